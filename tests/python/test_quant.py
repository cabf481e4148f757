"""vlafeed.quant: block-wise FP8 post-training quantization, FP8BlockLinear,
the checkpoint files and the `vlafeed quantize` command."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import torch.nn as nn  # noqa: E402

from vlafeed import quant as Q  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# e4m3fn: 3 mantissa bits -> round-to-nearest relative error <= 2^-4 for normal values; the smallest
# subnormal step is 2^-9, so values far below the block's amax lose at most 2^-10 of the scale.
REL = 2.0 ** -4
SUB = 2.0 ** -10


def blocky_weight(out_f, in_f, block, seed=0):
    """Gaussian weight whose blocks differ in magnitude by up to 1e6."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g)
    R, C = -(-out_f // block), -(-in_f // block)
    mags = 10.0 ** torch.randint(-3, 4, (R, C), generator=g).float()
    return w * mags.repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]


def per_element_bound_holds(w, dq, scale, block):
    br, bc = Q.block_shape(w.shape, block)
    s = scale.repeat_interleave(br, 0)[: w.shape[0]].repeat_interleave(bc, 1)[:, : w.shape[1]]
    err = (w - dq).abs()
    bound = REL * w.abs() + SUB * s + 1e-30
    return bool((err <= bound * (1 + 1e-6)).all()), float((err / bound).max())


@pytest.mark.parametrize("shape,block", [((256, 384), 128), ((300, 200), 128), ((130, 260), 128),
                                         ((64, 48), 16), ((7, 5), 4)])
def test_block_round_trip_error_bound(shape, block):
    w = blocky_weight(*shape, block)
    codes, scale = Q.quantize_weight(w, block, "layer")
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == w.shape
    assert scale.dtype == torch.float32
    assert tuple(scale.shape) == (-(-shape[0] // block), -(-shape[1] // block))
    dq = Q.dequantize_weight(codes, scale, block)
    ok, worst = per_element_bound_holds(w, dq, scale, block)
    assert ok, f"an element exceeds the e4m3 rounding bound ({worst:.3f}x)"
    # each block's largest element maps to +-448 and comes back (nearly) exactly
    br, bc = Q.block_shape(w.shape, block)
    for r in range(scale.shape[0]):
        for c in range(scale.shape[1]):
            wb = w[r * br:(r + 1) * br, c * bc:(c + 1) * bc]
            db = dq[r * br:(r + 1) * br, c * bc:(c + 1) * bc]
            i = wb.abs().argmax()
            assert abs(float(db.flatten()[i]) - float(wb.flatten()[i])) <= 1e-6 * float(wb.abs().max())
            assert float(scale[r, c]) == pytest.approx(float(wb.abs().max()) / 448.0, rel=1e-6)
    err = Q.block_errors(w, dq, block)
    assert 0 < err["mean_rel_error"] <= err["max_rel_error"] < 0.07


def test_edge_blocks_take_their_scale_from_real_elements_only():
    w = torch.ones(130, 260) * 0.5
    w[128:, :] = 3.0  # the bottom edge row-block (2 real rows)
    w[:128, 256:] = -7.0  # the right edge column-block (4 real columns)
    codes, scale = Q.quantize_weight(w, 128)
    assert scale.shape == (2, 3)
    assert float(scale[0, 0]) == pytest.approx(0.5 / 448)
    assert float(scale[1, 0]) == pytest.approx(3.0 / 448)
    assert float(scale[0, 2]) == pytest.approx(7.0 / 448)
    assert torch.equal(Q.dequantize_weight(codes, scale, 128), w)  # powers of two times 448-scale: exact


def test_zero_blocks_and_all_zero_weight():
    w = blocky_weight(256, 256, 128, seed=3)
    w[:128, 128:] = 0
    codes, scale = Q.quantize_weight(w, 128)
    assert float(scale[0, 1]) == 0.0
    assert torch.count_nonzero(codes[:128, 128:].float()) == 0
    dq = Q.dequantize_weight(codes, scale, 128)
    assert torch.isfinite(dq).all()
    assert torch.count_nonzero(dq[:128, 128:]) == 0
    z = torch.zeros(40, 70)
    codes, scale = Q.quantize_weight(z, 128)
    assert torch.equal(scale, torch.zeros(1, 1))
    assert torch.equal(Q.dequantize_weight(codes, scale, 128), z)
    assert Q.block_errors(z, z)["max_rel_error"] == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weight_refused_with_layer_named(bad):
    sd = {"blocks.3.mlp.fc1.weight": torch.randn(64, 32), "blocks.3.mlp.fc1.bias": torch.zeros(64)}
    sd["blocks.3.mlp.fc1.weight"][5, 7] = bad
    with pytest.raises(Q.QuantError, match=r"blocks\.3\.mlp\.fc1\.weight.*non-finite.*\[5, 7\]"):
        Q.quantize_state_dict(sd)


def test_block_beats_per_tensor_with_an_outlier_block():
    """Per-tensor scaling pushes small blocks into e4m3's subnormals; block scales keep them precise."""
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    w[:128, :128] *= 1e5
    errs = {}
    for block in (128, "tensor", "channel"):
        c, s = Q.quantize_weight(w, block)
        errs[block] = Q.block_errors(w, Q.dequantize_weight(c, s, block), 128)["max_rel_error"]
    assert errs[128] < 0.07
    assert errs["tensor"] > 5 * errs[128]
    assert errs["channel"] > 2 * errs[128]


def test_per_tensor_and_per_channel_scale_shapes():
    w = torch.randn(50, 30)
    assert Q.quantize_weight(w, "tensor")[1].shape == (1, 1)
    assert Q.quantize_weight(w, "channel")[1].shape == (50, 1)
    with pytest.raises(Q.QuantError, match="2-D"):
        Q.quantize_weight(torch.randn(3, 3, 3), 128, "conv")


def test_fp8_block_linear_matches_dequantized_linear():
    torch.manual_seed(0)
    lin = nn.Linear(300, 200).requires_grad_(False)
    q = Q.FP8BlockLinear.from_linear(lin, 128, "lin")
    x = torch.randn(4, 9, 300)
    w = Q.dequantize_weight(q.weight_codes, q.weight_scale, 128)
    assert torch.allclose(q(x), torch.nn.functional.linear(x, w, lin.bias), atol=1e-6)
    assert torch.equal(q.weight, w)
    ref = lin(x)
    assert float((q(x) - ref).norm() / ref.norm()) < 0.05
    # bf16 input stays bf16
    assert q(x.bfloat16()).dtype == torch.bfloat16
    # per-channel baseline through the same module
    qc = Q.FP8BlockLinear.from_linear(lin, "channel")
    assert qc.weight_scale.shape == (200, 1)
    assert float((qc(x) - ref).norm() / ref.norm()) < 0.05


class TinyVLA(nn.Module):
    """A vision encoder, an embedding table and a transformer: what the skip rules must tell apart."""

    def __init__(self):
        super().__init__()
        self.vision_tower = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.Flatten(), nn.LazyLinear(64))
        self.vision_tower[2] = nn.Linear(8 * 3 * 3, 64)
        self.embed_tokens = nn.Embedding(50, 64)
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True),
                                            2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 10)

    def forward(self, img, tok):
        v = self.vision_tower(img)[:, None]
        x = torch.cat([v, self.embed_tokens(tok)], 1)
        return self.head(self.blocks(x))


def tiny(seed=0):
    torch.manual_seed(seed)
    return TinyVLA().eval()


def tiny_inputs():
    g = torch.Generator().manual_seed(5)
    return torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 50, (2, 6), generator=g)


def test_quantize_model_skips_vision_and_keeps_outputs_close():
    m = tiny()
    with torch.no_grad():
        ref = m(*tiny_inputs())
    qm, summary = Q.quantize_model(m, 128, inplace=False)
    assert isinstance(qm.vision_tower[2], nn.Linear) and not isinstance(qm.vision_tower[2], Q.FP8BlockLinear)
    assert isinstance(qm.head, Q.FP8BlockLinear)
    assert isinstance(qm.blocks.layers[0].linear1, Q.FP8BlockLinear)
    assert isinstance(qm.blocks.layers[0].self_attn.out_proj, Q.FP8BlockLinear)
    assert "vision_tower.2.weight" in summary["skipped"]
    assert summary["skipped"]["vision_tower.2.weight"]["default"] is True
    assert "embed_tokens.weight" not in summary["quantized"]
    assert "blocks.layers.0.self_attn.in_proj_weight" in summary["quantized"]
    # 2 layers x (in_proj, out_proj, linear1, linear2) + head
    assert summary["layers_quantized"] == 9
    with torch.no_grad():
        out = qm(*tiny_inputs())
    assert float((out - ref).norm() / ref.norm()) < 0.08
    # --no-default-skip quantizes the vision encoder too
    _, s2 = Q.quantize_model(tiny(), 128, default_skip=False, inplace=False)
    assert "vision_tower.2.weight" in s2["quantized"]


def test_unmatched_skip_pattern_warns_and_is_listed():
    sd = tiny().state_dict()
    with pytest.warns(UserWarning, match="'decoder.\\*' matches no linear weight"):
        res = Q.quantize_state_dict(sd, 128, skip=["decoder.*", "head"])
    assert res.summary["unmatched_skip_patterns"] == ["decoder.*"]
    assert res.summary["skipped"]["head.weight"] == {"pattern": "head", "default": False, "shape": [10, 64]}
    # bare-checkpoint rule: embeddings and 1-D / 4-D weights are left alone
    assert "embed_tokens.weight" not in res.summary["quantized"]
    assert "vision_tower.0.weight" not in res.summary["quantized"]
    assert res.tensors["embed_tokens.weight"] is sd["embed_tokens.weight"]


def test_save_load_round_trip_and_mismatched_model(tmp_path):
    m = tiny()
    res = Q.quantize_state_dict(m.state_dict(), 128, source="tiny")
    out, summ = Q.save_quantized(res, tmp_path / "q.safetensors")
    from safetensors import safe_open
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["vlafeed_format"] == Q.FORMAT and f.metadata()["format"] == "pt"
        assert f.get_tensor("head.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("head.weight_scale_inv").dtype == torch.float32
        assert f.get_tensor("head.bias").dtype == torch.float32
        assert f.get_tensor("vision_tower.2.weight").dtype == torch.float32
    s = json.loads(summ.read_text())
    assert s["bytes_after"] < s["bytes_before"] and s["output_file_bytes"] > 0
    assert set(s["quantized"]["head.weight"]) >= {"max_rel_error", "mean_rel_error", "bytes_before", "bytes_after"}
    # into a fresh float model: same outputs as quantizing in memory
    fresh = Q.load_into(tiny(seed=1), out)
    assert isinstance(fresh.head, Q.FP8BlockLinear)
    qm, _ = Q.quantize_model(tiny(), 128, inplace=False)
    with torch.no_grad():
        assert torch.allclose(fresh(*tiny_inputs()), qm(*tiny_inputs()), atol=1e-6)
    # a model whose layers differ: named, not loaded half-way
    other = nn.Sequential(nn.Linear(64, 10))
    with pytest.raises(Q.QuantError, match="layers do not match the model: missing \\['0.bias', '0.weight'\\]"):
        Q.load_into(other, out)
    wrong_shape = tiny()
    wrong_shape.head = nn.Linear(64, 11)
    with pytest.raises(Q.QuantError, match="head"):
        Q.load_into(wrong_shape, out)
    # the model knows a linear weight the checkpoint lacks
    sd = m.state_dict()
    del sd["head.weight"]
    with pytest.raises(Q.QuantError, match="'head.weight' is not in the checkpoint"):
        Q.quantize_state_dict(sd, 128, linear_keys=Q.linear_weight_keys_of(m))


def test_checkpoint_readers(tmp_path):
    sd = tiny().state_dict()
    torch.save({"model": sd, "optimizer": {}, "step": 3, "args": {"lr": 1e-3}}, tmp_path / "ck.pt")
    got = Q.load_state_dict(tmp_path / "ck.pt")
    assert set(got) == set(sd)
    torch.save(sd, tmp_path / "plain.pt")
    assert set(Q.load_state_dict(tmp_path / "plain.pt")) == set(sd)
    from safetensors.torch import save_file
    save_file(sd, str(tmp_path / "m.safetensors"))
    assert set(Q.load_state_dict(tmp_path / "m.safetensors")) == set(sd)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(Q.QuantError, match="junk.pt: not a torch checkpoint"):
        Q.load_state_dict(tmp_path / "junk.pt")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{bad")
    with pytest.raises(Q.QuantError, match="junk.safetensors: not a readable safetensors"):
        Q.load_state_dict(tmp_path / "junk.safetensors")
    with pytest.raises(Q.QuantError, match="missing.pt: no such checkpoint"):
        Q.load_state_dict(tmp_path / "missing.pt")
    torch.save({"model": {"a": 1}}, tmp_path / "notensor.pt")
    with pytest.raises(Q.QuantError, match="entry 'a' is a int"):
        Q.load_state_dict(tmp_path / "notensor.pt")
    with pytest.raises(Q.QuantError, match="not a vlafeed FP8 checkpoint"):
        Q.load_quantized(tmp_path / "m.safetensors")


def run_cli(args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)


def test_cli_quantizes_the_example_policy_checkpoint(cli, tmp_path):
    """`vlafeed quantize` on a checkpoint as examples/train_policy.py writes it, loaded back into its Policy."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from train_policy import Policy
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    pol = Policy(num_cameras=2, state_dim=6, action_dim=6, chunk=10, d=128).eval()
    torch.save({"model": pol.state_dict(), "optimizer": {}, "step": 1, "epoch": 0, "loader_states": None,
                "args": {"steps": 1}}, tmp_path / "step_000001.pt")
    out = tmp_path / "policy-fp8.safetensors"
    r = run_cli([cli, "quantize", str(tmp_path / "step_000001.pt"), str(out), "--fp8-block", "128",
                 "--skip", "task", "--skip", "no_such_module"])
    assert r.returncode == 0, r.stderr
    assert "warning: skip pattern 'no_such_module' matches no linear weight" in r.stderr
    s = json.loads((tmp_path / "policy-fp8.safetensors.json").read_text())
    assert s["skipped"]["image.proj.weight"]["default"] is True  # the vision encoder stays high precision
    assert s["skipped"]["task.weight"]["pattern"] == "task"
    assert "transformer.layers.1.linear2.weight" in s["quantized"]
    assert s["layers_quantized"] == 2 * 4 + 3  # per layer in_proj/out_proj/linear1/linear2; state x2; head
    assert s["size_ratio"] < 0.6
    imgs = [torch.rand(2, 3, 32, 32) for _ in range(2)]
    state = torch.randn(2, 6)
    with torch.no_grad():
        ref = pol(imgs, state, ["a", "b"])
    q = Q.load_into(Policy(num_cameras=2, state_dim=6, action_dim=6, chunk=10, d=128).eval(), out)
    assert isinstance(q.head[1], Q.FP8BlockLinear)
    with torch.no_grad():
        got = q(imgs, state, ["a", "b"])
    assert float((got - ref).norm() / ref.norm()) < 0.08


def test_cli_errors_and_help(cli, tmp_path):
    sd = {"enc.fc.weight": torch.randn(8, 8), "enc.fc.bias": torch.zeros(8)}
    sd["enc.fc.weight"][1, 1] = float("nan")
    torch.save(sd, tmp_path / "nan.pt")
    r = run_cli([cli, "quantize", str(tmp_path / "nan.pt"), str(tmp_path / "o.safetensors")])
    assert r.returncode == 1
    assert "layer 'enc.fc.weight'" in r.stderr and "NaN" in r.stderr
    assert not (tmp_path / "o.safetensors").exists()
    r = run_cli([cli, "quantize", str(tmp_path / "absent.pt"), str(tmp_path / "o.safetensors")])
    assert r.returncode == 1 and "absent.pt: no such checkpoint file" in r.stderr
    r = run_cli([cli, "quantize", "only-one-arg"])
    assert r.returncode == 2
    r = run_cli([cli, "quantize", "--help"])
    assert r.returncode == 0 and "--fp8-block N" in r.stdout and "--skip PATTERN" in r.stdout
    r = run_cli([sys.executable, "-m", "vlafeed.quant", "--help"])
    assert r.returncode == 0 and "--per-channel" in r.stdout and "OUT.json" in r.stdout
    r = run_cli([sys.executable, "-m", "vlafeed.quant", "a.pt", "b", "--fp8-block", "0"])
    assert r.returncode == 2 and "--fp8-block must be >= 1" in r.stderr
    r = run_cli([cli, "quantize", "a.pt", "b"], {"VF_PYTHON": "/nonexistent/python"})
    assert r.returncode == 1 and "cannot run /nonexistent/python" in r.stderr


def test_scaled_mm_path_on_fp8_gpu():
    ok, why = Q.fp8_gpu_available()
    if not ok:
        pytest.skip(f"FP8 GPU path not testable here: {why}")
    torch.manual_seed(0)
    lin = nn.Linear(384, 256).cuda()
    q = Q.FP8BlockLinear.from_linear(lin, 128, "lin")
    x = torch.randn(64, 384, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), q.weight.float(), lin.bias)
    got = q(x).float()
    assert float((got - ref).norm() / ref.norm()) < 0.05


def test_main_baselines_and_rest_dtype(tmp_path, capsys):
    torch.save({"model": tiny().state_dict()}, tmp_path / "ck.pt")
    for flag, scale_shape in (("--per-tensor", [1, 1]), ("--per-channel", [10, 1])):
        out = tmp_path / f"q{flag}.safetensors"
        assert Q.main([str(tmp_path / "ck.pt"), str(out), flag, "--rest-dtype", "bfloat16", "-q"]) == 0
        s = json.loads(Path(str(out) + ".json").read_text())
        assert s["quantized"]["head.weight"]["scale_shape"] == scale_shape
        assert s["rest_dtype"] == "bfloat16"
        tensors, _, blocks = Q.load_quantized(out)
        assert tensors["head.bias"].dtype == torch.bfloat16
        assert blocks["head.weight"] == ((10, 64) if flag == "--per-tensor" else (1, 64))
    # everything skipped: nothing to quantize is an error, not an empty file
    assert Q.main([str(tmp_path / "ck.pt"), str(tmp_path / "none.safetensors"), "--skip", "*"]) == 1
    assert "no linear weight left to quantize" in capsys.readouterr().err
