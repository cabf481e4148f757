"""What vlafeed.Mix costs on top of its sources, and the proportions it realises.

    python3 bench/mix_bench.py [DATASET] [--batch-size 32] [--samples 4000]
        [--weights 0.7 0.3] [--window 100] [--keys lowdim|all] [--repeats 3] [--json]

Two sources: the first and the second half of DATASET's episodes (default: a
`vlafeed make-sample` dataset written once to build/bench/mix-data), each a
vlafeed.Loader. In the same run, alternating, repeated:

- sources alone: fresh loaders pull exactly the batches Mix pulled from each
  (the same samples, epoch wraps included), and drop them;
- the same with a state_dict() call before every pull (what Mix does for
  exact resume): the part of Mix's cost that is the sources' bookkeeping;
- Mix: fresh loaders behind vlafeed.Mix, dealing `--samples` samples.

Reported: samples/s (wall) and samples per CPU-second (process CPU time,
engine threads included) for both, their ratio (Mix over sources alone, per
CPU-second: 1.0 means free), and Mix.stats()'s realised proportions, overall
and in the last window, next to the requested weights. `--keys lowdim` keeps
only table columns (no video decode: the worst case for Mix's relative cost);
`--keys all` decodes every camera too.
"""
import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()

import vlafeed  # noqa: E402
from vlafeed import _native  # noqa: E402

LOWDIM = ["index", "episode_index", "frame_index", "timestamp", "observation.state", "action"]


def ensure_dataset(path):
    if (path / "meta" / "info.json").exists():
        return path
    cli = os.environ.get("VF_CLI") or str(ROOT / "build" / "vlafeed")
    subprocess.run([cli, "make-sample", str(path), "--episodes", "8", "--codec", "h264", "--size", "96x64",
                    "--fps", "10", "--min-length", "40", "--max-length", "80", "--seed", "7", "--quiet"], check=True)
    return path


def make_sources(root, args):
    n = len(_native.Dataset(str(root)).episodes)
    halves = [list(range(n // 2)), list(range(n // 2, n))]
    keys = LOWDIM if args.keys == "lowdim" else None
    return [vlafeed.Loader(str(root), batch_size=args.batch_size, seed=i, episodes=eps, keys=keys,
                           threads=args.threads, include_task=False, image_format=args.image_format)
            for i, eps in enumerate(halves)]


def run_mix(root, args):
    sources = make_sources(root, args)
    mix = vlafeed.Mix(sources, args.weights, batch_size=args.batch_size, window=args.window, seed=0)
    c0, t0 = time.process_time(), time.perf_counter()
    done, it = 0, iter(mix)
    while done < args.samples:
        done += len(next(it)["dataset_index"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = mix.stats()
    mix.close()
    return wall, cpu, done, stats


def run_alone(root, args, pulls, with_state=False):
    sources = make_sources(root, args)
    c0, t0 = time.process_time(), time.perf_counter()
    for src, n in zip(sources, pulls):
        it, got = iter(src), 0
        while got < n:
            if with_state:
                src.state_dict()
            try:
                next(it)
                got += 1
            except StopIteration:
                src.set_epoch(src.epoch + 1)
                it = iter(src)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for s in sources:
        s.close()
    return wall, cpu


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", nargs="?", type=Path, default=ROOT / "build" / "bench" / "mix-data")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--weights", type=float, nargs="+", default=[0.7, 0.3])
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--keys", choices=["lowdim", "all"], default="lowdim")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--image-format", choices=["float32", "uint8", "uint8_hwc"], default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if len(args.weights) != 2:
        ap.error("--weights: two weights (the two halves of the dataset)")
    root = ensure_dataset(args.dataset)
    run_mix(root, args)       # warm the page cache and imports
    mixes, alones, stated = [], [], []
    for _ in range(args.repeats):
        wall, cpu, done, stats = run_mix(root, args)
        mixes.append((wall, cpu))
        pulls = [s["batches_pulled"] for s in stats["sources"]]
        alones.append(run_alone(root, args, pulls))
        stated.append(run_alone(root, args, pulls, with_state=True))
    mw, mc = statistics.median(w for w, _ in mixes), statistics.median(c for _, c in mixes)
    aw, ac = statistics.median(w for w, _ in alones), statistics.median(c for _, c in alones)
    sw, sc = statistics.median(w for w, _ in stated), statistics.median(c for _, c in stated)
    res = {"dataset": str(root), "keys": args.keys, "image_format": args.image_format, "batch_size": args.batch_size, "window": args.window,
           "samples": done, "repeats": args.repeats,
           "sources_alone": {"samples_per_s": done / aw, "samples_per_cpu_s": done / ac, "wall_s": aw, "cpu_s": ac},
           "sources_alone_with_state_dict": {"samples_per_s": done / sw, "samples_per_cpu_s": done / sc,
                                             "wall_s": sw, "cpu_s": sc},
           "mix": {"samples_per_s": done / mw, "samples_per_cpu_s": done / mc, "wall_s": mw, "cpu_s": mc},
           "mix_over_alone_per_cpu_s": (done / mc) / (done / ac),
           "mix_cpu_us_per_sample": (mc - ac) / done * 1e6,
           "proportions": [{"requested": s["weight"], "realised": s["proportion"],
                            "last_window": s["last_window_proportion"], "samples": s["samples_taken"],
                            "epochs_completed": s["epochs_completed"]} for s in stats["sources"]]}
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(f"{done} samples, batch {args.batch_size}, window {args.window}, keys {args.keys}, "
          f"images {args.image_format}, median of {args.repeats}")
    print(f"  sources alone: {res['sources_alone']['samples_per_s']:9.0f} samples/s  "
          f"{res['sources_alone']['samples_per_cpu_s']:9.0f} samples/CPU-s")
    print(f"  + state_dict() per pull: {res['sources_alone_with_state_dict']['samples_per_s']:9.0f} samples/s  "
          f"{res['sources_alone_with_state_dict']['samples_per_cpu_s']:9.0f} samples/CPU-s")
    print(f"  Mix:           {res['mix']['samples_per_s']:9.0f} samples/s  "
          f"{res['mix']['samples_per_cpu_s']:9.0f} samples/CPU-s")
    print(f"  Mix / alone per CPU-s: {res['mix_over_alone_per_cpu_s']:.3f}  "
          f"(Mix's own cost ~{res['mix_cpu_us_per_sample']:.1f} us CPU per sample)")
    for i, p in enumerate(res["proportions"]):
        print(f"  source {i}: requested {p['requested']:.3f}  realised {p['realised']:.4f}  "
              f"last window {p['last_window']:.4f}  ({p['samples']} samples, {p['epochs_completed']} epoch wraps)")


if __name__ == "__main__":
    main()
