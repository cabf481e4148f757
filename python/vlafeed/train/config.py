"""Run configuration for ``python -m vlafeed.train``: typed sections, a YAML
file and ``--section.key value`` overrides on the command line.

Every key is declared below with its type and default. A YAML key or an
override that is not declared, or a value of the wrong type, raises
ConfigError naming the key (and the file) before anything is built, so a
typo never silently trains with a default. A value outside its range
(INT_RANGES, FLOAT_RANGES: e.g. a learning rate that is not a finite
number > 0, a negative step count, an absurd chunk or image size) raises
ConfigError naming the key, the value and the range.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path


# parameter names (fnmatch) without weight decay by default; 0-dim and 1-dim parameters never decay either
NO_DECAY_DEFAULT = ("*bias", "*norm*", "*embed*", "*ln_*", "*scale")


class ConfigError(ValueError):
    """A config key that does not exist, a value of the wrong type or out of its range, or a
    checkpoint directory that cannot be written."""


@dataclass
class DataConfig:
    dataset: str = ""              # LeRobot dataset root (required)
    mode: str = "stream"           # vlafeed.Loader mode: stream | pool
    batch_size: int = 8            # samples per micro-batch per rank
    seed: int = 0                  # the loader's order seed
    chunk: int = 10                # action chunk length (steps of 1/fps)
    loader_threads: int = 1        # engine threads per rank
    image_size: int = 0            # resize cameras to image_size x image_size (0: as stored)
    # t-models: key mapping and episode selection (models.py)
    rename: dict = field(default_factory=dict)   # {dataset key: key the model expects}
    episodes: list = field(default_factory=list)  # episode indices to train on ([]: all)
    # -- data windows, augmentation and mixing (train/data.py) --
    obs_steps: int = 1             # observation frames per sample: the current one and obs_steps - 1 before it
    delta_timestamps: dict = field(default_factory=dict)  # {key: [seconds, ...]} for observation keys
    augment: str = ""              # image augmentation: built-in names (comma-separated) or package.module:fn
    mix: list = field(default_factory=list)  # [{dataset|shards: path, weight: w, rename: {old: new}}, ...]
    mix_window: int = 0            # Mix window in samples (0: data.batch_size)


@dataclass
class ModelConfig:
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    patch: int = 16                # image patch size: tokens per camera = (H/patch) x (W/patch)
    max_text_tokens: int = 48      # instruction tokens kept per sample (byte-level tokenizer)
    vocab_size: int = 259          # 256 bytes + bos/eos/pad
    tokenizer: str = "bytes"       # bytes, or "module:function" returning a list[int] for a string
    camera_dropout: float = 0.0    # per-sample probability of dropping a camera (>= 1 camera kept)
    attention: str = "auto"        # auto | sdpa | flex | flash (flash: flash_attn_varlen_func, GPU)
    # t-models: which model is trained (models.py); the keys above are those of source "vlafeed"
    source: str = "vlafeed"        # vlafeed | lerobot | hf | python
    name: str = ""                 # lerobot: policy type (act, diffusion, ...); hf: an AutoModel* class name
    path: str = ""                 # a local folder of pretrained weights + config (lerobot, hf)
    entry: str = ""                # python: "module:build_fn"; hf: "module:fn" turning a batch into model inputs
    config: typing.Any = ""        # hf: a config.json path, or a dict of config kwargs with model_type
    overrides: dict = field(default_factory=dict)  # lerobot: policy config fields
    init_from: str = ""            # weights-only init (checkpoint, exported model or LeRobot pretrained_model)


@dataclass
class PackingConfig:
    enabled: bool = False          # pack samples into rows instead of padding to the longest
    max_tokens: int = 0            # tokens per packed row (0: the longest sample of the micro-batch)
    window: int = 0                # first-fit-decreasing look-ahead, in samples (0: the micro-batch)


@dataclass
class ParallelConfig:
    fsdp: bool = True              # FSDP2 (fully_shard); false: DDP
    reshard_after_forward: bool = True
    cpu_offload: bool = False      # FSDP2 CPUOffloadPolicy
    keep_unsharded_during_accumulation: bool = False  # FSDP: no reshard/all-gather between micro-batches
    backend: str = "auto"          # auto (nccl on CUDA, else gloo) | gloo | nccl
    device: str = "auto"           # auto | cpu | cuda


@dataclass
class TrainConfig:
    steps: int = 100               # optimizer steps in total (a resumed run continues to it)
    grad_accum: int = 1            # micro-batches per optimizer step
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 10         # linear LR warm-up, then train.schedule
    precision: str = "fp32"        # fp32 | amp_bfloat16 | pure_bf16
    seed: int = 0                  # model init seed; each rank's RNG stream is derived from it and the rank
    threads: int = 0               # torch threads per rank (0: this rank's share of the cores minus the loader's)
    stop_at: int = 0               # end this run after this step (with a checkpoint), as if interrupted; 0: off
    log_every: int = 10
    log_file: str = ""             # append {"step", "loss"} per step (rank 0) to this JSON-lines file
    sample_log: str = ""           # each rank appends {"step", "epoch", "index"} per micro-batch to <this>.rank<r>.jsonl
    deterministic: bool = True     # torch.use_deterministic_algorithms
    # --- t-essentials: optimizer, schedule, clipping, EMA, logging, memory/compile, freezing (train/optim.py,
    # train/ema.py, train/metrics.py, train/preempt.py) ---
    optimizer: str = "adamw"       # adamw | adam | sgd
    betas: list = field(default_factory=lambda: [0.9, 0.999])  # adam/adamw (beta1, beta2)
    momentum: float = 0.9          # sgd
    schedule: str = "cosine"       # constant | linear | cosine (after warmup_steps)
    min_lr_ratio: float = 0.1      # the schedule ends at lr * min_lr_ratio (linear, cosine)
    no_decay: list = field(default_factory=lambda: list(NO_DECAY_DEFAULT))  # fnmatch patterns without weight decay
    clip_grad_norm: float = 0.0    # clip the total gradient norm to this (0: off; the norm is logged anyway)
    ema_decay: float = 0.0         # exponential moving average of the weights (0: off), e.g. 0.999
    global_batch: int = 0          # samples per optimizer step over all ranks; 0: batch_size x grad_accum x world
    activation_checkpointing: bool = False  # recompute each FSDP block's activations in backward
    compile: bool = False          # torch.compile each FSDP block (and flex attention)
    freeze: list = field(default_factory=list)  # fnmatch patterns of parameter names not trained
    tensorboard: str = ""          # write TensorBoard scalars to this directory (rank 0)
    wandb_project: str = ""        # log to this Weights & Biases project (rank 0; WANDB_MODE=offline honoured)


@dataclass
class CheckpointConfig:
    dir: str = "checkpoints"
    every: int = 0                 # steps between checkpoints (0: only at the end)
    at_end: bool = True
    resume: str = ""               # "" (fresh), "auto" (dir/latest if there is one), or a checkpoint directory
    elastic_data: str = "error"    # world size changed and the loader cannot resume there: error | restart_epoch
    keep: int = 0                  # keep the newest N checkpoints (0: all)


@dataclass
class EvalConfig:  # validation on held-out episodes (train/data.py)
    every: int = 0                 # steps between validations (0: off)
    episodes: list = field(default_factory=list)  # held-out episode indices (excluded from training)
    fraction: float = 0.0          # or: this fraction of the episodes, held out by a split seeded by data.seed
    batches: int = 0               # batches per validation (0: all of the held-out episodes)
    batch_size: int = 0            # samples per validation batch (0: data.batch_size)
    # in a simulator (vlafeed.rl.evaluate), at every checkpoint: model.source lerobot only
    env: str = ""                  # simulator (a vlafeed eval alias or gymnasium id); "" off
    env_episodes: int = 10         # seeded episodes per simulator evaluation
    env_max_steps: int = 0         # steps per episode (0: the env's own limit)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# t-models: keys whose value is a mapping (kept whole in YAML; --key.sub value sets one entry)
# keys whose value is a mapping kept whole (not more section.name keys)
MAPPING_KEYS = ("data.rename", "model.overrides", "model.config", "data.delta_timestamps")

CHOICES = {
    "data.mode": ("stream", "pool"),
    "model.attention": ("auto", "sdpa", "flex", "flash"),
    "model.source": ("vlafeed", "lerobot", "hf", "python"),  # t-models
    "parallel.backend": ("auto", "gloo", "nccl"),
    "parallel.device": ("auto", "cpu", "cuda"),
    "train.precision": ("fp32", "amp_bfloat16", "pure_bf16"),
    "checkpoint.elastic_data": ("error", "restart_epoch"),
    # t-essentials
    "train.optimizer": ("adamw", "adam", "sgd"),
    "train.schedule": ("constant", "linear", "cosine"),
}


FLOAT_LISTS = ("train.betas",)


def _scalar(text: str):
    """One item of a comma-separated list on the command line: an int, a float, or the text itself
    (not YAML: name patterns such as *bias would read as YAML aliases)."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _coerce(key: str, value, typ, source: str):
    """value converted to typ, or ConfigError naming key; strings from the command line are parsed."""
    where = f" (in {source})" if source else ""
    if typ in (dict, list, typing.Any):  # mapping/list keys; YAML/JSON text (or a, b, c for lists) on the command line
        if isinstance(value, str) and source == "command line":
            import yaml
            text = value.strip()
            try:
                if typ is list and text and not text.startswith("["):
                    value = [_scalar(v.strip()) for v in text.split(",") if v.strip()]
                else:
                    value = yaml.safe_load(text) if text else ({} if typ is dict else [] if typ is list else "")
            except yaml.YAMLError as e:
                raise ConfigError(f"config key '{key}'{where}: not valid YAML/JSON: {e}") from None
        if typ is typing.Any:
            if not isinstance(value, (str, dict)):
                raise ConfigError(f"config key '{key}'{where}: expected a path or a mapping, got "
                                  f"{type(value).__name__} ({value!r})")
            return value
        if not isinstance(value, typ):
            raise ConfigError(f"config key '{key}'{where}: expected a {'mapping' if typ is dict else 'list'}, got "
                              f"{type(value).__name__} ({value!r})")
        return list(value) if typ is list else value
    if isinstance(value, str) and typ is not str and source == "command line":
        text = value.strip().lower()
        if typ is bool:
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
        else:
            try:
                return typ(value)
            except ValueError:
                pass
        raise ConfigError(f"config key '{key}'{where}: expected {typ.__name__}, got {value!r}")
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and typ is not bool:
        raise ConfigError(f"config key '{key}'{where}: expected {typ.__name__}, got a boolean ({value!r})")
    if not isinstance(value, typ):
        raise ConfigError(f"config key '{key}'{where}: expected {typ.__name__}, got {type(value).__name__} "
                          f"({value!r})")
    return value


def _set(cfg: Config, key: str, value, source: str):
    parts = key.split(".")
    if len(parts) > 2 and ".".join(parts[:2]) in MAPPING_KEYS:  # t-models: --model.overrides.dim_model 32
        sub = getattr(getattr(cfg, parts[0], None), parts[1])
        if source == "command line" and isinstance(value, str):
            import yaml
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        sub = dict(sub)
        sub[".".join(parts[2:])] = value
        _set(cfg, ".".join(parts[:2]), sub, source)
        return
    if len(parts) != 2:
        raise ConfigError(f"config key '{key}' ({source}): keys are section.name, e.g. train.steps")
    section, name = parts
    sections = {f.name: f for f in dataclasses.fields(Config)}
    if section not in sections:
        raise ConfigError(f"unknown config key '{key}' ({source}): no section '{section}' "
                          f"(sections: {', '.join(sections)})")
    sub = getattr(cfg, section)
    hints = typing.get_type_hints(type(sub))
    if name not in hints:
        raise ConfigError(f"unknown config key '{key}' ({source}): section '{section}' has "
                          f"{', '.join(hints)}")
    value = _coerce(key, value, hints[name], source)
    if key in FLOAT_LISTS:
        try:
            value = [float(x) if not isinstance(x, bool) else x for x in value]
        except (TypeError, ValueError):
            raise ConfigError(f"config key '{key}' ({source}): expected a list of numbers, got {value!r}") from None
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"config key '{key}' ({source}): {value!r} is not one of {', '.join(CHOICES[key])}")
    setattr(sub, name, value)




def _flatten(obj, prefix, path, out):
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: '{prefix or 'the top level'}' must be a mapping of keys, got "
                          f"{type(obj).__name__}")
    for k, v in obj.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and key not in MAPPING_KEYS:
            _flatten(v, key, path, out)
        else:
            out[key] = v
    return out


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Config from a YAML file (optional) and ``--section.key value`` / ``--section.key=value`` overrides."""
    cfg = Config()
    if path:
        import yaml
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        for key, value in _flatten(data, "", str(p), {}).items():
            _set(cfg, key, value, str(p))
    args = list(overrides or [])
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r}: overrides look like --section.key value")
        if "=" in a:
            key, value = a[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"config key '{a[2:]}' (command line): no value given")
            key, value = a[2:], args[i + 1]
            i += 2
        _set(cfg, key, value, "command line")
    validate(cfg)
    return cfg


# Allowed integer ranges: (lowest, highest or None). The upper bounds on chunk and image_size
# are sanity limits: both size tables and buffers (the loader's delta timestamps, the model's
# position embeddings, decoded frames) that would otherwise be allocated before anything
# else notices the value is absurd.
MAX_CHUNK = 1024
MAX_IMAGE_SIZE = 4096
INT_RANGES = {
    "data.batch_size": (1, None),
    "data.chunk": (1, MAX_CHUNK),
    "data.loader_threads": (1, None),
    "data.image_size": (0, MAX_IMAGE_SIZE),
    "model.d_model": (1, None),
    "model.layers": (1, None),
    "model.heads": (1, None),
    "model.patch": (1, None),
    "model.max_text_tokens": (0, None),
    "model.vocab_size": (1, None),
    "packing.max_tokens": (0, None),
    "packing.window": (0, None),
    "train.steps": (1, None),
    "train.grad_accum": (1, None),
    "train.warmup_steps": (0, None),
    "train.threads": (0, None),
    "train.stop_at": (0, None),
    "train.log_every": (1, None),
    "checkpoint.every": (0, None),
    "checkpoint.keep": (0, None),
    "train.global_batch": (0, None),
    "data.obs_steps": (1, MAX_CHUNK),
    "data.mix_window": (0, None),
    "eval.every": (0, None),
    "eval.batches": (0, None),
    "eval.batch_size": (0, None),
    "eval.env_episodes": (1, None),
    "eval.env_max_steps": (0, None),
}
# Float keys: (lowest, lowest allowed itself?, highest or None, highest allowed itself?); NaN and
# infinities are refused for all of them.
FLOAT_RANGES = {
    "train.lr": (0.0, False, None, False),
    "train.weight_decay": (0.0, True, None, False),
    "model.camera_dropout": (0.0, True, 1.0, False),
    # t-essentials
    "train.momentum": (0.0, True, 1.0, False),
    "train.min_lr_ratio": (0.0, True, 1.0, True),
    "train.clip_grad_norm": (0.0, True, None, False),
    "train.ema_decay": (0.0, True, 1.0, False),
    "eval.fraction": (0.0, True, 1.0, False),
}


def _int_range_text(low, high):
    return f">= {low}" if high is None else f"{low} <= value <= {high}"


def _float_range_text(low, low_closed, high, high_closed):
    if high is None:
        return f"a finite number {'>=' if low_closed else '>'} {low:g}"
    return f"{'[' if low_closed else '('}{low:g}, {high:g}{']' if high_closed else ')'}"


def validate(cfg: Config):
    """Raises ConfigError naming the first key whose value is out of its range (and the range)."""
    def need(cond, key, msg):
        if not cond:
            raise ConfigError(f"config key '{key}': {msg}")

    def value_of(key):
        section, name = key.split(".")
        return getattr(getattr(cfg, section), name)

    if cfg.data.mix:
        need(not cfg.data.dataset, "data.mix", "data.dataset and data.mix are exclusive: give one of them "
             "(data.mix lists every dataset, data.dataset included)")
    else:
        need(cfg.data.dataset != "", "data.dataset", "a dataset root is required (or data.mix)")
    for key, (low, high) in INT_RANGES.items():
        v = value_of(key)
        need(v >= low and (high is None or v <= high), key,
             f"{v!r} is out of range (allowed: {_int_range_text(low, high)})")
    for key, (low, low_closed, high, high_closed) in FLOAT_RANGES.items():
        v = value_of(key)
        ok = math.isfinite(v) and (v >= low if low_closed else v > low)
        if high is not None:
            ok = ok and (v <= high if high_closed else v < high)
        need(ok, key, f"{v!r} is out of range (allowed: {_float_range_text(low, low_closed, high, high_closed)})")
    need(cfg.model.d_model % cfg.model.heads == 0, "model.heads", "must divide model.d_model")
    # t-models
    need(all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in cfg.data.rename.items()),
         "data.rename", "a mapping of dataset key -> model key (both non-empty strings)")
    need(len(set(cfg.data.rename.values())) == len(cfg.data.rename), "data.rename", "two keys renamed to one name")
    need(all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in cfg.data.episodes),
         "data.episodes", "a list of episode indices (integers >= 0)")
    need(len(set(cfg.data.episodes)) == len(cfg.data.episodes), "data.episodes", "an episode is listed twice")
    src = cfg.model.source
    need(src != "lerobot" or cfg.model.name or cfg.model.path, "model.name",
         "model.source lerobot needs a policy type (act, diffusion, ...) or model.path")
    need(src != "hf" or cfg.model.name, "model.name", "model.source hf needs an AutoModel* class name, "
         "e.g. AutoModelForCausalLM")
    need(src != "hf" or cfg.model.config or cfg.model.path, "model.config",
         "model.source hf needs model.config (a config.json or a mapping with model_type) or model.path")
    need(src != "python" or cfg.model.entry, "model.entry", "model.source python needs 'package.module:build_fn'")
    need(not cfg.eval.env or src == "lerobot", "eval.env", "simulator evaluation runs policies that act: "
         "model.source lerobot (the exported pretrained_model/ is what vlafeed eval loads)")
    need(not cfg.eval.env or cfg.checkpoint.every or cfg.checkpoint.at_end, "eval.env",
         "evaluates checkpoints: set checkpoint.every or checkpoint.at_end")

    # t-essentials
    b = cfg.train.betas
    need(len(b) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in b),
         "train.betas", f"{b!r}: expected two numbers in [0, 1), e.g. [0.9, 0.999]")
    for key in ("train.no_decay", "train.freeze"):
        v = value_of(key)
        need(all(isinstance(x, str) and x for x in v), key, f"{v!r}: expected a list of name patterns")


# One line per key for `python -m vlafeed.train --help` and docs/training.md. Every declared key has one
# (tests/python/test_train_essentials.py checks both ways). Helpers adding keys add them in their own block.
KEY_HELP = {
    # t-essentials: the keys that existed before issue 19, and the essentials
    "data.dataset": "LeRobot dataset root, a folder or URL (required)",
    "data.mode": "vlafeed.Loader mode: stream, or pool (random frames across a pool of episode segments)",
    "data.batch_size": "samples per micro-batch per rank",
    "data.seed": "the loader's order seed",
    "data.chunk": "action chunk length, in steps of 1/fps",
    "data.loader_threads": "engine threads per rank",
    "data.image_size": "resize cameras to image_size x image_size (0: as stored)",
    "model.d_model": "width of the example policy's transformer",
    "model.layers": "transformer blocks of the example policy",
    "model.heads": "attention heads (must divide d_model)",
    "model.patch": "image patch size: tokens per camera = (H/patch) x (W/patch)",
    "model.max_text_tokens": "instruction tokens kept per sample",
    "model.vocab_size": "token vocabulary (256 bytes + bos/eos/pad for the byte tokenizer)",
    "model.tokenizer": "bytes, or module:function returning a list[int] for a string",
    "model.camera_dropout": "per-sample probability of dropping a camera (at least one is kept)",
    "model.attention": "auto (flash on CUDA when installed, else sdpa), sdpa, flex (compiled; CUDA) or flash",
    "packing.enabled": "pack several samples into each row instead of padding every sample to the longest",
    "packing.max_tokens": "tokens per packed row; 0: the longest sample of the micro-batch",
    "packing.window": "first-fit-decreasing look-ahead in samples (0: the whole micro-batch)",
    "parallel.fsdp": "shard with FSDP2 (fully_shard); false: DDP",
    "parallel.reshard_after_forward": "FSDP2: free the gathered parameters after forward (ZeRO-3) or keep them",
    "parallel.cpu_offload": "FSDP2: keep parameters, gradients and optimizer state on the CPU",
    "parallel.keep_unsharded_during_accumulation": "FSDP2: no reshard/all-gather between micro-batches",
    "parallel.backend": "process group backend: auto (nccl on CUDA, else gloo), gloo or nccl",
    "parallel.device": "auto, cpu or cuda",
    "train.steps": "optimizer steps in total (a resumed run continues to it)",
    "train.grad_accum": "micro-batches per optimizer step (recomputed from train.global_batch when that is set)",
    "train.lr": "peak learning rate",
    "train.weight_decay": "decoupled weight decay (AdamW) or L2 (adam, sgd), off for train.no_decay parameters",
    "train.warmup_steps": "linear LR warm-up steps before train.schedule",
    "train.precision": "fp32, amp_bfloat16 (fp32 weights, bf16 autocast) or pure_bf16 (bf16 weights)",
    "train.seed": "model init seed; each rank's RNG stream is derived from it and the rank",
    "train.threads": "torch threads per rank (0: this rank's share of the cores minus the loader's)",
    "train.stop_at": "end this run after this step with a checkpoint, as if interrupted (0: off)",
    "train.log_every": "print a progress line every N steps",
    "train.log_file": "append one JSON line of metrics per step to this file (rank 0)",
    "train.sample_log": "each rank appends the sample indices of each micro-batch to <this>.rank<r>.jsonl",
    "train.deterministic": "torch.use_deterministic_algorithms (and CUBLAS_WORKSPACE_CONFIG on CUDA)",
    "train.optimizer": "adamw, adam or sgd",
    "train.betas": "adam/adamw betas, two numbers in [0, 1)",
    "train.momentum": "sgd momentum in [0, 1)",
    "train.schedule": "LR after warm-up: constant, linear (to lr x min_lr_ratio) or cosine (to lr x min_lr_ratio)",
    "train.min_lr_ratio": "the final LR as a fraction of train.lr (linear and cosine)",
    "train.no_decay": "fnmatch patterns of parameter names without weight decay (0-dim/1-dim never decay)",
    "train.clip_grad_norm": "clip the total gradient norm over all ranks to this value (0: off; logged anyway)",
    "train.ema_decay": "keep an exponential moving average of the weights with this decay (0: off)",
    "train.global_batch": "samples per optimizer step over all ranks (0: batch_size x grad_accum x world size)",
    "train.activation_checkpointing": "recompute each FSDP block's activations in backward (less memory)",
    "train.compile": "torch.compile each FSDP block (the whole model when it has none)",
    "train.freeze": "fnmatch patterns of parameter names to freeze (each must match a parameter)",
    "train.tensorboard": "write TensorBoard scalars to this directory (rank 0; needs tensorboard)",
    "train.wandb_project": "log to this Weights & Biases project (rank 0; needs wandb; WANDB_MODE=offline works)",
    "checkpoint.dir": "directory of step_<N>/ checkpoints, latest and summary.json",
    "checkpoint.every": "steps between checkpoints (0: only at the end)",
    "checkpoint.at_end": "save a checkpoint after the last step",
    "checkpoint.resume": "empty (fresh run), auto (checkpoint.dir/latest if there is one) or a checkpoint directory",
    "checkpoint.elastic_data": "the world size changed and the loader cannot resume there: error or restart_epoch",
    "checkpoint.keep": "keep the newest N checkpoints (0: all)",
}

# t-models: model sources, key mapping, episodes, weights-only init
KEY_HELP.update({
    "data.rename": "mapping {dataset key: key the model expects}, applied to features, stats and batches",
    "data.episodes": "episode indices to train on ([]: every episode)",
    "model.source": "which model is trained: vlafeed (the example policy), lerobot, hf or python",
    "model.name": "lerobot: policy type (act, diffusion, ...); hf: AutoModel* class (AutoModelForCausalLM)",
    "model.path": "local folder with pretrained weights and config (LeRobot pretrained_model/, HF model)",
    "model.entry": "python: 'module:build_fn' building the model; hf: 'module:fn' turning a batch into inputs",
    "model.config": "hf: a config.json path or a mapping of config kwargs including model_type",
    "model.overrides": "lerobot: policy config fields set over the policy type's defaults",
    "model.init_from": "weights-only init from a checkpoint, an exported model or a LeRobot pretrained_model "
                       "(a new run: step 0, fresh optimizer)",
})



def declared_keys() -> list:
    """Every section.key of Config, in declaration order."""
    return [f"{s}.{k}" for s, values in Config().to_dict().items() for k in values]


# -- data windows, augmentation, mixing and validation (train/data.py) --
KEY_HELP = globals().get("KEY_HELP", {})
KEY_HELP.update({
    "data.obs_steps": "observation frames per sample (LeRobot's n_obs_steps): N gives the current frame and the "
                      "N-1 before it, as [B, N, ...] with <key>_is_pad",
    "data.delta_timestamps": "explicit windows: {observation key: [seconds relative to the frame, ...]}, each a "
                             "multiple of 1/fps (exclusive with data.obs_steps > 1)",
    "data.augment": "image augmentation per training batch: built-in names (random_crop, color_jitter; "
                    "comma-separated) or package.module:fn(batch, generator=, camera_keys=)",
    "data.mix": "weighted sources instead of data.dataset: a list of {dataset: root | shards: manifest.jsonl, "
                "weight: w, rename: {old: new}}, mixed sample by sample by vlafeed.Mix",
    "data.mix_window": "vlafeed.Mix window in samples, each holding exact weight shares (0: data.batch_size)",
    "eval.every": "steps between validations on the held-out episodes (0: no validation)",
    "eval.episodes": "held-out episode indices: validated on, never trained on",
    "eval.fraction": "hold out this fraction of the episodes instead (a split seeded by data.seed)",
    "eval.batches": "batches per validation (0: all of the held-out episodes)",
    "eval.batch_size": "samples per validation batch (0: data.batch_size)",
    "eval.env": "evaluate each checkpoint in this simulator (vlafeed eval's alias or a gymnasium id; "
                "model.source lerobot): exported, run by vlafeed.rl.evaluate on rank 0, success rate and return logged",
    "eval.env_episodes": "seeded episodes per simulator evaluation (seeds train.seed, train.seed + 1, ...)",
    "eval.env_max_steps": "steps per simulator episode (0: the env's own limit)",
})
