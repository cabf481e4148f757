"""Runs LeRobot's own lerobot-train, unchanged, and records what it trained on.

Executed by tests/python/test_lerobot_train_upstream.py with the python of
build-lerobot/venv312 (LeRobot 0.6), PYTHONPATH=python so vlafeed imports:

  python lerobot_train_runner.py upstream OUT.json LEROBOT-TRAIN-ARGS...
  python lerobot_train_runner.py vlafeed  OUT.json LEROBOT-TRAIN-ARGS...

"upstream" calls lerobot.scripts.lerobot_train.main() with the arguments as
sys.argv; "vlafeed" runs the same arguments through vlafeed's entry point,
``python -m vlafeed.lerobot train ARGS`` (vlafeed.lerobot.main), which
patches LeRobot's dataset classes and then calls the same main(). Nothing in
LeRobot's training code is replaced; three of its functions are wrapped to
observe, each calling the original unchanged:

  * make_train_eval_datasets: records the dataset's class (proving whose
    class was trained on) and wraps that class's __getitem__ to hash every
    item the DataLoader asks for (index, then each value's dtype, shape and
    bytes);
  * update_policy: hashes every tensor of the (preprocessed) batch before
    the step, and reads the step's loss and gradient norm from LeRobot's
    MetricsTracker afterwards (Python floats: exact in JSON).

With an eval split (--dataset.eval_split, --eval_steps) the items of the
held-out dataset are hashed too, and make_policy is wrapped to record the
loss of every forward pass the policy makes in eval mode (LeRobot's eval loop).

OUT: {"dataset_class", "meta_class", "num_frames", "num_episodes",
"items": [[index, sha256], ...], "eval_items": [...], "eval_losses": [float],
"steps": [{"batch": {key: sha256}, "loss": float, "grad_norm": float}, ...]}.
"""
import hashlib
import json
import sys


def digest(value):
    import numpy as np
    import torch
    h = hashlib.sha256()
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(json.dumps(value, default=repr, sort_keys=True).encode())
    return h.hexdigest()


def item_digest(item):
    h = hashlib.sha256()
    for key, value in item.items():
        h.update(key.encode())
        h.update(digest(value).encode())
    return h.hexdigest()


def install_probes(train_module, record):
    original_make = train_module.make_train_eval_datasets
    original_update = train_module.update_policy

    def make_train_eval_datasets(cfg):
        dataset, eval_dataset = original_make(cfg)
        cls = type(dataset)
        record["dataset_class"] = f"{cls.__module__}.{cls.__qualname__}"
        record["meta_class"] = f"{type(dataset.meta).__module__}.{type(dataset.meta).__qualname__}"
        record["num_frames"], record["num_episodes"] = dataset.num_frames, dataset.num_episodes
        record["episodes"] = None if dataset.episodes is None else [int(e) for e in dataset.episodes]
        original_getitem = cls.__getitem__

        if eval_dataset is not None:
            record["eval_episodes"] = [int(e) for e in eval_dataset.episodes]
            record["eval_num_frames"] = eval_dataset.num_frames

        def __getitem__(self, idx):
            item = original_getitem(self, idx)
            if self is dataset:
                record["items"].append([int(idx), item_digest(item)])
            elif self is eval_dataset:
                record["eval_items"].append([int(idx), item_digest(item)])
            return item

        cls.__getitem__ = __getitem__
        return dataset, eval_dataset

    def update_policy(train_metrics, policy, batch, *args, **kwargs):
        step = {"batch": {k: digest(v) for k, v in batch.items()}}
        result = original_update(train_metrics, policy, batch, *args, **kwargs)
        tracker = result[0]
        step["loss"] = float(tracker.loss.val)
        step["grad_norm"] = float(tracker.grad_norm.val)
        record["steps"].append(step)
        return result

    train_module.make_train_eval_datasets = make_train_eval_datasets
    train_module.update_policy = update_policy

    original_make_policy = train_module.make_policy

    def make_policy(*args, **kwargs):
        policy = original_make_policy(*args, **kwargs)
        forward = policy.forward

        def forward_recording_eval(*f_args, **f_kwargs):
            out = forward(*f_args, **f_kwargs)
            if not policy.training:  # LeRobot's eval loop (policy.eval(), then forward per batch)
                record["eval_losses"].append(float(out[0].item()))
            return out

        policy.forward = forward_recording_eval
        return policy

    train_module.make_policy = make_policy


def main(argv):
    mode, out, args = argv[1], argv[2], argv[3:]
    import torch
    torch.set_num_threads(1)
    import lerobot.scripts.lerobot_train as train_module
    record = {"items": [], "eval_items": [], "eval_losses": [], "steps": []}
    install_probes(train_module, record)
    if mode == "upstream":
        sys.argv = ["lerobot-train"] + args
        train_module.main()
    elif mode == "vlafeed":
        import vlafeed.lerobot
        rc = vlafeed.lerobot.main(["train"] + args)
        vlafeed.lerobot.unpatch()
        if rc:
            return rc
    else:
        raise SystemExit(f"mode must be upstream or vlafeed, not {mode!r}")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
