"""Sequence packing (src/pack through vlafeed._native.pack_plan) and the
example policy's variable-length attention: the packer's layout, its errors,
packed and padded batches giving the same per-sample outputs and losses,
and no token attending across a sample boundary.
"""
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from vlafeed import _native  # noqa: E402
from vlafeed.train.packing import (BOS, kept_cameras, load_tokenizer, packed_layout, padded_layout,  # noqa: E402
                                   sample_tokens)
from vlafeed.train.policy import VLAPolicy, attend, attention_mask, per_sample_loss  # noqa: E402

TASKS = ["pick the red cube", "open the drawer and put the spoon inside", "wave", "stack the blocks on the tray",
         "push the button twice", "fold the towel", "pour water", "close the lid"]


def test_pack_plan_places_every_sample_once_within_rows():
    lengths = [37, 5, 60, 12, 33, 64, 1, 20, 48, 9]
    for window in (0, 3, 4):
        plan = _native.pack_plan(lengths, 64, window)
        assert sorted(plan["order"]) == list(range(len(lengths)))
        assert all(t <= 64 for t in plan["row_tokens"])
        assert sum(plan["row_tokens"]) == sum(lengths) == plan["cu_seqlens"][-1]
        for r in range(len(plan["row_tokens"])):
            members = plan["order"][plan["row_first"][r]:plan["row_first"][r + 1]]
            off = 0
            for i in members:
                assert plan["sample_row"][i] == r and plan["sample_offset"][i] == off
                off += lengths[i]
            if window:  # a row never waits for samples beyond its window
                assert len({i // window for i in members}) == 1
        assert plan == _native.pack_plan(lengths, 64, window)  # a pure function of its input
    # fewer rows than one per sample: that is the point
    assert len(_native.pack_plan(lengths, 64)["row_tokens"]) < len(lengths)


def test_pack_plan_errors_name_the_sample():
    with pytest.raises(ValueError, match="sample 2 has 65 tokens"):
        _native.pack_plan([3, 4, 65], 64)
    with pytest.raises(ValueError, match="sample 0 has 0 tokens"):
        _native.pack_plan([0], 8)
    with pytest.raises(ValueError, match="max_tokens is 0"):
        _native.pack_plan([1], 0)
    with pytest.raises(ValueError, match="window"):
        _native.pack_plan([1], 4, -1)
    with pytest.raises(TypeError):
        _native.pack_plan(5, 4)
    assert _native.pack_plan([], 4)["row_tokens"] == []


def test_sample_tokens_tokenizers_and_camera_dropout():
    tok = load_tokenizer("bytes")
    s = sample_tokens(["héllo"], [0], tokenizer=tok, max_text_tokens=4, num_cameras=2, tokens_per_camera=6, chunk=3)
    assert s[0].text == [BOS] + list("héllo".encode())[:3] and s[0].length == 4 + 12 + 1 + 3
    mod = types.ModuleType("vf_test_tokenizer")
    mod.words = lambda text: [len(w) for w in text.split()]
    sys.modules["vf_test_tokenizer"] = mod
    user = load_tokenizer("vf_test_tokenizer:words")
    assert sample_tokens(["a bb ccc"], [0], tokenizer=user, max_text_tokens=10, num_cameras=1,
                         tokens_per_camera=2, chunk=1)[0].text == [BOS, 1, 2, 3]
    with pytest.raises(ValueError, match="model.tokenizer"):
        load_tokenizer("no_such_module_xyz:f")
    # dropout: deterministic per (seed, index), at least one camera kept, and it does drop some
    keeps = [kept_cameras(i, 3, 0.5, seed=7) for i in range(200)]
    assert keeps == [kept_cameras(i, 3, 0.5, seed=7) for i in range(200)]
    assert all(any(k) for k in keeps) and any(not all(k) for k in keeps)
    assert keeps != [kept_cameras(i, 3, 0.5, seed=8) for i in range(200)]


def _model_and_batch(B=8, attention="sdpa", dropout=0.4):
    torch.manual_seed(0)
    model = VLAPolicy(num_cameras=2, image_hw=(32, 32), state_dim=5, action_dim=4, chunk=3, d_model=32, layers=2,
                      heads=4, patch=16, max_positions=64, attention=attention).eval()
    images = [torch.rand(B, 3, 32, 32) for _ in range(2)]
    state = torch.randn(B, 5)
    samples = sample_tokens(TASKS[:B], list(range(B)), tokenizer=load_tokenizer("bytes"), max_text_tokens=24,
                            num_cameras=2, tokens_per_camera=model.tokens_per_camera, chunk=3, camera_dropout=dropout,
                            seed=1)
    return model, images, state, samples


def test_packed_and_padded_batches_give_the_same_per_sample_outputs_and_losses():
    model, images, state, samples = _model_and_batch()
    lengths = [s.length for s in samples]
    assert len(set(lengths)) > 3  # really variable-length
    padded = padded_layout(lengths)
    packed = packed_layout(lengths, max_tokens=64)
    assert packed.rows < padded.rows and packed.slots < padded.slots  # packing saves slots
    target, valid = torch.randn(8, 3, 4), torch.ones(8, 3)
    valid[2, 1:] = 0
    with torch.no_grad():
        a = model(images, state, samples, padded)
        b = model(images, state, samples, packed)
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    la, lb = per_sample_loss(a, target, valid), per_sample_loss(b, target, valid)
    assert torch.allclose(la, lb, atol=1e-5)
    # and the gradients of the mean loss agree too
    ga, gb = [], []
    for layout, out in ((padded, ga), (packed, gb)):
        model.zero_grad()
        per_sample_loss(model(images, state, samples, layout), target, valid).mean().backward()
        out.extend(p.grad.clone() for p in model.parameters())
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, atol=1e-5)


def test_no_token_attends_across_a_sample_boundary():
    model, images, state, samples = _model_and_batch()
    lengths = [s.length for s in samples]
    layout = packed_layout(lengths, max_tokens=64)
    # the mask itself: same sample only (padding slots attend to themselves)
    mask = attention_mask(layout)[:, 0]
    doc = layout.doc
    assert torch.equal(mask, doc[:, :, None] == doc[:, None, :])
    assert (mask.sum(-1) >= 1).all()
    # behaviour: change one sample's inputs; every other sample's output stays bit-identical,
    # including the ones that share its row
    row_of = {}
    for r in range(layout.rows):
        for i in set(doc[r][doc[r] >= 0].tolist()):
            row_of[i] = r
    shared = [i for i in range(8) if sum(row_of[j] == row_of[i] for j in range(8)) > 1]
    assert shared, "the test needs a row with more than one sample"
    victim = shared[0]
    with torch.no_grad():
        before = model(images, state, samples, layout)
        state2 = state.clone()
        state2[victim] += 5.0
        images2 = [img.clone() for img in images]
        images2[0][victim] = torch.rand(3, 32, 32)
        after = model(images2, state2, samples, layout)
    others = [i for i in range(8) if i != victim]
    assert torch.equal(before[others], after[others])
    assert not torch.allclose(before[victim], after[victim])
    # gradient check through the attention alone: d out[sample i] / d v[sample j] == 0 for i != j
    q = torch.randn(layout.rows, 2, layout.row_len, 8)
    k, v = torch.randn_like(q), torch.randn_like(q).requires_grad_(True)
    o = attend(q, k, v, layout, "sdpa")
    sel = doc == victim
    o[:, :, :][sel.unsqueeze(1).expand_as(o[..., 0])].sum().backward()
    touched = v.grad.abs().sum(dim=(1, 3)) > 0  # [rows, L]
    assert touched[sel].all() and not touched[~sel].any()


def test_flex_attention_matches_sdpa():
    model, images, state, samples = _model_and_batch(B=4)
    layout = packed_layout([s.length for s in samples], max_tokens=64)
    q = torch.randn(layout.rows, 2, layout.row_len, 8)
    k, v = torch.randn_like(q), torch.randn_like(q)
    try:
        flex = attend(q, k, v, layout, "flex")
    except Exception as e:  # flex_attention needs a compiler backend on some builds
        pytest.skip(f"flex_attention is not usable on this machine: {type(e).__name__}: {str(e)[:200]}")
    assert torch.allclose(flex, attend(q, k, v, layout, "sdpa"), atol=1e-5)


def test_flash_attention_varlen_needs_a_gpu():
    from vlafeed.train.policy import flash_available, resolve_attention
    if not flash_available("cuda" if torch.cuda.is_available() else "cpu"):
        assert resolve_attention("auto", "cpu") == "sdpa"
        with pytest.raises(RuntimeError, match="flash-attn"):
            resolve_attention("flash", "cpu")
        pytest.skip("flash_attn_varlen_func needs CUDA and flash-attn (neither here): the sdpa path is tested")
    model, images, state, samples = _model_and_batch()
    model = model.cuda().half()
    layout = packed_layout([s.length for s in samples], max_tokens=64, device="cuda")
    with torch.no_grad():
        a = model([i.cuda().half() for i in images], state.cuda().half(), samples, layout)
        model.attention = "flash"
        b = model([i.cuda().half() for i in images], state.cuda().half(), samples, layout)
    assert torch.allclose(a.float(), b.float(), atol=2e-2)
