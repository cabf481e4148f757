"""vlafeed.torch.device: batches delivered as tensors on a CUDA device.

    loader = vlafeed.Loader(root, batch_size=64, device="cuda:0", normalize={"observation.images.front": "mean_std"})
    for batch in loader:          # every tensor on cuda:0; images float32, normalized on the GPU
        ...

What happens to one batch (``DeviceFeeder``):

1. The engine assembles it into its own (pageable) pool memory, as without a
   device. Image columns the caller asked for as float32 are assembled as
   uint8, so a quarter of the bytes cross PCIe.
2. Its numeric columns are packed into one slot of a small ring of pinned
   (page-locked) host buffers: one host memcpy. The engine batch is released
   right after, so its pool buffer goes back to the engine at once.
3. One ``non_blocking`` copy of the slot runs on a side CUDA stream, then the
   conversions (uint8 -> float32, normalization) on the same stream, and two
   events are recorded: after the copy (the slot may be refilled) and after the
   conversions (the batch is ready).
4. The batch is handed out ``depth`` batches later: the consumer's current
   stream waits on the "ready" event (on the GPU, the host does not block) and
   the tensors are ``record_stream``-ed on it, so the caching allocator does not
   reuse them while the consumer's kernels run. So the copy of batch k+1
   overlaps the compute on batch k.
5. A slot is refilled only after its "copied" event completed (queried; when it
   has not, the host waits on that event).

Why a pinned ring and not the engine's memory pinned in place
(``cudaHostRegister``): the engine's pool buffers are allocated and freed by C
(freed when the loader and its last batch are gone), with no hook through which
Python could unregister them before they are freed; pages shared by two
registered ranges cannot be registered twice; and an engine buffer held until
its copy completes would be taken from the engine's prefetch. The ring costs one
host memcpy per batch (the bytes that cross PCIe, uint8 for images) and keeps
the engine free of CUDA. Writing straight into pinned pool memory needs an
allocator hook in the engine: future work.

Conversions are exact: ``ImageConversion`` looks every uint8 value up in a
table of 256 float32 values per channel, computed on the host with the engine's
own float32 operations in the engine's order (v / 255, then (x - mean) /
(std + 1e-8) or (x - min) / (max - min + 1e-8) * 2 - 1). A gather is exact on
any device, so the device's result equals the engine's CPU float output bit for
bit (an elementwise ``x.float() / 255`` on CUDA may not: torch multiplies by the
reciprocal of a scalar divisor there).

The device work sits behind a small backend interface (``CudaCopies``):
host_buffer, side, copy_async, empty, launch, record, query, synchronize,
hand_over. Tests drive the feeder with a CPU backend whose copies complete late,
to check the ordering rules without a GPU.
"""
import numpy as np
import torch

ALIGN = 64                  # byte alignment of each column inside a slot (any dtype's view is aligned)
DEFAULT_DEPTH = 2           # batches issued ahead of the one handed out
NORM_EPS = np.float32(1e-8)  # LeRobot's epsilon, as the engine adds it (src/sample/spec.c)


# ---- the device --------------------------------------------------------------------------------


def resolve_device(device, what="Loader"):
    """None for no device (None or "cpu": batches stay in engine memory, unchanged); a
    torch.device for an available CUDA device; a backend object (anything with ``copy_async``)
    as is. Otherwise an error naming the device and what torch reports."""
    if device is None:
        return None
    if hasattr(device, "copy_async"):
        return device
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{what}: device={device!r} is not a device torch knows ({e})") from None
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"{what}: device={device!r}: only CUDA devices are supported (or None / 'cpu' for "
                         f"batches in host memory)")
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"this torch ({torch.__version__}) is a build without CUDA"
        else:
            why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) reports torch.cuda.is_available() "
                   f"False, {torch.cuda.device_count()} device(s): no usable GPU or driver")
        raise RuntimeError(f"{what}: device={device!r} needs CUDA, but {why}; pass device=None for batches in "
                           f"host memory")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < count:
        raise RuntimeError(f"{what}: device={device!r}: torch reports {count} CUDA device(s) "
                           f"(cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


DEVICE_KEY = "__vlafeed_device__"   # a host batch's {column: conversion}, from a DataLoader worker


def wants_device(device):
    """Whether device= asks for a device (without touching CUDA: safe in a DataLoader worker)."""
    if device is None:
        return False
    if hasattr(device, "copy_async"):
        return True
    try:
        return torch.device(device).type != "cpu"
    except (RuntimeError, TypeError):
        return True   # resolve_device names what is wrong with it


class HostOnly:
    """The device of a loader in a DataLoader worker: the loader assembles its batches as for the
    device (uint8 images) and hands them over with host_batches(); the main process moves them."""

    def copy_async(self, host):
        raise RuntimeError("this loader runs in a DataLoader worker: its batches are moved to the device in the "
                           "main process (vlafeed.torch.DataLoader or vlafeed.torch.device.to_device)")

    host_buffer = side = empty = record = copy_async


class CudaCopies:
    """The CUDA backend: pinned host buffers, a side stream for the copies and conversions,
    events that order slot reuse and hand-over."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        # What the consumer's stream did before (e.g. the conversion tables' upload) comes first.
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def host_buffer(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def side(self):
        return torch.cuda.stream(self.stream)

    def copy_async(self, host):
        return host.to(self.device, non_blocking=True)

    def empty(self, shape, dtype):
        return torch.empty(shape, dtype=dtype, device=self.device)

    def to_device(self, tensor):
        """A small tensor (a conversion table) uploaded once, before the side stream uses it."""
        out = tensor.to(self.device)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return out

    def launch(self, fn, *args):
        fn(*args)            # enqueued on the side stream (the caller is inside side())

    def record(self):
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def query(self, event):
        return event.query()

    def synchronize(self, event):
        event.synchronize()

    def hand_over(self, event, tensors):
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for t in tensors:
            t.record_stream(consumer)


# ---- conversions ---------------------------------------------------------------------------------


def image_table(scale255="divide", mode=None, a=None, b=None):
    """float32 [C, 256] (C = 1 without normalization): what the engine makes of each uint8 value.
    scale255: "divide" (v / 255, the LeRobot engine) or "reciprocal" (v * (1 / 255), the shard
    reader). mode: None, "mean_std" (a = mean, b = std) or "min_max" (a = min, b = max), per
    channel, computed in float32 in the engine's order."""
    v = np.arange(256, dtype=np.float32)
    x = v / np.float32(255) if scale255 == "divide" else v * (np.float32(1) / np.float32(255))
    if mode is None:
        return x[None, :]
    a = np.asarray(a, dtype=np.float64).reshape(-1).astype(np.float32)
    b = np.asarray(b, dtype=np.float64).reshape(-1).astype(np.float32)
    if mode == "mean_std":
        shift, scale = a, b + NORM_EPS
    elif mode == "min_max":
        shift, scale = a, (b - a) + NORM_EPS
    else:
        raise ValueError(f"unknown normalization {mode!r}")
    y = (x[None, :] - shift[:, None]) / scale[:, None]
    if mode == "min_max":
        y = y * np.float32(2) - np.float32(1)
    return y.astype(np.float32)


class ImageConversion:
    """uint8 image column -> float32 CHW, by table lookup (exact). hwc: the input is [..., H, W, C]
    (the output is [..., C, H, W], as the engine's float format)."""

    def __init__(self, table, hwc=False):
        self.table = torch.as_tensor(np.ascontiguousarray(table, dtype=np.float32))
        self.hwc = hwc

    def __reduce__(self):   # pickled inline (a DataLoader worker's batch), not through shared memory
        return ImageConversion, (self.table.cpu().numpy(), self.hwc)

    def key(self):
        return (self.hwc, self.table.cpu().numpy().tobytes())

    def on(self, place):
        """This conversion with its table on a backend's device (once per feeder)."""
        other = ImageConversion.__new__(ImageConversion)
        other.table = place(self.table)
        other.hwc = self.hwc
        return other

    def out_shape(self, shape):
        shape = tuple(shape)
        return shape[:-3] + (shape[-1],) + shape[-3:-1] if self.hwc else shape

    def check(self, name, dtype, shape):
        if dtype != torch.uint8 or len(shape) < 3:
            raise ValueError(f"device conversion of {name!r}: expected a uint8 image column, got {dtype} "
                             f"{tuple(shape)}")
        channels = shape[-1] if self.hwc else shape[-3]
        if self.table.shape[0] not in (1, channels):
            raise ValueError(f"device conversion of {name!r}: {channels} channels, but the statistics hold "
                             f"{self.table.shape[0]} values")

    def apply_into(self, raw, out, columns=None):
        """out[...] = table[channel, raw[...]] (raw and out on the same device)."""
        src = raw.movedim(-1, -3) if self.hwc else raw
        idx = torch.empty(src.shape, dtype=torch.int32, device=src.device)
        idx.copy_(src)
        rows = self.table.shape[0]
        if rows > 1:
            offsets = torch.arange(0, 256 * rows, 256, dtype=torch.int32, device=src.device)
            idx += offsets.view(rows, 1, 1)
        torch.index_select(self.table.view(-1), 0, idx.view(-1), out=out.view(-1))

    def __call__(self, raw):
        """The converted tensor, on raw's device (the table moves there if needed)."""
        conv = self if self.table.device == raw.device else self.on(lambda t: t.to(raw.device))
        conv.check("column", raw.dtype, raw.shape)
        out = torch.empty(conv.out_shape(raw.shape), dtype=torch.float32, device=raw.device)
        conv.apply_into(raw, out)
        return out


class MixConversion:
    """A column of a Mix whose sources convert it with their own tables (e.g. each dataset's
    image statistics): each row is looked up in the table of its source (``dataset_index``).
    The sources' tables are read when a batch is converted (a shard reader names its image
    columns when it reads its first batch)."""

    def __init__(self, name, sources, place=None):
        self.name = name
        self.sources = sources          # objects with device_conversions(), or None
        self.place = place or (lambda t: t)
        self._tables = {}               # source index -> (host table, device table)
        self.hwc = None

    def on(self, place):
        return MixConversion(self.name, self.sources, place)

    def _source_tables(self):
        got = []
        for i, src in enumerate(self.sources):
            conv = src.device_conversions().get(self.name) if src is not None else None
            if conv is None:
                got.append(None)
                continue
            if self.hwc is None:
                self.hwc = conv.hwc
            elif conv.hwc != self.hwc:
                raise ValueError(f"Mix: column {self.name!r}: sources give it in different layouts (HWC and CHW)")
            if i not in self._tables or self._tables[i][0] is not conv.table:
                self._tables[i] = (conv.table, self.place(conv.table))
            got.append(self._tables[i])
        return got

    def out_shape(self, shape):
        self._source_tables()
        return ImageConversion.out_shape(self, shape)

    def check(self, name, dtype, shape):
        tables = [t for t in self._source_tables() if t is not None]
        for host, _ in tables:
            probe = ImageConversion.__new__(ImageConversion)
            probe.table, probe.hwc = host, self.hwc
            probe.check(name, dtype, shape)

    def apply_into(self, raw, out, columns=None):
        tables = self._source_tables()
        present = [t for t in tables if t is not None]
        first = present[0][0]
        if all(t[0] is first or torch.equal(t[0], first) for t in present):
            single = ImageConversion.__new__(ImageConversion)
            single.table, single.hwc = present[0][1], self.hwc
            single.apply_into(raw, out)
            return
        src = raw.movedim(-1, -3) if self.hwc else raw
        channels = src.shape[-3]
        rows = []
        for t in tables:   # every source's table as [channels, 256] (NaN where a source has none)
            if t is None:
                rows.append(torch.full((channels, 256), float("nan"), device=src.device))
            else:
                rows.append(t[1].expand(channels, 256) if t[1].shape[0] == 1 else t[1])
        table = torch.cat(rows).reshape(-1)
        which = columns["dataset_index"].to(torch.int32) * (channels * 256)
        idx = torch.empty(src.shape, dtype=torch.int32, device=src.device)
        idx.copy_(src)
        idx += torch.arange(0, 256 * channels, 256, dtype=torch.int32, device=src.device).view(channels, 1, 1)
        idx += which.view((-1,) + (1,) * (src.dim() - 1))
        torch.index_select(table, 0, idx.view(-1), out=out.view(-1))


def lerobot_device_plan(dataset, image_format, normalize, renames, keys, warn=None):
    """(engine image_format, engine normalize, {output column: ImageConversion}) for a LeRobot
    loader with a device: float32 images are assembled as uint8 CHW and converted (and
    normalized) on the device; vectors stay normalized by the engine."""
    if image_format != "float32":
        return image_format, normalize, {}
    features = dataset.features
    videos = [k for k, f in features.items() if f.get("kind") == "video" and (keys is None or k in keys)]
    renames = dict(renames or {})
    engine_norm = dict(normalize or {})
    stats = None
    conversions = {}
    for key in videos:
        mode = engine_norm.pop(key, None)
        if mode in (None, "none"):
            conversions[renames.get(key, key)] = ImageConversion(image_table("divide"))
            continue
        if mode not in ("mean_std", "min_max"):
            engine_norm[key] = mode   # the engine names what is wrong with it
            continue
        if stats is None:
            stats = dataset.stats
        a_name, b_name = ("mean", "std") if mode == "mean_std" else ("min", "max")
        entry = stats.get(key) or {}
        if a_name not in entry or b_name not in entry:
            raise ValueError(f"normalize['{key}']: the dataset has no '{a_name}' and '{b_name}' statistics for it "
                             f"(meta/stats.json)")
        a = np.asarray(entry[a_name], dtype=np.float64).reshape(-1)
        b = np.asarray(entry[b_name], dtype=np.float64).reshape(-1)
        if a.size != 3 or b.size != 3:
            raise ValueError(f"normalize['{key}']: statistics {a_name}/{b_name} hold {a.size}/{b.size} values, "
                             f"expected 3 (meta/stats.json)")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError(f"normalize['{key}']: a statistic {a_name}/{b_name} is not finite (meta/stats.json)")
        table = image_table("divide", mode, a, b)
        scale = (b.astype(np.float32) if mode == "mean_std" else b.astype(np.float32) - a.astype(np.float32))
        degenerate = int(((scale + NORM_EPS) <= np.float32(1e-6)).sum())
        if degenerate and warn is not None:
            warn(f"normalize['{key}']: {degenerate} of its 3 {'std' if mode == 'mean_std' else 'max - min'} values "
                 f"are 0 in meta/stats.json: those elements are divided by ~1e-8 as LeRobot does, so any value off "
                 f"the constant becomes huge")
        conversions[renames.get(key, key)] = ImageConversion(table)
    return "uint8", (engine_norm or None), conversions


# ---- the feeder ---------------------------------------------------------------------------------


class _Slot:
    __slots__ = ("buffer", "copied")

    def __init__(self):
        self.buffer = None
        self.copied = None   # the event after the last copy out of this slot


class DeviceFeeder:
    """Iterator over the batches of `batches` (dicts of CPU tensors and lists) on `device`, the
    copy of each issued `depth` batches ahead on a side stream (see the module's docstring).

    device: a torch.device / "cuda:N", or a backend object. conversions: {column: ImageConversion}
    applied on the device to those uint8 columns. An item of `batches` may be ``(batch, tag)``
    when ``tagged=True``: ``feeder.tag`` is then the tag of the batch handed out last (loaders use
    it for the resume state of what the caller received, while the feeder holds batches ahead)."""

    def __init__(self, batches, device, conversions=None, depth=DEFAULT_DEPTH, tagged=False):
        if isinstance(device, (str, torch.device)):
            dev = resolve_device(device, "DeviceFeeder")
            if dev is None:
                raise ValueError("DeviceFeeder: device must be a CUDA device (or a copy backend)")
            device = dev
        self.backend = device if hasattr(device, "copy_async") else CudaCopies(device)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"DeviceFeeder: depth must be an integer >= 1, got {depth!r}")
        self.depth = depth
        self._conversions = conversions if conversions is not None else {}   # may grow while iterating
        self._on_device = {}
        self._carried_keys = {}
        self._source = iter(batches)
        self._tagged = tagged
        self._slots = [_Slot() for _ in range(depth + 1)]
        self._next_slot = 0
        self._pending = []      # (batch dict on device, ready event, tensors to hand over, tag), oldest first
        self._exhausted = False
        self._error = None
        # len() on demand (a DataLoader's may cost a probe); a list's now (the feeder lets go of its batches)
        self._sized = len(batches) if isinstance(batches, (list, tuple)) else batches
        self.tag = None
        self.host_waits = 0     # times a slot's copy had not completed when it was needed again
        self.batches = 0

    def _upload(self, table):
        put = getattr(self.backend, "to_device", None)
        return put(table) if put is not None else table

    def _conversion(self, name, carried=None):
        conv = self._on_device.get(name)
        if carried is not None and name in carried:   # a worker's batch names its own conversions
            key = carried[name].key()
            if conv is None or self._carried_keys.get(name) != key:
                conv = self._on_device[name] = carried[name].on(self._upload)
                self._carried_keys[name] = key
            return conv
        if conv is None:
            conv = self._conversions.get(name)
            if conv is not None:
                conv = self._on_device[name] = conv.on(self._upload)
        return conv

    def __iter__(self):
        return self

    def __len__(self):
        if isinstance(self._sized, int):
            return self._sized
        if not hasattr(self._sized, "__len__"):
            raise TypeError("DeviceFeeder: its batches have no len()")
        return len(self._sized)

    def __next__(self):
        while not self._exhausted and len(self._pending) <= self.depth:
            try:
                item = next(self._source)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as e:  # noqa: BLE001 - raised after the batches before it, as without a device
                self._error = e
                self._exhausted = True
                break
            batch, tag = item if self._tagged else (item, None)
            del item
            self._pending.append(self._issue(batch) + (tag,))
            del batch  # the engine's batch is released here (its bytes are in a slot now)
        if not self._pending:
            self._source = iter(())   # let go of the source's generator
            error, self._error = self._error, None
            if error is not None:
                raise error
            raise StopIteration
        out, ready, handed, tag = self._pending.pop(0)
        self.backend.hand_over(ready, handed)
        self.tag = tag
        self.batches += 1
        return out

    def close(self):
        """Drops the batches issued ahead (their copies complete on the GPU regardless: torch's
        pinned-memory allocator does not reuse a slot freed while a copy reads it, and device
        memory freed on the side stream is reused in that stream's order)."""
        self._pending.clear()
        self._exhausted = True
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def _slot_for(self, nbytes):
        slot = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        if slot.copied is not None:
            if not self.backend.query(slot.copied):
                self.host_waits += 1
                self.backend.synchronize(slot.copied)
            slot.copied = None
        if slot.buffer is None or slot.buffer.numel() < nbytes:
            slot.buffer = self.backend.host_buffer(max(nbytes, ALIGN))
        return slot

    def _issue(self, batch):
        """Stages `batch` into a slot and issues its copy and conversions; (device batch, ready
        event, tensors for hand_over)."""
        out, layout, total, value = {}, [], 0, None
        carried = batch.get(DEVICE_KEY)
        for name, value in batch.items():
            if name == DEVICE_KEY:
                continue
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                nbytes = value.numel() * value.element_size()
                layout.append((name, value, total, nbytes))
                total += max(-(-nbytes // ALIGN), 1) * ALIGN
            out[name] = value
        handed = []
        if layout:
            slot = self._slot_for(total)
            host = slot.buffer
            for i, (name, value, offset, nbytes) in enumerate(layout):
                host[offset:offset + nbytes].view(value.dtype).view(value.shape).copy_(value)
                layout[i] = (name, value.dtype, tuple(value.shape), offset, nbytes)
        # Nothing here refers to the engine's batch memory any more: it can go back to its pool.
        del batch, value
        device_columns = {}
        with self.backend.side():
            if layout:
                flat = self.backend.copy_async(host[:total])
                slot.copied = self.backend.record()
                handed.append(flat)
            for name, dtype, shape, offset, nbytes in layout:
                device_columns[name] = flat[offset:offset + nbytes].view(dtype).view(shape)
            for name, dtype, shape, offset, nbytes in layout:
                column = device_columns[name]
                conv = self._conversion(name, carried)
                if conv is not None:
                    conv.check(name, dtype, shape)
                    converted = self.backend.empty(conv.out_shape(shape), torch.float32)
                    self.backend.launch(conv.apply_into, column, converted, device_columns)
                    handed.append(converted)
                    column = converted
                out[name] = column
            ready = self.backend.record()
        return out, ready, handed


def with_conversions(loader):
    """A worker loader's host batches, each carrying the conversions the main process applies."""
    for batch in loader.host_batches():
        conversions = loader.device_conversions()
        if conversions:
            batch[DEVICE_KEY] = dict(conversions)
        yield batch


def to_device(batches, device=None, conversions=None, depth=DEFAULT_DEPTH):
    """The batches of any iterable of dicts on `device`, copied ahead on a side stream (as
    DeviceFeeder). For a ``torch.utils.data.DataLoader`` with workers over a vlafeed dataset
    given ``device=``: its workers assemble host batches (uint8 images, with the conversions they
    need) and this moves and converts them in the main process; device defaults to the
    dataset's. Call it once per pass: ``for batch in to_device(dl): ...``."""
    dataset = getattr(batches, "dataset", None)
    if hasattr(dataset, "_move_in_main"):
        if device is None:
            device = dataset.device
        dataset._move_in_main = True      # read by the workers when they start (in iter() below)
        try:
            return DeviceFeeder(batches, device, conversions, depth)
        finally:
            dataset._move_in_main = False
    if device is None:
        raise ValueError("to_device: give the device")
    return DeviceFeeder(batches, device, conversions, depth)

