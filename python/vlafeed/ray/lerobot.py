"""vlafeed.ray.lerobot: LeRobot datasets as Ray Data datasets, decoded by the C engine
inside each Ray read task.

    import ray, vlafeed.ray
    source = vlafeed.ray.LeRobotDatasource("/data/ds", image_format="float32",
                                           renames={"observation.images.cam0": "front"})
    source.meta.total_frames, source.meta.video_keys, source.meta.stats["action"]["mean"]
    ds = ray.data.read_datasource(source)            # or vlafeed.ray.read_lerobot("/data/ds", ...)
    for batch in ds.iter_torch_batches(batch_size=64, collate_fn=vlafeed.ray.TorchCollate()):
        batch["front"]          # float32 [64, 3, H, W] in [0, 1]
        batch["task"]           # int64 [64]: index into source.meta.task_list

What happens where:

- On the driver, the constructor opens the metadata only (info.json, the
  episodes and tasks tables, stats) and lists the read tasks with
  ``vlafeed.data.plan.tasks`` (file groups by default: a run of episodes stored
  in the same MP4 of the primary camera). No data or video file is read on
  the driver. ``source.meta`` is plain picklable data.
- Each read task reopens the metadata restricted to its episodes, runs a
  stream-mode ``vlafeed.Loader`` over exactly them with ``rank=0,
  world_size=1`` pinned (RANK / WORLD_SIZE of the worker's environment are
  ignored), ``shuffle=False`` and one engine thread (a Ray task is given
  one CPU), and turns each engine batch of at most ``rows_per_block`` rows
  into an Arrow table: fixed-shape tensor columns (pyarrow's
  ``fixed_shape_tensor`` extension type over the engine's batch memory, no
  copy; ``iter_torch_batches`` turns them into tensors), scalars as plain
  columns, and ``task`` dictionary-encoded over the dataset's whole task
  list (so its indices are ``task_index``). Images are decoded, renamed,
  resized, converted (uint8 HWC / uint8 CHW / float32 CHW in [0, 1]) and
  vectors normalized from the stats in C, straight into the batch memory.
  Each MP4 of the task is opened once and decoded forward.
- ``delta_timestamps`` windows are exact: a window never leaves its episode
  (positions are clamped to the episode with ``<key>_is_pad`` masks, as in
  LeRobot) and a task holds whole episodes.
- Each ReadTask's ``BlockMetadata`` carries the task's rows, its decoded size
  in bytes (for Ray's memory-based backpressure and scheduling) and its
  files.

Errors: a read error raises ``VlafeedRayError`` naming the task id, its
episode range and the engine's message (which names the file and episode);
Ray's retry settings apply to it as to any task (``ray_remote_args``, e.g.
``{"max_retries": 0}``). With ``on_error="skip"`` the task instead retries
the failing part episode by episode, drops only the episodes that cannot be
read, and records each drop (task, episode, rows, message) in a small
ledger actor (one per Ray session): ``source.skipped()`` returns them, and nothing is dropped
without a record.
"""
import functools
import os
import resource
import time
import uuid

import numpy as np

from vlafeed import _native
from vlafeed.data.dataset import LeRobotDatasetMetadata
from vlafeed.data.loader import Loader
from vlafeed.data import plan as data_plan
from vlafeed.ray._common import VlafeedRayError, _array_column, _ledger, _ray  # noqa: F401

__all__ = ["LeRobotDatasource", "read_lerobot", "TorchCollate", "VlafeedRayError", "RayMeta",
           "loader_for_train_worker"]

PARTITIONINGS = {"file_group": "file_group", "episode": "episode", "sequential": "sequential"}
IMAGE_BYTES = {"uint8_hwc": 1, "uint8": 1, "float32": 4}


class RayMeta:
    """The dataset's metadata as plain data (picklable): what the driver read.

    Attributes mirror LeRobot's names: fps, total_frames, total_episodes,
    video_keys (= camera_keys), features (names -> dtype/shape), tasks
    (task strings by task_index; also ``task_list``), stats ({feature:
    {stat: ndarray}}), episodes (selected episodes: episode_index, length,
    from_index, to_index)."""

    def __init__(self, meta):
        self.root = meta.root
        self.fps = meta.fps
        self.total_frames = sum(int(e["length"]) for e in meta.selected_episodes)
        self.total_episodes = len(meta.selected_episodes)
        self.video_keys = list(meta.video_keys)
        self.camera_keys = self.video_keys
        self.features = {k: dict(v) for k, v in meta.features.items()}
        self.tasks = list(meta.task_list)
        self.task_list = self.tasks
        self.stats = {k: dict(v) for k, v in meta.stats.items()}
        self.episodes = [dict(e) for e in meta.selected_episodes]

    def __repr__(self):
        return (f"RayMeta(root={self.root!r}, fps={self.fps}, total_episodes={self.total_episodes}, "
                f"total_frames={self.total_frames}, video_keys={self.video_keys})")


# ---- the read task --------------------------------------------------------------------------


def _arrow_table(batch, task_dictionary):
    """Engine batch (dict of ndarrays / lists) -> pyarrow.Table with fixed-shape tensor columns."""
    import pyarrow as pa

    names, columns = [], []
    task_index = batch.get("task_index")
    for name, value in batch.items():
        if isinstance(value, list):
            if name == "task" and task_dictionary is not None and task_index is not None:
                indices = pa.array(np.asarray(task_index, dtype=np.int32))
                column = pa.DictionaryArray.from_arrays(indices, task_dictionary)
            else:
                column = pa.array(value, type=pa.string())
        else:
            column = _array_column(value)
        names.append(name)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=names)


# The dataset each Ray worker process opened for the datasource whose task it ran last: (key, Dataset).
# A task's episodes are a subset of it (Dataset.subset: no metadata file read again, cost in proportion
# to the task), so a worker reads the metadata once per datasource, as a rank does, and not once per
# task (at a million episodes a reopen costs seconds). One entry: a worker holds one model at a time.
_WORKER_DATASET = []


def _task_dataset(spec, episodes):
    key = (spec["root"], spec.get("source_id"))
    if not _WORKER_DATASET or _WORKER_DATASET[0][0] != key:
        _WORKER_DATASET.clear()
        # The files are checked when the loader first maps them (not indexed twice).
        _WORKER_DATASET.append((key, _native.Dataset(spec["root"], check_videos=False, check_files=False)))
    return _WORKER_DATASET[0][1].subset([int(e) for e in episodes])


def _loader_for(spec, episodes):
    """A stream loader over exactly `episodes` (dataset episode indices), pinned to rank 0 of 1."""
    native = _task_dataset(spec, episodes)
    kw = dict(spec["loader"])
    return Loader(native, mode="stream", batch_size=spec["rows_per_block"], seed=0, shuffle=False,
                  drop_last=False, rank=0, world_size=1, output="numpy", **kw)


def _stats_record(stats):
    return {k: stats.get(k, 0) for k in ("frames_decoded", "frames_delivered", "video_opens")}


def _read_task(spec, task):
    """Runs in a Ray worker: yields Arrow tables of at most rows_per_block rows for `task`."""
    import pyarrow as pa

    t0 = time.process_time()
    wall0 = time.perf_counter()
    episodes = task["episode_indices"]
    lengths = task["lengths"]
    where = (f"vlafeed.ray task {task['id']} (episodes {episodes[0]}..{episodes[-1]}, "
             f"{sum(lengths)} rows of {spec['root']})")
    dictionary = pa.array(spec["tasks"], type=pa.string()) if spec["include_task"] else None
    ledger = spec.get("ledger")
    totals = {"frames_decoded": 0, "frames_delivered": 0, "video_opens": 0}
    delivered = 0
    skipped_rows = 0

    def add_stats(loader):
        for k, v in _stats_record(loader.stats()).items():
            totals[k] += v

    # First the whole task in one loader (each MP4 opened once); on an error
    # under on_error="skip", the rest episode by episode.
    failure = None
    loader = None
    try:
        loader = _loader_for(spec, episodes)
        for batch in loader:
            table = _arrow_table(batch, dictionary)
            delivered += table.num_rows
            yield table
    except _native.VlafeedError as e:
        failure = e
    except Exception as e:  # an OSError from the I/O layer, a ValueError from a bad setting
        if isinstance(e, (ValueError, TypeError)) and loader is None:
            raise VlafeedRayError(f"{where}: {e}") from e
        failure = e
    finally:
        if loader is not None:
            add_stats(loader)
            loader.close()
    if failure is not None:
        if spec["on_error"] != "skip":
            raise VlafeedRayError(f"{where}: {failure}") from failure
        # Rows came out in episode order (shuffle=False): find where the task stopped.
        start = 0
        resume_at = 0
        for i, n in enumerate(lengths):
            if delivered < start + n:
                resume_at = i
                break
            start += n
        else:
            resume_at = len(lengths)
        offset = delivered - start  # rows of episode `resume_at` already delivered
        for i in range(resume_at, len(episodes)):
            got = 0
            one = None
            try:
                one = _loader_for(spec, [episodes[i]])
                for batch in one:
                    table = _arrow_table(batch, dictionary)
                    n = table.num_rows
                    if got + n <= offset:
                        got += n
                        continue
                    if got < offset:
                        table = table.slice(offset - got)
                    got += n
                    delivered += table.num_rows
                    yield table
            except Exception as e:  # noqa: BLE001 - recorded and counted below
                lost = lengths[i] - max(got, offset)
                skipped_rows += lost
                record = {"task": task["id"], "episode": int(episodes[i]), "rows": int(lost), "error": str(e)}
                if ledger is not None:
                    _ray().get(ledger.skip.remote(spec["source_id"], record))
            finally:
                if one is not None:
                    add_stats(one)
                    one.close()
            offset = 0
    if ledger is not None:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        record = {"task": task["id"], "pid": os.getpid(), "rows": delivered, "skipped_rows": skipped_rows,
                  "cpu_s": time.process_time() - t0, "wall_s": time.perf_counter() - wall0,
                  "peak_rss_bytes": peak_kb * 1024, **totals}
        _ray().get(ledger.done.remote(spec["source_id"], record))


# ---- the datasource -------------------------------------------------------------------------


def _import_datasource():
    _ray()
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
    return Datasource, ReadTask, BlockMetadata


_Datasource, _ReadTask, _BlockMetadata = _import_datasource()


class LeRobotDatasource(_Datasource):
    """A LeRobot v3.0 / v2.1 dataset (local folder, http(s):// or s3:// root) as a Ray Data source.

    Arguments:
      path: the dataset root.
      episodes: dataset episode indices to read (default: all).
      partitioning: "file_group" (default: one task per run of episodes in one
        primary-camera MP4), "episode" (one task per episode) or "sequential"
        (the episodes cut into `parallelism` contiguous runs; Ray's
        override_num_blocks sets it).
      rows_per_block: the most rows in one output block (default 128).
      delta_timestamps, keys, renames, image_format ("uint8_hwc" default,
        "uint8" = CHW, "float32" = CHW in [0, 1]), resize ((w, h)), normalize
        ({key: "mean_std" | "min_max"} from the stats), tolerance_s,
        include_task: as for vlafeed.Loader, applied in C inside each task.
      threads / decode_threads: engine threads per read task (default 1 / 1:
        Ray gives a task one CPU; raise both with ray_remote_args num_cpus).
      prefetch: engine batches assembled ahead inside a task (each up to
        rows_per_block rows; bounds the task's memory with rows_per_block).
      on_error: "raise" (default) or "skip" (episodes that cannot be read are
        dropped, counted and listed by ``skipped()``).
      report: keep a ledger actor that records each finished task's rows,
        MP4 opens, frames decoded, CPU seconds and peak RSS (``report()``);
        on by default, forced on by on_error="skip".
    """

    def __init__(self, path, *, episodes=None, partitioning="file_group", rows_per_block=128,
                 delta_timestamps=None, keys=None, renames=None, image_format="uint8_hwc", resize=None,
                 normalize=None, tolerance_s=1e-4, include_task=True, threads=1, decode_threads=1,
                 prefetch=2, on_error="raise", report=True):
        super().__init__()
        if partitioning not in PARTITIONINGS:
            raise ValueError(f"partitioning must be one of {sorted(PARTITIONINGS)}, not {partitioning!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if image_format not in IMAGE_BYTES:
            raise ValueError(f"image_format must be one of {sorted(IMAGE_BYTES)}, not {image_format!r}")
        if int(rows_per_block) < 1:
            raise ValueError(f"rows_per_block must be >= 1, not {rows_per_block!r}")
        self.path = os.fspath(path) if not isinstance(path, str) else path
        self.partitioning = partitioning
        self.rows_per_block = int(rows_per_block)
        self.on_error = on_error
        self._want_report = bool(report) or on_error == "skip"
        self._ledger = None
        self._source_id = uuid.uuid4().hex
        # Metadata only: no data footer, no video header, no stat of a data/video file.
        native = _native.Dataset(self.path, episodes, check_videos=False, check_files=False)
        meta = LeRobotDatasetMetadata(native)
        self.meta = RayMeta(meta)
        self._episode_list = [int(e["episode_index"]) for e in self.meta.episodes]
        self._lengths = [int(e["length"]) for e in self.meta.episodes]
        self._loader_kwargs = dict(delta_timestamps=delta_timestamps, keys=keys, renames=renames,
                                   image_format=image_format, resize=resize, normalize=normalize,
                                   tolerance_s=tolerance_s, include_task=include_task, threads=threads,
                                   decode_threads=decode_threads, prefetch=prefetch)
        self._include_task = include_task
        self._row_bytes = self._estimate_row_bytes(meta, image_format, resize, delta_timestamps)
        self._selection = episodes
        self._task_cache = {}
        if partitioning != "sequential":
            self._task_cache[None] = self._plan(native, 1)

    def _estimate_row_bytes(self, meta, image_format, resize, delta_timestamps):
        """Decoded bytes of one output row (images in the output format, windows included)."""
        deltas = delta_timestamps or {}
        total = 0
        for name, f in self.meta.features.items():
            shape = tuple(f.get("shape") or ())
            steps = max(1, len(deltas.get(name, [0])))
            if f.get("dtype") in ("video", "image"):
                if resize:
                    h, w, c = int(resize[1]), int(resize[0]), 3
                else:
                    dims = sorted(shape)
                    c = 3
                    h, w = (dims[-2], dims[-1]) if len(dims) >= 2 else (1, 1)
                total += steps * h * w * c * IMAGE_BYTES[image_format]
            else:
                count = int(np.prod(shape)) if shape else 1
                total += steps * count * 8
        return max(total, 8)

    def _plan(self, native, parallelism):
        world = max(1, min(int(parallelism), len(self._episode_list))) if self.partitioning == "sequential" else 1
        raw = data_plan.tasks(native, partition=PARTITIONINGS[self.partitioning], world_size=world,
                                 video_files=True)
        out = []
        for t in raw:
            first, count = t["episodes"]
            eps = self._episode_list[first:first + count]
            lengths = self._lengths[first:first + count]
            files = t.get("video_files") or {}
            if isinstance(files, dict):
                files = [f for cam in files.values() for f in cam]
            out.append({"id": int(t["id"]), "episode_indices": eps, "lengths": lengths,
                        "rows": int(sum(lengths)), "video_files": [self._join(f) for f in files]})
        return out

    def _join(self, relative):
        return self.path.rstrip("/") + "/" + relative

    def read_tasks_plan(self, parallelism=1):
        """The read tasks as dicts: id, episode_indices, lengths, rows, video_files (no file opened)."""
        key = None if self.partitioning != "sequential" else int(parallelism)
        if key not in self._task_cache:
            native = _native.Dataset(self.path, self._selection, check_videos=False, check_files=False)
            self._task_cache[key] = self._plan(native, parallelism)
        return self._task_cache[key]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_task_cache"] = {}  # recomputed on demand (the plan is pure metadata)
        return state

    def get_name(self):
        return "VlafeedLeRobot"

    def estimate_inmemory_data_size(self):
        return self.meta.total_frames * self._row_bytes

    def _ensure_ledger(self):
        if self._want_report and self._ledger is None:
            self._ledger = _ledger()
        return self._ledger

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
        spec = {"root": self.path, "rows_per_block": self.rows_per_block, "loader": self._loader_kwargs,
                "tasks": self.meta.tasks, "include_task": self._include_task, "on_error": self.on_error,
                "ledger": self._ensure_ledger(), "source_id": self._source_id}
        read_tasks = []
        for task in self.read_tasks_plan(parallelism):
            size = task["rows"] * self._row_bytes
            metadata = _BlockMetadata(num_rows=task["rows"], size_bytes=size,
                                      input_files=task["video_files"], exec_stats=None)
            read_tasks.append(_ReadTask(functools.partial(_read_task, spec, task), metadata,
                                        per_task_row_limit=per_task_row_limit))
        return read_tasks

    def report(self):
        """{"skipped": [{task, episode, rows, error}], "tasks": [{task, pid, rows, skipped_rows,
        cpu_s, wall_s, peak_rss_bytes, frames_decoded, frames_delivered, video_opens}]}, from
        every read task run so far (a task Ray retried appears once per attempt that finished)."""
        if self._ledger is None:
            return {"skipped": [], "tasks": []}
        return _ray().get(self._ledger.report.remote(self._source_id))

    def skipped(self):
        """The episodes on_error="skip" dropped: [{task, episode, rows, error}]."""
        return self.report()["skipped"]

    def skipped_rows(self):
        return sum(r["rows"] for r in self.skipped())


def read_lerobot(path, *, ray_remote_args=None, override_num_blocks=None, concurrency=None, **kwargs):
    """ray.data.Dataset over a LeRobot dataset, decoded by vlafeed inside each read task.
    kwargs go to LeRobotDatasource; ray_remote_args (e.g. {"max_retries": 1, "num_cpus": 2}),
    override_num_blocks and concurrency to ray.data.read_datasource. Build the
    LeRobotDatasource yourself when you need its ``meta``, ``report()`` or ``skipped()``."""
    ray = _ray()
    source = LeRobotDatasource(path, **kwargs)
    return ray.data.read_datasource(source, ray_remote_args=ray_remote_args,
                                    override_num_blocks=override_num_blocks, concurrency=concurrency)


# ---- torch side -----------------------------------------------------------------------------


def _collate_base():
    from ray.data.collate_fn import DefaultCollateFn
    return DefaultCollateFn


class TorchCollate(_collate_base()):
    """``iter_torch_batches(collate_fn=TorchCollate())``: Ray's default tensor conversion, except
    that dictionary-encoded columns (vlafeed's ``task``) become int64 tensors of their indices
    (= task_index; the strings are ``source.meta.task_list``) instead of failing as strings.
    ``strings=True`` also keeps them as a list of str under ``<name>_str``."""

    def __init__(self, *args, strings=False, combine_chunks=True, **kwargs):
        super().__init__(*args, combine_chunks=combine_chunks, **kwargs)
        self.strings = strings

    def __call__(self, batch):
        import pyarrow as pa
        import torch

        extra = {}
        keep = []
        for name in batch.column_names:
            column = batch.column(name)
            if pa.types.is_dictionary(column.type) or pa.types.is_string(column.type):
                if pa.types.is_dictionary(column.type):
                    indices = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in column.chunks]) \
                        if column.num_chunks else np.zeros(0, np.int32)
                    extra[name] = torch.from_numpy(indices.astype(np.int64))
                if self.strings or not pa.types.is_dictionary(column.type):
                    extra[name + "_str" if pa.types.is_dictionary(column.type) else name] = column.to_pylist()
            else:
                keep.append(name)
        out = super().__call__(batch.select(keep))
        out = dict(out)
        out.update(extra)
        return out


def loader_for_train_worker(path, *, state=None, device=None, **kwargs):
    """A ``vlafeed.Loader`` for the calling Ray Train worker: rank and world size from
    ``ray.train.get_context()``, optionally restored from a ``state_dict()`` saved in a Ray
    checkpoint, so a restarted worker continues sample for sample (see docs/ray.md, exact resume).
    device: None (host memory), "auto" (the worker's device from ``ray.train.torch.get_device()``:
    its GPU when Ray Train gave it one, else host memory) or a device such as "cuda:0": batches
    are delivered as tensors on it (see docs/gpus.md, batches on the device)."""
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if device == "auto":
        import ray.train.torch

        device = ray.train.torch.get_device()
        device = device if device.type == "cuda" else None
    return Loader(path, rank=rank, world_size=world, state=state, device=device, **kwargs)
