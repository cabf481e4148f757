"""Hugging Face model folders in and out: the DeepSeek-V3 / FineGrainedFP8 block-FP8 layout, streamed.

Input: a model folder (``config.json`` plus ``model.safetensors``, or shards listed by
``model.safetensors.index.json``, or ``pytorch_model.bin`` / its index, read with
``torch.load(weights_only=True, mmap=True)``). Output: a folder that vLLM, SGLang, TensorRT-LLM and
transformers load as ``quant_method: fp8``:

- each quantized linear weight ``<m>.weight`` as ``float8_e4m3fn`` codes with ``<m>.weight_scale_inv``
  beside it, float32, one value per 128x128 block on a ceil(out/128) x ceil(in/128) grid; the weight
  is ``codes * weight_scale_inv`` spread over each block (the edge blocks of a ragged shape cover only
  their real rows and columns, and their scale comes from those alone);
- every other tensor unchanged (or cast with ``rest_dtype``);
- shards of at most ``max_shard_size`` bytes (``model-0000i-of-0000n.safetensors`` and
  ``model.safetensors.index.json``; a single ``model.safetensors`` when one shard is enough);
- ``config.json`` with ``quantization_config`` = ``{"quant_method": "fp8", "weight_block_size": [128, 128],
  "activation_scheme": "dynamic", "modules_to_not_convert": [...]}``, where the list names every module
  whose weight stays in high precision (vision tower, lm_head, embeddings, norms, user skips), as
  module paths of the checkpoint;
- the folder's other files (tokenizer, processor, generation config, chat template) copied, and
  ``vlafeed_quant.json``, the summary.

Memory: tensors are read, quantized and written one row band at a time (at most ~16M elements,
a multiple of the block height), each output shard's layout is planned from the input headers
first and the bytes are written at their offsets, so the peak is a few bands, not a shard or the
checkpoint. The output folder appears only when complete (written under a temporary name, then
renamed).
"""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from vlafeed.quant.blockfp8 import (DEFAULT_SKIP, FORMAT, FP8_DTYPE, LEGACY_FORMAT, LEGACY_SCALE_SUFFIX, QuantError,
                                    block_shape, dequantize_weight, quantize_weight)
from vlafeed.quant.checkpoint import not_a_checkpoint, state_dict_in
from vlafeed.quant.layers import decide, is_linear_weight, layer_path, matching_pattern, scale_key

ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
             "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
             "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
SUMMARY_NAME = "vlafeed_quant.json"
BAND_ELEMENTS = 16 * 1024 * 1024


def parse_size(s) -> int:
    """Bytes from an int or a string such as "5GB" (10^9, as Hugging Face counts), "500MiB", "2000000"."""
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", str(s), re.IGNORECASE)
    if not m:
        raise QuantError(f"cannot read size {s!r} (examples: 5GB, 500MB, 2GiB, 1000000)")
    num, unit = float(m.group(1)), m.group(2).upper()
    if unit in ("", "B"):
        mult = 1
    else:
        base = 1024 if "I" in unit else 1000
        mult = base ** ("KMGT".index(unit[0]) + 1)
    n = int(num * mult)
    if n < 1:
        raise QuantError(f"size {s!r} must be at least 1 byte")
    return n


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------------------------------------- reading

class Source:
    """The tensors of a checkpoint folder or file, read one tensor (or row band) at a time.

    `entries` maps each tensor name to (file, shape, dtype) from the headers alone; `read(name, lo, hi)`
    returns rows lo:hi of one tensor. Safetensors files are opened per read, so no mapping of a whole
    shard stays resident; torch files are loaded memory-mapped with weights_only=True."""

    def __init__(self, path):
        self.path = Path(path)
        self.entries: Dict[str, Tuple[Path, Tuple[int, ...], torch.dtype]] = {}
        self.files: List[Path] = []
        self.metadata: Dict[Path, dict] = {}
        self.kind = ""
        self._torch: Dict[Path, dict] = {}
        if self.path.is_dir():
            self._open_folder()
        elif self.path.is_file():
            self._open_file(self.path)
        else:
            raise QuantError(f"{self.path}: no such file or folder")

    def _open_folder(self) -> None:
        p = self.path
        for index_name, kind in (("model.safetensors.index.json", "safetensors"),
                                 ("pytorch_model.bin.index.json", "torch")):
            if (p / index_name).is_file():
                try:
                    weight_map = json.loads((p / index_name).read_text())["weight_map"]
                except (ValueError, KeyError, TypeError) as e:
                    raise QuantError(f"{p / index_name}: not a shard index ({type(e).__name__}: {e})") from None
                names = sorted(set(weight_map.values()))
                for n in names:
                    if not (p / n).is_file():
                        raise QuantError(f"{p / index_name}: lists shard '{n}', which is not in the folder")
                self.kind = kind + " shards"
                for n in names:
                    self._open_file(p / n)
                missing = sorted(set(weight_map) - set(self.entries))
                if missing:
                    raise QuantError(f"{p / index_name}: maps '{missing[0]}' to a shard that does not hold it "
                                     f"({len(missing)} such tensors)")
                self.index_file = p / index_name
                return
        singles = [p / "model.safetensors", p / "pytorch_model.bin"]
        for f in singles:
            if f.is_file():
                self.kind = "safetensors" if f.suffix == ".safetensors" else "torch"
                self._open_file(f)
                return
        found = sorted(x for x in p.glob("*.safetensors"))
        if found:
            self.kind = "safetensors files"
            for f in found:
                self._open_file(f)
            return
        raise QuantError(f"{p}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
                         f"pytorch_model.bin.index.json in this folder")

    def _open_file(self, f: Path) -> None:
        self.files.append(f)
        if f.suffix == ".safetensors":
            from safetensors import safe_open
            try:
                with safe_open(str(f), framework="pt") as h:
                    self.metadata[f] = h.metadata() or {}
                    for k in h.keys():
                        sl = h.get_slice(k)
                        dt = ST_DTYPES.get(sl.get_dtype())
                        if dt is None:
                            raise QuantError(f"{f}: tensor '{k}' has dtype {sl.get_dtype()}, which this tool "
                                             f"does not handle")
                        self._add(k, f, tuple(sl.get_shape()), dt)
            except QuantError:
                raise
            except Exception as e:  # safetensors raises its own error types
                raise QuantError(f"{f}: not a readable safetensors file ({e})") from None
            self.kind = self.kind or "safetensors"
            return
        try:
            obj = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:
            try:  # the legacy (non-zip) serialization cannot be memory-mapped
                obj = torch.load(str(f), map_location="cpu", weights_only=True)
            except Exception as e:
                raise not_a_checkpoint(f, e) from None
        except Exception as e:
            raise not_a_checkpoint(f, e) from None
        sd = state_dict_in(obj, f)
        for k, v in sd.items():
            if v.dtype not in ST_NAMES:
                raise QuantError(f"{f}: tensor '{k}' has dtype {v.dtype}, which this tool does not handle")
            self._add(k, f, tuple(v.shape), v.dtype)
        self._torch[f] = sd
        self.metadata[f] = {}
        self.kind = self.kind or "torch"

    def _add(self, k: str, f: Path, shape, dtype) -> None:
        if k in self.entries:
            raise QuantError(f"tensor '{k}' is in both {self.entries[k][0].name} and {f.name}")
        self.entries[k] = (f, shape, dtype)

    def read(self, key: str, lo: Optional[int] = None, hi: Optional[int] = None) -> torch.Tensor:
        """Tensor `key` (rows lo:hi when given), as stored."""
        f, shape, _ = self.entries[key]
        if f in self._torch:
            t = self._torch[f][key]
            t = t if lo is None else t[lo:hi]
            return t.detach().contiguous().clone()
        from safetensors import safe_open
        with safe_open(str(f), framework="pt") as h:
            if lo is None or len(shape) == 0:
                return h.get_tensor(key)
            return h.get_slice(key)[lo:hi]

    def close(self) -> None:
        self._torch.clear()


# ---------------------------------------------------------------------------------------------- writing

@dataclass
class _Out:
    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


@dataclass
class _Item:
    """One input tensor and what it becomes."""
    key: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    quantize: bool
    block: Tuple[int, int] = (0, 0)
    out_dtype: Optional[torch.dtype] = None
    outs: List[_Out] = field(default_factory=list)

    @property
    def out_bytes(self) -> int:
        return sum(o.nbytes for o in self.outs)


class _ShardFile:
    """A safetensors file whose layout is fixed up front; tensor bytes are written at their offsets."""

    def __init__(self, path: Path, outs: List[_Out], metadata: dict):
        # same order as safetensors' own writer: larger alignment first, then by name
        order = sorted(outs, key=lambda o: (-torch.empty((), dtype=o.dtype).element_size(), o.name))
        pos = 0
        header = {"__metadata__": metadata}
        for o in order:
            o.offset = pos
            header[o.name] = {"dtype": ST_NAMES[o.dtype], "shape": list(o.shape), "data_offsets": [pos, pos + o.nbytes]}
            pos += o.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.data_start = 8 + len(raw)
        self.size = self.data_start + pos
        self.f = open(path, "wb")
        self.f.write(len(raw).to_bytes(8, "little"))
        self.f.write(raw)
        self.f.truncate(self.size)

    def write(self, out: _Out, byte_offset: int, t: torch.Tensor) -> None:
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        if byte_offset + data.nbytes > out.nbytes:
            raise AssertionError(f"write past the end of '{out.name}'")
        self.f.seek(self.data_start + out.offset + byte_offset)
        self.f.write(memoryview(data))

    def close(self) -> None:
        self.f.close()


def _band_rows(shape: Sequence[int], br: int) -> int:
    cols = 1
    for d in shape[1:]:
        cols *= int(d)
    rows = max(1, BAND_ELEMENTS // max(1, cols))
    return max(br, rows // br * br) if br > 1 else rows


class _ErrorAcc:
    """Per-block relative errors of one weight, accumulated band by band."""

    def __init__(self):
        self.max_rel, self.sum_rel, self.n_blocks, self.num2, self.den2 = 0.0, 0.0, 0, 0.0, 0.0

    def add(self, w: torch.Tensor, dq: torch.Tensor, br: int, bc: int) -> None:
        from vlafeed.quant.blockfp8 import _blocked
        w32 = w.float()
        d = _blocked(w32 - dq, br, bc).pow(2).sum(dim=(1, 3))
        n = _blocked(w32, br, bc).pow(2).sum(dim=(1, 3))
        rel = torch.where(n > 0, (d / torch.where(n > 0, n, torch.ones_like(n))).sqrt(), torch.zeros_like(n))
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.sum_rel += float(rel.sum())
        self.n_blocks += rel.numel()
        self.num2 += float(d.sum())
        self.den2 += float(n.sum())

    def result(self) -> dict:
        return {"max_rel_error": self.max_rel, "mean_rel_error": self.sum_rel / max(1, self.n_blocks),
                "matrix_rel_error": (self.num2 / self.den2) ** 0.5 if self.den2 > 0 else 0.0}


def _peak_rss() -> int:
    """Peak resident set size of this process, bytes: VmHWM where /proc has it (ru_maxrss on Linux also
    counts a parent's peak carried over across fork + exec), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _legacy_layout(src: Source) -> bool:
    return bool(src.metadata) and all(m.get("format") == LEGACY_FORMAT for m in src.metadata.values())


def plan(src: Source, block: int = 128, skip: Sequence[str] = (), only: Sequence[str] = (),
         default_skip: bool = True, rest_dtype: Optional[torch.dtype] = None,
         skip_ragged: bool = False) -> Tuple[List[_Item], dict]:
    """What each input tensor becomes, and the decisions (quantized / skipped with the deciding pattern)."""
    patterns = list(skip) + (list(DEFAULT_SKIP) if default_skip else [])
    fp8 = [k for k, (_, _, dt) in src.entries.items() if dt in (FP8_DTYPE, torch.float8_e5m2)]
    if fp8:
        raise QuantError(f"{src.path}: already holds FP8 tensors ('{fp8[0]}' and {len(fp8) - 1} more); "
                         f"quantize the original high-precision checkpoint instead")
    items, skipped = [], {}
    hits = {p: 0 for p in skip}
    only_hits = {p: 0 for p in only}
    for key in sorted(src.entries, key=lambda k: (src.files.index(src.entries[k][0]), k)):
        _, shape, dtype = src.entries[key]
        q = False
        if is_linear_weight(key, shape, dtype):
            path = layer_path(key)
            for p in only:
                if matching_pattern(path, [p]):
                    only_hits[p] += 1
            q, why = decide(path, patterns, only)
            if q and skip_ragged and (shape[0] % block or shape[1] % block):
                q, why = False, "--skip-ragged"
            if not q:
                if why in hits:
                    hits[why] += 1
                skipped[key] = {"pattern": why, "default": why not in hits and why not in ("--only", "--skip-ragged"),
                                "shape": list(shape)}
        it = _Item(key, shape, dtype, q)
        if q:
            it.block = block_shape(shape, block)
            R, C = -(-shape[0] // it.block[0]), -(-shape[1] // it.block[1])
            it.outs = [_Out(key, FP8_DTYPE, shape), _Out(scale_key(key), torch.float32, (R, C))]
        else:
            it.out_dtype = rest_dtype if (rest_dtype is not None and dtype.is_floating_point) else dtype
            it.outs = [_Out(key, it.out_dtype, shape)]
        items.append(it)
    return items, {"skipped": skipped, "unmatched_skip": [p for p, n in hits.items() if n == 0],
                   "unmatched_only": [p for p, n in only_hits.items() if n == 0]}


def _shard(items: List[_Item], max_bytes: int) -> List[List[_Item]]:
    shards: List[List[_Item]] = [[]]
    size = 0
    for it in items:
        if shards[-1] and size + it.out_bytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += it.out_bytes
    return shards


def _write_item(src: Source, it: _Item, sf: _ShardFile, errors: Dict[str, dict]) -> None:
    shape = it.shape
    if not it.quantize:
        out = it.outs[0]
        if len(shape) == 0 or shape[0] == 0:
            sf.write(out, 0, src.read(it.key).to(it.out_dtype))
            return
        step = _band_rows(shape, 1)
        row_bytes = out.nbytes // shape[0]
        for lo in range(0, shape[0], step):
            hi = min(shape[0], lo + step)
            sf.write(out, lo * row_bytes, src.read(it.key, lo, hi).to(it.out_dtype))
        return
    br, bc = it.block
    codes_out, scale_out = it.outs
    cols, C = shape[1], scale_out.shape[1]
    acc = _ErrorAcc()
    step = _band_rows(shape, br)
    for lo in range(0, shape[0], step):
        hi = min(shape[0], lo + step)
        w = src.read(it.key, lo, hi)
        codes, scale = quantize_weight(w, (br, bc), it.key)
        acc.add(w, dequantize_weight(codes, scale, (br, bc)), br, bc)
        sf.write(codes_out, lo * cols, codes)
        sf.write(scale_out, (lo // br) * C * 4, scale)
        del w, codes, scale
    errors[it.key] = {"shape": list(shape), "dtype": str(it.dtype).replace("torch.", ""),
                      "scale_shape": list(scale_out.shape), "block": [br, bc],
                      "bytes_before": _nbytes(shape, it.dtype), "bytes_after": it.out_bytes, **acc.result()}


def modules_not_converted(items: Iterable[_Item]) -> List[str]:
    """Module paths of every weight left in high precision (linear layers kept, embeddings, norms, convs).

    `lm_head` is listed whenever it is not quantized, also when the checkpoint has no `lm_head.weight`
    (tied to the embeddings): a loader would otherwise turn the module into an FP8 layer and tie a
    bf16 table into it."""
    items = list(items)
    mods = set()
    for it in items:
        if not it.quantize and it.dtype.is_floating_point and (it.key.endswith(".weight") or
                                                               it.key.endswith("in_proj_weight")):
            mods.add(layer_path(it.key))
    if not any(it.quantize and layer_path(it.key) == "lm_head" for it in items):
        mods.add("lm_head")
    return sorted(mods)


def quantization_config(block: int, not_converted: List[str]) -> dict:
    return {"quant_method": "fp8", "weight_block_size": [block, block], "activation_scheme": "dynamic",
            "fmt": "e4m3", "modules_to_not_convert": not_converted}


def _copy_other_files(src_dir: Path, dst_dir: Path, weight_files: Iterable[Path]) -> List[str]:
    skip = {Path(f).resolve() for f in weight_files}
    copied = []
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            f = Path(root) / name
            rel = f.relative_to(src_dir)
            if name.startswith(".") or f.resolve() in skip or name == "config.json" and rel.parent == Path("."):
                continue
            if name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json") or name == SUMMARY_NAME:
                continue
            (dst_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst_dir / rel)
            copied.append(str(rel))
    return copied


def _prepare_out(out_dir: Path, overwrite: bool) -> Path:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise QuantError(f"{out_dir}: exists and is not a folder")
        if any(out_dir.iterdir()) and not overwrite:
            raise QuantError(f"{out_dir}: folder exists and is not empty (pass --overwrite to replace it)")
    tmp = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _finish_out(tmp: Path, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def quantize_folder(src_dir, out_dir, block: int = 128, skip: Sequence[str] = (), only: Sequence[str] = (),
                    default_skip: bool = True, max_shard_size="5GB", rest_dtype: Optional[torch.dtype] = None,
                    overwrite: bool = False, after_write=None, skip_ragged: bool = False) -> dict:
    """Quantize a Hugging Face model folder into `out_dir` (module docstring). Returns the summary, also
    written to out_dir/vlafeed_quant.json. `after_write(tmp_dir, items)` runs before the folder is moved
    into place (the CLI's --eval writes its report there)."""
    t0 = time.perf_counter()
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if not src_dir.is_dir():
        raise QuantError(f"{src_dir}: not a folder")
    cfg_path = src_dir / "config.json"
    if not cfg_path.is_file():
        raise QuantError(f"{src_dir}: no config.json; a Hugging Face model folder is expected (for a single "
                         f"checkpoint file, give the file itself)")
    try:
        config = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise QuantError(f"{cfg_path}: not JSON ({e})") from None
    if isinstance(config.get("quantization_config"), dict):
        raise QuantError(f"{cfg_path}: the model is already quantized (quant_method "
                         f"{config['quantization_config'].get('quant_method')!r}); start from the original")
    if src_dir.resolve() == out_dir.resolve():
        raise QuantError(f"{out_dir}: the output folder must differ from the input folder")
    max_bytes = parse_size(max_shard_size)
    src = Source(src_dir)
    try:
        if _legacy_layout(src):
            raise QuantError(f"{src_dir}: holds a file in vlafeed's old private FP8 layout (header format "
                             f"'{LEGACY_FORMAT}', scales under '<layer>.weight{LEGACY_SCALE_SUFFIX}'); convert that "
                             f"file with `vlafeed quantize OLD.safetensors NEW.safetensors`, or quantize the "
                             f"original checkpoint")
        items, decisions = plan(src, block, skip, only, default_skip, rest_dtype, skip_ragged)
        if not any(it.quantize for it in items):
            raise QuantError(f"{src_dir}: no linear weight left to quantize ({len(decisions['skipped'])} skipped)")
        shards = _shard(items, max_bytes)
        n = len(shards)
        names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        tmp = _prepare_out(out_dir, overwrite)
        try:
            errors: Dict[str, dict] = {}
            weight_map = {}
            total = 0
            meta = {"format": "pt", "vlafeed_format": FORMAT}
            for name, shard in zip(names, shards):
                outs = [o for it in shard for o in it.outs]
                sf = _ShardFile(tmp / name, outs, meta)
                try:
                    for it in shard:
                        _write_item(src, it, sf, errors)
                finally:
                    sf.close()
                for o in outs:
                    weight_map[o.name] = name
                    total += o.nbytes
            if n > 1:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
            not_conv = modules_not_converted(items)
            qcfg = quantization_config(block, not_conv)
            config["quantization_config"] = qcfg
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            copied = _copy_other_files(src_dir, tmp, src.files + [getattr(src, "index_file", src_dir / "none")])
            before = sum(_nbytes(it.shape, it.dtype) for it in items)
            after = sum(it.out_bytes for it in items)
            bf16_before = sum(_nbytes(it.shape, torch.bfloat16 if it.dtype.is_floating_point else it.dtype)
                              for it in items)
            ragged = sorted(k for k, v in errors.items()
                            if v["shape"][0] % v["block"][0] or v["shape"][1] % v["block"][1])
            means = [v["mean_rel_error"] for v in errors.values()]
            summary = {
                "format": "huggingface fp8 (DeepSeek-V3 block layout)", "source": str(src_dir),
                "source_kind": src.kind, "output": str(out_dir), "block": [block, block],
                "fp8_dtype": "float8_e4m3fn", "scale_rule": "weight_scale_inv = amax(|block|)/448, float32",
                "layers_quantized": len(errors), "layers_skipped": len(decisions["skipped"]),
                "tensors_total": len(items), "bytes_before": before, "bytes_after": after,
                "size_ratio": after / before if before else 1.0, "bytes_before_as_bf16": bf16_before,
                "size_ratio_vs_bf16": after / bf16_before if bf16_before else 1.0,
                "max_rel_error": max((v["max_rel_error"] for v in errors.values()), default=0.0),
                "mean_rel_error": sum(means) / len(means) if means else 0.0,
                "rest_dtype": "keep" if rest_dtype is None else str(rest_dtype).replace("torch.", ""),
                "skip_patterns": list(skip), "only_patterns": list(only),
                "default_skip": list(DEFAULT_SKIP) if default_skip else [],
                "unmatched_skip_patterns": decisions["unmatched_skip"],
                "unmatched_only_patterns": decisions["unmatched_only"],
                "ragged_layers": ragged, "shards": names, "max_shard_size": max_bytes,
                "quantization_config": qcfg, "copied_files": copied,
                "quantized": errors, "skipped": decisions["skipped"],
            }
            if after_write is not None:
                after_write(tmp, items, summary)
            summary["seconds"] = time.perf_counter() - t0
            summary["peak_rss_bytes"] = _peak_rss()
            (tmp / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
            _finish_out(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        src.close()
    return summary


# ---------------------------------------------------------------------------------------------- loading back

def read_quantized_folder(path) -> Tuple[dict, dict, Dict[str, Tuple[int, int]]]:
    """(tensors, quantization_config, {quantized weight: block}) of a block-FP8 folder in the format above
    (written by vlafeed or any DeepSeek-V3-style checkpoint). Loads every tensor: meant for small models
    and tests; serving stacks read the folder themselves."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise QuantError(f"{path}: no config.json")
    qcfg = json.loads(cfg_path.read_text()).get("quantization_config")
    if not isinstance(qcfg, dict) or qcfg.get("quant_method") != "fp8":
        raise QuantError(f"{cfg_path}: no quantization_config with quant_method 'fp8'")
    bs = qcfg.get("weight_block_size")
    if not (isinstance(bs, list) and len(bs) == 2):
        raise QuantError(f"{cfg_path}: weight_block_size {bs!r} is not [rows, cols]")
    src = Source(path)
    tensors = {k: src.read(k) for k in src.entries}
    src.close()
    quantized = {}
    for k, t in tensors.items():
        if t.dtype == FP8_DTYPE:
            sk = scale_key(k)
            if sk not in tensors:
                raise QuantError(f"{path}: FP8 weight '{k}' has no '{sk}' beside it")
            blk = (int(bs[0]), int(bs[1]))
            R, C = tensors[sk].shape
            if (R, C) != (-(-t.shape[0] // blk[0]), -(-t.shape[1] // blk[1])):
                raise QuantError(f"{path}: '{sk}' {[R, C]} does not fit weight {list(t.shape)} with block {list(blk)}")
            quantized[k] = blk
    return tensors, qcfg, quantized
