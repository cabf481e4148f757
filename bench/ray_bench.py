#!/usr/bin/env python3
"""vlafeed on Ray Data against standalone vlafeed.Loader and Ray 2.60's own
ray.data.read_lerobot, on the same make-sample dataset, in one run.

    make build py-inplace
    python3 bench/ray_bench.py --out /tmp/vf-raybench \
        [--peer-python /work/wt-lerobot06/build-lerobot/venv312/bin/python]

Each measurement runs in a fresh child process with 2 CPUs for Ray
(ray.init(num_cpus=2)) and 2 engine threads for the standalone loader:

- loader:      vlafeed.Loader, stream mode, uint8 HWC, no shuffle.
- datasource:  ray.data.read_datasource(vlafeed.ray.LeRobotDatasource(...)), uint8 HWC.
- peer:        ray.data.read_lerobot(root) in the peer's Python 3.12 venv
               (lerobot[dataset] 0.6, torchcodec), its default frame tolerance.
- peer-loose:  the same with frame_tolerance_s = 1/fps (so it does not abort on
               LeRobot's drift) to count which frames it returns.
- floor:       Ray Data's own cost: a datasource with no reader (no file, no decode)
               yielding the same rows and frame bytes task for task, with the same size
               estimates, paced like a decoder (a sleep per block: the loader's CPU-s
               per row of the same repeat). What any datasource pays on top of decoding.
- ray-loader:  vlafeed.Loader in 2 Ray tasks (rank r of 2), the Ray Train worker path.

What is measured: rows/s and frames/s of wall time; frames per CPU-second,
where the CPU is every process of the run (driver, Ray's daemons and workers:
utime+stime from /proc, descendants of the child); MP4 opens (vlafeed: the
engine's counters; peer: torchcodec VideoDecoder constructions counted by a
worker setup hook); peak RSS per Ray worker (VmHWM); time to the first
batch. Exactness: every returned frame's identity stamp (episode, frame,
camera; tests/python/lerobot_reference.read_identity) against its row.
Results: <out>/ray-bench.json and a markdown table on stdout.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import _inplace  # bench/_inplace.py: the in-place build if there is one, else the installed package

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_PEER = "/work/wt-lerobot06/build-lerobot/venv312/bin/python"
TICKS = os.sysconf("SC_CLK_TCK")
ROWS_PER_BLOCK = 128  # --rows-per-block N
# The floor's pace, seconds per row: the standalone loader's CPU-seconds per row on run 2's dataset
# (5.1 CPU-s / 2,729 rows); the driver passes the measured value of the same run.
FLOOR_PACE_S_PER_ROW = 5.1 / 2729


# ---- /proc accounting (no psutil in either environment) -------------------------------------------


def _proc_table():
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                raw = f.read()
            rest = raw[raw.rindex(")") + 2:].split()
            out[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]), raw[raw.index("(") + 1:raw.rindex(")")])
        except (OSError, ValueError):
            continue
    return out


def descendants(root_pid):
    table = _proc_table()
    kids = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, stack = [], [root_pid]
    while stack:
        pid = stack.pop()
        for k in kids.get(pid, []):
            out.append(k)
            stack.append(k)
    return out, table


def tree_cpu_s(root_pid):
    """CPU seconds of root_pid and its living descendants."""
    pids, table = descendants(root_pid)
    total = sum(table[p][1] for p in pids if p in table)
    own = os.times()
    return total / TICKS + own.user + own.system


def worker_peaks(root_pid):
    """{pid: VmHWM bytes} of the Ray worker processes (names starting with ray::)."""
    pids, table = descendants(root_pid)
    out = {}
    for p in pids:
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
            if not cmd.startswith("ray::"):
                continue
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmHWM:"):
                    out[p] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return out


# ---- identity check ----------------------------------------------------------------------------


def check_frames(rows_iter, cameras):
    """Counts exact / neighbouring (off by one frame) / other / unreadable frames."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    from lerobot_reference import IdentityError, read_identity

    counts = {"exact": 0, "neighbour": 0, "other": 0, "unreadable": 0}
    examples = []
    for episode, frame, images in rows_iter:
        for cam, img in enumerate(images):
            try:
                e, k, c = read_identity(img)
            except IdentityError:
                counts["unreadable"] += 1
                continue
            if (e, k, c) == (episode, frame, cam):
                counts["exact"] += 1
            elif e == episode and c == cam and abs(k - frame) == 1:
                counts["neighbour"] += 1
                if len(examples) < 5:
                    examples.append({"episode": episode, "frame": frame, "camera": cam, "got_frame": k})
            else:
                counts["other"] += 1
    counts["examples"] = examples
    return counts


# ---- children ----------------------------------------------------------------------------------


def _use_inplace_build():
    """Children import the in-place build (make py-inplace) when there is one, else the installed package."""
    _inplace.use()


def child_loader(root, check, full_warm=False):
    _use_inplace_build()
    import resource

    import numpy as np
    import vlafeed

    def make():
        return vlafeed.Loader(root, mode="stream", batch_size=256, shuffle=False, rank=0, world_size=1, threads=2,
                              image_format="uint8_hwc", output="numpy")

    if full_warm:  # steady state: one whole untimed pass first
        for _ in make():
            pass
    t0 = time.perf_counter()
    c0 = tree_cpu_s(os.getpid())
    loader = make()
    cams = list(loader.dataset.camera_keys)
    rows, first, checked = 0, None, []
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        n = len(batch["index"])
        rows += n
        if check:
            for i in range(n):
                checked.append((int(batch["episode_index"][i]), int(batch["frame_index"][i]),
                                [np.asarray(batch[c][i]) for c in cams]))
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s(os.getpid()) - c0
    stats = loader.stats()
    out = {"rows": rows, "frames": rows * len(cams), "wall_s": wall, "cpu_s": cpu, "first_batch_s": first,
           "mp4_opens": stats["video_opens"], "frames_decoded": stats["frames_decoded"],
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if check:
        out["exactness"] = check_frames(checked, cams)
    return out


def _ray_start(hook=None):
    import ray

    kw = {}
    if hook is not None:
        kw["runtime_env"] = {"worker_process_setup_hook": hook}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, **kw)
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Start both worker processes before the clock, as a warm cluster would have them.
    @ray.remote(num_cpus=1)
    def warm():
        return os.getpid()
    ray.get([warm.remote() for _ in range(2)])
    return ray


def _consume(ds, cams, check, frame_key):
    import numpy as np

    rows, first, checked = 0, None, []
    t0 = time.perf_counter()
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        if first is None:
            first = time.perf_counter() - t0
        n = len(batch["episode_index"])
        rows += n
        if check:
            for i in range(n):
                checked.append((int(batch["episode_index"][i]), int(batch["frame_index"][i]),
                                [frame_key(np.asarray(batch[c][i])) for c in cams]))
    return rows, first, checked


def child_datasource(root, check, warm, full_warm=False):
    _use_inplace_build()
    ray = _ray_start()
    import vlafeed.ray as vray

    if warm:  # both workers import vlafeed.ray and Ray Data's read path before the clock
        ray.data.read_datasource(vray.LeRobotDatasource(root, episodes=[0, 1], partitioning="episode")).take_all()
    if full_warm:  # steady state: one whole untimed pass (Ray's object store has faulted its pages in)
        _consume(ray.data.read_datasource(vray.LeRobotDatasource(root, image_format="uint8_hwc")), [], False, None)
    c0 = tree_cpu_s(os.getpid())
    t0 = time.perf_counter()
    source = vray.LeRobotDatasource(root, image_format="uint8_hwc", rows_per_block=ROWS_PER_BLOCK)
    ds = ray.data.read_datasource(source)
    cams = source.meta.video_keys
    rows, first, checked = _consume(ds, cams, check, lambda a: a)
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s(os.getpid()) - c0
    report = source.report()["tasks"]
    peaks = worker_peaks(os.getpid())
    out = {"rows": rows, "frames": rows * len(cams), "wall_s": wall, "cpu_s": cpu, "first_batch_s": first,
           "tasks": len(source.read_tasks_plan()), "mp4_opens": sum(r["video_opens"] for r in report),
           "frames_decoded": sum(r["frames_decoded"] for r in report),
           "task_cpu_s": sum(r["cpu_s"] for r in report),
           "peak_rss_per_worker_bytes": max(peaks.values()) if peaks else None}
    if check:
        out["exactness"] = check_frames(checked, cams)
    ray.shutdown()
    return out


def child_floor(root, pace_s_per_row=FLOOR_PACE_S_PER_ROW):
    """Ray's own cost of carrying the frames, with no reader at all: a datasource that opens no file and
    decodes nothing, and yields, task for task and block for block, tables of the same rows and camera
    frames (uint8 HWC) as vlafeed's datasource, through the same read path and consumer. Its whole-
    tree CPU is what Ray Data spends moving those bytes from a read task to the consumer; any datasource
    that delivers these frames through Ray Data pays at least this on top of its decoding. The frames are
    one block's worth of non-zero pixels per task, filled once and handed to Ray for every block (Ray
    copies each into its object store); the tasks yield at a decoder's pace (see blocks()) and carry the
    same size estimates as vlafeed's datasource."""
    _use_inplace_build()
    ray = _ray_start()
    import numpy as np
    import pyarrow as pa
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    import vlafeed.ray as vray

    source = vray.LeRobotDatasource(root, image_format="uint8_hwc")
    cams = source.meta.video_keys
    plan = source.read_tasks_plan()
    # The frames' shapes as the datasource delivers them (one decoded row, untimed).
    row = ray.data.read_datasource(vray.LeRobotDatasource(root, episodes=[plan[0]["episode_indices"][0]],
                                                          image_format="uint8_hwc")).take(1)[0]
    shapes = {k: tuple(np.asarray(row[k]).shape) for k in cams}

    def blocks(rows, per_block):
        frames = {k: np.full((per_block, *shapes[k]), 0x5A, np.uint8) for k in cams}
        start = 0
        while start < rows:
            n = min(per_block, rows - start)
            # Paced like a reader: the block appears after the time one engine thread takes to decode
            # it at the standalone loader's rate (a sleep: no CPU). An unpaced source, always ready,
            # keeps Ray Data's output backpressure engaged and costs Ray far more than a decoder does.
            time.sleep(n * pace_s_per_row)
            cols = [pa.array(np.arange(start, start + n, dtype=np.int64))]
            for k in cams:  # real (non-zero) pages, filled once per task: Ray copies what it is handed
                cols.append(pa.FixedShapeTensorArray.from_numpy_ndarray(frames[k][:n]))
            yield pa.Table.from_arrays(cols, names=["episode_index", *cams])
            start += n

    class Floor(Datasource):
        # The same size estimates as vlafeed's datasource: Ray Data schedules and backpressures by them.
        def estimate_inmemory_data_size(self):
            return source.estimate_inmemory_data_size()

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            out = []
            for t in plan:
                meta = BlockMetadata(num_rows=t["rows"], size_bytes=t["rows"] * source._row_bytes,
                                     input_files=None, exec_stats=None)
                out.append(ReadTask(lambda rows=t["rows"]: blocks(rows, ROWS_PER_BLOCK), meta))
            return out

    _consume(ray.data.read_datasource(Floor()), [], False, None)  # warm: both workers have run the path
    c0 = tree_cpu_s(os.getpid())
    t0 = time.perf_counter()
    rows = 0
    first = None
    for batch in ray.data.read_datasource(Floor()).iter_batches(batch_size=None, batch_format="numpy"):
        if first is None:
            first = time.perf_counter() - t0
        rows += len(batch["episode_index"])
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s(os.getpid()) - c0
    ray.shutdown()
    return {"rows": rows, "frames": rows * len(cams), "wall_s": wall, "cpu_s": cpu, "first_batch_s": first,
            "tasks": len(plan), "mp4_opens": 0, "frame_shapes": {k: list(v) for k, v in shapes.items()}}


def child_ray_loader(root, full_warm=False):
    """vlafeed.Loader inside Ray workers, the path of Ray Train workers (docs/ray.md, exact resume under Ray Train):
    two Ray tasks of one CPU each, rank r of 2, one engine thread each, consuming their batches in place
    as a training loop would. The whole Ray tree is counted, as for the datasource."""
    _use_inplace_build()
    ray = _ray_start()

    @ray.remote(num_cpus=1)
    def worker(rank, world):
        import vlafeed
        loader = vlafeed.Loader(root, mode="stream", batch_size=128, shuffle=False, rank=rank, world_size=world,
                                threads=1, image_format="uint8_hwc", output="numpy")
        t0 = time.perf_counter()
        rows, first = 0, None
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            rows += len(batch["index"])
        st = loader.stats()
        return {"rows": rows, "first": first, "opens": st["video_opens"], "cams": len(loader.dataset.camera_keys)}

    # Warm-up: both workers import vlafeed (a small share each); --full-warm: a whole untimed pass.
    warm_world = 2 if full_warm else 40
    ray.get([worker.remote(r, warm_world) for r in range(2)])
    c0 = tree_cpu_s(os.getpid())
    t0 = time.perf_counter()
    parts = ray.get([worker.remote(r, 2) for r in range(2)])
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s(os.getpid()) - c0
    ray.shutdown()
    rows = sum(p["rows"] for p in parts)
    return {"rows": rows, "frames": rows * parts[0]["cams"], "wall_s": wall, "cpu_s": cpu,
            "first_batch_s": max(p["first"] for p in parts), "mp4_opens": sum(p["opens"] for p in parts)}


def _count_opens_hook():
    """Runs in every Ray worker of the peer: counts torchcodec decoder constructions."""
    import torchcodec.decoders as dec

    original = dec.VideoDecoder
    log = os.environ.get("VF_BENCH_OPENS_LOG")

    class CountingDecoder(original):
        def __init__(self, *a, **k):
            with open(f"{log}.{os.getpid()}", "a") as f:
                f.write("open\n")
            super().__init__(*a, **k)

    dec.VideoDecoder = CountingDecoder


def child_peer(root, check, tolerance, warm, full_warm=False):
    import glob

    import numpy as np

    log = os.environ["VF_BENCH_OPENS_LOG"]
    ray = _ray_start(_count_opens_hook)
    kw = {} if tolerance is None else {"frame_tolerance_s": tolerance}
    if warm:  # both workers import LeRobot, torchcodec and Ray Data's read path before the clock
        ray.data.read_lerobot(root, episodes=[0, 1], read_granularity="episode", **kw).take_all()
    if full_warm:  # steady state: one whole untimed pass
        _consume(ray.data.read_lerobot(root, **kw), [], False, None)
    for path in glob.glob(log + ".*"):
        os.remove(path)
    c0 = tree_cpu_s(os.getpid())
    t0 = time.perf_counter()
    ds = ray.data.read_lerobot(root, **kw)
    info = json.load(open(os.path.join(root, "meta", "info.json")))
    cams = [k for k, v in info["features"].items() if v.get("dtype") == "video"]

    def to_hwc_uint8(a):
        a = np.asarray(a)
        if a.ndim == 3 and a.shape[0] == 3 and a.shape[-1] != 3:
            a = a.transpose(1, 2, 0)
        if a.dtype != np.uint8:
            a = np.clip(np.rint(a.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
        return a

    error = None
    try:
        rows, first, checked = _consume(ds, cams, check, to_hwc_uint8)
    except Exception as e:  # the peer aborts on LeRobot's drift: that is a result
        rows, first, checked = 0, None, []
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s(os.getpid()) - c0
    peaks = worker_peaks(os.getpid())
    opens = sum(len(open(p).read().split()) for p in glob.glob(log + ".*"))
    out = {"rows": rows, "frames": rows * len(cams), "wall_s": wall, "cpu_s": cpu, "first_batch_s": first,
           "mp4_opens": opens, "peak_rss_per_worker_bytes": max(peaks.values()) if peaks else None,
           "tolerance_s": tolerance, "error": error}
    if check and not error:
        out["exactness"] = check_frames(checked, cams)
    ray.shutdown()
    return out


# ---- driver ------------------------------------------------------------------------------------


def run_child(python, what, root, out_dir, check, tolerance=None, timeout=1800, cold=False, full_warm=False,
              extra=()):
    env = _inplace.child_env() if python == sys.executable else dict(os.environ, PYTHONPATH="")
    env["VF_BENCH_OPENS_LOG"] = str(out_dir / f"opens-{what}-{time.time_ns()}")
    args = [python, str(pathlib.Path(__file__).resolve()), "--child", what, "--root", str(root)]
    if check:
        args.append("--check")
    if tolerance is not None:
        args += ["--tolerance", str(tolerance)]
    if cold:
        args.append("--cold")
    if full_warm:
        args.append("--full-warm")
    args += ["--rows-per-block", str(ROWS_PER_BLOCK), *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"error": f"child {what} exited {r.returncode}: {(r.stderr or r.stdout)[-1500:]}"}
    return json.loads(lines[-1])


def first_training_step(root, out_dir):
    """Seconds from launching examples/ray_finetune.py (Ray start, trainer, 2 workers, Ray Data
    read) to the first logged training step of each rank."""
    log_dir = out_dir / f"train-{time.time_ns()}"
    env = _inplace.child_env()
    t0 = time.time()
    r = subprocess.run([sys.executable, str(REPO / "examples" / "ray_finetune.py"), "--dataset", str(root),
                        "--epochs", "1", "--num-cpus", "2", "--log-dir", str(log_dir)], capture_output=True,
                       text=True, timeout=1800, env=env)
    if r.returncode != 0:
        return {"error": r.stderr[-1500:]}
    firsts = []
    for rank in (0, 1):
        line = (log_dir / f"rank{rank}.jsonl").read_text().splitlines()[0]
        firsts.append(json.loads(line)["t"] - t0)
    return {"first_step_s": max(firsts), "total_s": time.time() - t0}


def make_dataset(cli, root, episodes, cameras, size, codec, max_video_mb=None):
    if (root / "meta" / "info.json").exists():
        return
    extra = ["--max-video-mb", str(max_video_mb)] if max_video_mb else []
    subprocess.run([cli, "make-sample", str(root), "--episodes", str(episodes), "--cameras", str(cameras),
                    "--size", size, "--codec", codec, "--quiet", *extra], check=True, timeout=3600)


def per_cpu(r):
    return r["frames"] / r["cpu_s"] if r.get("cpu_s") else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child")
    p.add_argument("--rows-per-block", type=int, default=128,
                   help="the datasource's rows_per_block (default 128, its default)")
    p.add_argument("--root")
    p.add_argument("--floor-pace", type=float, default=FLOOR_PACE_S_PER_ROW,
                   help="floor: seconds per row a read task waits before yielding (default: the loader's "
                        "CPU-s per row; the full run passes the value it measured)")
    p.add_argument("--check", action="store_true")
    p.add_argument("--tolerance", type=float)
    p.add_argument("--cold", action="store_true", help="child: no warm-up read before the clock")
    p.add_argument("--full-warm", action="store_true",
                   help="steady state: every contender reads the whole dataset once, untimed, before the "
                        "timed pass (Ray's object store pages are then already faulted in, as in a long run)")
    p.add_argument("--train-first-step", action="store_true",
                   help="also time examples/ray_finetune.py from launch to its first training step")
    p.add_argument("--out", default="/tmp/vf-raybench")
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--cameras", type=int, default=3)
    p.add_argument("--size", default="320x240")
    p.add_argument("--codec", default="av1")
    p.add_argument("--max-video-mb", type=float, default=None,
                   help="make-sample's rollover size (more files per camera: more read tasks)")
    p.add_argument("--repeat", type=int, default=2, help="speed runs per contender (best kept)")
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    p.add_argument("--no-peer", action="store_true")
    a = p.parse_args(argv)
    global ROWS_PER_BLOCK
    ROWS_PER_BLOCK = a.rows_per_block
    if a.child:
        warm = not a.cold
        fn = {"loader": lambda: child_loader(a.root, a.check, a.full_warm),
              "datasource": lambda: child_datasource(a.root, a.check, warm, a.full_warm),
              "peer": lambda: child_peer(a.root, a.check, a.tolerance, warm, a.full_warm),
              "floor": lambda: child_floor(a.root, a.floor_pace),
              "ray-loader": lambda: child_ray_loader(a.root, a.full_warm)}[a.child]
        print(json.dumps(fn()))
        return 0

    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    root = out / f"ds-{a.episodes}e-{a.cameras}c-{a.size}-{a.codec}"
    if a.max_video_mb:
        root = root.with_name(root.name + f"-{a.max_video_mb:g}mb")
    make_dataset(str(REPO / "build" / "vlafeed"), root, a.episodes, a.cameras, a.size, a.codec, a.max_video_mb)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    results = {"dataset": str(root), "load_before": load_before, "full_warm": a.full_warm, "runs": {}}
    peer_ok = not a.no_peer and os.path.exists(a.peer_python)
    contenders = [("loader", sys.executable, None), ("datasource", sys.executable, None),
                  ("floor", sys.executable, None), ("ray-loader", sys.executable, None)]
    if peer_ok:
        contenders.append(("peer-loose", a.peer_python, 1.0))  # tolerance filled in below
    info = json.load(open(root / "meta" / "info.json"))
    fps = float(info["fps"])
    for rep in range(a.repeat):
        for name, python, tol in contenders:
            what = "peer" if name.startswith("peer") else name
            tolerance = (1.0 / fps) if name == "peer-loose" else None
            extra = ()
            if name == "floor":  # paced at this repeat's measured loader CPU-seconds per row
                lr = results["runs"]["loader"][-1]
                if lr.get("cpu_s") and lr.get("rows"):
                    extra = ("--floor-pace", repr(lr["cpu_s"] / lr["rows"]))
            r = run_child(python, what, root, out, False, tolerance, full_warm=a.full_warm, extra=extra)
            results["runs"].setdefault(name, []).append(r)
            print(f"[{rep}] {name}: {json.dumps(r)[:400]}", file=sys.stderr, flush=True)
    # Exactness (one run each, not timed): vlafeed's datasource; the peer at its default and loose tolerance.
    results["exact"] = {"datasource": run_child(sys.executable, "datasource", root, out, True)}
    if peer_ok:
        results["exact"]["peer-default"] = run_child(a.peer_python, "peer", root, out, True, None)
        results["exact"]["peer-loose"] = run_child(a.peer_python, "peer", root, out, True, 1.0 / fps)
    else:
        results["peer_missing"] = f"no peer python at {a.peer_python}" if not a.no_peer else "--no-peer"
    # Cold: a fresh Ray, nothing imported in the workers: time to the first batch.
    results["cold"] = {"datasource": run_child(sys.executable, "datasource", root, out, False, cold=True)}
    if peer_ok:
        results["cold"]["peer-loose"] = run_child(a.peer_python, "peer", root, out, False, 1.0 / fps, cold=True)
    if a.train_first_step:
        results["train_first_step"] = first_training_step(root, out)
    with open("/proc/loadavg") as f:
        results["load_after"] = f.read().split()[:3]

    def best(name):
        runs = [r for r in results["runs"].get(name, []) if not r.get("error") and r.get("cpu_s")]
        return max(runs, key=per_cpu) if runs else None

    summary = {}
    for name in results["runs"]:
        b = best(name)
        if b:
            summary[name] = {"frames": b["frames"], "rows_per_s": b["rows"] / b["wall_s"], "frames_per_s": b["frames"] / b["wall_s"],
                             "frames_per_cpu_s": per_cpu(b), "rows_per_cpu_s": b["rows"] / b["cpu_s"],
                             "mp4_opens": b.get("mp4_opens"), "first_batch_s": b.get("first_batch_s"),
                             "peak_rss_per_worker_mb": (b.get("peak_rss_per_worker_bytes") or
                                                        b.get("peak_rss_bytes") or 0) / 2**20}
    if "loader" in summary and "datasource" in summary:
        summary["datasource_vs_loader_per_cpu"] = summary["datasource"]["frames_per_cpu_s"] / \
            summary["loader"]["frames_per_cpu_s"]
    if "floor" in summary and "datasource" in summary and "loader" in summary:
        # Ray's carrying cost measured alone; what the datasource spends beyond it, against the loader;
        # and the best any datasource could do (decoding at the loader's cost, plus Ray's floor).
        cpu = {k: summary[k]["frames"] / summary[k]["frames_per_cpu_s"] for k in ("loader", "datasource", "floor")}
        summary["floor_cpu_s"] = cpu["floor"]
        summary["datasource_above_floor_vs_loader"] = cpu["loader"] / max(cpu["datasource"] - cpu["floor"], 1e-9)
        summary["any_datasource_bound_vs_loader"] = cpu["loader"] / (cpu["loader"] + cpu["floor"])
    if "ray-loader" in summary and "loader" in summary:
        summary["ray_loader_vs_loader_per_cpu"] = summary["ray-loader"]["frames_per_cpu_s"] / \
            summary["loader"]["frames_per_cpu_s"]
    if "peer-loose" in summary and "datasource" in summary:
        summary["datasource_vs_peer_per_cpu"] = summary["datasource"]["frames_per_cpu_s"] / \
            summary["peer-loose"]["frames_per_cpu_s"]
    results["summary"] = summary
    (out / "ray-bench.json").write_text(json.dumps(results, indent=1, default=str))
    print("| run | rows/s | frames/s | frames per CPU-s | MP4 opens | first batch s | peak RSS per worker MB |")
    print("|---|---|---|---|---|---|---|")
    for name, s in summary.items():
        if isinstance(s, dict):
            print(f"| {name} | {s['rows_per_s']:.0f} | {s['frames_per_s']:.0f} | {s['frames_per_cpu_s']:.0f} | "
                  f"{s['mp4_opens']} | {s['first_batch_s']:.2f} | {s['peak_rss_per_worker_mb']:.0f} |")
    for k in ("datasource_vs_loader_per_cpu", "datasource_vs_peer_per_cpu", "floor_cpu_s",
              "datasource_above_floor_vs_loader", "any_datasource_bound_vs_loader", "ray_loader_vs_loader_per_cpu"):
        if k in summary:
            print(f"{k}: {summary[k]:.2f}")
    print(json.dumps(results["exact"], default=str)[:3000])
    print(json.dumps(results["cold"], default=str)[:2000])
    if "train_first_step" in results:
        print("train first step:", results["train_first_step"])
    print(f"load before {load_before}, after {results['load_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
