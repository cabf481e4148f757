"""Token sequences per sample and their layout in a batch: packed rows
(the C packer, src/pack/ through vlafeed._native.pack_plan) or one padded
row per sample.

A sample's sequence is ``[instruction tokens][image tokens of each kept
camera][one state token][chunk action-query tokens]``. Instruction tokens come
from a tokenizer (bytes of the UTF-8 string by default: ids 0..255 after a
BOS id; or any callable str -> list[int] the user gives, e.g. a Hugging Face
tokenizer's ``encode``), cut to max_text_tokens. Cameras may be dropped per
sample (camera_dropout): which ones is a pure function of (seed, sample
index, camera), so a resumed run drops the same ones and the packed layout
stays a function of the loader's order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from vlafeed import _native
from vlafeed._entry import import_entry

BOS, EOS, PAD = 256, 257, 258


def byte_tokenizer(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def load_tokenizer(spec: str):
    """"bytes", or "module:function" naming a callable str -> list[int]."""
    if spec == "bytes":
        return byte_tokenizer
    if ":" not in spec:
        raise ValueError(f"model.tokenizer {spec!r}: expected 'bytes' or 'module:function'")
    try:
        return import_entry(spec)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"model.tokenizer {spec!r}: {e}") from None


def kept_cameras(index: int, num_cameras: int, dropout: float, seed: int) -> list[bool]:
    """Which cameras sample `index` keeps: each dropped with probability `dropout`, at least one kept."""
    if dropout <= 0 or num_cameras <= 1:
        return [True] * num_cameras
    keep = [_uniform(f"{seed}:{index}:{c}") >= dropout for c in range(num_cameras)]
    if not any(keep):
        keep[int(_uniform(f"{seed}:{index}") * num_cameras)] = True
    return keep


def _uniform(key: str) -> float:
    """A uniform number in [0, 1) that is a pure function of key (BLAKE2b; CRC-32 of similar strings is not
    uniform enough)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") / 2**64


@dataclass
class SampleTokens:
    text: list           # instruction token ids, BOS first
    cameras: list        # kept camera flags
    length: int          # tokens in the whole sequence


def sample_tokens(tasks, indices, *, tokenizer, max_text_tokens, num_cameras, tokens_per_camera, chunk,
                  camera_dropout=0.0, seed=0):
    out = []
    for task, index in zip(tasks, indices):
        ids = [BOS] + list(tokenizer(task))[: max_text_tokens - 1]
        cams = kept_cameras(int(index), num_cameras, camera_dropout, seed)
        out.append(SampleTokens(ids, cams, len(ids) + sum(cams) * tokens_per_camera + 1 + chunk))
    return out


@dataclass
class Layout:
    """Where each sample's tokens sit in a [rows, row_len] batch.

    dest: [total_tokens] flat index (row * row_len + column) of each token of
    the concatenation (samples in `order`); doc: [rows, row_len] sample id of
    each slot, -1 - column for unused slots (each attends only to itself);
    position_ids: [rows, row_len]; cu_seqlens: [samples + 1] over the
    concatenation (for flash_attn_varlen_func); order: sample ids in
    concatenation order; max_seqlen: longest sample.
    """
    rows: int
    row_len: int
    order: torch.Tensor
    cu_seqlens: torch.Tensor
    dest: torch.Tensor
    doc: torch.Tensor
    position_ids: torch.Tensor
    max_seqlen: int
    packed: bool

    @property
    def real_tokens(self):
        return int(self.cu_seqlens[-1])

    @property
    def slots(self):
        return self.rows * self.row_len


def _layout(lengths, order, rows, row_len, sample_row, sample_offset, packed, device):
    n = len(lengths)
    cu = [0]
    for i in order:
        cu.append(cu[-1] + lengths[i])
    dest, pos = [], []
    doc = torch.empty(rows * row_len, dtype=torch.long)
    doc.copy_(-1 - torch.arange(rows * row_len) % row_len)
    posid = torch.zeros(rows * row_len, dtype=torch.long)
    for i in order:
        start = sample_row[i] * row_len + sample_offset[i]
        dest.extend(range(start, start + lengths[i]))
        doc[start:start + lengths[i]] = i
        posid[start:start + lengths[i]] = torch.arange(lengths[i])
    return Layout(rows, row_len, torch.tensor(order, dtype=torch.long, device=device),
                  torch.tensor(cu, dtype=torch.int32, device=device),
                  torch.tensor(dest, dtype=torch.long, device=device), doc.view(rows, row_len).to(device),
                  posid.view(rows, row_len).to(device), max(lengths) if n else 0, packed)


def padded_layout(lengths, device="cpu") -> Layout:
    """One row per sample, padded to the longest."""
    n = len(lengths)
    return _layout(lengths, list(range(n)), n, max(lengths), list(range(n)), [0] * n, False, device)


def packed_layout(lengths, max_tokens, window=0, device="cpu") -> Layout:
    """Rows of at most max_tokens filled by the C packer (first-fit-decreasing over `window` samples),
    as long as the fullest row."""
    plan = _native.pack_plan(list(lengths), max_tokens, window)
    row_len = max(plan["row_tokens"]) if plan["row_tokens"] else 1  # trimmed to the fullest row
    return _layout(lengths, plan["order"], len(plan["row_tokens"]), row_len, plan["sample_row"],
                   plan["sample_offset"], True, device)
