"""vlafeed.train trains a Hugging Face model (model.source: hf): a tiny random Qwen2 built from a
config mapping (AutoModelForCausalLM), at 2 ranks under FSDP2 (torch.distributed.run, gloo, CPU),
its decoder layers the FSDP2 units (taken from transformers' _no_split_modules), next-token loss
on each sample's instruction text (the default inputs); exported to safetensors that
transformers loads back. A model without _no_split_modules warns (once, rank 0) that it wraps
into one unit. Error paths: not an AutoModel class, a hub id for model.path.
"""
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

import train_models_helpers as H

transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/install-deps.sh)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

QWEN = {"model_type": "qwen2", "vocab_size": 260, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 128, "pad_token_id": 258}


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return H.sample_dataset(cli, tmp_path_factory.mktemp("train-hf") / "sample")


def write_config(tmp, sample, ckdir, steps=8):
    cfg = {"data": {"dataset": str(sample), "batch_size": 4},
           "model": {"source": "hf", "name": "AutoModelForCausalLM", "config": QWEN, "max_text_tokens": 32},
           "train": {"steps": steps, "lr": 3e-3, "warmup_steps": 1, "log_every": 1, "threads": 1,
                     "log_file": str(Path(tmp) / "hf.jsonl")},
           "checkpoint": {"dir": str(ckdir)}}
    path = Path(tmp) / "hf.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_qwen2_decoder_layers_are_fsdp_units(sample, tmp_path):
    cfg = write_config(tmp_path, sample, tmp_path / "ck")
    r = H.train(sys.executable, tmp_path, ["--config", str(cfg)])
    assert "FSDP2 (4 units)" in r.stdout, r.stdout  # 3 Qwen2DecoderLayers + the root
    assert "Qwen2ForCausalLM" in r.stdout
    assert "one unit" not in r.stderr
    losses = [float.fromhex(v) for _, v in sorted(H.losses(tmp_path / "hf.jsonl").items())]
    assert len(losses) == 8 and losses[-1] < losses[0], losses  # three instruction strings: learnable

    out = tmp_path / "export"
    r = H.train(sys.executable, tmp_path, ["export", str(tmp_path / "ck"), str(out)], procs=1)
    from safetensors.torch import load_file
    sd = load_file(str(out / "model.safetensors"))
    hf_cfg = transformers.AutoConfig.from_pretrained(str(out / "hf_config.json"))
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert any(k.startswith("model.layers.2.") for k in sd)


def _cfg(tmp_path, sample, **model):
    from vlafeed.train.config import load_config
    args = ["--data.dataset", str(sample), "--checkpoint.dir", str(tmp_path / "ck"), "--model.source", "hf"]
    for k, v in model.items():
        args += [f"--model.{k}", v if isinstance(v, str) else json.dumps(v)]
    return load_config(None, args)


def test_one_unit_warning_once_on_rank0(sample, tmp_path, monkeypatch):
    import vlafeed
    from transformers.models.qwen2 import modeling_qwen2

    from vlafeed.train import models
    meta = vlafeed.LeRobotDataset(str(sample)).meta
    cfg = _cfg(tmp_path, sample, name="AutoModelForCausalLM", config=QWEN)
    tm = models.build(cfg, meta, torch.device("cpu"))
    assert {t.__name__ for t in tm.block_types} == {"Qwen2DecoderLayer"}
    monkeypatch.setattr(modeling_qwen2.Qwen2PreTrainedModel, "_no_split_modules", None)
    with pytest.warns(UserWarning, match="wraps it into one unit"):
        tm = models.build(cfg, meta, torch.device("cpu"), is_main=True)
    assert tm.block_types == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        models.build(cfg, meta, torch.device("cpu"), is_main=False)  # other ranks stay quiet
    # the default inputs: byte tokens of the instruction, padding ignored by the loss
    batch = {"task": ["ab", "abcd"]}
    inputs = tm.inputs(batch)
    assert inputs["input_ids"].shape == (2, 6) and inputs["labels"][0, 4:].tolist() == [-100, -100]


def test_hf_errors(sample, tmp_path):
    import vlafeed

    from vlafeed.train import models
    meta = vlafeed.LeRobotDataset(str(sample)).meta
    cases = [
        (dict(name="Qwen2Model", config=QWEN), "not a transformers AutoModel"),
        (dict(name="AutoModelForCausalLM", path="Qwen/Qwen2-0.5B"), "huggingface-cli download Qwen/Qwen2-0.5B"),
        (dict(name="AutoModelForCausalLM", config={"hidden_size": 8}), "needs model_type"),
        (dict(name="AutoModelForCausalLM", config=str(tmp_path / "none.json")), "is not a file"),
    ]
    for kw, message in cases:
        with pytest.raises(models.ModelError, match=message):
            models.build(_cfg(tmp_path, sample, **kw), meta, torch.device("cpu"))
