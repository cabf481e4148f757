"""LeRobot 0.6's recording API on vlafeed's LeRobotDataset and LeRobotDatasetMetadata.

    ds = vlafeed.LeRobotDataset.create("me/pick", fps=30, features=FEATURES, root="/data/pick")
    for frame in episode:                   # {"observation.images.front": uint8 [H,W,3], ..., "task": "pick"}
        ds.add_frame(frame)
    ds.save_episode()                        # encodes the cameras, writes Parquet rows, metadata, stats
    ds.finalize()                            # flushes the episodes table; ds[i] reads it back

What lands on disk is LeRobot v3.0 as LeRobot 0.6.1's DatasetWriter lays it
out (lerobot-format.md §1-§6): one data Parquet per (chunk, file) with one
row group per episode, each camera's episodes concatenated into one MP4 per
(chunk, file) with from/to timestamps, meta/episodes with the per-episode
stats columns, meta/tasks.parquet (pandas index "task"), info.json and the
aggregated stats.json, with the same size-based rollover rules. It is written
with vlafeed's own parts: the C Parquet writer (_native.parquet_write), the C
video encoder (_native.video_encode: libsvtav1 by default like LeRobot, with
CAP_SYS_NICE dropped while SVT-AV1 starts its threads, or libx264/libx265),
packet-remux concatenation (_native.video_concat(exact=True)) and FFmpeg's
PNG encoder for image features (_native.image_write).

Differences from upstream, on purpose:
  * camera frames wait for save_episode in a raw spill file per camera
    (images/<key>/episode-NNNNNN/frames.rgb) instead of one PNG per frame, so
    nothing is compressed twice; image (non-video) features are still stored
    as PNG bytes in the data Parquet, as LeRobot stores them;
  * the current episodes file is rewritten whole at each flush (every
    metadata_buffer_size episodes and at finalize) rather than appended to;
    data files are written as LeRobot writes them, a row group per episode
    through a writer kept open, complete at rollover or finalize();
  * concatenation places each episode at the summed stream durations, as
    LeRobot 0.6 does with a current FFmpeg (no timestamp drift);
  * streaming_encoding=True is accepted but encodes at save_episode;
    image_writer_processes become threads;
  * depth cameras, language columns, multi-dimensional (Array2D+) features,
    encoder extra_options and Hub uploads are refused with an error naming
    them.

Statistics are LeRobot 0.6.1's compute_stats algorithm, ported here
(RunningQuantileStats histograms with 5000 bins, q01/q10/q50/q90/q99,
sampled camera frames, count-weighted aggregation), so stats.json and the
stats/* episode columns carry the values LeRobot computes for the same frames.
"""
import concurrent.futures
import contextlib
import copy
import json
import logging
import os
import pathlib
import shutil
import tempfile

import numpy as np

from vlafeed import _native
from vlafeed.data import lerobot_compat as compat
from vlafeed.data.lerobot_compat import (
    CODEBASE_VERSION,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_DATA_PATH,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_PATH,
)

logger = logging.getLogger(__name__)

DEFAULT_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_IMAGE_PATH = "images/{image_key}/episode-{episode_index:06d}/frame-{frame_index:06d}.png"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": (1,), "names": None},
    "frame_index": {"dtype": "int64", "shape": (1,), "names": None},
    "episode_index": {"dtype": "int64", "shape": (1,), "names": None},
    "index": {"dtype": "int64", "shape": (1,), "names": None},
    "task_index": {"dtype": "int64", "shape": (1,), "names": None},
}
DEFAULT_QUANTILES = [0.01, 0.10, 0.50, 0.90, 0.99]
_PARQUET_SCALARS = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                    "float32", "float64"}


def _refuse(name, why):
    raise NotImplementedError(f"vlafeed's recorder does not support {name}: {why}")


# ---------------------------------------------------------------------------
# stats: LeRobot 0.6.1's compute_stats, ported (numpy only)

class RunningQuantileStats:
    """Mean, second moment, min, max and 5000-bin histograms per vector component
    (LeRobot's RunningQuantileStats)."""

    def __init__(self, quantile_list=None, num_quantile_bins=5000):
        self._count = 0
        self._mean = self._mean_of_squares = self._min = self._max = None
        self._histograms = self._bin_edges = None
        self._num_quantile_bins = num_quantile_bins
        self._quantile_list = DEFAULT_QUANTILES if quantile_list is None else quantile_list
        self._quantile_keys = [f"q{int(q * 100):02d}" for q in self._quantile_list]

    def update(self, batch):
        batch = batch.reshape(-1, batch.shape[-1])
        batch = batch.astype(np.result_type(batch.dtype, np.float32), copy=False)
        num_elements, vector_length = batch.shape
        if self._count == 0:
            self._mean = np.mean(batch, axis=0)
            self._mean_of_squares = np.mean(batch**2, axis=0)
            self._min = np.min(batch, axis=0)
            self._max = np.max(batch, axis=0)
            self._histograms = [np.zeros(self._num_quantile_bins) for _ in range(vector_length)]
            self._bin_edges = [np.linspace(self._min[i] - 1e-10, self._max[i] + 1e-10, self._num_quantile_bins + 1)
                               for i in range(vector_length)]
        else:
            if vector_length != self._mean.size:
                raise ValueError("The length of new vectors does not match the initialized vector length.")
            new_max, new_min = np.max(batch, axis=0), np.min(batch, axis=0)
            changed = np.any(new_max > self._max) or np.any(new_min < self._min)
            self._max = np.maximum(self._max, new_max)
            self._min = np.minimum(self._min, new_min)
            if changed:
                self._adjust_histograms()
        self._count += num_elements
        self._mean += (np.mean(batch, axis=0) - self._mean) * (num_elements / self._count)
        self._mean_of_squares += (np.mean(batch**2, axis=0) - self._mean_of_squares) * (num_elements / self._count)
        for i in range(batch.shape[1]):
            hist, _ = np.histogram(batch[:, i], bins=self._bin_edges[i])
            self._histograms[i] += hist

    def get_statistics(self):
        if self._count < 2:
            raise ValueError("Cannot compute statistics for less than 2 vectors.")
        stats = {"min": self._min.copy(), "max": self._max.copy(), "mean": self._mean.copy(),
                 "std": np.sqrt(np.maximum(0, self._mean_of_squares - self._mean**2)),
                 "count": np.array([self._count])}
        for q, key in zip(self._quantile_list, self._quantile_keys):
            stats[key] = np.array([self._quantile(h, e, q * self._count)
                                   for h, e in zip(self._histograms, self._bin_edges)])
        return stats

    def _adjust_histograms(self):
        for i in range(len(self._histograms)):
            old_edges, old_hist = self._bin_edges[i], self._histograms[i]
            padding = (self._max[i] - self._min[i]) * 1e-10
            new_edges = np.linspace(self._min[i] - padding, self._max[i] + padding, self._num_quantile_bins + 1)
            old_centers = (old_edges[:-1] + old_edges[1:]) / 2
            new_hist = np.zeros(self._num_quantile_bins)
            for center, count in zip(old_centers, old_hist):
                if count > 0:
                    b = max(0, min(np.searchsorted(new_edges, center) - 1, self._num_quantile_bins - 1))
                    new_hist[b] += count
            self._histograms[i], self._bin_edges[i] = new_hist, new_edges

    @staticmethod
    def _quantile(hist, edges, target_count):
        cumsum = np.cumsum(hist)
        idx = np.searchsorted(cumsum, target_count)
        if idx == 0:
            return edges[0]
        if idx >= len(cumsum):
            return edges[-1]
        before = cumsum[idx - 1]
        in_bin = cumsum[idx] - before
        if in_bin == 0:
            return edges[idx]
        return edges[idx] + (target_count - before) / in_bin * (edges[idx + 1] - edges[idx])


def _sample_indices(data_len, min_num_samples=100, max_num_samples=10_000, power=0.75):
    min_num_samples = min(min_num_samples, data_len)
    num = max(min_num_samples, min(int(data_len**power), max_num_samples))
    return np.round(np.linspace(0, data_len - 1, num)).astype(int).tolist()


def _auto_downsample(img, target_size=150, max_size_threshold=300):
    _, height, width = img.shape
    if max(width, height) < max_size_threshold:
        return img
    factor = int(width / target_size) if width > height else int(height / target_size)
    return img[:, ::factor, ::factor]


def sample_frames(frames):
    """LeRobot's sample_images over an [N, H, W, 3] uint8 array: the sampled frames, CHW, downsampled."""
    return np.stack([_auto_downsample(np.ascontiguousarray(frames[i].transpose(2, 0, 1)))
                     for i in _sample_indices(len(frames))])


def get_feature_stats(array, axis, keepdims):
    """LeRobot's get_feature_stats for vectors/scalars (axis 0) and images (axis (0, 2, 3))."""
    original_shape = array.shape
    if axis == (0, 2, 3):
        batch, channels = array.shape[:2]
        reshaped, sample_count = array.transpose(0, 2, 3, 1).reshape(-1, channels), batch
    else:
        reshaped, sample_count = (array.reshape(-1, 1) if array.ndim == 1 else array), array.shape[0]
    if reshaped.shape[0] < 2:
        stats = {"min": np.min(reshaped, axis=0), "max": np.max(reshaped, axis=0), "mean": np.mean(reshaped, axis=0),
                 "std": np.std(reshaped, axis=0), "count": np.array([sample_count])}
        for q in DEFAULT_QUANTILES:
            stats[f"q{int(q * 100):02d}"] = stats["mean"].copy()
    else:
        running = RunningQuantileStats()
        running.update(reshaped)
        stats = running.get_statistics()
        stats["count"] = np.array([sample_count])
    if not keepdims:
        return stats
    out = {}
    for key, value in stats.items():
        if key == "count":
            out[key] = value
        elif axis == (0, 2, 3):
            out[key] = value.reshape(1, -1, 1, 1) if value.ndim == 1 else value
        elif len(original_shape) == 1 and value.ndim > 0:
            out[key] = value.reshape(1)
        elif len(original_shape) >= 2 and value.ndim == 1:
            out[key] = value.reshape(1, -1)
        else:
            out[key] = value
    return out


def compute_episode_stats(episode_data, features):
    """Per-episode stats as LeRobot's compute_episode_stats: episode_data maps a
    feature to its stacked values, or (cameras) to an [N, H, W, 3] uint8 array."""
    ep_stats = {}
    for key, data in episode_data.items():
        dtype = features[key]["dtype"]
        if dtype in ("string", "language"):
            continue
        if dtype in ("image", "video"):
            stats = get_feature_stats(sample_frames(data), axis=(0, 2, 3), keepdims=True)
            ep_stats[key] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in stats.items()}
        else:
            ep_stats[key] = get_feature_stats(data, axis=0, keepdims=data.ndim == 1)
    return ep_stats


def _serialize(value):
    if isinstance(value, dict):
        return {k: _serialize(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_serialize(v) for v in value]
    return value


def _write_json(data, path):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_serialize(data), indent=4, ensure_ascii=False))
    os.replace(tmp, path)


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        name = f"{prefix}/{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def _update_chunk_file_indices(chunk_idx, file_idx, chunks_size):
    if file_idx == chunks_size - 1:
        return chunk_idx + 1, 0
    return chunk_idx, file_idx + 1


def _size_mb(path):
    return os.path.getsize(path) / (1024**2)


# ---------------------------------------------------------------------------
# Parquet: value -> type strings of _native.parquet_write

def _nested_type(leaf, depth):
    t = leaf
    for _ in range(depth):
        t = f"list<{t}>"
    return t


def _parquet_value_type(value):
    """The writer type of a metadata value (a stats array, a tasks list, a scalar)."""
    if isinstance(value, np.ndarray):
        leaf = "int64" if np.issubdtype(value.dtype, np.integer) else "float64"
        return _nested_type(leaf, value.ndim), value.astype(np.int64 if leaf == "int64" else np.float64).tolist()
    if isinstance(value, list):
        return "list<string>", list(value)
    if isinstance(value, (bool, np.bool_)):
        return "bool", bool(value)
    if isinstance(value, (int, np.integer)):
        return "int64", int(value)
    if isinstance(value, (float, np.floating)):
        return "float64", float(value)
    if isinstance(value, str):
        return "string", value
    raise TypeError(f"no Parquet type for a metadata value of type {type(value).__name__}")


def _write_parquet(path, columns, row_group_sizes=None, kv=None):
    """Writes a Parquet file atomically (temporary name, then rename) with vlafeed's C writer."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    kwargs = {"codec": "snappy", "dictionary": True, "created_by": "vlafeed"}
    if row_group_sizes:
        kwargs["row_group_sizes"] = list(row_group_sizes)
    if kv:
        kwargs["kv"] = kv
    _native.parquet_write(str(tmp), columns, **kwargs)
    os.replace(tmp, path)


def _hf_feature(ft):
    """The `datasets` feature JSON LeRobot's data files carry in their "huggingface" metadata."""
    if ft["dtype"] == "image":
        return {"_type": "Image"}
    if tuple(ft["shape"]) == (1,):
        return {"dtype": ft["dtype"], "_type": "Value"}
    return {"feature": {"dtype": ft["dtype"], "_type": "Value"}, "length": int(ft["shape"][0]), "_type": "List"}


def _arrow_schema(names, features):
    """The ARROW:schema metadata of LeRobot's data files (vectors as fixed_size_list), when
    pyarrow is importable; the "huggingface" metadata carries the same lengths without it."""
    try:
        import base64

        import pyarrow as pa
    except ImportError:
        return None
    fields = []
    for name in names:
        ft = features[name]
        if ft["dtype"] == "image":
            t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        elif ft["dtype"] == "string":
            t = pa.string()
        elif tuple(ft["shape"]) == (1,):
            t = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
        else:
            t = pa.list_(pa.from_numpy_dtype(np.dtype(ft["dtype"])), int(ft["shape"][0]))
        fields.append(pa.field(name, t))
    return base64.b64encode(pa.schema(fields).serialize().to_pybytes()).decode()


def _data_column_type(name, ft):
    dtype = ft["dtype"]
    if dtype == "image":
        return "struct<bytes:binary,path:string>"
    if dtype == "string":
        return "string"
    if dtype not in _PARQUET_SCALARS:
        _refuse(f"feature {name!r} of dtype {dtype!r}", "only numeric, string, image and video features are recorded")
    shape = tuple(ft["shape"])
    if shape == (1,):
        return dtype
    if len(shape) == 1:
        return f"list<{dtype}>"
    _refuse(f"feature {name!r} of shape {shape}", "multi-dimensional (Array2D+) features are not recorded")


# ---------------------------------------------------------------------------
# encoder settings (LeRobot's RGBEncoderConfig, duck-typed)

_ENCODER_DEFAULTS = {"vcodec": "libsvtav1", "pix_fmt": "yuv420p", "g": 2, "crf": 30, "preset": None,
                     "fast_decode": 0, "extra_options": {}, "video_backend": "pyav"}
_CODEC_NAMES = {"libsvtav1": "libsvtav1", "av1": "libsvtav1", "auto": "libsvtav1", "h264": "h264",
                "libx264": "h264", "hevc": "hevc", "libx265": "hevc"}


def _encoder_settings(config):
    """The encoder fields of a LeRobot RGBEncoderConfig (or a dict of its fields, or None for
    LeRobot's defaults: libsvtav1, yuv420p, g 2, crf 30, preset 12)."""
    s = dict(_ENCODER_DEFAULTS)
    if config is not None:
        src = config if isinstance(config, dict) else vars(config)
        for key in list(s):
            if key in src:
                s[key] = src[key]
        if getattr(config, "__class__", None).__name__ == "DepthEncoderConfig":
            _refuse("depth_encoder", "depth cameras are not recorded")
    vcodec = _CODEC_NAMES.get(str(s["vcodec"]))
    if vcodec is None:
        _refuse(f"vcodec={s['vcodec']!r}", "vlafeed encodes libsvtav1, h264 (libx264) and hevc (libx265)")
    s["vcodec"] = vcodec
    if s["pix_fmt"] != "yuv420p":
        _refuse(f"pix_fmt={s['pix_fmt']!r}", "camera videos are encoded as yuv420p")
    if s["extra_options"]:
        _refuse(f"extra_options={s['extra_options']!r}", "extra encoder options are not passed through")
    if s["preset"] is None and vcodec == "libsvtav1":
        s["preset"] = 12
    return s


# ---------------------------------------------------------------------------
# LeRobotDatasetMetadata

def _overlay(owner, name, recording_value):
    """A property that answers recording_value(self) while the object records, and otherwise
    what the class after the mixin answers (an instance attribute of that name first, so
    the read-side class may assign it in __init__)."""
    def get(self):
        if self._recording():
            return recording_value(self)
        if name in self.__dict__:
            return self.__dict__[name]
        return getattr(super(globals()[owner], self), name)

    def set_(self, value):
        self.__dict__[name] = value

    return property(get, set_, doc=f"While recording: the value being written; otherwise the dataset's {name}.")


_RECORDING_CLASSES = {}


def _recording_class(cls, overlay):
    """cls with overlay first in its MRO (same name), so the overlay's properties win over
    cls's own while an object records; cached per class."""
    key = (cls, overlay)
    if key not in _RECORDING_CLASSES:
        _RECORDING_CLASSES[key] = type(cls.__name__, (overlay, cls), {"__module__": cls.__module__,
                                                                       "__qualname__": cls.__qualname__})
    return _RECORDING_CLASSES[key]


def _plain_class(obj):
    """The class a recording object goes back to after finalize()."""
    cls = type(obj)
    return cls.__mro__[2] if cls in _RECORDING_CLASSES.values() else cls


class RecordingMetadataMixin:
    """LeRobotDatasetMetadata's write side (LeRobot 0.6.1): create, save_episode_tasks,
    save_episode, update_video_info, update_chunk_settings, get_chunk_settings,
    finalize, latest_episode. While recording, the read-side properties answer
    from the info being written (meta.info is info.json's dict)."""

    _rec = None

    # ---- creation --------------------------------------------------------------------

    @classmethod
    def create(cls, repo_id, fps, features, robot_type=None, root=None, use_videos=True, metadata_buffer_size=10,
               chunks_size=None, data_files_size_in_mb=None, video_files_size_in_mb=None):
        """A new, empty dataset at root (default $HF_LEROBOT_HOME/repo_id), which must not exist
        (LeRobot: FileExistsError); writes meta/info.json."""
        root = pathlib.Path(root) if root is not None else compat.lerobot_home() / repo_id
        features = {**copy.deepcopy(dict(features)), **copy.deepcopy(DEFAULT_FEATURES)}
        bad = sorted(name for name in features if "/" in name)
        if bad:
            raise ValueError(f"Feature names should not contain '/'. Found '/' in '{bad}'.")
        for name, ft in features.items():
            ft["shape"] = tuple(ft["shape"])
            if ft["dtype"] == "video":
                if (ft.get("info") or {}).get("is_depth_map"):
                    _refuse(f"depth video feature {name!r}", "depth cameras are not recorded")
            elif ft["dtype"] == "language":
                _refuse(f"language feature {name!r}", "LeRobot's annotation pipeline writes those columns after "
                                                     "recording")
            elif ft["dtype"] != "image":
                _data_column_type(name, ft)
        video_keys = [k for k, ft in features.items() if ft["dtype"] == "video"]
        if video_keys and not use_videos:
            raise ValueError(f"Features contain video keys {video_keys}, but 'use_videos' is set to False. "
                             "Either remove video features from the features dict, or set 'use_videos=True'.")
        root.mkdir(parents=True, exist_ok=False)
        obj = object.__new__(_recording_class(cls, _MetaRecordingOverlay))
        obj.repo_id = repo_id
        obj.revision = None
        info = {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": features,
                "total_episodes": 0, "total_frames": 0, "total_tasks": 0,
                "chunks_size": chunks_size or DEFAULT_CHUNK_SIZE,
                "data_files_size_in_mb": data_files_size_in_mb or DEFAULT_DATA_FILE_SIZE_IN_MB,
                "video_files_size_in_mb": video_files_size_in_mb or DEFAULT_VIDEO_FILE_SIZE_IN_MB,
                "data_path": DEFAULT_DATA_PATH, "video_path": DEFAULT_VIDEO_PATH if use_videos else None,
                "robot_type": robot_type, "splits": {}}
        obj._rec = _MetaState(root, info, metadata_buffer_size)
        obj._rec.write_info()
        return obj

    @classmethod
    def _resume_state(cls, meta, metadata_buffer_size=10):
        """Turns a read-mode metadata object into a write-mode one appending to its dataset."""
        root = pathlib.Path(meta.root)
        info = json.loads((root / "meta" / "info.json").read_text())
        if not str(info.get("codebase_version", "")).startswith("v3"):
            raise ValueError(f"{root}: resume() appends to LeRobot v3.0 datasets, not {info.get('codebase_version')}")
        for ft in info["features"].values():
            ft["shape"] = tuple(ft["shape"])
        state = _MetaState(root, info, metadata_buffer_size)
        state.tasks = list(meta.task_list)
        table = meta.episodes
        state.previous_episodes = [table[i] for i in range(len(table))] if len(table) else []
        stats_path = root / "meta" / "stats.json"
        if stats_path.is_file():
            state.stats = {k: {s: np.asarray(v) for s, v in d.items()}
                           for k, d in json.loads(stats_path.read_text()).items()}
        meta.__class__ = _recording_class(type(meta), _MetaRecordingOverlay)
        meta._rec = state
        return meta

    def _recording(self):
        return self._rec is not None and not self._rec.finalized

    # ---- write-side methods ----------------------------------------------------------

    def save_episode_tasks(self, tasks):
        """Registers an episode's (unique) tasks; new ones get the next task_index and
        meta/tasks.parquet is rewritten."""
        self._require_recording("save_episode_tasks")
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"Tasks are not unique: {tasks}")
        new = [t for t in tasks if t not in self._rec.tasks]
        if new:
            self._rec.tasks.extend(new)
            self._rec.write_tasks()

    def save_episode(self, episode_index, episode_length, episode_tasks, episode_stats, episode_metadata):
        """Adds an episode's row (with its flattened stats) to the episodes table, updates
        info.json's totals and splits, and aggregates stats.json."""
        self._require_recording("save_episode")
        rec = self._rec
        row = {"episode_index": int(episode_index), "tasks": list(episode_tasks), "length": int(episode_length)}
        row.update(episode_metadata)
        row.update(_flatten({"stats": episode_stats}))
        rec.add_episode_row(row)
        info = rec.info
        info["total_episodes"] += 1
        info["total_frames"] += int(episode_length)
        info["total_tasks"] = len(rec.tasks)
        info["splits"] = {"train": f"0:{info['total_episodes']}"}
        rec.write_info()
        rec.stats = compat.aggregate_stats([rec.stats, episode_stats]) if rec.stats is not None else episode_stats
        _write_json(rec.stats, rec.root / "meta" / "stats.json")

    def update_video_info(self, video_key=None, video_encoder=None, preserve_keys=None):
        """Fills info.json's ``features[key]["info"]`` from the key's first video file (chunk 0,
        file 0) and the encoder settings, as LeRobot's get_video_info does."""
        self._require_recording("update_video_info")
        rec = self._rec
        keys = rec.video_keys if video_key is None else [video_key]
        if video_key is not None and video_key not in rec.video_keys:
            raise ValueError(f"Video key {video_key} not found in dataset")
        enc = _encoder_settings(video_encoder)
        keep = set(preserve_keys or ())
        for key in keys:
            path = rec.root / rec.info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
            probe = _native.video_info(str(path))
            new = {"video.height": probe["height"], "video.width": probe["width"], "video.codec": probe["codec"],
                   "video.pix_fmt": probe["pix_fmt"], "video.fps": rec.info["fps"], "video.channels": 3,
                   "has_audio": False}
            if video_encoder is not None:
                new.update({"video.g": enc["g"], "video.crf": enc["crf"], "video.preset": enc["preset"],
                            "video.fast_decode": enc["fast_decode"],
                            "video.video_backend": enc.get("video_backend", "pyav"),
                            "video.extra_options": dict(enc["extra_options"])})
            new = {k: v for k, v in new.items() if k not in keep}
            merged = {**(rec.info["features"][key].get("info") or {}), **new}
            merged.setdefault("is_depth_map", False)
            rec.info["features"][key]["info"] = merged

    def update_chunk_settings(self, chunks_size=None, data_files_size_in_mb=None, video_files_size_in_mb=None):
        """Changes chunks_size / file size limits (positive) and rewrites info.json."""
        self._require_recording("update_chunk_settings")
        for name, value in (("chunks_size", chunks_size), ("data_files_size_in_mb", data_files_size_in_mb),
                            ("video_files_size_in_mb", video_files_size_in_mb)):
            if value is not None:
                if value <= 0:
                    raise ValueError(f"{name} must be positive, got {value}")
                self._rec.info[name] = value
        self._rec.write_info()

    def get_chunk_settings(self):
        return {"chunks_size": self.chunks_size, "data_files_size_in_mb": self.data_files_size_in_mb,
                "video_files_size_in_mb": self.video_files_size_in_mb}

    def finalize(self):
        """Flushes the buffered episode rows; afterwards the object reads the dataset it wrote.
        Idempotent."""
        rec = self._rec
        if rec is None or rec.finalized:
            return
        rec.flush_episodes()
        rec.finalized = True
        self.__class__ = _plain_class(self)
        if rec.info["total_episodes"] > 0:
            type(self).__init__(self, self.repo_id, root=str(rec.root))

    @property
    def latest_episode(self):
        """The last saved episode's metadata row (values in one-element lists, as LeRobot keeps them)."""
        if self._rec is None or self._rec.latest_row is None:
            return self.__dict__.get("_latest_episode_value")
        return {k: [v] for k, v in self._rec.latest_row.items()}

    @latest_episode.setter
    def latest_episode(self, value):
        # LeRobot's metadata keeps it as a plain attribute (None after a read-side open)
        self.__dict__["_latest_episode_value"] = value

    def _require_recording(self, name):
        if not self._recording():
            raise RuntimeError(f"Cannot call '{name}()' on read-only metadata. Use LeRobotDatasetMetadata.create() "
                               "or LeRobotDataset.create()/resume() to record.")

    # ---- read-side answers while recording ---------------------------------------------

class _MetaRecordingOverlay:
    """Put before LeRobotDatasetMetadata in a write-mode object's class (see _recording_class):
    while recording, the read-side properties answer from the info being written
    (meta.info is info.json's dict); finalize() switches the object back to the plain class."""

    info = _overlay("_MetaRecordingOverlay", "info", lambda self: self._rec.info)
    fps = _overlay("_MetaRecordingOverlay", "fps", lambda self: self._rec.fps)
    features = _overlay("_MetaRecordingOverlay", "features", lambda self: self._rec.features)
    total_episodes = _overlay("_MetaRecordingOverlay", "total_episodes", lambda self: self._rec.total_episodes)
    total_frames = _overlay("_MetaRecordingOverlay", "total_frames", lambda self: self._rec.total_frames)
    total_tasks = _overlay("_MetaRecordingOverlay", "total_tasks", lambda self: self._rec.total_tasks)
    chunks_size = _overlay("_MetaRecordingOverlay", "chunks_size", lambda self: self._rec.chunks_size)
    data_files_size_in_mb = _overlay("_MetaRecordingOverlay", "data_files_size_in_mb",
                                     lambda self: self._rec.data_files_size_in_mb)
    video_files_size_in_mb = _overlay("_MetaRecordingOverlay", "video_files_size_in_mb",
                                      lambda self: self._rec.video_files_size_in_mb)
    data_path = _overlay("_MetaRecordingOverlay", "data_path", lambda self: self._rec.data_path)
    video_path = _overlay("_MetaRecordingOverlay", "video_path", lambda self: self._rec.video_path)
    robot_type = _overlay("_MetaRecordingOverlay", "robot_type", lambda self: self._rec.robot_type)
    video_keys = _overlay("_MetaRecordingOverlay", "video_keys", lambda self: self._rec.video_keys)
    camera_keys = _overlay("_MetaRecordingOverlay", "camera_keys", lambda self: self._rec.camera_keys)
    image_keys = _overlay("_MetaRecordingOverlay", "image_keys", lambda self: self._rec.image_keys)
    depth_keys = _overlay("_MetaRecordingOverlay", "depth_keys", lambda self: self._rec.depth_keys)
    stats = _overlay("_MetaRecordingOverlay", "stats", lambda self: self._rec.stats)
    root = _overlay("_MetaRecordingOverlay", "root", lambda self: self._rec.root)
    tasks = _overlay("_MetaRecordingOverlay", "tasks",
                     lambda self: compat.tasks_frame(self._rec.tasks) if self._rec.tasks else None)
    # as LeRobot while recording a new dataset: the rows go to meta/episodes when flushed
    episodes = _overlay("_MetaRecordingOverlay", "episodes", lambda self: None)


    def get_task_index(self, task):
        if self._recording():
            return self._rec.tasks.index(task) if task in self._rec.tasks else None
        return super().get_task_index(task)


class _MetaState:
    """What a metadata object being written holds: info.json's dict, the task list,
    the buffered/flushed episode rows of the current meta/episodes file, stats."""

    def __init__(self, root, info, buffer_size):
        self.root = pathlib.Path(root)
        self.info = info
        self.buffer_size = max(1, int(buffer_size))
        self.tasks = []
        self.stats = None
        self.previous_episodes = []   # rows already on disk before a resume
        self.file_rows = []           # rows of the current meta/episodes file (flushed or not)
        self.unflushed = 0
        self.latest_row = None
        self.finalized = False

    fps = property(lambda self: self.info["fps"])
    features = property(lambda self: self.info["features"])
    total_episodes = property(lambda self: self.info["total_episodes"])
    total_frames = property(lambda self: self.info["total_frames"])
    total_tasks = property(lambda self: self.info["total_tasks"])
    chunks_size = property(lambda self: self.info["chunks_size"])
    data_files_size_in_mb = property(lambda self: self.info["data_files_size_in_mb"])
    video_files_size_in_mb = property(lambda self: self.info["video_files_size_in_mb"])
    data_path = property(lambda self: self.info["data_path"])
    video_path = property(lambda self: self.info["video_path"])
    robot_type = property(lambda self: self.info.get("robot_type"))
    video_keys = property(lambda self: [k for k, f in self.features.items() if f["dtype"] == "video"])
    image_keys = property(lambda self: [k for k, f in self.features.items() if f["dtype"] == "image"])
    camera_keys = property(lambda self: [k for k, f in self.features.items() if f["dtype"] in ("video", "image")])
    depth_keys = property(lambda self: [k for k in self.camera_keys
                                        if (self.features[k].get("info") or {}).get("is_depth_map")])

    def write_info(self):
        _write_json(self.info, self.root / "meta" / "info.json")

    def write_tasks(self):
        pandas_meta = {"index_columns": ["task"],
                       "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                                           "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
                       "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                                    "numpy_type": "int64", "metadata": None},
                                   {"name": "task", "field_name": "task", "pandas_type": "unicode",
                                    "numpy_type": "object", "metadata": None}],
                       "attributes": {}, "creator": {"library": "vlafeed", "version": "0"}}
        _write_parquet(self.root / "meta" / "tasks.parquet",
                       [("task_index", "int64", list(range(len(self.tasks)))), ("task", "string", list(self.tasks))],
                       kv={"pandas": json.dumps(pandas_meta)})

    def add_episode_row(self, row):
        """LeRobot's _save_episode_metadata: places the row in the current meta/episodes file
        or the next one (size estimate as upstream's), buffers it, flushes every buffer_size rows."""
        n = row["length"]
        if self.latest_row is None:
            chunk, file = 0, 0
            if self.previous_episodes:
                last = self.previous_episodes[-1]
                chunk, file = _update_chunk_file_indices(last.get("meta/episodes/chunk_index", 0),
                                                         last.get("meta/episodes/file_index", 0), self.chunks_size)
                start = last["dataset_to_index"]
            else:
                start = 0
        else:
            chunk, file = self.latest_row["meta/episodes/chunk_index"], self.latest_row["meta/episodes/file_index"]
            path = self.root / DEFAULT_EPISODES_PATH.format(chunk_index=chunk, file_index=file)
            if path.exists():
                size = _size_mb(path)
                per = size / self.latest_row["episode_index"] if self.latest_row["episode_index"] > 0 else 0.0
                if size + per * n >= self.data_files_size_in_mb:
                    self.flush_episodes()
                    chunk, file = _update_chunk_file_indices(chunk, file, self.chunks_size)
                    self.file_rows = []
            start = self.latest_row["dataset_to_index"]
        row["dataset_from_index"], row["dataset_to_index"] = start, start + n
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = chunk, file
        self.file_rows.append(row)
        self.latest_row = row
        self.unflushed += 1
        if self.unflushed >= self.buffer_size:
            self.flush_episodes()

    def flush_episodes(self):
        """Writes the current meta/episodes file with all of its rows."""
        if not self.file_rows or self.unflushed == 0:
            return
        first = self.file_rows[0]
        names = []
        for row in self.file_rows:
            names += [k for k in row if k not in names]
        columns = []
        for name in names:
            values = [row.get(name) for row in self.file_rows]
            sample = next(v for v in values if v is not None)
            type_string, _ = _parquet_value_type(sample)
            columns.append((name, type_string, [None if v is None else _parquet_value_type(v)[1] for v in values]))
        _write_parquet(self.root / DEFAULT_EPISODES_PATH.format(chunk_index=first["meta/episodes/chunk_index"],
                                                                file_index=first["meta/episodes/file_index"]),
                       columns)
        self.unflushed = 0


# ---------------------------------------------------------------------------
# the writer (LeRobot's DatasetWriter)

class _ThreadImageWriter:
    """LeRobot's AsyncImageWriter in threads: PNG encoding (FFmpeg, GIL released) off the caller's thread.
    Only image features go through it: camera frames are appended raw to their spill file."""

    def __init__(self, num_processes=0, num_threads=4):
        # PNG encoding releases the GIL, so LeRobot's processes become threads:
        # num_processes x num_threads of them (the files written are the same).
        workers = max(1, num_threads) * max(1, num_processes)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        self._pending = []

    def save_image(self, image, fpath, compress_level=1):
        self._pending.append(self._pool.submit(_native.image_write, str(fpath), image))

    def wait_until_done(self):
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def stop(self):
        self.wait_until_done()
        self._pool.shutdown(wait=True)


class DatasetWriter:
    """The write side of a LeRobotDataset in write mode (``dataset.writer``): the
    episode buffer, camera spill files, data Parquet and video files."""

    def __init__(self, meta, root, rgb_encoder, depth_encoder, encoder_threads, batch_encoding_size,
                 streaming_encoder=None, initial_frames=0):
        if depth_encoder is not None and meta.depth_keys:
            _refuse("depth_encoder", "depth cameras are not recorded")
        self._meta = meta
        self._root = pathlib.Path(root)
        self._rgb_encoder = _encoder_settings(rgb_encoder)
        self._rgb_encoder_config = rgb_encoder
        self._encoder_threads = encoder_threads
        self._batch_encoding_size = int(batch_encoding_size)
        if self._batch_encoding_size < 1:
            raise ValueError(f"batch_encoding_size must be >= 1, got {batch_encoding_size}")
        self._streaming = bool(streaming_encoder)
        self.image_writer = None
        self.episode_buffer = self._create_episode_buffer()
        self._latest_episode = None       # data placement of the last saved episode
        self._pq_writer = None            # the current data file, one row group per episode
        self._current_file_start_frame = None
        self._pending_video_episodes = []  # batch encoding: episodes whose spills wait
        self._latest_video = {}           # video_key -> (chunk, file, to_timestamp) of the last encoded episode
        self._recorded_frames = int(initial_frames)
        self._finalized = False

    # ---- the episode buffer ----------------------------------------------------------

    def _create_episode_buffer(self, episode_index=None):
        buf = {"size": 0, "task": []}
        index = self._meta.total_episodes if episode_index is None else episode_index
        for key in self._meta.features:
            buf[key] = index if key == "episode_index" else []
        buf["_spills"] = {}
        return buf

    def _episode_dir(self, key, episode_index):
        return self._root / "images" / key / f"episode-{int(episode_index):06d}"

    def add_frame(self, frame):
        """Validates a frame as LeRobot does (every feature but the 5 automatic ones, plus
        "task"; dtype and shape), then buffers it: cameras go to their spill file, image
        features also to a PNG; nothing else touches the disk before save_episode()."""
        frame = dict(frame)
        for name, value in frame.items():
            if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch.Tensor, without importing torch
                frame[name] = value.detach().cpu().numpy()
        features = self._meta.features
        _validate_frame(frame, features)
        if self.episode_buffer is None:
            self.episode_buffer = self._create_episode_buffer()
        buf = self.episode_buffer
        frame_index = buf["size"]
        buf["frame_index"].append(frame_index)
        buf["timestamp"].append(frame_index / self._meta.fps)
        buf["task"].append(frame.pop("task"))
        for key, value in frame.items():
            ft = features[key]
            if ft["dtype"] in ("image", "video"):
                rgb = _to_hwc_uint8(key, value)
                spill = buf["_spills"].get(key)
                if spill is None:
                    d = self._episode_dir(key, buf["episode_index"])
                    d.mkdir(parents=True, exist_ok=True)
                    spill = buf["_spills"][key] = {"path": d / "frames.rgb", "shape": rgb.shape}
                    open(spill["path"], "wb").close()
                if rgb.shape != spill["shape"]:
                    raise ValueError(f"The feature '{key}' changed size within episode {buf['episode_index']}: "
                                     f"{rgb.shape} after {spill['shape']}.")
                with open(spill["path"], "ab") as f:
                    f.write(rgb.tobytes())
                if ft["dtype"] == "image":
                    png = self._episode_dir(key, buf["episode_index"]) / f"frame-{frame_index:06d}.png"
                    if self.image_writer is not None:
                        self.image_writer.save_image(rgb, png)
                    else:
                        _native.image_write(str(png), rgb)
                    buf[key].append(str(png))
                else:
                    buf[key].append(None)
            else:
                buf[key].append(value)
        buf["size"] += 1

    def _spilled_frames(self, buf, key):
        spill = buf["_spills"][key]
        h, w, c = spill["shape"]
        return np.memmap(spill["path"], dtype=np.uint8, mode="r", shape=(buf["size"], h, w, c))

    def clear_episode_buffer(self, delete_images=True):
        """Drops the frames added since the last save_episode (and their spill files)."""
        if delete_images and self.episode_buffer is not None:
            self._wait_image_writer()
            for key in self._meta.camera_keys:
                d = self._episode_dir(key, self.episode_buffer["episode_index"])
                if d.is_dir():
                    shutil.rmtree(d)
        self.episode_buffer = self._create_episode_buffer()

    # ---- save_episode ----------------------------------------------------------------

    def save_episode(self, episode_data=None, parallel_encoding=True):
        """Writes the buffered episode: stats, data Parquet rows, camera videos (now, or per
        batch_encoding_size episodes), the episodes row, info.json and stats.json."""
        buf = episode_data if episode_data is not None else self.episode_buffer
        meta, features = self._meta, self._meta.features
        _validate_episode_buffer(buf, meta.total_episodes, features)
        if "_spills" not in buf:
            buf = self._adopt_episode_data(buf)
        self._wait_image_writer()
        length = buf["size"]
        tasks = buf["task"]
        episode_tasks = list(dict.fromkeys(tasks))
        episode_index = buf["episode_index"]
        columns = {"index": np.arange(meta.total_frames, meta.total_frames + length),
                   "episode_index": np.full((length,), episode_index)}
        meta.save_episode_tasks(episode_tasks)
        columns["task_index"] = np.array([meta.get_task_index(t) for t in tasks])
        stats_input = {}
        for key, ft in features.items():
            if ft["dtype"] in ("image", "video"):
                stats_input[key] = self._spilled_frames(buf, key)
                continue
            if key in columns:
                stats_input[key] = columns[key]
                continue
            values = np.stack(buf[key])
            if tuple(ft["shape"]) == (1,) and ft["dtype"] != "string":
                values = values.reshape(length)
            columns[key] = stats_input[key] = values
        ep_stats = compute_episode_stats(stats_input, features)
        ep_metadata = self._save_episode_data(buf, columns, length)
        spills = {key: (buf["_spills"][key], length) for key in meta.video_keys}
        if meta.video_keys and self._batch_encoding_size == 1:
            ep_metadata.update(self._encode_and_place(episode_index, spills, parallel_encoding))
        meta.save_episode(episode_index, length, episode_tasks, ep_stats, ep_metadata)
        if meta.video_keys and self._batch_encoding_size > 1:
            self._pending_video_episodes.append((episode_index, spills))
            if len(self._pending_video_episodes) >= self._batch_encoding_size:
                self.flush_pending_videos()
        for key in meta.image_keys:
            d = self._episode_dir(key, episode_index)
            if d.is_dir():
                shutil.rmtree(d)
        if episode_data is None:
            self.episode_buffer = self._create_episode_buffer()

    def _adopt_episode_data(self, episode_data):
        """A pre-built episode dict (LeRobot's save_episode(episode_data=...)) in this writer's
        buffer form: its camera frames (arrays, one per frame) spilled and PNG-encoded like
        add_frame's. Image file paths (LeRobot's own buffers) are refused by name."""
        buf = {k: v for k, v in episode_data.items()}
        buf["_spills"] = {}
        index = buf["episode_index"]
        for key in self._meta.camera_keys:
            values = list(buf[key])
            if values and isinstance(values[0], (str, os.PathLike)):
                _refuse(f"episode_data[{key!r}] given as image file paths",
                        "pass the frames as arrays (add_frame's form)")
            d = self._episode_dir(key, index)
            d.mkdir(parents=True, exist_ok=True)
            spill = buf["_spills"][key] = {"path": d / "frames.rgb", "shape": None}
            buf[key] = []
            with open(spill["path"], "wb") as f:
                for frame_index, value in enumerate(values):
                    rgb = _to_hwc_uint8(key, value)
                    if spill["shape"] is None:
                        spill["shape"] = rgb.shape
                    elif rgb.shape != spill["shape"]:
                        raise ValueError(f"The feature '{key}' changed size within episode {index}.")
                    f.write(rgb.tobytes())
                    if self._meta.features[key]["dtype"] == "image":
                        png = d / f"frame-{frame_index:06d}.png"
                        _native.image_write(str(png), rgb)
                        buf[key].append(str(png))
                    else:
                        buf[key].append(None)
        return buf

    def _save_episode_data(self, buf, columns, length):
        """Appends the episode as one row group of the current data file (kept open, as
        LeRobot's ParquetWriter), or closes it and starts the next file when LeRobot's size
        estimate says so."""
        meta = self._meta
        if self._latest_episode is None:
            chunk, file, start = 0, 0, 0
            previous = meta._rec.previous_episodes
            if previous:
                last = previous[-1]
                start = last["dataset_to_index"]
                chunk, file = _update_chunk_file_indices(last["data/chunk_index"], last["data/file_index"],
                                                         meta.chunks_size)
            self._current_file_start_frame = start
        else:
            chunk, file = self._latest_episode["data/chunk_index"], self._latest_episode["data/file_index"]
            start = self._latest_episode["dataset_to_index"]
            size = self._pq_writer.bytes / (1024**2) if self._pq_writer is not None else 0.0
            frames_in_file = start - self._current_file_start_frame
            per_frame = size / frames_in_file if frames_in_file > 0 else 0
            if size + per_frame * length >= meta.data_files_size_in_mb:
                chunk, file = _update_chunk_file_indices(chunk, file, meta.chunks_size)
                self.close_writer()
                self._current_file_start_frame = start
        names = [k for k, ft in meta.features.items() if ft["dtype"] not in ("video", "language")]
        if self._pq_writer is None:
            kv = {"huggingface": json.dumps({"info": {"features": {k: _hf_feature(meta.features[k])
                                                                   for k in names}}})}
            arrow = _arrow_schema(names, meta.features)
            if arrow:
                kv["ARROW:schema"] = arrow
            path = self._root / meta.data_path.format(chunk_index=chunk, file_index=file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._pq_writer = _native.parquet_writer_open(
                str(path), [(k, _data_column_type(k, meta.features[k])) for k in names], codec="snappy",
                dictionary=True, kv=kv, created_by="vlafeed")
        group = []
        for key in names:
            ft = meta.features[key]
            if ft["dtype"] == "image":
                group.append([{"bytes": pathlib.Path(p).read_bytes(), "path": pathlib.Path(p).name}
                              for p in buf[key]])
            elif ft["dtype"] == "string":
                group.append([str(v) for v in columns[key]])
            else:
                group.append(columns[key].astype(ft["dtype"]).tolist())
        self._pq_writer.write_row_group(group)
        placement = {"data/chunk_index": chunk, "data/file_index": file, "dataset_from_index": start,
                     "dataset_to_index": start + length}
        self._latest_episode = placement
        self._recorded_frames += length
        return placement

    def _encode_and_place(self, episode_index, spills, parallel_encoding=True):
        """Encodes each camera's spilled frames to a temporary MP4 (in parallel threads: the
        encoder releases the GIL) and appends it to the camera's current video file."""
        tmp_dir = pathlib.Path(tempfile.mkdtemp(dir=self._root))
        try:
            def encode(key):
                spill, length = spills[key]
                h, w, c = spill["shape"]
                frames = np.memmap(spill["path"], dtype=np.uint8, mode="r", shape=(length, h, w, c))
                out = tmp_dir / f"{key}_{int(episode_index):03d}.mp4"
                enc = self._rgb_encoder
                _native.video_encode(str(out), frames, int(self._meta.fps), codec=enc["vcodec"], gop=int(enc["g"]),
                                     crf=int(enc["crf"]), preset=enc["preset"], fast_decode=int(enc["fast_decode"]),
                                     threads=int(self._encoder_threads or 1))
                del frames
                return out

            keys = list(spills)
            if parallel_encoding and len(keys) > 1:
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(keys)) as pool:
                    paths = dict(zip(keys, pool.map(encode, keys)))
            else:
                paths = {k: encode(k) for k in keys}
            metadata = {}
            for key in keys:
                metadata.update(self._place_video(key, episode_index, paths[key]))
                shutil.rmtree(spills[key][0]["path"].parent, ignore_errors=True)
            return metadata
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def _place_video(self, key, episode_index, ep_path):
        """LeRobot's _save_episode_video: a new file (from_timestamp 0) or concatenation onto
        the camera's current one, by the video_files_size_in_mb rule."""
        meta = self._meta
        ep_size, ep_duration = _size_mb(ep_path), _native.video_duration(str(ep_path))
        latest = self._latest_video.get(key)
        if latest is None:
            chunk, file = 0, 0
            previous = meta._rec.previous_episodes
            if previous and f"videos/{key}/chunk_index" in previous[-1]:
                chunk, file = _update_chunk_file_indices(previous[-1][f"videos/{key}/chunk_index"],
                                                         previous[-1][f"videos/{key}/file_index"], meta.chunks_size)
            start = 0.0
            new_path = self._root / meta.video_path.format(video_key=key, chunk_index=chunk, file_index=file)
            new_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(ep_path), str(new_path))
        else:
            chunk, file, start = latest
            latest_path = self._root / meta.video_path.format(video_key=key, chunk_index=chunk, file_index=file)
            if _size_mb(latest_path) + ep_size >= meta.video_files_size_in_mb:
                chunk, file = _update_chunk_file_indices(chunk, file, meta.chunks_size)
                new_path = self._root / meta.video_path.format(video_key=key, chunk_index=chunk, file_index=file)
                new_path.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(ep_path), str(new_path))
                start = 0.0
            else:
                _native.video_concat([str(latest_path), str(ep_path)], str(latest_path), exact=True)
        self._latest_video[key] = (chunk, file, start + ep_duration)
        if "video.codec" not in (meta.features[key].get("info") or {}):
            meta.update_video_info(key, video_encoder=self._rgb_encoder)
            meta._rec.write_info()
        return {f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file,
                f"videos/{key}/from_timestamp": start, f"videos/{key}/to_timestamp": start + ep_duration}

    # ---- LeRobot's remaining writer methods -----------------------------------------------

    def start_image_writer(self, num_processes=0, num_threads=4):
        """PNG writing for image features in background threads (num_processes x num_threads of them)."""
        if self.image_writer is not None:
            logger.warning("You are starting a new AsyncImageWriter that is replacing an already existing one in "
                           "the dataset.")
            self.image_writer.stop()
        self.image_writer = _ThreadImageWriter(num_processes, num_threads)

    def stop_image_writer(self):
        if self.image_writer is not None:
            self.image_writer.stop()
            self.image_writer = None

    def _wait_image_writer(self):
        if self.image_writer is not None:
            self.image_writer.wait_until_done()

    def flush_pending_videos(self):
        """Encodes the episodes batch_encoding_size has held back and writes their video
        columns into the episodes table."""
        pending, self._pending_video_episodes = self._pending_video_episodes, []
        rec = self._meta._rec
        for episode_index, spills in pending:
            placement = self._encode_and_place(episode_index, spills)
            for row in rec.file_rows:
                if row["episode_index"] == episode_index:
                    stats_at = next((i for i, k in enumerate(row) if k.startswith("stats/")), len(row))
                    items = list(row.items())
                    row.clear()
                    row.update(items[:stats_at])
                    row.update(placement)
                    row.update(items[stats_at:])
            rec.unflushed = max(rec.unflushed, 1)
        if pending:
            rec.flush_episodes()

    def cancel_pending_videos(self):
        """Streaming encoding has nothing in flight here (frames are encoded at save_episode)."""

    def cleanup_interrupted_episode(self, episode_index):
        for key in self._meta.camera_keys:
            d = self._episode_dir(key, episode_index)
            if d.exists():
                shutil.rmtree(d)

    def close_writer(self):
        """Closes the current data file (its footer written; the next episode opens the next file)."""
        if self._pq_writer is not None:
            writer, self._pq_writer = self._pq_writer, None
            writer.close()

    def finalize(self):
        if self._finalized:
            return
        self.stop_image_writer()
        self.flush_pending_videos()
        self.close_writer()
        self._meta.finalize()
        images = self._root / "images"
        if images.is_dir() and not any(images.rglob("*.rgb")):
            shutil.rmtree(images, ignore_errors=True)
        self._finalized = True

    def __del__(self):
        """As LeRobot's: a writer dropped without finalize() still completes its files."""
        with contextlib.suppress(Exception):
            self.finalize()


def _to_hwc_uint8(key, value):
    """A camera frame as HWC uint8 (LeRobot's image_array_to_pil_image: CHW is transposed,
    float in [0, 1] is scaled by 255 and truncated)."""
    arr = np.asarray(value)
    if arr.ndim != 3:
        raise ValueError(f"The feature '{key}' has {arr.ndim} dimensions, but 3 are expected for a camera frame.")
    if arr.shape[0] == 3:
        arr = arr.transpose(1, 2, 0)
    elif arr.shape[-1] != 3:
        raise NotImplementedError(f"The feature '{key}' has {arr.shape[-1]} channels, but 3 is required for now.")
    if arr.dtype != np.uint8:
        lo, hi = float(arr.min()), float(arr.max())
        if hi > 1.0 or lo < 0.0:
            raise ValueError(f"The feature '{key}' is float, which requires values in the range [0.0, 1.0]. "
                             f"However, the provided range is [{lo}, {hi}]. Please adjust the range or provide a "
                             "uint8 image with values in the range [0, 255].")
        arr = (arr * 255).astype(np.uint8)
    return np.ascontiguousarray(arr)


def _validate_frame(frame, features):
    """LeRobot's validate_frame: the same checks and messages."""
    expected = set(features) - set(DEFAULT_FEATURES)
    actual = set(frame)
    if "task" not in actual:
        raise ValueError("Feature mismatch in `frame` dictionary:\nMissing features: {'task'}\n")
    actual -= {"task"}
    error = ""
    missing, extra = expected - actual, actual - expected
    if missing or extra:
        error += "Feature mismatch in `frame` dictionary:\n"
        if missing:
            error += f"Missing features: {missing}\n"
        if extra:
            error += f"Extra features: {extra}\n"
    for name in sorted(actual & expected):
        ft, value = features[name], frame[name]
        dtype, shape = ft["dtype"], tuple(ft["shape"])
        if dtype in ("image", "video"):
            if isinstance(value, np.ndarray):
                c, h, w = shape
                if value.ndim != 3 or (value.shape != (c, h, w) and value.shape != (h, w, c)):
                    error += (f"The feature '{name}' of shape '{value.shape}' does not have the expected shape "
                              f"'{(c, h, w)}' or '{(h, w, c)}'.\n")
            elif not (type(value).__module__.startswith("PIL.")):
                error += (f"The feature '{name}' is expected to be of type 'PIL.Image' or 'np.ndarray' channel first "
                          f"or channel last, but type '{type(value)}' provided instead.\n")
        elif dtype == "string":
            if not isinstance(value, str):
                error += (f"The feature '{name}' is expected to be of type 'str', but type '{type(value)}' "
                          "provided instead.\n")
        elif dtype == "language":
            pass
        elif isinstance(value, np.ndarray):
            if value.dtype != np.dtype(dtype):
                error += f"The feature '{name}' of dtype '{value.dtype}' is not of the expected dtype '{dtype}'.\n"
            if value.shape != shape:
                error += f"The feature '{name}' of shape '{value.shape}' does not have the expected shape '{shape}'.\n"
        else:
            error += (f"The feature '{name}' is not a 'np.ndarray'. Expected type is '{dtype}', but type "
                      f"'{type(value)}' provided instead.\n")
    if error:
        raise ValueError(error)


def _validate_episode_buffer(buf, total_episodes, features):
    """LeRobot's validate_episode_buffer."""
    if "size" not in buf:
        raise ValueError("size key not found in episode_buffer")
    if "task" not in buf:
        raise ValueError("task key not found in episode_buffer")
    if buf["episode_index"] != total_episodes:
        raise NotImplementedError(
            "You might have manually provided the episode_buffer with an episode_index that doesn't match the total "
            "number of episodes already in the dataset. This is not supported for now.")
    if buf["size"] == 0:
        raise ValueError("You must add one or several frames with `add_frame` before calling `add_episode`.")
    keys = set(buf) - {"task", "size", "_spills"}
    if keys != set(features):
        raise ValueError(f"Features from `episode_buffer` don't match the ones in `features`."
                         f"In episode_buffer not in features: {keys - set(features)}"
                         f"In features not in episode_buffer: {set(features) - keys}")


# ---------------------------------------------------------------------------
# LeRobotDataset

class RecordingDatasetMixin:
    """LeRobotDataset's write side (LeRobot 0.6.1): create, resume, add_frame,
    save_episode, clear_episode_buffer, has_pending_frames, finalize, writer;
    push_to_hub is refused (no Hub here)."""

    writer = None
    _is_finalized = False

    @classmethod
    def create(cls, repo_id, fps, features, root=None, robot_type=None, use_videos=True, tolerance_s=1e-4,
               image_writer_processes=0, image_writer_threads=0, video_backend=None, batch_encoding_size=1,
               rgb_encoder=None, depth_encoder=None, metadata_buffer_size=10, streaming_encoding=False,
               encoder_queue_maxsize=30, encoder_threads=None, video_files_size_in_mb=None,
               data_files_size_in_mb=None):
        """A new dataset in write mode at root (which must not exist yet). See LeRobot's
        LeRobotDataset.create; every keyword is accepted with its meaning."""
        from vlafeed.data.dataset import LeRobotDatasetMetadata
        _encoder_settings(rgb_encoder)  # refuse unsupported settings before anything is written
        obj = object.__new__(_recording_class(cls, _DatasetRecordingOverlay))
        obj.meta = LeRobotDatasetMetadata.create(repo_id=repo_id, fps=fps, robot_type=robot_type, features=features,
                                                 root=root, use_videos=use_videos,
                                                 metadata_buffer_size=metadata_buffer_size,
                                                 video_files_size_in_mb=video_files_size_in_mb,
                                                 data_files_size_in_mb=data_files_size_in_mb)
        obj._init_writer(repo_id, tolerance_s, video_backend, batch_encoding_size, rgb_encoder, depth_encoder,
                         encoder_threads, streaming_encoding, image_writer_processes, image_writer_threads, 0)
        return obj

    @classmethod
    def resume(cls, repo_id, root=None, tolerance_s=1e-4, revision=None, force_cache_sync=False, video_backend=None,
               batch_encoding_size=1, rgb_encoder=None, depth_encoder=None, encoder_threads=None,
               image_writer_processes=0, image_writer_threads=0, streaming_encoding=False, encoder_queue_maxsize=30,
               *, token=None):
        """Appends episodes to an existing local v3.0 dataset (new data/video/episodes files,
        as LeRobot's resume). root is required."""
        from vlafeed.data.dataset import LeRobotDatasetMetadata
        if not root:
            raise ValueError("resume() requires an explicit 'root' directory because it creates a DatasetWriter.")
        if force_cache_sync:
            _refuse("force_cache_sync=True", "there is no Hub download here; resume reads root in place")
        obj = object.__new__(_recording_class(cls, _DatasetRecordingOverlay))
        meta = LeRobotDatasetMetadata(repo_id, root=root, revision=revision)
        obj.meta = RecordingMetadataMixin._resume_state(meta)
        obj._init_writer(repo_id, tolerance_s, video_backend, batch_encoding_size, rgb_encoder, depth_encoder,
                         encoder_threads, streaming_encoding, image_writer_processes, image_writer_threads,
                         obj.meta.total_frames)
        obj.revision = revision
        return obj

    def _init_writer(self, repo_id, tolerance_s, video_backend, batch_encoding_size, rgb_encoder, depth_encoder,
                     encoder_threads, streaming_encoding, image_writer_processes, image_writer_threads,
                     initial_frames):
        self.repo_id = repo_id
        self.revision = None
        self._write_settings = {"tolerance_s": tolerance_s, "video_backend": video_backend}
        self.writer = DatasetWriter(self.meta, self.meta.root, rgb_encoder=rgb_encoder, depth_encoder=depth_encoder,
                                    encoder_threads=encoder_threads, batch_encoding_size=batch_encoding_size,
                                    streaming_encoder=streaming_encoding, initial_frames=initial_frames)
        if image_writer_processes or image_writer_threads:
            self.writer.start_image_writer(image_writer_processes, image_writer_threads)
        self._is_finalized = False

    def _writing(self):
        return self.writer is not None and not self._is_finalized

    def _require_writer(self, name):
        if not self._writing():
            raise RuntimeError(f"Cannot call '{name}()' on a read-only dataset. Use LeRobotDataset.create() for new "
                               "recording or LeRobotDataset.resume() for resume recording.")

    def add_frame(self, frame):
        """Adds one frame (every feature but timestamp/frame_index/episode_index/index/task_index,
        plus "task") to the current episode."""
        self._require_writer("add_frame")
        self.writer.add_frame(frame)

    def save_episode(self, episode_data=None, parallel_encoding=True):
        """Writes the current episode (videos, data rows, metadata, stats)."""
        self._require_writer("save_episode")
        self.writer.save_episode(episode_data, parallel_encoding)

    def clear_episode_buffer(self, delete_images=True):
        """Discards the frames added since the last save_episode()."""
        self._require_writer("clear_episode_buffer")
        self.writer.clear_episode_buffer(delete_images)

    def has_pending_frames(self):
        """Whether frames were added and not yet saved."""
        if not self._writing():
            return False
        return self.writer.episode_buffer is not None and self.writer.episode_buffer["size"] > 0

    def finalize(self):
        """Flushes pending videos and episode rows; the dataset then reads what was written.
        Idempotent."""
        if self._is_finalized or self.writer is None:
            return
        self.writer.finalize()
        self._is_finalized = True
        self.__class__ = _plain_class(self)
        root, settings = self.meta.root, self._write_settings
        if self.meta.total_episodes > 0:
            writer = self.writer
            type(self).__init__(self, self.repo_id, root=str(root), tolerance_s=settings["tolerance_s"],
                                video_backend=settings["video_backend"])
            self.writer, self._is_finalized = writer, True

    def push_to_hub(self, branch=None, tags=None, license="apache-2.0", tag_version=True, push_videos=True,
                    private=None, allow_patterns=None, upload_large_folder=False, **card_kwargs):
        """Refused: vlafeed has no Hub client."""
        _refuse("push_to_hub()", f"there is no Hub upload here; upload {self.meta.root} with huggingface_hub's "
                                 "HfApi().upload_folder(repo_type='dataset') (leave out images/)")

    # ---- read-side answers while recording ---------------------------------------------


class _DatasetRecordingOverlay:
    """Put before LeRobotDataset in a write-mode object's class: len() and the counts come from
    the metadata being written, reading raises until finalize() (as LeRobot)."""

    def _recording(self):
        return self.writer is not None and not self._is_finalized

    root = _overlay("_DatasetRecordingOverlay", "root", lambda self: self.meta.root)
    num_frames = _overlay("_DatasetRecordingOverlay", "num_frames", lambda self: self.meta.total_frames)
    num_episodes = _overlay("_DatasetRecordingOverlay", "num_episodes", lambda self: self.meta.total_episodes)

    def __len__(self):
        if self._writing():
            return self.meta.total_frames
        return super().__len__()

    def __getitem__(self, index):
        if self._writing():
            raise RuntimeError("Cannot read from a dataset that is being recorded. Call finalize() first, then "
                               "access items.")
        return super().__getitem__(index)

    def __repr__(self):
        if self._writing():
            return (f"vlafeed.LeRobotDataset(recording: repo_id={self.repo_id!r}, root={str(self.meta.root)!r}, "
                    f"episodes={self.meta.total_episodes}, frames={self.meta.total_frames})")
        return super().__repr__()
