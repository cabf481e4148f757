#!/usr/bin/env python3
"""WebDataset shards: vlafeed.ShardLoader against the webdataset library, same shards, same run.

    python3 bench/wds_bench.py [--work /tmp/wds-bench] [--samples 2000] [--size 160x120] [--out bench/wds-results.json]

1. `vlafeed make-sample` writes a LeRobot dataset (h264, 2 cameras); vlafeed.Loader reads its frames
   (uint8) and rows; this script writes VLA Foundry-layout shards from them with webdataset.TarWriter:
   per sample <cam>_t-1.jpg and <cam>_t0.jpg for both cameras (PIL, quality 95), lowdim.npz
   (np.savez_compressed: observation.state and action windows [4, D], past/future masks),
   metadata.json, language_instructions.json; 100 samples per shard; manifest.jsonl with stems.
2. Reads one epoch of all shards to tensors, each reader in turn, with a shuffle buffer of 1000 samples
   and batches of 64:
   - vlafeed.ShardLoader (torch output; uint8 [B,H,W,3] images, npz arrays as tensors, json parsed);
   - `vlafeed bench --source wds` (the C loader alone, batches freed, no Python);
   - webdataset: WebDataset(urls).shuffle(1000).decode("rgb8") + a map that turns the npz into
     tensors and the images into tensors, behind torch's DataLoader(batch_size=64) with
     num_workers 0, 1 and 2 (its workers split the shards).
   CPU seconds = getrusage(SELF) + getrusage(CHILDREN) deltas (every thread; DataLoader workers are
   reaped at the end of the epoch, so their CPU counts); also wall seconds. Figures: samples/s,
   MB/s (tar bytes read) and both per CPU second; the ratio is vlafeed's samples per CPU second over
   the best webdataset setting's (by samples per CPU second).
3. LeRobot video vs WDS JPEG for the same frames: bytes on disk per frame (MP4 bytes / frames x cameras
   against the mean JPEG member) and decode CPU per frame (vlafeed.Loader stream mode over the MP4s,
   one frame per camera per sample, against vlafeed.ShardLoader decoding only the JPEG fields).
"""
import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()

import torch  # noqa: E402
import webdataset as wds  # noqa: E402
from PIL import Image  # noqa: E402

import vlafeed  # noqa: E402

CAMS = ("observation.images.cam0", "observation.images.cam1")
STEPS = 4  # past 1, anchor, future 2


def cpu_now():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def jpeg(rgb):
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_shards(cli, work, samples, size):
    src = work / "lerobot"
    if not src.exists():
        subprocess.run([cli, "make-sample", str(src), "--episodes", "12", "--codec", "h264", "--size", size,
                        "--fps", "10", "--min-length", "40", "--max-length", "80", "--quiet"], check=True)
    loader = vlafeed.Loader(str(src), mode="stream", batch_size=64, shuffle=False, image_format="uint8_hwc",
                            output="numpy", include_task=False)
    frames = {cam: [] for cam in CAMS}
    rows = {"observation.state": [], "action": [], "episode_index": [], "frame_index": []}
    for b in loader:
        for cam in CAMS:
            frames[cam].append(np.asarray(b[cam]))
        for k in rows:
            rows[k].append(np.asarray(b[k]))
    frames = {cam: np.concatenate(v) for cam, v in frames.items()}
    rows = {k: np.concatenate(v) for k, v in rows.items()}
    n = len(rows["episode_index"])
    shards = work / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(np.resize(np.arange(n), samples))  # VLA Foundry shuffles frames before sharding
    manifest, per = [], 100
    for s in range(0, samples, per):
        name = f"shard_{s // per:06d}"
        with wds.TarWriter(str(shards / f"{name}.tar")) as w:
            for j, t in enumerate(order[s:s + per]):
                ep = rows["episode_index"][t]
                same = np.nonzero(rows["episode_index"] == ep)[0]
                first, last = same[0], same[-1]
                window = np.clip(np.arange(t - 1, t - 1 + STEPS), first, last)
                sample = {"__key__": f"{s + j:032x}"}
                for off in (-1, 0):
                    for cam in CAMS:
                        sample[f"{cam.split('.')[-1]}_t{off}.jpg"] = jpeg(frames[cam][max(first, t + off)])
                z = io.BytesIO()
                np.savez_compressed(z, **{"observation.state": rows["observation.state"][window],
                                          "action": rows["action"][window],
                                          "past_mask": np.arange(STEPS) < 1, "future_mask": np.arange(STEPS) >= 1})
                sample["lowdim.npz"] = z.getvalue()
                sample["metadata.json"] = json.dumps({"episode_index": str(ep), "frame_index":
                                                      str(rows["frame_index"][t]), "anchor_relative_idx": 1}).encode()
                sample["language_instructions.json"] = json.dumps({"original": "sample task"}).encode()
                w.write(sample)
        manifest.append(json.dumps({"shard": name, "num_sequences": len(order[s:s + per])}))
    (shards / "manifest.jsonl").write_text("\n".join(manifest))
    return shards / "manifest.jsonl"


def measure(fn):
    c0, t0 = cpu_now(), time.perf_counter()
    samples = fn()
    return samples, time.perf_counter() - t0, cpu_now() - c0


def run_vlafeed(manifest):
    def go():
        n = 0
        for batch in vlafeed.ShardLoader(str(manifest), batch_size=64, seed=0, shuffle_buffer=1000):
            n += len(batch["__key__"])
        return n
    return measure(go)


def run_cli(cli, manifest):
    r = subprocess.run([cli, "bench", "--source", "wds", str(manifest), "--batch-size", "64", "--json"],
                       capture_output=True, text=True, check=True)
    d = json.loads(r.stdout)
    return d["samples"], d["wall_s"], d["cpu_s"]


def to_tensors(sample):
    out = {}
    for k, v in sample.items():
        if k == "lowdim.npz":
            out.update({name: torch.from_numpy(np.asarray(v[name])) for name in v.keys()})  # dict or NpzFile
        elif k.endswith(".jpg"):
            out[k[:-4]] = torch.from_numpy(v)
        elif k.endswith(".json"):
            out[k] = v
    return out


def collate(samples):
    out = {}
    for k in samples[0]:
        vals = [s[k] for s in samples]
        out[k] = torch.stack(vals) if isinstance(vals[0], torch.Tensor) else vals
    return out


def run_webdataset(urls, workers):
    def go():
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).shuffle(1000).decode("rgb8").map(to_tensors)
        dl = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=collate)
        return sum(len(b["metadata.json"]) for b in dl)
    return measure(go)


def video_vs_jpeg(work, manifest):
    """Bytes on disk and decode CPU per frame: the LeRobot dataset's MP4s (vlafeed.Loader, stream mode,
    one frame per camera per sample, uint8) against the shards' JPEGs (vlafeed.ShardLoader, images only)."""
    src = work / "lerobot"
    video_bytes = sum(p.stat().st_size for p in (src / "videos").rglob("*.mp4"))
    info = json.loads((src / "meta" / "info.json").read_text())
    frames = info["total_frames"] * len(CAMS)

    def lerobot():
        n = 0
        for b in vlafeed.Loader(str(src), mode="stream", batch_size=64, image_format="uint8_hwc", output="numpy",
                                include_task=False, seed=0):
            n += len(b[CAMS[0]]) * len(CAMS)
        return n
    n_video, _, cpu_video = measure(lerobot)
    jpg_fields = [f"{cam.split('.')[-1]}_t{off}.jpg" for off in (-1, 0) for cam in CAMS]
    jpeg_bytes = 0
    import tarfile
    for tar in manifest.parent.glob("shard_*.tar"):
        with tarfile.open(tar) as t:
            jpeg_bytes += sum(m.size for m in t.getmembers() if m.name.endswith(".jpg"))

    def shards():
        n = 0
        for b in vlafeed.ShardLoader(str(manifest), batch_size=64, fields=jpg_fields, output="numpy"):
            n += len(b["__key__"]) * len(jpg_fields)
        return n
    n_jpeg, _, cpu_jpeg = measure(shards)
    return {"video_bytes_per_frame": round(video_bytes / frames), "jpeg_bytes_per_frame":
            round(jpeg_bytes / n_jpeg), "video_decode_us_per_frame": round(cpu_video / n_video * 1e6, 1),
            "jpeg_decode_us_per_frame": round(cpu_jpeg / n_jpeg * 1e6, 1), "video_frames": n_video,
            "jpeg_frames": n_jpeg}


def row(name, n, wall, cpu, mb):
    return {"reader": name, "samples": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "samples_per_s": round(n / wall, 1), "mb_per_s": round(mb / wall, 2),
            "samples_per_cpu_s": round(n / cpu, 1), "mb_per_cpu_s": round(mb / cpu, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/vlafeed-wds-bench")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--size", default="160x120")
    ap.add_argument("--cli", default=os.environ.get("VF_CLI", str(REPO / "build" / "vlafeed")))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work)
    manifest = work / "shards" / "manifest.jsonl"
    if not manifest.exists():
        manifest = write_shards(args.cli, work, args.samples, args.size)
    urls = sorted(str(p) for p in manifest.parent.glob("shard_*.tar"))
    mb = sum(os.path.getsize(u) for u in urls) / 1e6
    rows = [row("vlafeed.ShardLoader (Python, torch tensors)", *run_vlafeed(manifest), mb),
            row("vlafeed bench --source wds (C only)", *run_cli(args.cli, manifest), mb)]
    for workers in (0, 1, 2):
        rows.append(row(f"webdataset + DataLoader(num_workers={workers})", *run_webdataset(urls, workers), mb))
    best = max((r for r in rows if r["reader"].startswith("webdataset")), key=lambda r: r["samples_per_cpu_s"])
    ratio = rows[0]["samples_per_cpu_s"] / best["samples_per_cpu_s"]
    print(f"shards: {len(urls)} tars, {mb:.1f} MB, {args.samples} samples of 4 JPEGs {args.size} + npz + 2 json; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print("| reader | samples/s | MB/s | samples per CPU s | MB per CPU s | wall s | CPU s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['reader']} | {r['samples_per_s']} | {r['mb_per_s']} | {r['samples_per_cpu_s']} | "
              f"{r['mb_per_cpu_s']} | {r['wall_s']} | {r['cpu_s']} |")
    print(f"vlafeed.ShardLoader / best webdataset ({best['reader']}) per CPU second: {ratio:.2f}x")
    vj = video_vs_jpeg(work, manifest)
    print(f"LeRobot video (h264, make-sample) vs WDS JPEG (q95), {args.size}, per frame: "
          f"{vj['video_bytes_per_frame']} vs {vj['jpeg_bytes_per_frame']} bytes on disk; decode "
          f"{vj['video_decode_us_per_frame']} vs {vj['jpeg_decode_us_per_frame']} CPU us "
          f"(vlafeed.Loader stream mode vs vlafeed.ShardLoader, uint8 frames)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "video_vs_jpeg": vj, "ratio_per_cpu_s": round(ratio, 2),
                                              "mb": mb,
                                              "samples": args.samples, "size": args.size,
                                              "load": os.getloadavg()[0]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
