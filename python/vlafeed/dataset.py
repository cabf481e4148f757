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

import numpy as np

from vlafeed import _native
from vlafeed.loader import batch_to_dict


class LeRobotDatasetMetadata:
    """What LeRobotDatasetMetadata offers, from the engine's view of the dataset."""

    def __init__(self, root_or_native, episodes=None, *, on_metadata_error="raise"):
        if isinstance(root_or_native, _native.Dataset):
            self._native = root_or_native
        else:
            self._native = _native.Dataset(os.fspath(root_or_native), episodes, on_metadata_error=on_metadata_error)
        self._info = None
        self._stats = None

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

    @property
    def total_frames(self):
        return self._native.total_frames

    @property
    def total_episodes(self):
        return self._native.total_episodes

    @property
    def total_tasks(self):
        return len(self._native.tasks)

    @property
    def features(self):
        """{name: {"dtype", "shape", "kind"}} in info.json order (shape a tuple)."""
        return self._native.features

    @property
    def shapes(self):
        return {name: f["shape"] for name, f in self.features.items()}

    @property
    def camera_keys(self):
        return self._native.camera_keys

    @property
    def video_keys(self):
        return self._native.camera_keys

    @property
    def image_keys(self):
        return [name for name, f in self.features.items() if f["dtype"] == "image"]

    @property
    def tasks(self):
        """Task strings by task_index."""
        return self._native.tasks

    @property
    def episodes(self):
        """Selected episodes: dicts of episode_index, length, from_index, to_index."""
        return self._native.episodes

    @property
    def stats(self):
        """{feature: {stat: numpy array}} (meta/stats.json), like LeRobot's."""
        if self._stats is None:
            self._stats = {
                feature: {name: np.asarray(values, dtype=np.float64) for name, values in per.items()}
                for feature, per in self._native.stats.items()
            }
        return self._stats

    def __repr__(self):
        return (f"LeRobotDatasetMetadata(root={self.root!r}, fps={self.fps}, total_episodes={self.total_episodes}, "
                f"total_frames={self.total_frames}, camera_keys={self.camera_keys})")


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
    """

    def __init__(self, root, episodes=None, delta_timestamps=None, image_format="float32", tolerance_s=1e-4, *,
                 keys=None, renames=None, resize=None, normalize=None, return_uint8=False, image_transforms=None,
                 lerobot_shapes=True, include_task=True, threads=None, output="torch",
                 on_metadata_error="raise"):
        if return_uint8:
            image_format = "uint8"
        self._config = dict(
            root=os.fspath(root), episodes=None if episodes is None else [int(e) for e in episodes],
            delta_timestamps=None if delta_timestamps is None else {k: [float(x) for x in v]
                                                                     for k, v in delta_timestamps.items()},
            image_format=image_format, tolerance_s=tolerance_s, keys=keys, renames=renames, resize=resize,
            normalize=normalize, lerobot_shapes=lerobot_shapes, include_task=include_task, threads=threads,
            output=output, on_metadata_error=on_metadata_error)
        self.image_transforms = image_transforms
        self._open()

    # ---- engine objects (per process) ----------------------------------------------

    def _open(self):
        c = self._config
        self._pid = os.getpid()
        self.native_dataset = _native.Dataset(c["root"], c["episodes"], on_metadata_error=c["on_metadata_error"])
        self.meta = LeRobotDatasetMetadata(self.native_dataset)
        threads = c["threads"]
        if threads is None:  # get_items spreads the cameras over threads; more do not help
            threads = max(1, min(os.cpu_count() or 1, len(self.native_dataset.camera_keys) or 1))
        self._loader = _native.Loader(
            self.native_dataset, mode="map", batch_size=1, shuffle=False, threads=threads, prefetch=1,
            delta_timestamps=c["delta_timestamps"], keys=c["keys"], renames=c["renames"],
            image_format=c["image_format"], resize=c["resize"], normalize=c["normalize"],
            lerobot_shapes=c["lerobot_shapes"], include_task=c["include_task"], tolerance_s=c["tolerance_s"],
            decoder_cache_entries=32)
        self._len = self._loader.num_positions

    def _ensure_process(self):
        # A forked child (DataLoader worker) inherits the engine objects without
        # their threads: open its own (the inherited loader is left unclosed by
        # the engine in that process).
        if self._pid != os.getpid():
            self._open()

    def __getstate__(self):
        return {"config": self._config, "image_transforms": self.image_transforms}

    def __setstate__(self, state):
        self._config = state["config"]
        self.image_transforms = state["image_transforms"]
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

    @property
    def fps(self):
        return self.meta.fps

    @property
    def num_frames(self):
        return self._len

    @property
    def num_episodes(self):
        return self.native_dataset.num_episodes

    @property
    def features(self):
        return self.meta.features

    @property
    def camera_keys(self):
        return self.meta.camera_keys

    @property
    def video_keys(self):
        return self.meta.video_keys

    def __len__(self):
        return self._len

    def __getitem__(self, index):
        try:
            i = int(index)
        except TypeError:
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {index} is out of range for a dataset of {self._len} frames")
        self._ensure_process()
        batch = self._loader.get_items([i])
        item = {name: value[0] for name, value in batch_to_dict(batch, self._config["output"]).items()}
        if self.image_transforms is not None:
            for key in self.camera_keys:
                name = (self._config["renames"] or {}).get(key, key)
                if name in item:
                    item[name] = self.image_transforms(item[name])
        return item

    def __repr__(self):
        return (f"vlafeed.LeRobotDataset(root={self.root!r}, episodes={self.num_episodes}, frames={self._len}, "
                f"fps={self.fps}, camera_keys={self.camera_keys})")
