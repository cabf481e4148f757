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
from vlafeed.data.recording import RecordingDatasetMixin, RecordingMetadataMixin

try:  # LeRobot's classes are torch Datasets; this module still imports where torch is absent
    from torch.utils.data import Dataset as _TorchDataset
except ImportError:  # pragma: no cover - exercised by test_lerobot_surface's no-torch subprocess
    _TorchDataset = object


def _native_property(name, doc=None):
    """A read-only property that returns the native dataset's attribute `name`."""
    return property(lambda self: getattr(self._native, name), doc=doc)


def _meta_property(name):
    """A read-only property that returns the metadata's attribute `name` (``ds.fps`` is ``ds.meta.fps``)."""
    return property(lambda self: getattr(self.meta, name), doc=f"``meta.{name}``")


class LeRobotDatasetMetadata(RecordingMetadataMixin):
    """LeRobot 0.6's LeRobotDatasetMetadata over the engine's dataset.

    LeRobotDatasetMetadata(repo_id=None, root=None, revision=None,
    force_cache_sync=False, metadata_buffer_size=10, *, repo_type="dataset",
    token=None, episodes=None, on_metadata_error="raise", video_mismatch=None):
    LeRobot's constructor, then vlafeed's keywords. repo_id may be the dataset
    folder or URL itself (vlafeed's older positional form), or an id found
    under $HF_LEROBOT_HOME; there is no Hub download, so force_cache_sync=True
    and repo_type="bucket" are refused by name and token is unused.
    metadata_buffer_size only matters for recording. ``info`` is info.json as
    LeRobot's DatasetInfo; ``vf_info`` is vlafeed's own report of the
    dataset. on_metadata_error="warn" loads a dataset whose metadata
    `vlafeed info` calls inconsistent, with a Python warning per problem
    (counted in metadata_errors_ignored).
    """

    def __init__(self, repo_id=None, root=None, revision=None, force_cache_sync=False, metadata_buffer_size=10, *,
                 repo_type="dataset", token=None, episodes=None, on_metadata_error="raise", video_mismatch=None):
        compat.refuse_hub_only(repo_type=repo_type, force_cache_sync=force_cache_sync)
        self.repo_type = repo_type
        if isinstance(repo_id, _native.Dataset):
            self._native, self.repo_id = repo_id, None
        else:
            resolved, self.repo_id = compat.resolve_root(repo_id, root)
            self._native = open_native_dataset(resolved, episodes, on_metadata_error, video_mismatch)
        # LeRobot: the revision asked for, else the codebase version it reads (token is only
        # used for Hub downloads, which vlafeed does not make; it is not kept, as in LeRobot).
        self.revision = revision if revision else compat.CODEBASE_VERSION
        self.latest_episode = None
        self._metadata_buffer_size = metadata_buffer_size
        self._vf_info = None
        self._stats = None
        self._tasks = None
        self._info = None
        self._episodes_table = None

    @property
    def native_dataset(self):
        """The open engine dataset (vlafeed.plan.* and vlafeed.Loader take this object
        and use it without reading the metadata again)."""
        return self._native

    # ---- LeRobot's raw info.json and the derived surface ---------------------------

    @property
    def info(self):
        """meta/info.json as LeRobot 0.6 gives it (its ``DatasetInfo``): ``meta.info.fps``,
        ``meta.info.features``, ``meta.info.to_dict()``, and ``meta.info["codebase_version"]``;
        keys LeRobot does not model (a v2.1 ``total_videos``, ...) are readable too."""
        if self._info is None:
            raw = compat.read_json(self.root, "meta/info.json")
            self._info = compat.DatasetInfo.from_json(raw, self._native)
        return self._info

    @info.setter
    def info(self, value):  # LeRobot's writers assign meta.info
        self._info = value

    @property
    def info_json(self):
        """meta/info.json as a plain dict (``meta.info.to_dict()`` with every key the file has)."""
        return self.info.as_json()

    @property
    def vf_info(self):
        """The `vlafeed info --json` document (problems, episodes, videos as the engine sees them)."""
        if self._vf_info is None:
            self._vf_info = self._native.info()
        return self._vf_info

    @property
    def url_root(self):
        """The Hub URL root LeRobot names the dataset by (``hf://datasets/<repo_id>``); vlafeed
        itself reads ``root``."""
        if self.repo_type == "bucket":
            return f"hf://buckets/{self.repo_id}"
        return f"hf://datasets/{self.repo_id}"

    @property
    def robot_type(self):
        return self.info.robot_type

    @property
    def chunks_size(self):
        return int(self.info.chunks_size)

    @property
    def data_files_size_in_mb(self):
        return self.info.data_files_size_in_mb

    @property
    def video_files_size_in_mb(self):
        return self.info.video_files_size_in_mb

    @property
    def data_path(self):
        return self.info.data_path

    @property
    def video_path(self):
        return self.info.video_path

    @property
    def tools(self):
        """The dataset's tool schemas (info.json "tools"), else LeRobot's default ``say`` tool."""
        declared = self.info.tools
        return [dict(t) for t in (declared or compat.DEFAULT_TOOLS)]

    @tools.setter
    def tools(self, value):
        """LeRobot's: writes the tool schemas into meta/info.json (removes them for None or []) and
        reloads ``meta.info``."""
        if compat.is_url(os.fspath(self.root)):
            raise ValueError(f"meta.tools = ...: {self.root} is remote; info.json can only be written locally")
        self.info.tools = [dict(t) for t in value] if value else None
        compat.write_info(self.info, self.root)
        self._info = None

    @property
    def names(self):
        """{feature: names} from info.json (LeRobot's ``meta.names``)."""
        return {key: ft.get("names") for key, ft in self.features.items()}

    @property
    def depth_keys(self):
        """Features whose info marks them as depth maps (LeRobot's rule)."""
        return [key for key, ft in self.features.items() if compat.is_depth_feature(ft)]

    @property
    def has_language_columns(self):
        """True when the dataset declares language_persistent or language_events."""
        return any(col in self.features for col in compat.LANGUAGE_COLUMNS)

    def rescale_depth_stats(self, output_unit):
        """LeRobot's: depth features' stats converted in place from their recorded unit
        (info's depth_unit) to output_unit ("m" or "mm"); count is left alone."""
        compat.check_depth_unit(output_unit)
        stats = self.stats
        for key in self.depth_keys:
            stored = (self.features[key].get("info") or {}).get("depth_unit")
            if stored is None or stored == output_unit or key not in stats:
                continue
            factor = 1000.0 if stored == "m" else 1.0 / 1000.0
            stats[key] = {name: v if name == "count" else v * factor for name, v in stats[key].items()}

    def ensure_readable(self):
        """LeRobot's write-to-read switch; a vlafeed metadata object is always readable."""

    def filter_episodes(self, predicate, candidates=None):
        """Sorted episode indices whose episodes-table row (no stats columns) satisfies predicate,
        restricted to candidates when given (LeRobot's ``filter_episodes``)."""
        wanted = None if candidates is None else {int(c) for c in candidates}
        return sorted(int(row["episode_index"]) for row in self.episodes
                      if (wanted is None or int(row["episode_index"]) in wanted) and predicate(row))

    @property
    def task_to_index(self):
        return {task: i for i, task in enumerate(self._native.tasks)}

    def get_task_index(self, task):
        """task_index of a task string in ``meta.tasks``, or None (as LeRobot)."""
        if task in self.tasks.index:
            return int(self.tasks.loc[task].task_index)
        return None

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
        return sum(1 for p in self.vf_info["problems"] if p["severity"] == "error" and p["file"].startswith("meta/")
                   and "stats" not in p["file"])

    @property
    def root(self):
        """The dataset folder as a pathlib.Path (LeRobot's type); an http(s):// or s3:// root stays a str."""
        return compat.root_path(self._native.root)

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
        """info.json's features (``meta.info.features``, the same dict, as in LeRobot): {name:
        {"dtype", "shape" (a tuple), "names", "info" (videos)}}, in the file's order; what
        dataset_to_policy_features and LeRobot's dataset tools read."""
        return self.info.features

    @property
    def shapes(self):
        return {name: tuple(f["shape"]) for name, f in self.features.items()}

    camera_keys = _native_property("camera_keys", "The video features' keys (LeRobot's camera_keys).")
    video_keys = _native_property("camera_keys", "The video features' keys (LeRobot's video_keys).")

    @property
    def image_keys(self):
        return [name for name, f in self.features.items() if f["dtype"] == "image"]

    @property
    def tasks(self):
        """LeRobot's task table: a pandas DataFrame indexed by the task string, column task_index
        (one object, as LeRobot's attribute: changes to it are kept)."""
        if self._tasks is None:
            self._tasks = compat.tasks_frame(self._native.tasks)
        return self._tasks

    @tasks.setter
    def tasks(self, value):  # LeRobot's code assigns meta.tasks / meta.episodes / meta.stats
        self._tasks = value

    task_list = _native_property("tasks", "Task strings by task_index (a list).")

    @property
    def episodes(self):
        """The full episodes table with LeRobot's column names (episode_index, tasks, length,
        dataset_from_index, dataset_to_index, data/..., videos/<key>/...; stats columns dropped):
        ``meta.episodes["dataset_from_index"]`` is a list, ``meta.episodes[i]`` a row dict."""
        if self._episodes_table is None:
            self._episodes_table = compat.episodes_table(self.root, self.info_json, self._all_episodes_fallback())
        return self._episodes_table

    @episodes.setter
    def episodes(self, value):
        self._episodes_table = value

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

    @stats.setter
    def stats(self, value):
        self._stats = value

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


class LeRobotDataset(RecordingDatasetMixin, _TorchDataset):
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

    LeRobot 0.6's constructor is LeRobotDataset's own, keyword for keyword
    and in its order: episode_filter (a predicate over meta.episodes rows,
    intersected with episodes), return_uint8, depth_output_unit, token; a
    duplicate in episodes is read once, as LeRobot does. video_backend and
    the encoder settings have no effect on reading (vlafeed reads the files
    in place with its own decoders, whose frames equal PyAV's and
    torchcodec's); download_videos=False means LeRobot's tabular only: items
    hold no camera key, no MP4 is opened or checked (the videos need not be
    there), and a camera key named in keys or delta_timestamps is refused. What needs the Hub is refused with an error
    naming the keyword: force_cache_sync=True, and a repo_id with no local
    copy; so are the deprecated write-mode settings (streaming_encoding,
    batch_encoding_size != 1); a depth-map camera is refused by the engine
    (no depth decoding yet; keys= can leave it out). on_metadata_error="warn"
    loads inconsistent metadata with a warning per problem;
    on_error="skip" leaves out episodes the open found unservable (listed in
    skipped_episodes); check_videos=0 skips the open-time video check.
    video_mismatch: None (the VF_VIDEO_MISMATCH environment variable, else
    "refuse"), "refuse" or "timestamp": what to do with a video file whose
    frame count disagrees with its episodes where its pts do not show where
    frames are missing (refuse every episode of it, or serve it by
    timestamp with a LoaderWarning per file).
    """

    def __init__(self, repo_id=None, root=None, episodes=None, episode_filter=None, image_transforms=None,
                 delta_timestamps=None, tolerance_s=1e-4, revision=None, force_cache_sync=False, download_videos=True,
                 video_backend=None, return_uint8=False, depth_output_unit=compat.DEFAULT_DEPTH_UNIT,
                 batch_encoding_size=1, rgb_encoder=None, depth_encoder=None, encoder_threads=None,
                 streaming_encoding=False, encoder_queue_maxsize=30, *, token=None, image_format="float32", keys=None,
                 renames=None, resize=None, normalize=None, lerobot_shapes=True, include_task=True, threads=None,
                 output="torch", on_metadata_error="raise", on_error="raise", check_videos=1, video_mismatch=None):
        if return_uint8:
            image_format = "uint8"
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", not {on_error!r}')
        compat.refuse_hub_only(force_cache_sync=force_cache_sync)
        compat.check_depth_unit(depth_output_unit)
        if streaming_encoding or batch_encoding_size != 1:
            raise NotImplementedError(
                "streaming_encoding / batch_encoding_size != 1 open LeRobotDataset for writing (deprecated in "
                "LeRobot 0.6 too): use LeRobotDataset.resume(repo_id, root=...) to append episodes")
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("image_transforms must be callable or None.")
        root, repo_id = compat.resolve_root(repo_id, root)
        if not download_videos and check_videos == 1:
            check_videos = 0  # tabular only: the MP4s are not read (and may not be there)
        # LeRobot's download/backend knobs have no effect here: vlafeed reads the
        # files in place (local or by URL) with its own decoders, whose frames
        # equal PyAV's and torchcodec's.
        self.repo_id, self.video_backend = repo_id, video_backend
        self.revision = revision if revision else compat.CODEBASE_VERSION
        self.download_videos = download_videos
        self.tolerance_s = tolerance_s
        self._depth_output_unit = depth_output_unit
        self.writer = None
        requested = None if episodes is None else [int(e) for e in episodes]
        if episode_filter is not None:
            meta = LeRobotDatasetMetadata(root=root, on_metadata_error=on_metadata_error,
                                          video_mismatch=video_mismatch)
            requested = meta.filter_episodes(episode_filter, candidates=requested)
            if not requested:
                raise ValueError("The episode filter did not match any episode. Make sure the filter and episodes "
                                 "list are valid and compatible.")
        # LeRobot keeps the list as given (its rows are selected by membership, so a duplicate is
        # read once); the engine is given each episode once, in ascending order.
        self._episodes_requested = requested
        self._config = dict(
            root=root, episodes=None if requested is None else sorted(set(requested)),
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
        self._index_map = None
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
                "lerobot": (self.repo_id, self.revision, self.video_backend, self.download_videos, self.tolerance_s,
                            self._depth_output_unit, self._episodes_requested)}

    def __setstate__(self, state):
        self._config = state["config"]
        self.image_transforms = state["image_transforms"]
        (self.repo_id, self.revision, self.video_backend, self.download_videos, self.tolerance_s,
         self._depth_output_unit, self._episodes_requested) = state["lerobot"]
        self.writer = None
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
        """The dataset folder as a pathlib.Path (LeRobot's type); an http(s):// or s3:// root stays a str."""
        return compat.root_path(self._config["root"])

    @property
    def episodes(self):
        """The episodes asked for, as given (LeRobot's), or None for all; after on_error="skip"
        left some out, the ones served."""
        if self.skipped_episodes:
            return [e["episode_index"] for e in self.native_dataset.episodes]
        return self._episodes_requested

    @property
    def depth_output_unit(self):
        """The unit ("m" or "mm") LeRobot returns depth maps in (vlafeed's engine refuses depth cameras)."""
        return self._depth_output_unit

    @property
    def absolute_to_relative_idx(self):
        """{absolute frame index (the "index" column): position in this dataset} when episodes
        were selected, else None (LeRobot's; EpisodeAwareSampler maps its indices through it)."""
        if self.episodes is None:
            return None
        if self._index_map is None:
            index = self.hf_dataset["index"]
            self._index_map = dict(zip((int(i) for i in index), range(len(index))))
        return self._index_map

    @property
    def reader(self):
        """What LeRobot scripts read from ``dataset.reader`` (hf_dataset, delta_indices, the index map)."""
        return _ReaderView(self)

    def set_image_transforms(self, image_transforms):
        """Replace the transform applied to each camera frame in __getitem__."""
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("image_transforms must be callable or None.")
        self.image_transforms = image_transforms

    def clear_image_transforms(self):
        """Remove the camera-frame transform."""
        self.image_transforms = None

    def select_columns(self, column_names):
        """The table restricted to column_names (a name or a list), as ``hf_dataset`` gives it."""
        return self.hf_dataset.select_columns(column_names)

    def get_raw_item(self, idx):
        """Row idx of the table: no frames decoded, no windows, no transforms (LeRobot's)."""
        return self.hf_dataset[idx]

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
        """LeRobot's: the number of episodes asked for (len(episodes)), else all of them."""
        return len(self.episodes) if self.episodes is not None else self.native_dataset.num_episodes

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


class MultiLeRobotDataset(_TorchDataset):
    """LeRobot 0.6's MultiLeRobotDataset on vlafeed: several LeRobotDatasets concatenated, only
    the features common to all of them kept (the others listed in disabled_features), each item
    with a ``dataset_index`` tensor, stats aggregated as LeRobot aggregates them.

    repo_ids are looked up as LeRobot does, as ``root / repo_id`` (root defaults to
    $HF_LEROBOT_HOME); episodes: {repo_id: [episode, ...]}; tolerances_s: {repo_id: seconds}.
    """

    def __init__(self, repo_ids, root=None, episodes=None, image_transforms=None, delta_timestamps=None,
                 tolerances_s=None, download_videos=True, video_backend=None, *, token=None):
        super().__init__()
        self.repo_ids = repo_ids
        self.root = pathlib.Path(root) if root else compat.lerobot_home()
        self.tolerances_s = tolerances_s if tolerances_s else dict.fromkeys(repo_ids, 0.0001)
        self._datasets = [
            LeRobotDataset(repo_id, root=self.root / repo_id, episodes=episodes[repo_id] if episodes else None,
                           image_transforms=image_transforms, delta_timestamps=delta_timestamps,
                           tolerance_s=self.tolerances_s[repo_id], download_videos=download_videos,
                           video_backend=video_backend, token=token)
            for repo_id in repo_ids]
        common = set(self._datasets[0].features)
        for ds in self._datasets:
            common.intersection_update(ds.features)
        if not common:
            raise RuntimeError("Multiple datasets were provided but they had no keys common to all of them. "
                               "The multi-dataset functionality currently only keeps common keys.")
        self.disabled_features = set()
        for repo_id, ds in zip(self.repo_ids, self._datasets):
            extra = set(ds.features).difference(common)
            if extra:
                warnings.warn(f"vlafeed: keys {sorted(extra)} of {repo_id} were disabled as they are not contained "
                              f"in all the other datasets.", stacklevel=2)
                self.disabled_features.update(extra)
        self.delta_timestamps = delta_timestamps
        self.stats = compat.aggregate_stats([ds.meta.stats for ds in self._datasets])
        self.set_image_transforms(image_transforms)

    def set_image_transforms(self, image_transforms):
        """Replace the transform for this dataset and its children."""
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("image_transforms must be callable or None.")
        self.image_transforms = image_transforms
        for ds in getattr(self, "_datasets", []):
            ds.set_image_transforms(image_transforms)

    def clear_image_transforms(self):
        """Remove the transform from this dataset and its children."""
        self.set_image_transforms(None)

    @property
    def repo_id_to_index(self):
        return {repo_id: i for i, repo_id in enumerate(self.repo_ids)}

    @property
    def fps(self):
        return self._datasets[0].meta.info.fps

    @property
    def video(self):
        return len(self._datasets[0].meta.video_keys) > 0

    @property
    def features(self):
        """{name: feature} of the kept features (LeRobot gives them as datasets.Features)."""
        out = {}
        for ds in self._datasets:
            out.update({k: v for k, v in ds.features.items() if k not in self.disabled_features})
        return out

    @property
    def camera_keys(self):
        return [k for k, f in self.features.items() if f["dtype"] in ("video", "image")]

    @property
    def video_frame_keys(self):
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    @property
    def num_frames(self):
        return sum(ds.num_frames for ds in self._datasets)

    @property
    def num_episodes(self):
        return sum(ds.num_episodes for ds in self._datasets)

    @property
    def tolerance_s(self):
        return 1 / self.fps - 1e-4

    def __len__(self):
        return self.num_frames

    def __getitem__(self, idx):
        if idx >= len(self):
            raise IndexError(f"Index {idx} out of bounds.")
        start = 0
        for dataset_index, ds in enumerate(self._datasets):
            if idx < start + ds.num_frames:
                break
            start += ds.num_frames
        item = ds[idx - start]
        import torch
        item["dataset_index"] = torch.tensor(dataset_index)
        for key in self.disabled_features:
            item.pop(key, None)
        return item

    def __repr__(self):
        return (f"vlafeed.MultiLeRobotDataset(repo_ids={self.repo_ids!r}, frames={self.num_frames}, "
                f"episodes={self.num_episodes}, fps={self.fps}, camera_keys={self.camera_keys})")


class _ReaderView:
    """What LeRobot scripts read from ``dataset.reader`` (its DatasetReader)."""

    def __init__(self, ds):
        self._ds = ds

    hf_dataset = property(lambda self: self._ds.hf_dataset)
    _absolute_to_relative_idx = property(lambda self: self._ds.absolute_to_relative_idx)
    delta_indices = property(lambda self: self._ds.delta_indices)
    num_frames = property(lambda self: self._ds.num_frames)
    num_episodes = property(lambda self: self._ds.num_episodes)
    episodes = property(lambda self: self._ds.episodes)
    root = property(lambda self: self._ds.root)

    def set_image_transforms(self, image_transforms):
        self._ds.set_image_transforms(image_transforms)

    def clear_image_transforms(self):
        self._ds.clear_image_transforms()


class _ColumnView:
    """What LeRobot scripts read from ``dataset.hf_dataset``: columns by name, rows by number,
    ``data`` (a pyarrow Table: ``hf_dataset.data.column("task_index").to_numpy()``),
    ``unique(column)`` and ``select_columns(names)``."""

    def __init__(self, ds, columns=None):
        self._ds = ds
        self._columns = columns

    @property
    def column_names(self):
        names = [n for n, f in self._ds.meta.features.items() if f["dtype"] not in ("video", "image", "language")]
        return names if self._columns is None else [n for n in self._columns if n in names]

    @property
    def num_rows(self):
        return len(self._ds)

    def __len__(self):
        return len(self._ds)

    def select_columns(self, column_names):
        """The same rows restricted to column_names (a name or a list of names)."""
        wanted = [column_names] if isinstance(column_names, str) else list(column_names)
        missing = [c for c in wanted if c not in self.column_names]
        if missing:
            raise ValueError(f"select_columns: no column {missing[0]!r} in {self._ds.root} "
                             f"(columns: {', '.join(self.column_names)})")
        return _ColumnView(self._ds, wanted)

    @property
    def data(self):
        """The selected episodes' rows as a pyarrow Table (what ``datasets.Dataset.data`` wraps)."""
        import pyarrow as pa
        c = self._ds._config
        names = self.column_names
        _, cols = _native.dataset_read_table(c["root"], names, [e["episode_index"] for e in
                                                                self._ds.native_dataset.episodes])
        arrays = {}
        for name in names:
            data, dtype, width = cols[name]
            if dtype == "str":
                arrays[name] = pa.array(list(data))
                continue
            arr = np.frombuffer(data, dtype=dtype)
            if tuple(self._ds.meta.features[name]["shape"]) != (1,):
                arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(arr), width)
            else:
                arrays[name] = pa.array(arr)
        return pa.table(arrays)

    def unique(self, column):
        """The column's distinct values in order of first appearance (``datasets.Dataset.unique``)."""
        values = self[column]
        if isinstance(values, list):
            return list(dict.fromkeys(values))
        if values.ndim != 1:
            raise TypeError(f"unique: column {column!r} holds vectors; datasets.Dataset.unique takes scalar columns")
        return list(dict.fromkeys(values.tolist()))

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
