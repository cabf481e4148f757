"""vlafeed.torch: the engine behind torch.utils.data.

    ds = vlafeed.torch.IterableDataset("/data/my-dataset", batch_size=64, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in loader: ...

The intended use is ``num_workers=0``: the C engine runs its own threads
(decode, assembly, prefetch) and the batches it yields are already
collated. ``num_workers > 0`` works too: each worker process is its own
consumer (``torch.utils.data.get_worker_info()``), the epoch's samples of
this rank are split over the workers without duplicates, and the
DataLoader's round-robin over workers gives the same batch order as one
process with ``num_consumers = num_workers``. Engine threads per worker
default to cores / workers.

Tensors view engine memory in the process that made them; with workers,
torch moves them to shared memory (a copy) as it does for any batch.
"""
import os

import torch
import torch.utils.data

from vlafeed.loader import Loader, distributed_rank_world


class IterableDataset(torch.utils.data.IterableDataset):
    """An epoch of batches (dicts of tensors) from vlafeed.Loader.

    dataset_or_root: a dataset folder or a vlafeed.LeRobotDataset (its
    delta_timestamps and image settings carry over). num_workers: pass the
    DataLoader's value to make ``len()`` exact (batches per epoch over all
    workers). Other keyword arguments go to vlafeed.Loader (mode, batch_size,
    seed, shuffle, drop_last, rank, world_size, threads, delta_timestamps,
    image_format, ...).
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
        rank, world = distributed_rank_world()  # decided here, in the main process; workers inherit it
        if self.loader_kwargs.get("rank") is None:
            self.loader_kwargs["rank"] = rank
        if self.loader_kwargs.get("world_size") is None:
            self.loader_kwargs["world_size"] = world

    def set_epoch(self, epoch):
        """The next iteration yields epoch `epoch` (workers read it when they start)."""
        self.epoch = epoch

    def _loader(self, num_consumers, consumer, threads):
        kwargs = dict(self.loader_kwargs)
        kwargs.setdefault("threads", threads)
        return Loader(self.dataset_or_root, mode=self.mode, batch_size=self.batch_size, seed=self.seed,
                      epoch=self.epoch, num_consumers=num_consumers, consumer=consumer, **kwargs)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            loader = self._loader(self.num_consumers, None, 0)
        else:
            loader = self._loader(info.num_workers, info.id, max(1, (os.cpu_count() or 1) // info.num_workers))
        try:
            yield from loader
        finally:
            loader.close()

    def __len__(self):
        """Batches per epoch over all workers (pass num_workers= to match the DataLoader)."""
        consumers = self.num_workers if self.num_workers else self.num_consumers
        kwargs = dict(self.loader_kwargs)
        kwargs["threads"] = 1
        # Map and stream mode cut the same number of samples into the same
        # batches; a map loader does no work until iterated.
        with Loader(self.dataset_or_root, mode="map", batch_size=self.batch_size, seed=self.seed, epoch=self.epoch,
                    num_consumers=consumers, consumer=None, **kwargs) as probe:
            return len(probe)
