"""Dumps the public surface of upstream LeRobot's dataset classes as JSON.

Run by tests/python/test_lerobot_surface.py with the python of
build-lerobot/venv312 (LeRobot 0.6), never imported by the main test process:

  python lerobot_surface_dump.py DATASET_ROOT OUT.json

For LeRobotDataset, LeRobotDatasetMetadata and MultiLeRobotDataset it writes
every public name LeRobot defines: the class's own (methods, classmethods,
staticmethods, properties, with ``inspect.signature`` of each callable and
of the constructor) and the attributes an instance opened on DATASET_ROOT
sets in its constructor. The surface is read from LeRobot itself, so a new
LeRobot release shows up as a difference rather than going unnoticed.
"""
import inspect
import json
import sys
from pathlib import Path


def describe_parameter(p):
    default = None if p.default is inspect.Parameter.empty else repr(p.default)
    return {"name": p.name, "kind": p.kind.name, "has_default": p.default is not inspect.Parameter.empty,
            "default": default}


def describe_callable(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [describe_parameter(p) for p in sig.parameters.values()]


def class_surface(cls, instance):
    names = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(cls, name)
        owner = next((k.__module__ for k in cls.__mro__ if name in vars(k)), "")
        if isinstance(static, property):
            entry = {"kind": "property", "settable": static.fset is not None}
        elif isinstance(static, classmethod):
            entry = {"kind": "classmethod", "signature": describe_callable(getattr(cls, name))}
        elif isinstance(static, staticmethod):
            entry = {"kind": "staticmethod", "signature": describe_callable(getattr(cls, name))}
        elif callable(static):
            entry = {"kind": "method", "signature": describe_callable(static)}
        else:
            entry = {"kind": "class attribute"}
        entry["defined_in"] = owner
        names[name] = entry
    if instance is not None:
        for name in vars(instance):
            if not name.startswith("_") and name not in names:
                names[name] = {"kind": "instance attribute", "type": type(getattr(instance, name)).__name__,
                               "defined_in": cls.__module__}
    return {"init": describe_callable(cls.__init__), "names": names,
            "bases": [f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]]}


def main(argv):
    root, out = Path(argv[1]), Path(argv[2])
    import importlib.metadata as md
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.datasets.multi_dataset import MultiLeRobotDataset
    ds = LeRobotDataset("local/surface", root=root, video_backend="pyav")
    meta = LeRobotDatasetMetadata("local/surface", root=root)
    multi = MultiLeRobotDataset([root.name], root=root.parent, video_backend="pyav")
    dump = {"lerobot_version": md.version("lerobot"),
            "LeRobotDataset": class_surface(LeRobotDataset, ds),
            "LeRobotDatasetMetadata": class_surface(LeRobotDatasetMetadata, meta),
            "MultiLeRobotDataset": class_surface(MultiLeRobotDataset, multi),
            "values": {"root_type": type(ds.root).__name__, "meta_root_type": type(meta.root).__name__,
                       "revision": ds.revision, "meta_revision": meta.revision, "url_root": meta.url_root,
                       "info_type": type(meta.info).__name__, "info_dict": meta.info.to_dict(),
                       "names": meta.names, "depth_keys": meta.depth_keys,
                       "has_language_columns": meta.has_language_columns,
                       "absolute_to_relative_idx": ds.absolute_to_relative_idx,
                       "num_frames": ds.num_frames, "num_episodes": ds.num_episodes,
                       "multi_num_frames": multi.num_frames, "multi_camera_keys": multi.camera_keys,
                       "shapes": {k: list(v) for k, v in meta.shapes.items()},
                       "chunk_settings": meta.get_chunk_settings()}}
    out.write_text(json.dumps(dump, indent=1, sort_keys=True, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
