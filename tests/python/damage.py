"""Helpers that build small make-sample datasets and damage copies of them,
for the open-time checks (test_open_checks.py) and the corruption corpus
(test_corruption_corpus.py). Everything here uses the vlafeed CLI, pyarrow
and the ffmpeg CLI; nothing reads through vlafeed itself."""
import json
import os
import pathlib
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
DATA_FILE = "data/chunk-000/file-000.parquet"
CAM = "observation.images.cam0"
VIDEO_FILE = f"videos/{CAM}/chunk-000/file-000.mp4"


def make_sample(cli, root, *, episodes=3, cameras=1, size="64x48", codec="h264", min_length=10, max_length=20,
                extra=()):
    root = pathlib.Path(root)
    subprocess.run([cli, "make-sample", str(root), "--codec", codec, "--episodes", str(episodes), "--cameras",
                    str(cameras), "--size", size, "--min-length", str(min_length), "--max-length", str(max_length),
                    "--quiet", *extra], check=True, capture_output=True, timeout=300)
    return root


def copy(src, dst):
    shutil.copytree(src, dst)
    return pathlib.Path(dst)


def read_info(root):
    return json.loads((pathlib.Path(root) / "meta/info.json").read_text())


def write_info(root, info):
    (pathlib.Path(root) / "meta/info.json").write_text(json.dumps(info, indent=2))


def edit_info(root, fn):
    info = read_info(root)
    fn(info)
    write_info(root, info)


def read_episodes(root):
    return pq.read_table(pathlib.Path(root) / EPISODES_FILE)


def write_episodes(root, table, rel=EPISODES_FILE):
    path = pathlib.Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def edit_episodes(root, fn):
    """fn(list of row dicts) -> list of row dicts; the schema is kept."""
    t = read_episodes(root)
    rows = fn(t.to_pylist())
    write_episodes(root, pa.Table.from_pylist(rows, schema=t.schema))


def edit_data(root, fn, rel=DATA_FILE, **write_options):
    path = pathlib.Path(root) / rel
    t = pq.read_table(path)
    t = fn(t)
    pq.write_table(t, path, row_group_size=1 << 30, **write_options)


def replace_with_fifo(path):
    path = pathlib.Path(path)
    path.unlink()
    os.mkfifo(path)


def replace_with_dir(path):
    path = pathlib.Path(path)
    path.unlink()
    path.mkdir()


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *map(str, args)], check=True,
                   capture_output=True, timeout=300)


def ffprobe_frames(path):
    """Presentation timestamps (seconds) of every video frame, from the container."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pts_time",
                          "-of", "csv=p=0", str(path)], check=True, capture_output=True, text=True).stdout
    return sorted(float(x) for x in out.split() if x.strip() and x.strip() != "N/A")


def flip_byte(path, offset):
    path = pathlib.Path(path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)
