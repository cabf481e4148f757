"""Runs LeRobot's own dataset tools on vlafeed's objects and on LeRobot's.

Executed by tests/python/test_lerobot_train_upstream.py with the python of
build-lerobot/venv312 (LeRobot 0.6), PYTHONPATH=python:

  python lerobot_tools_runner.py upstream|vlafeed DATASET_ROOT OUT_DIR OUT.json

Two paths of LeRobot's code that read ``meta.info`` and the rest of the
metadata, run unchanged:

  * lerobot.datasets.dataset_tools.split_dataset(dataset, {"a": [0, 2],
    "b": [1, 3]}, output_dir=OUT_DIR): the dataset is LeRobot's
    LeRobotDataset or vlafeed's; LeRobot writes the two splits itself;
  * LeRobot's MultiLeRobotDataset over [DATASET_ROOT, DATASET_ROOT] (it reads
    ``meta.info.fps``, ``features`` through datasets.Features, and
    aggregates ``meta.stats``); for "vlafeed" its children are vlafeed's
    (vlafeed.lerobot.patch() before it is built, LeRobot's class itself kept).

OUT.json: {"split": {name: {"info": info.json, "episodes": [...],
"data": {column: values}}}, "multi": {"len", "fps", "items": [sha256...],
"stats": {feature: {stat: list}}}, "child_class"}.
"""
import hashlib
import json
import pathlib
import sys


def item_digest(item):
    import torch
    h = hashlib.sha256()
    for key, value in item.items():
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(json.dumps(value, default=repr).encode())
    return h.hexdigest()


def read_split(root):
    import pyarrow.parquet as pq
    root = pathlib.Path(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    episodes = [pq.read_table(f).to_pylist() for f in sorted((root / "meta" / "episodes").glob("*/*.parquet"))]
    data = {}
    for f in sorted((root / "data").glob("*/*.parquet")):
        for k, v in pq.read_table(f).to_pydict().items():
            data.setdefault(k, []).extend(v)
    return {"info": info, "episodes": episodes, "data": data,
            "videos": sorted(str(p.relative_to(root)) for p in (root / "videos").rglob("*.mp4"))}


def main(argv):
    mode, root, out_dir, out = argv[1], pathlib.Path(argv[2]), pathlib.Path(argv[3]), argv[4]
    from lerobot.datasets import dataset_tools
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as UpstreamDataset
    from lerobot.datasets.multi_dataset import MultiLeRobotDataset as UpstreamMulti
    if mode == "vlafeed":
        import vlafeed
        dataset = vlafeed.LeRobotDataset("local/tools", root=root)
    else:
        dataset = UpstreamDataset("local/tools", root=root)
    record = {"dataset_class": f"{type(dataset).__module__}.{type(dataset).__qualname__}"}
    # LeRobot writes the splits with its own classes (LeRobotDatasetMetadata.create), reading the source
    # through the dataset object it is given.
    splits = dataset_tools.split_dataset(dataset, {"a": [0, 2], "b": [1, 3]}, output_dir=out_dir)
    record["split"] = {name: read_split(out_dir / name) for name in splits}
    record["split_lens"] = {name: len(ds) for name, ds in splits.items()}
    if mode == "vlafeed":
        import vlafeed.lerobot
        vlafeed.lerobot.patch()  # UpstreamMulti (kept by reference) now builds vlafeed children
    twin = root.parent / (root.name + "-twin")
    if not twin.exists():
        twin.symlink_to(root)
    multi = UpstreamMulti([root.name, twin.name], root=root.parent)
    record["child_class"] = f"{type(multi._datasets[0]).__module__}.{type(multi._datasets[0]).__qualname__}"
    positions = sorted({0, 1, len(multi) // 2 - 1, len(multi) // 2, len(multi) - 1})
    record["multi"] = {"len": len(multi), "fps": multi.fps, "positions": positions,
                       "items": [item_digest(multi[p]) for p in positions],
                       "stats": {k: {s: v.tolist() for s, v in st.items()} for k, st in multi.stats.items()},
                       "disabled": sorted(multi.disabled_features)}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(record, f, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
