#!/usr/bin/env python3
"""Map mode's table cost per sample against the dataset's size (issue 26, part 3).

Tabular-only loaders (keys observation.state and action, no video) over the
synthetic LeRobot datasets of bench/scale_meta.py, with data files in the
two layouts LeRobot writes:

  file     one row group per data file (the v2.1 -> v3.0 converter; ~100 MB files)
  episode  one row group per episode (the recorder), 10-row meta/episodes row groups

For each size and layout, map mode (a global shuffle: random positions over
the whole dataset) and stream mode deliver --samples samples after a
--warmup of batches. Map mode runs three ways (--modes):

  map-parquet  the table cache on disk off: every row-cache miss reads Parquet
  map-cold     the loader's default, starting from an empty table cache on
               disk (no warmup: the measurement includes decoding and
               storing each data file the samples touch)
  map-warm     the same again, the cache filled by map-cold (a later run, or
               another rank on the node)
  getitem-*    the same three through vlafeed.LeRobotDataset: random ds[i],
               one item at a time, every tabular column (download_videos=False)

The table cache lives in --table-cache-dir (VF_CACHE_DIR of the children;
default <cache>/bench-table-cache). The figure in each row is the figure is samples per CPU-second of the process
(user + system time of every thread, resource.getrusage), so it holds while
other work shares the machine. Map mode's cost should not grow with the
dataset: the data files' footers are kept in a bounded cache per loader,
and a random row costs the pages holding it, found from a page index built
once per column chunk, not every page before it.

Each measurement runs in a fresh process. The datasets are generated (once)
under --cache; 100K episodes take several minutes and ~2 GB per layout.

usage:
  python3 bench/map_table_bench.py                         # 10k and 100k, both layouts
  python3 bench/map_table_bench.py --sizes 10k --samples 2000
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale_meta  # noqa: E402

LAYOUTS = {"file": dict(with_data=True, data_row_groups="file"),
           "episode": dict(with_data=True, data_row_groups="episode", meta_row_group=10)}
KEYS = ["observation.state", "action"]

CHILD = r'''
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
import _inplace  # the in-place build if there is one
if sys.argv[3]:
    sys.path.insert(0, sys.argv[3])  # --package: another build (a baseline)
else:
    _inplace.use()
import vlafeed
spec = json.loads(sys.argv[1])
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
extra = {"table_cache_bytes": spec["table_cache_bytes"]} if spec.get("table_cache_bytes") else {}
if spec.get("table_disk_cache") is not None:
    extra["table_disk_cache"] = spec["table_disk_cache"]
loader = vlafeed.Loader(spec["root"], mode=spec["mode"], keys=spec["keys"], batch_size=spec["batch"],
                        threads=spec["threads"], seed=1, output="numpy", **extra)
it = iter(loader)
for _ in range(spec["warmup"]):
    next(it)
e0 = loader.stats().get("table_episodes", 0)
c0, t0, n = cpu(), time.perf_counter(), 0
while n < spec["samples"]:
    n += len(next(it)["action"])
c1, t1 = cpu(), time.perf_counter()
st = loader.stats()
print(json.dumps(dict(samples=n, cpu_s=c1 - c0, wall_s=t1 - t0, table_reads=st.get("table_reads"),
                      table_pages_decoded=st.get("table_pages_decoded"),
                      table_pages_skipped=st.get("table_pages_skipped"),
                      table_cache_bytes=st.get("table_cache_bytes"), episodes_read=st.get("table_episodes", 0) - e0,
                      files_opened=st.get("table_files_opened"), file_evictions=st.get("table_file_evictions"),
                      files_bytes=st.get("table_files_bytes"), disk_episodes=st.get("table_disk_episodes"),
                      disk_builds=st.get("table_disk_builds"), disk_bytes=st.get("table_disk_bytes"))))
loader.close()
'''

# LeRobot's access pattern: vlafeed.LeRobotDataset, random ds[i], every
# tabular column (download_videos=False), one item at a time.
GETITEM = r'''
import json, random, resource, sys, time
sys.path.insert(0, sys.argv[2])
import _inplace
if sys.argv[3]:
    sys.path.insert(0, sys.argv[3])
else:
    _inplace.use()
import vlafeed
spec = json.loads(sys.argv[1])
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
ds = vlafeed.LeRobotDataset("bench", root=spec["root"], download_videos=False)
rng = random.Random(1)
for _ in range(spec["warmup"]):
    ds[rng.randrange(len(ds))]
c0, t0 = cpu(), time.perf_counter()
for _ in range(spec["samples"]):
    ds[rng.randrange(len(ds))]
c1, t1 = cpu(), time.perf_counter()
st = ds._loader.stats()
print(json.dumps(dict(samples=spec["samples"], cpu_s=c1 - c0, wall_s=t1 - t0, table_reads=st.get("table_reads"),
                      table_pages_decoded=st.get("table_pages_decoded"),
                      table_pages_skipped=st.get("table_pages_skipped"), episodes_read=st.get("table_episodes"),
                      files_opened=st.get("table_files_opened"), disk_episodes=st.get("table_disk_episodes"),
                      disk_builds=st.get("table_disk_builds"), disk_bytes=st.get("table_disk_bytes"))))
'''


def measure(root, mode, args):
    """mode: stream, map (the loader's defaults), map-parquet, map-cold or map-warm; getitem-parquet,
    getitem-cold or getitem-warm: the same three ways through vlafeed.LeRobotDataset's ds[i]."""
    getitem = mode.startswith("getitem")
    if getitem:
        mode = "map" + mode[len("getitem"):]
    engine_mode = "stream" if mode == "stream" else "map"
    disk = {"map-parquet": False}.get(mode)
    env = dict(os.environ)
    if getitem and disk is False:
        env["VF_TABLE_CACHE"] = "0"  # LeRobotDataset has no table_disk_cache keyword
    cache_dir = pathlib.Path(args.table_cache_dir or pathlib.Path(args.cache) / "bench-table-cache") / root.name
    env["VF_CACHE_DIR"] = str(cache_dir)
    if mode == "map-cold":
        shutil.rmtree(cache_dir / "table", ignore_errors=True)
    spec = dict(root=str(root), mode=engine_mode, keys=KEYS, batch=args.batch_size, threads=args.threads,
                warmup=0 if mode == "map-cold" else args.warmup,
                samples=args.stream_samples if mode == "stream" else args.samples,
                table_cache_bytes=args.table_cache_bytes, table_disk_cache=disk)
    if getitem:
        spec["samples"] = args.getitem_samples
    r = subprocess.run([sys.executable, "-c", GETITEM if getitem else CHILD, json.dumps(spec), str(HERE),
                        args.package or ""],
                       capture_output=True, text=True, env=env,
                       timeout=args.timeout)
    if r.returncode:
        return dict(error=(r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:200])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["per_cpu_s"] = out["samples"] / out["cpu_s"] if out["cpu_s"] > 0 else float("inf")
    # CPU per episode read in the measured window: a miss's cost, which
    # should not depend on the dataset's size (the share of samples that
    # miss does: the row cache holds more of a small dataset)
    out["us_per_episode_read"] = out["cpu_s"] / out["episodes_read"] * 1e6 if out.get("episodes_read") else None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10k,100k", help="comma list of scale_meta shapes (default 10k,100k)")
    ap.add_argument("--layouts", default="file,episode", help="comma list of file,episode")
    ap.add_argument("--modes", default="map-parquet,map-cold,map-warm,stream",
                    help="comma list of map-parquet, map-cold, map-warm, map (the defaults, whatever the cache "
                         "holds), stream (default: all but map), and getitem-parquet, getitem-cold, getitem-warm "
                         "(LeRobotDataset's random ds[i], every tabular column)")
    ap.add_argument("--getitem-samples", type=int, default=3000, help="items per getitem-* run (default 3000)")
    ap.add_argument("--samples", type=int, default=6400, help="samples measured per run (default 6400)")
    ap.add_argument("--stream-samples", type=int, default=400000,
                    help="samples measured per stream-mode run (default 400000: its table cost per sample is "
                         "tiny)")
    ap.add_argument("--warmup", type=int, default=4, help="batches before the measurement (default 4)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--table-cache-bytes", type=int, default=0,
                    help="the loaders' row cache bound (default: the loader's, 256 MiB); above the table's size, "
                         "map mode reads the table in file order and then only hits")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--cache", default=scale_meta.DEFAULT_CACHE)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--table-cache-dir", metavar="DIR",
                    help="VF_CACHE_DIR of the measured loaders (default <cache>/bench-table-cache)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--package", metavar="DIR", help="the python/ folder of another checkout's in-place build to "
                                                    "measure instead of this one's (e.g. a baseline)")
    args = ap.parse_args(argv)
    rows = []
    print("| size | layout | mode | samples/CPU-s | CPU s | wall s | table reads | pages decoded | pages skipped | "
          "episodes read | CPU µs per episode read | footers decoded | from disk cache | files stored |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes.split(","):
        for layout in args.layouts.split(","):
            params = scale_meta.shape_params(size, **LAYOUTS[layout])
            root = pathlib.Path(args.cache) / scale_meta.variant_name(size, params)
            scale_meta.generate(root, quiet=True, **params)
            for mode in args.modes.split(","):
                m = measure(root, mode, args)
                rows.append(dict(size=size, layout=layout, mode=mode, **m))
                if "error" in m:
                    print(f"| {size} | {layout} | {mode} | error: {m['error']} | | | | | | | | | | |", flush=True)
                    continue
                per_ep = m.get("us_per_episode_read")
                print(f"| {size} | {layout} | {mode} | {m['per_cpu_s']:.0f} | {m['cpu_s']:.2f} | {m['wall_s']:.2f} | "
                      f"{m['table_reads']} | {m['table_pages_decoded']} | {m['table_pages_skipped']} | "
                      f"{m.get('episodes_read')} | {'%.0f' % per_ep if per_ep else '-'} | "
                      f"{m.get('files_opened') if m.get('files_opened') is not None else '-'} | "
                      f"{m.get('disk_episodes') or 0} | {m.get('disk_builds') or 0} |", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
