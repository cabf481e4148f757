"""FP8BlockLinear: a Linear layer over FP8 codes and block scales, and how its product is computed.

Two paths, chosen per device from torch's own rules and a one-time probe:

- ``"blockwise"``: one ``scaled_mm`` call per layer and forward. The activations are quantized
  per token and per 128 input columns (torch's ``BlockWise1x128``), the weight keeps its 128x128
  block scales (``BlockWise128x128``), accumulation is in the GEMM. Torch accepts this pair only
  on CUDA devices of compute capability 9.0 with CUDA 12.9 or newer (cuBLASLt's block scaling; see
  the sample inputs of ``scaled_mm`` in torch's OpInfo tests), for K and N multiples of 128. The
  probe runs one small product and compares it with the dequantized reference, so a torch build
  that refuses the call, or misreads the scale layout, is detected before any layer uses it.
- ``"dequant"``: the weight is dequantized once into the activations' dtype and cached, then
  ``F.linear`` runs. Used on CPU, on GPUs or builds without block-scaled FP8 GEMM, and for layers
  whose shape the GEMM does not take (ragged edges, other block sizes).

``gemm_path()`` says which path a device gets and why; ``fp8_gpu_available()`` is its yes/no
form; ``gpu_self_check()`` measures the chosen path on the current GPU.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vlafeed.quant.blockfp8 import (FP8_DTYPE, FP8_MAX, Block, QuantError, block_shape, dequantize_weight,
                                    quantize_weight)

BLOCKWISE = "blockwise"
DEQUANT = "dequant"
MIN_CUDA_FOR_BLOCKWISE = (12, 9)

_probe_cache: Dict[str, Tuple[bool, str, Optional[str]]] = {}


def _version_tuple(v: Optional[str]) -> Optional[Tuple[int, int]]:
    if not v:
        return None
    parts = v.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _scaled_mm_apis() -> list:
    """The block-scaled GEMM entry points this torch has, best first."""
    apis = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        apis.append("F.scaled_mm")
    if hasattr(torch, "_scaled_mm"):
        apis.append("torch._scaled_mm")
    return apis


def device_facts(device=None) -> dict:
    """What the path choice depends on: CUDA present, ROCm or not, compute capability, the CUDA version
    torch was built with, and the scaled-GEMM entry points."""
    facts = {"cuda": bool(torch.cuda.is_available()), "hip": bool(getattr(torch.version, "hip", None)),
             "capability": None, "cuda_version": _version_tuple(getattr(torch.version, "cuda", None)),
             "apis": _scaled_mm_apis(), "device": None}
    if facts["cuda"]:
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        facts["capability"] = tuple(torch.cuda.get_device_capability(dev))
        facts["device"] = str(dev)
    return facts


def select_gemm_path(facts: dict, probe: Callable[[], Tuple[bool, str]]) -> Tuple[str, str]:
    """(path, reason) from `facts` (as device_facts returns) and `probe` (called only when every static
    check passes; returns (accepted, why not)). The static checks are torch's conditions for
    BlockWise1x128 x BlockWise128x128 scaled_mm: CUDA (not ROCm), capability 9.x, CUDA >= 12.9."""
    if not facts.get("cuda"):
        return DEQUANT, "no CUDA device: FP8 weights are dequantized for F.linear"
    if facts.get("hip"):
        return DEQUANT, "ROCm build: torch's 128x128 block-scaled FP8 GEMM is CUDA-only here"
    cap = facts.get("capability")
    if cap is None or cap[0] != 9:
        what = "?" if cap is None else f"{cap[0]}.{cap[1]}"
        return DEQUANT, (f"compute capability {what}: torch's block-scaled FP8 GEMM (1x128 activations x "
                         f"128x128 weights) runs on SM 9.0 only (SM 8.9 has no block scaling, SM 10.x+ uses MX "
                         f"formats)")
    cv = facts.get("cuda_version")
    if cv is None or tuple(cv) < MIN_CUDA_FOR_BLOCKWISE:
        have = "none" if cv is None else f"{cv[0]}.{cv[1]}"
        return DEQUANT, (f"torch built with CUDA {have}: block-scaled FP8 GEMM needs cuBLASLt from CUDA "
                         f"{MIN_CUDA_FOR_BLOCKWISE[0]}.{MIN_CUDA_FOR_BLOCKWISE[1]} or newer")
    if not facts.get("apis"):
        return DEQUANT, "this torch has neither torch.nn.functional.scaled_mm nor torch._scaled_mm"
    ok, why = probe()
    if not ok:
        return DEQUANT, f"the block-scaled FP8 GEMM probe failed: {why}"
    return BLOCKWISE, ""


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def _quantize_activations(x2: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 codes [M, K], float32 scales [M, K/128] laid out M-major, stride (1, M))."""
    M, K = x2.shape
    xg = x2.float().reshape(M, K // 128, 128)
    s = xg.abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX
    a = (xg / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(M, K)
    return a, s.t().contiguous().t()


def _blockwise_mm(x2: torch.Tensor, codes: torch.Tensor, scale_inv: torch.Tensor, api: str) -> torch.Tensor:
    """x2 [M, K] @ (codes * scale_inv)^T -> [M, N] in bfloat16, one scaled GEMM. K, N multiples of 128."""
    M, K = x2.shape
    a, sa = _quantize_activations(x2)
    b = codes.t()  # [K, N], column-major as scaled_mm wants its second operand
    if api == "F.scaled_mm":
        ST = F.ScalingType
        # weight scales [ceil(N/128), ceil(K/128)] -> [L4, N/128] with stride (1, L4), L4 = K/128 rounded up to 4
        L4 = _round_up(K // 128, 4)
        sb = F.pad(scale_inv.float(), (0, L4 - scale_inv.shape[1])).contiguous().t()
        return F.scaled_mm(a, b, sa, ST.BlockWise1x128, sb, ST.BlockWise128x128, output_dtype=torch.bfloat16)
    # the older entry point infers the recipe from the scale shapes: [M, K/128] and [K/128, N/128]
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=scale_inv.float().t().contiguous(), out_dtype=torch.bfloat16)


def _run_probe(device: str) -> Tuple[bool, str, Optional[str]]:
    """One small block-scaled product per entry point, checked against the dequantized reference."""
    errors = []
    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(256, 512, generator=g)
    w[:128, :128] *= 50.0  # blocks of different scale, so a misread scale layout shows
    codes, scale = quantize_weight(w, 128, "probe")
    x = torch.randn(32, 512, generator=g)
    ref = F.linear(x, dequantize_weight(codes, scale, 128))
    codes, scale, x = codes.to(device), scale.to(device), x.to(device, torch.bfloat16)
    for api in device_facts(device)["apis"]:
        try:
            got = _blockwise_mm(x, codes, scale, api).float().cpu()
        except Exception as e:  # torch raises RuntimeError / ValueError / NotImplementedError here
            errors.append(f"{api}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        rel = float((got - ref).norm() / ref.norm())
        if rel < 0.05:
            return True, "", api
        errors.append(f"{api}: ran but its result is off by {rel:.3f} (relative) from the dequantized product")
    return False, "; ".join(errors) or "no entry point", None


def _probe(device: str) -> Tuple[bool, str]:
    if device not in _probe_cache:
        _probe_cache[device] = _run_probe(device)
    ok, why, _ = _probe_cache[device]
    return ok, why


def _probe_api(device: str) -> Optional[str]:
    return _probe_cache.get(device, (False, "", None))[2]


def gemm_path(device=None) -> Tuple[str, str]:
    """("blockwise" or "dequant", why not blockwise) for `device` (default: the current CUDA device)."""
    facts = device_facts(device)
    return select_gemm_path(facts, lambda: _probe(facts["device"]))


def fp8_gpu_available(device=None) -> Tuple[bool, str]:
    """(True, "") when FP8BlockLinear runs its block-scaled FP8 GEMM on this device, else (False, why not)."""
    path, why = gemm_path(device)
    return path == BLOCKWISE, why


class FP8BlockLinear(nn.Module):
    """A drop-in nn.Linear whose weight is held as FP8 codes with block scales.

    Buffers: `weight_codes` (float8_e4m3fn, [out, in]) and `weight_scale` (float32, one value per
    block; W ~= codes * scale spread over its block, the same numbers a checkpoint stores as
    `weight_scale_inv`). The forward takes one of two paths (module docstring): one block-scaled FP8
    GEMM on devices where torch accepts it, else the weight dequantized once into the input's dtype
    (cached until the codes change or the device/dtype does) and `F.linear`. `last_path` records the
    path of the latest forward and `path_reason` why the GEMM was not used. `.weight` gives the
    dequantized weight, so code reading it (nn.MultiheadAttention's out_proj) keeps working."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, block: Block = 128,
                 device=None, bias_dtype=torch.float32, cache_dequantized: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        br, bc = block_shape((out_features, in_features), block)
        self.block = (br, bc)
        R, C = -(-out_features // br), -(-in_features // bc)
        self.register_buffer("weight_codes", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        self.register_buffer("weight_scale", torch.zeros(R, C, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None
        self.cache_dequantized = cache_dequantized
        self._cache: Optional[Tuple[torch.dtype, torch.device, int, torch.Tensor]] = None
        self.last_path: Optional[str] = None
        self.path_reason = ""

    @classmethod
    def from_linear(cls, linear: nn.Linear, block: Block = 128, name: str = "linear") -> "FP8BlockLinear":
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, block,
                device=linear.weight.device, bias_dtype=linear.weight.dtype)
        codes, scale = quantize_weight(linear.weight, m.block, name)
        m.weight_codes.copy_(codes)
        m.weight_scale.copy_(scale)
        if linear.bias is not None:
            m.bias.data.copy_(linear.bias.detach())
        return m

    def load_quantized(self, codes: torch.Tensor, scale: torch.Tensor, name: str = "linear") -> None:
        if tuple(codes.shape) != tuple(self.weight_codes.shape) or tuple(scale.shape) != tuple(self.weight_scale.shape):
            raise QuantError(f"layer '{name}': checkpoint codes {list(codes.shape)} / scales {list(scale.shape)} do "
                             f"not match the model's {list(self.weight_codes.shape)} / {list(self.weight_scale.shape)}")
        self.weight_codes.copy_(codes.to(FP8_DTYPE))
        self.weight_scale.copy_(scale.float())
        self._cache = None

    @property
    def weight(self) -> torch.Tensor:
        dtype = self.bias.dtype if self.bias is not None else torch.float32
        return dequantize_weight(self.weight_codes, self.weight_scale, self.block, dtype)

    def blockwise_shape_ok(self) -> bool:
        """Whether this layer's shape and block fit the block-scaled GEMM (128x128 blocks, K and N multiples
        of 128)."""
        return self.block == (128, 128) and self.in_features % 128 == 0 and self.out_features % 128 == 0

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as `dtype` on the codes' device; cached (one copy) when `cache_dequantized`."""
        # the codes' version counter changes on any in-place write, so a stale cache is never used
        stamp = self.weight_codes._version + self.weight_scale._version
        c = self._cache
        if c is not None and c[0] == dtype and c[1] == self.weight_codes.device and c[2] == stamp:
            return c[3]
        w = dequantize_weight(self.weight_codes, self.weight_scale, self.block, dtype)
        self._cache = (dtype, self.weight_codes.device, stamp, w) if self.cache_dequantized else None
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            path, why = gemm_path(x.device)
            if path == BLOCKWISE and not self.blockwise_shape_ok():
                path, why = DEQUANT, (f"layer shape [{self.out_features}, {self.in_features}] with block "
                                      f"{self.block} does not fit the 128x128 block-scaled GEMM")
            if path == BLOCKWISE:
                try:
                    out = self._forward_blockwise(x)
                    self.last_path, self.path_reason = BLOCKWISE, ""
                    return out
                except RuntimeError as e:  # pragma: no cover - only on a GPU that passed the probe
                    why = f"block-scaled GEMM refused this input: {str(e).splitlines()[0] if str(e) else e}"
            self.path_reason = why
        else:
            self.path_reason = "input on CPU"
        self.last_path = DEQUANT
        w = self.dequantized_weight(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def _forward_blockwise(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - needs an SM 9.0 GPU
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        api = _probe_api(str(x.device)) or "F.scaled_mm"
        out = _blockwise_mm(x2.contiguous(), self.weight_codes, self.weight_scale, api)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, block={self.block}")


def gpu_self_check(m: int = 256, k: int = 4096, n: int = 4096, iters: int = 20, device=None) -> dict:
    """Run one FP8BlockLinear of shape [n, k] on `m` tokens on the GPU and report: the path chosen and why,
    its relative error against F.linear with the dequantized weight in bf16 and against the original
    bf16 weight, and the time per GEMM of the chosen path and of a plain bf16 F.linear. Without CUDA:
    {"skipped": reason}."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    path, why = gemm_path(dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    lin = nn.Linear(k, n, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.02)
    lin = lin.to(dev, torch.bfloat16)
    q = FP8BlockLinear.from_linear(lin, 128, "self_check").to(dev)
    x = torch.randn(m, k, generator=g).to(dev, torch.bfloat16)
    with torch.no_grad():
        got = q(x).float()
        ref_dq = F.linear(x, q.dequantized_weight(torch.bfloat16)).float()
        ref_bf16 = lin(x).float()

    def timed(fn) -> float:
        with torch.no_grad():
            for _ in range(3):
                fn()
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) / iters * 1e3

    facts = device_facts(dev)
    return {"device": torch.cuda.get_device_name(dev), "capability": list(facts["capability"]),
            "torch": torch.__version__, "cuda": torch.version.cuda, "path": q.last_path, "device_path": path,
            "reason": q.path_reason or why, "api": _probe_api(str(dev)), "shape_mkn": [m, k, n],
            "rel_error_vs_dequantized_bf16": float((got - ref_dq).norm() / ref_dq.norm()),
            "rel_error_vs_bf16_weight": float((got - ref_bf16).norm() / ref_bf16.norm()),
            "ms_per_gemm": timed(lambda: q(x)), "ms_per_gemm_bf16": timed(lambda: lin(x))}
