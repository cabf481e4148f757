"""The loader's plan from the metadata alone: partition tasks, what each
(rank, worker) consumer reads in an epoch, and the MP4 opens at a world
size, without opening a data or video file.

    import vlafeed.plan
    p = vlafeed.plan.plan("path/to/dataset", world_size=1024, workers=8)
    p["opens"]            # consumers, distinct_files, task_opens, consumer_opens, lower_bound
    for t in vlafeed.plan.tasks("path/to/dataset"):                 # the file groups
        t["id"], t["episodes"], t["rows"], t["estimated_bytes"], t["video_files"]
    vlafeed.plan.consumer_tasks("path/to/dataset", rank=3, worker=1, world_size=8, workers=2, epoch=5)

Every function takes a dataset folder, or an open dataset (a
``vlafeed.LeRobotDataset``, ``vlafeed.LeRobotDatasetMetadata`` or
``_native.Dataset``): a folder's metadata is read at every call (at a
million episodes about 1.4 CPU-s and 440 MB each), an open dataset's never
again (``episodes=`` then takes a subset of it, from its model).

A task is a run of consecutive episodes (``episodes``: [first selected
episode, count]; ``episode_index``: [first, last] of the dataset's
indices) and rows (``rows``: [first position, count], the positions
``vlafeed.Loader`` and ``get_items`` use); ``estimated_bytes`` is the
decoded size of its rows (uint8 frames of every camera plus the numeric
columns). A consumer's entries are its pieces of tasks in the epoch's
global order (its shuffle buffer or pool reorders samples within them),
with ``rank`` and ``worker``. These are the same functions the loaders plan
with, so the lists are exactly what the loaders will read.
"""
import json
import os

from vlafeed import _native
from vlafeed.data.loader import native_dataset

__all__ = ["plan", "tasks", "consumer_tasks"]


def _report(dataset_or_root, episodes, **kw):
    ds, _ = native_dataset(dataset_or_root, episodes)
    if episodes is not None and ds is not None and not isinstance(dataset_or_root, (str, os.PathLike)):
        ds = ds.subset(list(episodes))  # an open dataset: its model, no metadata read
    return json.loads(_native.plan_report(ds, **kw))


def plan(dataset_or_root, *, world_size=1, workers=1, mode="stream", partition="file_group", batch_size=32,
         seed=0, epoch=0, shuffle=True, drop_last=False, shuffle_buffer=0, episode_pool_size=16, episodes=None,
         state=None):
    """The `vlafeed plan --json` document: strategies, remainder rule, MP4 opens of `epoch`.

    mode "stream", "pool" or "map". ``opens["consumer_opens"]`` is the sum over the
    world_size x workers consumers of the MP4 opens a ``vlafeed.Loader`` with these
    settings makes in the epoch (its ``stats()["video_opens"]``), at any thread count;
    ``opens["lower_bound"]`` the distinct files of each consumer's share, summed."""
    return _report(dataset_or_root, episodes, world_size=world_size, workers=workers, mode=mode,
                   partition=partition, batch_size=batch_size, seed=seed, epoch=epoch, shuffle=shuffle,
                   drop_last=drop_last, shuffle_buffer=shuffle_buffer, episode_pool_size=episode_pool_size,
                   resume=state)


def tasks(dataset_or_root, *, partition="file_group", world_size=1, workers=1, episodes=None, video_files=True):
    """The partition's tasks (the sequential partition depends on world_size x workers);
    video_files=False leaves out each task's files (faster at a million episodes)."""
    return _report(dataset_or_root, episodes, partition=partition, world_size=world_size, workers=workers,
                   tasks=1, video_files=video_files)["tasks"]


def consumer_tasks(dataset_or_root, *, rank=None, worker=None, world_size=1, workers=1, mode="stream",
                   partition="file_group", batch_size=32, seed=0, epoch=0, shuffle=True, drop_last=False,
                   shuffle_buffer=0, episode_pool_size=16, episodes=None, state=None, video_files=True):
    """What consumer (rank, worker) reads in `epoch`, or with rank=worker=None every
    consumer's pieces (rank-major, each with "rank" and "worker"). state: a resolved state of
    that epoch, whose remaining ranges restrict it (e.g. after an elastic resume)."""
    if (rank is None) != (worker is None):
        raise ValueError("consumer_tasks: give both rank and worker, or neither (every consumer)")
    every = rank is None
    return _report(dataset_or_root, episodes, mode=mode, partition=partition, world_size=world_size,
                   workers=workers, batch_size=batch_size, seed=seed, epoch=epoch, shuffle=shuffle,
                   drop_last=drop_last, shuffle_buffer=shuffle_buffer, episode_pool_size=episode_pool_size,
                   tasks=2 if every else 0, rank=-1 if every else rank, worker=-1 if every else worker,
                   resume=state, video_files=video_files)["consumer_tasks"]
