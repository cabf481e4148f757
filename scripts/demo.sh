#!/usr/bin/env bash
# demo.sh: the main job behind `make demo` (make builds first). In a few
# minutes on 2 cores it shows the whole path from data to training:
#   1. vlafeed make-sample: a LeRobot v3.0 dataset (AV1, 2 cameras, 8 episodes,
#      320x240) whose frames carry their identity and whose tables are pure
#      functions; the episodes are concatenated into one MP4 per camera the way
#      LeRobot does it, timestamp drift included
#   2. vlafeed info on it, and on a dataset written by pyarrow (another writer)
#   3. the drift: which frames LeRobot's own lookup would reject (issue #3177)
#   4. vlafeed plan: how the epoch is split into partitions and video opens
#   5. a 2-process DDP training run of a small VLA-style policy fed by
#      vlafeed.Loader (progress bars with loss, samples/s, data-wait fraction)
#   6. the same run fed by a pure-Python LeRobot-style loader, for comparison
#   7. vlafeed info on the real LeRobot v2.1 fixture
#   8. vlafeed.train: the example policy with FSDP2 + amp_bfloat16 at 2 ranks,
#      packed sequences; a run stopped at step 5 and resumed matches the
#      uninterrupted run bit for bit; the packed/padded speed-up, on the
#      sample and by padding rate
#   9. vlafeed convert --to wds: the sample as WebDataset shards in VLA
#      Foundry's layout; a policy trained from a 0.7/0.3 sample-level mix of
#      the shards and the LeRobot dataset (vlafeed.Mix over ShardLoader and
#      Loader), exact shares per window, exact resume of the mix
#  10. vlafeed.train with a LeRobot policy (ACT, tiny, random init) in LeRobot's
#      Python 3.12 venv: trained at 2 ranks (FSDP2), exported, fine-tuned from
#      the exported pretrained_model/, exported again and loaded back by
#      LeRobot's own ACTPolicy.from_pretrained (DEMO_LEROBOT=0 skips it)
# Parts that are not available yet are skipped with the reason.
# Knobs: DEMO_OUT (output folder), DEMO_STEPS (training steps, default 60),
# DEMO_BASELINE=0 (skip step 6).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cli="$here/build/vlafeed"
out="${DEMO_OUT:-$here/demo-out}"
fixture="$here/../shared/fixtures/lerobot-g1-v21"
steps="${DEMO_STEPS:-60}"
py=python3

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
skip() { printf '\033[33m-- skipped: %s\033[0m\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
timed() { # timed LABEL CMD...: runs CMD, records how long it took
  local label=$1; shift
  local t0; t0=$(now)
  "$@"
  timings+=("$(printf '%-44s %6s s' "$label" "$(since "$t0")")")
}
timings=()
demo_t0=$(now)

# A subcommand counts as available when its --help does not say "not implemented".
have_cmd() { local o; o=$("$cli" "$1" --help 2>&1 || true); ! grep -qi "not implemented" <<<"$o"; }

# The Python package: installed (make python), or the in-place build in python/.
vlafeed_python() {
  if $py -c 'import vlafeed' 2>/dev/null; then return 0; fi
  if PYTHONPATH="$here/python" $py -c 'import vlafeed' 2>/dev/null; then
    export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"; return 0
  fi
  return 1
}

rm -rf "$out"; mkdir -p "$out"
sample="$out/sample"

step "1. vlafeed make-sample: LeRobot v3.0, AV1, 2 cameras, 8 episodes, 320x240"
timed "make-sample (8 episodes x 2 cameras, AV1)" \
  "$cli" make-sample "$sample" --episodes 8 --cameras 2 --size 320x240 --codec av1

step "2. vlafeed info"
"$cli" info "$sample"
echo; echo "-- and a v3.0 dataset written by pyarrow, the way LeRobot's recorder writes it:"
$py "$here/scripts/write_pyarrow_dataset.py" "$out/pyarrow-v3" >/dev/null
"$cli" info "$out/pyarrow-v3" | head -n 4

step "3. the timestamp drift of concatenated MP4s, and what LeRobot's lookup makes of it"
$py "$here/examples/lerobot_drift.py" "$sample" | tail -n 10

step "4. vlafeed plan: partitions and video opens for 2 ranks"
if have_cmd plan; then
  "$cli" plan "$sample" --world-size 2 || skip "vlafeed plan failed (see above)"
else
  skip "vlafeed plan is not implemented yet"
fi

train() { # train CHECKPOINT_DIR STEPS [extra args]: 2-process DDP run on the sample
  local ck=$1 n=$2; shift 2
  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 "$here/examples/train_policy.py" \
    --dataset "$sample" --steps "$n" --batch-size 8 --lr 1e-3 --chunk 10 --seed 0 --device auto \
    --checkpoint-dir "$ck" --checkpoint-every "$n" --log-every 5 "$@"
}

step "5. train a small VLA policy with 2 processes (DDP, gloo on CPU), fed by vlafeed.Loader"
have_loader=0
if ! command -v torchrun >/dev/null; then
  skip "torchrun not found (torch is not installed)"
elif ! vlafeed_python; then
  skip "the vlafeed Python package does not import (make python, or make py-inplace)"
elif ! $py -c 'import vlafeed, sys; sys.exit(0 if hasattr(vlafeed, "Loader") else 1)'; then
  skip "vlafeed.Loader does not exist yet (the loader's Python API is not merged)"
else
  have_loader=1
  timed "training, vlafeed.Loader ($steps steps)" train "$out/checkpoints" "$steps"
  echo "checkpoints: $(ls "$out/checkpoints" | tr '\n' ' ')"
fi

step "6. the same training fed by a pure-Python LeRobot-style loader (PyAV per sample), for comparison"
if [ "${DEMO_BASELINE:-1}" = 0 ]; then
  skip "DEMO_BASELINE=0"
elif ! command -v torchrun >/dev/null; then
  skip "torchrun not found"
else
  base_steps=$(( steps < 30 ? steps : 30 ))
  timed "training, Python reference loader ($base_steps steps)" \
    train "$out/checkpoints-reference" "$base_steps" --loader reference
fi

if [ -d "$fixture" ]; then
  step "7. vlafeed info on the real LeRobot v2.1 fixture, episodes with videos (1, 2, 4)"
  "$cli" info "$fixture" --episodes 1,2,4
else
  skip "fixture $fixture not found"
fi

step "8. vlafeed.train: FSDP2 + amp_bfloat16 at 2 ranks on CPU, packed sequences, stop, resume exactly"
if ! command -v torchrun >/dev/null; then
  skip "torchrun not found"
elif ! vlafeed_python || ! $py -c 'import vlafeed.train, yaml' 2>/dev/null; then
  skip "vlafeed.train or pyyaml does not import"
else
  cat > "$out/train.yaml" <<EOF
data: {dataset: $sample, batch_size: 8, chunk: 10, image_size: 64}
model: {d_model: 64, layers: 2, heads: 4, patch: 16, camera_dropout: 0.5}
packing: {enabled: true}
parallel: {fsdp: true}
train: {steps: 12, precision: amp_bfloat16, warmup_steps: 3, log_every: 4}
checkpoint: {every: 4}
EOF
  vtrain() { OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 -m vlafeed.train --config "$out/train.yaml" "$@" 2>&1 \
               | grep -v -e '^W[0-9]' -e 'OMP_NUM_THREADS' -e '^\*\*\*' || true; }
  timed "vlafeed.train, 12 steps (uninterrupted)" \
    vtrain --checkpoint.dir "$out/vt-full" --train.log_file "$out/vt-full.jsonl"
  timed "vlafeed.train, stopped at step 5" \
    vtrain --checkpoint.dir "$out/vt-resumed" --train.log_file "$out/vt-resumed.jsonl" --train.stop_at 5
  timed "vlafeed.train, resumed to 12" \
    vtrain --checkpoint.dir "$out/vt-resumed" --train.log_file "$out/vt-resumed.jsonl" --checkpoint.resume auto
  timed "vlafeed.train, 12 steps padded (no packing)" \
    vtrain --checkpoint.dir "$out/vt-padded" --packing.enabled false
  $py - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def losses(f):
    return {r["step"]: r["loss_hex"] for r in map(json.loads, (out / f).read_text().splitlines())}
a, b = losses("vt-full.jsonl"), losses("vt-resumed.jsonl")
same = a == b and len(a) == 12
print(f"resume: the stopped-and-resumed run's 12 losses are {'bit-identical' if same else 'DIFFERENT'} "
      f"to the uninterrupted run's")
p = json.loads((out / "vt-full" / "summary.json").read_text())
q = json.loads((out / "vt-padded" / "summary.json").read_text())
print(f"packing: {p['tokens_per_s']:.0f} tokens/s packed ({100 * p['padding_fraction']:.0f}% padding) vs "
      f"{q['tokens_per_s']:.0f} padded ({100 * q['padding_fraction']:.0f}% padding): "
      f"{p['tokens_per_s'] / q['tokens_per_s']:.2f}x speed-up on this data")
sys.exit(0 if same else 1)
EOF
  echo "-- packing by padding rate (synthetic batches of the same policy, bench/train_bench.py; ratios):"
  timed "packed vs padded by padding rate" $py "$here/bench/train_bench.py" --skip-dist --steps 5 \
    --out "$out/packing.md" >/dev/null
  cat "$out/packing.md"
fi

step "9. WebDataset shards: convert the sample, then train from a 0.7/0.3 mix of the shards and the LeRobot dataset"
if [ "$have_loader" = 1 ]; then
  timed "convert --to wds (8 episodes, 2 cameras)" \
    "$cli" convert "$sample" "$out/wds" --to wds --past 0 --future 0 --image-offsets 0 --samples-per-shard 64
  ls "$out/wds/shards" | head -n 4; echo "..."
  head -n 2 "$out/wds/shards/manifest.jsonl"; echo
  timed "train from Mix(shards 0.7, LeRobot 0.3), 30 steps" \
    $py "$here/examples/train_mix.py" --shards "$out/wds/shards/manifest.jsonl" --dataset "$sample" \
    --weights 0.7,0.3 --steps 30 --batch-size 16
else
  echo "(skipped: the Python package is not built)"
fi

step "10. vlafeed.train fine-tunes a LeRobot ACT policy (Python 3.12 venv), exports it, LeRobot loads it back"
py312="$here/build-lerobot/venv312/bin/python"
lerobot_ready() {
  [ -x "$py312" ] && "$py312" -c 'import lerobot.policies.act.modeling_act' 2>/dev/null
}
if [ "${DEMO_LEROBOT:-1}" = 0 ]; then
  skip "DEMO_LEROBOT=0"
elif ! lerobot_ready && ! { "$here/tests/python/install_lerobot06.sh" >"$out/lerobot06-install.log" 2>&1 && lerobot_ready; }; then
  skip "no LeRobot 0.6 venv at $py312 (tests/python/install_lerobot06.sh failed: see $out/lerobot06-install.log)"
elif ! PYTHONPATH="$here/python" "$py312" -c 'import vlafeed._native._core' 2>/dev/null \
     && ! make -C "$here" py312-inplace >"$out/py312-build.log" 2>&1; then
  skip "vlafeed does not build for Python 3.12 (see $out/py312-build.log)"
else
  cat > "$out/act.yaml" <<EOF
data: {dataset: $sample, batch_size: 8, image_size: 96}
model:
  source: lerobot
  name: act
  overrides: {pretrained_backbone_weights: null, dim_model: 64, n_heads: 2, dim_feedforward: 128,
              n_encoder_layers: 2, n_decoder_layers: 1, n_vae_encoder_layers: 1, latent_dim: 8,
              chunk_size: 10, n_action_steps: 10}
train: {steps: 8, lr: 1.0e-4, warmup_steps: 2, log_every: 4, threads: 1}
EOF
  act() { PYTHONPATH="$here/python" OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
            "$py312" "$@" 2>&1 | grep -v -e '^W[0-9]' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func' -e 'sys.exit(main())' -e '^Loading weights' || true; }
  timed "ACT: 8 steps, 2 ranks FSDP2 (random init)" \
    act -m torch.distributed.run --standalone --nproc_per_node=2 -m vlafeed.train --config "$out/act.yaml" \
      --checkpoint.dir "$out/act-base"
  act -m vlafeed.train export "$out/act-base" "$out/act-base-export"
  timed "ACT: fine-tune 6 steps from the export" \
    act -m torch.distributed.run --standalone --nproc_per_node=2 -m vlafeed.train --config "$out/act.yaml" \
      --model.path "$out/act-base-export/pretrained_model" --train.steps 6 --checkpoint.dir "$out/act-tuned"
  act -m vlafeed.train export "$out/act-tuned" "$out/act-tuned-export"
  PYTHONPATH="$here/python" HF_HUB_OFFLINE=1 "$py312" - "$out" <<'EOF' 2>&1 | grep -v Warning || true
import sys, torch
from pathlib import Path
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
import vlafeed
out = Path(sys.argv[1]) / "act-tuned-export" / "pretrained_model"
policy = ACTPolicy.from_pretrained(out).eval()
pre, post = make_pre_post_processors(policy.config, pretrained_path=str(out))
loader = vlafeed.Loader(str(Path(sys.argv[1]) / "sample"), batch_size=4, resize=(96, 96), shuffle=False)
batch = next(iter(loader))
with torch.no_grad():
    actions = post(policy.predict_action_chunk(pre(batch)))
err = (actions[:, 0] - batch["action"].float()).abs().mean()
print(f"LeRobot's ACTPolicy.from_pretrained({out.name}/) predicts action chunks {tuple(actions.shape)} on "
      f"vlafeed batches; mean |first action - recorded action| = {err:.3f}")
EOF
fi

step "summary"
for f in "$out/checkpoints/summary.json" "$out/checkpoints-reference/summary.json"; do
  [ -f "$f" ] || continue
  $py - "$f" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['loader']:>9} loader: loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, "
      f"{s['samples_per_s']:.1f} samples/s, {100 * s['data_wait_fraction']:.0f}% of step time waiting for data "
      f"({s['steps']} steps x {s['batch_size']} x {s['processes']} processes)")
EOF
done
[ "$have_loader" = 1 ] || echo "(the vlafeed training run was skipped: see step 5)"
for t in "${timings[@]}"; do echo "$t"; done
printf '%-44s %6s s\n' "whole demo" "$(since "$demo_t0")"
echo "outputs in $out"
