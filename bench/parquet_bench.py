#!/usr/bin/env python3
"""Parquet read speed: vlafeed's C reader against pyarrow on the same file.

Generates a ~100 MB LeRobot-like data file with pyarrow defaults plus
snappy (as LeRobot writes it: FixedSizeList<float32> vectors of 32, 32,
12 and 6, a float32 timestamp, four int64 scalars; random-walk floats, so
the dictionary passes 1 MiB and pyarrow falls back to PLAIN pages), then
times bench_parquet_read (every column, all row groups) and
pyarrow.parquet.read_table (single-threaded and with threads).

usage: bench/parquet_bench.py [--build build] [--mb 100] [--iterations 5] [--keep DIR]
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_table(target_mb, seed=0):
    rng = np.random.default_rng(seed)
    dims = {"observation.state": 32, "action": 32, "observation.effort": 12, "observation.velocity": 6}
    row_bytes = sum(dims.values()) * 4 + 4 + 4 * 8
    rows = int(target_mb * 1e6 / row_bytes)
    frames = 400
    cols = {}
    for name, dim in dims.items():
        walk = np.cumsum(rng.standard_normal((rows, dim)).astype(np.float32) * 0.01, axis=0)
        cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(walk.ravel()), dim)
    frame = np.arange(rows) % frames
    cols["timestamp"] = pa.array((frame / 30.0).astype(np.float32))
    cols["frame_index"] = pa.array(frame, pa.int64())
    cols["episode_index"] = pa.array(np.arange(rows) // frames, pa.int64())
    cols["index"] = pa.array(np.arange(rows), pa.int64())
    cols["task_index"] = pa.array((np.arange(rows) // frames) % 7, pa.int64())
    return pa.table(cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = pathlib.Path(__file__).resolve().parents[1]
    ap.add_argument("--build", default=str(root / "build"))
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--keep", help="write the file here (reused if present)")
    args = ap.parse_args()

    tmp = None
    if args.keep:
        path = pathlib.Path(args.keep) / "bench_lerobot.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="vf-pqbench-")
        path = pathlib.Path(tmp.name) / "bench_lerobot.parquet"
    if not path.exists():
        pq.write_table(make_table(args.mb), path, compression="snappy")
    size = path.stat().st_size
    meta = pq.ParquetFile(path).metadata
    encodings = sorted({e for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                        for e in meta.row_group(g).column(c).encodings})
    print(f"file: {path} ({size / 1e6:.1f} MB, {meta.num_rows} rows, {meta.num_row_groups} row groups, "
          f"encodings {encodings})")

    exe = pathlib.Path(args.build) / "bench_parquet_read"
    out = subprocess.run([str(exe), str(path), str(args.iterations)], check=True, capture_output=True, text=True).stdout
    mean = float(re.search(r"seconds per pass: mean ([0-9.]+)", out).group(1))
    decoded = int(re.search(r"decoded bytes: (\d+)", out).group(1))
    print(f"vlafeed C reader:           {size / mean / 1e6:8.1f} MB/s of file, {decoded / mean / 1e6:8.1f} MB/s decoded"
          f" ({mean * 1000:.1f} ms per pass)")

    results = {}
    for threads in (False, True):
        pq.read_table(path, use_threads=threads)  # warm-up
        times = []
        for _ in range(args.iterations):
            t0 = time.perf_counter()
            table = pq.read_table(path, use_threads=threads)
            times.append(time.perf_counter() - t0)
            del table
        results[threads] = sum(times) / len(times)
        label = f"pyarrow read_table ({'threads' if threads else '1 thread'})"
        print(f"{label:28s}{size / results[threads] / 1e6:8.1f} MB/s of file ({results[threads] * 1000:.1f} ms per pass)")
    print(f"ratio C / pyarrow (1 thread): {results[False] / mean:.2f}x; C / pyarrow (threads, "
          f"{os.cpu_count()} cpus): {results[True] / mean:.2f}x")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
