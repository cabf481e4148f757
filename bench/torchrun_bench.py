#!/usr/bin/env python3
"""torchrun_bench.py: data-loading throughput per node with N ranks on one
machine (one process per GPU, as torchrun starts them).

    torchrun --standalone --nproc_per_node=N bench/torchrun_bench.py DATASET
        [--mode single|sarm] [--loader map|stream|pool] [--batch-size 64] [--num-batches 50]
        [--threads T] [--format float32|uint8] [--gpu] [--out-dir DIR]

Each rank opens its own vlafeed.Loader (rank and world size from torchrun's
environment, so the ranks read disjoint slices of the epoch) with T engine
threads (default: cores / local ranks, so the node is not oversubscribed),
waits at a barrier, then pulls --num-batches batches as a training loop
would. With --gpu and a CUDA device, every tensor of the batch is copied to
the rank's GPU (pinned staging is not used: the batch memory is the
engine's) and the copy is synchronised before the next batch; without a
device the copy is skipped and the JSON says why.

Rank 0 gathers every rank's figures (torch.distributed, gloo) and writes
torchrun-<mode>-<loader>-n<N>.json: frames_per_s_node is the SUM over ranks
of each rank's frames / its wall time (the node's throughput), next to the
aggregate total frames / slowest rank's wall time, CPU seconds of all ranks
and frames per CPU-second.
"""
import argparse
import json
import os
import resource
import sys
import time

import _inplace  # bench/_inplace.py: the in-place build if there is one, else the installed package

_inplace.use()

SARM_DELTAS_S = [float(s) for s in range(-7, 1)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--mode", choices=["single", "sarm"], default="single")
    ap.add_argument("--loader", choices=["map", "stream", "pool"], default="map")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-batches", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--format", choices=["float32", "uint8"], default="float32")
    ap.add_argument("--gpu", action="store_true", help="copy every batch to this rank's CUDA device")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir")
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    import vlafeed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    cores = os.cpu_count() or 1
    threads = a.threads or max(1, cores // local_world)
    torch.set_num_threads(1)  # the ranks' own torch ops must not compete with the engine threads

    device, gpu_reason = None, None
    if a.gpu:
        if torch.cuda.is_available():
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        else:
            gpu_reason = "no CUDA device (torch.cuda.is_available() is False)"
    else:
        gpu_reason = "not requested (--gpu)"

    ds = vlafeed._native.Dataset(os.fspath(a.root), None)
    cameras = list(ds.camera_keys)
    deltas = {c: SARM_DELTAS_S for c in cameras} if a.mode == "sarm" else None
    if world > 1:
        dist.barrier()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    loader = vlafeed.Loader(ds, mode=a.loader, batch_size=a.batch_size, seed=a.seed, rank=rank, world_size=world,
                            threads=threads, delta_timestamps=deltas, image_format=a.format)
    frames = samples = batches = 0
    first = None
    epoch = 0
    warmup = loader.stats()["window"] + 2  # steady state: once every batch buffer exists
    steady = None  # (time, cpu, frames) at the start of the steady state
    while batches < a.num_batches:
        for batch in loader:
            n = len(batch["index"])
            per_sample = 0
            for c in cameras:
                t = batch[c]
                per_sample += t.numel() // max(1, n * t.shape[-1] * t.shape[-2] * t.shape[-3])
            if device is not None:
                for v in batch.values():
                    if isinstance(v, torch.Tensor):
                        v.to(device, non_blocking=False)
                torch.cuda.synchronize(device)
            del batch
            frames += n * per_sample
            samples += n
            batches += 1
            if batches == warmup and a.num_batches >= 2 * warmup:
                ru = resource.getrusage(resource.RUSAGE_SELF)
                steady = (time.monotonic(), ru.ru_utime + ru.ru_stime, frames)
            if first is None:
                first = time.monotonic() - t0
            if batches >= a.num_batches:
                break
        else:
            epoch += 1
            loader.set_epoch(epoch)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    stats = loader.stats()
    loader.close()
    steady_fps = steady_fpc = None
    if steady:
        steady_fps = (frames - steady[2]) / (t0 + wall - steady[0])
        steady_fpc = (frames - steady[2]) / ((r1.ru_utime + r1.ru_stime) - steady[1])
    mine = {"rank": rank, "frames": frames, "samples": samples, "batches": batches, "wall_s": wall,
            "steady_frames_per_s": steady_fps, "steady_frames_per_cpu_s": steady_fpc,
            "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), "first_batch_s": first,
            "peak_rss_mb": r1.ru_maxrss / 1024.0, "threads": threads,
            "frames_decoded": stats.get("frames_decoded"), "frames_assembled": stats.get("frames_delivered")}
    ranks = [None] * world
    if world > 1:
        dist.all_gather_object(ranks, mine)
        dist.destroy_process_group()
    else:
        ranks = [mine]
    if rank != 0:
        return 0
    node_fps = sum(r["frames"] / r["wall_s"] for r in ranks)
    total_frames = sum(r["frames"] for r in ranks)
    cpu = sum(r["cpu_s"] for r in ranks)
    dec = sum(r["frames_decoded"] or 0 for r in ranks)
    asm = sum(r["frames_assembled"] or 0 for r in ranks)
    doc = {
        "schema": "vlafeed-bench-torchrun/1",
        "config": f"torchrun-{a.mode}-{a.loader}-n{world}",
        "settings": {"mode": a.mode, "loader": a.loader, "batch_size": a.batch_size, "num_batches": a.num_batches,
                     "ranks": world, "threads_per_rank": threads, "image_format": a.format},
        "machine": {"cores": cores, "loadavg_before": list(os.getloadavg())},
        "results": {
            "frames_per_s_node": node_fps,
            "frames_per_s_aggregate": total_frames / max(r["wall_s"] for r in ranks),
            "frames_per_cpu_s": total_frames / cpu if cpu > 0 else None,
            "samples_per_s": sum(r["samples"] / r["wall_s"] for r in ranks),
            "frames": total_frames, "cpu_s": cpu, "wallclock_s": max(r["wall_s"] for r in ranks),
            "first_batch_latency_s": max(r["first_batch_s"] or 0 for r in ranks),
            "decoded_per_emitted": dec / asm if asm else None,
            "peak_rss_mb": sum(r["peak_rss_mb"] for r in ranks),
            "steady_state": None if any(r["steady_frames_per_s"] is None for r in ranks) else {
                "frames_per_s_node": sum(r["steady_frames_per_s"] for r in ranks),
                "frames_per_cpu_s": sum(r["frames"] for r in ranks) / sum(
                    r["frames"] / r["steady_frames_per_cpu_s"] for r in ranks)},
            "per_rank": ranks,
        },
        "gpu_copy": {"done": device is not None, "reason": None if device is not None else gpu_reason},
    }
    if a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
        with open(os.path.join(a.out_dir, doc["config"] + ".json"), "w") as f:
            json.dump(doc, f, indent=2)
    r = doc["results"]
    st = r["steady_state"] or {}
    print(f"{doc['config']}: {r['frames_per_s_node']:.1f} frames/s per node (sum over {world} ranks of "
          f"{threads} threads; steady state {st.get('frames_per_s_node') or 0:.1f}), "
          f"{r['frames_per_cpu_s']:.1f} frames/CPU-s, gpu copy: "
          f"{'yes' if device is not None else 'skipped, ' + gpu_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
