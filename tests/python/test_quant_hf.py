"""vlafeed.quant's Hugging Face folder mode: the DeepSeek-V3 / FineGrainedFP8 block layout checked key by
key, transformers loading the output (CPU dequantization, and the FP8Linear path a GPU load takes),
a Qwen2-VL-like model whose vision tower stays bf16, shards, streaming, the old private layout, --eval."""
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' FP8 loader requires it

from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from vlafeed import quant as Q  # noqa: E402
from vlafeed.quant import hf as H  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Relative logit error of the FP8 model against the original on these tiny random bf16 models
# (measured ~0.05; random N(0, 0.02) weights and bf16 compute); a misload gives ~1 or NaN.
LOGIT_TOL = 0.10


def qwen2_config(inter=384):
    return transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=inter, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                    tie_word_embeddings=False)


def save_tiny_qwen2(path, inter=384, shard=None, seed=0):
    torch.manual_seed(seed)
    m = transformers.Qwen2ForCausalLM(qwen2_config(inter)).to(torch.bfloat16)
    kw = {"max_shard_size": shard} if shard else {}
    m.save_pretrained(str(path), **kw)
    return path


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A tiny random Qwen2 (bf16) saved in 4 shards, with tokenizer-like extra files and a model card."""
    d = save_tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "orig", shard="500KB")
    (d / "tokenizer_config.json").write_text('{"model_max_length": 256}\n')
    (d / "chat_template.jinja").write_text("{{ messages }}\n")
    (d / "README.md").write_text("# tiny qwen2\n")
    return d


@pytest.fixture(scope="module")
def qwen2_fp8(qwen2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen2q") / "fp8"
    summary = Q.quantize_folder(qwen2_dir, out, max_shard_size="400KB")
    return out, summary


def independent_block_fp8(w):
    """Codes and scales block by block, written out directly (no shared code with vlafeed.quant)."""
    w = w.float()
    R, C = -(-w.shape[0] // 128), -(-w.shape[1] // 128)
    scale = torch.zeros(R, C)
    codes = torch.zeros(w.shape, dtype=torch.float8_e4m3fn)
    for r in range(R):
        for c in range(C):
            blk = w[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128]
            s = float(blk.abs().max()) / 448.0
            scale[r, c] = s
            codes[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] = (blk / s if s > 0 else blk).to(torch.float8_e4m3fn)
    return codes, scale


def read_folder(d):
    tensors = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            assert (h.metadata() or {}).get("format") == "pt"
            for k in h.keys():
                tensors[k] = h.get_tensor(k)
    return tensors


def test_folder_layout_is_the_block_fp8_format(qwen2_dir, qwen2_fp8):
    out, s = qwen2_fp8
    orig = read_folder(qwen2_dir)
    got = read_folder(out)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert {k: qc[k] for k in ("quant_method", "weight_block_size", "activation_scheme")} == \
        {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    # the model's own config is kept; the quantization config is the only addition
    src_cfg = json.loads((qwen2_dir / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg
    # lm_head, embeddings, norms are listed and stay bf16, bit for bit
    not_conv = set(qc["modules_to_not_convert"])
    assert {"lm_head", "model.embed_tokens", "model.norm", "model.layers.0.input_layernorm"} <= not_conv
    quantized = {k for k, v in got.items() if v.dtype == torch.float8_e4m3fn}
    assert len(quantized) == 2 * 7 == s["layers_quantized"]  # q, k, v, o, gate, up, down per layer
    for k, v in orig.items():
        if k in quantized:
            sk = k + "_scale_inv"
            assert k.endswith(".weight") and Q.layer_path(k) not in not_conv
            assert got[sk].dtype == torch.float32
            assert tuple(got[sk].shape) == (-(-v.shape[0] // 128), -(-v.shape[1] // 128))
            codes, scale = independent_block_fp8(v)
            assert torch.equal(got[k].view(torch.uint8), codes.view(torch.uint8)), k
            assert torch.equal(got[sk], scale), sk
        else:
            assert torch.equal(got[k], v) and got[k].dtype == v.dtype, k
    assert set(got) == set(orig) | {k + "_scale_inv" for k in quantized}
    # shards and their index
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(s["shards"]) > 1 and sorted(set(index["weight_map"].values())) == s["shards"]
    assert set(index["weight_map"]) == set(got)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    for f in s["shards"]:
        assert (out / f).stat().st_size <= 400_000 + 8 + 4096  # data within the limit, plus the header
    for name in ("generation_config.json", "tokenizer_config.json", "chat_template.jinja", "README.md"):
        assert (out / name).read_bytes() == (qwen2_dir / name).read_bytes()
    assert s["source_kind"] == "safetensors shards" and s["size_ratio_vs_bf16"] < 0.7


def test_transformers_loads_the_output_on_cpu(qwen2_dir, qwen2_fp8):
    out, _ = qwen2_fp8
    auto = transformers.AutoModelForCausalLM
    orig = auto.from_pretrained(str(qwen2_dir), dtype=torch.bfloat16).eval()
    fp8 = auto.from_pretrained(str(out), dtype=torch.bfloat16).eval()  # no GPU: transformers dequantizes to bf16
    ours = auto.from_pretrained(str(qwen2_dir), dtype=torch.bfloat16).eval()
    ours.load_state_dict(Q.dequantized_state_dict(out, torch.bfloat16))
    fsd = fp8.state_dict()
    for k, v in ours.state_dict().items():
        assert torch.equal(fsd[k], v), k
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b, c = (m(ids).logits.float() for m in (orig, fp8, ours))
    assert torch.equal(b, c)
    rel = float((b - a).norm() / a.norm())
    assert 0 < rel < LOGIT_TOL


def gpu_style_load(cls, path):
    """from_pretrained as on an SM 9.0 GPU: FP8Linear modules take the codes and weight_scale_inv as stored."""
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)):
        return cls.from_pretrained(str(path), dtype=torch.bfloat16, output_loading_info=True)


def check_fp8linear_load(cls, out):
    from transformers.integrations.finegrained_fp8 import FP8Linear
    model, info = gpu_style_load(cls, out)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    stored = read_folder(out)
    fp8_mods = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert len(fp8_mods) == sum(1 for v in stored.values() if v.dtype == torch.float8_e4m3fn)
    for name, mod in fp8_mods.items():
        key = [k for k in stored if k.endswith(name.split(".", 2)[-1] + ".weight")
               and stored[k].dtype == torch.float8_e4m3fn and stored[k].shape == mod.weight.shape]
        assert key, name
        assert any(torch.equal(mod.weight.view(torch.uint8), stored[k].view(torch.uint8)) and
                   torch.equal(mod.weight_scale_inv, stored[k + "_scale_inv"]) for k in key), name
        assert list(mod.block_size) == [128, 128]
    return model, fp8_mods


def test_transformers_fp8linear_load_path_takes_every_quantized_layer(qwen2_fp8):
    out, s = qwen2_fp8
    model, mods = check_fp8linear_load(transformers.AutoModelForCausalLM, out)
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.bfloat16
    assert len(mods) == s["layers_quantized"]


def test_tied_lm_head_is_listed_and_stays_bf16(tmp_path):
    """A tied LM head has no tensor of its own; it must still be named, or a GPU load makes it FP8Linear."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(tmp_path / "t"))
    s = Q.quantize_folder(tmp_path / "t", tmp_path / "tq")
    assert "lm_head" in s["quantization_config"]["modules_to_not_convert"]
    model, _ = check_fp8linear_load(transformers.AutoModelForCausalLM, tmp_path / "tq")
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.model.embed_tokens.weight


def qwen2_vl(path):
    torch.manual_seed(0)
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}, tie_word_embeddings=False),
        vision_config=dict(depth=2, embed_dim=128, hidden_size=256, num_heads=4, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503,
        bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    transformers.Qwen2VLForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(str(path))
    return path


def test_qwen2_vl_vision_tower_stays_bf16_and_logits_hold(tmp_path):
    src = qwen2_vl(tmp_path / "vl")
    out = tmp_path / "vl-fp8"
    s = Q.quantize_folder(src, out)
    assert s["layers_quantized"] == 14
    vis = [k for k in s["skipped"] if k.startswith("visual.")]
    assert len(vis) == 2 * 4 + 2 and all(s["skipped"][k]["default"] for k in vis)  # 4 per block, merger's 2
    not_conv = s["quantization_config"]["modules_to_not_convert"]
    assert "visual.blocks.0.attn.qkv" in not_conv and "visual.patch_embed.proj" in not_conv
    cls = transformers.Qwen2VLForConditionalGeneration
    orig = cls.from_pretrained(str(src), dtype=torch.bfloat16).eval()
    fp8 = cls.from_pretrained(str(out), dtype=torch.bfloat16).eval()
    for (n, a), (_, b) in zip(orig.model.visual.named_parameters(), fp8.model.visual.named_parameters()):
        assert torch.equal(a, b), n
    g = torch.Generator().manual_seed(2)
    ids = torch.cat([torch.randint(0, 400, (1, 5), generator=g), torch.tensor([[502] + [500] * 4 + [503]]),
                     torch.randint(0, 400, (1, 6), generator=g)], 1)
    kw = dict(input_ids=ids, pixel_values=torch.randn(16, 3 * 2 * 14 * 14, generator=g).bfloat16(),
              image_grid_thw=torch.tensor([[1, 4, 4]]), mm_token_type_ids=(ids == 500).long())
    with torch.no_grad():
        a, b = orig(**kw).logits.float(), fp8(**kw).logits.float()
    assert 0 < float((b - a).norm() / a.norm()) < LOGIT_TOL
    model, mods = check_fp8linear_load(cls, out)
    assert all(type(m) is torch.nn.Linear for n, m in model.named_modules() if n.startswith("model.visual")
               and isinstance(m, torch.nn.Linear))
    assert all(n.startswith("model.language_model.") for n in mods)


def test_ragged_shapes_use_the_ceil_grid_and_skip_ragged_loads_exactly(tmp_path):
    src = save_tiny_qwen2(tmp_path / "r", inter=300)  # 300 = 2 full row blocks + a 44-row edge
    out = tmp_path / "rq"
    r = run_module([str(src), str(out), "-q"])
    assert r.returncode == 0, r.stderr
    assert "6 quantized layer(s) have a dimension that is not a multiple of 128" in r.stderr
    tensors, qcfg, blocks = Q.read_quantized_folder(out)
    orig = read_folder(src)
    k = "model.layers.0.mlp.up_proj.weight"
    assert tuple(tensors[k + "_scale_inv"].shape) == (3, 2)
    codes, scale = independent_block_fp8(orig[k])
    assert torch.equal(tensors[k].view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(tensors[k + "_scale_inv"], scale)
    # the edge block's scale comes from its 44 real rows only
    assert scale[2, 0] == orig[k][256:, :128].float().abs().max() / 448.0
    # --skip-ragged keeps those layers bf16: transformers' CPU dequantization then matches ours exactly
    out2 = tmp_path / "rq2"
    assert Q.main([str(src), str(out2), "--skip-ragged", "-q"]) == 0
    s2 = json.loads((out2 / "vlafeed_quant.json").read_text())
    assert s2["ragged_layers"] == [] and s2["skipped"][k]["pattern"] == "--skip-ragged"
    fp8 = transformers.AutoModelForCausalLM.from_pretrained(str(out2), dtype=torch.bfloat16)
    ours = Q.dequantized_state_dict(out2, torch.bfloat16)
    fsd = fp8.state_dict()
    assert all(torch.equal(fsd[k2], v) for k2, v in ours.items())


def test_torch_bin_input_band_streaming_and_only(tmp_path, monkeypatch):
    src = save_tiny_qwen2(tmp_path / "s")
    sd = read_folder(src)
    b = tmp_path / "b"
    b.mkdir()
    torch.save(sd, b / "pytorch_model.bin")
    (b / "config.json").write_bytes((src / "config.json").read_bytes())
    (b / "preprocessor_config.json").write_text("{}\n")
    whole = tmp_path / "whole"
    Q.quantize_folder(src, whole)
    monkeypatch.setattr(H, "BAND_ELEMENTS", 128 * 256)  # one 128-row band at a time
    banded = tmp_path / "banded"
    s = Q.quantize_folder(b, banded)
    assert s["source_kind"] == "torch" and (banded / "preprocessor_config.json").is_file()
    assert (banded / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    only = tmp_path / "only"
    s = Q.quantize_folder(src, only, only=["mlp", "no_such_layer"])
    assert s["layers_quantized"] == 6 and s["unmatched_only_patterns"] == ["no_such_layer"]
    assert s["skipped"]["model.layers.0.self_attn.q_proj.weight"]["pattern"] == "--only"
    # a pickle that needs more than weights_only=True allows is refused, not executed
    torch.save({"model.x.weight": torch.zeros(2, 2), "extra": _Custom()}, b / "pytorch_model.bin")
    with pytest.raises(Q.QuantError, match="weights_only=True"):
        Q.quantize_folder(b, tmp_path / "evil")


class _Custom:
    pass


def write_legacy_file(path, sd):
    """A file as vlafeed wrote it before the standard naming: `<weight>_scale` + header format vlafeed-fp8."""
    res = Q.quantize_state_dict(sd, 128)
    tensors = {}
    for k, v in res.tensors.items():
        tensors[k[: -len("_scale_inv")] + "_scale" if k.endswith("_scale_inv") else k] = v
    meta = {"format": "vlafeed-fp8", "block": json.dumps([128, 128]),
            "quantized": json.dumps({k: v["block"] for k, v in sorted(res.summary["quantized"].items())})}
    save_file(tensors, str(path), metadata=meta)
    return res


def test_old_private_layout_is_converted_never_misloaded(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU(), torch.nn.Linear(384, 256))
    old = tmp_path / "old.safetensors"
    res = write_legacy_file(old, model.state_dict())
    with pytest.warns(Q.LegacyLayoutWarning, match="old private FP8 layout"):
        tensors, meta, blocks = Q.load_quantized(old)
    assert "0.weight_scale_inv" in tensors and "0.weight_scale" not in tensors
    assert torch.equal(tensors["0.weight_scale_inv"], res.tensors["0.weight_scale_inv"])
    with pytest.warns(Q.LegacyLayoutWarning):
        loaded = Q.load_into(torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU(),
                                                 torch.nn.Linear(384, 256)), old)
    x = torch.randn(4, 256)
    with torch.no_grad():
        assert float((loaded(x) - model(x)).norm() / model(x).norm()) < 0.05
    # the command converts the file (values unchanged)
    new = tmp_path / "new.safetensors"
    r = run_module([str(old), str(new)])
    assert r.returncode == 0 and "converted" in r.stdout, r.stderr
    t2, meta2, _ = Q.load_quantized(new)
    assert meta2["vlafeed_format"] == Q.FORMAT and torch.equal(t2["2.weight_scale_inv"], tensors["2.weight_scale_inv"])
    # FP8 codes whose header does not say how to read them: refused, never handed out as weights
    bare = tmp_path / "bare.safetensors"
    save_file({k: v for k, v in tensors.items()}, str(bare))
    with pytest.raises(Q.QuantError, match="holds FP8 tensors .* no vlafeed header"):
        Q.load_quantized(bare)
    # an old file dropped into a model folder: the folder mode refuses it with the way out named
    d = tmp_path / "folder"
    d.mkdir()
    (d / "config.json").write_text("{}")
    os.replace(old, d / "model.safetensors")
    with pytest.raises(Q.QuantError, match="old private FP8 layout"):
        Q.quantize_folder(d, tmp_path / "o")
    # re-quantizing FP8 codes is refused too
    with pytest.raises(Q.QuantError, match="already holds FP8"):
        Q.quantize_state_dict(t2)


def test_eval_report_block_vs_per_tensor_vs_per_channel(qwen2_dir, tmp_path):
    import numpy as np
    out = tmp_path / "ev"
    toks = tmp_path / "toks.npy"
    np.save(toks, np.random.default_rng(0).integers(0, 512, size=(2, 96)))
    assert Q.main([str(qwen2_dir), str(out), "--eval-tokens", str(toks), "--eval-seq-len", "64", "-q"]) == 0
    rep = json.loads((out / "eval.json").read_text())
    rows = {r["variant"]: r for r in rep["variants"]}
    assert list(rows) == ["original", "fp8 block", "fp8 per-channel", "fp8 per-tensor"]
    assert rep["tokens"] == 192 and rep["sequences"] == 4 and rep["model_class"] == "Qwen2ForCausalLM"
    assert rows["original"]["rel_logit_error"] == 0 and rows["original"]["loss_delta"] == 0
    for v in ("fp8 block", "fp8 per-channel", "fp8 per-tensor"):
        assert 0 < rows[v]["rel_logit_error"] < LOGIT_TOL and rows[v]["max_abs_logit_diff"] > 0
        assert abs(rows[v]["loss_delta"]) < 0.05
    readme = (out / "README.md").read_text()
    assert readme.startswith("# tiny qwen2") and "| fp8 block |" in readme
    assert json.loads((out / "vlafeed_quant.json").read_text())["eval"]["variants"][1]["variant"] == "fp8 block"
    # the built-in sample (no tokenizer here: the paragraph's bytes); a text token file; a bad id
    (tmp_path / "t.txt").write_text("1, 2, 3 4\n5 6 7")
    assert Q.main([str(qwen2_dir), str(tmp_path / "ev2"), "--eval-tokens", str(tmp_path / "t.txt"), "-q"]) == 0
    assert json.loads((tmp_path / "ev2" / "eval.json").read_text())["tokens"] == 7
    (tmp_path / "bad.txt").write_text("1 2 999")
    assert Q.main([str(qwen2_dir), str(tmp_path / "ev3"), "--eval-tokens", str(tmp_path / "bad.txt"), "-q"]) == 1
    assert not (tmp_path / "ev3").exists()  # nothing half-written
    assert Q.main([str(qwen2_dir), str(tmp_path / "ev4"), "--eval", "-q"]) == 0
    assert "bytes" in json.loads((tmp_path / "ev4" / "eval.json").read_text())["sample"]


def run_module(args):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "vlafeed.quant", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_cli_folder_mode_errors_and_help(qwen2_dir, qwen2_fp8, tmp_path, capsys):
    out, _ = qwen2_fp8
    r = run_module(["--help"])
    assert r.returncode == 0
    for s in ("INPUT", "OUTPUT", "--eval", "--only PATTERN", "--max-shard-size SIZE", "weight_scale_inv",
              "Single-file mode", "modules_to_not_convert", "--skip-ragged"):
        assert s in r.stdout, s
    usage = (ROOT / "tools" / "cmd_quantize.c").read_text()
    for s in ("HF_DIR OUT_DIR", "--eval", "--only PATTERN", "--max-shard-size SIZE", "weight_scale_inv",
              "single-file", "--skip-ragged"):
        assert s in usage, s
    with pytest.raises(SystemExit) as e:
        Q.parse_args([str(qwen2_dir), str(tmp_path / "x"), "--per-tensor"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        Q.parse_args([str(qwen2_dir / "config.json"), str(tmp_path / "x"), "--eval"])
    assert e.value.code == 2
    capsys.readouterr()
    assert Q.main([str(qwen2_dir), str(out)]) == 1  # exists, not empty
    assert "not empty (pass --overwrite" in capsys.readouterr().err
    assert Q.main([str(out), str(tmp_path / "again")]) == 1  # already quantized
    assert "already quantized" in capsys.readouterr().err
    (tmp_path / "nocfg").mkdir()
    assert Q.main([str(tmp_path / "nocfg"), str(tmp_path / "y")]) == 1
    assert "no config.json" in capsys.readouterr().err
    assert Q.main([str(qwen2_dir), str(tmp_path / "z"), "--max-shard-size", "lots"]) == 1
    assert "cannot read size 'lots'" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial folder left
    assert Q.parse_size("5GB") == 5 * 10 ** 9 and Q.parse_size("2GiB") == 2 * 2 ** 30 and Q.parse_size(7) == 7
