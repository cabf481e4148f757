#!/usr/bin/env python3
"""Scale benchmark (issue 9): what opening, planning and loading cost per rank
on LeRobot-shaped synthetic datasets of 10K / 100K / 1M episodes.

Datasets come from bench/scale_meta.py (cached under --cache, default
/tmp/vf-scale). Variants per size:

  meta      metadata only, one row group per meta/episodes file
  meta-rg10 metadata only, 10-row row groups in meta/episodes (the recorder's flushes)
  data      + data parquet files, one row group per data file (converter layout)
  data-ep   10-row meta row groups + data files with one row group per episode
            (the recorder's layout)
  meta-lr, meta-rg10-lr
            meta, meta-rg10 with LeRobot's real stats columns (q01..q99 too: 10
            stats per feature, as LeRobot 0.4+ writes them)
  (size "sample", variant "real": a small `vlafeed make-sample` dataset with MP4s)

The synthetic sets have no MP4 files, so anything that opens videos reports an error; the
loaders' first batch is taken with the tabular keys (observation.state,
action) where data files exist.

Every measurement runs in a fresh subprocess; the table gives its wall time
(process start to exit, Python start-up and import included), the time of the
operation itself where the child can measure it ("op s"), the child's CPU
seconds (user + system, all threads: "CPU s"), the first batch time, and the
child's peak RSS (os.wait4's ru_maxrss). A measurement that
fails or runs past --timeout prints "error: ..." or "timeout" instead of
stopping the run. The "import" row is the baseline (python + import vlafeed).

Measurements:
  import     python -c 'import vlafeed'
  meta_py    vlafeed.LeRobotDatasetMetadata(root[, skip_file_checks=True])
  dataset_py vlafeed.LeRobotDataset(root[, skip_file_checks=True])
  info       vlafeed info --json [flags found in `vlafeed info --help` that skip file checks]
  plan       vlafeed plan --json --world-size W --workers K
  loader:<mode>:<keys>[@W]
             vlafeed.Loader(root, mode=<mode>, rank=0, world_size=W, num_consumers=1,
                            keys=None (all) | tabular, output="numpy"), then the first batch
The metadata cache (docs/scale.md, "Opening big metadata") is set per run with
--meta-cache, a comma list of modes; each measurement runs once per mode and its
row is labelled [mode] unless the only mode is off:
  off   VF_META_CACHE=0: every open decodes meta/episodes (the default; the figures
        before the cache existed)
  cold  a new, empty VF_CACHE_DIR per run: the first open, writing the cache
  warm  a VF_CACHE_DIR per dataset filled once beforehand (`vlafeed info`, not
        timed): every later open
A suffix @W runs a measurement at world size W instead of --world-size
(e.g. plan@8, loader:stream:all@1), to see how a rank's cost falls with W.
Optional keyword arguments that today's API may not accept (skip_file_checks,
or any given with --py-kwarg) are passed when the call accepts them: a
TypeError naming one drops it and the call is retried; the row says which
were used.

usage:
  python3 bench/scale_bench.py --sizes 10k                 # quick: well under a minute
  python3 bench/scale_bench.py --sizes 10k,100k --json out.json
  python3 bench/scale_bench.py --sizes 1m --variants meta,meta-rg10 --measure info,plan,loader:stream:all
"""
import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import _inplace  # noqa: E402  (the in-place build if there is one, else the installed package)
import scale_meta  # noqa: E402

TABULAR_KEYS = ["observation.state", "action"]
VARIANTS = {
    "meta": dict(),
    "meta-rg10": dict(meta_row_group=10),
    "data": dict(with_data=True, data_row_groups="file"),
    "data-ep": dict(with_data=True, data_row_groups="episode", meta_row_group=10),
    # LeRobot's real per-episode stats columns: q01..q99 besides min/max/mean/std/count
    "meta-lr": dict(stats_quantiles=True),
    "meta-rg10-lr": dict(meta_row_group=10, stats_quantiles=True),
}
DEFAULT_VARIANTS = {"10k": list(VARIANTS), "100k": list(VARIANTS), "1m": ["meta-lr", "meta-rg10-lr"],
                    "droid": ["meta"], "sample": ["real"]}
DEFAULT_MEASURES = ["meta_py", "info", "plan", "loader:stream:all", "loader:map:all",
                    "loader:stream:tabular", "loader:map:tabular"]
RESULT_PREFIX = "VFBENCH_RESULT "

# The child process for the Python measurements. argv[1]: a JSON spec.
CHILD = r'''
import json, os, sys, time
spec = json.loads(sys.argv[1])
out = {}
def finish(**kw):
    out.update(kw)
    sys.stdout.write("''' + RESULT_PREFIX + r'''" + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)
def call(fn, args, kwargs, optional):
    """fn(*args, **kwargs, **optional), dropping optional keys the callee refuses."""
    opt = dict(optional)
    while True:
        try:
            return fn(*args, **kwargs, **opt), sorted(opt)
        except TypeError as e:
            bad = [k for k in opt if k in str(e)]
            if not bad:
                raise
            for k in bad:
                del opt[k]
try:
    t0 = time.perf_counter()
    import vlafeed
    out["import_s"] = time.perf_counter() - t0
    what = spec["what"]
    if what == "import":
        finish(op_s=out["import_s"])
    if what in ("meta_py", "dataset_py"):
        cls = vlafeed.LeRobotDatasetMetadata if what == "meta_py" else vlafeed.LeRobotDataset
        t0 = time.perf_counter()
        obj, used = call(cls, [spec["root"]], {}, spec["optional"])
        op = time.perf_counter() - t0
        n = getattr(obj, "total_episodes", None)
        if n is None:
            n = getattr(obj, "num_episodes", None)
        finish(op_s=op, used=used, episodes=n)
    if what == "loader":
        import warnings
        warnings.simplefilter("ignore")
        kwargs = dict(mode=spec["mode"], rank=0, world_size=spec["world_size"], batch_size=spec["batch_size"],
                      output="numpy")
        if spec["keys"] is not None:
            kwargs["keys"] = spec["keys"]
        t0 = time.perf_counter()
        loader, used = call(vlafeed.Loader, [spec["root"]], kwargs, spec["optional"])
        out.update(op_s=time.perf_counter() - t0, used=used, rank_batches=len(loader),
                   rank_samples=getattr(loader, "num_samples", None))
        if spec["first_batch"]:
            t0 = time.perf_counter()
            try:
                batch = next(iter(loader))
                out["first_batch_s"] = time.perf_counter() - t0
                out["batch_keys"] = sorted(batch)
            except Exception as e:
                out["first_batch_error"] = f"{type(e).__name__}: {e}"
        else:
            out["first_batch_skipped"] = spec.get("skip_reason", "")
        finish()
    finish(error=f"unknown measurement {what}")
except Exception as e:
    finish(error=f"{type(e).__name__}: {e}")
'''


TIME = shutil.which("time", path="/usr/bin:/bin")
RSS_MARK = "VFBENCH_MAXRSS_KB "
CPU_MARK = "VFBENCH_CPU_S "


def run_child(cmd, timeout, env=None):
    """Runs cmd in its own session; returns dict(rc, wall_s, maxrss_mb,
    stdout, stderr, timed_out). Peak RSS is the command's own: it runs under
    GNU time (/usr/bin/time) when present, because a child forked straight
    from this process would start with this process's high-water mark (Linux
    carries it over fork and exec into ru_maxrss); else os.wait4's value."""
    full = [TIME, "-f", RSS_MARK + "%M\n" + CPU_MARK + "%U %S", *cmd] if TIME else list(cmd)
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdout=so, stderr=se, env=env, start_new_session=True)
        timed_out = False
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                timed_out = True
                os.killpg(proc.pid, 9)
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        stderr = se.read().decode(errors="replace")
        maxrss_kb = None if TIME else ru.ru_maxrss
        cpu_s = None if TIME else ru.ru_utime + ru.ru_stime
        kept = []
        for line in stderr.splitlines():
            if line.startswith(RSS_MARK):
                maxrss_kb = int(line[len(RSS_MARK):])
            elif line.startswith(CPU_MARK):
                cpu_s = sum(float(x) for x in line[len(CPU_MARK):].split())
            elif not (TIME and line.startswith("Command ") and ("exited with" in line or "terminated by" in line)):
                kept.append(line)
        return dict(rc=proc.returncode, wall_s=wall, cpu_s=cpu_s,
                    maxrss_mb=None if maxrss_kb is None else maxrss_kb / 1024.0,
                    stdout=so.read().decode(errors="replace"), stderr="\n".join(kept), timed_out=timed_out)


def warm_meta(root):
    """Reads every file under root/meta once (bytes read)."""
    total = 0
    for path in sorted(pathlib.Path(root, "meta").rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                while True:
                    chunk = f.read(1 << 22)
                    if not chunk:
                        break
                    total += len(chunk)
    return total


def find_cli(arg):
    if arg:
        return arg
    local = REPO / "build" / "vlafeed"
    if local.exists():
        return str(local)
    return shutil.which("vlafeed") or "vlafeed"


def python_env():
    return _inplace.child_env()


def skip_check_flags(cli):
    """The `vlafeed info` options that skip per-file checks, from its --help."""
    try:
        text = subprocess.run([cli, "info", "--help"], capture_output=True, text=True, timeout=30)
        text = text.stdout + text.stderr
    except (OSError, subprocess.SubprocessError):
        return []
    flags = []
    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text):
        if flag in flags:
            continue
        if ("skip" in flag or "lazy" in flag or flag.startswith("--no-")) and \
                any(w in flag for w in ("file", "exist", "check", "stat")):
            flags.append(flag)
    return flags


def first_line(text, limit=120):
    for line in text.strip().splitlines():
        line = line.strip()
        if line and not line.startswith("vlafeed: warning"):
            return line[:limit]
    return ""


def problem_summary(doc):
    counts = {}
    for p in doc.get("problems") or []:
        if p.get("severity") == "error":
            counts[p.get("message", "?")] = counts.get(p.get("message", "?"), 0) + 1
    return ", ".join(f"{n} {m}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])


def measure(what, root, args, cli, flags, env, has_data, extra_env=None):
    """One measurement -> result dict (status 'ok' | 'timeout' | 'error: ...').
    extra_env: variables added to the child's environment (the metadata cache)."""
    res = dict(measure=what)
    cli_env = dict(os.environ, **extra_env) if extra_env else None
    if extra_env:
        env = dict(env or os.environ, **extra_env)
    world_size = args.world_size
    if "@" in what:  # e.g. loader:stream:all@8: this measurement at another world size
        what, _, ws = what.partition("@")
        world_size = int(ws)
    optional = {"skip_file_checks": True}
    optional.update(args.py_kwarg)
    if what in ("import", "meta_py", "dataset_py") or what.startswith("loader:"):
        spec = dict(what=what, root=str(root), optional=optional)
        if what.startswith("loader:"):
            _, mode, keys = what.split(":")
            has_videos = (pathlib.Path(root) / "videos").is_dir()
            spec.update(what="loader", mode=mode, world_size=world_size, batch_size=args.batch_size,
                        keys=None if keys == "all" else TABULAR_KEYS,
                        first_batch=has_data and (keys != "all" or has_videos),
                        skip_reason="no data files" if not has_data else "no video files")
        r = run_child([sys.executable, "-c", CHILD, json.dumps(spec)], args.timeout, env)
        child = {}
        for line in r["stdout"].splitlines():
            if line.startswith(RESULT_PREFIX):
                child = json.loads(line[len(RESULT_PREFIX):])
        res.update(wall_s=r["wall_s"], cpu_s=r["cpu_s"], maxrss_mb=r["maxrss_mb"])
        if r["timed_out"]:
            res["status"] = "timeout"
        elif "error" in child:
            res["status"] = "error: " + child["error"][:160]
        elif not child:
            res["status"] = f"error: exit {r['rc']}: " + first_line(r["stderr"])
        else:
            res["status"] = "ok"
        for k in ("op_s", "first_batch_s", "used", "rank_samples", "rank_batches", "episodes"):
            if k in child:
                res[k] = child[k]
        if "first_batch_error" in child:
            res["first_batch"] = "error: " + child["first_batch_error"][:120]
        elif "first_batch_skipped" in child:
            res["first_batch"] = "n/a (" + child["first_batch_skipped"] + ")"
        return res
    if what == "info":
        cmd = [cli, "info", "--json", "--compact", *flags, str(root)]
    elif what == "plan":
        cmd = [cli, "plan", "--json", "--world-size", str(world_size), "--workers", str(args.workers), str(root)]
    else:
        return dict(res, status=f"error: unknown measurement {what}")
    res["command"] = " ".join(cmd[:-1]) + " ROOT"
    r = run_child(cmd, args.timeout, cli_env)
    res.update(wall_s=r["wall_s"], cpu_s=r["cpu_s"], maxrss_mb=r["maxrss_mb"])
    if r["timed_out"]:
        return dict(res, status="timeout")
    try:
        doc = json.loads(r["stdout"])
    except ValueError:
        return dict(res, status=f"error: exit {r['rc']}: " + first_line(r["stderr"] or r["stdout"]))
    if what == "plan" and r["rc"] != 0 or not isinstance(doc, dict) or \
            what == "info" and not doc.get("total_episodes"):
        # info exits 1 for any error found, so it is judged by whether it described the dataset.
        first = ((doc.get("problems") or [{}])[0].get("message") if isinstance(doc, dict) else None)
        return dict(res, status=f"error: exit {r['rc']}: " + (first or first_line(r["stderr"] or r["stdout"])))
    res["status"] = "ok"
    if what == "info":
        # Exit 1 is expected: no MP4s (and no data files for the meta variants).
        res["notes"] = f"exit {r['rc']}; errors: " + (problem_summary(doc) or "none")
        mc = doc.get("meta_cache")
        if mc and mc.get("enabled"):
            res["notes"] += f"; meta cache: {mc['hits']} hits, {mc['misses']} misses, {mc['written']} written"
    else:
        fg = (doc.get("strategies") or {}).get("file_group") or {}
        distinct = sum(c.get("files", 0) for c in doc.get("cameras") or [])
        res["notes"] = f"file_group tasks {fg.get('tasks')}, video_opens {fg.get('video_opens')}, " \
                       f"distinct MP4s {distinct}"
    return res


SAMPLE_ARGS = ["--episodes", "20", "--cameras", "3", "--codec", "h264", "--size", "160x120", "--quiet"]


META_CACHE_MODES = ("off", "cold", "warm")


class MetaCacheDirs:
    """The VF_CACHE_DIR of each --meta-cache mode: a new empty folder per run
    (cold), one per dataset filled beforehand (warm); all removed at exit."""

    def __init__(self, cli):
        self.cli = cli
        self.top = pathlib.Path(tempfile.mkdtemp(prefix="vf-scale-metacache-"))
        self.count = 0

    def env(self, mode, root):
        if mode == "off":
            return {"VF_META_CACHE": "0"}
        self.count += 1
        if mode == "cold":
            return {"VF_META_CACHE": "1", "VF_CACHE_DIR": str(self.top / f"cold-{self.count}")}
        d = self.top / ("warm-" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(root)))
        if not d.exists():
            env = dict(os.environ, VF_META_CACHE="1", VF_CACHE_DIR=str(d))
            r = subprocess.run([self.cli, "info", "--json", "--compact", "--no-file-checks", str(root)],
                               capture_output=True, text=True, env=env)
            try:
                mc = json.loads(r.stdout)["meta_cache"]
                print(f"  meta cache filled: {mc['written']} entries in {d}", file=sys.stderr)
            except (ValueError, KeyError, TypeError):
                print(f"  meta cache not filled: {first_line(r.stderr)}", file=sys.stderr)
        return {"VF_META_CACHE": "1", "VF_CACHE_DIR": str(d)}

    def close(self):
        shutil.rmtree(self.top, ignore_errors=True)


def ensure_sample(cache, cli):
    """A small real dataset (MP4s included) from `vlafeed make-sample`, for the
    first batch with every key. Returns (root, stamp-like dict)."""
    root = pathlib.Path(cache) / "sample-real"
    info = root / "meta" / "info.json"
    if not info.exists():
        if root.exists():
            shutil.rmtree(root)  # an interrupted make-sample of ours
        root.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([cli, "make-sample", str(root), *SAMPLE_ARGS], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"scale_bench: vlafeed make-sample failed:\n{r.stderr}")
    doc = json.loads(info.read_text())
    return root, dict(params=dict(episodes=doc["total_episodes"], with_data=True), total_frames=doc["total_frames"])


def ensure_dataset(size, variant, cache):
    """Generates (or finds cached) size/variant in a child process, so that
    this process stays small. Returns the root."""
    root = None if cache == scale_meta.DEFAULT_CACHE else str(pathlib.Path(cache) / f"{size}-{variant}")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import scale_meta; "
            "a = json.loads(sys.argv[2]); print(scale_meta.ensure(a['size'], a['root'], **a['over']))")
    arg = json.dumps(dict(size=size, root=root, over=VARIANTS[variant]))
    r = subprocess.run([sys.executable, "-c", code, str(HERE), arg], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"scale_bench: generating {size}/{variant} failed:\n{r.stderr}")
    return pathlib.Path(r.stdout.strip().splitlines()[-1])


def fmt(v, digits=2):
    return "" if v is None else f"{v:.{digits}f}"


def markdown(rows):
    out = ["| dataset | episodes | frames | measurement | wall s | CPU s | op s | first batch s | peak RSS MB | status "
           "| notes |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        fb = fmt(r.get("first_batch_s"), 3) if "first_batch_s" in r else r.get("first_batch", "")
        notes = r.get("notes", "")
        if r.get("used"):
            notes = (notes + "; " if notes else "") + "kwargs: " + ",".join(r["used"])
        if r.get("rank_samples") is not None or r.get("rank_batches") is not None:
            notes = (notes + "; " if notes else "") + \
                f"rank 0: {r.get('rank_samples')} samples, {r.get('rank_batches')} batches"
        status = r["status"].replace("|", "/")
        out.append(f"| {r['dataset']} | {r.get('episodes_total', '')} | {r.get('frames_total', '')} | "
                   f"{r['measure']} | {fmt(r.get('wall_s'))} | {fmt(r.get('cpu_s'))} | {fmt(r.get('op_s'))} | {fb} | "
                   f"{fmt(r.get('maxrss_mb'), 0)} | {status} | {notes.replace('|', '/')} |")
    return "\n".join(out)


def parse_kwarg(text):
    if "=" not in text:
        raise argparse.ArgumentTypeError("expected KEY=JSON")
    k, v = text.split("=", 1)
    try:
        return k, json.loads(v)
    except ValueError:
        return k, v


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--targets" in argv:
        # issue 26's targets 1-5 in one table: bench/scale_targets.py takes the other arguments
        import scale_targets
        argv.remove("--targets")
        return scale_targets.main(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", action="store_true",
                    help="measure issue 26's targets 1-5 instead (bench/scale_targets.py; its options follow)")
    ap.add_argument("--sizes", default="10k,100k",
                    help="comma list of 10k,100k,1m,droid,sample (default 10k,100k); sample: a 20-episode "
                         "`vlafeed make-sample` dataset with MP4s (3 cameras, h264 160x120), for first batches "
                         "with every key")
    ap.add_argument("--variants", help=f"comma list of {','.join(VARIANTS)} (default: all, 1m and droid: meta,meta-rg10)")
    ap.add_argument("--measure", help="comma list of import,meta_py,dataset_py,info,plan,loader:MODE:KEYS "
                                      f"(KEYS all|tabular; default {','.join(DEFAULT_MEASURES)})")
    ap.add_argument("--cache", default=scale_meta.DEFAULT_CACHE, help="dataset cache folder")
    ap.add_argument("--cli", help="vlafeed binary (default build/vlafeed, else on PATH)")
    ap.add_argument("--world-size", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=8, help="workers per rank for `vlafeed plan`")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per measurement (default 300)")
    ap.add_argument("--py-kwarg", type=parse_kwarg, action="append", default=[],
                    help="extra optional KEY=JSON for the Python opens (dropped if refused)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-': stdout, no table)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per measurement; the table keeps the fastest (wall) and notes the spread")
    ap.add_argument("--no-warm", action="store_true",
                    help="do not read a dataset's meta/ files once before its measurements (by default the "
                         "page cache is warmed, so the first measurement does not also time the disk)")
    ap.add_argument("--meta-cache", default="off",
                    help="comma list of off,cold,warm: how the metadata cache is set for each run (default off; "
                         "see above)")
    ap.add_argument("--quick", action="store_true",
                    help="10k, variants meta and data, measurements meta_py,info,plan,loader:stream:all,"
                         "loader:map:tabular (under a minute once the datasets are cached)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes = "10k"
        args.variants = args.variants or "meta,data"
        args.measure = args.measure or "meta_py,info,plan,loader:stream:all,loader:map:tabular"
    args.py_kwarg = dict(args.py_kwarg)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    measures = [m.strip() for m in (args.measure or ",".join(DEFAULT_MEASURES)).split(",") if m.strip()]
    for m in measures:
        if "@" in m and not m.partition("@")[2].isdigit():
            ap.error(f"bad measurement {m!r}: the world size after @ must be a number")
        m = m.partition("@")[0]
        if m.startswith("loader:") and (len(m.split(":")) != 3 or m.split(":")[2] not in ("all", "tabular")):
            ap.error(f"bad measurement {m!r}: use loader:MODE:all or loader:MODE:tabular")
    cache_modes = [m.strip() for m in args.meta_cache.split(",") if m.strip()]
    if not cache_modes or any(m not in META_CACHE_MODES for m in cache_modes):
        ap.error(f"--meta-cache: a comma list of {','.join(META_CACHE_MODES)}")
    cli = find_cli(args.cli)
    flags = skip_check_flags(cli)
    cache_dirs = MetaCacheDirs(cli)
    env = python_env()
    log = sys.stderr
    rows = []
    started = time.time()
    base = measure("import", None, args, cli, flags, env, False)
    base.update(dataset="(none)")
    rows.append(base)
    for size in sizes:
        variants = args.variants.split(",") if args.variants else DEFAULT_VARIANTS.get(size, ["meta"])
        for variant in variants:
            if (variant not in VARIANTS or size == "sample") and not (size == "sample" and variant == "real"):
                ap.error(f"unknown variant {size}/{variant!r}")
            t0 = time.perf_counter()
            if size == "sample":
                root, stamp = ensure_sample(args.cache, cli)
            else:
                root = ensure_dataset(size, variant, args.cache)
                stamp = scale_meta.read_stamp(root)
            print(f"[{size}/{variant}] dataset ready in {time.perf_counter() - t0:.1f} s: {root}", file=log)
            has_data = bool(stamp["params"]["with_data"])
            if not args.no_warm:
                t0 = time.perf_counter()
                warmed = warm_meta(root)
                print(f"  page cache: read {warmed / 1e6:.0f} MB of meta/ in {time.perf_counter() - t0:.1f} s",
                      file=log)
            for m, mode in ((m, mode) for m in measures for mode in cache_modes):
                if m.partition("@")[0].endswith(":tabular") and not has_data:
                    continue  # tabular loaders only say something where rows exist
                runs = [measure(m, root, args, cli, flags, env, has_data, cache_dirs.env(mode, root))
                        for _ in range(max(1, args.repeat))]
                ok = [x for x in runs if x.get("wall_s") is not None and x["status"] == "ok"] or runs
                r = min(ok, key=lambda x: x.get("wall_s") or float("inf"))
                if len(runs) > 1:
                    walls = sorted(x["wall_s"] for x in ok if x.get("wall_s") is not None)
                    r["runs_wall_s"] = walls
                    r["notes"] = (r.get("notes", "") + f"; best of {len(runs)} (wall {walls[0]:.2f}-{walls[-1]:.2f} s)"
                                  ).lstrip("; ")
                r.update(dataset=f"{size}/{variant}", root=str(root), episodes_total=stamp["params"]["episodes"],
                         frames_total=stamp["total_frames"])
                if cache_modes != ["off"]:
                    r["measure"] = f"{m} [{mode}]"
                    r["meta_cache"] = mode
                rows.append(r)
                print(f"  {r['measure']}: {fmt(r.get('wall_s'))} s, {fmt(r.get('cpu_s'))} CPU-s, {fmt(r.get('maxrss_mb'), 0)} MB, "
                      f"{r['status'][:100]}",
                      file=log)
    cache_dirs.close()
    doc = dict(command=" ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
               date_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
               machine=dict(host=platform.node(), cpus=os.cpu_count(), python=platform.python_version(),
                            load_avg=os.getloadavg()),
               cli=cli, info_skip_flags=flags, world_size=args.world_size, workers=args.workers, results=rows)
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        return 0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2))
    print(f"world_size {args.world_size}, workers {args.workers} (plan), info flags: {' '.join(flags) or 'none'}, "
          f"load average at start {doc['machine']['load_avg'][0]:.2f}")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
