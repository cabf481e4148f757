"""The example VLA policy: images, instruction tokens and state in, an
action chunk out, over variable-length token sequences.

Per sample: instruction tokens (embedding), image patch tokens of each kept
camera (a patch-embedding ImageEncoder, plus a camera embedding), one state
token (MLP), and `chunk` learned action queries; learned position
embeddings indexed by the position inside the sample. A stack of
TransformerBlocks (each an FSDPBlock, so FSDP2 shards them one by one)
attends within each sample only, whatever the layout: padded rows, or
packed rows where several samples share a row. An action head reads the
query tokens; a 0-dim learned scale (kept out of FSDP sharding) scales the
output.

Attention backends (model.attention): "flash" runs flash_attn_varlen_func on
the unpadded concatenation with cu_seqlens (GPU with flash-attn installed);
"flex" runs torch's flex_attention with a document mask, compiled
(torch.compile) on CUDA; training refuses it on CPU, where PyTorch has no
FlexAttention backward; "sdpa" runs
scaled_dot_product_attention with a block-diagonal boolean mask built from
each slot's sample id; "auto" picks flash when available on a GPU, else
sdpa.
"""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F

from vlafeed.train.packing import Layout
from vlafeed.train.parallel import FSDPBlock


def flash_available(device) -> bool:
    if torch.device(device).type != "cuda":
        return False
    try:
        import flash_attn  # noqa: F401
        return True
    except ImportError:
        return False


def resolve_attention(kind: str, device) -> str:
    if kind == "auto":
        return "flash" if flash_available(device) else "sdpa"
    if kind == "flash" and not flash_available(device):
        raise RuntimeError("model.attention is 'flash' but flash-attn is not installed or the device is not CUDA")
    if kind == "flex" and torch.device(device).type != "cuda":
        from vlafeed.train.config import ConfigError
        raise ConfigError("config key 'model.attention': flex needs a CUDA device for training (PyTorch's "
                          "FlexAttention has no backward on CPU); use sdpa (or auto) on CPU")
    return kind


_compiled_flex = None


def compiled_flex_attention():
    """flex_attention under torch.compile (fused kernels; uncompiled it materialises the full score matrix)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def attention_mask(layout: Layout) -> torch.Tensor:
    """[rows, 1, L, L] bool: slot q may attend slot k iff both belong to the same sample (or q == k for padding)."""
    d = layout.doc
    return (d[:, :, None] == d[:, None, :]).unsqueeze(1)


def attend(q, k, v, layout: Layout, kind: str, mask=None):
    """q, k, v: [rows, heads, L, head_dim] -> same shape, attention within each sample."""
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask is not None else attention_mask(layout))
    if kind == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = layout.doc

        def same_doc(b, h, qi, ki):
            return doc[b, qi] == doc[b, ki]
        bm = create_block_mask(same_doc, doc.shape[0], None, doc.shape[1], doc.shape[1], device=str(doc.device))
        if q.is_cuda:
            return compiled_flex_attention()(q, k, v, block_mask=bm)
        return flex_attention(q, k, v, block_mask=bm)  # CPU: forward only (tests, inference)
    if kind == "flash":
        from flash_attn import flash_attn_varlen_func
        rows, heads, L, hd = q.shape
        flat = lambda t: t.transpose(1, 2).reshape(rows * L, heads, hd)[layout.dest]  # noqa: E731
        out = flash_attn_varlen_func(flat(q), flat(k), flat(v), layout.cu_seqlens, layout.cu_seqlens,
                                     layout.max_seqlen, layout.max_seqlen)
        full = q.new_zeros(rows * L, heads, hd).index_copy(0, layout.dest, out.to(q.dtype))
        return full.view(rows, L, heads, hd).transpose(1, 2)
    raise ValueError(f"attention backend {kind!r}")


class TransformerBlock(FSDPBlock):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, layout: Layout, kind: str, mask=None):
        rows, L, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(rows, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = attend(q, k, v, layout, kind, mask).transpose(1, 2).reshape(rows, L, d)
        x = x + self.proj(a)
        return x + self.mlp(self.norm2(x))


class ImageEncoder(FSDPBlock):
    """[B,3,H,W] images -> [B, (H/patch)*(W/patch), d] patch tokens."""

    def __init__(self, d: int, patch: int):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.patch(x).flatten(2).transpose(1, 2))


class VLAPolicy(nn.Module):
    def __init__(self, *, num_cameras, image_hw, state_dim, action_dim, chunk, d_model=64, layers=2, heads=4,
                 patch=16, vocab_size=259, max_positions=512, attention="sdpa"):
        super().__init__()
        self.chunk, self.action_dim, self.attention = chunk, action_dim, attention
        h, w = image_hw
        if h % patch or w % patch:
            raise ValueError(f"image size {w}x{h} is not a multiple of model.patch ({patch}): "
                             f"set data.image_size to a multiple of it")
        self.tokens_per_camera = (h // patch) * (w // patch)
        self.text = nn.Embedding(vocab_size, d_model)
        self.image = ImageEncoder(d_model, patch)
        self.camera = nn.Parameter(torch.zeros(num_cameras, d_model))
        self.state = nn.Sequential(nn.Linear(state_dim, d_model), nn.SiLU(), nn.Linear(d_model, d_model))
        self.queries = nn.Parameter(torch.randn(chunk, d_model) * 0.02)
        self.position = nn.Embedding(max_positions, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, action_dim)
        self.log_scale = nn.Parameter(torch.tensor(0.0))  # 0-dim: FSDP2 leaves it unsharded

    def sequences(self, images, state, samples):
        """Per-sample token embeddings concatenated in sample order: [sum(len), d]."""
        B = state.shape[0]
        # one encoder call for every camera (an FSDP unit runs once per forward)
        encoded = self.image(torch.cat(images)).split(B)
        cam_tokens = [e + self.camera[c].to(e.dtype) for c, e in enumerate(encoded)]  # [B, P, d] each
        state_tok = self.state(state)  # [B, d]
        pieces = []
        for i in range(B):
            s = samples[i]
            ids = torch.tensor(s.text, dtype=torch.long, device=state.device)
            parts = [self.text(ids)]
            parts += [cam_tokens[c][i] for c, keep in enumerate(s.cameras) if keep]
            parts += [state_tok[i:i + 1], self.queries.to(state_tok.dtype)]
            pieces.append(torch.cat([p.to(state_tok.dtype) for p in parts]))
        return pieces

    def forward(self, images, state, samples, layout: Layout):
        """-> [B, chunk, action_dim] predictions (sample order)."""
        pieces = self.sequences(images, state, samples)
        d = pieces[0].shape[-1]
        flat = torch.cat([pieces[i] for i in layout.order.tolist()])
        x = flat.new_zeros(layout.slots, d).index_copy(0, layout.dest, flat).view(layout.rows, layout.row_len, d)
        x = x + self.position(layout.position_ids).to(x.dtype)
        mask = attention_mask(layout) if self.attention == "sdpa" else None
        for blk in self.blocks:
            x = blk(x, layout, self.attention, mask)
        out = self.norm(x).view(layout.slots, d)[layout.dest]  # [sum(len), d] in concatenation order
        # the last `chunk` tokens of each sample are its action queries
        ends = layout.cu_seqlens[1:].long()
        idx = (ends[:, None] - self.chunk + torch.arange(self.chunk, device=ends.device)[None]).reshape(-1)
        q = out[idx].view(len(pieces), self.chunk, d)
        pred_in_order = self.head(q) * torch.exp(self.log_scale).to(q.dtype)
        pred = torch.empty_like(pred_in_order)
        pred[layout.order] = pred_in_order
        return pred

    def get_fsdp_block_types(self):
        return (TransformerBlock, ImageEncoder)


def per_sample_loss(pred, target, valid):
    """L1 over action dims, masked by valid [B, chunk]: -> [B]."""
    err = F.l1_loss(pred.float(), target.float(), reduction="none").mean(dim=-1)
    return (err * valid).sum(dim=1) / valid.sum(dim=1).clamp_min(1)
