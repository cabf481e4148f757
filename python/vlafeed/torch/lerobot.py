"""vlafeed.torch.lerobot: the engine behind torch.utils.data (exported as vlafeed.torch).

    ds = vlafeed.torch.IterableDataset("/data/my-dataset", batch_size=64, seed=0)
    loader = vlafeed.torch.DataLoader(ds, num_workers=0)   # or torch.utils.data.DataLoader(ds, batch_size=None)
    for epoch in range(ds.epoch, epochs):
        ds.set_epoch(epoch)
        for batch in loader: ...
        torch.save({"data": loader.state_dict(), ...}, path)   # any time, mid-epoch too
    # later: loader.load_state_dict(torch.load(path)["data"]) continues sample for sample

The intended use is ``num_workers=0``: the C engine runs its own threads
(decode, assembly, prefetch) and the batches it yields are already
collated. ``num_workers > 0`` works too: each worker process is its own
consumer (``torch.utils.data.get_worker_info()``), the epoch's samples of
this rank are split over the workers without duplicates, and the
DataLoader's round-robin over workers gives the same batch order as one
process with ``num_consumers = num_workers``. Engine threads per worker
default to cores / workers.

Resume: the state counts the batches the training loop took. With
``num_workers=0`` the dataset counts them itself; with workers only the
main process sees them, so iterate through ``vlafeed.torch.DataLoader``
(torch's DataLoader plus that count and state_dict / load_state_dict), or
pass ``batches_consumed=`` to ``state_dict``. A restored state applies to
the next iteration of its epoch: each worker skips what was consumed
without decoding it, the rank's remaining batches dealt over the workers
so that the DataLoader's round-robin from worker 0 yields exactly what the
uninterrupted run would have yielded next. ``persistent_workers`` is not
supported (workers would keep their first epoch and state).

Tensors view engine memory in the process that made them; with workers,
torch moves them to shared memory (a copy) as it does for any batch.

``device="cuda:N"`` (a Loader keyword): with ``num_workers=0`` the loader
delivers CUDA tensors itself. With workers, a worker never touches CUDA: it
assembles host batches (uint8 images), each carrying the conversions it
needs, and the main process moves them (``vlafeed.torch.DataLoader`` does;
around torch's DataLoader use ``vlafeed.torch.to_device(dl)``; a worker
started otherwise raises).
"""
import os
import warnings

import torch
import torch.utils.data

from vlafeed import _native
from vlafeed.data.loader import Loader, LoaderWarning, distributed_rank_world, native_dataset
from vlafeed.torch.device import DeviceFeeder, HostOnly, resolve_device, wants_device, with_conversions

# Settings that define the order (the others, threads, image format, ...,
# may change between a run and its resumption).
_ORDER_DEFAULTS = {"shuffle": True, "drop_last": False, "shuffle_buffer": 0, "partition": "file_group",
                   "episode_pool_size": 16}


class IterableDataset(torch.utils.data.IterableDataset):
    """An epoch of batches (dicts of tensors) from vlafeed.Loader.

    dataset_or_root: a dataset folder or a vlafeed.LeRobotDataset (its
    delta_timestamps and image settings carry over). num_workers: pass the
    DataLoader's value to make ``len()`` exact (batches per epoch over all
    workers). Other keyword arguments go to vlafeed.Loader (mode, batch_size,
    seed, shuffle, drop_last, rank, world_size, threads, delta_timestamps,
    image_format, episode_pool_size, ...).
    """

    def __init__(self, dataset_or_root, *, batch_size=32, mode="stream", seed=0, epoch=0, num_workers=None,
                 **loader_kwargs):
        super().__init__()
        self.dataset_or_root = dataset_or_root
        self.batch_size = batch_size
        self.mode = mode
        self.seed = seed
        self.epoch = epoch
        self.num_workers = num_workers
        self.loader_kwargs = dict(loader_kwargs)
        self.num_consumers = self.loader_kwargs.pop("num_consumers", 1)
        self.loader_kwargs.pop("consumer", None)
        self.loader_kwargs.pop("state", None)
        rank, world = distributed_rank_world()  # decided here, in the main process; workers inherit it
        if self.loader_kwargs.get("rank") is None:
            self.loader_kwargs["rank"] = rank
        if self.loader_kwargs.get("world_size") is None:
            self.loader_kwargs["world_size"] = world
        self._resume = None            # a state waiting for the next iteration of its epoch
        self._batches = None           # batches of self.epoch the training loop took (None: unknown)
        self._consumers = None         # consumers per rank of the counted iteration
        self._native_ds = None         # the dataset in this process, for loader_state()
        self._generation = None        # the resolved state the current epoch resumed from (elastic ranges)
        # device=: checked here, in the main process (a worker never touches CUDA)
        self.device = resolve_device(self.loader_kwargs.get("device"), "IterableDataset") \
            if wants_device(self.loader_kwargs.get("device")) else None
        self._move_in_main = False     # set while vlafeed.torch.DataLoader / to_device starts the workers

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_native_ds"] = None     # engine objects are per process
        return state

    def set_epoch(self, epoch):
        """The next iteration yields epoch `epoch` (workers read it when they start). A
        restored state is kept when `epoch` is its epoch, dropped otherwise."""
        if epoch != self.epoch:
            self._batches = 0 if self._batches is not None else None
        if self._resume is not None and epoch != self._resume["epoch"]:
            self._resume = None
        if self._generation is not None and epoch != self._generation["epoch"]:
            self._generation = None
        self.epoch = epoch

    def _loader(self, num_consumers, consumer, threads, state, **extra):
        kwargs = dict(self.loader_kwargs, **extra)
        kwargs.setdefault("threads", threads)
        return Loader(self.dataset_or_root, mode=self.mode, batch_size=self.batch_size, seed=self.seed,
                      epoch=self.epoch, num_consumers=num_consumers, consumer=consumer, state=state, **kwargs)

    def _take_resume(self):
        state = self._resume
        return state if state is not None and state["epoch"] == self.epoch else None

    def _order_settings(self, consumers):
        order = {k: self.loader_kwargs.get(k, v) for k, v in _ORDER_DEFAULTS.items()}
        return dict(mode=self.mode, batch_size=self.batch_size, seed=self.seed,
                    world_size=self.loader_kwargs["world_size"], num_consumers=consumers, **order)

    def _resolve(self, state, consumers):
        """The pending state in this run's layout (elastic resume when the world size, the
        consumers or the batch size changed), resolved once here so that workers don't replay
        it each; remembered for state_dict()."""
        if state is None:
            return None
        state = _native.resolve_state(self._main_dataset(), resume=state, **self._order_settings(consumers))
        self._generation = state
        return state

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        state = self._take_resume()
        self._resume = None            # in a worker: its own copy; in the main process: consumed now
        if info is None:
            state = self._resolve(state, self.num_consumers)
            loader = self._loader(self.num_consumers, None, 0, state)
            self._batches = loader._native.batches_delivered
            self._consumers = self.num_consumers
            batches = loader
        elif self.device is None:
            loader = self._loader(info.num_workers, info.id, max(1, (os.cpu_count() or 1) // info.num_workers),
                                  state)
            batches = loader
        else:
            if not self._move_in_main:
                raise RuntimeError(
                    f"vlafeed.torch.IterableDataset(device={self.device!s}) in a DataLoader worker: the workers "
                    "assemble host batches and the main process moves them; iterate through "
                    "vlafeed.torch.DataLoader, or vlafeed.torch.to_device(dataloader)")
            loader = self._loader(info.num_workers, info.id, max(1, (os.cpu_count() or 1) // info.num_workers),
                                  state, device=HostOnly())
            batches = with_conversions(loader)
        try:
            for batch in batches:
                if info is None:
                    self._batches += 1
                yield batch
        finally:
            loader.close()

    def __len__(self):
        """Batches per epoch over all workers (pass num_workers= to match the DataLoader)."""
        consumers = self.num_workers if self.num_workers else self.num_consumers
        kwargs = dict(self.loader_kwargs)
        kwargs["threads"] = 1
        kwargs.pop("device", None)
        # Map, stream and pool mode cut the same number of samples into the
        # same batches; a map loader does no work until iterated (and its
        # warnings are the real loader's to give).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LoaderWarning)
            probe = Loader(self.dataset_or_root, mode="map", batch_size=self.batch_size, seed=self.seed,
                           epoch=self.epoch, num_consumers=consumers, consumer=None, **kwargs)
        with probe:
            return len(probe)

    # ---- resume ------------------------------------------------------------------------

    def _main_dataset(self):
        if self._native_ds is None:
            self._native_ds, _ = native_dataset(self.dataset_or_root, self.loader_kwargs.get("episodes"))
        return self._native_ds

    def state_dict(self, batches_consumed=None, num_workers=None):
        """The position of the training loop in the current epoch (a dict; see
        vlafeed.Loader.state_dict). batches_consumed: batches the loop took this epoch;
        by default the count of the last iteration in this process (num_workers=0) or of
        vlafeed.torch.DataLoader. num_workers: the DataLoader's, with batches_consumed."""
        if batches_consumed is None:
            if self._resume is not None:   # restored, not iterated yet: the same position
                return dict(self._resume)
            if self._batches is None:
                raise RuntimeError(
                    "vlafeed.torch.IterableDataset.state_dict(): with DataLoader num_workers > 0 the dataset cannot "
                    "see which batches the training loop took; iterate through vlafeed.torch.DataLoader, or pass "
                    "batches_consumed= (batches taken from the DataLoader this epoch) and num_workers=")
            batches_consumed = self._batches
        if num_workers is not None:
            consumers = num_workers if num_workers > 0 else self.num_consumers
        elif self._consumers is not None:
            consumers = self._consumers
        else:
            consumers = self.num_workers if self.num_workers else self.num_consumers
        generation = self._generation
        if generation is not None and generation["epoch"] != self.epoch:
            generation = None
        return _native.loader_state(self._main_dataset(), epoch=self.epoch, batches=batches_consumed,
                                    resume=generation, **self._order_settings(consumers))

    def load_state_dict(self, state):
        """The next iteration of the state's epoch continues where the state stopped (the
        state is checked when the loaders open: ValueError naming what differs)."""
        state = dict(state)
        batches = _native.state_batches(state)
        self.epoch = int(state["epoch"])
        self._resume = state
        self._generation = None
        self._batches = batches
        self._consumers = int(state["consumers"])


class _CountingIterator:
    """Hands out a DataLoader iterator's batches, counting them on the dataset."""

    def __init__(self, inner, dataset):
        self._inner = inner
        self._dataset = dataset

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._inner)
        self._dataset._batches += 1
        return batch

    def __len__(self):
        return len(self._inner)


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader over a vlafeed.torch.IterableDataset (batch_size=None:
    the engine's batches are already collated) that counts the batches it hands out, so
    that ``state_dict()`` is exact with worker processes too."""

    def __init__(self, dataset, **kwargs):
        kwargs.setdefault("batch_size", None)
        if kwargs.get("persistent_workers"):
            raise ValueError("vlafeed.torch.DataLoader: persistent_workers is not supported (workers would keep "
                             "their first epoch and resume state)")
        super().__init__(dataset, **kwargs)
        if isinstance(dataset, IterableDataset) and dataset._batches is None and dataset._resume is None:
            # From here on every pass goes through this loader and is counted.
            dataset._batches = 0
            dataset._consumers = self.num_workers if self.num_workers > 0 else dataset.num_consumers

    def __iter__(self):
        ds = self.dataset
        if not isinstance(ds, IterableDataset) or self.num_workers == 0:
            return super().__iter__()        # num_workers=0: the dataset counts (and moves) in-process
        # Resolve a pending state for this worker count before the workers copy the dataset.
        state = ds._take_resume()
        if state is not None:
            ds._resume = ds._resolve(state, self.num_workers)
        ds._move_in_main = ds.device is not None   # the workers assemble host batches, moved here
        try:
            inner = super().__iter__()
        finally:
            ds._move_in_main = False
        if ds.device is not None:
            inner = DeviceFeeder(inner, ds.device)
        # The workers have their copy of the dataset (and of the pending state) now.
        state = ds._take_resume()
        ds._batches = _native.state_batches(state) if state is not None else 0
        ds._consumers = self.num_workers
        ds._resume = None
        return _CountingIterator(inner, ds)

    def state_dict(self):
        """The dataset's state (see IterableDataset.state_dict)."""
        return self.dataset.state_dict()

    def load_state_dict(self, state):
        self.dataset.load_state_dict(state)
