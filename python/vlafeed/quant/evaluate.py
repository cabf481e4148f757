"""Accuracy of a quantized model: held-out loss and logit error of block FP8 against the original and
against per-tensor and per-channel FP8 (the `--eval` of `vlafeed quantize HF_DIR OUT_DIR`).

The original model is loaded with transformers from the input folder (the class named by
`config.json`'s `architectures`), run on the evaluation tokens, and its logits kept as the
reference. Then the quantized layers' weights are replaced in place, one variant at a time:

- ``fp8 block`` : the codes and `weight_scale_inv` read back from the written folder, dequantized;
- ``fp8 per-channel`` / ``fp8 per-tensor`` : the original weights quantized in memory with one scale
  per output row / per matrix (the same layers; for comparison only, never written).

Every variant runs in the same dtype (float32 by default), so the numbers are the error the
stored weights carry (weights-only; activations are not quantized). Per variant: next-token cross
entropy (loss) and perplexity, the relative logit error ||logits - logits_orig|| / ||logits_orig||
over all positions, the largest absolute logit difference, and top-1 agreement with the original.

Tokens: a user file (`.npy`, or `.txt` of integers separated by white space or commas; a 2-D
array is taken as one sequence per row), else a built-in English paragraph, through the folder's
tokenizer when transformers can load one, else as its UTF-8 bytes (ids 0..255, folded into the
vocabulary when it is smaller).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from vlafeed.quant.blockfp8 import QuantError, dequantize_weight, quantize_weight
from vlafeed.quant.layers import scale_key

SAMPLE_TEXT = (
    "A robot arm learns to stack cups from a few hundred demonstrations. Each episode is a stream of "
    "camera frames, joint positions and the commands an operator gave, recorded thirty times a second. "
    "The policy reads a short window of that stream and predicts the next chunk of actions; training "
    "runs for hours on many GPUs, and the loader must keep them busy. After training, the weights are "
    "compressed so the model fits on the computer inside the robot: each linear layer is stored as "
    "eight-bit floating point numbers with one scale for every block of 128 by 128 values, while the "
    "camera encoder and the output head stay in sixteen-bit precision. Whether that is safe is decided "
    "by measurement, not by hope: the loss on held-out data and the change of the model's outputs are "
    "compared before and after, on the same inputs, with the same code. If the numbers move by less "
    "than the noise between two training runs, the smaller model ships; otherwise the layers that "
    "matter most are kept in higher precision and the test is repeated.")

VARIANTS = ("original", "fp8 block", "fp8 per-channel", "fp8 per-tensor")
MAX_REFERENCE_BYTES = 1 << 30


def load_token_file(path, vocab_size: int) -> List[torch.Tensor]:
    """Sequences of token ids from a .npy file or a text file of integers (2-D: one sequence per row)."""
    path = Path(path)
    if not path.is_file():
        raise QuantError(f"{path}: no such token file")
    if path.suffix == ".npy":
        import numpy as np
        try:
            arr = np.load(str(path), allow_pickle=False)
        except Exception as e:
            raise QuantError(f"{path}: not a readable .npy file ({e})") from None
        if arr.dtype.kind not in "iu":
            raise QuantError(f"{path}: holds {arr.dtype} values; token ids must be integers")
        t = torch.from_numpy(arr.astype("int64"))
    else:
        text = path.read_text().replace(",", " ").split()
        try:
            t = torch.tensor([int(x) for x in text], dtype=torch.long)
        except ValueError as e:
            raise QuantError(f"{path}: not a list of integers ({e})") from None
    if t.dim() == 1:
        seqs = [t]
    elif t.dim() == 2:
        seqs = list(t)
    else:
        raise QuantError(f"{path}: a 1-D or 2-D array of token ids is expected, got shape {list(t.shape)}")
    if t.numel() < 2:
        raise QuantError(f"{path}: fewer than 2 tokens")
    bad = (t < 0) | (t >= vocab_size)
    if bool(bad.any()):
        raise QuantError(f"{path}: token id {int(t[bad][0])} is outside the vocabulary [0, {vocab_size})")
    return seqs


def builtin_tokens(src_dir, vocab_size: int) -> Tuple[List[torch.Tensor], str]:
    """The built-in paragraph through the folder's tokenizer, or as bytes when there is none."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(src_dir))
        ids = tok(SAMPLE_TEXT, return_tensors="pt")["input_ids"][0]
        if len(ids) > 1 and int(ids.max()) < vocab_size:
            return [ids.long()], "built-in paragraph through the model's tokenizer"
    except Exception:  # no tokenizer files, or one transformers cannot load: fall back to bytes
        pass
    ids = torch.tensor(list(SAMPLE_TEXT.encode()), dtype=torch.long) % vocab_size
    return [ids], "built-in paragraph as UTF-8 bytes (no tokenizer)"


def split_sequences(seqs: Sequence[torch.Tensor], seq_len: int, max_tokens: int) -> List[torch.Tensor]:
    out, total = [], 0
    for s in seqs:
        s = s.reshape(-1)
        for lo in range(0, len(s), seq_len):
            piece = s[lo:lo + seq_len]
            if len(piece) < 2 or total >= max_tokens:
                continue
            piece = piece[: max_tokens - total]
            if len(piece) >= 2:
                out.append(piece)
                total += len(piece)
    if not out:
        raise QuantError("no evaluation sequence of at least 2 tokens")
    return out


def variant_weight(w: torch.Tensor, variant: str, block: int = 128) -> torch.Tensor:
    """`w` through FP8 with per-channel or per-tensor scales, dequantized to float32."""
    b = {"fp8 per-channel": "channel", "fp8 per-tensor": "tensor", "fp8 block": block}[variant]
    codes, scale = quantize_weight(w, b, "eval")
    return dequantize_weight(codes, scale, b)


def _load_model(src_dir, dtype: torch.dtype):
    try:
        import transformers
    except ImportError:
        raise QuantError("--eval needs transformers (pip install transformers accelerate)") from None
    try:
        cfg = transformers.AutoConfig.from_pretrained(str(src_dir))
    except Exception as e:
        raise QuantError(f"{src_dir}: transformers cannot read config.json ({type(e).__name__}: {e})") from None
    arch = (getattr(cfg, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    try:
        model = cls.from_pretrained(str(src_dir), dtype=dtype)
    except TypeError:  # transformers before `dtype=`
        model = cls.from_pretrained(str(src_dir), torch_dtype=dtype)
    except Exception as e:
        raise QuantError(f"{src_dir}: transformers cannot load the model for --eval "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return model.eval(), cfg


def param_map(model, keys: Sequence[str]) -> Dict[str, torch.nn.Parameter]:
    """Checkpoint key -> the model's parameter, through transformers' own key renamings when it has
    them (e.g. Qwen2-VL's `model.layers.*` -> `model.language_model.layers.*`), else by unique suffix."""
    params = dict(model.named_parameters(remove_duplicate=False))
    renamings = []
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        renamings = [r for r in get_model_conversion_mapping(model) if hasattr(r, "rename_source_key")]
    except Exception:  # older transformers: no mapping, the suffix rule below decides
        pass
    out = {}
    for k in keys:
        name = k
        for r in renamings:
            name, _ = r.rename_source_key(name)
        if name not in params:
            tail = k[len("model."):] if k.startswith("model.") else k
            cands = [n for n in params if n == k or n.endswith("." + tail)]
            if len(cands) != 1:
                raise QuantError(f"--eval: cannot tell which parameter of {type(model).__name__} checkpoint "
                                 f"tensor '{k}' is ({len(cands)} candidates)")
            name = cands[0]
        out[k] = params[name]
    return out


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids[None]).logits[0].float()


def evaluate(src_dir, quant_dir, quantized: Dict[str, Tuple[int, int]], token_file=None, seq_len: int = 512,
             max_tokens: int = 2048, dtype: torch.dtype = torch.float32, block: int = 128) -> dict:
    """Run the comparison (module docstring). `quantized` maps each quantized checkpoint key to its block;
    `quant_dir` holds the written shards. Returns the report (also what eval.json holds)."""
    from vlafeed.quant.hf import Source
    model, cfg = _load_model(src_dir, dtype)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    vocab = int(getattr(text_cfg, "vocab_size", 0) or getattr(cfg, "vocab_size", 0))
    if vocab <= 0:
        raise QuantError(f"{src_dir}: config.json gives no vocab_size")
    if token_file:
        seqs, sample = load_token_file(token_file, vocab), f"token file {token_file}"
    else:
        seqs, sample = builtin_tokens(src_dir, vocab)
    cap = max(2, MAX_REFERENCE_BYTES // (4 * vocab))
    if max_tokens > cap:
        max_tokens = cap
    seqs = split_sequences(seqs, seq_len, max_tokens)
    pmap = param_map(model, sorted(quantized))
    src, qsrc = Source(src_dir), Source(quant_dir)

    ref = [_logits(model, s) for s in seqs]
    rows = []
    for variant in VARIANTS:
        if variant != "original":
            with torch.no_grad():
                for k, p in pmap.items():
                    if variant == "fp8 block":
                        w = dequantize_weight(qsrc.read(k), qsrc.read(scale_key(k)), quantized[k])
                    else:
                        w = variant_weight(src.read(k), variant, block)
                    p.copy_(w.to(p.dtype))
        loss_sum, n_pred, d2, r2, max_abs, agree = 0.0, 0, 0.0, 0.0, 0.0, 0
        for s, r in zip(seqs, ref):
            lg = r if variant == "original" else _logits(model, s)
            loss_sum += float(F.cross_entropy(lg[:-1], s[1:], reduction="sum"))
            n_pred += len(s) - 1
            diff = lg - r
            d2 += float(diff.pow(2).sum())
            r2 += float(r.pow(2).sum())
            max_abs = max(max_abs, float(diff.abs().max()))
            agree += int((lg.argmax(-1) == r.argmax(-1)).sum())
        loss = loss_sum / n_pred
        rows.append({"variant": variant, "loss": loss, "perplexity": math.exp(min(loss, 700.0)),
                     "rel_logit_error": (d2 / r2) ** 0.5 if r2 > 0 else 0.0, "max_abs_logit_diff": max_abs,
                     "top1_agreement": agree / sum(len(s) for s in seqs)})
    src.close()
    qsrc.close()
    base = rows[0]["loss"]
    for r in rows:
        r["loss_delta"] = r["loss"] - base
    return {"model_class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""), "sample": sample,
            "sequences": len(seqs), "tokens": sum(len(s) for s in seqs), "seq_len": seq_len,
            "layers_quantized": len(quantized), "weights_only": True, "variants": rows}


def markdown_table(report: dict) -> str:
    """The report as a Markdown section (the README.md of the output folder)."""
    lines = ["## FP8 accuracy (vlafeed quantize --eval)", "",
             f"{report['model_class']}, {report['layers_quantized']} linear layers quantized; "
             f"{report['tokens']} tokens in {report['sequences']} sequence(s) ({report['sample']}); "
             f"weights dequantized, {report['dtype']} compute (weight error only).", "",
             "| variant | loss | loss delta | rel. logit error | max abs logit diff | top-1 agreement |",
             "|---|---|---|---|---|---|"]
    for r in report["variants"]:
        lines.append(f"| {r['variant']} | {r['loss']:.4f} | {r['loss_delta']:+.4f} | {r['rel_logit_error']:.5f} | "
                     f"{r['max_abs_logit_diff']:.4f} | {100 * r['top1_agreement']:.1f}% |")
    return "\n".join(lines) + "\n"


def write_report(out_dir, report: dict, src_readme: Optional[Path] = None) -> None:
    """eval.json, and README.md = the source's README (if any) with the table appended."""
    out_dir = Path(out_dir)
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    head = ""
    if src_readme is not None and src_readme.is_file():
        head = src_readme.read_text().rstrip() + "\n\n"
    (out_dir / "README.md").write_text(head + markdown_table(report))
