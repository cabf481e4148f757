"""vlafeed.data: reading datasets through the C engine.

- ``dataset``: ``LeRobotDataset`` / ``LeRobotDatasetMetadata``, map-style
  access with LeRobot's semantics and names.
- ``loader``: ``Loader``, batches in stream, map or pool mode, with exact
  and elastic resume.
- ``wds``: ``ShardLoader``, WebDataset shards (local, http(s), s3).
- ``mix``: ``Mix``, a resumable weighted interleaving of several loaders.
- ``plan``: the read plan (tasks, per-consumer shares, MP4 opens) without
  reading any data.
- ``lerobot_compat``: LeRobot's path templates, home folder and tables.

The names users need are also at the top level: ``vlafeed.Loader`` etc.
"""
from vlafeed.data.loader import Loader, LoaderWarning
from vlafeed.data.mix import Mix, MixSourceError
from vlafeed.data.wds import ShardLoader


def __getattr__(name):
    # dataset.py imports torch (LeRobot's classes are torch Datasets): loaded on first use.
    if name in ("LeRobotDataset", "LeRobotDatasetMetadata", "MultiLeRobotDataset"):
        from vlafeed.data import dataset
        return getattr(dataset, name)
    raise AttributeError(f"module 'vlafeed.data' has no attribute {name!r}")

__all__ = ["LeRobotDataset", "LeRobotDatasetMetadata", "MultiLeRobotDataset", "Loader", "LoaderWarning", "Mix", "MixSourceError",
           "ShardLoader"]
