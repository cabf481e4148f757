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
from vlafeed.data.dataset import LeRobotDataset, LeRobotDatasetMetadata
from vlafeed.data.loader import Loader, LoaderWarning
from vlafeed.data.mix import Mix, MixSourceError
from vlafeed.data.wds import ShardLoader

__all__ = ["LeRobotDataset", "LeRobotDatasetMetadata", "Loader", "LoaderWarning", "Mix", "MixSourceError",
           "ShardLoader"]
