"""A pure-Python reference of LeRobotDataset.__getitem__ (v3.0 and v2.1).

Written from the format spec (shared/docs/lerobot-format.md §3-§8), not from
LeRobot's code, with pyarrow + PyAV + numpy + torch only. It is the oracle of
the parity suite: vlafeed must return what this returns, key for key, dtype
for dtype, value for value, pixel for pixel.

What it implements:
  * metadata: info.json; v3.0 meta/episodes/*/*.parquet (sorted numerically
    by (chunk, file), rows by position, columns by name, stats/* dropped),
    meta/tasks.parquet (column `task`, else `__index_level_0__`, else the
    pandas index column), meta/stats.json; v2.1 episodes.jsonl, tasks.jsonl,
    episodes_stats.jsonl (aggregated like LeRobot: min of mins, max of maxes,
    count-weighted mean, pooled std, summed count).
  * episode selection: `episodes=[...]` keeps those episodes' rows in file
    (episode) order, whatever order the list is in; positions 0..len-1.
  * delta_timestamps: validated (|d*fps - round(d*fps)|/fps <= tolerance_s,
    else ValueError), converted with round(d*fps), clamped to the episode,
    `<key>_is_pad` for every delta key (video keys too).
  * tabular values stacked (T, *shape); scalars 0-d; floats float32, ints
    int64, bools bool.
  * video by ORDINAL: the episodes stored in a camera file, sorted by
    from_timestamp, start at the cumulative sum of their lengths; frame k of
    episode e is ordinal start(e) + k. This is exact whatever the timestamp
    drift of concatenated MP4s (LeRobot issue #3177). If the lengths do not
    add up to the file's frame count the reference falls back to timestamps
    (first pts >= from - 0.5/fps, then the nearest pts within 0.45/fps).
    Decoding: PyAV, seek to the keyframe at or before the frame, decode
    forward to the exact pts, convert to rgb24 (PyAV's swscale; see
    README-parity.md: byte-identical to the system FFmpeg 5.1 CLI with
    -sws_flags bilinear; `rgb_converter="ffmpeg-cli"` does the YUV->RGB step
    with the system ffmpeg instead), then CHW, float32 = uint8 / 255 (torch
    true division, as LeRobot does) unless image_format="uint8".
  * lerobot_compat=True: LeRobot's own lookup instead of ordinals: query time
    = from_timestamp + the row's float32 timestamp, nearest frame pts, and
    FrameTimestampError when |query - pts| > tolerance_s (default 1e-4).
    On a drifting 30 fps file this fails from the second episode of a file
    on, which is upstream issue #3177.

Returned dict order (lerobot-format.md §7.6): video keys, then the data
columns in info.features order, then `<key>_is_pad` for every delta key in
delta_timestamps order, then `task`. A single-delta video key is squeezed to
(C,H,W); a single-delta vector stays (1,N).

Also here: `read_identity` (the make-sample frame stamp decoder, after
src/video/identity.c), `ffmpeg_cli_frames` (every frame of a file decoded by
the system ffmpeg CLI, by ordinal) and `make_sample_state/action/length`
(the ground-truth functions of include/vlafeed/make_sample.h).
"""
from __future__ import annotations

import bisect
import collections
import json
import math
import os
import re
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch


class FrameTimestampError(ValueError):
    """LeRobot's error when no frame lies within tolerance_s of a query time."""


# ---------------------------------------------------------------------------
# metadata

def _numeric_sorted_parquets(folder: Path) -> list[Path]:
    """*/*.parquet under folder, sorted by the numbers in (chunk, file)."""
    def key(p: Path):
        nums = [int(x) for x in re.findall(r"\d+", str(p.relative_to(folder)))]
        return (nums, str(p))
    return sorted(folder.glob("*/*.parquet"), key=key)


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _column_values(col: pa.ChunkedArray, shape: list[int], dtype: str) -> np.ndarray:
    """A Parquet column as a numpy array (rows, *shape) of the output dtype."""
    col = col.combine_chunks()
    npdtype = _out_dtype(dtype)
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        n = int(np.prod(shape))
        lengths = col.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != n).any():
            raise ValueError(f"column has list lengths {sorted(set(lengths.tolist()))}, info.json shape says {shape}")
        flat = col.flatten().to_numpy(zero_copy_only=False)
        return flat.astype(npdtype).reshape((len(col), *shape))
    arr = col.to_numpy(zero_copy_only=False)
    return arr.astype(npdtype)


def _out_dtype(dtype: str):
    """The dtype LeRobot's torch conversion gives (floats float32, ints int64)."""
    if dtype == "bool":
        return np.bool_
    if dtype.startswith("float"):
        return np.float32
    if dtype.startswith("int") or dtype.startswith("uint"):
        return np.int64
    raise ValueError(f"unsupported feature dtype {dtype!r}")


def aggregate_stats(per_episode: list[dict]) -> dict:
    """LeRobot's aggregation of per-episode stats (min, max, mean, std, count)."""
    out: dict = {}
    keys = []
    for st in per_episode:
        for k in st:
            if k not in keys:
                keys.append(k)
    for feat in keys:
        eps = [st[feat] for st in per_episode if feat in st]
        mins = np.stack([np.asarray(s["min"], dtype=np.float64) for s in eps])
        maxs = np.stack([np.asarray(s["max"], dtype=np.float64) for s in eps])
        means = np.stack([np.asarray(s["mean"], dtype=np.float64) for s in eps])
        stds = np.stack([np.asarray(s["std"], dtype=np.float64) for s in eps])
        counts = np.stack([np.asarray(s["count"], dtype=np.float64) for s in eps])
        total = counts.sum(axis=0)
        w = counts.reshape(counts.shape + (1,) * (means.ndim - counts.ndim))
        mean = (means * w).sum(axis=0) / total.reshape(total.shape + (1,) * (means.ndim - 1 - total.ndim))
        var = ((stds ** 2 + (means - mean) ** 2) * w).sum(axis=0) / total.reshape(
            total.shape + (1,) * (means.ndim - 1 - total.ndim))
        out[feat] = {"min": mins.min(axis=0), "max": maxs.max(axis=0), "mean": mean,
                     "std": np.sqrt(var), "count": total.astype(np.int64)}
    return out


class ReferenceMeta:
    """Dataset metadata: info, episodes table, tasks, stats (v3.0 or v2.1)."""

    def __init__(self, root):
        self.root = Path(root)
        with open(self.root / "meta" / "info.json", encoding="utf-8") as f:
            self.info = json.load(f)
        self.version = str(self.info.get("codebase_version", ""))
        self.fps = self.info["fps"]
        self.features = self.info["features"]
        self.camera_keys = [k for k, v in self.features.items() if v["dtype"] == "video"]
        self.total_frames = int(self.info["total_frames"])
        self.total_episodes = int(self.info["total_episodes"])
        if self.version.startswith("v3"):
            self._load_v3()
        elif self.version.startswith("v2"):
            self._load_v21()
        else:
            raise ValueError(f"{self.root}: unsupported codebase_version {self.version!r}")
        # episode index -> row; checks §3.3's invariants
        self.by_index = {int(ep["episode_index"]): ep for ep in self.episodes}
        for pos, ep in enumerate(self.episodes):
            if int(ep["episode_index"]) != pos:
                raise ValueError(f"{self.root}: episodes row {pos} holds episode {ep['episode_index']}")
            if ep["dataset_to_index"] - ep["dataset_from_index"] != ep["length"]:
                raise ValueError(f"{self.root}: episode {pos}: to - from != length")

    # v3.0 -------------------------------------------------------------------
    def _load_v3(self):
        files = _numeric_sorted_parquets(self.root / "meta" / "episodes")
        if not files:
            raise FileNotFoundError(f"{self.root}/meta/episodes: no parquet files")
        tables = [pq.read_table(p) for p in files]
        wanted = ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                  "dataset_from_index", "dataset_to_index"]
        for k in self.camera_keys:
            wanted += [f"videos/{k}/{c}" for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        self.episodes = []
        for t in tables:
            cols = {name: t.column(name).to_pylist() for name in wanted if name in t.column_names}
            missing = [w for w in wanted if w not in cols]
            if missing:
                raise ValueError(f"{self.root}: episodes metadata lacks columns {missing}")
            for r in range(t.num_rows):
                self.episodes.append({name: cols[name][r] for name in wanted})
        tasks_table = pq.read_table(self.root / "meta" / "tasks.parquet")
        name = None
        for cand in ("task", "__index_level_0__"):
            if cand in tasks_table.column_names:
                name = cand
                break
        if name is None:
            md = tasks_table.schema.metadata or {}
            if b"pandas" in md:
                idx = json.loads(md[b"pandas"])["index_columns"]
                if len(idx) == 1 and isinstance(idx[0], str):
                    name = idx[0]
        if name is None:
            raise ValueError(f"{self.root}/meta/tasks.parquet: no task string column")
        self.tasks = tasks_table.column(name).to_pylist()
        ti = tasks_table.column("task_index").to_pylist()
        if ti != list(range(len(ti))):
            raise ValueError(f"{self.root}/meta/tasks.parquet: task_index is not the row position")
        stats_path = self.root / "meta" / "stats.json"
        if stats_path.exists():
            with open(stats_path, encoding="utf-8") as f:
                raw = json.load(f)
            self.stats = {feat: {k: np.atleast_1d(np.asarray(v)) for k, v in d.items()} for feat, d in raw.items()}
        else:
            self.stats = None

    def data_file(self, ep: dict) -> Path:
        if self.version.startswith("v3"):
            rel = self.info["data_path"].format(chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"])
        else:
            e = int(ep["episode_index"])
            rel = self.info["data_path"].format(episode_chunk=e // self.info["chunks_size"], episode_index=e)
        return self.root / rel

    def video_file(self, ep: dict, key: str) -> Path:
        if self.version.startswith("v3"):
            rel = self.info["video_path"].format(video_key=key, chunk_index=ep[f"videos/{key}/chunk_index"],
                                                 file_index=ep[f"videos/{key}/file_index"])
        else:
            e = int(ep["episode_index"])
            rel = self.info["video_path"].format(video_key=key, episode_chunk=e // self.info["chunks_size"],
                                                 episode_index=e)
        return self.root / rel

    def video_from_timestamp(self, ep: dict, key: str) -> float:
        return float(ep[f"videos/{key}/from_timestamp"]) if self.version.startswith("v3") else 0.0

    def episodes_in_video_file(self, path: Path, key: str) -> list[dict]:
        """Every episode whose `key` frames are stored in path, by from_timestamp."""
        eps = [ep for ep in self.episodes if self.video_file(ep, key) == path]
        return sorted(eps, key=lambda ep: (self.video_from_timestamp(ep, key), ep["episode_index"]))

    # v2.1 -------------------------------------------------------------------
    def _load_v21(self):
        rows = _read_jsonl(self.root / "meta" / "episodes.jsonl")
        rows.sort(key=lambda r: r["episode_index"])
        self.episodes = []
        start = 0
        for r in rows:
            n = int(r["length"])
            self.episodes.append({"episode_index": int(r["episode_index"]), "tasks": r.get("tasks"), "length": n,
                                  "dataset_from_index": start, "dataset_to_index": start + n})
            start += n
        tasks = _read_jsonl(self.root / "meta" / "tasks.jsonl")
        tasks.sort(key=lambda r: r["task_index"])
        if [t["task_index"] for t in tasks] != list(range(len(tasks))):
            raise ValueError(f"{self.root}/meta/tasks.jsonl: task_index values are not 0..n-1")
        self.tasks = [t["task"] for t in tasks]
        stats_path = self.root / "meta" / "episodes_stats.jsonl"
        if stats_path.exists():
            self.stats = aggregate_stats([r["stats"] for r in _read_jsonl(stats_path)])
        else:
            self.stats = None


# ---------------------------------------------------------------------------
# video: frame index, ordinal mapping, decoding

class VideoFile:
    """One MP4 stream: frame pts in presentation order, keyframes, decoding."""

    def __init__(self, path: Path, rgb_converter: str = "pyav", cache_frames: int = 96):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: video file missing")
        self.rgb_converter = rgb_converter
        with av.open(str(self.path)) as c:
            s = c.streams.video[0]
            self.time_base = Fraction(s.time_base.numerator, s.time_base.denominator)
            self.width, self.height = s.codec_context.width, s.codec_context.height
            pk = [(p.pts, bool(p.is_keyframe)) for p in c.demux(s) if p.pts is not None and p.size > 0]
        pk.sort()
        self.pts = [p for p, _ in pk]
        self.keyframes = [i for i, (_, k) in enumerate(pk) if k]
        self.seconds = [float(p * self.time_base) for p in self.pts]
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cache_frames = cache_frames

    def __len__(self):
        return len(self.pts)

    def nearest(self, t: float) -> int:
        """Ordinal of the frame whose pts is nearest to t seconds (ties: earlier)."""
        i = bisect.bisect_left(self.seconds, t)
        cands = [j for j in (i - 1, i) if 0 <= j < len(self.seconds)]
        return min(cands, key=lambda j: (abs(self.seconds[j] - t), j))

    def frames_rgb(self, ordinals) -> list[np.ndarray]:
        """uint8 HWC rgb24 frames for the given ordinals (any order, repeats ok)."""
        ordinals = [int(o) for o in ordinals]
        for o in ordinals:
            if not 0 <= o < len(self.pts):
                raise IndexError(f"{self.path}: frame ordinal {o} outside [0, {len(self.pts)})")
        todo = sorted(set(ordinals) - set(self._cache))
        got = self._decode(todo) if todo else {}
        out = []
        for o in ordinals:
            if o in got:
                out.append(got[o])
            else:
                self._cache.move_to_end(o)
                out.append(self._cache[o])
        return out

    def preload(self):
        """Decodes the whole file once, in order, and keeps every frame (for
        small test files that are read many times in random order)."""
        self._cache_frames = max(self._cache_frames, len(self.pts))
        self._decode(list(range(len(self.pts))))

    def _keyframe_before(self, o: int) -> int:
        k = bisect.bisect_right(self.keyframes, o) - 1
        if k < 0:
            raise ValueError(f"{self.path}: no keyframe at or before frame {o}")
        return self.keyframes[k]

    def _decode(self, targets: list[int]) -> dict:
        """Decodes sorted target ordinals: seek to the keyframe at or before a
        target, decode forward to its exact pts, and keep going forward to the
        next target while that is no further than seeking again."""
        frames = {}
        want_pts = {self.pts[o]: o for o in targets}
        with av.open(str(self.path)) as c:
            s = c.streams.video[0]
            s.thread_type = "NONE"
            i = 0
            while i < len(targets):
                kf = self._keyframe_before(targets[i])
                c.seek(self.pts[kf], stream=s, backward=True, any_frame=False)
                last = None
                for f in c.decode(s):
                    if f.pts is None or f.pts < self.pts[kf]:
                        continue
                    o = want_pts.get(f.pts)
                    if o is not None and o not in frames:
                        frames[o] = f
                    while i < len(targets) and targets[i] in frames:
                        i += 1
                    last = bisect.bisect_left(self.pts, f.pts)
                    if i >= len(targets) or self._keyframe_before(targets[i]) > last + 1:
                        break
                else:
                    if i < len(targets):
                        raise ValueError(f"{self.path}: decoding ended before frame {targets[i]} (last {last})")
        order = sorted(frames)
        rgbs = self._to_rgb([frames[o] for o in order])
        out = dict(zip(order, rgbs))
        for o, rgb in out.items():
            self._cache[o] = rgb
            self._cache.move_to_end(o)
        while len(self._cache) > self._cache_frames:
            self._cache.popitem(last=False)
        return out

    def _to_rgb(self, frames) -> list[np.ndarray]:
        if self.rgb_converter == "pyav":
            return [f.to_ndarray(format="rgb24") for f in frames]
        if self.rgb_converter == "ffmpeg-cli":
            return yuv_to_rgb_ffmpeg_cli(frames)
        raise ValueError(f"unknown rgb_converter {self.rgb_converter!r}")


def yuv_to_rgb_ffmpeg_cli(frames, sws_flags: str = "bilinear") -> list[np.ndarray]:
    """YUV->RGB24 by the system ffmpeg CLI (swscale of FFmpeg 5.1, as vlafeed
    links): the decoded yuv420p planes (bit-exact across decoders) are piped
    in as rawvideo and converted with -sws_flags bilinear."""
    if not frames:
        return []
    f0 = frames[0]
    if f0.format.name != "yuv420p":
        raise ValueError(f"ffmpeg-cli converter handles yuv420p, got {f0.format.name}")
    w, h = f0.width, f0.height
    rng = "pc" if int(f0.color_range) == 2 else "tv"
    raw = b"".join(f.to_ndarray(format="yuv420p").tobytes() for f in frames)
    cmd = ["ffmpeg", "-v", "error", "-f", "rawvideo", "-pix_fmt", "yuv420p", "-color_range", rng, "-s", f"{w}x{h}",
           "-i", "-", "-sws_flags", sws_flags, "-pix_fmt", "rgb24", "-f", "rawvideo", "-"]
    out = subprocess.run(cmd, input=raw, capture_output=True, check=True).stdout
    a = np.frombuffer(out, np.uint8).reshape(len(frames), h, w, 3)
    return [a[i].copy() for i in range(len(frames))]


def ffmpeg_cli_frames(path, sws_flags: str = "bilinear", max_frames: int | None = None) -> np.ndarray:
    """Every frame of a video decoded and converted by the system ffmpeg CLI,
    uint8 (N, H, W, 3), indexed by ordinal (no frame dropped or duplicated)."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        w, h = s.codec_context.width, s.codec_context.height
    cmd = ["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:v:0", "-fps_mode", "passthrough",
           "-sws_flags", sws_flags, "-pix_fmt", "rgb24"]
    if max_frames:
        cmd += ["-frames:v", str(max_frames)]
    out = subprocess.run(cmd + ["-f", "rawvideo", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(out, np.uint8).reshape(-1, h, w, 3)


class CameraMap:
    """Ordinal mapping of the episodes stored in one camera file."""

    def __init__(self, meta: ReferenceMeta, key: str, path: Path, video: VideoFile):
        self.eps = meta.episodes_in_video_file(path, key)
        fps = float(meta.fps)
        total = sum(int(ep["length"]) for ep in self.eps)
        self.start: dict[int, int] = {}
        self.frame_ordinals: dict[int, list[int]] = {}
        self.drift_ms: dict[int, float] = {}
        if total == len(video):
            self.method = "ordinal"
            o = 0
            for ep in self.eps:
                e = int(ep["episode_index"])
                self.start[e] = o
                self.drift_ms[e] = (video.seconds[o] - meta.video_from_timestamp(ep, key)) * 1000.0
                o += int(ep["length"])
        else:
            # Fallback (§3.4 step 3): frames were dropped or the file was edited.
            self.method = "timestamp"
            tol = 0.45 / fps
            for ep in self.eps:
                e = int(ep["episode_index"])
                frm = meta.video_from_timestamp(ep, key)
                first = bisect.bisect_left(video.seconds, frm - 0.5 / fps)
                ords = []
                for k in range(int(ep["length"])):
                    t = video.seconds[first] + k / fps if first < len(video) else frm + k / fps
                    j = video.nearest(t)
                    ords.append(j if abs(video.seconds[j] - t) <= tol else -1)
                self.frame_ordinals[e] = ords
                self.drift_ms[e] = ((video.seconds[first] - frm) * 1000.0) if first < len(video) else math.nan

    def ordinal(self, episode: int, k: int) -> int:
        if self.method == "ordinal":
            return self.start[episode] + k
        o = self.frame_ordinals[episode][k]
        if o < 0:
            raise ValueError(f"episode {episode} frame {k}: no frame in the video within tolerance")
        return o


# ---------------------------------------------------------------------------
# the dataset

class ReferenceDataset:
    """LeRobotDataset.__getitem__ semantics; see the module docstring."""

    def __init__(self, root, episodes=None, delta_timestamps=None, image_format: str = "float32",
                 tolerance_s: float = 1e-4, lerobot_compat: bool = False, rgb_converter: str = "pyav"):
        if image_format not in ("float32", "uint8"):
            raise ValueError(f"image_format must be 'float32' or 'uint8', got {image_format!r}")
        self.root = Path(root)
        self.meta = ReferenceMeta(self.root)
        self.image_format = image_format
        self.tolerance_s = tolerance_s
        self.lerobot_compat = lerobot_compat
        self.rgb_converter = rgb_converter
        fps = self.meta.fps
        if episodes is None:
            sel = [int(ep["episode_index"]) for ep in self.meta.episodes]
        else:
            sel = sorted({int(e) for e in episodes})
            for e in sel:
                if e not in self.meta.by_index:
                    raise IndexError(f"episode {e} not in the dataset (0..{len(self.meta.episodes) - 1})")
        self.episodes = sel
        # delta_timestamps -> delta indices
        self.delta_timestamps = dict(delta_timestamps) if delta_timestamps else None
        self.delta_indices = None
        if self.delta_timestamps:
            bad = {}
            for key, deltas in self.delta_timestamps.items():
                if key not in self.meta.features:
                    raise KeyError(f"delta_timestamps key {key!r} is not a feature")
                off = [d for d in deltas if abs(d * fps - round(d * fps)) / fps > tolerance_s]
                if off:
                    bad[key] = off
            if bad:
                raise ValueError(f"delta_timestamps not multiples of 1/fps within tolerance_s={tolerance_s}: {bad}")
            self.delta_indices = {k: [round(d * fps) for d in v] for k, v in self.delta_timestamps.items()}
        self._load_tables()
        self._videos: dict[Path, VideoFile] = {}
        self._maps: dict[tuple[str, Path], CameraMap] = {}

    # tables ---------------------------------------------------------------
    def _load_tables(self):
        feats = self.meta.features
        self.data_keys = [k for k, v in feats.items() if v["dtype"] not in ("video", "image", "string", "language")]
        per_file: dict[Path, dict] = {}
        chunks = {k: [] for k in self.data_keys}
        self.ep_from = []   # positions
        self.ep_to = []
        self.ep_global_from = []
        pos = 0
        for e in self.episodes:
            ep = self.meta.by_index[e]
            path = self.meta.data_file(ep)
            if path not in per_file:
                t = pq.read_table(path)
                missing = [k for k in self.data_keys if k not in t.column_names]
                if missing:
                    raise ValueError(f"{path}: missing data columns {missing}")
                per_file[path] = {k: _column_values(t.column(k), feats[k]["shape"] if feats[k]["shape"] != [1] else [],
                                                    feats[k]["dtype"]) for k in self.data_keys}
            cols = per_file[path]
            rows = np.nonzero(cols["episode_index"] == e)[0]
            n = int(ep["length"])
            if len(rows) != n or (len(rows) and rows[-1] - rows[0] + 1 != n):
                raise ValueError(f"{path}: episode {e} has {len(rows)} rows (contiguous: "
                                 f"{len(rows) and rows[-1] - rows[0] + 1 == len(rows)}), metadata says {n}")
            sl = slice(int(rows[0]), int(rows[0]) + n)
            idx = cols["index"][sl]
            if not np.array_equal(idx, np.arange(ep["dataset_from_index"], ep["dataset_to_index"])):
                raise ValueError(f"{path}: episode {e}: index column is not dataset_from_index..to")
            if not np.array_equal(cols["frame_index"][sl], np.arange(n)):
                raise ValueError(f"{path}: episode {e}: frame_index is not 0..length-1")
            for k in self.data_keys:
                chunks[k].append(cols[k][sl])
            self.ep_from.append(pos)
            self.ep_to.append(pos + n)
            self.ep_global_from.append(int(ep["dataset_from_index"]))
            pos += n
        self.columns = {k: (np.concatenate(v) if v else np.zeros((0,), _out_dtype(feats[k]["dtype"])))
                        for k, v in chunks.items()}
        self.length = pos
        self.pos_episode = np.repeat(np.arange(len(self.episodes)), [b - a for a, b in zip(self.ep_from, self.ep_to)])
        self.index_to_position = {int(g): p for p, g in enumerate(self.columns["index"])}

    def __len__(self):
        return self.length

    @property
    def fps(self):
        return self.meta.fps

    def position_of_index(self, global_index: int) -> int:
        """Position of the row whose `index` column equals global_index."""
        return self.index_to_position[int(global_index)]

    # video ------------------------------------------------------------------
    def video(self, path: Path) -> VideoFile:
        v = self._videos.get(path)
        if v is None:
            v = self._videos[path] = VideoFile(path, self.rgb_converter)
        return v

    def preload_videos(self):
        """Decodes every camera file of the selected episodes once and keeps
        all frames in memory (small datasets read many times in random order)."""
        for e in self.episodes:
            for key in self.meta.camera_keys:
                v = self.video(self.meta.video_file(self.meta.by_index[e], key))
                if len(v._cache) < len(v):
                    v.preload()
        return self

    def camera_map(self, key: str, path: Path) -> CameraMap:
        m = self._maps.get((key, path))
        if m is None:
            m = self._maps[(key, path)] = CameraMap(self.meta, key, path, self.video(path))
        return m

    def frame_ordinals(self, key: str, episode: int, ks) -> tuple[Path, list[int]]:
        """(file, ordinals) of frames ks of an episode for camera key."""
        ep = self.meta.by_index[episode]
        path = self.meta.video_file(ep, key)
        m = self.camera_map(key, path)
        return path, [m.ordinal(episode, int(k)) for k in ks]

    def frames_uint8_hwc(self, key: str, episode: int, ks) -> np.ndarray:
        path, ords = self.frame_ordinals(key, episode, ks)
        return np.stack(self.video(path).frames_rgb(ords))

    def _compat_ordinals(self, key: str, episode: int, timestamps) -> tuple[Path, list[int]]:
        """LeRobot's lookup: from_timestamp + stored timestamp, nearest pts,
        FrameTimestampError beyond tolerance_s."""
        ep = self.meta.by_index[episode]
        path = self.meta.video_file(ep, key)
        v = self.video(path)
        frm = self.meta.video_from_timestamp(ep, key)
        ords = []
        for ts in timestamps:
            q = frm + float(ts)
            j = v.nearest(q)
            diff = abs(v.seconds[j] - q)
            if diff > self.tolerance_s:
                raise FrameTimestampError(
                    f"{path}: episode {episode}: query {q:.6f}s is {diff * 1000:.3f} ms from the nearest frame "
                    f"(pts {v.seconds[j]:.6f}s) > tolerance_s={self.tolerance_s} (LeRobot issue #3177)")
            ords.append(j)
        return path, ords

    # items ------------------------------------------------------------------
    def query_positions(self, pos: int) -> tuple[dict, dict]:
        """{key: clamped positions} and {key: is_pad} for the delta keys."""
        ei = int(self.pos_episode[pos])
        s, t = self.ep_from[ei], self.ep_to[ei]
        q, pad = {}, {}
        for key, d in (self.delta_indices or {}).items():
            q[key] = [min(max(pos + x, s), t - 1) for x in d]
            pad[key] = [(pos + x < s) or (pos + x >= t) for x in d]
        return q, pad

    def __getitem__(self, pos: int) -> dict:
        pos = int(pos)
        if pos < 0:
            pos += self.length
        if not 0 <= pos < self.length:
            raise IndexError(f"position {pos} outside [0, {self.length})")
        ei = int(self.pos_episode[pos])
        episode = self.episodes[ei]
        q, pad = self.query_positions(pos)
        item: dict = {}
        for key in self.meta.camera_keys:
            positions = q.get(key, [pos])
            ks = [p - self.ep_from[ei] for p in positions]
            if self.lerobot_compat:
                path, ords = self._compat_ordinals(key, episode, [self.columns["timestamp"][p] for p in positions])
                frames = np.stack(self.video(path).frames_rgb(ords))
            else:
                frames = self.frames_uint8_hwc(key, episode, ks)
            x = torch.from_numpy(np.ascontiguousarray(frames.transpose(0, 3, 1, 2)))
            if self.image_format == "float32":
                x = x.type(torch.float32) / 255
            item[key] = x.squeeze(0)
        for key in self.data_keys:
            col = self.columns[key]
            if key in q:
                item[key] = torch.from_numpy(np.ascontiguousarray(col[q[key]]))
            else:
                item[key] = torch.from_numpy(np.array(col[pos]))  # 0-d for scalars
        for key in (self.delta_indices or {}):
            item[f"{key}_is_pad"] = torch.tensor(pad[key], dtype=torch.bool)
        item["task"] = self.meta.tasks[int(self.columns["task_index"][pos])]
        return item


def collate(items: list[dict]) -> dict:
    """Stacks reference items into a batch dict like vlafeed.Loader's."""
    out = {}
    for k in items[0]:
        if isinstance(items[0][k], str):
            out[k] = [it[k] for it in items]
        else:
            out[k] = torch.stack([it[k] for it in items])
    return out


class ReferenceLoader:
    """A simple batch iterator over the reference with vlafeed.Loader's batch
    shape (dicts of [B, ...] tensors plus "task" list[str]), sharded by rank:
    each epoch a seeded permutation, rank r takes every world_size-th sample.
    For developing the training example before vlafeed.Loader exists; not a
    model of vlafeed's order."""

    def __init__(self, dataset: ReferenceDataset, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 drop_last: bool = True):
        self.ds, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.epoch = 0

    def set_epoch(self, e: int):
        self.epoch = e

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
        order = torch.randperm(len(self.ds), generator=g).tolist()[self.rank::self.world_size]
        for i in range(0, len(order), self.batch_size):
            chunk = order[i:i + self.batch_size]
            if len(chunk) < self.batch_size and self.drop_last:
                break
            yield collate([self.ds[p] for p in chunk])

    def stats(self) -> dict:
        return {}


# ---------------------------------------------------------------------------
# make-sample ground truth and identity stamps

def _splitmix64(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def make_sample_length(episode: int, seed: int = 0, min_length: int = 40, max_length: int = 100) -> int:
    """length(e) = min + splitmix64(seed*1000003 + e) % (max-min+1), per make_sample.h."""
    return min_length + _splitmix64((seed * 1000003 + episode) & ((1 << 64) - 1)) % (max_length - min_length + 1)


def make_sample_state(episode: int, frame: int, dim: int) -> np.float32:
    """observation.state[dim] = sin(0.05*k + 0.3*d + e) (float32), per make_sample.h."""
    return np.float32(math.sin(0.05 * frame + 0.3 * dim + episode))


def make_sample_action(episode: int, frame: int, dim: int) -> np.float32:
    """action[dim] = the next state."""
    return np.float32(math.sin(0.05 * (frame + 1) + 0.3 * dim + episode))


_ID_WHITENING = bytes([0xA5, 0x3C, 0x96, 0x5A, 0xC3, 0x69, 0x0F, 0x5A, 0xA5])


def _crc16_ccitt(data: bytes) -> int:
    crc = 0xFFFF
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


class IdentityError(ValueError):
    """The frame carries no readable identity stamp."""


def read_identity(rgb_hwc: np.ndarray) -> tuple[int, int, int]:
    """(episode, frame, camera) of a make-sample frame (uint8 HWC, full frame).

    The stamp (src/video/identity.c) is a 9x8 grid of black/white cells over
    the top half of frames at least 128 px high (the whole frame below that),
    read from each cell's central half; 72 bits = episode(24) frame(24)
    camera(8) CRC-16/CCITT(16), XORed with a fixed whitening pattern."""
    img = np.asarray(rgb_hwc)
    if img.dtype != np.uint8:
        img = np.clip(np.rint(img.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    if img.ndim == 3 and img.shape[0] == 3 and img.shape[2] != 3:
        img = img.transpose(1, 2, 0)
    h_full, w = img.shape[:2]
    h = h_full // 2 if h_full >= 128 else h_full
    bits = bytearray(9)
    for cell in range(72):
        col, row = cell % 9, cell // 9
        x0, x1 = col * w // 9, (col + 1) * w // 9
        y0, y1 = row * h // 8, (row + 1) * h // 8
        ix, iy = (x1 - x0) // 4, (y1 - y0) // 4
        block = img[y0 + iy:y1 - iy, x0 + ix:x1 - ix, :].astype(np.uint64)
        mean = int(block.sum() // block.size) if block.size else 128
        if 80 < mean < 176:
            raise IdentityError(f"identity stamp: block {cell} (row {row}, column {col}) is ambiguous (mean {mean})")
        if mean >= 176:
            bits[cell // 8] |= 1 << (7 - cell % 8)
    b = bytes(x ^ y for x, y in zip(bits, _ID_WHITENING))
    crc = _crc16_ccitt(b[:7])
    if b[7] != crc >> 8 or b[8] != crc & 0xFF:
        raise IdentityError("identity stamp: checksum mismatch")
    return (b[0] << 16 | b[1] << 8 | b[2], b[3] << 16 | b[4] << 8 | b[5], b[6])


def make_sample_dataset(cli: str, out, **options) -> Path:
    """Runs `vlafeed make-sample OUT --key value ...` once; an existing
    complete dataset at out is reused (the parity and reference suites share
    their datasets within a pytest session)."""
    out = Path(out)
    if (out / "meta" / "info.json").exists():
        return out
    if out.exists():
        import shutil
        shutil.rmtree(out)
    cmd = [cli, "make-sample", str(out), "--quiet"]
    for k, v in options.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


# The datasets the parity suites share (vlafeed make-sample options).
SAMPLE_SPECS = {
    # 160x128 keeps the stamp readable (>= 128 px high: top half) and the
    # files small; 0.25 MB per MP4 gives 3-4 episodes per file and several
    # files per camera, so drift and rollover are both present.
    "av1": dict(codec="av1", episodes=7, cameras=2, size="160x128", max_video_mb=0.25, min_length=25,
                max_length=50, seed=3),
    "h264": dict(codec="h264", episodes=7, cameras=2, size="160x128", max_video_mb=0.09, min_length=25,
                 max_length=50, seed=4),
    # A long GOP with B-frames: decode order != presentation order.
    "h264-gop12": dict(codec="h264", episodes=3, cameras=1, size="160x128", gop=12, min_length=30, max_length=45,
                       seed=5),
}


def sample_dataset(tmp_path_factory, cli: str, name: str) -> Path:
    """The make-sample dataset `name` of SAMPLE_SPECS, written once per pytest
    session (under the session's base temp dir) and shared by the suites."""
    base = tmp_path_factory.getbasetemp() / "vf-samples"
    base.mkdir(exist_ok=True)
    return make_sample_dataset(cli, base / name, **SAMPLE_SPECS[name])


def find_cli(root: Path | None = None) -> str | None:
    """The vlafeed command: $VF_CLI, <repo>/build/vlafeed, or None."""
    import shutil
    here = Path(__file__).resolve().parents[2]
    for cand in (os.environ.get("VF_CLI"), str((root or here) / "build" / "vlafeed"), shutil.which("vlafeed")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


# ---------------------------------------------------------------------------
# comparison helpers for the parity suites

def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype}"
    return f"{type(value).__name__} {value!r:.80}"


def item_differences(want: dict, got: dict, exact_key_order: bool = True) -> list[str]:
    """Every difference between two item dicts: key sets and order, types,
    shapes, dtypes, values (exact: tensors with torch.equal, strings ==).
    Empty when equal."""
    diffs = []
    if exact_key_order and list(want) != list(got):
        diffs.append(f"keys differ:\n  want {list(want)}\n  got  {list(got)}")
    elif set(want) != set(got):
        diffs.append(f"key sets differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
    for k in want:
        if k not in got:
            continue
        a, b = want[k], got[k]
        if isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor):
                diffs.append(f"{k}: want {describe(a)}, got {describe(b)}")
            elif a.dtype != b.dtype or a.shape != b.shape:
                diffs.append(f"{k}: want {describe(a)}, got {describe(b)}")
            elif not torch.equal(a, b):
                if a.dtype in (torch.float32, torch.float64, torch.uint8) and a.ndim >= 3:
                    d = (a.double() - b.double()).abs()
                    scale = 255.0 if a.dtype != torch.uint8 else 1.0
                    diffs.append(f"{k}: pixels differ at {int((d > 0).sum())}/{d.numel()} values, "
                                 f"max |diff| {float(d.max()) * scale:.3f}/255")
                else:
                    diffs.append(f"{k}: values differ:\n  want {a.tolist()}\n  got  {b.tolist()}")
        elif a != b:
            diffs.append(f"{k}: want {a!r}, got {b!r}")
    return diffs
