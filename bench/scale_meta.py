#!/usr/bin/env python3
"""Synthetic LeRobot v3.0 datasets at scale (issue 9), written with pyarrow.

The output has LeRobot's on-disk layout (shared/docs/lerobot-format.md §1-§6)
but no MP4 files: the point is the metadata (and optionally the data parquet
files) of a large dataset, which is what the engine's open, plan and loader
setup cost depends on.

What is written under ROOT:

- meta/info.json: codebase_version v3.0, fps, 3 video cameras
  observation.images.{a,b,c} (with an `info` block), float32 vectors
  observation.state and action, the default features (timestamp,
  frame_index, episode_index, index, task_index), chunks_size,
  data_files_size_in_mb, video_files_size_in_mb, data_path/video_path.
- meta/episodes/chunk-XXX/file-YYY.parquet: one row per episode with
  LeRobot's columns (episode_index, tasks, length, data/*, dataset_*_index,
  videos/<cam>/{chunk_index,file_index,from_timestamp,to_timestamp},
  optionally stats/<feature>/{min,max,mean,std,count} and LeRobot's
  quantiles {q01,q10,q50,q90,q99} (stats_quantiles; the variant name gets
  "-lr"), and
  meta/episodes/{chunk_index,file_index}), `episodes_per_meta_file` rows per
  file, in one row group per file or in row groups of `meta_row_group` rows
  (the recorder flushes every 10 episodes).
- meta/tasks.parquet (task_index + task), meta/stats.json.
- optionally data/chunk-XXX/file-YYY.parquet with real rows, one row group
  per file (converter layout) or one per episode (recorder layout).

Episode lengths are seeded random in [min_length, max_length]. Files roll
over as LeRobot's writer does: an episode goes to a fresh file when the
current file plus the episode would reach the size target. Each camera has
its own bytes per frame (bitrates differ), with per-episode jitter, so the
cameras roll over at different episodes.

Outputs are cached: ROOT/.vf-scale-stamp.json records the parameters, and a
call with the same parameters returns without writing anything.

Python: ``generate(root, **params)`` or ``generate(root, **shape_params("100k"))``
returns the stamp dict; ``ensure(shape, root=None, **overrides)`` picks the
default folder /tmp/vf-scale/<name>. CLI: see --help.
"""
import argparse
import fcntl
import json
import os
import pathlib
import shutil
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

GENERATOR_VERSION = 1
STAMP = ".vf-scale-stamp.json"
PARTIAL = ".vf-scale-partial"  # present while writing: an interrupted folder is ours to replace
DEFAULT_CACHE = "/tmp/vf-scale"
CAMERAS = ("observation.images.a", "observation.images.b", "observation.images.c")

# Parameters of generate() and their defaults (the 10K shape).
DEFAULTS = dict(
    episodes=10_000,
    fps=30,
    min_length=150,
    max_length=250,
    seed=0,
    state_dim=8,
    action_dim=7,
    num_tasks=1000,
    cameras=3,
    image_shape=(480, 640, 3),
    # MB of MP4 per frame, one per camera (bitrates differ, so files roll over
    # at different episodes); +-jitter per episode.
    camera_mb_per_frame=(0.0070, 0.0080, 0.0095),
    video_jitter=0.2,
    video_files_size_in_mb=200,
    data_files_size_in_mb=100,
    # Bytes per frame in a data parquet file, used to place episodes in data
    # files (metadata), whether or not the data files are written.
    data_bytes_per_frame=200,
    chunks_size=1000,
    episodes_per_meta_file=10_000,
    meta_row_group=0,  # 0: one row group per meta/episodes file; N: N-row row groups
    episode_stats=True,  # stats/<feature>/{min,max,mean,std,count} columns
    # Also LeRobot's per-episode quantiles stats/<feature>/{q01,q10,q50,q90,q99}
    # (lerobot/datasets/compute_stats.py DEFAULT_QUANTILES): what a dataset
    # recorded or converted by LeRobot 0.4+ carries, 10 stats per feature.
    stats_quantiles=False,
    with_data=False,
    data_row_groups="file",  # "file": one row group per data file; "episode": one per episode
    robot_type="synthetic",
)

SHAPES = {
    "10k": dict(episodes=10_000),
    "100k": dict(episodes=100_000),
    "1m": dict(episodes=1_000_000),
    # DROID: 95,600 episodes (~27.6M frames at ~289 frames/episode), 15 fps,
    # 3 cameras at 180x320, 200 MB MP4s; ~2.2K distinct MP4 files overall.
    "droid": dict(episodes=95_600, fps=15, min_length=180, max_length=398, image_shape=(180, 320, 3),
                  camera_mb_per_frame=(0.0050, 0.0053, 0.0057), state_dim=8, action_dim=7, num_tasks=20_000,
                  robot_type="franka"),
}


def shape_params(shape, **overrides):
    """Full parameter dict for a named shape ("10k", "100k", "1m", "droid")
    with overrides applied."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    params = dict(DEFAULTS)
    params.update(SHAPES[shape])
    for k, v in overrides.items():
        if k not in DEFAULTS:
            raise TypeError(f"unknown parameter {k!r}")
        params[k] = v
    return params


def variant_name(shape, params):
    """A folder name that tells the variants apart, e.g. 100k-rg10-data-ep."""
    name = shape
    if params["meta_row_group"]:
        name += f"-rg{params['meta_row_group']}"
    if params["with_data"]:
        name += "-data" + ("-ep" if params["data_row_groups"] == "episode" else "")
    if params["stats_quantiles"] and params["episode_stats"]:
        name += "-lr"
    base = shape_params(shape)
    for k in sorted(params):
        if k not in ("meta_row_group", "with_data", "data_row_groups", "stats_quantiles") and params[k] != base[k]:
            v = params[k]
            v = "x".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)
            name += f"-{k}={v}"
    return name


def ensure(shape, root=None, **overrides):
    """Generates the named shape (with overrides) under root, default
    /tmp/vf-scale/<variant name>, unless it is already there. Returns the root."""
    params = shape_params(shape, **overrides)
    root = pathlib.Path(root) if root else pathlib.Path(DEFAULT_CACHE) / variant_name(shape, params)
    generate(root, **params)
    return root


# ---- layout ------------------------------------------------------------------------------


def chunk_file(n, chunks_size):
    """(chunk_index, file_index) arrays for sequential file numbers n."""
    n = np.asarray(n, dtype=np.int64)
    return n // chunks_size, n % chunks_size


def rollover(sizes, limit):
    """LeRobot's rule: an episode opens a new file when the current file's size
    plus the episode's reaches the limit (a file always gets at least one
    episode). Returns (file number per episode, offset of the episode in its
    file, in the same units as sizes)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    files = np.empty(len(sizes), dtype=np.int64)
    offsets = np.empty(len(sizes), dtype=np.float64)
    cur, size = 0, 0.0
    for i, s in enumerate(sizes.tolist()):
        if size > 0 and size + s >= limit:
            cur += 1
            size = 0.0
        files[i] = cur
        offsets[i] = size
        size += s
    return files, offsets


def video_layout(lengths, fps, mb_per_frame, jitter, limit_mb, rng):
    """(file numbers, from_timestamp, to_timestamp) for one camera. The
    timestamps are the float sum of the previous episodes' durations in the
    same file, as LeRobot's writer accumulates them."""
    mb = lengths * mb_per_frame * rng.uniform(1 - jitter, 1 + jitter, len(lengths))
    files, _ = rollover(mb, limit_mb)
    dur = lengths / float(fps)
    # from_timestamp: duration of the earlier episodes of the same file.
    csum = np.cumsum(dur) - dur
    starts = np.r_[0, np.flatnonzero(np.diff(files)) + 1]
    base = np.repeat(csum[starts], np.diff(np.r_[starts, len(files)]))
    from_ts = csum - base
    return files, from_ts, from_ts + dur


def list_of(values, dim, value_type):
    """A list<value_type> array, dim values per row, from a flat array."""
    flat = pa.array(np.ascontiguousarray(values).ravel(), type=value_type)
    return pa.FixedSizeListArray.from_arrays(flat, dim).cast(pa.list_(value_type))


def image_stat(values):
    """LeRobot's (C,1,1) image stats: list<list<list<double>>> from (rows, C)."""
    rows, c = values.shape
    flat = pa.array(values.ravel(), type=pa.float64())
    inner = pa.FixedSizeListArray.from_arrays(flat, 1)
    mid = pa.FixedSizeListArray.from_arrays(inner, 1)
    outer = pa.FixedSizeListArray.from_arrays(mid, c)
    return outer.cast(pa.list_(pa.list_(pa.list_(pa.float64()))))


def task_string(i):
    verbs = ("pick up", "push", "open", "close", "stack", "wipe", "pour")
    objects = ("the red cube", "the drawer", "the blue cup", "the towel", "the marker", "the lid")
    return f"{verbs[i % len(verbs)]} {objects[(i // 7) % len(objects)]} (variant {i})"


def features(p):
    feats = {
        "observation.state": {"dtype": "float32", "shape": [p["state_dim"]],
                              "names": [f"state_{i}" for i in range(p["state_dim"])]},
        "action": {"dtype": "float32", "shape": [p["action_dim"]],
                   "names": [f"action_{i}" for i in range(p["action_dim"])]},
    }
    h, w, c = p["image_shape"]
    for cam in CAMERAS[:p["cameras"]]:
        feats[cam] = {"dtype": "video", "shape": [h, w, c], "names": ["height", "width", "channels"],
                      "info": {"video.height": h, "video.width": w, "video.codec": "av1", "video.pix_fmt": "yuv420p",
                               "video.is_depth_map": False, "video.fps": p["fps"], "video.channels": c,
                               "has_audio": False}}
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                        ("index", "int64"), ("task_index", "int64")):
        feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


# ---- generation ------------------------------------------------------------------------


def layout(p):
    """Everything about the episodes as NumPy arrays (no I/O)."""
    rng = np.random.default_rng(p["seed"])
    n = p["episodes"]
    lengths = rng.integers(p["min_length"], p["max_length"] + 1, n).astype(np.int64)
    to_index = np.cumsum(lengths)
    from_index = to_index - lengths
    task_index = rng.integers(0, p["num_tasks"], n).astype(np.int64)
    data_file, _ = rollover(lengths * float(p["data_bytes_per_frame"]), p["data_files_size_in_mb"] * 1e6)
    cams = []
    for c in range(p["cameras"]):
        cams.append(video_layout(lengths, p["fps"], p["camera_mb_per_frame"][c], p["video_jitter"],
                                 p["video_files_size_in_mb"], rng))
    return dict(lengths=lengths, from_index=from_index, to_index=to_index, task_index=task_index,
                data_file=data_file, cams=cams)


def slice_layout(L, lo, hi):
    """The layout arrays of episodes [lo, hi) (views)."""
    out = {k: L[k][lo:hi] for k in ("lengths", "from_index", "to_index", "task_index", "data_file")}
    out["cams"] = [tuple(a[lo:hi] for a in cam) for cam in L["cams"]]
    return out


def episode_stats_columns(p, S, lo):
    """stats/<feature>/{min,max,mean,std,count} for the episodes of the slice
    S, which starts at episode lo."""
    cols = {}
    lengths = S["lengths"]
    n = len(lengths)
    ep = np.arange(lo, lo + n, dtype=np.int64)
    rng = np.random.default_rng(p["seed"] * 7919 + lo)
    for name, dim in (("observation.state", p["state_dim"]), ("action", p["action_dim"])):
        mean = rng.normal(0, 1, (n, dim))
        std = rng.uniform(0.1, 1, (n, dim))
        cols[f"stats/{name}/min"] = list_of(mean - 2 * std, dim, pa.float64())
        cols[f"stats/{name}/max"] = list_of(mean + 2 * std, dim, pa.float64())
        cols[f"stats/{name}/mean"] = list_of(mean, dim, pa.float64())
        cols[f"stats/{name}/std"] = list_of(std, dim, pa.float64())
        cols[f"stats/{name}/count"] = list_of(lengths, 1, pa.int64())
        if p["stats_quantiles"]:
            for q, z in QUANTILE_Z:  # inside [min, max], as real quantiles are
                cols[f"stats/{name}/{q}"] = list_of(np.clip(mean + z * std, mean - 2 * std, mean + 2 * std), dim,
                                                    pa.float64())
    for cam in CAMERAS[:p["cameras"]]:
        c = p["image_shape"][2]
        mean = rng.uniform(0.3, 0.7, (n, c))
        cols[f"stats/{cam}/min"] = image_stat(np.zeros((n, c)))
        cols[f"stats/{cam}/max"] = image_stat(np.ones((n, c)))
        cols[f"stats/{cam}/mean"] = image_stat(mean)
        cols[f"stats/{cam}/std"] = image_stat(np.full((n, c), 0.25))
        cols[f"stats/{cam}/count"] = list_of(np.minimum(lengths, 100), 1, pa.int64())
        if p["stats_quantiles"]:
            for q, z in QUANTILE_Z:
                cols[f"stats/{cam}/{q}"] = image_stat(np.clip(mean + z * 0.25, 0, 1))
    last = (lengths - 1).astype(np.float64)
    ti = S["task_index"]
    scalars = {
        "timestamp": (np.zeros(n), last / p["fps"], last / p["fps"] / 2, pa.float64()),
        "frame_index": (np.zeros(n, np.int64), lengths - 1, last / 2, pa.int64()),
        "episode_index": (ep, ep, ep.astype(np.float64), pa.int64()),
        "index": (S["from_index"], S["to_index"] - 1, (S["from_index"] + S["to_index"] - 1) / 2.0, pa.int64()),
        "task_index": (ti, ti, ti.astype(np.float64), pa.int64()),
    }
    for name, (mn, mx, mean, mtype) in scalars.items():
        cols[f"stats/{name}/min"] = list_of(mn, 1, mtype)
        cols[f"stats/{name}/max"] = list_of(mx, 1, mtype)
        cols[f"stats/{name}/mean"] = list_of(mean, 1, pa.float64())
        cols[f"stats/{name}/std"] = list_of(np.sqrt((lengths.astype(np.float64) ** 2 - 1) / 12.0)
                                            if name in ("timestamp", "frame_index", "index") else np.zeros(n),
                                            1, pa.float64())
        cols[f"stats/{name}/count"] = list_of(lengths, 1, pa.int64())
        if p["stats_quantiles"]:
            span = np.asarray(mx, np.float64) - np.asarray(mn, np.float64)
            for q, z in QUANTILE_Z:
                cols[f"stats/{name}/{q}"] = list_of(np.asarray(mn, np.float64) + span * QUANTILE_FRACTION[q], 1,
                                                    pa.float64())
    return cols


# LeRobot's DEFAULT_QUANTILES [0.01, 0.10, 0.50, 0.90, 0.99] as its column
# names, with a normal's z-score (vectors) and the fraction of [min, max]
# (scalar features) used to make plausible values.
QUANTILE_Z = (("q01", -2.326), ("q10", -1.2816), ("q50", 0.0), ("q90", 1.2816), ("q99", 2.326))
QUANTILE_FRACTION = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def write_meta_file(root, p, S, lo, mchunk, mfile, task_strings):
    """meta/episodes/chunk-<mchunk>/file-<mfile>.parquet for the slice S
    (episodes lo, lo+1, ...)."""
    if not isinstance(task_strings, pa.Array):
        task_strings = pa.array(task_strings, pa.string())
    rows = len(S["lengths"])
    dchunk, dfile = chunk_file(S["data_file"], p["chunks_size"])
    cols = {
        "episode_index": pa.array(np.arange(lo, lo + rows, dtype=np.int64)),
        "tasks": pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32)),
                                          task_strings.take(pa.array(S["task_index"]))),
        "length": pa.array(S["lengths"]),
        "data/chunk_index": pa.array(dchunk),
        "data/file_index": pa.array(dfile),
        "dataset_from_index": pa.array(S["from_index"]),
        "dataset_to_index": pa.array(S["to_index"]),
    }
    for c, cam in enumerate(CAMERAS[:p["cameras"]]):
        files, from_ts, to_ts = S["cams"][c]
        vchunk, vfile = chunk_file(files, p["chunks_size"])
        cols[f"videos/{cam}/chunk_index"] = pa.array(vchunk)
        cols[f"videos/{cam}/file_index"] = pa.array(vfile)
        cols[f"videos/{cam}/from_timestamp"] = pa.array(from_ts)
        cols[f"videos/{cam}/to_timestamp"] = pa.array(to_ts)
    if p["episode_stats"]:
        cols.update(episode_stats_columns(p, S, lo))
    cols["meta/episodes/chunk_index"] = pa.array(np.full(rows, mchunk, dtype=np.int64))
    cols["meta/episodes/file_index"] = pa.array(np.full(rows, mfile, dtype=np.int64))
    path = pathlib.Path(root) / f"meta/episodes/chunk-{mchunk:03d}/file-{mfile:03d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, compression="snappy", row_group_size=p["meta_row_group"] or rows)


def write_episodes_meta(root, p, L, task_strings, jobs=1):
    """Writes the meta/episodes files; in `jobs` processes when that pays
    (many episodes), since small row groups make pyarrow's writer slow."""
    n = p["episodes"]
    per = p["episodes_per_meta_file"]
    nfiles = (n + per - 1) // per
    mchunk, mfile = chunk_file(np.arange(nfiles), p["chunks_size"])
    work = [(str(root), p, slice_layout(L, f * per, min(n, (f + 1) * per)), f * per, int(mchunk[f]), int(mfile[f]))
            for f in range(nfiles)]
    if jobs > 1 and nfiles > 1 and n >= 200_000:
        import concurrent.futures
        import multiprocessing
        strings = task_strings.to_pylist()
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, nfiles),
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            for fut in [pool.submit(write_meta_file, *w, strings) for w in work]:
                fut.result()
    else:
        for w in work:
            write_meta_file(*w, task_strings)
    return nfiles


def data_schema(p):
    return pa.schema([
        ("observation.state", pa.list_(pa.float32(), p["state_dim"])),
        ("action", pa.list_(pa.float32(), p["action_dim"])),
        ("timestamp", pa.float32()),
        ("frame_index", pa.int64()),
        ("episode_index", pa.int64()),
        ("index", pa.int64()),
        ("task_index", pa.int64()),
    ])


def write_data(root, p, L):
    """One parquet file per data file number, rows of its episodes in order."""
    schema = data_schema(p)
    files = L["data_file"]
    bounds = np.r_[0, np.flatnonzero(np.diff(files)) + 1, len(files)]
    chunk, fileno = chunk_file(files[bounds[:-1]], p["chunks_size"])
    for k in range(len(bounds) - 1):
        e0, e1 = int(bounds[k]), int(bounds[k + 1])
        lengths = L["lengths"][e0:e1]
        r0, r1 = int(L["from_index"][e0]), int(L["to_index"][e1 - 1])
        index = np.arange(r0, r1, dtype=np.int64)
        episode = np.repeat(np.arange(e0, e1, dtype=np.int64), lengths)
        frame = index - np.repeat(L["from_index"][e0:e1], lengths)
        # Cheap deterministic vectors: a function of (index, component).
        base = (index % 4096).astype(np.float32) * np.float32(1 / 4096)
        state = base[:, None] + np.arange(p["state_dim"], dtype=np.float32)[None, :]
        action = base[:, None] - np.arange(p["action_dim"], dtype=np.float32)[None, :]
        table = pa.table({
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), p["state_dim"]),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), p["action_dim"]),
            "timestamp": pa.array((frame / p["fps"]).astype(np.float32)),
            "frame_index": pa.array(frame),
            "episode_index": pa.array(episode),
            "index": pa.array(index),
            "task_index": pa.array(np.repeat(L["task_index"][e0:e1], lengths)),
        }, schema=schema)
        path = root / f"data/chunk-{chunk[k]:03d}/file-{fileno[k]:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        if p["data_row_groups"] == "episode":
            with pq.ParquetWriter(path, schema, compression="snappy") as w:
                offsets = np.r_[0, np.cumsum(lengths)]
                for i in range(len(lengths)):
                    w.write_table(table.slice(int(offsets[i]), int(lengths[i])))
        else:
            pq.write_table(table, path, compression="snappy", row_group_size=max(1, r1 - r0))
    return len(bounds) - 1


def write_stats_json(root, p, L):
    total = int(L["lengths"].sum())
    n = p["episodes"]
    stats = {}
    for name, dim in (("observation.state", p["state_dim"]), ("action", p["action_dim"])):
        stats[name] = {"min": [-3.0] * dim, "max": [3.0] * dim, "mean": [0.0] * dim, "std": [1.0] * dim,
                       "count": [total]}
    c = p["image_shape"][2]
    for cam in CAMERAS[:p["cameras"]]:
        stats[cam] = {"min": [[[0.0]]] * c, "max": [[[1.0]]] * c, "mean": [[[0.5]]] * c, "std": [[[0.25]]] * c,
                      "count": [min(n, 100) * 100]}
    maxlen = int(L["lengths"].max())
    for name, mx in (("timestamp", (maxlen - 1) / p["fps"]), ("frame_index", maxlen - 1),
                     ("episode_index", n - 1), ("index", total - 1), ("task_index", p["num_tasks"] - 1)):
        stats[name] = {"min": [0], "max": [mx], "mean": [mx / 2], "std": [mx / 4 or 0.0], "count": [total]}
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=2))


def read_stamp(root):
    try:
        return json.loads((pathlib.Path(root) / STAMP).read_text())
    except (OSError, ValueError):
        return None


def normalized(params):
    """JSON-comparable parameters (tuples as lists)."""
    return json.loads(json.dumps(params))


def generate(root, force=False, quiet=True, jobs=None, **params):
    """Writes the dataset under root unless root's stamp already records the
    same parameters (and generator version). Unknown parameter names raise
    TypeError; missing ones take DEFAULTS. Returns the stamp dict: the
    parameters plus totals (frames, files per kind) and seconds taken.
    jobs: processes for the meta/episodes files of large datasets (default
    min(4, CPUs)); it does not change the output."""
    for k in params:
        if k not in DEFAULTS:
            raise TypeError(f"unknown parameter {k!r}")
    p = dict(DEFAULTS)
    p.update(params)
    p["camera_mb_per_frame"] = tuple(p["camera_mb_per_frame"])
    p["image_shape"] = tuple(p["image_shape"])
    if not 1 <= p["cameras"] <= len(CAMERAS) or len(p["camera_mb_per_frame"]) < p["cameras"]:
        raise ValueError(f"cameras must be 1..{len(CAMERAS)} with one camera_mb_per_frame each")
    if p["data_row_groups"] not in ("file", "episode"):
        raise ValueError("data_row_groups must be 'file' or 'episode'")
    if p["episodes"] < 1 or p["min_length"] < 1 or p["max_length"] < p["min_length"]:
        raise ValueError("need episodes >= 1 and 1 <= min_length <= max_length")
    root = pathlib.Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    # Several benches may ask for the same cached folder at once: one writes,
    # the others wait for it and then find its stamp.
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _generate_locked(root, force, quiet, jobs, p)


def _generate_locked(root, force, quiet, jobs, p):
    want = {"generator_version": GENERATOR_VERSION, "params": normalized(p)}
    old = read_stamp(root)
    if not force and old and {k: old.get(k) for k in want} == want:
        return old
    if root.exists():
        if old is None and any(root.iterdir()) and not (root / PARTIAL).exists():
            raise FileExistsError(f"{root}: not empty and not written by scale_meta.py (no {STAMP}); "
                                  "choose another folder")
        shutil.rmtree(root)
    t0 = time.perf_counter()
    root.mkdir(parents=True)
    (root / PARTIAL).write_text("scale_meta.py is writing (or was interrupted writing) this folder\n")
    L = layout(p)
    task_strings = pa.array([task_string(i) for i in range(p["num_tasks"])])
    (root / "meta").mkdir()
    jobs = min(4, os.cpu_count() or 1) if jobs is None else jobs
    meta_files = write_episodes_meta(root, p, L, task_strings, jobs)
    pq.write_table(pa.table({"task_index": pa.array(np.arange(p["num_tasks"], dtype=np.int64)),
                             "task": task_strings}), root / "meta/tasks.parquet", compression="snappy")
    write_stats_json(root, p, L)
    data_files = write_data(root, p, L) if p["with_data"] else 0
    total = int(L["lengths"].sum())
    n = p["episodes"]
    info = {
        "codebase_version": "v3.0", "robot_type": p["robot_type"], "total_episodes": n, "total_frames": total,
        "total_tasks": p["num_tasks"], "chunks_size": p["chunks_size"],
        "data_files_size_in_mb": p["data_files_size_in_mb"], "video_files_size_in_mb": p["video_files_size_in_mb"],
        "fps": p["fps"], "splits": {"train": f"0:{n}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features(p),
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    video_files = [int(files[-1]) + 1 for files, _, _ in L["cams"]]
    # Episode at which each camera first rolls over (tests and reports use it).
    first_rollover = [int(np.argmax(files > 0)) if files[-1] > 0 else None for files, _, _ in L["cams"]]
    stamp = dict(want, total_frames=total, meta_files=meta_files, data_files_in_meta=int(L["data_file"][-1]) + 1,
                 data_files_written=data_files, video_files_per_camera=video_files,
                 distinct_video_files=sum(video_files), first_rollover_per_camera=first_rollover,
                 seconds=round(time.perf_counter() - t0, 3))
    (root / STAMP).write_text(json.dumps(stamp, indent=2))
    (root / PARTIAL).unlink()
    if not quiet:
        print(f"wrote {root}: {n} episodes, {total} frames, {meta_files} meta/episodes files, "
              f"{data_files} data files, {sum(video_files)} MP4s referenced ({stamp['seconds']} s)", file=sys.stderr)
    return stamp


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="10k", choices=sorted(SHAPES), help="named size (default 10k)")
    ap.add_argument("--out", help=f"dataset folder (default {DEFAULT_CACHE}/<variant name>)")
    ap.add_argument("--episodes", type=int, help="override the shape's episode count")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--episodes-per-meta-file", type=int)
    ap.add_argument("--meta-row-group", type=int,
                    help="rows per row group in meta/episodes files (0: one per file; the recorder writes 10)")
    ap.add_argument("--no-episode-stats", action="store_true", help="leave out the stats/* columns")
    ap.add_argument("--lerobot-stats", action="store_true",
                    help="also LeRobot's quantile stats columns q01..q99 (10 stats per feature; folder suffix -lr)")
    ap.add_argument("--with-data", action="store_true", help="also write data/ parquet files with real rows")
    ap.add_argument("--data-row-groups", choices=("file", "episode"),
                    help="data files: one row group per file (converter) or per episode (recorder)")
    ap.add_argument("--video-files-size-in-mb", type=int)
    ap.add_argument("--force", action="store_true", help="regenerate even if the stamp matches")
    ap.add_argument("--jobs", type=int, help="processes writing meta/episodes files (default min(4, CPUs))")
    ap.add_argument("--print-root", action="store_true", help="print only the dataset folder on stdout")
    args = ap.parse_args(argv)
    overrides = {k: v for k, v in (("episodes", args.episodes), ("seed", args.seed),
                                   ("episodes_per_meta_file", args.episodes_per_meta_file),
                                   ("meta_row_group", args.meta_row_group),
                                   ("data_row_groups", args.data_row_groups),
                                   ("video_files_size_in_mb", args.video_files_size_in_mb)) if v is not None}
    if args.no_episode_stats:
        overrides["episode_stats"] = False
    if args.with_data:
        overrides["with_data"] = True
    if args.lerobot_stats:
        overrides["stats_quantiles"] = True
    params = shape_params(args.shape, **overrides)
    root = pathlib.Path(args.out) if args.out else pathlib.Path(DEFAULT_CACHE) / variant_name(args.shape, params)
    stamp = generate(root, force=args.force, quiet=args.print_root, jobs=args.jobs, **params)
    if args.print_root:
        print(root)
    else:
        print(json.dumps({"root": str(root), **{k: v for k, v in stamp.items() if k != "params"}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
