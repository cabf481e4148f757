"""vlafeed.torch: vlafeed's loaders behind ``torch.utils.data``.

- ``IterableDataset`` and ``DataLoader`` (``vlafeed.torch.lerobot``): a LeRobot
  dataset through the C engine, resumable mid-epoch, with ``num_workers`` 0
  (the intended use: the engine has its own threads) or more.
- ``ShardIterableDataset`` (``vlafeed.torch.wds``): WebDataset shards through
  ``vlafeed.ShardLoader``, resumable across worker counts.
- ``to_device`` (``vlafeed.torch.device``): batches moved to a CUDA device on a
  side stream, ahead of the training step; with DataLoader workers, in the main
  process (the loaders' ``device=`` does the same inside a loader).

Importing this package imports torch.
"""
from vlafeed.torch.device import to_device
from vlafeed.torch.lerobot import DataLoader, IterableDataset
from vlafeed.torch.wds import ShardIterableDataset

__all__ = ["IterableDataset", "DataLoader", "ShardIterableDataset", "to_device"]
