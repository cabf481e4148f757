#!/usr/bin/env python3
"""Writes a small LeRobot v3.0 dataset with pyarrow, laid out as LeRobot's
recorder writes it (shared/docs/lerobot-format.md §1-§6): info.json, one
episodes-metadata file, tasks.parquet, stats.json, one data file with one row
group per episode. Videos are tiny H.264 files made with the ffmpeg command
when it is present (the metadata is the point here, not the pixels).

usage: write_pyarrow_dataset.py OUT [--episodes N] [--no-video]
"""
import argparse
import json
import pathlib
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FPS = 30
DIM = 6
CAMERA = "observation.images.front"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--no-video", action="store_true")
    args = ap.parse_args()
    root = pathlib.Path(args.out)
    (root / "meta/episodes/chunk-000").mkdir(parents=True, exist_ok=True)
    (root / "data/chunk-000").mkdir(parents=True, exist_ok=True)
    lengths = [30 + 7 * e for e in range(args.episodes)]
    total = sum(lengths)

    # data: one row group per episode
    vec = pa.list_(pa.float32(), DIM)
    schema = pa.schema([("action", vec), ("observation.state", vec), ("timestamp", pa.float32()),
                        ("frame_index", pa.int64()), ("episode_index", pa.int64()),
                        ("index", pa.int64()), ("task_index", pa.int64())])
    writer = pq.ParquetWriter(root / "data/chunk-000/file-000.parquet", schema, compression="snappy")
    start = 0
    froms = []
    for e, n in enumerate(lengths):
        k = np.arange(n)
        state = np.sin(0.05 * k[:, None] + 0.3 * np.arange(DIM)[None, :] + e).astype(np.float32)
        action = np.sin(0.05 * (k[:, None] + 1) + 0.3 * np.arange(DIM)[None, :] + e).astype(np.float32)
        table = pa.table({
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), DIM),
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), DIM),
            "timestamp": pa.array((k / FPS).astype(np.float32)),
            "frame_index": pa.array(k, pa.int64()),
            "episode_index": pa.array(np.full(n, e), pa.int64()),
            "index": pa.array(start + k, pa.int64()),
            "task_index": pa.array(np.zeros(n), pa.int64()),
        }, schema=schema)
        writer.write_table(table)
        froms.append(start)
        start += n
    writer.close()

    # video: one H.264 file holding every episode back to back
    has_video = not args.no_video and shutil.which("ffmpeg") is not None
    if has_video:
        vdir = root / "videos" / CAMERA / "chunk-000"
        vdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc=size=96x64:rate={FPS}", "-frames:v", str(total), "-c:v", "libx264",
                        "-g", "2", "-pix_fmt", "yuv420p", str(vdir / "file-000.mp4")], check=True)

    # episodes metadata
    ep = {
        "episode_index": pa.array(range(args.episodes), pa.int64()),
        "tasks": pa.array([["Pick the orange cube and place it in the box"]] * args.episodes),
        "length": pa.array(lengths, pa.int64()),
        "data/chunk_index": pa.array([0] * args.episodes, pa.int64()),
        "data/file_index": pa.array([0] * args.episodes, pa.int64()),
        "dataset_from_index": pa.array(froms, pa.int64()),
        "dataset_to_index": pa.array([f + n for f, n in zip(froms, lengths)], pa.int64()),
    }
    if has_video:
        ep[f"videos/{CAMERA}/chunk_index"] = pa.array([0] * args.episodes, pa.int64())
        ep[f"videos/{CAMERA}/file_index"] = pa.array([0] * args.episodes, pa.int64())
        ep[f"videos/{CAMERA}/from_timestamp"] = pa.array([f / FPS for f in froms], pa.float64())
        ep[f"videos/{CAMERA}/to_timestamp"] = pa.array([(f + n) / FPS for f, n in zip(froms, lengths)],
                                                        pa.float64())
    ep["meta/episodes/chunk_index"] = pa.array([0] * args.episodes, pa.int64())
    ep["meta/episodes/file_index"] = pa.array([0] * args.episodes, pa.int64())
    pq.write_table(pa.table(ep), root / "meta/episodes/chunk-000/file-000.parquet", compression="snappy")

    # tasks (current writer era: a `task` column)
    pq.write_table(pa.table({"task_index": pa.array([0], pa.int64()),
                             "task": ["Pick the orange cube and place it in the box"]}),
                   root / "meta/tasks.parquet", compression="snappy")

    features = {
        "action": {"dtype": "float32", "shape": [DIM], "names": [f"j{i}" for i in range(DIM)]},
        "observation.state": {"dtype": "float32", "shape": [DIM], "names": [f"j{i}" for i in range(DIM)]},
    }
    if has_video:
        features[CAMERA] = {"dtype": "video", "shape": [64, 96, 3], "names": ["height", "width", "channels"],
                            "info": {"video.height": 64, "video.width": 96, "video.codec": "h264",
                                     "video.pix_fmt": "yuv420p", "video.is_depth_map": False,
                                     "video.fps": FPS, "video.channels": 3, "has_audio": False}}
    features.update({
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    })
    info = {
        "codebase_version": "v3.0", "robot_type": "so101_follower", "total_episodes": args.episodes,
        "total_frames": total, "total_tasks": 1, "chunks_size": 1000, "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200, "fps": FPS,
        "splits": {"train": f"0:{args.episodes}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": ("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
                       if has_video else None),
        "features": features,
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    stats = {name: {"min": [0.0] * DIM, "max": [1.0] * DIM, "mean": [0.5] * DIM, "std": [0.1] * DIM,
                    "count": [total]} for name in ("action", "observation.state")}
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))
    print(f"wrote {root}: {args.episodes} episodes, {total} frames" + (", 1 camera" if has_video else ""))


if __name__ == "__main__":
    main()
