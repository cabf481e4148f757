#!/usr/bin/env bash
# install_lerobot.sh: puts upstream LeRobot (the real LeRobotDataset) into an
# isolated venv, build-lerobot/venv, for tests/python/test_upstream_lerobot.py.
#
# It never touches the main environment and never changes torch: the venv
# inherits the system site-packages (torch 2.13.0 CPU, PyAV, pyarrow, numpy),
# every install is pinned by a constraints file holding the installed torch,
# and the packages whose declared requirements would drag in another torch
# (lerobot, torchvision, torchcodec) are installed with --no-deps.
#
# Why these versions (see tests/python/README-parity.md):
#   lerobot 0.4.4     the newest release for Python 3.11 (0.5+ need >= 3.12); it
#                     declares torch<2.11 and torchvision<0.26, ignored here
#   torchvision 0.28  the build paired with torch 2.13; on PyPI it is CUDA-linked,
#                     so its C++ ops cannot load on CPU torch (the runner skips
#                     torchvision's meta registrations of those ops; LeRobot's
#                     dataset code only needs torchvision.transforms)
#   torchcodec 0.13   paired with torch 2.13, CPU build, uses the system FFmpeg 5.1;
#                     LeRobot's default decoder (its pyav path goes through
#                     torchvision.io.VideoReader, which torchvision 0.28 removed)
# Usage: tests/python/install_lerobot.sh [VENV_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
venv="${1:-$here/build-lerobot/venv}"
py=${PYTHON:-python3}

torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])') || {
  echo "install_lerobot: torch is not installed in $py; refusing (an unpinned install would pull CUDA torch)" >&2
  exit 1
}
case "$torch_version" in
  2.13.*) tv=0.28.0; tc=0.13.0 ;;
  *) echo "install_lerobot: no known torchvision/torchcodec pairing for torch $torch_version; skipping" >&2; exit 1 ;;
esac

"$py" -m venv --system-site-packages "$venv"
cons="$venv/constraints.txt"
"$py" - "$cons" <<'EOF'
import sys, importlib.metadata as md
pins = {"torch": md.version("torch").split("+")[0]}
for name in ("av", "numpy", "pyarrow"):
    try:
        pins[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
open(sys.argv[1], "w").write("".join(f"{k}=={v}\n" for k, v in pins.items()))
EOF
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$cons")
"${pip[@]}" --no-deps lerobot==0.4.4 "torchvision==$tv" "torchcodec==$tc"
# LeRobot's dataset code imports these; none of them depends on torch except
# accelerate (torch>=2.0, satisfied by the pinned 2.13).
"${pip[@]}" "datasets>=4.0.0,<5.0.0" "huggingface-hub>=0.34.2,<0.36.0" pandas pillow jsonlines \
  "einops>=0.8,<0.9" draccus==0.10.0 termcolor "deepdiff>=7,<9" "accelerate>=1.10.0,<2.0.0"

after=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "$after" != "$torch_version" ]; then
  echo "install_lerobot: torch changed ($torch_version -> $after) in $venv; removing it" >&2
  rm -rf "$venv"
  exit 1
fi
"$venv/bin/python" "$here/tests/python/lerobot_upstream.py" --check
echo "install_lerobot: LeRobot ready in $venv (torch $after)"
