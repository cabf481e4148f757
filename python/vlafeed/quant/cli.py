"""The command line: python -m vlafeed.quant, vlafeed quantize."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from pathlib import Path

import torch

from vlafeed.quant.blockfp8 import DEFAULT_SKIP, LEGACY_FORMAT, Block, QuantError
from vlafeed.quant.checkpoint import convert_legacy, load_state_dict, quantize_state_dict, save_quantized

EPILOG = """\
Folder mode (INPUT is a Hugging Face model folder): OUTPUT is a folder in the DeepSeek-V3 /
transformers FineGrainedFP8 layout that vLLM, SGLang, TensorRT-LLM and transformers load:
<module>.weight as float8_e4m3fn codes, <module>.weight_scale_inv float32 per 128x128 block
(W = codes * scale_inv), config.json with quantization_config {"quant_method": "fp8",
"weight_block_size": [N, N], "activation_scheme": "dynamic", "modules_to_not_convert": [...]},
shards of at most --max-shard-size with model.safetensors.index.json, the folder's other files
(tokenizer, processor, generation config) copied, and vlafeed_quant.json (the summary). Input:
model.safetensors, its shards and index, or pytorch_model.bin (read with weights_only=True).
Tensors are streamed one row band at a time: peak memory stays far below one shard.

Single-file mode (INPUT is a .pt or .safetensors file, e.g. examples/train_policy.py's
checkpoint): OUTPUT is one safetensors file with the same naming (<layer>.weight codes,
<layer>.weight_scale_inv) and OUT.json (the summary). A file in vlafeed's old private layout
(header format "vlafeed-fp8", scales under <layer>.weight_scale) given as INPUT is converted to
the standard naming; vlafeed.quant.load_quantized converts it on load as well.

Kept in high precision by default (--no-default-skip to quantize them): """ + ", ".join(DEFAULT_SKIP) + """;
embeddings and every tensor that is not a 2-D weight (norms, biases, convolutions) are never
quantized. Exit status: 0 ok, 1 bad input (the file/layer is named), 2 usage."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="vlafeed quantize",
        usage="%(prog)s HF_DIR OUT_DIR [--fp8-block N] [--skip PATTERN] [--only PATTERN] [--max-shard-size SIZE]\n"
              "                        [--eval] [--eval-tokens FILE] [options]      (folder mode)\n"
              "       %(prog)s CHECKPOINT OUT [--fp8-block N | --per-tensor | --per-channel] [options]"
              "      (single-file mode)",
        description="Block-wise FP8 (float8_e4m3fn) post-training quantization of a model's linear weights.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="INPUT",
                   help="a Hugging Face model folder (config.json + safetensors shards or pytorch_model.bin), "
                        "or a single .pt (a state_dict, or a dict with it under 'model') / .safetensors file")
    p.add_argument("out", metavar="OUTPUT", help="output folder (folder mode) or .safetensors file (single-file mode)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fp8-block", type=int, default=128, metavar="N",
                   help="block size: one float32 scale per NxN block of each weight (default 128)")
    g.add_argument("--per-tensor", action="store_true", help="single-file mode baseline: one scale per weight matrix")
    g.add_argument("--per-channel", action="store_true",
                   help="single-file mode baseline: one scale per output channel (row)")
    p.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                   help="keep layers matching this glob in high precision (repeatable); matched against the layer "
                        "path, its prefixes and each dotted component. A pattern matching nothing is warned about")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="quantize only the linear layers matching this glob (repeatable; same matching as --skip; "
                        "--skip and the default skips still apply)")
    p.add_argument("--skip-ragged", action="store_true",
                   help="folder mode: keep layers whose shape is not a multiple of the block in high precision "
                        "(transformers' CPU dequantization misreads ragged edge blocks)")
    p.add_argument("--no-default-skip", action="store_true",
                   help="also quantize the vision encoder, lm_head and *norm* layers (the default skip list)")
    p.add_argument("--rest-dtype", choices=["keep", "bfloat16", "float16", "float32"], default="keep",
                   help="dtype of the tensors left unquantized (default: as in the checkpoint)")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="folder mode: largest output shard, e.g. 5GB (default), 500MB, 2GiB")
    p.add_argument("--eval", action="store_true",
                   help="folder mode: measure held-out loss and logit error of block FP8 vs per-tensor vs "
                        "per-channel FP8 vs the original (needs transformers); writes eval.json and README.md "
                        "into OUTPUT")
    p.add_argument("--eval-tokens", metavar="FILE", default=None,
                   help="token ids for --eval: .npy or .txt of integers (default: a built-in paragraph through "
                        "the model's tokenizer, or as bytes); implies --eval")
    p.add_argument("--eval-seq-len", type=int, default=512, metavar="N", help="--eval sequence length (default 512)")
    p.add_argument("--eval-max-tokens", type=int, default=2048, metavar="N",
                   help="--eval: at most this many tokens (default 2048)")
    p.add_argument("--eval-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="--eval compute dtype (default float32: the error of the weights alone)")
    p.add_argument("--overwrite", action="store_true", help="folder mode: replace an existing non-empty OUTPUT")
    p.add_argument("--summary", default=None, metavar="FILE",
                   help="summary JSON path (default OUTPUT.json in single-file mode; folder mode always writes "
                        "OUTPUT/vlafeed_quant.json and copies it here too)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    args = p.parse_args(argv)
    if args.fp8_block < 1:
        p.error("--fp8-block must be >= 1")
    if args.eval_tokens:
        args.eval = True
    folder = Path(args.checkpoint).is_dir()
    if folder and (args.per_tensor or args.per_channel):
        p.error("--per-tensor / --per-channel are single-file baselines; the Hugging Face fp8 format has one "
                "block shape (--eval compares them without writing them)")
    if not folder and args.eval:
        p.error("--eval needs a Hugging Face model folder as INPUT (it runs the model through transformers)")
    if args.eval_seq_len < 2 or args.eval_max_tokens < 2:
        p.error("--eval-seq-len and --eval-max-tokens must be >= 2")
    return args


def _is_legacy_file(path: str) -> bool:
    if not path.endswith(".safetensors"):
        return False
    try:
        from safetensors import safe_open
        with safe_open(path, framework="pt") as f:
            return (f.metadata() or {}).get("format") == LEGACY_FORMAT
    except Exception:  # unreadable: the normal path reports it
        return False


def _rest_dtype(args):
    return None if args.rest_dtype == "keep" else getattr(torch, args.rest_dtype)


def _print_summary(s: dict, where: str) -> None:
    print(f"quantized {s['layers_quantized']} linear weight(s), skipped {s['layers_skipped']}; "
          f"{s['bytes_before']} -> {s['bytes_after']} bytes ({100 * s['size_ratio']:.1f}%, "
          f"{100 * s['size_ratio_vs_bf16']:.1f}% of bf16); relative error max {s['max_rel_error']:.4f} "
          f"mean {s['mean_rel_error']:.4f}")
    print(f"wrote {where}")


def _folder(args) -> int:
    from vlafeed.quant.hf import quantize_folder
    report = {}

    def after_write(tmp, items, summary):
        if not args.eval:
            return
        from vlafeed.quant.evaluate import evaluate, write_report
        quantized = {k: tuple(v["block"]) for k, v in summary["quantized"].items()}
        rep = evaluate(args.checkpoint, tmp, quantized, args.eval_tokens, args.eval_seq_len, args.eval_max_tokens,
                       getattr(torch, args.eval_dtype), args.fp8_block)
        write_report(tmp, rep, Path(args.checkpoint) / "README.md")
        summary["eval"] = rep
        report.update(rep)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = quantize_folder(args.checkpoint, args.out, args.fp8_block, args.skip, args.only, not args.no_default_skip,
                            args.max_shard_size, _rest_dtype(args), args.overwrite, after_write, args.skip_ragged)
    for p in s["unmatched_skip_patterns"]:
        print(f"vlafeed quantize: warning: skip pattern '{p}' matches no linear weight in {args.checkpoint}",
              file=sys.stderr)
    for p in s["unmatched_only_patterns"]:
        print(f"vlafeed quantize: warning: --only pattern '{p}' matches no linear weight in {args.checkpoint}",
              file=sys.stderr)
    if s["ragged_layers"]:
        print(f"vlafeed quantize: warning: {len(s['ragged_layers'])} quantized layer(s) have a dimension that is not "
              f"a multiple of {args.fp8_block} (e.g. '{s['ragged_layers'][0]}'); they are stored with ragged edge "
              f"blocks as the format defines, but transformers' CPU dequantization (checked with 5.24) infers the "
              f"block from the scale grid and misreads them; use --skip-ragged for a checkpoint loaded that way",
              file=sys.stderr)
    if args.summary:
        shutil.copyfile(Path(args.out) / "vlafeed_quant.json", args.summary)
    if not args.quiet:
        _print_summary(s, f"{args.out} ({len(s['shards'])} shard(s), config.json with quantization_config, "
                          f"{len(s['copied_files'])} other file(s) copied)")
        if report:
            from vlafeed.quant.evaluate import markdown_table
            print(markdown_table(report), end="")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    block: Block = "tensor" if args.per_tensor else "channel" if args.per_channel else args.fp8_block
    try:
        if Path(args.checkpoint).is_dir():
            return _folder(args)
        if _is_legacy_file(args.checkpoint):
            out, summ = convert_legacy(args.checkpoint, args.out, args.summary)
            if not args.quiet:
                print(f"converted {args.checkpoint} from the old '{LEGACY_FORMAT}' layout (scales renamed to "
                      f"'<weight>_scale_inv', values unchanged); wrote {out} and {summ}")
            return 0
        sd = load_state_dict(args.checkpoint)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = quantize_state_dict(sd, block, args.skip, not args.no_default_skip, source=args.checkpoint,
                                      rest_dtype=_rest_dtype(args), only=args.only)
        for w in res.warnings:
            print(f"vlafeed quantize: warning: {w}", file=sys.stderr)
        if not res.summary["layers_quantized"]:
            raise QuantError(f"{args.checkpoint}: no linear weight left to quantize "
                             f"({res.summary['layers_skipped']} skipped)")
        out, summ = save_quantized(res, args.out, args.summary)
    except QuantError as e:
        print(f"vlafeed quantize: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        _print_summary(res.summary, f"{out} and {summ}")
    return 0


def summary_of(path) -> dict:
    """The summary JSON of an output folder (vlafeed_quant.json) or file (OUT.json)."""
    p = Path(path)
    return json.loads((p / "vlafeed_quant.json" if p.is_dir() else p.with_name(p.name + ".json")).read_text())
