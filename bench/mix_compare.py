"""vlafeed.Mix against VLA Foundry's documented mixing, by index arithmetic alone.

    python3 bench/mix_compare.py [--json]

No data is read. Both sides are computed from what decides which dataset
each sample comes from:

- vlafeed.Mix: the mixing order (``vlafeed.mix.window_order``), the same
  function Mix itself runs; per rank, and the same on every rank.
- VLA Foundry (TRI-ML/vla_foundry, as described in
  ../shared/docs/webdataset-vla-foundry.md §3): a small model written from
  that description. Per checkpoint window every dataset gets a sample budget
  ceil(w_i * S / sum w); shards are taken from a seeded permutation of its
  manifest until the budget is covered AND at least W = num_workers x
  world_size shards are taken (wrapping into new permutations, seed + 1,
  when allowed), then the list is cut to a multiple of W. Shard j goes to
  rank j mod R, worker (j div R) mod num_workers. Every worker batches each
  dataset on its own (per-rank batch B = global batch / R, partial batches
  dropped) and a RandomMix per worker, with probabilities proportional to
  the selected sample totals, picks whole batches until all are used. The
  window ends when the first rank runs dry, training when the step budget is
  reached. Simplifications, stated: the per-window shuffle of the shard URL
  list is left out (it moves shards between workers, which changes nothing
  here where shards are equal), and workers are taken round-robin (their
  in_order=False default makes that order nondeterministic).

The example: weights 0.7 / 0.3 over 1,000,000 training samples, VLA
Foundry's default 5 checkpoint windows (200,000 samples each), shards of
8192 samples (the size in VLA Foundry's own shard-selection test), global
batch 320, 4 workers per rank, on 8 ranks and on 1.
"""
import argparse
import json
import math
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a test loads this file by path
import _inplace  # noqa: E402  (bench/_inplace.py: the in-place build if there is one, else the installed package)
_inplace.use()

from vlafeed.mix import normalized_weights, window_order  # noqa: E402


# ------------------------------------------------------------ VLA Foundry model

def permutation(n, seed):
    """The shard order for one pass: numpy's default_rng(seed) shuffling the manifest list."""
    order = list(range(n))
    np.random.default_rng(seed).shuffle(order)
    return order


def select_shards(sizes, cursor, seed, needed, workers_total, allow_multiple_epochs=True):
    """Shard selection for one dataset and one window, as described in the doc (§3.2).
    sizes: num_sequences per manifest line. Returns (selected manifest indices, cursor', seed')."""
    n = len(sizes)
    per_epoch = sum(sizes)
    sel, got = [], 0

    def done():
        return got >= needed and len(sel) >= workers_total

    perm = permutation(n, seed)
    for k in range(cursor, n):
        sel.append(perm[k])
        got += sizes[perm[k]]
        if done():
            break
    if not done():
        if not allow_multiple_epochs:
            raise IndexError("not enough shards left in this pass and multiple epochs are not allowed")
        bulk = (needed - got) // per_epoch
        if workers_total - len(sel) > bulk * n:
            bulk = max(bulk, math.ceil((workers_total - len(sel)) / n))
        seed_tmp = seed
        for _ in range(bulk):
            seed_tmp += 1
            for j in permutation(n, seed_tmp):
                sel.append(j)
                got += sizes[j]
        if not done():
            seed_tmp += 1
            for j in permutation(n, seed_tmp):
                sel.append(j)
                got += sizes[j]
                if done():
                    break
    sel = sel[:(len(sel) // workers_total) * workers_total]
    cursor2 = cursor + len(sel)
    return sel, cursor2 % n, seed + cursor2 // n


def vla_foundry_run(manifests, weights, total_samples, num_checkpoints, global_batch, world_size, num_workers,
                    seed=42):
    """Per training step, for each rank, the dataset its whole batch came from; plus per-window facts."""
    wsum = sum(weights)
    per_window = total_samples // num_checkpoints
    needed = [math.ceil(w * per_window / wsum) for w in weights]
    total_steps = total_samples // global_batch
    B = global_batch // world_size
    W = num_workers * world_size
    cursors = [0] * len(manifests)
    seeds = [seed] * len(manifests)
    steps, windows, k = [], [], 0
    while len(steps) < total_steps:
        selected = []
        for d, sizes in enumerate(manifests):
            sel, cursors[d], seeds[d] = select_shards(sizes, cursors[d], seeds[d], needed[d], W)
            selected.append(sel)
        totals = [sum(manifests[d][j] for j in sel) for d, sel in enumerate(selected)]
        rank_batches = []
        for r in range(world_size):
            per_worker = []
            for wk in range(num_workers):
                left = []
                for d, sel in enumerate(selected):
                    mine = [j for pos, j in enumerate(sel) if pos % world_size == r
                            and (pos // world_size) % num_workers == wk]
                    left.append(sum(manifests[d][j] for j in mine) // B)
                rng = random.Random(seed + k * world_size * num_workers + r * num_workers + wk)
                seq = []
                while any(left):        # RandomMix(longest=True): draw, drop exhausted sources
                    live = [d for d in range(len(left)) if left[d]]
                    p = np.array([totals[d] for d in live], dtype=np.float64)
                    c = np.cumsum(p / p.sum())
                    d = live[min(int(np.searchsorted(c, rng.random())), len(live) - 1)]
                    seq.append(d)
                    left[d] -= 1
                per_worker.append(seq)
            order = []
            for t in range(max(len(s) for s in per_worker)):    # workers round-robin
                order.extend(s[t] for s in per_worker if t < len(s))
            rank_batches.append(order)
        n_steps = min(min(len(o) for o in rank_batches), total_steps - len(steps))
        steps.extend([o[t] for o in rank_batches] for t in range(n_steps))
        windows.append({"needed": needed, "selected_samples": totals, "selected_shards": [len(s) for s in selected],
                        "steps": n_steps, "samples": n_steps * global_batch,
                        "dropped_at_window_end": sum(len(o) - n_steps for o in rank_batches) * B})
        k += 1
    return np.asarray(steps, dtype=np.int64), windows, B


# ----------------------------------------------------------------- Mix side

def mix_stream(weights, window, seed, samples):
    """Dataset index of every sample one rank's Mix deals (samples a multiple of window)."""
    fr = normalized_weights(weights)
    return np.concatenate([window_order(fr, window, seed, w)[1] for w in range(samples // window)])


# ------------------------------------------------------------------- report

def compare(weights=(0.7, 0.3), total=1_000_000, num_checkpoints=5, global_batch=320, world_size=8,
            num_workers=4, shards=(200, 200), shard_size=8192, mix_window=1000, seed=42):
    w0 = weights[0] / sum(weights)
    per_window = total // num_checkpoints
    manifests = [[shard_size] * n for n in shards]
    steps, windows, B = vla_foundry_run(manifests, list(weights), total, num_checkpoints, global_batch,
                                        world_size, num_workers, seed)
    # VLA Foundry: per step, the global batch is world_size per-rank batches of B, each from one dataset
    a_per_step = (steps == 0).sum(axis=1) * B
    n_vla = len(steps) * global_batch
    cum_a = np.cumsum(a_per_step)
    cum_n = np.arange(1, len(steps) + 1) * global_batch
    vla = {"samples": int(n_vla), "dataset_samples": [int(cum_a[-1]), int(n_vla - cum_a[-1])],
           "share0": float(cum_a[-1] / n_vla),
           "max_prefix_count_dev": float(np.abs(cum_a - w0 * cum_n).max()),
           "max_prefix_share_dev": float(np.abs(cum_a / cum_n - w0).max()),
           "batch_share0_range": [float(a_per_step.min() / global_batch), float(a_per_step.max() / global_batch)],
           "single_dataset_global_batches": int(np.sum((a_per_step == 0) | (a_per_step == global_batch))),
           "steps": int(len(steps)), "windows": windows}
    # Mix: every rank deals total / world_size samples from the same order
    per_rank = total // world_size
    rank_budget = per_window // world_size
    stream = mix_stream(weights, mix_window, seed, per_rank)
    is0 = (stream == 0).astype(np.int64)
    c = np.cumsum(is0)
    n = np.arange(1, len(stream) + 1)
    rb = global_batch // world_size
    batch0 = is0.reshape(-1, rb).sum(axis=1) * world_size      # every rank holds the same order
    cw = is0.reshape(-1, rank_budget).sum(axis=1) * world_size
    # prefixes inside every mixing window (the window restarts the count)
    inwin = is0.reshape(-1, mix_window).cumsum(axis=1)
    ideal = w0 * np.arange(1, mix_window + 1)
    mix = {"samples": int(len(stream) * world_size),
           "dataset_samples": [int(c[-1] * world_size), int((len(stream) - c[-1]) * world_size)],
           "share0": float(c[-1] / len(stream)),
           "per_checkpoint_window": [[int(x), int(rank_budget * world_size - x)] for x in cw],
           "max_prefix_count_dev": float(np.abs(c - w0 * n).max() * world_size),
           "max_window_prefix_count_dev_per_rank": float(np.abs(inwin - ideal).max()),
           "max_prefix_share_dev": float(np.abs(c[rb - 1:] / n[rb - 1:] - w0).max()),
           "batch_share0_range": [float(batch0.min() / global_batch), float(batch0.max() / global_batch)],
           "single_dataset_global_batches": int(np.sum((batch0 == 0) | (batch0 == global_batch))),
           "window": mix_window, "samples_per_window_per_rank": rank_budget}
    return {"config": {"weights": list(weights), "total_samples": total, "num_checkpoints": num_checkpoints,
                       "samples_per_checkpoint": per_window, "global_batch": global_batch,
                       "world_size": world_size, "num_workers": num_workers, "shards": list(shards),
                       "shard_size": shard_size, "seed": seed}, "vla_foundry": vla, "mix": mix}


def doc_examples():
    """The worked examples of the doc's §3.2, through the model."""
    out = {}
    sel, cur, sd = select_shards([8192] * 200, 0, 123, 500_000, 32)
    out["repo_test"] = {"shards": len(sel), "samples": 8192 * len(sel), "cursor": cur, "seed_delta": sd - 123}
    sel, cur, sd = select_shards([100] * 1000, 0, 42, 200_000, 96)
    out["multi_epoch"] = {"shards": len(sel), "samples": 100 * len(sel), "cursor": cur, "seed_delta": sd - 42}
    sel, cur, sd = select_shards([100] * 10, 0, 42, 1000, 96)
    out["small_dataset"] = {"shards": len(sel), "samples": 100 * len(sel), "cursor": cur, "seed_delta": sd - 42}
    try:
        select_shards([100] * 10, 0, 42, 1000, 96, allow_multiple_epochs=False)
        out["small_dataset_single_epoch"] = "selected"
    except IndexError:
        out["small_dataset_single_epoch"] = "IndexError"
    return out


def table(results):
    lines = ["| | requested | VLA Foundry (model) | vlafeed.Mix |", "|---|---|---|---|"]
    for r in results:
        cfg, v, m = r["config"], r["vla_foundry"], r["mix"]
        w0 = cfg["weights"][0] / sum(cfg["weights"])
        tag = f"**{cfg['world_size']} rank(s) x {cfg['num_workers']} workers**"
        lines.append(f"| {tag}: samples of dataset 0 / 1 | {round(w0 * cfg['total_samples']):,} / "
                     f"{round((1 - w0) * cfg['total_samples']):,} | {v['dataset_samples'][0]:,} / "
                     f"{v['dataset_samples'][1]:,} | {m['dataset_samples'][0]:,} / {m['dataset_samples'][1]:,} |")
        lines.append(f"| share of dataset 0 | {w0:.3f} | {v['share0']:.4f} | {m['share0']:.4f} |")
        win = v["windows"][0]
        lines.append(f"| window 0: budget vs selected samples | {cfg['samples_per_checkpoint']:,} "
                     f"({win['needed'][0]:,} + {win['needed'][1]:,}) | "
                     f"{sum(win['selected_samples']):,} ({win['selected_samples'][0]:,} + "
                     f"{win['selected_samples'][1]:,}; {win['selected_shards'][0]} + {win['selected_shards'][1]} shards), "
                     f"{len(v['windows'])} windows for the run | exactly {cfg['samples_per_checkpoint']:,} "
                     f"({m['per_checkpoint_window'][0][0]:,} + {m['per_checkpoint_window'][0][1]:,}) in each of "
                     f"{len(m['per_checkpoint_window'])} |")
        lines.append(f"| max \\|count0 - {w0} n\\| over prefixes (samples) | 0 | {v['max_prefix_count_dev']:,.0f} | "
                     f"{m['max_prefix_count_dev']:.1f} (< 1 per rank; {m['max_window_prefix_count_dev_per_rank']:.2f} "
                     f"inside any window) |")
        lines.append(f"| max \\|share0 - {w0}\\| over prefixes >= one batch | 0 | {v['max_prefix_share_dev']:.3f} | "
                     f"{m['max_prefix_share_dev']:.4f} |")
        lines.append(f"| share of dataset 0 in one global batch (min - max) | {w0} | "
                     f"{v['batch_share0_range'][0]:.3f} - {v['batch_share0_range'][1]:.3f} | "
                     f"{m['batch_share0_range'][0]:.4f} - {m['batch_share0_range'][1]:.4f} |")
        lines.append(f"| global batches all from one dataset | 0 | {v['single_dataset_global_batches']:,} of "
                     f"{v['steps']:,} | {m['single_dataset_global_batches']} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = [compare(world_size=8), compare(world_size=1)]
    ex = doc_examples()
    if args.json:
        print(json.dumps({"runs": results, "doc_examples": ex}, indent=1))
        return
    print(table(results))
    print()
    print("Doc §3.2 worked examples through the model:")
    for k, v in ex.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
