#!/usr/bin/env python3
"""opens_bench.py: MP4 opens and throughput of one loader, against `vlafeed plan`.

    python3 bench/opens_bench.py ROOT [--mode stream] [--threads 1,2,4] [--batch-size 32]
                                 [--batches N] [--share default|on|off] [--repeat 3]
                                 [--package DIR]

For each thread count: a `vlafeed.Loader` (numpy output, float32 [C,H,W]
images) reads --batches batches (0: the whole epoch) after one untimed batch;
prints samples/s (wall), samples per CPU-second (getrusage of this process:
user + sys, meaningful on a shared machine), the MP4 opens the run counted
(stats()["video_opens"]) and, for a whole epoch, plan's figure and bound.
The best of --repeat runs per row is kept (least CPU per sample).
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
import _inplace  # noqa: E402

if "--package" in sys.argv[:-1]:  # another build first (a baseline), e.g. the main checkout's python/
    sys.path.insert(0, sys.argv[sys.argv.index("--package") + 1])
else:
    _inplace.use()

import vlafeed  # noqa: E402
import vlafeed.plan as vplan  # noqa: E402


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(root, mode, threads, batch_size, batches, share):
    kw = {} if share == "default" else {"share_video_readers": share == "on"}
    loader = vlafeed.Loader(root, mode=mode, batch_size=batch_size, threads=threads, output="numpy", **kw)
    try:
        it = iter(loader)
        first = next(it)
        n = 0
        t0, c0 = time.perf_counter(), cpu()
        for i, b in enumerate(it):
            n += len(b["index"])
            if batches and i + 1 >= batches:
                break
        wall, used = time.perf_counter() - t0, cpu() - c0
        return {"samples": n, "wall_s": wall, "cpu_s": used, "samples_per_s": n / wall,
                "samples_per_cpu_s": n / used, "video_opens": loader.stats()["video_opens"],
                "first": len(first["index"])}
    finally:
        loader.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--mode", default="stream")
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=0)
    ap.add_argument("--share", default="default", choices=["default", "on", "off"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--package", help="import vlafeed from this folder (a baseline build's python/)")
    a = ap.parse_args()
    opens = vplan.plan(a.root, mode=a.mode, batch_size=a.batch_size)["opens"]
    print(f"vlafeed from {os.path.dirname(vlafeed.__file__)}", flush=True)
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        best = min((run(a.root, a.mode, t, a.batch_size, a.batches, a.share) for _ in range(a.repeat)),
                   key=lambda r: r["cpu_s"] / r["samples"])
        best.update(threads=t, mode=a.mode, share=a.share)
        rows.append(best)
        print(f"{a.mode} threads {t} share {a.share}: {best['samples_per_s']:.1f} samples/s, "
              f"{best['samples_per_cpu_s']:.1f} samples/CPU-s, opens {best['video_opens']} "
              f"(plan {opens['consumer_opens']}, bound {opens['lower_bound']})", flush=True)
    print(json.dumps({"plan": opens, "runs": rows}))


if __name__ == "__main__":
    main()
