"""vlafeed: stream LeRobot datasets into PyTorch training from a C engine.

The engine is C (the ``vlafeed._native`` extension); this package is a thin
layer over it:

- ``vlafeed.LeRobotDataset(root, episodes=None, delta_timestamps=None, ...)``:
  map-style, ``ds[i]`` returns the dict of tensors LeRobot returns;
  ``ds.meta`` describes the dataset like ``LeRobotDatasetMetadata``.
- ``vlafeed.Loader(dataset_or_root, mode="stream", batch_size=32, ...)``:
  iterates batches (dicts of torch tensors viewing engine memory).
- ``vlafeed.torch.IterableDataset``: the loader behind a
  ``torch.utils.data.DataLoader(ds, batch_size=None)``.

torch is imported only when tensors are made, so the C parts work without it.

Importing vlafeed sets what the engine and FFmpeg print to the VF_LOG
environment variable's level (default: warnings and errors, so decoders do
not print banners); ``vlafeed.set_log_level(2)`` shows FFmpeg's info lines.
"""
from vlafeed._native import __version__, VlafeedError, set_log_level  # noqa: F401
from vlafeed.dataset import LeRobotDataset, LeRobotDatasetMetadata
from vlafeed.loader import Loader
from vlafeed.mix import Mix
from vlafeed.wds import ShardLoader

set_log_level()

__all__ = ["__version__", "VlafeedError", "LeRobotDataset", "LeRobotDatasetMetadata", "Loader", "ShardLoader", "set_log_level"]
