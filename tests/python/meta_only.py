"""A LeRobot v3.0 dataset folder with metadata only (no data files, no
MP4s): info.json for n episodes of 2 frames and one AV1 camera, and a
one-task tasks.parquet. The caller writes meta/episodes."""
import json

import pyarrow as pa
import pyarrow.parquet as pq


def write_info_and_tasks(root, n):
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    info = {
        "codebase_version": "v3.0", "robot_type": "bot", "total_episodes": n, "total_frames": 2 * n,
        "total_tasks": 1, "chunks_size": 1000, "fps": 10,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {
            "action": {"dtype": "float32", "shape": [2], "names": None},
            "cam": {"dtype": "video", "shape": [48, 64, 3], "names": None,
                    "info": {"video.codec": "av1", "video.width": 64, "video.height": 48,
                             "video.pix_fmt": "yuv420p", "video.fps": 10}},
            **{k: {"dtype": "int64", "shape": [1], "names": None}
               for k in ("frame_index", "episode_index", "index", "task_index")},
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        },
    }
    (root / "meta/info.json").write_text(json.dumps(info))
    pq.write_table(pa.table({"task_index": [0], "task": ["pick"]}), root / "meta/tasks.parquet")
