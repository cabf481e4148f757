"""Conversion throughput of `vlafeed convert --to wds`, and what the user
trades by choosing shards of JPEGs over LeRobot's video: bytes on disk and
CPU cost of decoding one frame, for the same dataset.

    python3 bench/convert_wds_bench.py --out /tmp/vfbench/wds [--episodes 20]

Datasets: a make-sample dataset (AV1 via libsvtav1, 2 cameras, 320x240,
30 fps, GOP 2, crf 30: LeRobot's defaults) and the real v2.1 fixture
../shared/fixtures/lerobot-g1-v21 (AV1 640x480, episodes 1, 2, 4: the ones
whose videos are present).

Measured per conversion (one process, /usr/bin/time): wall and CPU seconds,
peak RSS, frames decoded per second, samples per second and output MB/s.
Decode cost per frame, each per CPU second of the decoding process:
  video: build/bench_video's seq_rgb (sequential decode + RGB24, the
         cheapest way to read video; random access costs more with GOP 2)
         on every camera file of the dataset;
  JPEG:  build/bench_jpeg (TurboJPEG into RGB24, C, like the video figure)
         and PIL (libjpeg-turbo) decoding every `<cam>_t0.jpg` of the shards
         to an RGB numpy array, as webdataset's .decode("rgb8") does.
Bytes: videos/ + data/ of the LeRobot dataset against the shard tars, for the
default image offsets -1,0 (each frame stored twice per camera) and for 0.
"""
import argparse
import glob
import io
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = os.environ.get("VF_CLI", str(ROOT / "build" / "vlafeed"))
BENCH_VIDEO = str(ROOT / "build" / "bench_video")
BENCH_JPEG = str(ROOT / "build" / "bench_jpeg")
FIXTURE = ROOT.parent / "shared" / "fixtures" / "lerobot-g1-v21"


def timed(cmd):
    """(stdout, wall s, cpu s, peak RSS MiB) of one command through /usr/bin/time."""
    t0 = time.time()
    r = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M"] + [str(c) for c in cmd], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"{cmd}: {r.stderr[-2000:]}")
    line = [l for l in r.stderr.splitlines() if l.startswith("TIME ")][-1].split()
    return r.stdout, float(line[1]), float(line[2]) + float(line[3]), int(line[4]) / 1024.0, time.time() - t0


def du(paths):
    return sum(os.path.getsize(p) for pattern in paths for p in glob.glob(pattern, recursive=True)
               if os.path.isfile(p))


def convert(src, out, extra):
    shutil.rmtree(out, ignore_errors=True)  # a complete output would only be re-verified
    stdout, wall, cpu, rss, _ = timed([CLI, "convert", src, out, "--to", "wds", "--json", "--quiet"] + extra)
    s = json.loads(stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": rss, "samples": s["samples"],
            "frames_decoded": s["frames_decoded"], "jpegs": s["jpegs_encoded"], "output_bytes": s["output_bytes"],
            "spill_bytes": s["spill_bytes"], "frames_per_s": s["frames_decoded"] / wall,
            "samples_per_s": s["samples"] / wall, "output_mb_per_s": s["output_bytes"] / 1e6 / wall}


def video_decode_cost(mp4s):
    """CPU microseconds per frame of sequential decode + RGB24 (bench_video seq_rgb)."""
    rates = []
    for mp4 in mp4s:
        r = subprocess.run([BENCH_VIDEO, mp4, "--seconds", "1"], capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            if line.startswith("seq_rgb "):
                rates.append(float(line.split()[1]))
    per_s = sum(rates) / len(rates)
    return 1e6 / per_s


def turbojpeg_decode_cost(shards_dir, camera):
    """CPU microseconds per frame of TurboJPEG decode to RGB24 (build/bench_jpeg)."""
    r = subprocess.run([BENCH_JPEG, f".{camera}_t0.jpg"] + sorted(glob.glob(f"{shards_dir}/shard_*.tar")),
                       capture_output=True, text=True, check=True)
    return 1e6 / float(r.stdout.split()[1])


def jpeg_decode_cost(shards_dir, camera):
    import numpy as np
    from PIL import Image
    blobs = []
    for tar in sorted(glob.glob(f"{shards_dir}/shard_*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                if m.name.endswith(f".{camera}_t0.jpg"):
                    blobs.append(tf.extractfile(m).read())
    c0 = time.process_time()
    for b in blobs:
        np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
    cpu = time.process_time() - c0
    return 1e6 * cpu / len(blobs), sum(map(len, blobs)) / len(blobs), len(blobs)


def one_dataset(name, src, out, extra, cameras, video_glob, data_glob):
    print(f"== {name}", flush=True)
    full = convert(src, out / f"{name}-wds", extra)
    only_t0 = convert(src, out / f"{name}-wds-t0", extra + ["--image-offsets", "0"])
    shards = out / f"{name}-wds" / "shards"
    frames = full["samples"]
    video_bytes = du([video_glob])
    data_bytes = du([data_glob])
    mp4s = sorted(glob.glob(video_glob, recursive=True))
    video_us = video_decode_cost(mp4s)
    jpeg_us, jpeg_bytes, n = jpeg_decode_cost(shards, cameras[0])
    turbo_us = turbojpeg_decode_cost(shards, cameras[0])
    res = {"dataset": name, "frames_per_camera": frames, "cameras": len(cameras), "convert": full,
           "convert_offset0": only_t0,
           "bytes": {"lerobot_video": video_bytes, "lerobot_data": data_bytes,
                     "wds_offsets_-1_0": full["output_bytes"], "wds_offset_0": only_t0["output_bytes"],
                     "video_per_frame": video_bytes / (frames * len(cameras)),
                     "jpeg_per_frame": jpeg_bytes},
           "decode_cpu_us_per_frame": {"video_seq_rgb": video_us, "jpeg_turbojpeg": turbo_us, "jpeg_pil": jpeg_us, "jpeg_frames_timed": n}}
    print(json.dumps(res, indent=1), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--episodes", type=int, default=20)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    ds = out / "sample"
    if not ds.exists():
        subprocess.run([CLI, "make-sample", ds, "--episodes", str(a.episodes), "--cameras", "2", "--quiet"],
                       check=True)
    results.append(one_dataset("make-sample-av1-320x240", ds, out, [], ["cam0", "cam1"],
                               f"{ds}/videos/**/*.mp4", f"{ds}/data/**/*.parquet"))
    if FIXTURE.is_dir():
        results.append(one_dataset("g1-v21-av1-640x480", FIXTURE, out, ["--episodes", "1,2,4"], ["cam_high"],
                                   f"{FIXTURE}/videos/chunk-000/*/episode_00000[124].mp4",
                                   f"{FIXTURE}/data/chunk-000/episode_00000[124].parquet"))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n| dataset | frames/s | samples/s | output MB/s | CPU s | peak RSS MiB | LeRobot video+data MB | "
          "WDS MB (offsets -1,0) | WDS MB (offset 0) | video decode us/frame | TurboJPEG us/frame | PIL us/frame |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        c, b, d = r["convert"], r["bytes"], r["decode_cpu_us_per_frame"]
        print(f"| {r['dataset']} | {c['frames_per_s']:.0f} | {c['samples_per_s']:.0f} | {c['output_mb_per_s']:.1f} | "
              f"{c['cpu_s']:.1f} | {c['peak_rss_mib']:.0f} | {(b['lerobot_video'] + b['lerobot_data']) / 1e6:.1f} | "
              f"{b['wds_offsets_-1_0'] / 1e6:.1f} | {b['wds_offset_0'] / 1e6:.1f} | {d['video_seq_rgb']:.0f} | "
              f"{d['jpeg_turbojpeg']:.0f} | {d['jpeg_pil']:.0f} |")


if __name__ == "__main__":
    main()
