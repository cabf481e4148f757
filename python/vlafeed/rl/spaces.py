"""Observation and action spaces of vlafeed.rl: which gymnasium spaces a policy takes, and
batching of observations (``stack``) for the policy server and the learner.

Observation spaces: Box (a vector, or an image: uint8 with 3 dims, HWC or CHW), Discrete
(one-hot), Dict and Tuple of those (nested). Action spaces: Discrete, MultiDiscrete, Box.
Anything else raises RLError naming the space.

A batch mirrors the space: a tensor [B, ...] for a Box, a dict of batches for a Dict, a tuple
for a Tuple. ``stack`` copies each observation once, into one array per leaf; with a
``Stacker`` those arrays are allocated once (at the largest batch) and reused, so a policy
server's steady state allocates nothing per batch."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from vlafeed.rl.config import RLError

try:
    import gymnasium as gym
    from gymnasium import spaces as gspaces
except ImportError:  # pragma: no cover - install-deps installs it
    gym = gspaces = None


def describe(space) -> str:
    r = repr(space)
    return r if r.startswith(type(space).__name__) else f"{type(space).__name__}({r})"


def is_image(space) -> bool:
    """A Box of uint8 with 3 dims (HWC or CHW): an image."""
    return isinstance(space, gspaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def image_layout(space) -> str:
    """'hwc' or 'chw' for an image Box (channels 1, 3 or 4; HWC when ambiguous)."""
    h, w, c = space.shape
    if c in (1, 3, 4):
        return "hwc"
    if h in (1, 3, 4):
        return "chw"
    raise RLError(f"image observation {describe(space)}: cannot tell the channel axis (1, 3 or 4 channels first "
                  f"or last)")


def check_obs_space(space, where: str = "observation") -> None:
    """Raises RLError naming the first unsupported (sub)space."""
    if isinstance(space, gspaces.Dict):
        for k, s in space.spaces.items():
            check_obs_space(s, f"{where}[{k!r}]")
    elif isinstance(space, gspaces.Tuple):
        for i, s in enumerate(space.spaces):
            check_obs_space(s, f"{where}[{i}]")
    elif isinstance(space, gspaces.Box):
        if is_image(space):
            image_layout(space)
    elif isinstance(space, gspaces.Discrete):
        pass
    else:
        raise RLError(f"vlafeed.rl: {where} space {describe(space)} is not supported (Box, Discrete, Dict, Tuple)")


def check_action_space(space) -> None:
    if isinstance(space, (gspaces.Discrete, gspaces.MultiDiscrete)):
        return
    if isinstance(space, gspaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise RLError(f"vlafeed.rl: action space {describe(space)} is an integer Box; use MultiDiscrete")
        return
    raise RLError(f"vlafeed.rl: action space {describe(space)} is not supported (Discrete, MultiDiscrete, Box)")


def leaves(space, prefix=()) -> List[tuple]:
    """(path, leaf space) pairs in a fixed order (Dict keys as the space orders them)."""
    if isinstance(space, gspaces.Dict):
        return [x for k, s in space.spaces.items() for x in leaves(s, prefix + (k,))]
    if isinstance(space, gspaces.Tuple):
        return [x for i, s in enumerate(space.spaces) for x in leaves(s, prefix + (i,))]
    return [(prefix, space)]


def _leaf_dtype(space):
    if isinstance(space, gspaces.Discrete):
        return np.int64
    return np.uint8 if is_image(space) else np.float32


def _leaf_shape(space):
    return () if isinstance(space, gspaces.Discrete) else tuple(space.shape)


def _alloc(space, n: int):
    if isinstance(space, gspaces.Dict):
        return {k: _alloc(s, n) for k, s in space.spaces.items()}
    if isinstance(space, gspaces.Tuple):
        return tuple(_alloc(s, n) for s in space.spaces)
    return np.empty((n,) + _leaf_shape(space), dtype=_leaf_dtype(space))


def _fill(buf, obs_list, space, where="observation"):
    if isinstance(space, gspaces.Dict):
        for k, s in space.spaces.items():
            try:
                sub = [o[k] for o in obs_list]
            except (KeyError, TypeError, IndexError):
                raise RLError(f"{where}: an observation lacks key {k!r} of {describe(space)}") from None
            _fill(buf[k], sub, s, f"{where}[{k!r}]")
        return
    if isinstance(space, gspaces.Tuple):
        for i, s in enumerate(space.spaces):
            _fill(buf[i], [o[i] for o in obs_list], s, f"{where}[{i}]")
        return
    for j, o in enumerate(obs_list):
        try:
            buf[j] = o  # the one copy (with a dtype cast where the env's differs)
        except ValueError as e:
            raise RLError(f"{where}: observation of shape {np.shape(o)} does not fit {describe(space)}: {e}") from None


def _to_torch(buf):
    if isinstance(buf, dict):
        return {k: _to_torch(v) for k, v in buf.items()}
    if isinstance(buf, tuple):
        return tuple(_to_torch(v) for v in buf)
    return buf if isinstance(buf, torch.Tensor) else torch.from_numpy(np.asarray(buf))


def _view(buf, n):
    if isinstance(buf, dict):
        return {k: _view(v, n) for k, v in buf.items()}
    if isinstance(buf, tuple):
        return tuple(_view(v, n) for v in buf)
    return buf[:n]


def stack_numpy(obs_list: Sequence[Any], space, out=None):
    """The observations as one numpy structure mirroring the space ([n, ...] arrays)."""
    n = len(obs_list)
    buf = _alloc(space, n) if out is None else _view(out, n)
    _fill(buf, obs_list, space)
    return buf


def stack(obs_list: Sequence[Any], space, out=None):
    """A batch of torch tensors from a list of observations (numpy arrays, dicts, tuples).

    Each observation is copied once into a per-leaf array (``out``: arrays from a Stacker to reuse);
    the tensors share memory with those arrays (torch.from_numpy)."""
    return _to_torch(stack_numpy(obs_list, space, out))


class Stacker:
    """Preallocated per-leaf arrays for batches of up to ``capacity`` observations (grown on demand).
    The batch it returns is valid until the next call (the policy server runs the forward pass
    before it stacks the next batch)."""

    def __init__(self, space, capacity: int):
        self.space, self.capacity = space, int(capacity)
        self.buf = _alloc(space, self.capacity)
        self.allocations = 1

    def __call__(self, obs_list):
        if len(obs_list) > self.capacity:
            self.capacity = len(obs_list)
            self.buf = _alloc(self.space, self.capacity)
            self.allocations += 1
        return stack(obs_list, self.space, self.buf)


def concat(parts: List[Any]):
    """Concatenates numpy structures (trajectories' stacked observations) along the batch axis."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(concat([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate(parts)


def to_torch(batch, device=None):
    """numpy structure -> torch structure (no copy on the CPU)."""
    t = _to_torch(batch) if not isinstance(batch, torch.Tensor) else batch
    if device is None:
        return t
    return map_tensors(t, lambda x: x.to(device, non_blocking=True))


def map_tensors(batch, fn):
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(map_tensors(v, fn) for v in batch)
    return fn(batch)


def batch_size(batch) -> int:
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, tuple):
        return batch_size(batch[0])
    return int(batch.shape[0])


def action_numpy(space, actions: List[Any]) -> np.ndarray:
    """Stored actions of a trajectory: int64 [T] / [T, k] for (Multi)Discrete, float32 [T, ...] for Box."""
    if isinstance(space, (gspaces.Discrete, gspaces.MultiDiscrete)):
        return np.asarray(actions, dtype=np.int64)
    return np.asarray(actions, dtype=np.float32)


def env_action(space, a):
    """One row of a policy's action batch as the env takes it."""
    if isinstance(space, gspaces.Discrete):
        return int(a)
    if isinstance(space, gspaces.MultiDiscrete):
        return np.asarray(a, dtype=space.dtype)
    return np.asarray(a, dtype=space.dtype)


def to_json(space) -> Dict[str, Any]:
    """A JSON description of a space (for the checkpoint's vlafeed_rl.json)."""
    if isinstance(space, gspaces.Dict):
        return {"type": "Dict", "spaces": {k: to_json(s) for k, s in space.spaces.items()}}
    if isinstance(space, gspaces.Tuple):
        return {"type": "Tuple", "spaces": [to_json(s) for s in space.spaces]}
    if isinstance(space, gspaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gspaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, gspaces.Box):
        return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "shape": list(space.shape),
                "dtype": str(space.dtype)}
    raise RLError(f"vlafeed.rl: cannot describe space {describe(space)}")


def from_json(d: Dict[str, Any]):
    """The space that to_json described; RLError for anything else (a damaged checkpoint)."""
    try:
        return _from_json(d)
    except RLError:
        raise
    except Exception as e:  # KeyError, TypeError, ValueError, AssertionError from gymnasium, ...
        raise RLError(f"vlafeed.rl: bad space description in a checkpoint: {type(e).__name__}: {e} "
                      f"(in {str(d)[:200]})") from None


def _from_json(d: Dict[str, Any]):
    if not isinstance(d, dict):
        raise RLError(f"vlafeed.rl: a space description is a JSON object, got {type(d).__name__}")
    from_json = _from_json
    t = d["type"]
    if t == "Dict":
        return gspaces.Dict({k: from_json(s) for k, s in d["spaces"].items()})
    if t == "Tuple":
        return gspaces.Tuple([from_json(s) for s in d["spaces"]])
    if t == "Discrete":
        return gspaces.Discrete(d["n"], start=d.get("start", 0))
    if t == "MultiDiscrete":
        return gspaces.MultiDiscrete(d["nvec"])
    if t == "Box":
        dt = np.dtype(d["dtype"])
        return gspaces.Box(np.asarray(d["low"], dtype=dt), np.asarray(d["high"], dtype=dt), tuple(d["shape"]), dt)
    raise RLError(f"vlafeed.rl: unknown space type {t!r} in a checkpoint")
