"""Shared pieces of the benchmark peers: LeRobot v3.0 metadata read with
pyarrow (no vlafeed, no LeRobot), the sample positions and windows, and the
measurement record every peer writes (the same field names as
`vlafeed bench --json`'s "results", so bench/compare.py and
bench/plot_bench.py read all of them alike).

Used by pyav_peer.py (main environment) and lerobot_peer.py (run with the
isolated LeRobot venv's python, which sees the same system packages).
"""
import json
import os
import resource
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SARM_DELTAS_S = [float(s) for s in range(-7, 1)]  # 8 steps 1 s apart, ending at the sample


class Meta:
    """What a LeRobot v3.0 loader reads before decoding: info.json, the
    episodes table (per-camera file and from_timestamp) and the data rows."""

    def __init__(self, root):
        self.root = os.fspath(root)
        with open(os.path.join(self.root, "meta", "info.json")) as f:
            self.info = json.load(f)
        if self.info.get("codebase_version") != "v3.0":
            raise ValueError(f"{root}: the peers read v3.0 datasets only")
        self.fps = float(self.info["fps"])
        self.cameras = [k for k, v in self.info["features"].items() if v.get("dtype") == "video"]
        ep_dir = os.path.join(self.root, "meta", "episodes")
        files = sorted(os.path.join(r, n) for r, _, ns in os.walk(ep_dir) for n in ns if n.endswith(".parquet"))
        eps = pa.concat_tables([pq.read_table(p) for p in files]).to_pydict()
        order = np.argsort(eps["episode_index"])
        self.episodes = []
        for i in order:
            e = {"index": eps["episode_index"][i], "length": eps["length"][i],
                 "from": eps["dataset_from_index"][i], "to": eps["dataset_to_index"][i], "videos": {}}
            for cam in self.cameras:
                path = self.info["video_path"].format(video_key=cam,
                                                      chunk_index=eps[f"videos/{cam}/chunk_index"][i],
                                                      file_index=eps[f"videos/{cam}/file_index"][i])
                e["videos"][cam] = (os.path.join(self.root, path), eps[f"videos/{cam}/from_timestamp"][i])
            self.episodes.append(e)
        self.num_frames = sum(e["length"] for e in self.episodes)
        # episode position of every global row (rows are the episodes' frames in order)
        self.starts = np.cumsum([0] + [e["length"] for e in self.episodes])

    def locate(self, pos):
        """(episode dict, frame within the episode) of sample position pos."""
        ep = int(np.searchsorted(self.starts, pos, side="right") - 1)
        return self.episodes[ep], int(pos - self.starts[ep])


def load_table(meta, columns=("observation.state", "action", "timestamp", "frame_index", "episode_index",
                              "index", "task_index")):
    """The data rows as numpy arrays (what LeRobot's HF dataset holds)."""
    data_dir = os.path.join(meta.root, "data")
    files = sorted(os.path.join(r, n) for r, _, ns in os.walk(data_dir) for n in ns if n.endswith(".parquet"))
    t = pa.concat_tables([pq.read_table(p) for p in files])
    out = {}
    for c in columns:
        if c not in t.column_names:
            continue
        col = t[c].combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type):
            out[c] = np.asarray(col.flatten().to_numpy(zero_copy_only=False)).reshape(len(col), -1)
        else:
            out[c] = col.to_numpy(zero_copy_only=False)
    return out


def window_rows(meta, pos, deltas_s):
    """LeRobot's window: frame offsets round(delta * fps), clamped to the
    episode, with is_pad where clamped. Returns (episode, [k...], [pad...])."""
    ep, k = meta.locate(pos)
    ks, pads = [], []
    for d in deltas_s:
        j = k + int(round(d * meta.fps))
        pads.append(j < 0 or j >= ep["length"])
        ks.append(min(max(j, 0), ep["length"] - 1))
    return ep, ks, pads


class Meter:
    """Wall, CPU (self + waited-for children) and RSS of a measured run."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.c0 = self._cpu()
        self.first_batch = None
        self.t1 = self.c1 = None
        self.frames_at_first = 0

    @staticmethod
    def _cpu():
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    def batch(self, frames_so_far=0):
        """Call after each batch with the frames taken so far (this batch included)."""
        if self.first_batch is None:
            now = time.monotonic()
            self.first_batch = now - self.t0
            self.t1, self.c1 = now, self._cpu()  # steady state: after the first batch
            self.frames_at_first = frames_so_far

    def deadline(self, seconds):
        """Measurement ends `seconds` after the first batch (a loader that
        fills a buffer first is not cut short by its warm-up)."""
        return (self.t1 if self.t1 is not None else self.t0) + seconds

    def stop(self):
        now, cpu = time.monotonic(), self._cpu()
        self.wall = now - self.t0
        self.cpu = cpu - self.c0
        self.steady_wall = now - self.t1 if self.t1 is not None else None
        self.steady_cpu = cpu - self.c1 if self.c1 is not None else None
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.peak_rss_mb = max(s.ru_maxrss, c.ru_maxrss) / 1024.0


def record(config, peer, mode, settings, meter, batches, samples, frames, decoded=None, extra=None):
    """The peer's JSON document (schema vlafeed-bench-peer/1)."""
    wall, cpu = meter.wall, meter.cpu
    results = {
        "batches": batches, "samples": samples, "frames": frames,
        "wallclock_s": wall, "cpu_s": cpu,
        "frames_per_s_node": frames / wall if wall > 0 else None,
        "frames_per_cpu_s": frames / cpu if cpu > 0 else None,
        "samples_per_s": samples / wall if wall > 0 else None,
        "first_batch_latency_s": meter.first_batch,
        "decoded_per_emitted": (decoded / frames) if decoded is not None and frames else None,
        "peak_rss_mb": meter.peak_rss_mb,
    }
    steady = frames - meter.frames_at_first
    if meter.steady_wall and steady > 0:
        results["steady_state"] = {"after_batches": 1, "frames_per_s_node": steady / meter.steady_wall,
                                   "frames_per_cpu_s": steady / meter.steady_cpu if meter.steady_cpu else None,
                                   "wallclock_s": meter.steady_wall}
    else:
        results["steady_state"] = None
    load = os.getloadavg()
    doc = {"schema": "vlafeed-bench-peer/1", "config": config, "peer": peer,
           "settings": dict(settings, mode=mode), "results": results,
           "machine": {"cores": os.cpu_count(), "loadavg_before": list(load)}}
    if extra:
        doc.update(extra)
    return doc


def write(doc, out_dir):
    if not out_dir:
        return None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, doc["config"] + ".json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    return path
