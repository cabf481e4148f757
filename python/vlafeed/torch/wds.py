"""vlafeed.torch.wds: ShardIterableDataset, vlafeed.ShardLoader behind torch's DataLoader.

    ds = ShardIterableDataset("shards/manifest.jsonl", batch_size=64, seed=0)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    for k, batch in enumerate(dl): ...
    state = ds.state_dict(batches_consumed=k + 1, num_workers=2)   # any time
    # later, any worker count: ds.load_state_dict(state); the next pass continues there

With ``num_workers=0`` the process is one consumer (or ``num_consumers``
engine consumers) and counts the batches itself (``state_dict()`` without
arguments). With W workers each worker process is consumer ``worker id``
of W, so the DataLoader's round-robin over its workers yields the batches
of one ``ShardLoader(num_consumers=W)`` in the same order; only the main
process sees which batches the loop took, so pass
``batches_consumed=`` (batches taken since this pass started) and
``num_workers=``. A restored state applies to the next pass of its epoch;
each worker skips what was delivered without decoding it; a state from
another worker count, world size or batch size resumes elastically.
``persistent_workers`` is not supported (a worker would keep its first
epoch and state).

``device="cuda:N"``: with ``num_workers=0`` the ShardLoader delivers CUDA
tensors itself; with workers, iterate ``vlafeed.torch.to_device(dl)``: the
workers assemble host batches (uint8 images) and the main process moves and
converts them.
"""
import torch.utils.data

from vlafeed.data.loader import distributed_rank_world
from vlafeed.data.wds import ShardLoader
from vlafeed.torch.device import HostOnly, resolve_device, wants_device, with_conversions


class ShardIterableDataset(torch.utils.data.IterableDataset):
    """Batches of vlafeed.ShardLoader for torch.utils.data.DataLoader(ds, batch_size=None).
    Keyword arguments other than batch_size, seed and epoch go to ShardLoader."""

    def __init__(self, manifest_or_url, *, batch_size=32, seed=0, epoch=0, **loader_kwargs):
        rank, world = loader_kwargs.pop("rank", None), loader_kwargs.pop("world_size", None)
        if rank is None or world is None:
            env_rank, env_world = distributed_rank_world()
            rank = env_rank if rank is None else rank
            world = env_world if world is None else world
        self.manifest = str(manifest_or_url)
        self.batch_size, self.seed, self.epoch = batch_size, seed, epoch
        self.loader_kwargs = dict(loader_kwargs, rank=rank, world_size=world)
        self.device = resolve_device(loader_kwargs.get("device"), "ShardIterableDataset") \
            if wants_device(loader_kwargs.get("device")) else None
        self._move_in_main = False  # set while vlafeed.torch.device.to_device starts the workers
        self._pending = None     # a restored state for the next pass
        self._base = None        # the state the current pass started from
        self._taken = None       # batches taken in this process's current pass (num_workers=0)
        self._consumers = None

    def set_epoch(self, epoch):
        if self._pending is not None and epoch != self._pending["epoch"]:
            self._pending = None
        if epoch != self.epoch:
            self._base, self._taken = None, None
        self.epoch = epoch

    def _loader(self, consumers, consumer, state, **extra):
        kwargs = dict(self.loader_kwargs, **extra)
        kwargs["num_consumers"] = consumers
        return ShardLoader(self.manifest, batch_size=self.batch_size, seed=self.seed, epoch=self.epoch,
                           consumer=consumer, state=state, **kwargs)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        state = self._pending
        if info is None:
            consumers = self.loader_kwargs.get("num_consumers", 1)
            loader = self._loader(consumers, None, state)
            self._pending, self._base, self._taken, self._consumers = None, state, 0, consumers
            batches = loader
        elif self.device is None:
            loader = self._loader(info.num_workers, info.id, state, threads=1)
            batches = loader
        else:
            if not self._move_in_main:
                raise RuntimeError(
                    f"vlafeed.torch.ShardIterableDataset(device={self.device!s}) in a DataLoader worker: the "
                    "workers assemble host batches and the main process moves them; iterate through "
                    "vlafeed.torch.to_device(dataloader)")
            loader = self._loader(info.num_workers, info.id, state, threads=1, device=HostOnly())
            batches = with_conversions(loader)
        with loader:
            for batch in batches:
                if info is None:
                    self._taken += 1
                yield batch

    def state_dict(self, batches_consumed=None, num_workers=None):
        """The state after the loop took `batches_consumed` batches since the current pass
        started (default: this process's count, num_workers=0) from a DataLoader with
        `num_workers` workers."""
        if self._pending is not None and batches_consumed is None:
            return dict(self._pending)
        if num_workers:
            consumers = num_workers
            base = self._pending if self._pending is not None else self._base
        else:
            consumers = self._consumers or self.loader_kwargs.get("num_consumers", 1)
            base = self._base
        if batches_consumed is None:
            if self._taken is None:
                raise RuntimeError("ShardIterableDataset.state_dict(): pass batches_consumed= (and num_workers= "
                                   "with DataLoader workers)")
            batches_consumed = self._taken
        with self._loader(consumers, None, base, threads=1, device=None) as probe:
            return probe._native.state_at(probe._native.batches_delivered + batches_consumed)

    def load_state_dict(self, state):
        """The next pass of the state's epoch continues where the state stopped."""
        self._pending = dict(state)
        self.epoch = int(state["epoch"])
        self._taken = None
