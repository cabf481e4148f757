#!/usr/bin/env python3
"""plot_bench.py: one PNG comparing benchmark runs.

    python3 bench/plot_bench.py RESULTS_DIR [--out bench.png]

Reads every JSON that `vlafeed bench --out-dir`, the peers
(bench/peers/*.py --out-dir) and bench/torchrun_bench.py wrote into
RESULTS_DIR and draws, per mode (single, sarm), horizontal bars of frames/s
per node (wall clock) and frames per CPU-second, with each vlafeed run's
decode limit (measured in the same run) as a tick on its bar. Needs
matplotlib (scripts/install-deps.sh installs it); `vlafeed bench` itself
does not.
"""
import argparse
import glob
import json
import os
import sys


def load(results_dir):
    runs = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict) or "results" not in d or "settings" not in d:
            continue
        runs.append(d)
    return runs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--out", default=None, help="PNG path (default RESULTS_DIR/bench.png)")
    a = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    runs = load(a.results_dir)
    if not runs:
        print(f"plot_bench: no benchmark JSON in {a.results_dir}", file=sys.stderr)
        return 1
    modes = [m for m in ("single", "sarm") if any(r["settings"].get("mode") == m for r in runs)]
    fig, axes = plt.subplots(len(modes), 2, figsize=(14, 1.2 + 0.42 * max(
        sum(1 for r in runs if r["settings"].get("mode") == m) for m in modes) * len(modes)), squeeze=False)
    for row, mode in enumerate(modes):
        sel = [r for r in runs if r["settings"].get("mode") == mode]
        sel.sort(key=lambda r: (not r["config"].startswith(("single-", "sarm-", "torchrun")),
                                -(r["results"].get("frames_per_s_node") or 0)))
        names = [r["config"] for r in sel]
        for col, (key, limit_key, label) in enumerate((("frames_per_s_node", "frames_per_s", "frames/s per node"),
                                                       ("frames_per_cpu_s", "frames_per_cpu_s",
                                                        "frames per CPU-second"))):
            ax = axes[row][col]
            vals = [r["results"].get(key) or 0 for r in sel]
            colors = ["#1f77b4" if not n.startswith("peer") else "#ff7f0e" for n in names]
            y = list(range(len(sel)))
            ax.barh(y, vals, color=colors)
            for i, r in enumerate(sel):
                lim = r.get("limit")
                if lim and lim.get(limit_key):
                    ax.plot([lim[limit_key]] * 2, [i - 0.4, i + 0.4], color="black", lw=2)
                ax.text(vals[i], i, f" {vals[i]:,.0f}", va="center", fontsize=8)
            ax.set_yticks(y)
            ax.set_yticklabels(names, fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{mode}: {label}", fontsize=10)
            ax.set_xlim(0, max(max(vals), max((r.get("limit") or {}).get(limit_key) or 0 for r in sel)) * 1.18)
    fig.suptitle("vlafeed (blue; black tick: decode limit of the same files, same run) vs peers (orange)",
                 fontsize=10)
    fig.tight_layout()
    out = a.out or os.path.join(a.results_dir, "bench.png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
