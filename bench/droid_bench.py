#!/usr/bin/env python3
"""droid_bench.py: vlafeed on a DROID-shaped LeRobot v3.0 dataset, globally shuffled.

    python3 bench/droid_bench.py [--out DIR] [--episodes 24] [--codecs av1,h264]
                                 [--modes map,pool] [--batches 30] [--threads N] [--no-remote]

The shape is DROID's as LeRobot publishes it (lerobot/droid_1.0.1): 3 cameras
at 320x180, 15 fps, episodes of a few hundred frames, each camera's episodes
packed into MP4 files that roll over by size on their own (the recorder's
per-camera rollover, so one episode's cameras sit in files with different
indices). The datasets are written by `vlafeed make-sample` (LeRobot's
encoding defaults: GOP 2, crf 30), once per codec, and kept in DIR/data-<codec>.
Sizes are chosen to build in a few minutes on a 2-core machine; the real DROID
has 95.6K episodes in 2,154 MP4s, which changes what a file open costs but not
what a decoded sample costs.

For each codec and each mode (map: a global permutation of every frame of the
dataset; pool: the episode pool, uniform random frames across
`episode_pool_size` whole episodes), a `vlafeed.Loader` with shuffle on,
batch 64, LeRobot's float32 [C,H,W] images and the tabular columns, and as
many engine threads as the machine has cores, takes --batches batches after
a first one that is not timed. It reports:

  samples/s (wall), samples per CPU-second (getrusage of this process, so
  it stays meaningful on a shared machine; one fully used core delivers
  this many samples per second), CPU utilisation, and the bytes read per
  sample (/proc/self/io rchar over the timed batches: the pread()s of
  video packets and Parquet pages; the data files here are under the 1 MiB
  from which vlafeed maps Parquet ranges instead of reading them).

Next to it: the best published end-to-end figures for this shape (Lance on
local disk, 632.7 samples/s on a 112-core 8xH100 node, real shuffle, batch 64,
= 5.65 samples/s per core; LeRobot streaming 613.4 samples/s with 117 GB of
RAM).

Remote (unless --no-remote): the AV1 dataset served over HTTP on loopback
(tests/python/remote_server.py, range requests), a map-mode loader on the
http:// root, the bytes the server sent counted from its request log
(every GET's range, HEADs are 0) from the first batch on (the loader's open,
which reads the metadata, is counted apart), over few batches
(--remote-batches), so that most frames land in parts of the MP4s not
fetched yet, as they would in a dataset far larger than this one.
`Loader.stats()` has no byte counter for HTTP reads (the HTTP client counts
them, vf_http_client_stats, but the loader does not report them), hence
the server-side count. The floor for a
sample is what it cannot do without: per camera, the packets from the
keyframe at or before its frame up to the frame (decode order; from the
MP4's packet index, read with PyAV), plus its share of the data Parquet
(file bytes / rows). The ratio fetched / floor is printed for the default
1 MiB read-ahead block and for VF_HTTP_BLOCK_BYTES=65536.

Writes DIR/droid.json and prints a Markdown table (bench/droid.md has the
figures of the last run).
"""
import argparse
import bisect
import json
import os
import platform
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _inplace  # noqa: E402

_inplace.use()
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

LANCE_SAMPLES_S, LANCE_CORES = 632.7, 112
LEROBOT_STREAMING_SAMPLES_S = 613.4


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def find_cli():
    for c in (os.environ.get("VF_CLI"), os.path.join(ROOT, "build", "vlafeed")):
        if c and os.path.exists(c):
            return c
    raise SystemExit("droid_bench: build the vlafeed command first (make build) or set VF_CLI")


def make_dataset(cli, out, codec, episodes, max_video_mb):
    path = os.path.join(out, f"data-{codec}")
    if os.path.exists(os.path.join(path, "meta", "info.json")):
        return path, None
    t0 = time.monotonic()
    log(f"droid_bench: writing {path} ({episodes} episodes x 3 cameras 320x180 @ 15 fps, {codec})...")
    subprocess.run([cli, "make-sample", path, "--episodes", str(episodes), "--cameras", "3", "--size", "320x180",
                    "--fps", "15", "--codec", codec, "--gop", "2", "--crf", "30", "--min-length", "150",
                    "--max-length", "350", "--max-video-mb", str(max_video_mb), "--seed", "1", "--quiet"],
                   check=True)
    return path, time.monotonic() - t0


def dataset_shape(path):
    with open(os.path.join(path, "meta", "info.json")) as f:
        info = json.load(f)
    files = {}
    for dirpath, _, names in os.walk(os.path.join(path, "videos")):
        for n in names:
            if n.endswith(".mp4"):
                cam = os.path.relpath(dirpath, os.path.join(path, "videos")).split(os.sep)[0]
                files[cam] = files.get(cam, 0) + 1
    return info["total_episodes"], info["total_frames"], files


def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_loader(root, mode, batches, threads, batch_size=64, server=None):
    """Times `batches` batches after a first one that is not timed. With a server, also returns its request
    log from the loader's open on (the metadata the open reads is before it) and the samples counted there
    (the first batch included)."""
    import vlafeed
    loader = vlafeed.Loader(root, mode=mode, batch_size=batch_size, shuffle=True, seed=0, threads=threads,
                            output="numpy", rank=0, world_size=1)
    if batches + 1 > len(loader):
        log(f"droid_bench: only {len(loader)} batches per epoch; taking {len(loader) - 1}")
        batches = len(loader) - 1
    log_start = len(server.log) if server else 0
    it = iter(loader)
    first = len(next(it)["index"])  # first batch: opens and indexes the MP4s it touches; not timed
    c0, r0, t0 = cpu_s(), rchar(), time.monotonic()
    samples = 0
    for _ in range(batches):
        samples += len(next(it)["index"])
    wall, cpu, read = time.monotonic() - t0, cpu_s() - c0, rchar() - r0
    st = loader.stats()
    log_slice = (server.log[log_start:], first + samples) if server else None
    loader.close()
    return dict(samples=samples, wall_s=wall, cpu_s=cpu, samples_per_s=samples / wall,
                samples_per_cpu_s=samples / cpu, cpu_utilisation=cpu / wall, bytes_read_per_sample=read / samples,
                engine_threads=st["engine_threads"], frames_decoded=st["frames_decoded"],
                frames_delivered=st["frames_delivered"], video_opens=st["video_opens"]), log_slice


# ---- remote: bytes served against the GOP floor ----------------------------------------

def served_bytes(log, root_dir, url_prefix):
    total, requests = 0, 0
    for method, path, rng in log:
        if method != "GET":
            continue
        requests += 1
        full = os.path.join(root_dir, path.lstrip("/"))
        size = os.path.getsize(full)
        if not rng:
            total += size
            continue
        a, b = rng.split("=", 1)[1].split("-")
        if a == "":
            total += min(size, int(b))
        else:
            end = min(int(b), size - 1) if b else size - 1
            total += end - int(a) + 1
    return total, requests


def packet_index(mp4):
    """Per frame in presentation order: (bytes from the keyframe at or before it to it, in decode order)."""
    import av
    with av.open(mp4) as c:
        s = c.streams.video[0]
        pkts = [(p.pts, p.dts, p.size, p.is_keyframe) for p in c.demux(s) if p.size > 0]
    # Decode order as stored; prefix sums of sizes.
    prefix = [0]
    for p in pkts:
        prefix.append(prefix[-1] + p[2])
    keys = [i for i, p in enumerate(pkts) if p[3]]
    by_pts = sorted(range(len(pkts)), key=lambda i: pkts[i][0])
    cost = []
    for i in by_pts:  # frame ordinal = rank in pts order
        k = keys[bisect.bisect_right(keys, i) - 1] if keys and keys[0] <= i else 0
        cost.append(prefix[i + 1] - prefix[k])
    return cost


def sample_floor(path):
    """Mean floor bytes of a uniformly random sample: per camera, the mean GOP-prefix bytes over every frame
    (every frame of the dataset is one sample in map mode, all cameras), plus the data Parquet bytes per row."""
    total_frames = dataset_shape(path)[1]
    video = 0.0
    for dirpath, _, names in os.walk(os.path.join(path, "videos")):
        for n in sorted(names):
            if n.endswith(".mp4"):
                video += sum(packet_index(os.path.join(dirpath, n)))
    table = 0
    for dirpath, _, names in os.walk(os.path.join(path, "data")):
        for n in names:
            if n.endswith(".parquet"):
                table += os.path.getsize(os.path.join(dirpath, n))
    return video / total_frames, table / total_frames


def run_remote(path, batches, threads, block_bytes):
    from remote_server import RemoteServer
    parent, name = os.path.split(os.path.realpath(path))  # (the server does not follow links)
    env_before = os.environ.get("VF_HTTP_BLOCK_BYTES")
    if block_bytes:
        os.environ["VF_HTTP_BLOCK_BYTES"] = str(block_bytes)
    try:
        with RemoteServer(parent, lifetime_s=3600) as srv:
            res, (log_slice, samples) = run_loader(srv.url(name), "map", batches, threads, server=srv)
            total, requests = served_bytes(log_slice, parent, srv.url(""))
            whole, whole_requests = served_bytes(srv.log, parent, srv.url(""))
            res["samples_fetched_for"] = samples
    finally:
        if env_before is None:
            os.environ.pop("VF_HTTP_BLOCK_BYTES", None)
        else:
            os.environ["VF_HTTP_BLOCK_BYTES"] = env_before
    res.update(fetched_bytes=total, requests=requests, fetched_per_sample=total / res["samples_fetched_for"],
               open_bytes=whole - total, open_requests=whole_requests - requests)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/vf-droid")
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--max-video-mb", type=float, default=3)
    ap.add_argument("--codecs", default="av1,h264")
    ap.add_argument("--modes", default="map,pool")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="engine threads (default: the number of cores)")
    ap.add_argument("--no-remote", action="store_true")
    ap.add_argument("--remote-batches", type=int, default=2,
                    help="timed batches of the remote run (after the first); few, so that most frames come from "
                         "parts of the files not fetched yet, as in a dataset far larger than this one")
    a = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    threads = a.threads or cores
    os.makedirs(a.out, exist_ok=True)
    cli = find_cli()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    doc = dict(machine=dict(cores=cores, cpu=platform.processor() or platform.machine(), loadavg_before=load),
               threads=threads, batch_size=64, image_format="float32 CHW", runs=[], datasets={})
    log(f"droid_bench: {cores} cores, {threads} engine threads, batch 64, load {' '.join(load)}")
    for codec in a.codecs.split(","):
        path, build_s = make_dataset(cli, a.out, codec, a.episodes, a.max_video_mb)
        eps, frames, files = dataset_shape(path)
        doc["datasets"][codec] = dict(path=path, episodes=eps, frames=frames, mp4_files=files, build_s=build_s)
        for mode in a.modes.split(","):
            log(f"droid_bench: {codec} {mode} ...")
            res, _ = run_loader(path, mode, a.batches, threads)
            res.update(codec=codec, mode=mode)
            doc["runs"].append(res)
            log(f"droid_bench:   {res['samples_per_s']:.1f} samples/s, {res['samples_per_cpu_s']:.1f} per CPU-s, "
                f"{res['bytes_read_per_sample']:.0f} B read/sample")
    if not a.no_remote:
        codec = a.codecs.split(",")[0]
        path = doc["datasets"][codec]["path"]
        video_floor, table_floor = sample_floor(path)
        doc["remote"] = dict(codec=codec, floor_video_per_sample=video_floor, floor_table_per_sample=table_floor,
                             floor_per_sample=video_floor + table_floor, runs=[])
        for block in (0, 65536):
            log(f"droid_bench: remote map, block {block or 'default (1 MiB)'} ...")
            res = run_remote(path, a.remote_batches, threads, block)
            res.update(block_bytes=block or (1 << 20), ratio_to_floor=res["fetched_per_sample"] /
                       (video_floor + table_floor))
            doc["remote"]["runs"].append(res)
            log(f"droid_bench:   {res['fetched_per_sample']:.0f} B fetched/sample, floor "
                f"{video_floor + table_floor:.0f}, ratio {res['ratio_to_floor']:.1f}")
    with open(os.path.join(a.out, "droid.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(table(doc))


def table(doc):
    lines = ["| codec | mode | threads | samples/s | samples per CPU-s (per core) | CPU used | bytes read / sample |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        lines.append(f"| {r['codec']} | {r['mode']} | {r['engine_threads']} | {r['samples_per_s']:,.1f} | "
                     f"{r['samples_per_cpu_s']:,.1f} | {r['cpu_utilisation']:.2f} | "
                     f"{r['bytes_read_per_sample']:,.0f} |")
    lines.append(f"| Lance, local disk (published) | real shuffle | 112 cores | {LANCE_SAMPLES_S} | "
                 f"{LANCE_SAMPLES_S / LANCE_CORES:.2f} | | |")
    lines.append(f"| LeRobot streaming (published) | | | {LEROBOT_STREAMING_SAMPLES_S} (117 GB RAM) | | | |")
    if "remote" in doc:
        rm = doc["remote"]
        lines += ["", f"Remote (http, {rm['codec']}, map): floor {rm['floor_per_sample']:,.0f} B per sample "
                      f"({rm['floor_video_per_sample']:,.0f} video GOP bytes + {rm['floor_table_per_sample']:,.0f} "
                      "table)", "",
                  "| read-ahead block | samples | fetched / sample | requests | fetched / floor | open: bytes, requests |",
                  "|---|---|---|---|---|---|"]
        for r in rm["runs"]:
            lines.append(f"| {r['block_bytes']:,} | {r['samples_fetched_for']} | {r['fetched_per_sample']:,.0f} | "
                         f"{r['requests']} | {r['ratio_to_floor']:.1f} | {r['open_bytes']:,}, {r['open_requests']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
