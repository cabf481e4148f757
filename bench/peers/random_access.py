"""random_access.py: the measuring half of bench/random_access_bench.py,
run once per side in its own process (vlafeed in the main environment,
upstream LeRobot in its venv) so each process's getrusage counts only its
own loader.

    python random_access.py vlafeed|lerobot REQUESTS.json OUT.json

REQUESTS.json: {"threads": 1, "cases": [{"name", "root", "deltas" (None or
{camera: [s, ...]}), "tolerance_s", "positions" [...], "warmup" N}]}. For
every case the dataset is opened once, the first `warmup` positions are read
unmeasured (decoder opens, first touches), then every other position is read
with ds[i] one at a time (what a map-style DataLoader worker does) between
two getrusage(RUSAGE_SELF) readings: user + system CPU of every thread of the
process. OUT.json gets CPU and wall seconds per item and the thread settings
the process ran with.

Both sides run at one thread: torch.set_num_threads(1) (a DataLoader worker's
setting), vlafeed with threads=1 (engine) and one decode thread per reader,
LeRobot's torchcodec VideoDecoder with its default num_ffmpeg_threads (1).
"""
import inspect
import json
import os
import resource
import sys
import time


def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _open_vlafeed(case, threads):
    import vlafeed
    return vlafeed.LeRobotDataset(case["root"], delta_timestamps=case["deltas"], tolerance_s=case["tolerance_s"],
                                  threads=threads)


def _open_lerobot(case, threads):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    return LeRobotDataset("local/vlafeed-bench", root=case["root"], delta_timestamps=case["deltas"],
                          tolerance_s=case["tolerance_s"], video_backend="torchcodec")


def _thread_settings(side, threads):
    import torch
    s = {"torch_num_threads": torch.get_num_threads(), "torch_num_interop_threads": torch.get_num_interop_threads(),
         "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    if side == "vlafeed":
        import vlafeed
        s.update(vlafeed_engine_threads=threads, vlafeed_decode_threads_per_reader=1,
                 vlafeed_version=getattr(vlafeed, "__version__", "?"), torch=torch.__version__)
    else:
        import lerobot
        import torchcodec
        from torchcodec.decoders import VideoDecoder
        p = inspect.signature(VideoDecoder).parameters.get("num_ffmpeg_threads")
        s.update(torchcodec_num_ffmpeg_threads=None if p is None else p.default,
                 lerobot=getattr(lerobot, "__version__", "?"), torchcodec=getattr(torchcodec, "__version__", "?"),
                 torch=torch.__version__, video_backend="torchcodec")
    return s


def main(argv):
    side, req_path, out_path = argv
    req = json.load(open(req_path))
    threads = int(req.get("threads", 1))
    if side == "lerobot":
        from lerobot_peer import prepare_offline_lerobot
        prepare_offline_lerobot()
    import torch
    torch.set_num_threads(threads)
    opener = _open_vlafeed if side == "vlafeed" else _open_lerobot
    out = {"side": side, "threads": _thread_settings(side, threads), "cases": {}}
    for case in req["cases"]:
        t0, c0 = time.monotonic(), _cpu_s()
        ds = opener(case, threads)
        open_wall, open_cpu = time.monotonic() - t0, _cpu_s() - c0
        positions, warmup = case["positions"], case["warmup"]
        checksum = 0.0
        for i in positions[:warmup]:
            ds[i]
        measured = positions[warmup:]
        t0, c0 = time.monotonic(), _cpu_s()
        for i in measured:
            item = ds[i]
        wall, cpu = time.monotonic() - t0, _cpu_s() - c0
        # what the last item held (a cheap check that both read the same frames)
        for key in sorted(k for k in item if k.startswith("observation.images")):
            checksum += float(item[key].double().sum())
        out["cases"][case["name"]] = {"items": len(measured), "cpu_s": cpu, "wall_s": wall,
                                      "cpu_ms_per_item": 1e3 * cpu / len(measured),
                                      "wall_ms_per_item": 1e3 * wall / len(measured),
                                      "open_wall_s": open_wall, "open_cpu_s": open_cpu,
                                      "last_item_pixel_sum": checksum, "last_position": measured[-1]}
        print(f"{side} {case['name']}: {out['cases'][case['name']]['cpu_ms_per_item']:.3f} CPU-ms/item",
              file=sys.stderr, flush=True)
        del ds, item
    with open(out_path, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
