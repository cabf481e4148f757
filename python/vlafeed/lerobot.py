"""Make LeRobot's own code (lerobot-train, its dataset tools) read through vlafeed.

    import vlafeed.lerobot
    vlafeed.lerobot.patch()      # LeRobot's LeRobotDataset & co. are now vlafeed's
    ...                          # lerobot_train.train(cfg), make_dataset(cfg), ...
    vlafeed.lerobot.unpatch()    # LeRobot's own classes back

or, from the shell, lerobot-train's own command line unchanged:

    python -m vlafeed.lerobot train --dataset.repo_id=user/ds --dataset.root=/data/ds --policy.type=act ...

patch() imports LeRobot's dataset modules and replaces LeRobotDataset,
LeRobotDatasetMetadata and MultiLeRobotDataset with vlafeed's classes in
every ``lerobot`` module that holds them by name (lerobot.datasets,
lerobot_dataset, dataset_metadata, multi_dataset, factory, the scripts, ...),
so code that imported them before the patch sees vlafeed's too. A LeRobot
module imported after patch() takes the patched names from those modules.
unpatch() puts LeRobot's classes back everywhere. Both are idempotent.

The entry point (``python -m vlafeed.lerobot train|eval|... ARGS``) patches,
then runs LeRobot's console script of that name (``lerobot-train`` ...)
with ARGS as given: sys.argv is what lerobot-train would have seen.

LeRobot itself is not a dependency of vlafeed: this module imports it only
when patch() is called.
"""
import importlib
import sys

# LeRobot's public name -> vlafeed's class of that name (vlafeed.data.dataset).
NAMES = ("LeRobotDataset", "LeRobotDatasetMetadata", "MultiLeRobotDataset")

# Modules that define or import the classes by name (LeRobot 0.6). Any other
# already-imported lerobot module holding them is patched as well.
MODULES = ("lerobot.datasets.dataset_metadata", "lerobot.datasets.lerobot_dataset", "lerobot.datasets.multi_dataset",
           "lerobot.datasets.dataset_reader", "lerobot.datasets.dataset_writer", "lerobot.datasets.factory",
           "lerobot.datasets.dataset_tools", "lerobot.datasets.aggregate", "lerobot.datasets",
           "lerobot.scripts.lerobot_train")

# (module, name) -> the object patch() replaced there.
_replaced = {}
# LeRobot's own classes, looked up once before the first patch (afterwards their
# defining modules hold vlafeed's).
_upstream = {}


def _upstream_classes():
    if not _upstream:
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        from lerobot.datasets.multi_dataset import MultiLeRobotDataset
        _upstream.update(LeRobotDataset=LeRobotDataset, LeRobotDatasetMetadata=LeRobotDatasetMetadata,
                         MultiLeRobotDataset=MultiLeRobotDataset)
    return _upstream


def _vlafeed_classes():
    from vlafeed.data import dataset
    return {name: getattr(dataset, name) for name in NAMES}


def is_patched():
    """True while patch() is in effect."""
    return bool(_replaced)


def patch(modules=MODULES):
    """Replace LeRobot's dataset classes with vlafeed's in LeRobot's modules. Returns the list of
    "module.name" entries replaced. Raises ImportError (naming the module) if LeRobot is not
    installed in this interpreter."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            if name in MODULES[:3]:
                raise ImportError(f"vlafeed.lerobot.patch(): LeRobot's {name} does not import here ({e}); "
                                  f"install lerobot[dataset] into this environment") from e
            # optional modules (the scripts need LeRobot's training extras)
    upstream = _upstream_classes()
    mine = _vlafeed_classes()
    originals = {id(cls): name for name, cls in upstream.items()}
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == "lerobot" or mod_name.startswith("lerobot.")):
            continue
        for attr in NAMES:
            value = vars(module).get(attr)
            if (mod_name, attr) not in _replaced and value is not None and originals.get(id(value)) == attr:
                _replaced[(mod_name, attr)] = value
                setattr(module, attr, mine[attr])
    return sorted(f"{m}.{n}" for m, n in _replaced)


def unpatch():
    """Put back every LeRobot class patch() replaced, and LeRobot's class in any LeRobot module
    first imported while patched (it took vlafeed's from the patched modules)."""
    for (mod_name, attr), value in list(_replaced.items()):
        module = sys.modules.get(mod_name)
        if module is not None:
            setattr(module, attr, value)
        del _replaced[(mod_name, attr)]
    if not _upstream:
        return
    mine = {id(cls): name for name, cls in _vlafeed_classes().items()}
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith("lerobot."):
            continue
        for attr in NAMES:
            if mine.get(id(vars(module).get(attr))) == attr:
                setattr(module, attr, _upstream[attr])


# LeRobot's console scripts the entry point runs (lerobot 0.6's [console_scripts]).
COMMANDS = {"train": "lerobot.scripts.lerobot_train", "eval": "lerobot.scripts.lerobot_eval",
            "edit-dataset": "lerobot.scripts.lerobot_edit_dataset", "info": "lerobot.scripts.lerobot_info",
            "dataset-viz": "lerobot.scripts.lerobot_dataset_viz",
            "train-tokenizer": "lerobot.scripts.lerobot_train_tokenizer"}


def main(argv=None):
    """``python -m vlafeed.lerobot COMMAND ARGS``: patch(), then LeRobot's lerobot-COMMAND with ARGS."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        known = ", ".join(COMMANDS)
        print(f"usage: python -m vlafeed.lerobot COMMAND [LeRobot's arguments]\n"
              f"  runs LeRobot's lerobot-COMMAND with vlafeed's dataset classes; COMMAND: {known}",
              file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    # Through the importable module, not this __main__ copy, so vlafeed.lerobot.unpatch() sees it.
    this = importlib.import_module("vlafeed.lerobot")
    this.patch()
    module = importlib.import_module(COMMANDS[command])
    this.patch()  # the script module is imported now: bind its names too
    sys.argv = [f"lerobot-{command}"] + rest
    result = module.main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
