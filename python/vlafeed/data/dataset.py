"""vlafeed.LeRobotDataset: LeRobot's map-style dataset on the C engine.

    ds = vlafeed.LeRobotDataset("/data/my-dataset", delta_timestamps={"action": [0.0, 0.1, 0.2]})
    len(ds)            # frames of the selected episodes
    item = ds[0]       # {"observation.images.front": float32 [3,H,W], ..., "action": [3,6],
                       #  "timestamp": 0-d, ..., "action_is_pad": bool [3], "task": str}
    ds.meta.fps, ds.meta.stats["action"]["mean"], ds.meta.camera_keys

Items are what ``lerobot.datasets.lerobot_dataset.LeRobotDataset.__getitem__``
returns (lerobot-format.md §7): video keys first, then the data columns, then
``<key>_is_pad`` masks for every key of delta_timestamps, then ``task``;
floats as float32, integers as int64, scalars 0-d; a single-delta video key
is squeezed to [C,H,W] while a single-delta vector stays [1,N]; padded
window steps repeat the episode's boundary frame.

The dataset can be pickled (DataLoader workers under any start method): the
engine objects are reopened in the process that uses them.
"""
import os
import pathlib
import warnings

import numpy as np

from vlafeed import _native
from vlafeed.data import lerobot_compat as compat
from vlafeed.data.loader import batch_to_dict, emit_warnings, open_native_dataset


def _native_property(name, doc=None):
    """A read-only property that returns the native dataset's attribute `name`."""
    return property(lambda self: getattr(self._native, name), doc=doc)


def _meta_property(name):
    """A read-only property that returns the metadata's attribute `name` (``ds.fps`` is ``ds.meta.fps``)."""
    return property(lambda self: getattr(self.meta, name), doc=f"``meta.{name}``")


class LeRobotDatasetMetadata:
    """LeRobot 0.6's LeRobotDatasetMetadata over the engine's dataset.

    LeRobotDatasetMetadata(repo_id=None, root=None, revision=None,
    force_cache_sync=False, *, episodes=None, on_metadata_error="raise"):
    repo_id may be the dataset folder or URL itself (vlafeed's older
    positional form), or an id found under $HF_LEROBOT_HOME; there is no Hub
    download. on_metadata_error="warn" loads a dataset whose metadata
    `vlafeed info` calls inconsistent, with a Python warning per problem
    (counted in metadata_errors_ignored).
    """

    def __init__(self, repo_id=None, root=None, revision=None, force_cache_sync=False, *, episodes=None,
                 on_metadata_error="raise", video_mismatch=None):
        if isinstance(repo_id, _native.Dataset):
            self._native, self.repo_id = repo_id, None
        else:
            resolved, self.repo_id = compat.resolve_root(repo_id, root)
            self._native = open_native_dataset(resolved, episodes, on_metadata_error, video_mismatch)
        self.revision = revision
        self._info = None
        self._stats = None
        self._info_json = None
        self._episodes_table = None
        self._features = None

    # ---- LeRobot's raw info.json and the derived surface ---------------------------

    @property
    def info_json(self):
        """meta/info.json as a dict (LeRobot's ``meta.info``)."""
        if self._info_json is None:
            self._info_json = compat.read_json(self.root, "meta/info.json") or {}
        return self._info_json

    @property
    def robot_type(self):
        return self.info_json.get("robot_type")

    @property
    def chunks_size(self):
        return int(self.info_json.get("chunks_size", compat.DEFAULT_CHUNK_SIZE))

    @property
    def data_path(self):
        return self.info_json.get("data_path")

    @property
    def video_path(self):
        return self.info_json.get("video_path")

    @property
    def task_to_index(self):
        return {task: i for i, task in enumerate(self._native.tasks)}

    def get_task_index(self, task):
        """task_index of a task string, or None (as LeRobot)."""
        return self.task_to_index.get(task)

    def _episode_row(self, ep_index):
        table = self.episodes
        if "episode_index" in table.column_names:
            indices = table["episode_index"]
            if ep_index in indices:
                return table[indices.index(ep_index)]
        raise IndexError(f"episode {ep_index} is not in the dataset")

    def get_data_file_path(self, ep_index):
        """The data Parquet of an episode, relative to the root (a Path)."""
        row = self._episode_row(int(ep_index))
        if "data/chunk_index" in row:
            return pathlib.Path(compat.format_path(self.data_path, chunk_index=row["data/chunk_index"],
                                                   file_index=row["data/file_index"]))
        return pathlib.Path(compat.format_path(self.data_path, episode_chunk=int(ep_index) // self.chunks_size,
                                               episode_index=int(ep_index)))

    def get_video_file_path(self, ep_index, vid_key):
        """An episode's MP4 of camera vid_key, relative to the root (a Path)."""
        row = self._episode_row(int(ep_index))
        if f"videos/{vid_key}/chunk_index" in row:
            return pathlib.Path(compat.format_path(self.video_path, video_key=vid_key,
                                                   chunk_index=row[f"videos/{vid_key}/chunk_index"],
                                                   file_index=row[f"videos/{vid_key}/file_index"]))
        return pathlib.Path(compat.format_path(self.video_path, video_key=vid_key,
                                               episode_chunk=int(ep_index) // self.chunks_size,
                                               episode_index=int(ep_index)))

    @property
    def selected_episodes(self):
        """The selected episodes: dicts of episode_index, length, from_index, to_index."""
        return self._native.episodes

    @property
    def metadata_errors_ignored(self):
        """Metadata errors let through by on_metadata_error="warn" (0 in the strict default)."""
        return sum(1 for p in self.info["problems"] if p["severity"] == "error" and p["file"].startswith("meta/")
                   and "stats" not in p["file"])

    @property
    def root(self):
        return self._native.root

    @property
    def info(self):
        """The `vlafeed info --json` document."""
        if self._info is None:
            self._info = self._native.info()
        return self._info

    @property
    def fps(self):
        fps = self._native.fps
        return int(fps) if float(fps).is_integer() else fps

    total_frames = _native_property("total_frames")
    total_episodes = _native_property("total_episodes")

    @property
    def total_tasks(self):
        return len(self._native.tasks)

    @property
    def features(self):
        """{name: {"dtype", "shape" (tuple), "names", "info" (videos), "kind"}} in info.json order, as
        LeRobot's meta.features (what dataset_to_policy_features reads); frame sizes are the files'."""
        if self._features is None:
            self._features = compat.lerobot_features(self.info_json, self._native.features)
        return self._features

    @property
    def shapes(self):
        return {name: f["shape"] for name, f in self.features.items()}

    camera_keys = _native_property("camera_keys", "The video features' keys (LeRobot's camera_keys).")
    video_keys = _native_property("camera_keys", "The video features' keys (LeRobot's video_keys).")

    @property
    def image_keys(self):
        return [name for name, f in self.features.items() if f["dtype"] == "image"]

    @property
    def tasks(self):
        """LeRobot's task table: a pandas DataFrame indexed by the task string, column task_index."""
        return compat.tasks_frame(self._native.tasks)

    task_list = _native_property("tasks", "Task strings by task_index (a list).")

    @property
    def episodes(self):
        """The full episodes table with LeRobot's column names (episode_index, tasks, length,
        dataset_from_index, dataset_to_index, data/..., videos/<key>/...; stats columns dropped):
        ``meta.episodes["dataset_from_index"]`` is a list, ``meta.episodes[i]`` a row dict."""
        if self._episodes_table is None:
            self._episodes_table = compat.episodes_table(self.root, self.info_json, self._all_episodes_fallback())
        return self._episodes_table

    def _all_episodes_fallback(self):
        rows = []
        if not compat.is_url(self.root):
            path = pathlib.Path(self.root) / "meta" / "episodes.jsonl"
            if path.is_file():
                import json
                start = 0
                for line in path.read_text().splitlines():
                    if line.strip():
                        e = json.loads(line)
                        rows.append({"episode_index": e["episode_index"], "length": e["length"],
                                     "from_index": start, "to_index": start + e["length"]})
                        start += e["length"]
                return rows
        return self._native.episodes

    @property
    def stats(self):
        """{feature: {stat: numpy array}} (meta/stats.json) with LeRobot's dtypes: count and integer
        features' min/max int64, the rest float64."""
        if self._stats is None:
            self._stats = compat.lerobot_stats(self._native.stats, self._native.features)
        return self._stats

    def __repr__(self):
        return (f"LeRobotDatasetMetadata(root={self.root!r}, fps={self.fps}, total_episodes={self.total_episodes}, "
                f"total_frames={self.total_frames}, camera_keys={self.camera_keys})")


def _tabular_only(meta, keys, delta_timestamps):
    """keys and delta_timestamps without the camera keys (download_videos=False). A camera
    key asked for by name is refused: there are no videos to read it from."""
    video = set(meta.video_keys) | set(meta.camera_keys)
    if keys is None:
        keys = [name for name in meta.features if name not in video]
    else:
        asked = [k for k in keys if k in video]
        if asked:
            raise ValueError(f"download_videos=False reads no video, but keys asks for {asked[0]!r}; leave "
                             f"the camera keys out of keys or set download_videos=True")
    if delta_timestamps is not None:
        asked = [k for k in delta_timestamps if k in video]
        if asked:
            raise ValueError(f"download_videos=False reads no video, but delta_timestamps has {asked[0]!r}")
    return keys, delta_timestamps


class LeRobotDataset:
    """Map-style LeRobot dataset: ``len(ds)``, ``ds[i]`` -> dict of torch tensors.

    root: the dataset folder (meta/info.json inside). episodes: episode
    indices to select (positions 0..len-1 then run over their frames in
    ascending episode order, as in LeRobot). delta_timestamps: {key:
    [seconds, ...]} windows, checked against the 1/fps grid within
    tolerance_s. image_format: "float32" ([C,H,W] in [0,1], LeRobot's
    default), "uint8" ([C,H,W], lerobot-train's return_uint8=True) or
    "uint8_hwc". return_uint8=True is the same as image_format="uint8".
    keys, renames, resize, normalize, lerobot_shapes, include_task: as for
    vlafeed.Loader. image_transforms: an optional callable applied to each
    camera tensor, as LeRobot does. output: "torch" (default) or "numpy".

    LeRobot 0.6's signature is accepted (repo_id, root, episodes,
    image_transforms, delta_timestamps, tolerance_s, revision,
    force_cache_sync, download_videos, video_backend, batch_encoding_size;
    the other download and backend knobs have no effect). download_videos=False
    means LeRobot's tabular only: items hold no camera key, no MP4 is opened
    or checked (the videos need not be there), and a camera key named in keys
    or delta_timestamps is refused. on_metadata_error="warn"
    loads inconsistent metadata with a warning per problem;
    on_error="skip" leaves out episodes the open found unservable (listed in
    skipped_episodes); check_videos=0 skips the open-time video check.
    video_mismatch: None (the VF_VIDEO_MISMATCH environment variable, else
    "refuse"), "refuse" or "timestamp": what to do with a video file whose
    frame count disagrees with its episodes where its pts do not show where
    frames are missing (refuse every episode of it, or serve it by
    timestamp with a LoaderWarning per file).
    """

    def __init__(self, repo_id=None, root=None, episodes=None, image_transforms=None, delta_timestamps=None,
                 tolerance_s=1e-4, revision=None, force_cache_sync=False, download_videos=True, video_backend=None,
                 batch_encoding_size=1, *, image_format="float32", keys=None, renames=None, resize=None,
                 normalize=None, return_uint8=False, lerobot_shapes=True, include_task=True, threads=None,
                 output="torch", on_metadata_error="raise", on_error="raise", check_videos=1, video_mismatch=None):
        if return_uint8:
            image_format = "uint8"
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", not {on_error!r}')
        root, repo_id = compat.resolve_root(repo_id, root)
        if not download_videos and check_videos == 1:
            check_videos = 0  # tabular only: the MP4s are not read (and may not be there)
        # LeRobot's download/backend knobs have no effect here: vlafeed reads the
        # files in place (local or by URL) with its own decoders, whose frames
        # equal PyAV's and torchcodec's.
        self.repo_id, self.revision, self.video_backend = repo_id, revision, video_backend
        self.download_videos = download_videos
        self._config = dict(
            root=root, episodes=None if episodes is None else [int(e) for e in episodes],
            delta_timestamps=None if delta_timestamps is None else {k: [float(x) for x in v]
                                                                     for k, v in delta_timestamps.items()},
            image_format=image_format, tolerance_s=tolerance_s, keys=keys, renames=renames, resize=resize,
            normalize=normalize, lerobot_shapes=lerobot_shapes, include_task=include_task, threads=threads,
            output=output, on_metadata_error=on_metadata_error, on_error=on_error, check_videos=check_videos,
            video_mismatch=video_mismatch)
        self.image_transforms = image_transforms
        self._open()

    # ---- engine objects (per process) ----------------------------------------------

    def _open(self):
        c = self._config
        self._pid = os.getpid()
        self.native_dataset = open_native_dataset(c["root"], c["episodes"], c["on_metadata_error"],
                                                  c.get("video_mismatch"), check_videos=c.get("check_videos", 1))
        self.skipped_episodes = []
        if c.get("on_error") == "skip":
            self._skip_bad_episodes()
        self.meta = LeRobotDatasetMetadata(self.native_dataset)
        self.meta.repo_id, self.meta.revision = self.repo_id, self.revision
        keys, delta_timestamps = c["keys"], c["delta_timestamps"]
        if not self.download_videos:  # LeRobot's "tabular only": no camera key is read
            keys, delta_timestamps = _tabular_only(self.meta, keys, delta_timestamps)
        threads = c["threads"]
        if threads is None:  # get_items spreads the cameras over threads; more do not help
            threads = max(1, min(os.cpu_count() or 1, len(self.native_dataset.camera_keys) or 1))
        self._loader = _native.Loader(
            self.native_dataset, mode="map", batch_size=1, shuffle=False, threads=threads, prefetch=1,
            delta_timestamps=delta_timestamps, keys=keys, renames=c["renames"],
            image_format=c["image_format"], resize=c["resize"], normalize=c["normalize"],
            lerobot_shapes=c["lerobot_shapes"], include_task=c["include_task"], tolerance_s=c["tolerance_s"],
            decoder_cache_entries=32, log_warnings=False)
        self._len = self._loader.num_positions
        self._warned = emit_warnings(self._loader)

    def _skip_bad_episodes(self):
        """on_error="skip": leaves out the selected episodes the open found
        unservable (their video frames cannot be matched exactly, or their
        data/video file is damaged or missing), with one warning each;
        skipped_episodes lists them."""
        c = self._config
        selected = [e["episode_index"] for e in self.native_dataset.episodes]
        bad = {}
        for p in self.native_dataset.info()["problems"]:
            if p["severity"] == "error" and p["episode"] is not None and p["episode"] in selected and \
                    (p["file"].startswith("videos/") or p["file"].startswith("data/")):
                bad.setdefault(p["episode"], f'{p["file"]}: {p["message"]}')
        if not bad:
            return
        keep = [e for e in selected if e not in bad]
        if not keep:
            raise _native.VlafeedError(f"{c['root']}: on_error=\"skip\" would skip every selected episode; first: "
                                       f"{next(iter(bad.values()))}")
        for episode, why in sorted(bad.items()):
            warnings.warn(f"vlafeed: episode {episode} skipped (on_error=\"skip\"): {why}", stacklevel=4)
        self.skipped_episodes = sorted(bad)
        self.native_dataset = open_native_dataset(c["root"], keep, c["on_metadata_error"], c.get("video_mismatch"),
                                                  check_videos=c.get("check_videos", 1))

    def _ensure_process(self):
        # A forked child (DataLoader worker) inherits the engine objects without
        # their threads: open its own (the inherited loader is left unclosed by
        # the engine in that process).
        if self._pid != os.getpid():
            self._open()

    def __getstate__(self):
        return {"config": self._config, "image_transforms": self.image_transforms,
                "lerobot": (self.repo_id, self.revision, self.video_backend, self.download_videos)}

    def __setstate__(self, state):
        self._config = state["config"]
        self.image_transforms = state["image_transforms"]
        self.repo_id, self.revision, self.video_backend, self.download_videos = state["lerobot"]
        self._open()

    # ---- LeRobotDataset surface -------------------------------------------------------

    @property
    def loader_defaults(self):
        """The sample settings a vlafeed.Loader over this dataset inherits."""
        c = self._config
        return {k: c[k] for k in ("delta_timestamps", "image_format", "tolerance_s", "keys", "renames", "resize",
                                  "normalize")}

    @property
    def root(self):
        return self._config["root"]

    @property
    def episodes(self):
        return self._config["episodes"]

    @property
    def delta_timestamps(self):
        return self._config["delta_timestamps"]

    @property
    def delta_indices(self):
        """{key: [frame offsets]} (round(delta * fps))."""
        if self.delta_timestamps is None:
            return None
        fps = self.native_dataset.fps
        return {k: [int(round(d * fps)) for d in v] for k, v in self.delta_timestamps.items()}

    fps = _meta_property("fps")

    @property
    def num_frames(self):
        return self._len

    @property
    def num_episodes(self):
        return self.native_dataset.num_episodes

    features = _meta_property("features")
    camera_keys = _meta_property("camera_keys")
    video_keys = _meta_property("video_keys")

    @property
    def hf_dataset(self):
        """What LeRobot scripts read from hf_dataset: ``ds.hf_dataset["action"]`` -> numpy array of the
        selected episodes' rows (numeric columns), ``ds.hf_dataset[i]`` -> row i's table values (no
        frames, no task string; torch tensors as LeRobot's transform gives them), ``hf_dataset[a:b]``
        -> {column: [values]}, ``len(ds.hf_dataset)``, ``column_names``."""
        return _ColumnView(self)

    def __len__(self):
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        try:
            i = int(index)
        except TypeError:
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {index} is out of range for a dataset of {self._len} frames")
        self._ensure_process()
        try:
            batch = self._loader.get_items([i])
        finally:  # what reading said (a frame size other than info.json's, ...): also when it failed
            if self._loader.num_warnings > self._warned:
                self._warned = emit_warnings(self._loader, self._warned)
        item = {name: value[0] for name, value in batch_to_dict(batch, self._config["output"]).items()}
        if self.image_transforms is not None:
            for key in self.camera_keys:
                name = (self._config["renames"] or {}).get(key, key)
                if name in item:
                    item[name] = self.image_transforms(item[name])
        return item

    def __repr__(self):
        return (f"vlafeed.LeRobotDataset(repo_id={self.repo_id!r}, root={self.root!r}, episodes={self.num_episodes}, frames={self._len}, "
                f"fps={self.fps}, camera_keys={self.camera_keys})")


class _ColumnView:
    """What LeRobot scripts read from ``dataset.hf_dataset``: columns by name."""

    def __init__(self, ds):
        self._ds = ds

    @property
    def column_names(self):
        return [n for n, f in self._ds.meta.features.items() if f["dtype"] not in ("video", "image", "language")]

    def __len__(self):
        return len(self._ds)

    def _row(self, i):
        """Row i of the selected episodes' table, as LeRobot's hf_dataset gives it (its torch
        transform): the non-video columns only, vectors as float32 tensors, scalars as 0-d
        tensors; no frames, no task string."""
        import bisect
        import torch
        n = len(self._ds)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range ({n} rows)")
        eps = self._ds.native_dataset.episodes
        if getattr(self, "_starts", None) is None:
            self._starts = [0]
            for e in eps:
                self._starts.append(self._starts[-1] + e["length"])
        k = bisect.bisect_right(self._starts, i) - 1
        cached = getattr(self, "_episode_rows", None)
        if cached is None or cached[0] != k:
            names = self.column_names
            _, cols = _native.dataset_read_table(self._ds._config["root"], names, [eps[k]["episode_index"]])
            cached = (k, cols)
            self._episode_rows = cached
        row = {}
        local = i - self._starts[k]
        for name, (data, dtype, width) in cached[1].items():
            if dtype == "str":
                row[name] = data[local]
                continue
            arr = np.frombuffer(data, dtype=dtype).reshape(-1, width)[local]
            shape = tuple(self._ds.meta.features[name]["shape"])
            row[name] = torch.from_numpy(arr.copy()) if shape != (1,) else torch.tensor(arr[0])
        return row

    def __getitem__(self, column):
        if isinstance(column, (int, np.integer)):
            return self._row(int(column))
        if isinstance(column, slice):
            rows = [self._row(i) for i in range(*column.indices(len(self)))]
            return {k: [r[k] for r in rows] for k in (rows[0] if rows else {})}
        if not isinstance(column, str):
            raise TypeError(f"hf_dataset[...] takes a column name, a row number or a slice, not {type(column).__name__}")
        if column not in self.column_names:
            raise KeyError(f"no column {column!r} (columns: {', '.join(self.column_names)})")
        c = self._ds._config
        starts, cols = _native.dataset_read_table(c["root"], [column], [e["episode_index"] for e in
                                                                          self._ds.native_dataset.episodes])
        data, dtype, width = cols[column]
        if dtype == "str":
            return list(data)
        arr = np.frombuffer(data, dtype=dtype)
        shape = self._ds.meta.features[column]["shape"]
        return arr.reshape(-1, width) if tuple(shape) != (1,) else arr.copy()
