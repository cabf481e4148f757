"""vlafeed.Mix: several datasets mixed by weight, sample by sample.

    mix = vlafeed.Mix([loader_a, loader_b], weights=[0.7, 0.3], batch_size=64,
                      window=1000, seed=0)
    for batch in mix:            # {"observation.state": [64, D], ..., "dataset_index": int64 [64]}
        ...

Sources are any objects with vlafeed.Loader's surface (``__iter__`` = one
epoch of dict batches, ``set_epoch``, ``state_dict`` / ``load_state_dict``,
optionally ``stats`` and ``__len__``): vlafeed.Loader, vlafeed.ShardLoader, or
a Python class of your own. Mix pulls batches from them and deals single
samples out of those batches into its own batches.

The order. The output stream is cut into consecutive windows of ``window``
(N) samples. In every window, dataset i contributes exactly its
largest-remainder share of N (weights are read as the decimals they print as,
so 0.7 is 7/10; ties of the remainders go to a seeded order that changes per
window). Inside the window the shares are interleaved smoothly: datasets in
order of decreasing share are each spread evenly (a stride schedule: its k-th
sample at virtual time (2k + 1) / (2 q_i)) over the positions the larger ones
left, against the smaller ones taken together. So a dataset never comes in a
run longer than its share needs (within one), and every prefix of a window
holds each dataset's share of that prefix to within about a sample. The order is a pure function of (weights, window, seed,
window number); no data is needed to know it (``Mix.order(w)``).

Epochs. Each source runs its own epochs: when one ends, Mix calls
``set_epoch(e + 1)`` on it and goes on, independently of the others.

Budget per window. ``samples_per_window=S`` (a multiple of N) makes one pass
over the Mix (``for batch in mix``) yield exactly S samples, in ceil(S / B)
batches (the last one short when B does not divide S), like VLA Foundry's
checkpoint window but exact: S samples, S / N whole mixing windows, each with
its exact shares. Without it a pass never ends; stop by step count.
Breaking out of a pass and iterating again continues the same stream.
``epoch`` / ``set_epoch(e)`` number the passes (trainer loops call them; a
Mix with a budget can so be a source of another Mix); the stream never
restarts.

Resume. ``state_dict()`` holds, for every source, its own state as of the
batch Mix is slicing (taken before that batch was pulled) and how many of
that batch's samples were dealt, plus the stream position and counters.
``load_state_dict()`` restores each source, pulls that batch again and skips
the dealt samples: the resumed stream equals the uninterrupted one sample for
sample (with deterministic sources and transforms).

Ranks. Mix runs per rank over per-rank sources (each vlafeed.Loader already
reads only its rank's share). The mixing order is the same on every rank, so
every rank's batches hold exact shares, and so does the global batch: with R
ranks, R times each rank's count. Sources that report ``rank`` /
``world_size`` must agree, or Mix refuses them.
"""
import math
from fractions import Fraction

import numpy as np

from vlafeed.data.loader import OneThreadAtATime

STATE_VERSION = 1
MAX_WINDOW = 1 << 24


class MixSourceError(RuntimeError):
    """A source raised, or gave something Mix cannot use; names the source index."""

    def __init__(self, message, source_index):
        super().__init__(message)
        self.source_index = source_index


def exact_weight(w, index):
    """A positive weight as an exact Fraction (floats read as their shortest decimal repr)."""
    if isinstance(w, bool):
        raise ValueError(f"Mix: weight {index} is a bool ({w!r}); give a positive number")
    if isinstance(w, (int, Fraction)):
        f = Fraction(w)
    else:
        try:
            x = float(w)
        except (TypeError, ValueError):
            raise ValueError(f"Mix: weight {index} is not a number: {w!r}") from None
        if not math.isfinite(x):
            raise ValueError(f"Mix: weight {index} is not finite: {w!r}")
        f = Fraction(repr(x))
    if f <= 0:
        raise ValueError(f"Mix: weight {index} must be positive, got {w!r}")
    return f


def normalized_weights(weights):
    fr = [exact_weight(w, i) for i, w in enumerate(weights)]
    total = sum(fr)
    return [f / total for f in fr]


def tie_priority(seed, window_index, k):
    """A seeded permutation of range(k) for window `window_index`: rank of each
    source when remainders or virtual times tie (lower goes first)."""
    rng = np.random.default_rng([int(seed), int(window_index)])
    prio = np.empty(k, dtype=np.int64)
    prio[rng.permutation(k)] = np.arange(k)
    return prio


def largest_remainder(fractions, n, priority):
    """Integer shares of n for exact fractions summing to 1: floors, then one more
    for the largest remainders (ties: lower priority value first)."""
    exact = [f * n for f in fractions]
    base = [math.floor(e) for e in exact]
    extra = n - sum(base)
    order = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - base[i]), int(priority[i])))
    for i in order[:extra]:
        base[i] += 1
    return np.asarray(base, dtype=np.int64)


def two_class(qa, qb):
    """Boolean mask over qa + qb positions, True where class a goes: the k-th
    item of a class sits at virtual time (2k+1)/(2q), positions sorted by
    time, a first on ties. float64 division is correctly rounded, so equal
    fractions give equal keys and distinct ones (denominators < 2^25) keep
    their order: the sort is exact."""
    ta = (2 * np.arange(qa, dtype=np.int64) + 1).astype(np.float64) / float(2 * qa) if qa else np.empty(0)
    tb = (2 * np.arange(qb, dtype=np.int64) + 1).astype(np.float64) / float(2 * qb) if qb else np.empty(0)
    t = np.concatenate((ta, tb))
    cls = np.concatenate((np.zeros(qa, dtype=np.int8), np.ones(qb, dtype=np.int8)))
    return cls[np.lexsort((cls, t))] == 0


def smooth_order(quotas, priority):
    """Dataset indices of one window holding quotas[i] samples of dataset i.
    Datasets in order of decreasing quota (ties by priority); each in turn is
    spread evenly over the positions the larger ones left free, against the
    smaller ones taken together as one class. So every dataset is spread
    evenly against all the others (its runs are as short as its share
    allows, within one), and every prefix holds each dataset's share of it
    to within a sample or so."""
    quotas = np.asarray(quotas, dtype=np.int64)
    n = int(quotas.sum())
    levels = sorted(range(len(quotas)), key=lambda i: (-int(quotas[i]), int(priority[i])))
    levels = [i for i in levels if quotas[i] > 0]
    out = np.empty(n, dtype=np.int64)
    free = np.arange(n, dtype=np.int64)
    rest = n
    for i in levels[:-1]:
        rest -= int(quotas[i])
        mask = two_class(int(quotas[i]), rest)
        out[free[mask]] = i
        free = free[~mask]
    if levels:
        out[free] = levels[-1]
    return out


def window_order(fractions, window, seed, window_index):
    """(quotas, dataset index per position) of mixing window `window_index`."""
    prio = tie_priority(seed, window_index, len(fractions))
    q = largest_remainder(fractions, window, prio)
    return q, smooth_order(q, prio)


def seed_matters(fractions, window):
    """Whether the seeded tie order can change a window: remainders tied across the cut of
    the largest-remainder rounding, or equal quotas (their order in the window). When it
    cannot, every window has the same order."""
    exact = [f * window for f in fractions]
    rem = sorted((e - math.floor(e) for e in exact), reverse=True)
    extra = window - sum(math.floor(e) for e in exact)
    if 0 < extra < len(rem) and rem[extra - 1] == rem[extra]:
        return True
    q = largest_remainder(fractions, window, list(range(len(fractions))))
    return len(set(q.tolist())) < len(q)


def column_kind(value):
    if isinstance(value, np.ndarray):
        return "numpy"
    if isinstance(value, list):
        return "list"
    if type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "shape"):
        return "torch"
    return None


_NP_DTYPES = {}


def numpy_dtype_of(torch, dtype):
    """NumPy's dtype for a torch dtype (TypeError when NumPy has none, e.g. bfloat16)."""
    got = _NP_DTYPES.get(dtype)
    if got is None:
        got = _NP_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return got


class _MixConversions:
    """{column: MixConversion} of a Mix, looked up by name when the device step meets a column."""

    def __init__(self, mix):
        self.mix = mix

    def get(self, name):
        from vlafeed.torch.device import MixConversion

        sources = [s.source if self.mix._host_source(s) else None for s in self.mix._src]
        if not any(src is not None and name in src.device_conversions() for src in sources):
            return None
        return MixConversion(name, sources)


class _Src:
    """Mix's bookkeeping for one source."""

    def __init__(self, index, source, transform):
        self.index = index
        self.source = source
        self.transform = transform
        self.epoch = int(getattr(source, "epoch", 0) or 0)
        self.epochs_completed = 0
        self.it = None
        self.batch = None
        self.rows = 0
        self.dealt = 0
        self.state_before = None
        self.taken = 0
        self.batches_pulled = 0


class Mix:
    """Batches mixing several sources by weight at the sample level.

    sources: objects with vlafeed.Loader's surface. weights: positive numbers,
    one per source (normalized). batch_size: samples per output batch.
    window: the mixing window N (default: samples_per_window if given, else
    batch_size, so every batch holds exact shares). seed: the tie-breaking
    order per window. transforms: None or one callable-or-None per source,
    applied to every batch the source yields (to rename or convert columns).
    samples_per_window: exact sample budget of one pass (a multiple of N).
    Every output batch has the sources' common columns plus ``dataset_index``
    (int64: a torch tensor when the columns are torch tensors, else NumPy).
    """

    def __init__(self, sources, weights, batch_size, window=None, seed=0, transforms=None,
                 samples_per_window=None, device=None):
        sources = list(sources)
        if not sources:
            raise ValueError("Mix: no sources given")
        weights = list(weights)
        if len(weights) != len(sources):
            raise ValueError(f"Mix: {len(sources)} sources but {len(weights)} weights")
        self.fractions = normalized_weights(weights)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Mix: batch_size must be a positive integer, got {batch_size!r}")
        if samples_per_window is not None:
            if isinstance(samples_per_window, bool) or not isinstance(samples_per_window, int) \
                    or samples_per_window < 1:
                raise ValueError(f"Mix: samples_per_window must be a positive integer, got {samples_per_window!r}")
        if window is None:
            window = samples_per_window if samples_per_window is not None else batch_size
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"Mix: window must be an integer in 1..{MAX_WINDOW}, got {window!r}")
        if samples_per_window is not None and samples_per_window % window:
            raise ValueError(f"Mix: samples_per_window ({samples_per_window}) must be a multiple of "
                             f"window ({window}) so that every budget holds whole mixing windows")
        for i, f in enumerate(self.fractions):
            if f * window < 1:
                raise ValueError(f"Mix: window {window} gives source {i} (weight {float(f):.6g}) "
                                 f"{float(f * window):.3g} samples per window; use a window of at least "
                                 f"{math.ceil(1 / f)}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"Mix: seed must be a non-negative integer, got {seed!r}")
        if transforms is None:
            transforms = [None] * len(sources)
        transforms = list(transforms)
        if len(transforms) != len(sources):
            raise ValueError(f"Mix: {len(sources)} sources but {len(transforms)} transforms")
        for i, t in enumerate(transforms):
            if t is not None and not callable(t):
                raise TypeError(f"Mix: transform {i} is not callable: {t!r}")
        for i, s in enumerate(sources):
            missing = [m for m in ("__iter__", "set_epoch", "state_dict", "load_state_dict")
                       if not callable(getattr(s, m, None))]
            if missing:
                raise TypeError(f"Mix: source {i} ({type(s).__name__}) lacks {', '.join(missing)}")
        ranks = {(getattr(s, "rank", None), getattr(s, "world_size", None)) for s in sources}
        ranks.discard((None, None))
        if len(ranks) > 1:
            raise ValueError("Mix: sources disagree on (rank, world_size): "
                             + ", ".join(f"source {i}: ({getattr(s, 'rank', None)}, {getattr(s, 'world_size', None)})"
                                         for i, s in enumerate(sources)))
        self.sources = sources
        self.batch_size = batch_size
        self.window = window
        self.seed = seed
        self.samples_per_window = samples_per_window
        self._src = [_Src(i, s, t) for i, (s, t) in enumerate(zip(sources, transforms))]
        self._schema = None          # {name: (kind, dtype, shape[1:])}, column order
        self._schema_source = None
        self._one_thread = OneThreadAtATime("Mix")
        self._pos = 0                # samples emitted
        self._batches = 0
        self._pass_done = 0          # samples of the current pass (samples_per_window)
        self._passes_completed = 0
        self._epoch = 0              # pass number, for trainers that call set_epoch
        self._awaiting_next = False  # a pass ended and set_epoch() has not named the next one
        self._order_cache = {}
        self._seed_matters = seed_matters(self.fractions, window)
        k = len(sources)
        self._window_counts = np.zeros(k, dtype=np.int64)   # current window so far
        self._last_window = np.zeros(k, dtype=np.int64)     # last completed window
        self._device = None
        self._handed = None          # during a device pass: the state as of the last batch handed out
        if device is not None:
            from vlafeed.torch.device import resolve_device
            self._device = resolve_device(device, "Mix")
        if self._device is not None:
            for i, src in enumerate(sources):
                own = getattr(src, "device", None)
                if own is not None and own != self._device:
                    raise ValueError(f"Mix: source {i} delivers its batches on {own}, this Mix on {self._device}: "
                                     "give the device to the Mix (and, for uint8 images on the wire, the same "
                                     "device to its vlafeed sources)")

    @property
    def device(self):
        """The device the mixed batches are delivered on (None: host memory)."""
        return self._device

    def device_conversions(self):
        """What the device step does to the mixed uint8 image columns: each row converted with its
        source's table (its dataset's statistics)."""
        return _MixConversions(self)

    def _host_source(self, s):
        """Whether source s hands its host batches to this Mix (a vlafeed loader given the Mix's
        device: the Mix moves the mixed batch, and the source's conversions run on the device)."""
        return self._device is not None and getattr(s.source, "device", None) is not None and \
            callable(getattr(s.source, "host_batches", None))

    def _iter_source(self, s):
        if self._host_source(s):
            return self._call(s, "host_batches()", s.source.host_batches)
        return self._call(s, "__iter__()", iter, s.source)

    # ---- order -------------------------------------------------------------

    def order(self, window_index):
        """Dataset index of every position of mixing window `window_index` (no data read)."""
        return self._order(window_index).copy()

    def _order(self, window_index):
        if not self._seed_matters:
            window_index = -1   # every window is the same; computed once (with window 0's ties)
        hit = self._order_cache.get(window_index)
        if hit is None:
            if len(self._order_cache) >= 4:
                self._order_cache.pop(next(iter(self._order_cache)))
            hit = self._order_cache[window_index] = window_order(self.fractions, self.window, self.seed,
                                                                 max(window_index, 0))
        return hit[1]

    def quotas(self, window_index):
        """Samples of each source in mixing window `window_index`."""
        self._order(window_index)
        return self._order_cache[window_index if self._seed_matters else -1][0].copy()

    def _next_indices(self, n):
        parts, pos = [], self._pos
        while n:
            w, off = divmod(pos, self.window)
            m = min(n, self.window - off)
            parts.append(self._order(w)[off:off + m])
            pos += m
            n -= m
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    # ---- sources -----------------------------------------------------------

    def _call(self, s, what, fn, *args):
        try:
            return fn(*args)
        except StopIteration:
            raise
        except Exception as exc:
            raise MixSourceError(f"Mix: source {s.index} ({type(s.source).__name__}) raised in {what} "
                                 f"(its epoch {s.epoch}): {type(exc).__name__}: {exc}", s.index) from exc

    def _pull(self, s):
        """Next batch of source s into s.batch, wrapping its epoch when it ends."""
        for attempt in range(2):
            state = self._call(s, "state_dict()", s.source.state_dict)
            if s.it is None:
                s.it = self._iter_source(s)
            try:
                batch = self._call(s, "__next__()", next, s.it)
            except StopIteration:
                if attempt:
                    raise MixSourceError(f"Mix: source {s.index} ({type(s.source).__name__}) yielded no "
                                         f"batch in its epoch {s.epoch}", s.index) from None
                s.it = None
                self._call(s, f"set_epoch({s.epoch + 1})", s.source.set_epoch, s.epoch + 1)
                s.epoch += 1
                s.epochs_completed += 1
                continue
            s.state_before = state
            s.batches_pulled += 1
            e = getattr(s.source, "epoch", None)
            if isinstance(e, int) and not isinstance(e, bool):
                s.epoch = e   # the source's own count when it has one
            self._take_batch(s, batch)
            return
        raise AssertionError("unreachable")

    def _take_batch(self, s, batch):
        if s.transform is not None:
            batch = self._call(s, "its transform", s.transform, batch)
        if not isinstance(batch, dict):
            raise MixSourceError(f"Mix: source {s.index} gave a {type(batch).__name__}, not a dict batch",
                                 s.index)
        s.batch = batch
        s.rows = self._check_batch(s, batch)
        s.dealt = 0

    def _check_batch(self, s, batch):
        """Rows of the batch; checks its columns against the common schema."""
        if "dataset_index" in batch:
            raise MixSourceError(f"Mix: source {s.index} has a column 'dataset_index', which Mix adds itself; "
                                 "rename it with a transform", s.index)
        rows = None
        desc = {}
        for name, value in batch.items():
            kind = column_kind(value)
            if kind is None:
                raise MixSourceError(f"Mix: source {s.index} column {name!r} is a {type(value).__name__}; "
                                     "columns must be torch tensors, NumPy arrays or lists", s.index)
            if kind == "list":
                n, dtype, shape = len(value), None, None
            else:
                if value.ndim == 0:
                    raise MixSourceError(f"Mix: source {s.index} column {name!r} is a scalar, not a batch column",
                                         s.index)
                n, dtype, shape = int(value.shape[0]), value.dtype, tuple(value.shape[1:])
            if rows is None:
                rows = n
            elif n != rows:
                raise MixSourceError(f"Mix: source {s.index} column {name!r} has {n} rows but the batch's "
                                     f"other columns have {rows}", s.index)
            desc[name] = (kind, dtype, shape)
        if self._schema is None:
            self._schema, self._schema_source = desc, s.index
            return rows or 0
        ref, r = self._schema, self._schema_source
        for name in ref:
            if name not in desc:
                raise MixSourceError(f"Mix: source {s.index} lacks column {name!r} (source {r} has it)", s.index)
        for name, (kind, dtype, shape) in desc.items():
            if name not in ref:
                raise MixSourceError(f"Mix: source {s.index} has column {name!r}, which source {r} lacks",
                                     s.index)
            rk, rd, rs = ref[name]
            if kind != rk:
                raise MixSourceError(f"Mix: source {s.index} column {name!r} is {kind}, source {r}'s is {rk}",
                                     s.index)
            if dtype != rd:
                raise MixSourceError(f"Mix: source {s.index} column {name!r} has dtype {dtype}, source {r}'s "
                                     f"has {rd}", s.index)
            if shape != rs:
                raise MixSourceError(f"Mix: source {s.index} column {name!r} has per-sample shape {list(shape)}, "
                                     f"source {r}'s has {list(rs)}", s.index)
        return rows or 0

    # ---- iteration ---------------------------------------------------------

    def __len__(self):
        """Batches per pass (only with samples_per_window; otherwise a pass never ends)."""
        if self.samples_per_window is None:
            raise TypeError("Mix without samples_per_window is an endless stream and has no len()")
        return -(-self.samples_per_window // self.batch_size)

    @property
    def epoch(self):
        """The pass number: set by set_epoch(), or counted up when a new pass starts without it."""
        return self._epoch

    def set_epoch(self, epoch):
        """Records the pass number (trainers call this between epochs; it also makes a Mix with
        samples_per_window usable as a source of another Mix). The stream never restarts: a
        pass in progress continues, a finished one is followed by the next."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"Mix.set_epoch: epoch must be a non-negative integer, got {epoch!r}")
        self._one_thread.check()
        self._epoch = epoch
        self._awaiting_next = False

    def __iter__(self):
        # One thread at a time, as the Loader sources (a second thread would deal the same
        # window twice): another thread gets RuntimeError naming the holder.
        with self._one_thread.iterating():
            yield from (self._pass() if self._device is None else self._on_device(self._pass()))

    def _on_device(self, batches):
        """The pass's batches moved by a DeviceFeeder, which takes them from the mixing ahead of the
        caller: the state is that of the last batch handed out, and a pass left early puts the
        stream back there (so that the next pass continues with the first batch not handed out)."""
        from vlafeed.torch.device import DeviceFeeder

        def tagged():
            for batch in batches:
                yield batch, self._live_state()

        self._handed = self._live_state()
        feeder = DeviceFeeder(tagged(), self._device, self.device_conversions(), tagged=True)
        produced = self._batches
        handed_out = 0
        try:
            for batch in feeder:
                self._handed = feeder.tag
                handed_out += 1
                yield batch
        finally:
            feeder.close()
            state, self._handed = self._handed, None
            if self._batches != produced + handed_out:   # mixed batches the caller never got
                self.load_state_dict(state)

    def _pass(self):
        S = self.samples_per_window
        if S is not None and self._pass_done >= S:
            self._pass_done = 0
            if self._awaiting_next:     # iterated again without set_epoch: the next pass
                self._epoch += 1
            self._awaiting_next = False
        while True:
            n = self.batch_size if S is None else min(self.batch_size, S - self._pass_done)
            if n <= 0:
                return
            batch = self._next_batch(n)
            if S is not None and self._pass_done >= S:
                self._passes_completed += 1
                self._awaiting_next = True
            yield batch
            if S is not None and self._pass_done >= S:
                return

    def _next_batch(self, n):
        d = self._next_indices(n)
        pieces = []          # (src, batch, start, stop, output positions)
        for s in self._src:
            pos = np.flatnonzero(d == s.index)
            need, at = len(pos), 0
            while at < need:
                if s.batch is None or s.dealt >= s.rows:
                    s.batch = None
                    self._pull(s)
                    continue
                m = min(need - at, s.rows - s.dealt)
                pieces.append((s, s.batch, s.dealt, s.dealt + m, pos[at:at + m]))
                s.dealt += m
                at += m
            s.taken += need
        out = self._assemble(pieces, d)
        # counters
        pos, at = self._pos, 0
        while at < n:   # window bookkeeping, possibly across a window boundary
            m = min(n - at, self.window - pos % self.window)
            self._window_counts += np.bincount(d[at:at + m], minlength=len(self._src))
            pos += m
            at += m
            if pos % self.window == 0:
                self._last_window = self._window_counts
                self._window_counts = np.zeros(len(self._src), dtype=np.int64)
        self._pos += n
        self._pass_done += n
        self._batches += 1
        return out

    def _assemble(self, pieces, d):
        """Output columns: rows copied once, straight to their positions. Torch columns on the
        CPU go through NumPy views (a plain row copy; torch's index_copy_ runs on its thread
        pool, which costs far more than the copy on a busy machine)."""
        n = len(d)
        out = {}
        torch = None
        for name, (kind, dtype, shape) in self._schema.items():
            if kind == "list":
                col = [None] * n
                for _, batch, a, b, pos in pieces:
                    for p, v in zip(pos.tolist(), batch[name][a:b]):
                        col[p] = v
            elif kind == "numpy":
                col = np.empty((n,) + shape, dtype=dtype)
                for _, batch, a, b, pos in pieces:
                    col[pos] = batch[name][a:b]
            else:
                if torch is None:
                    import torch
                col = None
                if all(batch[name].device.type == "cpu" for _, batch, _, _, _ in pieces):
                    try:
                        np_col = np.empty((n,) + shape, dtype=numpy_dtype_of(torch, dtype))
                        for _, batch, a, b, pos in pieces:
                            np_col[pos] = batch[name][a:b].detach().numpy()
                        col = torch.from_numpy(np_col)
                    except TypeError:   # a dtype NumPy lacks (bfloat16): torch's own copy
                        col = None
                if col is None:
                    col = torch.empty((n,) + shape, dtype=dtype, device=pieces[0][1][name].device)
                    for _, batch, a, b, pos in pieces:
                        col.index_copy_(0, torch.from_numpy(pos).to(col.device), batch[name][a:b])
            out[name] = col
        di = d.astype(np.int64, copy=True)
        if torch is not None:
            di = torch.from_numpy(di)
        out["dataset_index"] = di
        return out

    # ---- resume ------------------------------------------------------------

    def _fingerprint(self):
        return {"version": STATE_VERSION, "sources": len(self._src),
                "weights": [f"{f.numerator}/{f.denominator}" for f in self.fractions],
                "window": self.window, "batch_size": self.batch_size, "seed": self.seed,
                "samples_per_window": self.samples_per_window}

    def state_dict(self):
        """Position of the stream: per source its state before the batch being sliced and the
        samples of that batch already dealt; the sample position and counters."""
        if self._handed is not None:
            return self._handed
        return self._live_state()

    def _live_state(self):
        src = []
        for s in self._src:
            if s.batch is not None and s.dealt < s.rows:
                state, dealt, holding = s.state_before, s.dealt, True
            else:   # nothing half-used: the source's own state now is the state before its next pull
                state, dealt, holding = self._call(s, "state_dict()", s.source.state_dict), 0, False
            src.append({"state": state, "holding": holding, "dealt": dealt, "epoch": s.epoch,
                        "epochs_completed": s.epochs_completed, "taken": s.taken,
                        "batches_pulled": s.batches_pulled})
        st = self._fingerprint()
        st.update({"position": self._pos, "batches": self._batches, "pass_done": self._pass_done,
                   "passes_completed": self._passes_completed, "epoch": self._epoch,
                   "awaiting_next": self._awaiting_next,
                   "window_counts": self._window_counts.tolist(), "last_window": self._last_window.tolist(),
                   "source_states": src})
        return st

    def load_state_dict(self, state):
        """Continues where `state` stopped: restores every source, pulls its half-dealt batch
        again and skips the samples already dealt. ValueError when the state comes from a Mix
        with other sources count, weights, window, batch size, seed or budget."""
        self._one_thread.check()
        self._check_state(state)
        # A source may still refuse its own state (checked by the source): then every source goes
        # back to where it was, so a refused state leaves the whole Mix as it was.
        before = self.state_dict()
        try:
            self._restore(state)
        except BaseException:
            try:
                self._restore(before)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise

    def _restore(self, state):
        for s, ss in zip(self._src, state["source_states"]):
            self._call(s, "load_state_dict()", s.source.load_state_dict, ss["state"])
            s.epoch = int(ss["epoch"])
            s.epochs_completed = int(ss["epochs_completed"])
            s.taken = int(ss["taken"])
            s.batches_pulled = int(ss["batches_pulled"])
            s.it, s.batch, s.rows, s.dealt, s.state_before = None, None, 0, 0, None
            if ss["holding"]:
                s.it = self._iter_source(s)
                try:
                    batch = self._call(s, "__next__()", next, s.it)
                except StopIteration:
                    raise MixSourceError(f"Mix.load_state_dict: source {s.index} yielded no batch from the "
                                         "restored state (the batch being dealt)", s.index) from None
                s.state_before = ss["state"]
                self._take_batch(s, batch)
                dealt = int(ss["dealt"])
                if dealt > s.rows:
                    raise MixSourceError(f"Mix.load_state_dict: source {s.index}'s restored batch has {s.rows} "
                                         f"samples, but the state says {dealt} were dealt", s.index)
                s.dealt = dealt
        self._pos = int(state["position"])
        self._batches = int(state["batches"])
        self._pass_done = int(state["pass_done"])
        self._passes_completed = int(state["passes_completed"])
        self._epoch = int(state["epoch"])
        self._awaiting_next = bool(state["awaiting_next"])
        self._window_counts = np.asarray(state["window_counts"], dtype=np.int64)
        self._last_window = np.asarray(state["last_window"], dtype=np.int64)

    def _check_state(self, state):
        """Every field of a state checked (type, range, consistency with this Mix and between the
        counters) before anything is restored: a refused state leaves the Mix as it was, and the
        ValueError names the field."""
        def fail(field, why):
            raise ValueError(f"Mix.load_state_dict: {field} {why}")

        def count(value, field, upper=None):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                fail(field, f"must be an integer, got {type(value).__name__} {value!r}")
            if value < 0 or value >= 2 ** 63 or (upper is not None and value > upper):
                fail(field, f"is {value}, outside [0, {upper if upper is not None else 2 ** 63 - 1}]")
            return int(value)

        def flag(value, field):
            if not isinstance(value, bool):
                fail(field, f"must be true or false, got {value!r}")
            return value

        def counts(value, field, total):
            if not isinstance(value, (list, tuple)) or len(value) != k:
                fail(field, f"must be a list of {k} counts (one per source), got {value!r}")
            values = [count(v, f"{field}[{i}]") for i, v in enumerate(value)]
            if sum(values) != total:
                fail(field, f"adds up to {sum(values)}, but the state's position makes it {total}")
            return values

        if not isinstance(state, dict):
            fail("state", f"must be a dict (a Mix.state_dict()), got {type(state).__name__}")
        for key, value in self._fingerprint().items():
            if key not in state:
                fail("state", f"has no {key!r}; not a Mix state")
            if type(state[key]) is bool and type(value) is not bool:  # True == 1
                fail(f"the state's {key}", f"is {state[key]!r}, this Mix has {value!r}")
            if state[key] != value:
                fail(f"the state's {key}", f"is {state[key]!r}, this Mix has {value!r}")
        k, S = len(self._src), self.samples_per_window
        position = count(state.get("position"), "position")
        batches = count(state.get("batches"), "batches", upper=position)
        if batches * self.batch_size < position:
            fail("batches", f"is {batches}: position {position} needs at least {-(-position // self.batch_size)} "
                            f"batches of {self.batch_size}")
        count(state.get("pass_done"), "pass_done", upper=position if S is None else min(S, position))
        count(state.get("passes_completed"), "passes_completed",
              upper=None if S is None else position // S)
        count(state.get("epoch"), "epoch")
        if flag(state.get("awaiting_next"), "awaiting_next") and (S is None or state["pass_done"] != S):
            fail("awaiting_next", "is true, but no pass has ended (it is set when a pass of samples_per_window "
                                  "samples ends)")
        counts(state.get("window_counts"), "window_counts", position % self.window)
        counts(state.get("last_window"), "last_window", self.window if position >= self.window else 0)
        sources = state.get("source_states")
        if not isinstance(sources, (list, tuple)) or len(sources) != k:
            fail("source_states", f"must be a list of {k} source states, got {sources!r:.200}")
        taken = 0
        for i, ss in enumerate(sources):
            field = f"source_states[{i}]"
            if not isinstance(ss, dict):
                fail(field, f"must be a dict, got {type(ss).__name__}")
            missing = {"state", "holding", "dealt", "epoch", "epochs_completed", "taken", "batches_pulled"} - set(ss)
            if missing:
                fail(field, f"has no {', '.join(sorted(missing))}")
            if not isinstance(ss["state"], dict):
                fail(f"{field}.state", f"must be the source's state_dict() (a dict), got {type(ss['state']).__name__}")
            holding = flag(ss["holding"], f"{field}.holding")
            dealt = count(ss["dealt"], f"{field}.dealt")
            if dealt and not holding:
                fail(f"{field}.dealt", f"is {dealt} while the source holds no batch")
            if holding and not dealt:  # a batch is pulled when a sample is needed: one is dealt at once
                fail(f"{field}.holding", "is true, but no sample of the held batch was dealt")
            epoch = count(ss["epoch"], f"{field}.epoch")
            own = ss["state"].get("epoch")
            if isinstance(getattr(self._src[i].source, "epoch", None), int) and isinstance(own, int) and \
                    not isinstance(own, bool) and own != epoch:
                # Mix keeps the source's own epoch; the next epoch it starts is epoch + 1
                fail(f"{field}.epoch", f"is {epoch}, but the source's own state is at epoch {own}")
            count(ss["epochs_completed"], f"{field}.epochs_completed")
            taken += count(ss["taken"], f"{field}.taken", upper=position)
            count(ss["batches_pulled"], f"{field}.batches_pulled")
        if taken != position:
            fail("source_states", f"took {taken} samples in all, but the state's position is {position}")

    # ---- stats -------------------------------------------------------------

    def stats(self):
        """Samples and batches emitted, windows completed, and per source: requested weight,
        epoch, samples taken, realised proportion overall and in the last completed window,
        and the source's own stats()."""
        total = self._pos
        last_total = int(self._last_window.sum())
        per = []
        for s in self._src:
            f = self.fractions[s.index]
            entry = {"index": s.index, "weight": float(f), "epoch": s.epoch,
                     "epochs_completed": s.epochs_completed, "samples_taken": s.taken,
                     "batches_pulled": s.batches_pulled,
                     "proportion": s.taken / total if total else None,
                     "last_window_samples": int(self._last_window[s.index]),
                     "last_window_proportion": (int(self._last_window[s.index]) / last_total
                                                if last_total else None)}
            fn = getattr(s.source, "stats", None)
            if callable(fn):
                entry["source_stats"] = self._call(s, "stats()", fn)
            per.append(entry)
        return {"samples": total, "batches": self._batches, "window": self.window, "epoch": self._epoch,
                "windows_completed": total // self.window, "batch_size": self.batch_size,
                "samples_per_window": self.samples_per_window, "passes_completed": self._passes_completed,
                "sources": per}

    def close(self):
        """Closes the sources that have close()."""
        for s in self._src:
            fn = getattr(s.source, "close", None)
            if callable(fn):
                fn()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

