"""Upstream LeRobot's recorder and reader, for tests/python/test_lerobot_record.py.

Run with the LeRobot 0.6 venv's python (build-lerobot/venv312), never
imported by the main test process:

  python lerobot_record_upstream.py JOB.json OUT.pt

JOB: {"record": {"root", "frames" (an .npz written by the test), "fps",
"features", "robot_type", "vcodec"} or null, "aggregate": {"roots", "out"} or
null, "read": [root, ...]}. "aggregate" runs LeRobot's aggregate_datasets
(after "record") into "out".
"record" writes the test's frames with LeRobotDataset.create / add_frame /
save_episode / finalize (LeRobot's own recorder). "read" opens each root with
LeRobotDataset (torchcodec) and dumps every item. OUT (torch.save):
{"read": {root: {"len", "items": [item dict, ...], "stats_keys": {...}} or
{"__open_error__": type, "message"}}, "signatures": {class: {method:
[(parameter, kind, repr(default))]}}} (the recording names).
"""
import json
import sys

import numpy as np


def record(job):
    from lerobot.configs import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    features = {k: dict(v, shape=tuple(v["shape"])) for k, v in job["features"].items()}
    data = np.load(job["frames"])
    tasks = json.loads(str(data["tasks"]))
    ds = LeRobotDataset.create("local/upstream-record", job["fps"], features, root=job["root"],
                               robot_type=job["robot_type"], rgb_encoder=RGBEncoderConfig(vcodec=job["vcodec"]))
    for e, episode_tasks in enumerate(tasks):
        for f, task in enumerate(episode_tasks):
            frame = {k: data[f"{e}/{k}"][f] for k in features}
            frame["task"] = task
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()


def read(root):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    try:
        ds = LeRobotDataset("local/vlafeed-recorded", root=root, video_backend="torchcodec")
    except Exception as e:  # noqa: BLE001 - compared by the test
        return {"__open_error__": type(e).__name__, "message": str(e)[:2000]}
    items = [dict(ds[i]) for i in range(len(ds))]
    return {"len": len(ds), "items": items, "total_episodes": ds.meta.total_episodes,
            "stats_keys": {k: sorted(v) for k, v in ds.meta.stats.items()},
            "tasks": list(ds.meta.tasks.index)}


RECORDING_NAMES = {
    "LeRobotDataset": ["create", "resume", "add_frame", "save_episode", "clear_episode_buffer", "has_pending_frames",
                       "finalize", "push_to_hub"],
    "LeRobotDatasetMetadata": ["create", "save_episode_tasks", "save_episode", "update_video_info",
                               "update_chunk_settings", "get_chunk_settings", "finalize"],
    "DatasetWriter": None,  # every public method, and __init__
}


def signatures():
    """{class: {method: [(parameter, kind, repr(default))]}} of upstream's recording names."""
    import inspect

    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.datasets.dataset_writer import DatasetWriter
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    classes = {"LeRobotDataset": LeRobotDataset, "LeRobotDatasetMetadata": LeRobotDatasetMetadata,
               "DatasetWriter": DatasetWriter}
    out = {}
    for cls_name, names in RECORDING_NAMES.items():
        cls = classes[cls_name]
        if names is None:
            names = ["__init__"] + [n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)]
        out[cls_name] = {n: [(p.name, p.kind.name, "<none>" if p.default is p.empty else repr(p.default))
                             for p in inspect.signature(getattr(cls, n)).parameters.values()]
                         for n in names}
    return out


def main(argv):
    with open(argv[1], encoding="utf-8") as f:
        job = json.load(f)
    import torch
    if job.get("record"):
        record(job["record"])
    if job.get("aggregate"):  # LeRobot's dataset tool over the recordings, read back below
        from lerobot.datasets.aggregate import aggregate_datasets
        agg = job["aggregate"]
        aggregate_datasets(repo_ids=[f"local/part{i}" for i in range(len(agg["roots"]))],
                           aggr_repo_id="local/aggregated", roots=agg["roots"], aggr_root=agg["out"])
    torch.save({"read": {root: read(root) for root in job.get("read", [])}, "signatures": signatures()}, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
