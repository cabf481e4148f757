#!/usr/bin/env python3
"""lerobot_peer.py: upstream LeRobot's own loaders as benchmark peers.

Run with the python of the isolated LeRobot venv (build-lerobot/venv, made by
tests/python/install_lerobot.sh; see tests/python/README-parity.md), never
imported by the main environment:

    build-lerobot/venv/bin/python bench/peers/lerobot_peer.py DATASET
        --dataset map|streaming --mode single|sarm [--workers 0|2]
        [--batch-size 8] [--num-batches N] [--seconds S] [--out-dir DIR]

  map        lerobot.datasets.lerobot_dataset.LeRobotDataset (0.4.4), its
             default video backend (torchcodec 0.13 on the system FFmpeg 5.1),
             behind torch.utils.data.DataLoader(shuffle=True, batch_size=8)
  streaming  lerobot.datasets.streaming_dataset.StreamingLeRobotDataset from
             the local folder, behind a DataLoader (batch_size=8). Its shuffle
             buffer fills before the first item comes out; LeRobot's default
             (1000 items) holds 1000 decoded items: 11 GB for 3 cameras at
             640x480 float32 (21.9 GB peak RSS measured here), so the peer
             sizes it to ~1 GB (--buffer-size; 90 items single, 11 sarm).
             With workers > 0 every worker iterates the whole dataset
             (LeRobot #3781): frames/s then counts duplicates.

sarm: delta_timestamps {camera: [-7, ..., 0] s}. tolerance_s is 0.45 / fps
instead of LeRobot's 1e-4: make-sample concatenates episodes the way
LeRobot does, so LeRobot's own timestamp check (#3177) rejects most
episodes at 1e-4 (README-parity.md); with the wider tolerance LeRobot
returns exactly the reference frames. It changes no decoding work.

The HF caches go to a temporary folder and the hub is offline.
"""
import argparse
import os
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def prepare_offline_lerobot():
    """Before LeRobot is imported: a private Hugging Face cache, offline, and torchvision's
    CUDA-linked registrations stubbed (torchvision's PyPI build for torch 2.13 is CUDA-linked;
    LeRobot only needs its transforms, see tests/python/lerobot_upstream.py)."""
    cache = tempfile.mkdtemp(prefix="vlafeed-bench-hf-")
    os.environ.setdefault("HF_HOME", cache)
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(cache, "datasets"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--dataset", choices=["map", "streaming"], required=True)
    ap.add_argument("--mode", choices=["single", "sarm"], required=True)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--num-batches", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--buffer-size", type=int, default=0,
                    help="streaming: shuffle buffer in items (default: as many as fit in ~1 GB; LeRobot's "
                         "default 1000 holds 11 GB of 3-camera 640x480 float32 items)")
    ap.add_argument("--out-dir")
    a = ap.parse_args(argv)

    prepare_offline_lerobot()
    import lerobot
    import numpy as np
    import torch
    import torch.utils.data

    import common

    meta = common.Meta(a.root)
    deltas = {cam: common.SARM_DELTAS_S for cam in meta.cameras} if a.mode == "sarm" else None
    tolerance = 0.45 / meta.fps
    t_import = time.monotonic()
    buffer_size = None
    if a.dataset == "map":
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        ds = LeRobotDataset("local/vlafeed-bench", root=a.root, delta_timestamps=deltas, tolerance_s=tolerance)
        g = torch.Generator()
        g.manual_seed(a.seed)
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                         generator=g)
    else:
        from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset
        item_bytes = 4 * 3 * sum(int(np.prod(meta.info["features"][c]["shape"][:2])) for c in meta.cameras)
        item_bytes *= len(common.SARM_DELTAS_S) if a.mode == "sarm" else 1
        buffer_size = a.buffer_size or max(8, int(1e9 // item_bytes))
        ds = StreamingLeRobotDataset("local/vlafeed-bench", root=a.root, delta_timestamps=deltas,
                                     tolerance_s=tolerance, seed=a.seed, buffer_size=buffer_size)
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers)
    open_s = time.monotonic() - t_import
    meter = common.Meter()  # like `vlafeed bench`: from the loader's start, the dataset already open
    per_sample = len(meta.cameras) * (len(common.SARM_DELTAS_S) if a.mode == "sarm" else 1)
    batches = samples = 0
    it = iter(dl)
    for batch in it:
        n = len(batch["index"])
        batches += 1
        samples += n
        del batch
        meter.batch(samples * per_sample)
        if batches >= a.num_batches or time.monotonic() >= meter.deadline(a.seconds):
            break
    del it
    meter.stop()
    config = f"peer-lerobot-{a.dataset}-{a.mode}-w{a.workers}"
    import torchcodec
    doc = common.record(config, f"lerobot-{a.dataset}", a.mode,
                        {"loader": ("LeRobotDataset" if a.dataset == "map" else "StreamingLeRobotDataset")
                         + "+DataLoader", "batch_size": a.batch_size, "workers": a.workers,
                         "lerobot": getattr(lerobot, "__version__", "?"), "torch": torch.__version__,
                         "torchcodec": getattr(torchcodec, "__version__", "?"), "tolerance_s": tolerance,
                         "image_format": "float32_chw", "dataset_open_s": open_s,
                         "buffer_size": buffer_size if a.dataset == "streaming" else None},
                        meter, batches, samples, samples * per_sample)
    path = common.write(doc, a.out_dir)
    r = doc["results"]
    print(f"{config}: {r['frames_per_s_node']:.1f} frames/s, {r['frames_per_cpu_s']:.1f} frames/CPU-s, "
          f"{r['samples_per_s']:.1f} samples/s ({batches} batches, {r['wallclock_s']:.1f} s, first batch "
          f"{r['first_batch_latency_s']:.1f} s)" + (f" -> {path}" if path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
