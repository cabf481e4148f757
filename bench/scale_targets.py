#!/usr/bin/env python3
"""Issue 26's targets 1-5, measured in one run, each in a fresh process.

Prints one markdown table: target, what was measured, the figure, the
target and whether it is met. The figures are CPU seconds (user + system,
all threads, from GNU time) and wall seconds of the whole child process
(Python start-up included where the child is Python), and peak RSS.

  1. metadata open, 1M episodes, LeRobot's real stats columns (q01..q99),
     both layouts (one row group per meta/episodes file; the recorder's
     10-row row groups): `vlafeed info` and a stream loader (rank 0 of
     1,024), cold (an empty metadata cache: VF_CACHE_DIR is a fresh folder)
     and warm (the same folder, second open). Target: < 2 s wall and
     < 2 CPU-s.
  2. MP4 opens per epoch at 1,024 ranks x 8 workers on the DROID shape, as
     `vlafeed plan` prints them for stream, pool and map mode, against the
     lower bound (distinct files per consumer, summed). Target: <= 1.5x.
     (That the printed figure equals the opens a run counts at 1, 2 and 4
     threads is tests/python/test_plan_opens.py.)
  3. map mode's tabular cost per sample (bench/map_table_bench.py) at 10K
     and 100K episodes in both data layouts: a later run over the table
     cache on disk (the figure), Parquet only and the first run (beside
     it), and stream mode's. Target: flat from 10K to 100K (within 25%)
     and within 2x of stream.
  4. the pool-mode resume state after 1,024 x 8 -> 768 x 4 at 26% of an
     epoch (100K episodes). Target: O(consumers), not O(samples delivered).
  5. the model's bytes per episode per camera at 1M (RSS after the open,
     less the interpreter's); `vlafeed.plan.plan` on an open dataset;
     world-1 map loader open at 1M. Target: <= ~150 B; no metadata reread;
     no per-position pass.

Datasets come from bench/scale_meta.py (cached under --cache, /tmp/vf-scale
by default); the 1M ones take minutes and ~2.4 / 4.7 GB the first time.

usage:
  python3 bench/scale_targets.py                  # all five, ~10-15 min once the datasets exist
  python3 bench/scale_targets.py --only 1,4 --json out.json
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _inplace  # noqa: E402
import scale_bench  # noqa: E402
import scale_meta  # noqa: E402

PY_PRELUDE = "import json, resource, sys, time\n"


def py_child(code, args, env=None):
    """Runs Python code in a child under GNU time; the code prints one JSON
    line last. Returns (result dict, run dict)."""
    r = scale_bench.run_child([sys.executable, "-c", PY_PRELUDE + code], args.timeout, env or _inplace.child_env())
    out = {}
    for line in r["stdout"].splitlines():
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except ValueError:
                pass
    if r["rc"] != 0 and not out:
        out = dict(error=(r["stderr"].strip().splitlines() or [f"exit {r['rc']}"])[-1][:200])
    return out, r


def dataset(size, variant, args):
    return scale_bench.ensure_dataset(size, variant, args.cache)


def row(target, what, figure, goal, met):
    return dict(target=target, what=what, figure=figure, goal=goal, met=met)


def target1(args, rows):
    cli = scale_bench.find_cli(args.cli)
    flags = scale_bench.skip_check_flags(cli)
    for variant, label in (("meta-lr", "one row group per file"), ("meta-rg10-lr", "10-row row groups")):
        root = dataset(args.size, variant, args)
        scale_bench.warm_meta(root)
        cache = tempfile.mkdtemp(prefix="vf-meta-cache-")
        env = dict(_inplace.child_env(), VF_CACHE_DIR=cache)
        for phase in ("cold", "warm"):  # the loader below starts cold again, in its own empty folder
            r = scale_bench.run_child([cli, "info", "--json", "--compact", *flags, str(root)], args.timeout, env)
            ok = r["cpu_s"] is not None and r["cpu_s"] < 2 and r["wall_s"] < 2
            rows.append(row(1, f"`vlafeed info`, {args.size} {label}, {phase}",
                            f"{r['wall_s']:.2f} s, {r['cpu_s']:.2f} CPU-s, {r['maxrss_mb']:.0f} MB",
                            "< 2 s, < 2 CPU-s", ok))
        lcache = tempfile.mkdtemp(prefix="vf-meta-cache-")
        lenv = dict(_inplace.child_env(), VF_CACHE_DIR=lcache)
        code = ("import vlafeed, warnings; warnings.simplefilter('ignore')\n"
                "from vlafeed import _native\n"
                f"ds = _native.Dataset({str(root)!r}, check_files=False)\n"
                "l = vlafeed.Loader(ds, mode='stream', rank=0, world_size=1024, batch_size=32, output='numpy')\n"
                "print(json.dumps(dict(batches=len(l))))\n")
        for phase in ("cold", "warm"):
            out, r = py_child(code, args, lenv)
            if "error" in out:
                rows.append(row(1, f"stream loader rank 0/1,024, {label}, {phase}", "error: " + out["error"],
                                "< 2 s, < 2 CPU-s", False))
                continue
            ok = r["cpu_s"] < 2 and r["wall_s"] < 2
            rows.append(row(1, f"stream loader rank 0/1,024 (whole Python process), {args.size} {label}, {phase}",
                            f"{r['wall_s']:.2f} s, {r['cpu_s']:.2f} CPU-s, {r['maxrss_mb']:.0f} MB",
                            "< 2 s, < 2 CPU-s", ok))


def target2(args, rows):
    cli = scale_bench.find_cli(args.cli)
    params = scale_meta.shape_params("droid", episode_stats=False)
    root = pathlib.Path(args.cache) / scale_meta.variant_name("droid", params)
    scale_meta.generate(root, quiet=True, **params)
    for mode in ("stream", "pool", "map"):
        r = scale_bench.run_child([cli, "plan", "--json", "--world-size", "1024", "--workers", "8", "--mode", mode,
                                   str(root)], args.timeout)
        try:
            doc = json.loads(r["stdout"])
            o = doc["opens"]
        except (ValueError, KeyError):
            rows.append(row(2, f"`vlafeed plan` {mode}, DROID shape, 1,024 x 8",
                            "error: " + scale_bench.first_line(r["stderr"] or r["stdout"]), "<= 1.5x bound", False))
            continue
        ratio = o.get("ratio_to_lower_bound")
        rows.append(row(2, f"`vlafeed plan --mode {mode}`, DROID shape, 1,024 x 8",
                        f"{o.get('consumer_opens'):,} opens, bound {o.get('lower_bound'):,} ({ratio:.2f}x)",
                        "<= 1.5x bound", ratio is not None and ratio <= 1.5))


def target3(args, rows):
    import map_table_bench as mtb
    ns = argparse.Namespace(batch_size=32, threads=min(2, os.cpu_count() or 1), warmup=4, samples=args.map_samples,
                            stream_samples=args.stream_samples, timeout=args.timeout, package=None,
                            table_cache_bytes=0, table_cache_dir=None, cache=args.cache)
    res = {}
    for size in ("10k", "100k"):
        for layout in ("file", "episode"):
            params = scale_meta.shape_params(size, **mtb.LAYOUTS[layout])
            root = pathlib.Path(args.cache) / scale_meta.variant_name(size, params)
            scale_meta.generate(root, quiet=True, **params)
            # map-cold fills the table cache on disk, map-warm is a later run
            for mode in ("map-parquet", "map-cold", "map-warm", "stream"):
                res[size, layout, mode] = mtb.measure(root, mode, ns)
    for layout in ("file", "episode"):
        m10, m100 = res["10k", layout, "map-warm"], res["100k", layout, "map-warm"]
        p100, c100 = res["100k", layout, "map-parquet"], res["100k", layout, "map-cold"]
        s100 = res["100k", layout, "stream"]
        if any("error" in x for x in (m10, m100, s100, p100, c100)):
            err = next(x["error"] for x in (m10, m100, s100, p100, c100) if "error" in x)
            rows.append(row(3, f"map tabular, {layout} layout", "error: " + err, "flat, >= 0.5x stream", False))
            continue
        flat = m100["per_cpu_s"] / m10["per_cpu_s"]
        vs = m100["per_cpu_s"] / s100["per_cpu_s"]
        rows.append(row(3, f"map tabular samples/CPU-s, {layout} layout: 10K -> 100K (later runs: table cache on "
                           f"disk filled)",
                        f"{m10['per_cpu_s']:.0f} -> {m100['per_cpu_s']:.0f} ({flat:.2f}x); 100K Parquet only "
                        f"{p100['per_cpu_s']:.0f}, first run {c100['per_cpu_s']:.0f}", ">= 0.75x", flat >= 0.75))
        rows.append(row(3, f"map vs stream at 100K, {layout} layout",
                        f"{m100['per_cpu_s']:.0f} vs {s100['per_cpu_s']:.0f} ({vs:.3f}x)", ">= 0.5x", vs >= 0.5))


T4_CODE = r'''
import vlafeed
from vlafeed import _native
ds = _native.Dataset(ROOT, check_files=False, check_videos=0)
frames = vlafeed.LeRobotDatasetMetadata(ds).total_frames
batches = int(frames // 1024 // 16 * 0.26)
st = _native.loader_state(ds, epoch=0, batches=batches, num_consumers=8, mode="pool", batch_size=16, seed=1,
                          world_size=1024, episode_pool_size=16)
c0 = time.process_time()
new = _native.resolve_state(ds, resume=st, mode="pool", batch_size=16, seed=1, world_size=768, num_consumers=4,
                            episode_pool_size=16)
c1 = time.process_time()
text = json.dumps(new)
ranges = sum(len(c.get("ranges", [])) for c in new.get("consumers", []) if isinstance(c, dict)) \
    if isinstance(new.get("consumers"), list) else len(new.get("ranges", []) or [])
print(json.dumps(dict(bytes=len(text), ranges=ranges, resolve_cpu_s=c1 - c0,
                      maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
'''


def target4(args, rows):
    params = scale_meta.shape_params("100k", episode_stats=False)
    root = pathlib.Path(args.cache) / scale_meta.variant_name("100k", params)
    scale_meta.generate(root, quiet=True, **params)
    out, r = py_child(T4_CODE.replace("ROOT", repr(str(root))), args)
    if "error" in out:
        rows.append(row(4, "pool elastic state, 100K, 1,024 x 8 -> 768 x 4 at 26%", "error: " + out["error"],
                        "O(consumers)", False))
        return
    rows.append(row(4, "pool-mode state after 1,024 x 8 -> 768 x 4 at 26% of an epoch, 100K",
                    f"{out['bytes']:,} B of JSON, {out['ranges']} ranges, resolve {out['resolve_cpu_s']:.2f} CPU-s, "
                    f"{r['maxrss_mb']:.0f} MB peak", "O(consumers): < 1 MB", out["bytes"] < (1 << 20)))


T5_MODEL = r'''
import vlafeed
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
r0 = rss()
from vlafeed import _native
ds = _native.Dataset(ROOT, check_files=False, check_videos=0)
r1 = rss()
meta = vlafeed.LeRobotDatasetMetadata(ds)
cams = len(meta.video_keys)
c0 = time.process_time()
p = vlafeed.plan.plan(meta, world_size=1024, workers=8)
c1 = time.process_time()
print(json.dumps(dict(model_bytes=r1 - r0, episodes=meta.total_episodes, cameras=cams, plan_cpu_s=c1 - c0)))
'''

T5_MAP = r'''
import vlafeed, warnings
warnings.simplefilter("ignore")
c0 = time.process_time()
from vlafeed import _native
ds = _native.Dataset(ROOT, check_files=False)
l = vlafeed.Loader(ds, mode="map", world_size=1, rank=0, batch_size=32, output="numpy")
c1 = time.process_time()
print(json.dumps(dict(open_cpu_s=c1 - c0, batches=len(l))))
'''


def target5(args, rows):
    root = dataset(args.size, "meta-lr", args)
    env = dict(_inplace.child_env(), VF_CACHE_DIR=tempfile.mkdtemp(prefix="vf-meta-cache-"))
    out, r = py_child(T5_MODEL.replace("ROOT", repr(str(root))), args, env)
    if "error" in out:
        rows.append(row(5, "model size", "error: " + out["error"], "<= ~150 B", False))
    else:
        per = out["model_bytes"] / (out["episodes"] * max(1, out["cameras"]))
        rows.append(row(5, f"model bytes per episode per camera, {args.size} ({out['cameras']} cameras)",
                        f"{per:.0f} B", "<= ~150 B", per <= 150))
        rows.append(row(5, "`vlafeed.plan.plan(meta)` on the open metadata, 1,024 x 8",
                        f"{out['plan_cpu_s']:.2f} CPU-s", "no metadata reread (< open's cost)",
                        out["plan_cpu_s"] < r["cpu_s"] / 2))
    out, r = py_child(T5_MAP.replace("ROOT", repr(str(root))), args, env)
    if "error" in out:
        rows.append(row(5, "world-1 map loader open", "error: " + out["error"], "no per-position pass", False))
    else:
        rows.append(row(5, f"world-1 map loader, {args.size}, whole process",
                        f"open {out['open_cpu_s']:.2f} CPU-s; process {r['cpu_s']:.2f} CPU-s, {r['maxrss_mb']:.0f} MB",
                        "no per-position pass (~open cost)", out["open_cpu_s"] < 3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="1,2,3,4,5", help="comma list of targets (default all)")
    ap.add_argument("--size", default="1m", help="size for targets 1 and 5 (default 1m; 100k for a quick look)")
    ap.add_argument("--cache", default=scale_meta.DEFAULT_CACHE)
    ap.add_argument("--cli", help="vlafeed binary (default build/vlafeed)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--map-samples", type=int, default=6400)
    ap.add_argument("--stream-samples", type=int, default=100000)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    rows = []
    started = time.time()
    for t in args.only.split(","):
        fn = {"1": target1, "2": target2, "3": target3, "4": target4, "5": target5}.get(t.strip())
        if fn is None:
            ap.error(f"unknown target {t!r}")
        print(f"[target {t}] ...", file=sys.stderr, flush=True)
        fn(args, rows)
    print(f"scale targets, {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC, {os.cpu_count()} CPUs, "
          f"load average at start {os.getloadavg()[0]:.1f}")
    print("| target | measured | figure | goal | met |")
    print("|---|---|---|---|---|")
    for x in rows:
        print(f"| {x['target']} | {x['what']} | {x['figure']} | {x['goal']} | {'yes' if x['met'] else '**no**'} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(started=started, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
