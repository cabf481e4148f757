"""The model seam of ``python -m vlafeed.train``: which model is trained, what
the loader delivers to it, how a batch becomes a loss, and how the result
is exported.

``build(cfg, meta, device) -> TrainModel`` per ``model.source``:

- ``vlafeed`` (default): the example policy of policy.py with runner.Step's
  inputs (packing included), exactly as before the seam existed.
- ``lerobot``: a LeRobot policy (``model.name``: act, diffusion, ...) built by
  LeRobot's own ``make_policy`` and ``make_pre_post_processors`` from the
  dataset's features and stats (after ``data.rename``), or loaded from a
  local ``pretrained_model/`` folder (``model.path``). The loader delivers
  what the policy's config asks for (its observation/action delta indices,
  float images in [0, 1]); the loss is the policy's own forward. LeRobot
  needs Python >= 3.12.
- ``hf``: a Hugging Face ``AutoModel*`` class (``model.name``) from a config
  (``model.config``) or a local folder (``model.path``); FSDP2 units are the
  module types named by ``_no_split_modules``. The loss is the model's own
  (``labels`` in its inputs); ``model.entry`` names ``module:fn(batch) ->
  inputs``; without it, next-token loss on each sample's instruction text.
- ``python``: ``model.entry = module:build_fn``; ``build_fn(features, stats,
  cfg)`` returns an nn.Module whose ``forward(batch)`` returns a loss tensor
  or a dict holding ``"loss"``.

``model.init_from`` loads weights only (a new run), ``data.rename`` maps
dataset keys to the keys the model expects, and ``export_main`` writes a
consolidated safetensors model (plus a LeRobot ``pretrained_model/`` folder
for LeRobot policies).
"""
from __future__ import annotations

import importlib
import json
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from vlafeed.train.config import ConfigError

ASSETS = "model"  # <checkpoint.dir>/model/: what export needs besides the weights (configs, processors)


class ModelError(ConfigError):
    """A model that cannot be built as configured; the message names the key and what to do."""


def _warn_once(is_main, message):
    if is_main:
        warnings.warn(f"vlafeed.train: {message}", stacklevel=3)


class TrainModel:
    """What the runner needs of a model.

    module: the nn.Module wrap_model wraps (FSDP2/DDP); block_types: module types that become FSDP2 units
    (besides FSDPBlock and get_fsdp_block_types()); delta_timestamps: {dataset key: [seconds]} for the loader;
    image_format: the loader's image format; describe: a few words for the start-up line."""

    source = "?"
    image_format = "uint8"
    block_types: tuple = ()
    describe = ""

    def __init__(self, module: nn.Module, delta_timestamps: dict, rename: dict):
        self.module = module
        self.delta_timestamps = delta_timestamps
        self.rename = dict(rename)

    def prepare(self, batch: dict) -> dict:
        """The batch with data.rename applied (dataset key -> model key, their _is_pad companions too)."""
        if not self.rename:
            return batch
        out = {}
        for k, v in batch.items():
            if k in self.rename:
                out[self.rename[k]] = v
            elif k.endswith("_is_pad") and k[:-7] in self.rename:
                out[self.rename[k[:-7]] + "_is_pad"] = v
            else:
                out[k] = v
        return out

    def loss(self, wrapped, batch):
        """(scalar loss of this micro-batch, {"real_tokens", "slot_tokens"})."""
        raise NotImplementedError

    def save_assets(self, folder: Path):
        """Writes what export needs besides the weights (rank 0, once per run)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vlafeed_model.json").write_text(json.dumps({"source": self.source}, indent=1))


# --------------------------------------------------------------------------------------------------
# features and stats after data.rename

def renamed_features(meta, rename) -> dict:
    feats = dict(meta.features)
    for src in rename:
        if src not in feats:
            raise ModelError(f"config key 'data.rename': the dataset has no key {src!r} (its keys: "
                             f"{', '.join(sorted(feats))})")
    return {rename.get(k, k): v for k, v in feats.items()}


def renamed_stats(meta, rename) -> dict:
    stats = meta.stats or {}
    return {rename.get(k, k): v for k, v in stats.items()}


def require_keys(features, keys, dataset, what):
    """ModelError naming the first key the model needs that the (renamed) dataset lacks."""
    for key in keys:
        if key not in features:
            have = ", ".join(sorted(k for k in features if not k.endswith("_index") and k not in
                                    ("timestamp", "index")))
            raise ModelError(f"dataset {dataset}: {what} needs the key {key!r}, which the dataset does not have "
                             f"(it has: {have}); map a dataset key to it with data.rename, e.g. "
                             f"--data.rename '{{<dataset key>: {key}}}'")


class _RenamedMeta:
    """The dataset metadata as the model sees it (LeRobot's make_policy reads features and stats)."""

    def __init__(self, meta, rename):
        self._meta = meta
        self.features = renamed_features(meta, rename)
        self.stats = renamed_stats(meta, rename)
        self.fps = meta.fps
        self.camera_keys = [rename.get(k, k) for k in meta.camera_keys]
        self.robot_type = getattr(meta, "robot_type", None)

    def __bool__(self):
        return True


# --------------------------------------------------------------------------------------------------
# vlafeed: the example policy

class VlafeedModel(TrainModel):
    source = "vlafeed"
    image_format = "uint8"

    def __init__(self, cfg, meta, device):
        from vlafeed.train import runner
        rename = cfg.data.rename
        feats = renamed_features(meta, rename)
        require_keys(feats, ["observation.state", "action"], cfg.data.dataset, "model.source vlafeed")
        view = _RenamedMeta(meta, rename)
        model, cams, hw, state_dim, action_dim = runner.build_model(cfg, view, device)
        fps = float(meta.fps)
        inverse = {v: k for k, v in rename.items()}
        super().__init__(model, {inverse.get("action", "action"): [i / fps for i in range(cfg.data.chunk)]},
                         rename)
        self.step = runner.Step(cfg, model, cams, view.stats, state_dim, action_dim, device)
        self.describe = f"attention {model.attention}"
        self.packed = cfg.packing.enabled
        self.ctor = {"num_cameras": len(cams), "image_hw": list(hw), "state_dim": state_dim,
                     "action_dim": action_dim}

    def loss(self, wrapped, batch):
        from vlafeed.train.policy import per_sample_loss
        images, state, samples, layout, target, valid = self.step.inputs(self.prepare(batch), self.packed)
        pred = wrapped(images, state, samples, layout)
        return per_sample_loss(pred, target, valid).mean(), {"real_tokens": layout.real_tokens,
                                                             "slot_tokens": layout.slots}

    def save_assets(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vlafeed_model.json").write_text(json.dumps({"source": self.source, "policy": self.ctor},
                                                              indent=1))


# --------------------------------------------------------------------------------------------------
# lerobot: LeRobot's own policies and processors

LEROBOT_EXTRA_DEPS = {  # policy type -> what its modeling code imports beyond lerobot's core
    "smolvla": "transformers (pip install 'lerobot[smolvla]')",
    "pi0": "transformers (pip install 'lerobot[pi]')",
    "pi05": "transformers (pip install 'lerobot[pi]')",
}
# FSDP2 units per policy type: (module path, class names)
LEROBOT_BLOCKS = {
    "act": ("lerobot.policies.act.modeling_act", ("ACTEncoderLayer", "ACTDecoderLayer")),
    "diffusion": ("lerobot.policies.diffusion.modeling_diffusion", ("DiffusionConditionalResidualBlock1d",)),
}


def import_lerobot():
    try:
        import lerobot  # noqa: F401
        from lerobot.policies import factory  # noqa: F401
    except ImportError as e:
        raise ModelError(f"model.source lerobot: LeRobot is not importable in this Python ({sys.version.split()[0]} "
                         f"at {sys.executable}): {e}. LeRobot 0.6 needs Python >= 3.12: install vlafeed and "
                         f"lerobot into a 3.12 environment (tests/python/install_lerobot06.sh builds one)") from None
    return factory


def _looks_like_hub_id(path: str) -> bool:
    return not Path(path).exists() and path.count("/") == 1 and not path.startswith((".", "/", "~"))


def check_local_folder(key, path, needs):
    p = Path(path).expanduser()
    if _looks_like_hub_id(path):
        raise ModelError(f"config key '{key}': {path!r} is not a local folder; it looks like a Hugging Face Hub id, "
                         f"and this run has no network: download it first (huggingface-cli download {path} "
                         f"--local-dir DIR) and set {key} to DIR")
    if not p.is_dir():
        raise ModelError(f"config key '{key}': {p} is not a directory")
    missing = [n for n in needs if not (p / n).exists()]
    if missing:
        raise ModelError(f"config key '{key}': {p} has no {', '.join(missing)}")
    return p


class LeRobotModel(TrainModel):
    source = "lerobot"
    image_format = "float32"

    def __init__(self, cfg, meta, device):
        factory = import_lerobot()
        from lerobot.configs.policies import PreTrainedConfig
        m = cfg.model
        view = _RenamedMeta(meta, cfg.data.rename)
        if m.path:
            folder = check_local_folder("model.path", m.path, ["config.json", "model.safetensors"])
            pcfg = PreTrainedConfig.from_pretrained(str(folder))
            if m.name and m.name != pcfg.type:
                raise ModelError(f"config key 'model.name': {m.name!r}, but {folder}/config.json is a {pcfg.type!r}"
                                 f" policy")
            for k, v in m.overrides.items():
                self._override(pcfg, k, v)
            pcfg.pretrained_path = str(folder)
        else:
            if m.name in LEROBOT_EXTRA_DEPS:
                try:
                    importlib.import_module("transformers")
                except ImportError:
                    raise ModelError(f"model.name {m.name!r}: this LeRobot policy needs "
                                     f"{LEROBOT_EXTRA_DEPS[m.name]}, which is not installed") from None
            try:
                cls = PreTrainedConfig.get_choice_class(m.name)
            except Exception:
                raise ModelError(f"config key 'model.name': {m.name!r} is not a LeRobot policy type (known: "
                                 f"{', '.join(sorted(PreTrainedConfig.get_known_choices()))})") from None
            pcfg = cls()
            for k, v in m.overrides.items():
                self._override(pcfg, k, v)
        pcfg.device = device.type
        if hasattr(pcfg, "push_to_hub"):
            pcfg.push_to_hub = False
        feats = view.features
        require_keys(feats, ["action"], cfg.data.dataset, f"LeRobot policy {pcfg.type!r}")
        if not any(k.startswith("observation.") for k in feats):
            require_keys(feats, ["observation.state"], cfg.data.dataset, f"LeRobot policy {pcfg.type!r}")
        try:
            policy = factory.make_policy(pcfg, ds_meta=view)
        except ImportError as e:
            raise ModelError(f"LeRobot policy {pcfg.type!r} needs a package that is not installed: {e} "
                             f"(pip install it into this environment)") from None
        except (KeyError, ValueError) as e:
            raise ModelError(f"LeRobot policy {pcfg.type!r} cannot be built from dataset {cfg.data.dataset} "
                             f"(keys after data.rename: {', '.join(sorted(feats))}): {e}; map dataset keys to the "
                             f"policy's with data.rename") from None
        policy.train()
        stats = {k: {s: torch.as_tensor(v) for s, v in d.items()} for k, d in view.stats.items()}
        if m.path:  # a fine-tune: the pretrained pipelines, normalised with this dataset's stats (as lerobot-train)
            feats_io = {**pcfg.input_features, **pcfg.output_features}
            pre, post = factory.make_pre_post_processors(
                pcfg, pretrained_path=str(pcfg.pretrained_path), dataset_stats=stats,
                preprocessor_overrides={"device_processor": {"device": device.type},
                                        "normalizer_processor": {"features": feats_io, "stats": stats,
                                                                 "norm_map": pcfg.normalization_mapping}},
                postprocessor_overrides={"unnormalizer_processor": {"features": pcfg.output_features, "stats": stats,
                                                                    "norm_map": pcfg.normalization_mapping}})
        else:
            pre, post = factory.make_pre_post_processors(pcfg, dataset_stats=stats)
        self.preprocessor, self.postprocessor, self.config = pre, post, pcfg
        fps = float(meta.fps)
        inverse = {v: k for k, v in cfg.data.rename.items()}
        dts = {}
        obs = pcfg.observation_delta_indices
        act = pcfg.action_delta_indices
        for key in pcfg.input_features:
            if obs is not None and key in feats:
                dts[inverse.get(key, key)] = [i / fps for i in obs]
        for key in pcfg.output_features:
            if act is not None:
                dts[inverse.get(key, key)] = [i / fps for i in act]
        super().__init__(policy, dts, cfg.data.rename)
        # the policy's vector features as declared ((1,) for a 1-dim action): a loader column of shape
        # [B] or [B, T] for such a key gets its trailing dimension back before the policy sees it
        self.vector_shapes = {k: tuple(f.shape) for k, f in {**pcfg.input_features, **pcfg.output_features}.items()
                              if len(tuple(f.shape)) == 1}
        self.windowed = {cfg.data.rename.get(k, k) for k in dts}  # in the policy's names
        blocks = LEROBOT_BLOCKS.get(pcfg.type)
        if blocks:
            mod = importlib.import_module(blocks[0])
            self.block_types = tuple(getattr(mod, n) for n in blocks[1] if hasattr(mod, n))
        self.describe = f"LeRobot {pcfg.type} ({sum(p.numel() for p in policy.parameters())} parameters)"

    @staticmethod
    def _override(pcfg, key, value):
        if not hasattr(pcfg, key):
            raise ModelError(f"config key 'model.overrides': {type(pcfg).__name__} has no field {key!r}")
        current = getattr(pcfg, key)
        if isinstance(current, tuple) and isinstance(value, list):
            value = tuple(value)
        setattr(pcfg, key, value)

    def with_feature_dims(self, batch: dict) -> dict:
        """A 1-dim vector feature read back as [B] (or [B, T] when windowed) gets its declared last dimension."""
        out = dict(batch)
        for key, shape in self.vector_shapes.items():
            v = out.get(key)
            if isinstance(v, torch.Tensor) and shape == (1,):
                want = 3 if key in self.windowed else 2
                if v.dim() == want - 1:
                    out[key] = v.unsqueeze(-1)
        return out

    def loss(self, wrapped, batch):
        batch = self.with_feature_dims(self.prepare(batch))
        n = int(batch["action"].shape[0]) if "action" in batch else 0
        batch = self.preprocessor(batch)
        out = wrapped(batch)
        loss = out[0] if isinstance(out, tuple) else out["loss"] if isinstance(out, dict) else out
        return loss, {"real_tokens": n, "slot_tokens": n}

    def save_assets(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        self.config._save_pretrained(folder)
        self.preprocessor.save_pretrained(folder)
        self.postprocessor.save_pretrained(folder)
        (folder / "vlafeed_model.json").write_text(json.dumps({"source": self.source, "type": self.config.type},
                                                              indent=1))


# --------------------------------------------------------------------------------------------------
# hf: Hugging Face transformers models

def _import_entry(key, spec):
    if not spec or ":" not in spec:
        raise ModelError(f"config key '{key}': {spec!r} is not 'package.module:function'")
    mod, fn = spec.split(":", 1)
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise ModelError(f"config key '{key}': cannot import {mod!r} ({e}); is it on PYTHONPATH?") from None
    obj = getattr(module, fn, None)
    if not callable(obj):
        raise ModelError(f"config key '{key}': module {mod!r} has no callable {fn!r}")
    return obj


def hf_block_types(model: nn.Module) -> tuple:
    """Module types FSDP2 shards one by one: get_fsdp_block_types() if the model has it, else the classes
    named by transformers' _no_split_modules (on the model or any sub-model)."""
    getter = getattr(model, "get_fsdp_block_types", None)
    if callable(getter):
        return tuple(getter())
    names = set()
    for mod in model.modules():
        names.update(getattr(mod, "_no_split_modules", None) or ())
    return tuple({type(m) for m in model.modules() if type(m).__name__ in names})


def default_text_inputs(tokenizer, max_tokens, pad_id, bos=None, eos=None):
    """The default batch -> inputs of a causal LM: each sample's instruction text ("task"), tokenized
    (between bos and eos when given), cut to max_tokens, padded right; labels are the input ids with the
    padding set to -100 (ignored by the loss; the model shifts them for next-token prediction)."""
    def fn(batch):
        ends = ([bos] if bos is not None else [], [eos] if eos is not None else [])
        rows = [(ends[0] + list(tokenizer(t)) + ends[1])[:max_tokens] for t in batch["task"]]
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return fn


class HFModel(TrainModel):
    source = "hf"
    image_format = "uint8"

    def __init__(self, cfg, meta, device, is_main=True):
        try:
            import transformers
        except ImportError:
            raise ModelError("model.source hf needs transformers: pip install transformers "
                             "(scripts/install-deps.sh pins the tested version)") from None
        m = cfg.model
        cls = getattr(transformers, m.name, None)
        if cls is None or not m.name.startswith("AutoModel"):
            raise ModelError(f"config key 'model.name': {m.name!r} is not a transformers AutoModel* class "
                             f"(e.g. AutoModelForCausalLM)")
        if m.path:
            folder = check_local_folder("model.path", m.path, ["config.json"])
            model = cls.from_pretrained(str(folder))
        else:
            if isinstance(m.config, dict):
                kwargs = dict(m.config)
                if "model_type" not in kwargs:
                    raise ModelError("config key 'model.config': the mapping needs model_type (e.g. qwen2)")
                try:
                    hf_cfg = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
                except ValueError as e:
                    raise ModelError(f"config key 'model.config': {e}") from None
            else:
                p = Path(m.config)
                if not p.is_file():
                    raise ModelError(f"config key 'model.config': {p} is not a file (a config.json, or a mapping)")
                hf_cfg = transformers.AutoConfig.from_pretrained(str(p))
            model = cls.from_config(hf_cfg)
        model.train()
        self.hf_config = model.config
        super().__init__(model, {}, cfg.data.rename)
        self.block_types = hf_block_types(model)
        if not self.block_types:
            _warn_once(is_main, f"{type(model).__name__} names no _no_split_modules and has no "
                                f"get_fsdp_block_types(): FSDP2 wraps it into one unit (all parameters gathered "
                                f"at once); subclass its layers from vlafeed.train.FSDPBlock or define "
                                f"get_fsdp_block_types()")
        if m.entry:
            self.inputs = _import_entry("model.entry", m.entry)
        else:
            from vlafeed.train.packing import BOS, EOS, PAD, load_tokenizer
            tok = load_tokenizer(m.tokenizer)
            pad = getattr(model.config, "pad_token_id", None)
            vocab = getattr(model.config, "vocab_size", None)
            if m.tokenizer == "bytes" and vocab is not None and vocab <= PAD:
                raise ModelError(f"config key 'model.config': vocab_size {vocab} is too small for the default "
                                 f"byte tokenizer (ids 0..{PAD}); use >= {PAD + 1} or set model.entry")
            bytes_ends = (BOS, EOS) if m.tokenizer == "bytes" else (None, None)
            self.inputs = default_text_inputs(tok, m.max_text_tokens or 48, PAD if pad is None else pad, *bytes_ends)
        self.device = device
        self.describe = f"{type(model).__name__} ({sum(p.numel() for p in model.parameters())} parameters)"

    def loss(self, wrapped, batch):
        inputs = self.inputs(self.prepare(batch))
        if not isinstance(inputs, dict) or "labels" not in inputs:
            raise ModelError("model.entry: the function must return a dict of model inputs including 'labels'")
        inputs = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        out = wrapped(**inputs)
        n = int((inputs["labels"] != -100).sum())
        slots = int(inputs["labels"].numel())
        return out.loss, {"real_tokens": n, "slot_tokens": slots}

    def save_assets(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        self.hf_config.save_pretrained(folder)
        (folder / "vlafeed_model.json").write_text(json.dumps({"source": self.source}, indent=1))


# --------------------------------------------------------------------------------------------------
# python: the user's own module

class PythonModel(TrainModel):
    source = "python"
    image_format = "float32"

    def __init__(self, cfg, meta, device):
        build_fn = _import_entry("model.entry", cfg.model.entry)
        rename = cfg.data.rename
        module = build_fn(renamed_features(meta, rename), renamed_stats(meta, rename), cfg)
        if not isinstance(module, nn.Module):
            raise ModelError(f"model.entry {cfg.model.entry!r} returned {type(module).__name__}, not an nn.Module")
        fps = float(meta.fps)
        inverse = {v: k for k, v in rename.items()}
        dts = getattr(module, "delta_timestamps", None)
        if dts is None:
            dts = {"action": [i / fps for i in range(cfg.data.chunk)]}
        dts = {inverse.get(k, k): v for k, v in dts.items()}
        super().__init__(module, dts, rename)
        self.image_format = getattr(module, "image_format", "float32")
        self.device = device
        self.describe = f"{type(module).__name__} from {cfg.model.entry}"

    def loss(self, wrapped, batch):
        batch = self.prepare(batch)
        batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        n = len(batch["index"]) if "index" in batch else 0
        out = wrapped(batch)
        if isinstance(out, dict):
            if "loss" not in out:
                raise ModelError(f"model.entry {type(self.module).__name__}.forward returned a dict without 'loss'")
            out = out["loss"]
        if not isinstance(out, torch.Tensor) or out.dim() != 0:
            raise ModelError(f"{type(self.module).__name__}.forward must return a scalar loss tensor (or a dict "
                             f"with 'loss'), got {type(out).__name__}")
        return out, {"real_tokens": n, "slot_tokens": n}


SOURCES = {"vlafeed": VlafeedModel, "lerobot": LeRobotModel, "hf": HFModel, "python": PythonModel}


def build(cfg, meta, device, is_main=True) -> TrainModel:
    """The TrainModel of cfg.model.source (the module built with the RNG as the caller seeded it)."""
    source = cfg.model.source
    if source not in SOURCES:
        raise ModelError(f"config key 'model.source': {source!r} is not one of {', '.join(SOURCES)}")
    if source == "hf":
        tm = HFModel(cfg, meta, device, is_main)
    else:
        tm = SOURCES[source](cfg, meta, device)
    if cfg.model.init_from:
        init_from(tm.module, cfg.model.init_from)
    return tm


# --------------------------------------------------------------------------------------------------
# weights: full state dicts from checkpoints, safetensors, init_from

def full_state_dict_from_checkpoint(path) -> dict:
    """The model's full (unsharded) state dict from a vlafeed.train DCP checkpoint, read without running
    code from it (the same allowlisted reader as resume)."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from vlafeed.train import checkpoint as ckpt
    path = Path(path)
    ckpt.read_meta(path)
    safe = ckpt._safe_dcp_planner(path)

    class Planner(_EmptyStateDictLoadPlanner):
        load_bytes = type(safe).load_bytes

    sd = {}
    _load_state_dict(sd, storage_reader=ckpt._safe_dcp_reader(path), planner=Planner(keys={"model"}), no_dist=True)
    model = sd.get("model", {})
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}


def read_weights(where) -> dict:
    """State dict from a checkpoint directory (vlafeed.json), a folder holding model.safetensors (an export or a
    LeRobot pretrained_model/) or a .safetensors file."""
    from vlafeed.train import checkpoint as ckpt
    p = Path(where)
    if _looks_like_hub_id(str(where)):
        check_local_folder("model.init_from", str(where), [])
    if p.is_dir() and (p / ckpt.META).is_file():
        return full_state_dict_from_checkpoint(p)
    if p.is_dir() and (p / "latest").is_file():
        return full_state_dict_from_checkpoint(ckpt.latest(p))
    for cand in (p, p / "model.safetensors", p / "pretrained_model" / "model.safetensors"):
        if cand.is_file() and cand.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(cand))
    raise ModelError(f"config key 'model.init_from': {p} is neither a vlafeed.train checkpoint (no {ckpt.META}), nor "
                     f"a folder with model.safetensors, nor a .safetensors file")


def init_from(module: nn.Module, where):
    """Copies weights into module (before wrapping): every tensor must exist with the same shape."""
    sd = read_weights(where)
    own = module.state_dict()
    for k, v in own.items():
        if k not in sd:
            raise ModelError(f"config key 'model.init_from': {where} has no tensor {k!r} that the model has")
        if tuple(sd[k].shape) != tuple(v.shape):
            raise ModelError(f"config key 'model.init_from': tensor {k!r} has shape {list(sd[k].shape)} in {where}, "
                             f"{list(v.shape)} in the model")
    extra = sorted(set(sd) - set(own))
    if extra:
        raise ModelError(f"config key 'model.init_from': {where} holds tensor {extra[0]!r} (and {len(extra) - 1} "
                         f"more) that the model does not have")
    with torch.no_grad():
        module.load_state_dict({k: sd[k].to(v.dtype) for k, v in own.items()}, strict=True)


# --------------------------------------------------------------------------------------------------
# export

EXPORT_USAGE = """usage: python -m vlafeed.train export CHECKPOINT OUT

Writes OUT/model.safetensors (the consolidated model: every FSDP2 shard gathered) and
OUT/config.json (the run's config and the model's source). CHECKPOINT is a step_<N>
directory or a checkpoint.dir (its latest). For a LeRobot policy also writes
OUT/pretrained_model/ (config.json, model.safetensors, the pre/post-processors) that
LeRobot's PolicyClass.from_pretrained(OUT/pretrained_model) loads."""


def export(checkpoint, out) -> Path:
    from safetensors.torch import save_file

    from vlafeed.train import checkpoint as ckpt
    path = Path(checkpoint)
    if path.is_dir() and not (path / ckpt.META).is_file() and (path / "latest").is_file():
        path = ckpt.latest(path)
    meta = ckpt.read_meta(path)
    run = meta.get("config") or {}
    assets = path.parent / ASSETS
    info = json.loads((assets / "vlafeed_model.json").read_text()) if (assets / "vlafeed_model.json").is_file() \
        else {"source": (run.get("model") or {}).get("source", "vlafeed")}
    sd = full_state_dict_from_checkpoint(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in sd.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", "step": str(meta["step"])})
    (out / "config.json").write_text(json.dumps({"step": meta["step"], "model": info, "run": run}, indent=1))
    if info["source"] == "hf" and (assets / "config.json").is_file():
        shutil.copy(assets / "config.json", out / "hf_config.json")
    if info["source"] == "lerobot":
        _export_lerobot(assets, sd, out / "pretrained_model")
    return out


def _export_lerobot(assets, sd, folder):
    import_lerobot()
    if not (assets / "config.json").is_file():
        raise ModelError(f"{assets}/config.json is missing: the LeRobot policy's config and processors are written "
                         f"there when a run starts; without them the pretrained_model/ folder cannot be made")
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class
    pcfg = PreTrainedConfig.from_pretrained(str(assets))
    pcfg.pretrained_path = None
    policy = get_policy_class(pcfg.type)(pcfg)
    missing, unexpected = policy.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ModelError(f"{assets}: the checkpoint does not fit a {pcfg.type} policy of this config "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    policy.save_pretrained(folder)
    for f in assets.iterdir():
        if f.name.startswith(("policy_preprocessor", "policy_postprocessor")):
            shutil.copy(f, folder / f.name)


def export_main(argv) -> int:
    from vlafeed.train import checkpoint as ckpt
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(EXPORT_USAGE, file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        out = export(argv[0], argv[1])
    except (ModelError, ckpt.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    print(f"exported {argv[0]} to {out}" + (f" (LeRobot: {out / 'pretrained_model'})"
                                            if (out / "pretrained_model").is_dir() else ""), flush=True)
    return 0

