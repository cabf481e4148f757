#!/usr/bin/env bash
# install-deps.sh: installs what vlafeed needs to build, test and run, on a
# fresh Debian machine of this kind. Idempotent and quick when all is there.
#   system (apt-get): compilers, FFmpeg libraries with libdav1d/libsvtav1,
#                     snappy, zstd, zlib, libcurl, OpenSSL libcrypto, jansson, libarchive,
#                     libjpeg-turbo (TurboJPEG API), libpng
#   python (pip):     pyarrow, PyAV, numpy, pytest, hypothesis, tqdm, torch==2.13.0 (CPU),
#                     matplotlib (bench/plot_bench.py charts only), safetensors (vlafeed.quant),
#                     ray[data,train] (vlafeed.ray, vlafeed.rl), gymnasium (vlafeed.rl),
#                     webdataset (interop tests and the bench peer), pillow (JPEG reference decodes),
#                     transformers + accelerate (vlafeed.quant's --eval and the FP8 interop tests:
#                     transformers loads FP8 checkpoints only with accelerate),
#                     tensorboard + wandb (vlafeed.train's train.tensorboard / train.wandb_project sinks)
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config clang libclang-rt-14-dev llvm
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev libdav1d-dev ffmpeg
  libsnappy-dev libzstd-dev zlib1g-dev libcurl4-openssl-dev libssl-dev libjansson-dev libarchive-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
)
# simulators (vlafeed.rl): gymnasium's MuJoCo tasks (mujoco; vlafeed/InvertedPendulumPixels-v0), LeRobot's
# gym-pusht (pymunk) and gym-aloha (dm_control), rendered headless through EGL (libegl1) or OSMesa (libosmesa6);
# vlafeed.rl.sims.PIP has the same pins; gymnasium's MuJoCo renderer imports imageio
APT_PACKAGES+=(libegl1 libosmesa6)
SIM_PIP_PACKAGES=("mujoco==3.8.1" "gym-pusht==0.1.8" "gym-aloha==0.1.5" "imageio==2.37.0" "psutil==7.2.2")
PIP_PACKAGES=(pyarrow av numpy pytest hypothesis tqdm "torch==2.13.0" scikit-build-core ninja cmake matplotlib pandas boto3 "moto[server]" pyyaml safetensors "ray[data,train]==2.60.0" gymnasium "webdataset==1.0.2" pillow "transformers==5.24.0" "accelerate==1.15.0" "tensorboard==2.21.0" "wandb==0.31.0")

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
need_pip=()
for spec in "${PIP_PACKAGES[@]}" "${SIM_PIP_PACKAGES[@]}"; do
  mod=${spec%%==*}
  case "$mod" in
    scikit-build-core) mod=scikit_build_core ;;
    "moto[server]") mod=moto ;;
    pyyaml) mod=yaml ;;
    pillow) mod=PIL ;;
    "ray[data,train]") mod=ray ;;
  esac
  "$PY" -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('${mod//-/_}') else 1)" 2>/dev/null || need_pip+=("$spec")
done
if [ ${#need_pip[@]} -gt 0 ]; then
  echo "install-deps: pip install ${need_pip[*]}"
  "$PY" -m pip install -q "${need_pip[@]}"
fi
echo "install-deps: ok"
