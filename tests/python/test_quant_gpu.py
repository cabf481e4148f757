"""FP8BlockLinear's GEMM paths: the choice from torch's own rules (a table with the device facts and the
probe monkeypatched), the CPU fallback against F.linear, the dequantized-weight cache, and on an SM 9.0
GPU the block-scaled GEMM itself (skipped elsewhere, with the reason)."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from vlafeed import quant as Q  # noqa: E402
from vlafeed.quant import linear as L  # noqa: E402

APIS = ["F.scaled_mm", "torch._scaled_mm"]


def facts(cuda=True, hip=False, cap=(9, 0), cv=(12, 9), apis=APIS):
    return {"cuda": cuda, "hip": hip, "capability": cap, "cuda_version": cv, "apis": apis, "device": "cuda:0"}


@pytest.mark.parametrize("f,probe,path,why", [
    (facts(cuda=False, cap=None), (True, ""), "dequant", "no CUDA device"),
    (facts(hip=True), (True, ""), "dequant", "ROCm"),
    (facts(cap=(8, 9)), (True, ""), "dequant", "compute capability 8.9"),
    (facts(cap=(8, 0)), (True, ""), "dequant", "compute capability 8.0"),
    (facts(cap=(10, 0)), (True, ""), "dequant", "SM 10.x\\+ uses MX"),
    (facts(cap=(12, 0)), (True, ""), "dequant", "compute capability 12.0"),
    (facts(cv=(12, 4)), (True, ""), "dequant", "CUDA 12.4: .* 12.9 or newer"),
    (facts(cv=None), (True, ""), "dequant", "CUDA none"),
    (facts(apis=[]), (True, ""), "dequant", "neither"),
    (facts(), (False, "F.scaled_mm: RuntimeError: boom"), "dequant", "probe failed: F.scaled_mm: RuntimeError"),
    (facts(), (True, ""), "blockwise", "^$"),
    (facts(cv=(13, 0)), (True, ""), "blockwise", "^$"),
])
def test_path_selection_table(f, probe, path, why):
    calls = []

    def fake_probe():
        calls.append(1)
        return probe

    got, reason = L.select_gemm_path(f, fake_probe)
    assert got == path
    import re
    assert re.search(why, reason), reason
    # the probe runs only when every static check of torch's rules passes
    static_ok = f["cuda"] and not f["hip"] and f["capability"][0] == 9 and f["cuda_version"] is not None \
        and tuple(f["cuda_version"]) >= (12, 9) and f["apis"]
    assert len(calls) == (1 if static_ok else 0)


def test_probe_is_run_once_per_device_and_cached(monkeypatch):
    runs = []
    monkeypatch.setattr(L, "_probe_cache", {})
    monkeypatch.setattr(L, "_run_probe", lambda dev: (runs.append(dev), (False, "refused", None))[1])
    monkeypatch.setattr(L, "device_facts", lambda device=None: facts())
    for _ in range(3):
        assert L.gemm_path("cuda:0") == ("dequant", "the block-scaled FP8 GEMM probe failed: refused")
    assert runs == ["cuda:0"]
    assert Q.fp8_gpu_available() == (False, "the block-scaled FP8 GEMM probe failed: refused")
    monkeypatch.setattr(L, "_run_probe", lambda dev: (True, "", "F.scaled_mm"))
    monkeypatch.setattr(L, "_probe_cache", {})
    assert Q.fp8_gpu_available() == (True, "")


def test_cpu_fallback_equals_f_linear_on_the_dequantized_weight():
    torch.manual_seed(0)
    lin = nn.Linear(384, 256)
    q = Q.FP8BlockLinear.from_linear(lin, 128, "lin")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 7, 384).to(dtype)
        w = Q.dequantize_weight(q.weight_codes, q.weight_scale, 128, dtype)
        assert torch.equal(q(x), F.linear(x, w, lin.bias.detach().to(dtype)))
        assert q.last_path == "dequant" and q.path_reason == "input on CPU"
    if not torch.cuda.is_available():
        ok, why = Q.fp8_gpu_available()
        assert ok is False and why.startswith("no CUDA device")
        assert Q.gpu_self_check() == {"skipped": "no CUDA device"}


def test_dequantized_weight_cache_follows_the_codes():
    torch.manual_seed(0)
    q = Q.FP8BlockLinear.from_linear(nn.Linear(256, 128, bias=False), 128)
    x = torch.randn(2, 256)
    y1 = q(x)
    assert q._cache is not None and q(x) is not y1 and torch.equal(q(x), y1)
    cached = q._cache[3]
    assert q.dequantized_weight(torch.float32) is cached  # one copy, reused
    other = Q.FP8BlockLinear.from_linear(nn.Linear(256, 128, bias=False), 128)
    q.load_quantized(other.weight_codes, other.weight_scale)
    assert torch.equal(q(x), other(x)) and not torch.equal(q(x), y1)
    q.weight_scale.mul_(2)  # an in-place write is seen too
    assert torch.allclose(q(x), 2 * other(x))
    q.cache_dequantized = False
    q._cache = None
    q(x)
    assert q._cache is None


def test_blockwise_shape_rule():
    assert Q.FP8BlockLinear(256, 384, block=128).blockwise_shape_ok()
    assert not Q.FP8BlockLinear(300, 384, block=128).blockwise_shape_ok()
    assert not Q.FP8BlockLinear(256, 384, block=64).blockwise_shape_ok()


def test_activation_scales_layout_for_blockwise():
    x = torch.randn(5, 256)
    a, s = L._quantize_activations(x)
    assert a.dtype == torch.float8_e4m3fn and tuple(s.shape) == (5, 2) and s.stride() == (1, 5)
    back = (a.float().reshape(5, 2, 128) * s[..., None]).reshape(5, 256)
    assert float((back - x).norm() / x.norm()) < 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_self_check_on_this_gpu():  # pragma: no cover - needs a GPU
    r = Q.gpu_self_check(m=64, k=1024, n=1024, iters=5)
    ok, why = Q.fp8_gpu_available()
    assert r["path"] == ("blockwise" if ok else "dequant"), r
    assert r["rel_error_vs_dequantized_bf16"] < (0.05 if ok else 0.01), r
    assert r["rel_error_vs_bf16_weight"] < 0.06 and r["ms_per_gemm"] > 0, r
