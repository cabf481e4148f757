"""vlafeed.Loader: batches from the C engine as dicts of torch tensors.

    loader = vlafeed.Loader("/data/my-dataset", mode="stream", batch_size=64, seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:          # {"observation.images.front": [B,3,H,W] float32, ...}
            ...

Tensors VIEW the engine's batch memory (no copy): the batch buffer goes back
to the engine's pool when the last tensor viewing it is gone. Keep a tensor
beyond the step only if you mean to hold that buffer; ``.clone()`` otherwise.

Distribution: ``rank``/``world_size`` default to torch.distributed's when it
is initialised, else to the RANK / WORLD_SIZE environment variables, else
0 / 1. Every rank gets the same number of samples per epoch (see
include/vlafeed/loader.h for the remainder rule); when the world size does
not divide an epoch evenly, or a consumer gets nothing, the loader says so
with a ``LoaderWarning`` (and counts it in ``stats()``).

Resume: ``state = loader.state_dict()`` (a dict of integers and names, fit
for torch.save or JSON) and later ``loader.load_state_dict(state)`` (or
``Loader(..., state=state)``) continue the stream sample for sample where
the consumer stopped, on every rank: the state counts the samples all ranks
received in the current epoch. A state from another dataset or other order
settings raises ValueError naming what differs.
"""
import contextlib
import os
import sys
import threading
import warnings

import numpy as np

from vlafeed import _native

_torch = None


def torch_module():
    """The torch module, imported on first use (None when not installed)."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is optional
            _torch = False
        else:
            _torch = torch
    return _torch or None


def output_torch(output):
    """The torch module for output="torch", None for "numpy"; an error for anything else or
    for "torch" without PyTorch installed."""
    if output == "numpy":
        return None
    if output != "torch":
        raise ValueError(f"output must be 'torch' or 'numpy', not {output!r}")
    torch = torch_module()
    if torch is None:
        raise ImportError("output='torch' needs PyTorch; install torch or pass output='numpy'")
    return torch


def batch_to_dict(batch, output="torch"):
    """{name: tensor | ndarray | list[str]} in the batch's column order;
    tensors and arrays view the batch memory."""
    torch = output_torch(output)
    out = {}
    for name in batch.keys():
        value = batch[name]
        if not isinstance(value, list):
            value = np.asarray(value)
            if torch is not None:
                value = torch.from_numpy(value)
        out[name] = value
    return out


def distributed_rank_world():
    """(rank, world_size): torch.distributed when initialised, else the
    RANK / WORLD_SIZE environment variables, else (0, 1)."""
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:  # pragma: no cover - exotic torch builds
            pass
    rank = int(os.environ.get("RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return rank, world


class OneThreadAtATime:
    """A loader serves one consumer thread at a time. A pass (an iteration over the loader) belongs
    to the thread that started it until it ends, is abandoned or that thread exits; another thread
    that starts a pass, or moves the loader to another epoch or state, meanwhile gets RuntimeError
    naming the holder. (Before, the second thread's set_epoch waited forever behind the first
    thread's wait in the engine queue, or silently moved the first thread's pass to another epoch.)
    Passes started one after the other from different threads, and nested or abandoned passes in
    one thread, are fine."""

    def __init__(self, what):
        self.what = what
        self._lock = threading.Lock()
        self._owner = None
        self._passes = 0

    def _refuse_others(self):
        owner = self._owner
        if owner is not None and owner is not threading.current_thread() and owner.is_alive():
            raise RuntimeError(f"this {self.what} is already being iterated by thread {owner.name!r}: a "
                               f"{self.what} is iterated by one thread at a time (give each thread its own "
                               f"{self.what}, or hand batches between threads with a queue)")

    def check(self):
        """Raises RuntimeError when another live thread holds a pass."""
        with self._lock:
            self._refuse_others()

    @contextlib.contextmanager
    def iterating(self):
        """Holds the loader for this thread during a pass."""
        with self._lock:
            self._refuse_others()
            self._owner = threading.current_thread()
            self._passes += 1
        try:
            yield
        finally:
            with self._lock:
                self._passes -= 1
                if self._passes == 0:
                    self._owner = None


class LoaderWarning(UserWarning):
    """What a loader says once and goes on: an uneven split (the world size does not divide an
    epoch, a consumer gets no samples), a feature left out of the samples (no supported dtype), a
    stream whose frame size differs from info.json (frames are scaled to the declared size), a
    normalization element with std 0, files served by timestamp (video_mismatch="timestamp")."""


def emit_warnings(native, seen=0, rank=0):
    """warnings.warn the loader's warnings from index `seen` on; returns how many there are. A warning
    whose text is the same on every rank (how the epoch splits over the ranks) is given by rank 0
    only; the engine does not print them itself (the loader is opened with log_warnings=False), so
    each reaches the user once, through Python's warnings filters, at the user's line."""
    messages = native.warnings
    scopes = native.warnings_global
    for message, is_global in zip(messages[seen:], scopes[seen:]):
        if not (is_global and rank != 0):
            warnings.warn(message, LoaderWarning, stacklevel=outside_vlafeed())
    return len(messages)


def open_native_dataset(root, episodes=None, on_metadata_error="raise", video_mismatch=None, **settings):
    """_native.Dataset(root, ...) with vlafeed's Python-side reporting. video_mismatch: None (the
    VF_VIDEO_MISMATCH environment variable, else "refuse"), "refuse" (every episode of a video file
    whose frame count disagrees with its episodes, where the file's pts do not show where frames are
    missing, is refused) or "timestamp" (such files are served by timestamp, one LoaderWarning per
    file: frames after a dropped run may be other frames than the rows describe)."""
    if video_mismatch is not None:
        settings["video_mismatch"] = video_mismatch
    native = _native.Dataset(os.fspath(root), episodes, on_metadata_error=on_metadata_error, **settings)
    for p in native.problems:  # the problems only: info() would build the whole document
        if p["changes_samples"]:
            column = f"{p['column']}: " if p["column"] and p["column"] not in p["message"] else ""
            warnings.warn(f"vlafeed: {p['file']}: {column}{p['message']}", LoaderWarning,
                          stacklevel=outside_vlafeed())
    return native


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def outside_vlafeed():
    """The stacklevel for warnings.warn, called from here, that names the first frame outside the
    vlafeed package: the user's line, however deep inside vlafeed the warning is raised."""
    frame, level, outermost = sys._getframe(1), 1, 1
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE_DIR + os.sep):
            outermost = level
        elif not name.startswith("<frozen "):
            return level
        frame, level = frame.f_back, level + 1
    return outermost  # vlafeed is the program (python -m vlafeed.train): its outermost line


def native_dataset(dataset_or_root, episodes=None, on_metadata_error="raise", video_mismatch=None):
    """(_native.Dataset, defaults dict) for a path, a _native.Dataset or a
    vlafeed.LeRobotDataset (whose delta_timestamps and image settings become
    the loader's defaults). on_metadata_error and video_mismatch apply to a
    path (an open dataset was opened with its own)."""
    if isinstance(dataset_or_root, _native.Dataset):
        return dataset_or_root, {}
    native = getattr(dataset_or_root, "native_dataset", None)
    if native is not None:
        return native, dict(getattr(dataset_or_root, "loader_defaults", None) or {})
    return open_native_dataset(dataset_or_root, episodes, on_metadata_error, video_mismatch), {}


class EnginePasses:
    """What Loader and ShardLoader share: epochs and passes over their engine loader
    (``self._native``), one thread at a time, resume states and closing. A subclass's
    ``__init__`` calls ``_init_passes`` before it opens the engine loader."""

    def _init_passes(self, what, epoch):
        self._epoch = epoch
        self._consumed = 0           # batches taken in the current epoch
        self._resume_pending = False
        self._one_thread = OneThreadAtATime(what)
        self._device = None          # a torch.device (or copy backend) when batches go to a device
        self._device_conversions = {}
        self._handed = None          # during a device pass: (engine state, _consumed) of the last batch handed out

    def _init_device(self, device, output):
        """Resolves device= (None or "cpu": no device); the device needs output="torch"."""
        if device is None:
            return
        from vlafeed.torch.device import resolve_device
        self._device = resolve_device(device, type(self).__name__)
        if self._device is not None and output != "torch":
            raise ValueError(f"{type(self).__name__}: device={device!r} needs output='torch', not {output!r}")

    @property
    def device(self):
        """The device batches are delivered on (None: host memory, viewing the engine's batches)."""
        return self._device

    def device_conversions(self):
        """{column: conversion} the device step applies to uint8 image columns (uint8 -> float32,
        normalization), for batches moved outside the loader (vlafeed.torch.device.to_device)."""
        return self._device_conversions

    def __iter__(self):
        with self._one_thread.iterating():
            self._begin_pass()
            batches = self._engine_batches()
            yield from (batches if self._device is None else self._on_device(batches))

    def host_batches(self):
        """One pass, as iterating the loader, but without the device step: host memory, image
        columns uint8 where the device step would convert them (``device_conversions()``). For a
        consumer that moves the batches itself (a Mix given the device, DataLoader workers)."""
        with self._one_thread.iterating():
            self._begin_pass()
            yield from self._engine_batches()

    def _on_device(self, host_batches):
        """The pass's batches moved to the device by a DeviceFeeder. The feeder pulls batches from
        the engine ahead of the caller, so the resume state and the batch count are those of the
        last batch handed out; a pass left early puts the engine back there."""
        from vlafeed.torch.device import DeviceFeeder

        def tagged():
            for batch in host_batches:
                yield batch, (self._native.get_state(), self._consumed)

        self._handed = (self._native.get_state(), self._consumed)
        feeder = DeviceFeeder(tagged(), self._device, self._device_conversions, tagged=True)
        try:
            for batch in feeder:
                self._handed = feeder.tag
                yield batch
        finally:
            feeder.close()
            handed, self._handed = self._handed, None
            state, consumed = handed if handed is not None else (None, self._consumed)
            if self._consumed != consumed:   # batches taken from the engine that the caller never got
                self._consumed = consumed
                try:
                    self._native.set_state(state)
                except ValueError:           # the loader was closed: nothing to continue
                    pass

    def _engine_state(self):
        """The engine's state as of what the caller received."""
        if self._handed is not None:
            return dict(self._handed[0])
        return self._native.get_state()

    @property
    def epoch(self):
        return self._epoch

    def __len__(self):
        """Batches per epoch."""
        return self._native.num_batches

    def set_epoch(self, epoch):
        """Starts epoch `epoch` (its order is a pure function of seed and epoch).
        After load_state_dict(), set_epoch(<the state's epoch>) keeps the
        restored position."""
        if self._resume_pending and epoch == self._epoch:
            return
        self._one_thread.check()
        self._native.set_epoch(epoch)
        self._handed = None
        self._epoch = epoch
        self._consumed = 0
        self._resume_pending = False
        self._epoch_started()

    def _epoch_started(self):
        """Called after set_epoch moved the engine to another epoch."""

    def _begin_pass(self):
        # A second pass over the loader without set_epoch() moves on to the
        # next epoch (like a shuffling DataLoader); set_epoch(e) before the
        # pass chooses e explicitly; after load_state_dict() the pass
        # continues the restored epoch.
        if self._resume_pending:
            self._resume_pending = False
        elif self._consumed:
            self.set_epoch(self._epoch + 1)

    def load_state_dict(self, state):
        """Continues where `state` stopped: the next batch is the one an uninterrupted run
        would have yielded. Raises ValueError naming what differs when the state comes from
        another dataset (episode selection) or manifest, or from other order settings (mode,
        seed, batch_size, world_size, consumers, shuffle, drop_last, partition, shuffle_buffer,
        episode_pool_size)."""
        self._one_thread.check()
        self._native.set_state(state)
        self._resumed(state)

    def _resumed(self, state):
        self._handed = None
        self._epoch = int(state["epoch"])
        self._consumed = self._native.batches_delivered
        self._resume_pending = True

    def close(self):
        """Stops the engine threads now (also done when the loader is collected)."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Loader(EnginePasses):
    """Batches of samples assembled by the C engine.

    mode: "stream" (file-group partitions decoded forward, shuffled per
    epoch; the fast path for training), "pool" (each consumer holds
    ``episode_pool_size`` episodes and emits uniformly random frames across
    them, decoding only what it emits) or "map" (a seeded permutation of all
    frames, LeRobot's random access). Other arguments mirror
    ``vlafeed._native.Loader``: seed, shuffle, drop_last, epoch, rank,
    world_size, num_consumers, consumer, threads, decode_threads, prefetch,
    share_video_readers (None or True, the default: the engine threads share one
    reader per video file, taking turns on its decoder and converting the pictures
    in parallel, so the MP4 opens are what vlafeed.plan.plan counts at any thread
    count; False: a thread opens its own reader of a file another thread is
    decoding, more opens, no waiting for the decoder),
    shuffle_buffer, partition, episode_pool_size, decoder_cache_entries (0:
    sized to the mode), delta_timestamps, keys, renames, image_format
    ("float32" | "uint8" | "uint8_hwc"), resize ((width, height)), normalize
    ({key: "mean_std" | "min_max"}), lerobot_shapes, include_task,
    tolerance_s, state (a ``state_dict()`` to start from), prefetch_cache_dir
    and prefetch_cache_bytes (pool mode over an http/s3 root: download each
    admitted episode's videos in the background into a bounded local cache),
    table_cache_bytes (bound of the table rows held in memory; 0: 256 MiB;
    rows are read lazily, only for the episodes this loader emits),
    table_disk_cache (map mode: None, the default, keeps the decoded rows of
    each data file the loader draws from in the table cache on disk, under
    ``VF_CACHE_DIR`` or ``~/.cache/vlafeed/table``, when the table does not
    fit in ``table_cache_bytes`` and the loader draws at least one sample per
    episode; True whenever map mode reads a local table; False never).
    ``output="numpy"`` yields NumPy arrays instead of tensors.

    on_error: "raise" (default): a sample whose frame or row cannot be read
    (a damaged, missing or refused video or data file) raises the error,
    which names the file, column/camera and episode. "skip": that sample is
    left out of its batch (the batch is shorter; a batch left empty is not
    yielded), one ``LoaderWarning`` per (file, episode), and it is counted:
    ``stats()["skipped"]`` and ``stats()["skipped_by_file" | "_by_episode" |
    "_by_column"]``, each skip listed in ``loader.skipped``. Order, batch
    sequence and resume states are those of "raise" (a skipped sample counts
    as consumed), so resuming is still exact. ``get_items`` always raises:
    its positions are asked for explicitly.

    on_metadata_error: "raise" (default) refuses a dataset whose metadata
    has errors (``vlafeed info`` lists them); "warn" opens it anyway with a
    UserWarning per error, as ``LeRobotDataset(..., on_metadata_error=)``.
    video_mismatch: None, "refuse" or "timestamp" (see open_native_dataset).
    affinity: "none" (default), "auto" (the CPUs of the NUMA node of this rank's GPU) or a CPU list
    the engine threads are pinned to (docs/gpus.md, Placement). decode_device: "cpu", "auto" or
    "cuda" (NVDEC), None for VF_DECODE_DEVICE or "cpu"; decode_device_cameras: {camera: device}
    overrides (docs/gpus.md, GPU decode).

    device: None or "cpu" (default): batches view the engine's memory, as
    above. "cuda" / "cuda:N": every tensor is delivered on that GPU, copied
    ahead of the caller from pinned host buffers on a side stream; float32
    images are assembled as uint8 and converted (and normalized, for the
    cameras in ``normalize``) on the GPU, equal bit for bit to the engine's
    float output. The resume state is that of the last batch handed out.
    See vlafeed.torch.device and docs/gpus.md.
    """

    def __init__(self, dataset_or_root, mode="stream", batch_size=32, seed=0, shuffle=True, drop_last=False,
                 rank=None, world_size=None, *, episodes=None, epoch=0, num_consumers=1, consumer=None,
                 threads=0, decode_threads=1, prefetch=4, shuffle_buffer=0, partition="file_group",
                 delta_timestamps=None, keys=None, renames=None, image_format=None, resize=None,
                 normalize=None, lerobot_shapes=True, include_task=True, tolerance_s=None, output="torch",
                 decoder_cache_entries=0, share_video_readers=None, episode_pool_size=16, state=None,
                 prefetch_cache_dir=None,
                 prefetch_cache_bytes=0, table_cache_bytes=0, table_disk_cache=None, on_error="raise",
                 on_metadata_error="raise", video_mismatch=None, affinity="none", decode_device=None, decode_device_cameras=None,
                 device=None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", not {on_error!r}')
        native, defaults = native_dataset(dataset_or_root, episodes, on_metadata_error, video_mismatch)
        if rank is None or world_size is None:
            env_rank, env_world = distributed_rank_world()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        delta_timestamps = defaults.get("delta_timestamps") if delta_timestamps is None else delta_timestamps
        image_format = defaults.get("image_format", "float32") if image_format is None else image_format
        tolerance_s = defaults.get("tolerance_s", 1e-4) if tolerance_s is None else tolerance_s
        keys = defaults.get("keys") if keys is None else keys
        renames = defaults.get("renames") if renames is None else renames
        resize = defaults.get("resize") if resize is None else resize
        resize = None if resize is None else tuple(resize)  # [w, h] from a config file as well as (w, h)
        normalize = defaults.get("normalize") if normalize is None else normalize
        self.dataset = native
        self.batch_size = batch_size
        self.output = output
        self.rank, self.world_size = rank, world_size
        self._init_passes("Loader", epoch)
        self._init_device(device, output)
        if self._device is not None:
            from vlafeed.torch.device import lerobot_device_plan
            image_format, normalize, self._device_conversions = lerobot_device_plan(
                native, image_format, normalize, renames, keys,
                warn=lambda m: warnings.warn(f"vlafeed: {m}", LoaderWarning, stacklevel=outside_vlafeed()))
        # Placement (docs/gpus.md): pin the engine threads; decode_threads=0 sized from the rank's cores.
        from vlafeed import _affinity
        self._affinity = _affinity.resolve(affinity)
        cpus = self._affinity["cpus"]
        if decode_threads == 0 and cpus is None and threads > 0:
            cores = len(os.sched_getaffinity(0)) // _affinity.local_rank_world()[1]
            decode_threads = _affinity.decode_threads_for(cores, threads)
        self._native = _native.Loader(
            native, mode=mode, batch_size=batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last,
            epoch=epoch, rank=rank, world_size=world_size, num_consumers=num_consumers,
            consumer=-1 if consumer is None else consumer, threads=threads, decode_threads=decode_threads,
            prefetch=prefetch, shuffle_buffer=shuffle_buffer, partition=partition,
            delta_timestamps=delta_timestamps, keys=keys, renames=renames, image_format=image_format,
            resize=resize, normalize=normalize, lerobot_shapes=lerobot_shapes, include_task=include_task,
            tolerance_s=tolerance_s, decoder_cache_entries=decoder_cache_entries,
            share_video_readers=-1 if share_video_readers is None else int(bool(share_video_readers)),
            episode_pool_size=episode_pool_size, state=state, prefetch_cache_dir=prefetch_cache_dir,
            prefetch_cache_bytes=prefetch_cache_bytes, table_cache_bytes=table_cache_bytes,
            table_disk_cache=-1 if table_disk_cache is None else int(bool(table_disk_cache)), on_error=on_error,
            log_warnings=False, cpus=cpus,
            **({} if decode_device is None else {"decode_device": decode_device}),
            **({} if decode_device_cameras is None else {"decode_device_cameras": decode_device_cameras}))
        self.on_error = on_error
        self._skips_seen = 0
        self._skip_warned = set()
        self._warned = emit_warnings(self._native, rank=self.rank)
        if state is not None:
            self._resumed(state)

    @property
    def num_samples(self):
        """Samples this loader yields per epoch."""
        return self._native.num_samples

    def _epoch_started(self):
        self._warned = emit_warnings(self._native, self._warned, rank=self.rank)

    def _engine_batches(self):
        skipping = self.on_error == "skip"
        for batch in self._native:
            self._consumed += 1
            if skipping:
                self._warn_skips()
            if self._native.num_warnings > self._warned:  # what reading said (features, frame sizes)
                self._warned = emit_warnings(self._native, self._warned, rank=self.rank)
            yield batch_to_dict(batch, self.output)
        if skipping:  # the skips of the epoch's last batches, or of an epoch with nothing left
            self._warn_skips()

    def _warn_skips(self):
        skips = self._native.skips
        for k in skips[self._skips_seen:]:
            key = (k["file"], k["episode_index"])
            if key not in self._skip_warned:
                self._skip_warned.add(key)
                warnings.warn(f"vlafeed: skipping samples of episode {k['episode_index']} (on_error=\"skip\"): "
                              f"{k['message']}", LoaderWarning, stacklevel=outside_vlafeed())
        self._skips_seen = len(skips)

    def state_dict(self):
        """The loader's position: {version, mode, fingerprint, selection, positions, seed, epoch,
        samples_consumed, batch_size, world_size, consumers, shuffle, drop_last, partition,
        shuffle_buffer, episode_pool_size, settings_hash}. samples_consumed counts what the
        callers of every rank received this epoch (this rank's count x world_size), so one
        state (e.g. rank 0's) resumes every rank."""
        return self._engine_state()

    @property
    def warnings(self):
        """Warnings the loader gave (uneven splits over ranks, consumers without samples)."""
        return self._native.warnings

    def get_items(self, positions):
        """The samples at these positions (rows of the selected frames) as one batch dict."""
        batch = batch_to_dict(self._native.get_items(list(positions)), self.output)
        if self._device is None:
            return batch
        from vlafeed.torch.device import DeviceFeeder
        return next(DeviceFeeder([batch], self._device, self._device_conversions, depth=1))

    @property
    def skipped(self):
        """on_error="skip": the samples left out so far, as dicts (position, episode_index,
        file, column (None for table rows), message), in delivery order."""
        return self._native.skips

    def stats(self):
        """Engine metrics: samples, batches, frames decoded vs delivered, video opens,
        cache counters, wait time, first-batch latency, p50/p95/p99 sample latency;
        skipped (samples left out under on_error="skip") with skipped_by_file,
        skipped_by_episode and skipped_by_column ({name: count}); placement: affinity
        ({"cpus": [...] or None, "reason": ...}), pinned_cpus, engine_threads, decode_threads;
        data wait: data_wait_s (time iteration blocked on the engine, first batch included) and
        data_wait_fraction (the wait after the first batch over the wall time from the first
        batch handed out to the last; None before the second batch). See docs/gpus.md."""
        st = self._native.stats()
        st["affinity"] = dict(self._affinity, cpus=None if self._affinity["cpus"] is None
                              else list(self._affinity["cpus"]))
        st["node_cache"] = _native.node_cache_stats()
        st["data_wait_s"] = st["wait_seconds"]
        handout = st["handout_seconds"]
        st["data_wait_fraction"] = st["wait_after_first_seconds"] / handout if handout > 0 else None
        by_file, by_episode, by_column = {}, {}, {}
        for k in self._native.skips:
            by_file[k["file"]] = by_file.get(k["file"], 0) + 1
            by_episode[k["episode_index"]] = by_episode.get(k["episode_index"], 0) + 1
            col = k["column"] if k["column"] is not None else "(table rows)"
            by_column[col] = by_column.get(col, 0) + 1
        st.update(skipped_by_file=by_file, skipped_by_episode=by_episode, skipped_by_column=by_column)
        return st
