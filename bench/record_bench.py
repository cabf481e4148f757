"""CPU cost of recording with LeRobot's API: vlafeed's recorder against LeRobot 0.6.1's.

Run the same command once in each environment (the frames are the same:
numpy's PCG64 stream with a fixed seed):

  python3 bench/record_bench.py --impl vlafeed OUT_DIR   (the in-place build after make py-inplace)
  build-lerobot/venv312/bin/python bench/record_bench.py --impl lerobot OUT_DIR

Records EPISODES episodes of FRAMES frames with two 480x640 cameras (a
smooth moving picture plus noise), a 6-float state and action, one task,
with H.264 by default (--codec libsvtav1 for LeRobot's default; as root,
run LeRobot under `setpriv --inh-caps=-sys_nice --bounding-set=-sys_nice`
so SVT-AV1 cannot take real-time priority). Prints wall seconds and CPU
seconds of this process and its children (LeRobot encodes in a process
pool), and the encoder thread setting.
"""
import argparse
import os
import resource
import shutil
import sys
import time

import numpy as np


def frames(rng, n, h, w, seed):
    y, x = np.mgrid[0:h, 0:w]
    base = ((x + y + seed * 50) % 256).astype(np.uint8)
    for i in range(n):
        img = np.repeat(np.roll(base, 4 * i, axis=1)[..., None], 3, axis=2)
        img = np.clip(img.astype(np.int16) + rng.integers(-6, 7, img.shape), 0, 255).astype(np.uint8)
        yield img


def cpu_seconds():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["vlafeed", "lerobot"], required=True)
    ap.add_argument("--codec", default="h264")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("out")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    cam = {"dtype": "video", "shape": (480, 640, 3), "names": ["height", "width", "channels"]}
    features = {"observation.images.front": cam, "observation.images.side": dict(cam),
                "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
                "action": {"dtype": "float32", "shape": (6,), "names": None}}
    if args.impl == "vlafeed":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _inplace
        _inplace.use()
        from vlafeed import LeRobotDataset
        encoder = {"vcodec": args.codec}
    else:
        from lerobot.configs import RGBEncoderConfig
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        encoder = RGBEncoderConfig(vcodec=args.codec)
    rng = np.random.default_rng(0)
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    ds = LeRobotDataset.create("bench/record", 30, features, root=args.out, rgb_encoder=encoder)
    for e in range(args.episodes):
        front, side = frames(rng, args.frames, 480, 640, e), frames(rng, args.frames, 480, 640, e + 7)
        for f, (a, b) in enumerate(zip(front, side)):
            ds.add_frame({"observation.images.front": a, "observation.images.side": b,
                          "observation.state": rng.standard_normal(6).astype(np.float32),
                          "action": rng.standard_normal(6).astype(np.float32), "task": "pick"})
        ds.save_episode()
    ds.finalize()
    cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    print(f"{args.impl}: {args.episodes} episodes x {args.frames} frames x 2 cameras 480x640, codec {args.codec}, "
          f"encoder_threads=None (vlafeed: 1 encoder thread per camera; LeRobot: codec default), "
          f"parallel_encoding=True: wall {wall:.2f} s, CPU {cpu:.2f} s (self + children)")


if __name__ == "__main__":
    main()
