"""What ``python -m vlafeed.train`` feeds the model, by config: observation
windows, image augmentation, weighted mixing and the held-out validation set.

- Windows (``data.obs_steps``, ``data.delta_timestamps``): LeRobot's delta
  timestamps for observation keys next to the action chunk. A windowed key
  arrives as ``[B, T, ...]`` with a bool ``<key>_is_pad`` ``[B, T]`` (True
  where the offset falls outside the episode and the edge frame is repeated).
  Offsets are checked against the dataset before anything is built: the key
  must exist and every offset must be a whole number of frames (1/fps).
- Augmentation (``data.augment``): built-in names or ``package.module:fn``,
  called once per training micro-batch with a ``torch.Generator`` seeded
  from (train.seed, rank, step, micro-batch): the same run resumed from a
  checkpoint augments exactly as the uninterrupted one.
- Mixing (``data.mix``): a list of LeRobot datasets and WebDataset shard
  manifests with weights, each mapped onto one column set and mixed sample
  by sample by ``vlafeed.Mix``, whose state is the checkpoint's loader state.
- Validation (``eval.*``): held-out episodes (listed, or a seeded fraction)
  are left out of the training loader and evaluated with gradients off by
  ``validate(loss_fn, ...)``, which takes the training step's own loss.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vlafeed._entry import import_entry
from vlafeed.train.config import Config, ConfigError

# offsets closer than this (in frames) to a whole frame count as whole
FRAME_TOLERANCE = 1e-4


# ---------------------------------------------------------------------------
# windows

def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def observation_keys(features: dict) -> list:
    """The observation features a window applies to (state, cameras, other observation.* columns)."""
    return [k for k in features if k.startswith("observation.")]


def delta_timestamps(cfg: Config, features: dict, fps: float, where: str = "") -> dict:
    """The loader's delta_timestamps: the action chunk, plus the observation windows of
    data.obs_steps or data.delta_timestamps. ConfigError naming the key (and where) otherwise."""
    d = cfg.data
    at = f" ({where})" if where else ""
    out = {"action": [i / fps for i in range(d.chunk)]}
    if d.delta_timestamps and d.obs_steps > 1:
        raise ConfigError("config keys 'data.obs_steps' and 'data.delta_timestamps' are exclusive: give the "
                          "window as data.obs_steps (the last N frames) or as explicit offsets, not both")
    if d.obs_steps > 1:
        for key in observation_keys(features):
            out[key] = [-(d.obs_steps - 1 - i) / fps for i in range(d.obs_steps)]
        return out
    for key, offsets in d.delta_timestamps.items():
        if key == "action":
            raise ConfigError("config key 'data.delta_timestamps': 'action' is set by data.chunk (the action "
                              "chunk of data.chunk steps of 1/fps); give observation keys here")
        if key not in features:
            raise ConfigError(f"config key 'data.delta_timestamps': '{key}' is not a feature of the dataset{at} "
                              f"(its observation keys: {', '.join(observation_keys(features)) or 'none'})")
        if not isinstance(offsets, list) or not offsets or not all(_is_number(x) for x in offsets):
            raise ConfigError(f"config key 'data.delta_timestamps': '{key}' must map to a non-empty list of "
                              f"seconds, got {offsets!r}")
        for x in offsets:
            frames = x * fps
            if abs(frames - round(frames)) > FRAME_TOLERANCE:
                raise ConfigError(f"config key 'data.delta_timestamps': '{key}' offset {x!r} s is not a multiple "
                                  f"of 1/fps = {1 / fps:.6g} s (the dataset{at} has fps {fps:g}): {frames:.4g} "
                                  f"frames")
        out[key] = [round(x * fps) / fps for x in offsets]
    return out


def windowed_keys(dts: dict) -> dict:
    """{observation key: index of its newest step} for every windowed observation key."""
    return {k: max(range(len(v)), key=lambda i: v[i]) for k, v in dts.items() if k != "action"}


def newest_step(batch: dict, windows: dict) -> dict:
    """The batch with each windowed observation key reduced to its newest step (what the built-in
    example policy reads); the full windows stay under ``<key>@window``."""
    if not windows:
        return batch
    out = dict(batch)
    for key, i in windows.items():
        if key in out:
            out[key + "@window"] = out[key]
            out[key] = out[key][:, i]
    return out


# ---------------------------------------------------------------------------
# augmentation

def augment_generator(seed: int, rank: int, step: int, micro: int) -> torch.Generator:
    """A CPU generator seeded by (train.seed, rank, step, micro-batch) alone: a resumed run draws the same."""
    digest = hashlib.sha256(f"vlafeed.train.augment/{seed}/{rank}/{step}/{micro}".encode()).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


def _torchvision_functional(name):
    try:
        from torchvision.transforms.v2 import functional as F
    except ImportError as e:
        raise ConfigError(f"config key 'data.augment': the built-in '{name}' needs torchvision "
                          f"(torchvision.transforms.v2), which is not installed here ({e}); install the "
                          f"torchvision that matches torch {torch.__version__}, or give package.module:fn") from None
    return F


def _images(batch, camera_keys):
    """(key, uint8 or float tensor [..., C, H, W]) of the batch's cameras."""
    return [(k, batch[k]) for k in camera_keys if k in batch]


def random_crop(batch, *, generator, camera_keys, scale=0.9):
    """Each sample's images cropped to scale x scale of their size at a random place (the same place
    for a sample's cameras and window steps) and resized back (torchvision's functional ops)."""
    F = _torchvision_functional("random_crop")
    out = dict(batch)
    n = None
    for key, img in _images(batch, camera_keys):
        n = img.shape[0]
        h, w = img.shape[-2:]
        ch, cw = max(1, round(h * scale)), max(1, round(w * scale))
        tops = torch.randint(0, h - ch + 1, (n,), generator=generator)
        lefts = torch.randint(0, w - cw + 1, (n,), generator=generator)
        rows = [F.resize(F.crop(img[i], int(tops[i]), int(lefts[i]), ch, cw), [h, w], antialias=True)
                for i in range(n)]
        out[key] = torch.stack(rows).to(img.dtype)
    return out


def color_jitter(batch, *, generator, camera_keys, brightness=0.2, contrast=0.2, saturation=0.2):
    """Per-sample brightness, contrast and saturation factors in [1 - x, 1 + x] (torchvision's functional ops)."""
    F = _torchvision_functional("color_jitter")
    out = dict(batch)
    for key, img in _images(batch, camera_keys):
        n = img.shape[0]
        f = 1 + (torch.rand(n, 3, generator=generator) * 2 - 1) * torch.tensor([brightness, contrast, saturation])
        rows = []
        for i in range(n):
            x = F.adjust_brightness(img[i], float(f[i, 0]))
            x = F.adjust_contrast(x, float(f[i, 1]))
            rows.append(F.adjust_saturation(x, float(f[i, 2])))
        out[key] = torch.stack(rows).to(img.dtype)
    return out


BUILTIN_AUGMENTS = {"random_crop": random_crop, "color_jitter": color_jitter}


def load_augment(spec: str):
    """None for "", else fn(batch, generator=, camera_keys=) -> batch. ConfigError naming data.augment."""
    if not spec:
        return None
    if ":" in spec:
        try:
            fn = import_entry(spec)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"config key 'data.augment': cannot load {spec!r} ({e})") from None
        if not callable(fn):
            raise ConfigError(f"config key 'data.augment': {spec!r} is not callable")
        return fn
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        if n not in BUILTIN_AUGMENTS:
            raise ConfigError(f"config key 'data.augment': unknown augmentation {n!r} (built-in: "
                              f"{', '.join(BUILTIN_AUGMENTS)}; or package.module:fn)")
        if n in ("random_crop", "color_jitter"):
            _torchvision_functional(n)  # refuse before the run starts

    def chain(batch, *, generator, camera_keys):
        for n in names:
            batch = BUILTIN_AUGMENTS[n](batch, generator=generator, camera_keys=camera_keys)
        return batch
    return chain


def apply_augment(fn, batch, camera_keys, *, seed, rank, step, micro):
    if fn is None:
        return batch
    out = fn(batch, generator=augment_generator(seed, rank, step, micro), camera_keys=list(camera_keys))
    if not isinstance(out, dict):
        raise TypeError(f"data.augment returned {type(out).__name__}, not the batch dict")
    return out


# ---------------------------------------------------------------------------
# held-out episodes

def heldout_episodes(cfg: Config, total: int, where: str) -> list:
    """Sorted held-out episode indices of eval.episodes or eval.fraction of the episodes training would
    read (data.episodes where that key is set, else all), split by a permutation seeded by data.seed."""
    e = cfg.eval
    pool = list(getattr(cfg.data, "episodes", None) or range(total))
    if e.episodes and e.fraction:
        raise ConfigError("config keys 'eval.episodes' and 'eval.fraction' are exclusive: list the held-out "
                          "episodes or give a fraction, not both")
    if e.episodes:
        bad = [x for x in e.episodes if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < total]
        if bad:
            raise ConfigError(f"config key 'eval.episodes': {bad[0]!r} is not an episode of {where} "
                              f"(episodes 0..{total - 1})")
        held = sorted(set(e.episodes))
    elif e.fraction:
        k = max(1, round(e.fraction * len(pool)))
        g = torch.Generator().manual_seed(cfg.data.seed)
        held = sorted(pool[i] for i in torch.randperm(len(pool), generator=g)[:k].tolist())
    else:
        held = []
    if held and not set(pool) - set(held):
        raise ConfigError(f"config key '{'eval.episodes' if e.episodes else 'eval.fraction'}': all {len(pool)} "
                          f"training episodes of {where} would be held out; none is left to train on")
    if cfg.eval.every and not held:
        raise ConfigError("config key 'eval.every': validation needs held-out episodes (eval.episodes or "
                          "eval.fraction)")
    return held


def training_episodes(cfg: Config, total: int, held: list):
    """The episodes the training loader reads (None: all): data.episodes (when that key exists) minus held."""
    chosen = getattr(cfg.data, "episodes", None) or None
    if not held:
        return list(chosen) if chosen else None
    base = list(chosen) if chosen else range(total)
    keep = [i for i in base if i not in set(held)]
    if not keep:
        raise ConfigError("config key 'eval.episodes': every training episode is held out")
    return keep


# ---------------------------------------------------------------------------
# sources and the training stream

@dataclass
class Source:
    kind: str                      # "dataset" | "shards"
    path: str
    weight: float = 1.0
    rename: dict = field(default_factory=dict)


def parse_mix(entries: list) -> list:
    """data.mix entries as Sources; ConfigError naming the entry and field."""
    out = []
    for i, e in enumerate(entries):
        where = f"config key 'data.mix' entry {i}"
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: expected a mapping like {{dataset: ROOT, weight: 0.5}}, got {e!r}")
        unknown = set(e) - {"dataset", "shards", "weight", "rename"}
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} (fields: dataset | shards, "
                              f"weight, rename)")
        if ("dataset" in e) == ("shards" in e):
            raise ConfigError(f"{where}: give exactly one of 'dataset' (a LeRobot root) or 'shards' (a "
                              f"manifest.jsonl)")
        kind = "dataset" if "dataset" in e else "shards"
        path = e[kind]
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{where}: '{kind}' must be a path, got {path!r}")
        if "://" not in path and not Path(path).exists():
            raise ConfigError(f"{where}: {kind} {path} does not exist")
        w = e.get("weight", 1.0)
        if not _is_number(w) or w <= 0:
            raise ConfigError(f"{where}: 'weight' must be a number > 0, got {w!r}")
        rn = e.get("rename", {}) or {}
        if not isinstance(rn, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rn.items()):
            raise ConfigError(f"{where}: 'rename' must map column names to column names, got {rn!r}")
        out.append(Source(kind, path, w, dict(rn)))
    return out


def sources_of(cfg: Config) -> list:
    if cfg.data.mix:
        return parse_mix(cfg.data.mix)
    return [Source("dataset", cfg.data.dataset)]


class DataPlan:
    """Everything the runner needs from the data keys: the metadata the model is built from, the
    training stream (a vlafeed.Loader, or a vlafeed.Mix of sources), the windows, the augmentation and
    the held-out episodes."""

    def __init__(self, cfg: Config, vlafeed, rank: int, world: int):
        self.cfg, self.vlafeed, self.rank, self.world = cfg, vlafeed, rank, world
        self.sources = sources_of(cfg)
        first = next((i for i, s in enumerate(self.sources) if s.kind == "dataset"), None)
        if first is None:
            raise ConfigError("config key 'data.mix': at least one entry must be a LeRobot dataset (the model's "
                              "features and normalization stats come from the first one)")
        self.primary = first
        self._metas = {}
        self.meta = self.meta_of(first)
        src = self.sources[first]
        self.renamed_features = {src.rename.get(k, k): v for k, v in self.meta.features.items()}
        self.fps = float(self.meta.fps)
        self.delta_timestamps = self._stream_dts(self.renamed_features, self.fps, src.path)
        self.windows = windowed_keys(self.delta_timestamps)
        self.augment = load_augment(cfg.data.augment)
        self.total_episodes = int(self.meta.total_episodes)
        self.heldout = heldout_episodes(cfg, self.total_episodes, src.path)
        self.train_episodes = training_episodes(cfg, self.total_episodes, self.heldout)
        if len(self.sources) > 1 or cfg.data.mix:
            for i, s in enumerate(self.sources):
                if s.kind == "shards" and self.windows:
                    raise ConfigError(f"config key 'data.mix' entry {i}: observation windows (data.obs_steps, "
                                      f"data.delta_timestamps) are read from LeRobot datasets only, not from "
                                      f"shards ({s.path})")

    def use_model(self, model_dts: dict, image_format: str = "uint8"):
        """Takes what the model asks of the loader (models.TrainModel: delta_timestamps in the training names
        before data.rename, image format). A key the model windows itself replaces this plan's window for it;
        a key both name with other offsets is a ConfigError naming it."""
        merged = dict(self.delta_timestamps)
        action = {v: k for k, v in self.cfg.data.rename.items()}.get("action", "action")  # in the stream's names
        for key, offsets in (model_dts or {}).items():
            mine = merged.get(key)
            if mine is not None and key != action and \
                    [round(x * self.fps) for x in mine] != [round(x * self.fps) for x in offsets]:
                raise ConfigError(f"config key 'data.delta_timestamps': the model ({self.cfg.model.source}) asks "
                                  f"for '{key}' at {len(offsets)} offsets of its own; leave that key to the model")
            merged[key] = list(offsets)
        self.delta_timestamps = merged
        self.model_dts = dict(model_dts or {})
        self.windows = windowed_keys(merged)
        self.image_format = image_format

    @property
    def model_meta(self):
        """The first dataset's metadata in training names (features, camera_keys, fps, stats)."""
        from types import SimpleNamespace
        return SimpleNamespace(features=self.renamed_features, camera_keys=self.camera_keys, fps=self.fps,
                               stats=self.stats, total_episodes=self.total_episodes)

    @property
    def stats(self):
        stats = self.meta.stats or {}
        rn = self.sources[self.primary].rename
        return {rn.get(k, k): v for k, v in stats.items()}

    @property
    def camera_keys(self):
        rn = self.sources[self.primary].rename
        return [rn.get(k, k) for k in self.meta.camera_keys]

    def meta_of(self, i):
        if i not in self._metas:
            self._metas[i] = self.vlafeed.LeRobotDataset(self.sources[i].path).meta
        return self._metas[i]

    def _loader_kwargs(self, dts):
        d = self.cfg.data
        kw = dict(mode=d.mode, batch_size=d.batch_size, seed=d.seed, rank=self.rank, world_size=self.world,
                  delta_timestamps=dts, image_format=getattr(self, "image_format", "uint8"), drop_last=True,
                  threads=d.loader_threads)
        if d.image_size:
            kw["resize"] = (d.image_size, d.image_size)
        return kw

    def _source_dts(self, i):
        """delta_timestamps in source i's own column names, checked against its fps."""
        s = self.sources[i]
        meta = self.meta_of(i)
        inverse = {v: k for k, v in s.rename.items()}
        features = {s.rename.get(k, k): v for k, v in meta.features.items()}
        dts = self._stream_dts(features, float(meta.fps), s.path)
        dts.update(getattr(self, "model_dts", {}))  # what the model asks for (use_model)
        return {inverse.get(k, k): v for k, v in dts.items()}

    def _stream_dts(self, features, fps, where):
        """The windows of data.chunk / data.obs_steps / data.delta_timestamps, given in the model's names
        (after data.rename, which the model seam applies to each batch), as keys of the stream (before it)."""
        top = dict(self.cfg.data.rename)
        inverse = {v: k for k, v in top.items()}
        dts = delta_timestamps(self.cfg, {top.get(k, k): v for k, v in features.items()}, fps, where)
        return {inverse.get(k, k): v for k, v in dts.items()}

    def training_stream(self):
        """vlafeed.Loader (one dataset) or vlafeed.Mix (data.mix): iterable, set_epoch, state_dict."""
        if not self.cfg.data.mix:
            kw = self._loader_kwargs(self.delta_timestamps)
            if self.train_episodes is not None:
                kw["episodes"] = self.train_episodes
            return self.vlafeed.Loader(self.cfg.data.dataset, **kw)
        sources, transforms = [], []
        columns = self.columns()
        for i, s in enumerate(self.sources):
            if s.kind == "dataset":
                kw = self._loader_kwargs(self._source_dts(i))
                if i == self.primary and self.train_episodes is not None:
                    kw["episodes"] = self.train_episodes
                sources.append(self.vlafeed.Loader(s.path, **kw))
                transforms.append(LeRobotColumns(i, s, columns))
            else:
                d = self.cfg.data
                kw = dict(batch_size=d.batch_size, seed=d.seed, rank=self.rank, world_size=self.world,
                          drop_last=True, image_format="uint8_hwc")
                if d.image_size:
                    kw["resize"] = (d.image_size, d.image_size)
                sources.append(self.vlafeed.ShardLoader(s.path, **kw))
                transforms.append(ShardColumns(i, s, columns, self.cfg.data.chunk, self.camera_keys))
        window = self.cfg.data.mix_window or self.cfg.data.batch_size
        try:
            return TrainingMix(self.vlafeed.Mix(sources, [s.weight for s in self.sources],
                                                batch_size=self.cfg.data.batch_size, window=window,
                                                seed=self.cfg.data.seed, transforms=transforms), self.world)
        except ValueError as e:
            raise ConfigError(f"config key 'data.mix': {e}") from None

    def columns(self):
        """The columns every mixed batch has (training names)."""
        cols = ["observation.state", "action", "action_is_pad", "task", "index", "episode_index"]
        cols += [k for k in self.camera_keys if k not in cols]
        for k in self.windows:
            cols += [c for c in (k, k + "_is_pad") if c not in cols]
        return cols

    def validation_stream(self):
        """A fresh deterministic loader over the held-out episodes (the same batches on every rank), or None."""
        if not self.heldout:
            return None
        s = self.sources[self.primary]
        kw = self._loader_kwargs(self._source_dts(self.primary) if self.cfg.data.mix else self.delta_timestamps)
        kw.update(mode="stream", shuffle=False, drop_last=False, rank=0, world_size=1, episodes=self.heldout,
                  batch_size=self.cfg.eval.batch_size or self.cfg.data.batch_size)
        loader = self.vlafeed.Loader(s.path, **kw)
        if s.rename:
            return _Renamed(loader, s.rename)
        return loader


class TrainingMix:
    """The runner's view of a vlafeed.Mix. A state saved at another world size is a ValueError, as for a
    vlafeed.Loader that cannot continue there, so the runner names the checkpoint: each rank's Mix deals
    from part-used batches of its own sources, which do not reshard, so exactly-once could not hold even
    where every source resumes elastically. Restarting an epoch instead (checkpoint.elastic_data=
    restart_epoch) is refused too: a Mix has no epoch to restart."""

    def __init__(self, mix, world):
        self.mix, self.world = mix, world
        self._refused = None

    def __iter__(self):
        return iter(self.mix)

    @property
    def epoch(self):
        return self.mix.epoch

    def set_epoch(self, epoch):
        if self._refused is not None:
            raise ConfigError("config key 'checkpoint.elastic_data': restart_epoch cannot be used with data.mix "
                              "(each source runs its own epochs; the mix has none to restart); resume at the "
                              f"saved world size ({self._refused})")
        self.mix.set_epoch(epoch)

    def state_dict(self):
        return self.mix.state_dict()

    def load_state_dict(self, state):
        saved = {ss["state"].get("world_size") for ss in state.get("source_states", [])
                 if isinstance(ss, dict) and isinstance(ss.get("state"), dict)}
        saved.discard(None)
        if saved and saved != {self.world}:
            self._refused = f"saved at world size {', '.join(map(str, sorted(saved)))}"
            raise ValueError(f"data.mix: the mix's per-rank state ({self._refused}) does not reshard to "
                             f"{self.world} rank(s)")
        try:
            self.mix.load_state_dict(state)
        except RuntimeError as e:
            if isinstance(e.__cause__, ValueError):
                self._refused = str(e)
                raise ValueError(f"data.mix: {e}") from None
            raise


class _Renamed:
    def __init__(self, loader, rename):
        self.loader, self.rename = loader, rename

    def __iter__(self):
        for b in self.loader:
            yield {self.rename.get(k, k): v for k, v in b.items()}


class LeRobotColumns:
    """A Mix transform: a vlafeed.Loader batch renamed and cut to the common training columns."""

    def __init__(self, index, source, columns):
        self.index, self.source, self.columns = index, source, columns

    def __call__(self, batch):
        b = {self.source.rename.get(k, k): v for k, v in batch.items()}
        missing = [c for c in self.columns if c not in b]
        if missing:
            raise ConfigError(f"config key 'data.mix' entry {self.index} ({self.source.path}): the batch lacks "
                              f"{', '.join(missing)} (columns: {', '.join(sorted(b))}; map names with 'rename')")
        return {c: b[c] for c in self.columns}


class ShardColumns:
    """A Mix transform: a ShardLoader batch of VLA Foundry windows as training columns. The shard's
    state window gives the anchor step, its action window the chunk from the anchor on (action_is_pad
    from future_mask), `<cam>_t0` the camera image (HWC -> CHW), language_instructions.json the task,
    metadata.json the index and episode."""

    def __init__(self, index, source, columns, chunk, camera_keys):
        self.index, self.source, self.columns, self.chunk = index, source, columns, chunk
        self.camera_keys = camera_keys

    def fail(self, msg):
        raise ConfigError(f"config key 'data.mix' entry {self.index} (shards {self.source.path}): {msg}")

    def __call__(self, batch):
        b = {self.source.rename.get(k, k): v for k, v in batch.items()}
        for need in ("observation.state", "action", "past_mask", "future_mask"):
            if need not in b:
                self.fail(f"the shards lack '{need}' (columns: {', '.join(sorted(b))})")
        action = b["action"]
        T = action.shape[1]
        # the anchor is the first step of the future part: the window is past + 1 + future steps
        anchor = self._anchor(b)
        if T - anchor < self.chunk:
            self.fail(f"the action window has {T - anchor} steps from the anchor on, data.chunk is {self.chunk} "
                      f"(convert with --future {self.chunk - 1} or more)")
        fm = b["future_mask"].bool()
        out = {"observation.state": b["observation.state"][:, anchor].float().contiguous(),
               "action": action[:, anchor:anchor + self.chunk].float().contiguous(),
               "action_is_pad": ~fm[:, anchor:anchor + self.chunk].contiguous()}
        meta = b.get("metadata.json")
        lang = b.get("language_instructions.json")
        n = action.shape[0]
        out["task"] = [x.get("original", "") if isinstance(x, dict) else "" for x in lang] if lang else [""] * n
        out["index"] = torch.tensor([int((m or {}).get("index", -1)) for m in meta] if meta else [-1] * n,
                                    dtype=torch.int64)
        out["episode_index"] = torch.tensor([int((m or {}).get("episode_index", -1)) for m in meta]
                                            if meta else [-1] * n, dtype=torch.int64)
        for key in self.camera_keys:
            name = key.removeprefix("observation.images.") + "_t0"
            if name not in b:
                self.fail(f"no image column '{name}' for camera {key} (columns: {', '.join(sorted(b))})")
            out[key] = b[name].permute(0, 3, 1, 2).contiguous()
        return {c: out[c] for c in self.columns}

    def _anchor(self, b):
        """Index of the anchor step in the windows: metadata.json's anchor_relative_idx (the number of past
        steps), the same for every sample of a conversion."""
        meta = b.get("metadata.json") or []
        found = {int(m["anchor_relative_idx"]) for m in meta if isinstance(m, dict) and "anchor_relative_idx" in m}
        if len(found) != 1:
            self.fail(f"metadata.json gives anchor_relative_idx {sorted(found) or 'nowhere'}; expected one value "
                      f"(shards written by `vlafeed convert --to wds`)")
        return found.pop()


# ---------------------------------------------------------------------------
# validation

def validate(loss_fn, stream, batches: int = 0, model=None) -> dict:
    """Mean of loss_fn(batch) over the stream's first `batches` batches (0: all), weighted by batch size,
    with gradients off (model.eval() during it when a model is given). Returns {"val_loss", "val_batches",
    "val_samples"}."""
    was_training = model.training if model is not None else None
    if model is not None:
        model.eval()
    total, n, count = 0.0, 0, 0
    try:
        with torch.no_grad():
            for batch in stream:
                rows = len(batch["index"]) if "index" in batch else 1
                total += float(loss_fn(batch)) * rows
                n += rows
                count += 1
                if batches and count >= batches:
                    break
    finally:
        if model is not None and was_training:
            model.train()
    if not n:
        raise RuntimeError("validation: the held-out episodes gave no batch")
    return {"val_loss": total / n, "val_batches": count, "val_samples": n}
