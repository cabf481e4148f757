#!/usr/bin/env bash
# run-fuzzers.sh BUILD_DIR SECONDS: runs every libFuzzer target built in
# BUILD_DIR for SECONDS each, starting from the seed corpus that
# tests/fuzz/make_seeds.py writes (generated files and the shared fixtures;
# nothing binary is kept in the repo). Any crash, leak or timeout fails.
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-60}
here=$(cd "$(dirname "$0")/.." && pwd)
work="$here/tests/fuzz/work"
rm -rf "$work"; mkdir -p "$work"
python3 "$here/tests/fuzz/make_seeds.py" "$work/seeds"
status=0
shopt -s nullglob
for bin in "$build"/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  corpus="$work/corpus/$name"; mkdir -p "$corpus"
  seeds="$work/seeds/$name"; mkdir -p "$seeds"
  dict=""
  [ -f "$here/tests/fuzz/$name.dict" ] && dict="-dict=$here/tests/fuzz/$name.dict"
  echo "fuzz: $name for ${seconds}s ($(ls "$seeds" | wc -l) seeds)"
  if ! ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=0 -artifact_prefix="$work/$name-" $dict "$corpus" "$seeds" > "$work/$name.log" 2>&1; then
    echo "fuzz: $name FAILED; last lines of $work/$name.log:"
    tail -40 "$work/$name.log"
    status=1
  else
    grep -E "^#[0-9]+.*(DONE|pulse)" "$work/$name.log" | tail -1 || true
  fi
done
exit $status
