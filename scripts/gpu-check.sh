#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU check (docs/gpus.md "The GPU check").
#
#   scripts/gpu-check.sh [--dry-run] [--out DIR] [bench/gpu_check.py options...]
#
# On a machine with CUDA: builds what it needs (make py-inplace build; pip
# installs only what is missing and never fails the check over one), makes
# the sample datasets once, then runs bench/gpu_check.py's steps (loader to
# cuda with the data-wait fraction of a training step, NVDEC vs CPU decode,
# vlafeed.train FSDP2/DDP with flash-attn or SDPA, FP8 GEMM vs bf16, a short
# vlafeed.rl run, then vlafeed.rl's hybrid placement: policy server and learner
# actor on one GPU at num_gpus 0.5 each), each with its own time limit, going
# on after a failure. The RL GPU tests: VF_GPU_RL_TESTS=1 also runs
# tests/python/test_rl_accounting.py (its GPU case skips without a GPU).
# Everything fits in 8 minutes: the steps are cut to the time that is left.
# Results: bench/gpu/<date>-<device name slug>/summary.json and summary.md.
#
# Without CUDA (or with --dry-run) it is the CPU dry run: tiny datasets,
# every step skipped with the reason, the summary written (tests/python/
# test_gpu_check.py runs it). Idempotent: rerunning rebuilds nothing that is
# up to date and reuses the datasets.
set -u
cd "$(dirname "$0")/.."
start=$(date +%s)
budget=${VF_GPU_CHECK_SECONDS:-470}   # under 8 minutes in all
dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
has_cuda=0
if [ "$dry" = 0 ] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    has_cuda=1
fi

built() { [ -x build/vlafeed ] && ls python/vlafeed/_native/_core*.so >/dev/null 2>&1; }

if [ "$has_cuda" = 1 ]; then
    echo "gpu-check: building (make py-inplace build)"
    if ! timeout 240 make py-inplace build >/tmp/vlafeed-gpu-check-build.log 2>&1; then
        echo "gpu-check: the build failed or timed out; see /tmp/vlafeed-gpu-check-build.log" >&2
    fi
    # Python packages the steps use: installed only when missing (a failure is reported by the step).
    for pair in yaml:pyyaml ray:ray gymnasium:gymnasium tqdm:tqdm; do
        mod=${pair%%:*}; pkg=${pair#*:}
        if ! python3 -c "import $mod" 2>/dev/null; then
            echo "gpu-check: pip install $pkg"
            timeout 120 python3 -m pip install -q "$pkg" >/dev/null 2>&1 || echo "gpu-check: could not install $pkg" >&2
        fi
    done
elif ! built; then
    echo "gpu-check: no build yet: make py-inplace build"
    make py-inplace build >/tmp/vlafeed-gpu-check-build.log 2>&1 || { echo "gpu-check: build failed" >&2; exit 1; }
fi

# RL section (vlafeed.rl placement on the GPU): the kill/accounting tests and the hybrid GPU test
if [ "$has_cuda" = 1 ] && [ "${VF_GPU_RL_TESTS:-0}" = 1 ]; then
    echo "gpu-check: vlafeed.rl placement tests (test_rl_accounting.py)"
    PYTHONPATH="$PWD/python" timeout 240 python3 -m pytest -q -p no:cacheprovider \
        tests/python/test_rl_accounting.py -k "gpu or hybrid" 2>&1 | tail -5 || echo "gpu-check: RL tests failed" >&2
fi

deadline=$((start + budget))
exec python3 bench/gpu_check.py --deadline "$deadline" "$@"
