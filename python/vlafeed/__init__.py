"""vlafeed: stream LeRobot datasets into PyTorch training from a C engine.

The engine is C (the ``vlafeed._native`` extension); this package is laid out
by concept:

- ``vlafeed.data``: ``LeRobotDataset`` (map-style, ``ds[i]`` returns the dict
  LeRobot returns; ``ds.meta`` like ``LeRobotDatasetMetadata``), ``Loader``
  (batches of torch tensors viewing engine memory), ``ShardLoader``
  (WebDataset shards), ``Mix`` (weighted mixing) and ``plan``; the names
  users need are re-exported here.
- ``vlafeed.torch``: the loaders behind ``torch.utils.data``.
- ``vlafeed.ray``: Ray Data datasources and the Ray Train worker's loader.
- ``vlafeed.train``, ``vlafeed.rl``, ``vlafeed.quant``: training, RL and FP8
  quantization.

torch is imported only when tensors are made, so the C parts work without it.
Older module paths (``vlafeed.loader``, ``vlafeed.wds_torch``, ...) still
import: see ``vlafeed._aliases``.

Importing vlafeed sets what the engine and FFmpeg print to the VF_LOG
environment variable's level (default: warnings and errors, so decoders do
not print banners); ``vlafeed.set_log_level(2)`` shows FFmpeg's info lines.
"""
from vlafeed import _aliases
from vlafeed._native import __version__, VlafeedError, node_cache_stats, set_log_level  # noqa: F401
from vlafeed.data.loader import Loader, LoaderWarning
from vlafeed.data.mix import Mix
from vlafeed.data.wds import ShardLoader

_aliases.install()
set_log_level()


def __getattr__(name):
    # LeRobot's classes subclass torch.utils.data.Dataset: their module (and torch) is imported
    # when they are first asked for, so ``import vlafeed`` stays torch-free.
    if name in ("LeRobotDataset", "LeRobotDatasetMetadata", "MultiLeRobotDataset"):
        from vlafeed.data import dataset
        return getattr(dataset, name)
    # ``import vlafeed; vlafeed.loader`` worked while the data modules sat at the top level.
    if "vlafeed." + name in _aliases.MOVED:
        import importlib
        return importlib.import_module("vlafeed." + name)
    raise AttributeError(f"module 'vlafeed' has no attribute {name!r}")

__all__ = ["__version__", "VlafeedError", "LeRobotDataset", "LeRobotDatasetMetadata", "MultiLeRobotDataset", "Loader",
           "ShardLoader", "Mix", "set_log_level"]
