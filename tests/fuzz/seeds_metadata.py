"""Seeds for fuzz_metadata: metadata file sets in one input (see
tests/fuzz/fuzz_metadata.c for the section order). Built from the real v2.1
fixture's meta files (trimmed to a few episodes) and variations of them, plus
small LeRobot v3.0 episodes/tasks Parquet files written with pyarrow.
Everything is written under out_dir only."""
import io
import json
import pathlib

SECTIONS = ["info", "episodes", "tasks", "episodes_stats", "stats", "episodes_parquet", "tasks_parquet"]
FIXTURE = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "lerobot-g1-v21" / "meta"


def pack(**files):
    """Five NUL-separated JSON files, then u32 length + episodes Parquet,
    then tasks Parquet (the layout fuzz_metadata.c splits)."""
    parts = []
    for name in SECTIONS:
        v = files.get(name, b"")
        parts.append(v.encode() if isinstance(v, str) else v)
    out = b"\0".join(parts[:5]) + b"\0"
    return out + len(parts[5]).to_bytes(4, "little") + parts[5] + parts[6]


def v21_files():
    if FIXTURE.is_dir():
        info = json.loads((FIXTURE / "info.json").read_text())
        episodes = (FIXTURE / "episodes.jsonl").read_text().splitlines()[:4]
        tasks = (FIXTURE / "tasks.jsonl").read_text()
        stats = (FIXTURE / "episodes_stats.jsonl").read_text().splitlines()[:2]
    else:
        info = {"codebase_version": "v2.1", "robot_type": "r", "total_episodes": 4, "total_frames": 40,
                "total_tasks": 1, "chunks_size": 1000, "fps": 30,
                "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
                "features": {"action": {"dtype": "float32", "shape": [2], "names": None},
                             "cam": {"dtype": "video", "shape": [480, 640, 3], "names": None,
                                     "info": {"video.codec": "av1", "video.width": 640, "video.height": 480}},
                             "index": {"dtype": "int64", "shape": [1], "names": None}}}
        episodes = [json.dumps({"episode_index": e, "tasks": ["t"], "length": 10}) for e in range(4)]
        tasks = json.dumps({"task_index": 0, "task": "t"}) + "\n"
        stats = [json.dumps({"episode_index": e, "stats": {"action": {"min": [0, 0], "max": [1, 1], "mean": [0.5, 0.5],
                                                                      "std": [0.1, 0.1], "count": [10]}}})
                 for e in range(2)]
    lengths = [json.loads(line)["length"] for line in episodes]
    info["total_episodes"] = len(episodes)
    info["total_frames"] = sum(lengths)
    return info, "\n".join(episodes) + "\n", tasks, "\n".join(stats) + "\n"


def v3_parquet():
    """Small episodes and tasks Parquet files as LeRobot writes them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    cam = "observation.images.front"
    n = 3
    lengths = [5, 4, 6]
    froms = [0, 5, 9]
    table = pa.table({
        "episode_index": pa.array(range(n), pa.int64()),
        "tasks": pa.array([["pick"]] * n, pa.list_(pa.string())),
        "length": pa.array(lengths, pa.int64()),
        "data/chunk_index": pa.array([0] * n, pa.int64()),
        "data/file_index": pa.array([0, 0, 1], pa.int64()),
        "dataset_from_index": pa.array(froms, pa.int64()),
        "dataset_to_index": pa.array([f + l for f, l in zip(froms, lengths)], pa.int64()),
        f"videos/{cam}/chunk_index": pa.array([0] * n, pa.int64()),
        f"videos/{cam}/file_index": pa.array([0, 1, 1], pa.int64()),
        f"videos/{cam}/from_timestamp": pa.array([0.0, 0.0, 4 / 30], pa.float64()),
        f"videos/{cam}/to_timestamp": pa.array([5 / 30, 4 / 30, 10 / 30], pa.float64()),
        "stats/action/mean": pa.array([[0.5, 0.5]] * n),
        "meta/episodes/chunk_index": pa.array([0] * n, pa.int64()),
        "meta/episodes/file_index": pa.array([0] * n, pa.int64()),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    episodes = buf.getvalue()
    out = {}
    for column in ["task", "__index_level_0__"]:
        t = pa.table({"task_index": pa.array([0], pa.int64()), column: pa.array(["pick"])})
        t = t.replace_schema_metadata({b"pandas": json.dumps({"index_columns": [column]}).encode()})
        b = io.BytesIO()
        pq.write_table(t, b, compression="snappy")
        out[column] = b.getvalue()
    info = {"codebase_version": "v3.0", "robot_type": None, "total_episodes": n, "total_frames": sum(lengths),
            "total_tasks": 1, "chunks_size": 1000, "fps": 30,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": {"action": {"dtype": "float32", "shape": [2], "names": None},
                         cam: {"dtype": "video", "shape": [64, 96, 3], "names": None,
                               "info": {"video.codec": "h264", "video.width": 96, "video.height": 64,
                                        "video.pix_fmt": "yuv420p", "video.fps": 30, "is_depth_map": False}},
                         "index": {"dtype": "int64", "shape": [1], "names": None}}}
    return info, episodes, out


def write_seeds(out_dir):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seeds = {}
    info, episodes, tasks, stats = v21_files()
    text = json.dumps(info, indent=4)
    seeds["v21"] = pack(info=text, episodes=episodes, tasks=tasks, episodes_stats=stats)
    seeds["v21_compact"] = pack(info=json.dumps(info), episodes=episodes, tasks=tasks)
    seeds["v21_truncated"] = pack(info=text[: len(text) // 2], episodes=episodes, tasks=tasks)
    seeds["v21_bad_line"] = pack(info=text, episodes=episodes.replace("}\n", ",\n", 1), tasks=tasks)
    seeds["v21_nan_stats"] = pack(info=text, episodes=episodes, tasks=tasks,
                                  episodes_stats=stats.replace("[", "[NaN, ", 3))
    for key, value in [("fps", -30), ("fps", "30"), ("codebase_version", "v1.6"), ("total_frames", None),
                       ("chunks_size", 0), ("features", [])]:
        bad = dict(info)
        bad[key] = value
        seeds[f"v21_{key}_{value}"] = pack(info=json.dumps(bad), episodes=episodes, tasks=tasks)
    huge = json.loads(json.dumps(info))
    first = next(iter(huge["features"]))
    huge["features"][first]["shape"] = [16777216, 16777216]
    seeds["v21_huge_shape"] = pack(info=json.dumps(huge), episodes=episodes, tasks=tasks)
    v20 = dict(info, codebase_version="v2.0")
    seeds["v20_stats"] = pack(info=json.dumps(v20), episodes=episodes, tasks=tasks,
                              stats=json.dumps({"action": {"mean": [1, 2], "std": [[0.1], [0.2]], "count": [4]}}))
    v3 = v3_parquet()
    if v3:
        info3, ep_parquet, tasks_parquet = v3
        for column, tp in tasks_parquet.items():
            seeds[f"v30_{column}"] = pack(info=json.dumps(info3), episodes_parquet=ep_parquet, tasks_parquet=tp,
                                          stats=json.dumps({"action": {"mean": [0.5, 0.5], "std": [0.1, 0.1]}}))
        seeds["v30_truncated_episodes"] = pack(info=json.dumps(info3), episodes_parquet=ep_parquet[:-20],
                                               tasks_parquet=tasks_parquet["task"])
    for name, data in seeds.items():
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        (out / f"{safe}.bin").write_bytes(data)


if __name__ == "__main__":
    import sys
    write_seeds(sys.argv[1])
