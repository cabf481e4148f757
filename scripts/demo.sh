#!/usr/bin/env bash
# demo.sh: the main job behind `make demo`. Builds are done by make; this
# writes a small LeRobot v3.0 dataset, describes it with `vlafeed info`, and
# describes the real LeRobot v2.1 fixture (../shared/fixtures/lerobot-g1-v21).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cli="$here/build/vlafeed"
out="${DEMO_OUT:-$here/demo-out}"
fixture="$here/../shared/fixtures/lerobot-g1-v21"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

rm -rf "$out"; mkdir -p "$out"

step "1. write a small LeRobot v3.0 dataset with pyarrow (the layout LeRobot's recorder writes)"
python3 "$here/scripts/write_pyarrow_dataset.py" "$out/pyarrow-v3"

step "2. vlafeed info on it"
"$cli" info "$out/pyarrow-v3"

if "$cli" make-sample --help >/dev/null 2>&1; then
  step "3. vlafeed make-sample: a synthetic v3.0 dataset with real AV1 video (2 cameras)"
  "$cli" make-sample "$out/sample" --episodes 6 --cameras 2 --size 320x240
  "$cli" info "$out/sample"
fi

if [ -d "$fixture" ]; then
  step "4. vlafeed info on the real LeRobot v2.1 fixture (97 of its 100 videos are absent on purpose)"
  "$cli" info "$fixture" || true
  step "5. the same, restricted to the episodes whose videos are present"
  "$cli" info "$fixture" --episodes 1,2,4
else
  echo "(fixture $fixture not found; skipping)"
fi
step "demo done (outputs in $out)"
