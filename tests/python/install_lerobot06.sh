#!/usr/bin/env bash
# install_lerobot06.sh: upstream LeRobot 0.6 (lerobot[dataset]) and Ray Data
# 2.60.0 in an isolated Python 3.12 venv, build-lerobot/venv312, the peer of
# tests/python/test_upstream_lerobot.py (and of Ray's read_lerobot).
#
# Idempotent: when the venv already holds what is asked for (a stamp file
# written after a successful check, and the check passing again), it does
# nothing. Otherwise it (re)creates the venv from scratch.
#
# Why these versions (see bench/lerobot.md, parity):
#   Python 3.12    lerobot >= 0.5 requires it; the main environment is 3.11 and
#                  is never touched (no --system-site-packages here)
#   torch 2.11.0   lerobot 0.6 requires torch < 2.12; the CPU wheel on this disk
#                  is 2.13 for 3.11 only, so torch comes from PyPI, where the
#                  x86_64 build is CUDA 13: its nvidia-* libraries are linked by
#                  libtorch and must be present for `import torch`, even on a
#                  machine without a GPU (2.11.0 is the smallest such wheel:
#                  506 MB, against 860 MB for 2.9/2.10). The venv is ~5.6 GB.
#   torchvision 0.26 / torchcodec 0.11   the releases paired with torch 2.11
#                  (lerobot 0.6: torchvision < 0.27, torchcodec < 0.12)
#   ray[data] 2.60.0   the Ray the project pins elsewhere
# Usage: tests/python/install_lerobot06.sh [VENV_DIR]
# PYTHON312 names the interpreter; else pyenv's newest 3.12, else python3.12.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
venv="${1:-$here/build-lerobot/venv312}"
specs=("lerobot[dataset]==0.6.*" "torch==2.11.0" "torchvision==0.26.*" "torchcodec==0.11.*" "ray[data]==2.60.0")
stamp="$venv/.vlafeed-installed"
want_stamp="${specs[*]}"
# lerobot-train's own extra (lerobot[training] asks for accelerate; wandb is only imported when
# enabled): added to an existing venv in place, so a venv from before this line is not rebuilt.
train_extras=("accelerate>=1.14.0,<2.0.0" "diffusers>=0.38.0,<0.40.0")  # diffusers: the diffusion policy

ensure_train_extras() {
  "$venv/bin/python" -c 'import accelerate, diffusers' 2>/dev/null && return 0
  echo "install_lerobot06: adding ${train_extras[*]} (lerobot-train) to $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${train_extras[@]}" || \
    echo "install_lerobot06: could not install ${train_extras[*]}; the lerobot-train tests will skip" >&2
}

# simulators (vlafeed.rl): vlafeed eval of LeRobot policies and the closed loop run in this venv;
# added in place like the train extras (same pins as scripts/install-deps.sh)
sim_extras=("mujoco==3.8.1" "gym-pusht==0.1.8" "gym-aloha==0.1.5")

ensure_sim_extras() {
  "$venv/bin/python" -c 'import mujoco, gym_pusht, gym_aloha' 2>/dev/null && return 0
  echo "install_lerobot06: adding ${sim_extras[*]} (simulators) to $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${sim_extras[@]}" || \
    echo "install_lerobot06: could not install ${sim_extras[*]}; the simulator tests in this venv will skip" >&2
}

check() {
  [ -x "$venv/bin/python" ] || return 1
  "$venv/bin/python" - <<'EOF' || return 1
import importlib.metadata as md, sys
v = {n: md.version(n) for n in ("lerobot", "torch", "ray")}
ok = v["lerobot"].startswith("0.6.") and v["torch"].startswith("2.11.") and v["ray"] == "2.60.0"
sys.exit(0 if ok else 1)
EOF
  "$venv/bin/python" "$here/tests/python/lerobot_upstream.py" --check >/dev/null || return 1
  "$venv/bin/python" -c 'import ray.data; ray.data.read_lerobot' 2>/dev/null || return 1
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] && check; then
  ensure_train_extras
  ensure_sim_extras
  echo "install_lerobot06: $venv is ready"
  exit 0
fi

py=${PYTHON312:-}
if [ -z "$py" ]; then
  pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  py=$(ls -d "$pyenv_root"/versions/3.12.*/bin/python 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$py" ] || py=$(command -v python3.12 || true)
fi
if [ -z "$py" ] || ! "$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  echo "install_lerobot06: no Python 3.12 found (set PYTHON312); LeRobot 0.6 needs it" >&2
  exit 1
fi

rm -rf "$venv"
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
echo "install_lerobot06: installing ${specs[*]} into $venv (a few GB from PyPI; minutes)"
if ! "${pip[@]}" "${specs[@]}"; then
  echo "install_lerobot06: pip failed; removing $venv" >&2
  rm -rf "$venv"
  exit 1
fi
if ! check; then
  echo "install_lerobot06: the installed venv does not pass its check; removing $venv" >&2
  "$venv/bin/python" "$here/tests/python/lerobot_upstream.py" --check >&2 || true
  rm -rf "$venv"
  exit 1
fi
printf '%s' "$want_stamp" > "$stamp"
ensure_train_extras
ensure_sim_extras
"$venv/bin/python" "$here/tests/python/lerobot_upstream.py" --check
echo "install_lerobot06: ready in $venv ($(du -sh "$venv" | cut -f1))"
