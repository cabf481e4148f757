"""vlafeed.ShardLoader: batches from WebDataset tar shards (VLA Foundry's layout).

    loader = vlafeed.ShardLoader("shards/manifest.jsonl", batch_size=64, seed=0, shuffle_buffer=1000)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:      # {"observation.state": [B,T,D], "top_t0": [B,H,W,3] uint8, ...}
            ...

The C engine (src/wds/) reads the tars (local, http(s)://, s3://), groups
members into samples as webdataset does, and decodes JPEG/PNG, .npy, .npz
and .cls in C. The Python layer only parses what is Python's to parse:
``.json`` (json.loads), ``.txt`` (UTF-8), ``.pth`` (torch.load with
weights_only=True), ``.npy`` arrays of dtypes the engine leaves to numpy
(strings, big-endian, Fortran order). Other suffixes arrive as bytes.

Columns: each npz array under its name (``observation.state``,
``past_mask``...), each image under its suffix without the extension
(``top_t0``), every other field under its suffix (``metadata.json``), plus
``__key__`` and ``__shard__`` (lists of str). Images are uint8 [B,H,W,3]
(``image_format="uint8_hwc"``, default) or float32 [B,3,H,W] in [0, 1]
(``"float_chw"``); ``resize=(width, height)`` resizes them.

Order, distribution and resume work like ``vlafeed.Loader``'s stream mode
(the shards are its tasks): see include/vlafeed/wds.h.
"""
import io
import json

import numpy as np

from vlafeed import _native
from vlafeed.data.loader import EnginePasses, distributed_rank_world, output_torch, torch_module

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")   # the members the shard reader decodes to images (src/wds)


def _parse_member(suffix, kind, data):
    """One sample's member parsed in Python: a .npy array, .json, .txt, .pth or raw bytes."""
    if kind == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    ext = suffix.rsplit(".", 1)[-1]
    if ext == "json":
        return json.loads(data)
    if ext == "txt":
        return data.decode("utf-8")
    if ext == "pth":
        torch = torch_module()
        if torch is None:
            raise ImportError(f"field {suffix!r} is a .pth: decoding it needs PyTorch")
        return torch.load(io.BytesIO(data), weights_only=True)
    return data


def convert_batch(raw, output="torch", on_error="raise", skipped=None):
    """{column: tensor | ndarray | list} from the native batch dict.

    Members parsed here (``.npy``, ``.json``, ``.txt``, ``.pth``) that cannot be parsed raise
    VlafeedError naming the shard, the sample's key and the field; with ``on_error="skip"`` the
    sample is left out of every column instead and its message appended to ``skipped``. None when
    every sample of the batch was left out."""
    torch = output_torch(output)
    n = len(raw["keys"])
    parsed, bad = {}, {}
    for name, suffix, kind, payload, descr, shape in raw["columns"]:
        if kind == "array":
            continue
        values = []
        for i, data in enumerate(payload):
            try:
                values.append(_parse_member(suffix, kind, data))
            except ImportError:
                raise
            except Exception as e:  # noqa: BLE001 - any parser's failure is bad input, named below
                message = (f"{raw['shards'][i]}: sample {raw['keys'][i]!r}: field {suffix!r}: cannot parse it "
                           f"({type(e).__name__}: {e})")
                if on_error != "skip":
                    raise _native.VlafeedError(message) from e
                bad.setdefault(i, message)
                values.append(None)
        parsed[name] = values
    keep = [i for i in range(n) if i not in bad]
    if bad and skipped is not None:
        skipped.extend(bad[i] for i in sorted(bad))
    if not keep:
        return None
    out = {}
    for name, suffix, kind, payload, descr, shape in raw["columns"]:
        if kind == "array":
            value = np.frombuffer(payload, dtype=np.dtype(descr)).reshape(shape)
            if bad:
                value = value[keep]
        elif kind == "npy":
            rows = [parsed[name][i] for i in keep]
            try:
                value = np.stack(rows) if rows else np.zeros((0,))
            except ValueError as e:
                raise _native.VlafeedError(f"{raw['shards'][keep[0]]}: field {suffix!r}: the samples' arrays differ "
                                           f"in shape within a batch ({e})") from e
        else:
            out[name] = [parsed[name][i] for i in keep]
            continue
        if torch is not None and value.dtype.kind in "biuf":
            value = torch.from_numpy(np.ascontiguousarray(value) if bad else value)
        out[name] = value
    out["__key__"] = [raw["keys"][i] for i in keep]
    out["__shard__"] = [raw["shards"][i] for i in keep]
    return out


class ShardLoader(EnginePasses):
    """Batches of samples from the shards a manifest.jsonl lists.

    manifest_or_url: path or http(s):// / s3:// URL of manifest.jsonl
    (``shard`` entries with or without ``.tar``). batch_size, seed,
    shuffle (shards permuted per epoch and the shuffle buffer), drop_last,
    rank / world_size (default: torch.distributed, else RANK / WORLD_SIZE,
    else 0 / 1), epoch, num_consumers / consumer (as ``vlafeed.Loader``),
    shuffle_buffer (samples per consumer, default 1000, 0 = shard order),
    fields (suffixes to deliver; default: those of the first sample of the
    first shard; a sample lacking one is bad input), image_format, resize,
    on_error ("raise", default: bad input raises VlafeedError naming the
    shard, member and key; "skip": the sample, or the rest of a damaged
    shard, is left out and counted in ``stats()``), threads (decode
    threads; 0 = min(4, cores)), prefetch (batches a producer thread
    assembles ahead, default 2; 0: each batch is built inside ``next``),
    output ("torch" | "numpy"), state (a ``state_dict()`` to start from),
    device (None: host memory; "cuda:N": batches as CUDA tensors, float_chw
    images read as uint8 and converted on the device; see docs/gpus.md).

    allow_outside_base: every shard must resolve under the manifest's folder
    (or URL prefix); a manifest naming ``../``, absolute paths, other hosts
    or local files from an http manifest is refused, naming the line.
    ``True`` lets such shards through (None: the VF_WDS_ALLOW_OUTSIDE=1
    environment variable decides, off by default).

    Budgets (None: the default; each must be >= 1). A shard or manifest
    cannot make the loader allocate more than they allow: each is checked
    on what a header declares before the memory is allocated, and a sample
    over one is bad input (VlafeedError naming the shard, the member, the
    key and the budget; skipped and counted under on_error="skip"). Members
    whose suffix is not in ``fields`` are never read, whatever their size.

    - max_image_pixels: width * height a JPEG or PNG header may declare
      (default 64 Mpx, 8192 x 8192);
    - max_member_bytes: a member's size in the tar (a sparse member's
      expanded size), and what one member decodes to: an image's pixels at
      the decoded size, a .npz's inflated arrays (default 256 MiB);
    - max_sample_bytes: a sample's members plus what they decode to
      (default 1 GiB);
    - max_batch_bytes: a batch's columns; the sample that would pass it is
      refused and the batch keeps those before it (default 8 GiB);
    - max_manifest_samples: the manifest's num_sequences together (the
      plan of an epoch holds about 16 bytes per sample; default 2**28).
      Besides, a local shard's count is checked against its file size at
      construction (a sample needs at least one 512-byte tar header), and
      a shard listed with num_sequences 0 whose tar holds samples raises
      (under on_error="skip": a counted skipped shard).
    - max_buffer_bytes: the read members of the samples held between
      reading and delivering them (the shuffle buffer, every consumer of
      this loader together; default 4 GiB). The sample that would pass it
      fails the pass, under either on_error policy (it is not bad input, and
      leaving it out would make what is delivered depend on memory), at the
      same sample on every run: VlafeedError naming the shard, member and
      key and saying to raise it or lower shuffle_buffer.
    """

    def __init__(self, manifest_or_url, batch_size=32, seed=0, shuffle=True, drop_last=False, rank=None,
                 world_size=None, *, epoch=0, num_consumers=1, consumer=None, shuffle_buffer=1000, fields=None,
                 image_format="uint8_hwc", resize=None, on_error="raise", threads=0, output="torch", state=None,
                 prefetch=2, allow_outside_base=None, max_image_pixels=None, max_member_bytes=None,
                 max_sample_bytes=None, max_batch_bytes=None, max_manifest_samples=None, max_buffer_bytes=None,
                 device=None):
        if rank is None or world_size is None:
            env_rank, env_world = distributed_rank_world()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        if fields is not None and not isinstance(fields, str):
            fields = ",".join(fields)
        self.batch_size = batch_size
        self.output = output
        self.rank, self.world_size = rank, world_size
        self.seed = seed
        self.drop_last = drop_last
        self._init_passes("ShardLoader", epoch)
        self._init_device(device, output)
        self._device_images = None   # with a device and float images: the table uint8 HWC -> float32 CHW
        if self._device is not None and image_format in ("float_chw", "float32"):
            from vlafeed.torch.device import ImageConversion, image_table
            # The shard reader's float format is its uint8 pixels times 1/255, planes in CHW order.
            self._device_images = ImageConversion(image_table("reciprocal"), hwc=True)
            image_format = "uint8_hwc"
        self.on_error = on_error
        self._parse_skips = []  # messages of samples left out by the Python-side parsers
        budgets = {"max_image_pixels": max_image_pixels, "max_member_bytes": max_member_bytes,
                   "max_sample_bytes": max_sample_bytes, "max_batch_bytes": max_batch_bytes,
                   "max_manifest_samples": max_manifest_samples, "max_buffer_bytes": max_buffer_bytes}
        self._native = _native.WdsLoader(
            str(manifest_or_url), batch_size=batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last,
            epoch=epoch, rank=rank, world_size=world_size, num_consumers=num_consumers,
            consumer=-1 if consumer is None else consumer, shuffle_buffer=shuffle_buffer, fields=fields,
            image_format=image_format, resize=None if resize is None else tuple(resize), on_error=on_error,
            threads=threads, state=state, prefetch=prefetch,
            **({} if allow_outside_base is None else {"allow_outside_base": bool(allow_outside_base)}),
            **{name: value for name, value in budgets.items() if value is not None})
        if state is not None:
            self._resumed(state)

    @property
    def num_samples(self):
        """Samples this loader yields per epoch (before any skipped under on_error='skip')."""
        return self._native.num_samples

    @property
    def shards(self):
        """[(name as in the manifest, path or URL, num_sequences)]."""
        return self._native.shards

    def _engine_batches(self):
        while True:
            raw = self._native.next_batch()
            if raw is None:
                return
            self._consumed += 1
            if self._device_images is not None:
                for name, suffix, kind, *_ in raw["columns"]:
                    if kind == "array" and suffix.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
                        self._device_conversions.setdefault(name, self._device_images)
            batch = convert_batch(raw, self.output, self.on_error, self._parse_skips)
            if batch is not None:  # None: every sample of it was left out (on_error="skip")
                yield batch

    def state_dict(self):
        """{kind: "wds", version, fingerprint (of the manifest's shard names and counts), positions, seed,
        epoch, samples_consumed (samples the callers of all ranks received this epoch), batch_size,
        world_size, consumers, shuffle, drop_last, shuffle_buffer}: one state resumes every rank."""
        return self._engine_state()

    def stats(self):
        """samples, batches, skipped_samples, skipped_shards, skip_messages (the first 64), samples_read,
        samples_passed (skipped in the stream unread), shards_opened, bytes_read, images_decoded,
        decode_seconds. Samples left out because a member parsed in Python (.npy, .json, .txt,
        .pth) could not be parsed count in skipped_samples and their messages in skip_messages."""
        st = self._native.stats()
        st["skipped_samples"] += len(self._parse_skips)
        st["skip_messages"] = (list(st["skip_messages"]) + self._parse_skips)[:64]
        return st
