"""The command line: python -m vlafeed.quant, vlafeed quantize."""
from __future__ import annotations

import argparse
import sys
import warnings

import torch

from vlafeed.quant.blockfp8 import DEFAULT_SKIP, Block, QuantError
from vlafeed.quant.checkpoint import load_state_dict, quantize_state_dict, save_quantized


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="vlafeed quantize",
        description="Block-wise FP8 (float8_e4m3fn) post-training quantization of a checkpoint's linear weights.",
        epilog="Output: OUT (safetensors: <layer>.weight codes + <layer>.weight_scale float32 beside each quantized "
               "weight, every other tensor unchanged) and OUT.json (summary: layers quantized/skipped, bytes "
               "before/after, per-layer max/mean relative error). Default skips (vision encoder): "
               + ", ".join(DEFAULT_SKIP) + ". Exit status: 0 ok, 1 bad input (the file/layer is named), 2 usage.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="torch .pt (a state_dict, or a dict with it under 'model' as examples/train_policy.py "
                        "writes) or .safetensors")
    p.add_argument("out", metavar="OUT", help="output .safetensors file")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fp8-block", type=int, default=128, metavar="N",
                   help="block size: one float32 scale per NxN block of each weight (default 128)")
    g.add_argument("--per-tensor", action="store_true", help="baseline: one scale per weight matrix")
    g.add_argument("--per-channel", action="store_true", help="baseline: one scale per output channel (row)")
    p.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                   help="keep layers matching this glob in high precision (repeatable); matched against the layer "
                        "path, its prefixes and each dotted component. A pattern matching nothing is warned about")
    p.add_argument("--no-default-skip", action="store_true",
                   help="quantize the vision encoder too (the default skip list is not applied)")
    p.add_argument("--rest-dtype", choices=["keep", "bfloat16", "float16", "float32"], default="keep",
                   help="dtype of the tensors left unquantized (default: as in the checkpoint)")
    p.add_argument("--summary", default=None, metavar="FILE", help="summary JSON path (default OUT.json)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    args = p.parse_args(argv)
    if args.fp8_block < 1:
        p.error("--fp8-block must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    block: Block = "tensor" if args.per_tensor else "channel" if args.per_channel else args.fp8_block
    try:
        sd = load_state_dict(args.checkpoint)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = quantize_state_dict(sd, block, args.skip, not args.no_default_skip, source=args.checkpoint,
                                      rest_dtype=None if args.rest_dtype == "keep" else getattr(torch, args.rest_dtype))
        for w in res.warnings:
            print(f"vlafeed quantize: warning: {w}", file=sys.stderr)
        if not res.summary["layers_quantized"]:
            raise QuantError(f"{args.checkpoint}: no linear weight left to quantize "
                             f"({res.summary['layers_skipped']} skipped)")
        out, summ = save_quantized(res, args.out, args.summary)
    except QuantError as e:
        print(f"vlafeed quantize: {e}", file=sys.stderr)
        return 1
    s = res.summary
    if not args.quiet:
        print(f"quantized {s['layers_quantized']} linear weight(s), skipped {s['layers_skipped']}; "
              f"{s['bytes_before']} -> {s['bytes_after']} bytes ({100 * s['size_ratio']:.1f}%, "
              f"{100 * s['size_ratio_vs_bf16']:.1f}% of bf16); relative error max {s['max_rel_error']:.4f} "
              f"mean {s['mean_rel_error']:.4f}")
        print(f"wrote {out} and {summ}")
    return 0
