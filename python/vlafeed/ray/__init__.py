"""vlafeed.ray: vlafeed's readers as Ray Data datasources, and the Ray Train
worker's loader.

- ``vlafeed.ray.lerobot``: ``LeRobotDatasource`` / ``read_lerobot`` (LeRobot
  datasets, one read task per file group, decoded by the C engine inside
  the task), ``TorchCollate`` for ``iter_torch_batches``, ``RayMeta``, and
  ``loader_for_train_worker`` (a ``vlafeed.Loader`` for a Ray Train worker,
  resumable from a Ray checkpoint).
- ``vlafeed.ray.wds``: ``WdsDatasource`` / ``read_wds`` (WebDataset shards
  through the C shard reader).
- ``vlafeed.ray._common``: what both share (``VlafeedRayError``, the skip
  ledger actor, Arrow tensor columns).

Importing this package imports Ray (``pip install 'vlafeed[ray]'``).
"""
from vlafeed.ray._common import VlafeedRayError
from vlafeed.ray.lerobot import LeRobotDatasource, RayMeta, TorchCollate, loader_for_train_worker, read_lerobot
from vlafeed.ray.wds import WdsDatasource, read_wds

__all__ = ["LeRobotDatasource", "read_lerobot", "TorchCollate", "VlafeedRayError", "RayMeta",
           "loader_for_train_worker", "WdsDatasource", "read_wds"]
