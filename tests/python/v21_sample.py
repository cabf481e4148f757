"""Builds a LeRobot v2.1 dataset from `vlafeed make-sample` output, for the
v2.1 -> v3.0 converter tests.

make-sample writes v3.0; with file size limits below one episode every
episode gets its own data file and, per camera, its own MP4 starting at
time 0, which is exactly what a v2.1 episode file is. This module moves
those files into the v2.1 layout (lerobot-format.md §10.1) and writes the
v2.1 metadata (episodes.jsonl, tasks.jsonl, episodes_stats.jsonl from the
per-episode stats columns, info.json with the v2 templates). The frames
keep make-sample's identity stamps (episode, frame, camera)."""
import json
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq


def make_v21(cli, root: Path, *, episodes=6, cameras=2, size="128x96", min_length=20, max_length=40,
             codec="av1", seed=0, work=None):
    root = Path(root)
    work = Path(work) if work else root.parent / (root.name + "-v3src")
    r = subprocess.run([cli, "make-sample", str(work), "--episodes", str(episodes), "--cameras", str(cameras),
                        "--size", size, "--min-length", str(min_length), "--max-length", str(max_length),
                        "--codec", codec, "--seed", str(seed), "--max-video-mb", "0.000001",
                        "--max-data-mb", "0.000001", "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    info = json.loads((work / "meta/info.json").read_text())
    eps = pq.read_table(work / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    tasks = pq.read_table(work / "meta/tasks.parquet").to_pylist()
    video_keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    (root / "meta").mkdir(parents=True)
    (root / "data/chunk-000").mkdir(parents=True)
    for ep in eps:
        e = ep["episode_index"]
        src = work / f"data/chunk-{ep['data/chunk_index']:03d}/file-{ep['data/file_index']:03d}.parquet"
        assert pq.read_metadata(src).num_rows == ep["length"]
        shutil.copyfile(src, root / f"data/chunk-000/episode_{e:06d}.parquet")
        for key in video_keys:
            assert ep[f"videos/{key}/from_timestamp"] == 0.0
            vsrc = work / (f"videos/{key}/chunk-{ep[f'videos/{key}/chunk_index']:03d}/"
                           f"file-{ep[f'videos/{key}/file_index']:03d}.mp4")
            dst = root / f"videos/chunk-000/{key}/episode_{e:06d}.mp4"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(vsrc, dst)
    with open(root / "meta/episodes.jsonl", "w") as f:
        for ep in eps:
            f.write(json.dumps({"episode_index": ep["episode_index"], "tasks": ep["tasks"],
                                "length": ep["length"]}) + "\n")
    with open(root / "meta/tasks.jsonl", "w") as f:
        for t in tasks:
            f.write(json.dumps({"task_index": t["task_index"], "task": t["task"]}) + "\n")
    with open(root / "meta/episodes_stats.jsonl", "w") as f:
        for ep in eps:
            stats = {}
            for col, value in ep.items():
                if col.startswith("stats/"):
                    _, feat, stat = col.split("/")
                    stats.setdefault(feat, {})[stat] = value
            f.write(json.dumps({"episode_index": ep["episode_index"], "stats": stats}) + "\n")
    info.update(codebase_version="v2.1", total_chunks=1, total_videos=len(eps) * len(video_keys),
                chunks_size=1000,
                data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                video_path=("videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
                            if video_keys else None))
    for k in ("data_files_size_in_mb", "video_files_size_in_mb"):
        info.pop(k, None)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    shutil.rmtree(work)
    return root
