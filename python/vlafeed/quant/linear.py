"""FP8BlockLinear: a Linear layer over FP8 codes and block scales (the GPU GEMM path and its CPU fallback)."""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vlafeed.quant.blockfp8 import FP8_DTYPE, FP8_MAX, Block, QuantError, block_shape, dequantize_weight, quantize_weight


def fp8_gpu_available() -> Tuple[bool, str]:
    """(True, "") when torch._scaled_mm can run FP8 here, else (False, why not)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return False, f"GPU compute capability {major}.{minor} < 8.9 has no FP8 tensor cores"
    if not hasattr(torch, "_scaled_mm"):
        return False, "this torch has no torch._scaled_mm"
    return True, ""


class FP8BlockLinear(nn.Module):
    """A drop-in nn.Linear whose weight is held as FP8 codes with block scales.

    On CPU (and on GPUs without FP8) the weight is dequantized block by block
    into the input's dtype and F.linear runs. On a CUDA device with FP8
    (compute capability >= 8.9) the product runs through torch._scaled_mm:
    each 128-column slab of the weight is one _scaled_mm call with a per-row
    (row-block) weight scale and a per-token activation scale, the slabs'
    outputs summed in float32 -- block scales on the weight side, as the
    installed torch's _scaled_mm takes row-wise scales. `.weight` gives the
    dequantized weight, so code reading it (nn.MultiheadAttention's
    out_proj) keeps working."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, block: Block = 128,
                 device=None, bias_dtype=torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        br, bc = block_shape((out_features, in_features), block)
        self.block = (br, bc)
        R, C = -(-out_features // br), -(-in_features // bc)
        self.register_buffer("weight_codes", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        self.register_buffer("weight_scale", torch.zeros(R, C, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None

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

    @property
    def weight(self) -> torch.Tensor:
        dtype = self.bias.dtype if self.bias is not None else torch.float32
        return dequantize_weight(self.weight_codes, self.weight_scale, self.block, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and fp8_gpu_available()[0]:
            return self._forward_scaled_mm(x)
        w = dequantize_weight(self.weight_codes, self.weight_scale, self.block, x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def _forward_scaled_mm(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - needs an FP8 GPU
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        br, bc = self.block
        out = torch.zeros(x2.shape[0], self.out_features, dtype=torch.float32, device=x.device)
        row_scale_all = self.weight_scale.repeat_interleave(br, 0)[: self.out_features]  # [out, C]
        for c in range(self.weight_scale.shape[1]):
            lo, hi = c * bc, min(self.in_features, (c + 1) * bc)
            xs = x2[:, lo:hi].float()
            pad = (-(hi - lo)) % 16  # _scaled_mm wants K a multiple of 16
            a_amax = xs.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
            a_scale = a_amax / FP8_MAX
            a = (xs / a_scale).to(FP8_DTYPE)
            b = self.weight_codes[:, lo:hi]
            if pad:
                a = F.pad(a.float(), (0, pad)).to(FP8_DTYPE)
                b = F.pad(b.float(), (0, pad)).to(FP8_DTYPE)
            ws = row_scale_all[:, c:c + 1].t().contiguous().float()  # [1, out]
            out += torch._scaled_mm(a, b.t(), scale_a=a_scale.float(), scale_b=ws, out_dtype=torch.float32)
        if self.bias is not None:
            out += self.bias.float()
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, block={self.block}")
