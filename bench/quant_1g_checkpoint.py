"""A 1.2 GB random Qwen2-shaped checkpoint (bf16, 32 layers of hidden 1024 / MLP 4096, three
safetensors shards + index) for the quantizer's peak-memory check in bench/quant.md:

    python3 bench/quant_1g_checkpoint.py /tmp/q1g/in
    /usr/bin/time -v python3 -m vlafeed.quant /tmp/q1g/in /tmp/q1g/out          # Maximum resident set size
    /usr/bin/time -v python3 -c "import torch, safetensors, vlafeed.quant"      # the imports alone
"""
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/q1g/in"
import json
import os

import torch
from safetensors.torch import save_file
os.makedirs(OUT, exist_ok=True)
H, I, L = 1024, 4096, 32
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": H, "intermediate_size": I,
       "num_hidden_layers": L, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000,
       "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
json.dump(cfg, open(f"{OUT}/config.json", "w"))
g = torch.Generator().manual_seed(0)
weight_map, per_shard, total = {}, 11, 0
shards = [list(range(i, min(L, i + per_shard))) for i in range(0, L, per_shard)]
for s, layers in enumerate(shards):
    t = {}
    for l in layers:
        p = f"model.layers.{l}."
        for n, shape in [("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (H, H)), ("self_attn.v_proj", (H, H)),
                         ("self_attn.o_proj", (H, H)), ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)),
                         ("mlp.down_proj", (H, I))]:
            t[p + n + ".weight"] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        t[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    if s == 0:
        t["model.embed_tokens.weight"] = (torch.randn(32000, H, generator=g) * 0.02).to(torch.bfloat16)
    if s == len(shards) - 1:
        t["model.norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        t["lm_head.weight"] = (torch.randn(32000, H, generator=g) * 0.02).to(torch.bfloat16)
    name = f"model-{s+1:05d}-of-{len(shards):05d}.safetensors"
    save_file(t, f"{OUT}/{name}", metadata={"format": "pt"})
    for k, v in t.items():
        weight_map[k] = name
        total += v.numel() * 2
    del t
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, open(f"{OUT}/model.safetensors.index.json", "w"))
print("bytes", total)
