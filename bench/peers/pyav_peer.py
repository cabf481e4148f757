#!/usr/bin/env python3
"""pyav_peer.py: a LeRobot-style PyAV loader behind a torch DataLoader (the
anchors' "PyAV behind a torch DataLoader, batch 8, 0 or 2 workers" row).

    python3 bench/peers/pyav_peer.py DATASET --mode single|sarm [--workers 0|2]
        [--batch-size 8] [--num-batches N] [--seconds S] [--window span|per-frame] [--out-dir DIR]

What one item costs, as in LeRobot's map-style dataset with its PyAV video
path (``decode_video_frames`` -> torchvision/PyAV): for every camera, open
the MP4, seek to the keyframe at or before the first wanted timestamp
(``from_timestamp + frame_index / fps`` of each requested frame), decode
forward until the last wanted timestamp, keep the frames nearest to the
wanted timestamps, convert to RGB and then to float32 [C,H,W] / 255; plus
the tabular row (state, action, indices) from arrays held in memory. The
DataLoader shuffles (seeded) and collates batches of 8 with 0 or 2 worker
processes.

--window span (default; LeRobot's behaviour): one seek per camera and a
decode of every frame between the first and the last wanted timestamp (for
sarm, ~7 s = ~211 frames per camera per sample).
--window per-frame (a stronger peer): one seek + decode per wanted frame.
--decoder-threads 1 (a stronger peer): one decoder thread instead of PyAV's
default threading, which on 2 cores costs ~2.5x the CPU per random frame
(the decoder's threads are started for every opened file).

Frames counted are the frames the items hold (cameras x steps per sample).
"""
import argparse
import os
import sys
import time

import av
import numpy as np
import torch
import torch.utils.data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def decode_at(path, timestamps, window, threads=0):
    """RGB frames (uint8 HWC) nearest to each timestamp, and the number of
    frames decoded, LeRobot/PyAV style (a fresh container per call).
    threads 0 keeps PyAV's decoder threading (what LeRobot gets)."""
    decoded = 0
    out = [None] * len(timestamps)
    with av.open(path) as container:
        stream = container.streams.video[0]
        if threads:
            stream.codec_context.thread_count = threads
        tb = float(stream.time_base)
        groups = [list(range(len(timestamps)))] if window == "span" else [[i] for i in range(len(timestamps))]
        for group in groups:
            want = [timestamps[i] for i in group]
            first, last = min(want), max(want)
            container.seek(int(first / tb), stream=stream, backward=True, any_frame=False)
            frames, pts = [], []
            for frame in container.decode(stream):
                decoded += 1
                t = frame.pts * tb
                frames.append(frame)
                pts.append(t)
                if t >= last - 1e-6:
                    break
            pts = np.asarray(pts)
            for i, w in zip(group, want):
                j = int(np.argmin(np.abs(pts - w)))
                out[i] = frames[j].to_ndarray(format="rgb24")
    return out, decoded


class PyAVDataset(torch.utils.data.Dataset):
    def __init__(self, root, mode, window, decoder_threads=0):
        self.decoder_threads = decoder_threads
        self.meta = common.Meta(root)
        self.table = common.load_table(self.meta)
        self.deltas = common.SARM_DELTAS_S if mode == "sarm" else [0.0]
        self.mode = mode
        self.window = window

    def __len__(self):
        return self.meta.num_frames

    def __getitem__(self, pos):
        ep, ks, pads = common.window_rows(self.meta, pos, self.deltas)
        item = {}
        decoded = 0
        for cam in self.meta.cameras:
            path, from_ts = ep["videos"][cam]
            ts = [from_ts + k / self.meta.fps for k in ks]
            frames, n = decode_at(path, ts, self.window, self.decoder_threads)
            decoded += n
            t = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in frames]).type(torch.float32) / 255
            item[cam] = t if self.mode == "sarm" else t[0]
            if self.mode == "sarm":
                item[cam + "_is_pad"] = torch.tensor(pads)
        row = ep["from"] + ks[-1]
        for name, values in self.table.items():
            item[name] = torch.tensor(values[row])
        item["_decoded"] = decoded
        return item


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--mode", choices=["single", "sarm"], required=True)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--num-batches", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0, help="stop after this long (default 30)")
    ap.add_argument("--window", choices=["span", "per-frame"], default="span")
    ap.add_argument("--decoder-threads", type=int, default=0,
                    help="0 (default): PyAV's own decoder threading, as LeRobot runs it; 1: one thread per "
                         "decoder (a tuned peer: on 2 cores ~2.5x less CPU per random frame)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    ds = PyAVDataset(a.root, a.mode, a.window, a.decoder_threads)
    g = torch.Generator()
    g.manual_seed(a.seed)
    meter = common.Meter()
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers, generator=g)
    it = iter(dl)
    batches = samples = frames = decoded = 0
    per_sample = len(ds.meta.cameras) * len(ds.deltas)
    for batch in it:
        n = len(batch["_decoded"])
        batches += 1
        samples += n
        frames += n * per_sample
        decoded += int(batch["_decoded"].sum())
        del batch
        meter.batch(frames)
        if batches >= a.num_batches or time.monotonic() >= meter.deadline(a.seconds):
            break
    del it  # joins the workers, so their CPU time is in RUSAGE_CHILDREN
    meter.stop()
    window = "" if a.mode == "single" else f"-{a.window}"
    tuned = f"-dt{a.decoder_threads}" if a.decoder_threads else ""
    config = f"peer-pyav-{a.mode}{window}{tuned}-w{a.workers}"
    doc = common.record(config, "pyav", a.mode,
                        {"loader": "pyav+DataLoader", "batch_size": a.batch_size, "workers": a.workers,
                         "window": a.window if a.mode == "sarm" else None, "pyav": av.__version__,
                         "decoder_threads": a.decoder_threads or "pyav default",
                         "torch": torch.__version__, "image_format": "float32_chw"},
                        meter, batches, samples, frames, decoded)
    path = common.write(doc, a.out_dir)
    r = doc["results"]
    if a.json:
        import json
        print(json.dumps(doc, indent=2))
    else:
        print(f"{config}: {r['frames_per_s_node']:.1f} frames/s, {r['frames_per_cpu_s']:.1f} frames/CPU-s, "
              f"{r['samples_per_s']:.1f} samples/s ({batches} batches, {r['wallclock_s']:.1f} s, "
              f"{r['decoded_per_emitted']:.2f} decoded/frame)" + (f" -> {path}" if path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
