#!/usr/bin/env python3
"""replicate_dataset.py: grow a LeRobot v3.0 dataset by repeating its episodes.

    python3 bench/replicate_dataset.py SRC DST --copies K

    python3 bench/replicate_dataset.py SRC DST --copies K --layout files

Why: `vlafeed make-sample` encodes with libsvtav1 at about 20-35 frames/s on
a 2-core machine, so writing the ~13,000 frames per camera that 200 batches
of 64 need would take half an hour. The benchmark needs that many frames,
not that many distinct pictures: decoding cost per frame is the same for a
copy. So make-sample writes a few long base episodes and this script writes
a new dataset holding K copies of them. Copy c of the base's episode e is
episode c * E + e, with its own rows (index shifted by c * total_frames).

--layout concat (default; needs a base with one MP4 per camera and one data
file): what LeRobot itself writes for a dataset of this size (files roll
over at 200 MB of video / 100 MB of data): per camera ONE MP4 holding the K
copies back to back (FFmpeg's concat demuxer, packets copied, no
re-encode), whose episodes' from/to timestamps are the copy's real start
(the pts of its first frame in the new file) plus the base's; one data file
with every row (one row group per episode, like make-sample).
--layout files: every copy in its own MP4 per camera (a hard link or copy of
the base file, same timestamps) and its own data file, as in a dataset whose
files rolled over at a small size: more files for the decoder cache.

meta/episodes is rewritten (indices, file indices, timestamps, per-episode
stats of episode_index and index), meta/info.json gets the new totals and
split, meta/tasks.parquet and meta/stats.json are copied (the global stats of
episode_index / index updated to the new ranges).

The result opens in vlafeed and in upstream LeRobot like any v3.0 dataset.
Frame identity stamps still name the base episode (the benchmark does not
check them).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def link_or_copy(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def replace_column(table, name, values):
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, type=table.schema.field(i).type))


def concat_videos(src_path, dst_path, copies):
    """dst = copies x src back to back (FFmpeg concat demuxer, packets
    copied); returns the start of each copy in seconds (the pts of its
    first frame in dst)."""
    import av
    os.makedirs(os.path.dirname(dst_path), exist_ok=True)
    listing = dst_path + ".list"
    with open(listing, "w") as f:
        for _ in range(copies):
            f.write("file '" + os.path.abspath(src_path).replace("'", "'\\''") + "'\n")
    tmp = dst_path + ".tmp.mp4"
    subprocess.run(["ffmpeg", "-hide_banner", "-v", "error", "-y", "-f", "concat", "-safe", "0", "-i", listing,
                    "-map", "0:v:0", "-c", "copy", "-movflags", "+faststart", tmp], check=True)
    os.remove(listing)
    os.replace(tmp, dst_path)
    with av.open(src_path) as c:
        n = sum(1 for p in c.demux(c.streams.video[0]) if p.pts is not None)
    with av.open(dst_path) as c:
        stream = c.streams.video[0]
        pts = sorted(p.pts for p in c.demux(stream) if p.pts is not None)
        tb = float(stream.time_base)
    if len(pts) != n * copies:
        raise RuntimeError(f"{dst_path}: {len(pts)} frames after concatenation, expected {n * copies}")
    return [pts[c * n] * tb for c in range(copies)]


def replicate(src, dst, copies, layout="concat"):
    if copies < 1:
        raise ValueError("copies must be >= 1")
    if layout not in ("concat", "files"):
        raise ValueError("layout must be concat or files")
    with open(os.path.join(src, "meta", "info.json")) as f:
        info = json.load(f)
    if info.get("codebase_version") != "v3.0":
        raise ValueError(f"{src}: only v3.0 datasets can be replicated (found {info.get('codebase_version')})")
    if os.path.exists(os.path.join(dst, "meta", "info.json")):
        raise FileExistsError(f"{dst} already holds a dataset")
    ep_dir = os.path.join(src, "meta", "episodes")
    ep_files = sorted(os.path.join(r, n) for r, _, names in os.walk(ep_dir) for n in names if n.endswith(".parquet"))
    episodes = pa.concat_tables([pq.read_table(p) for p in ep_files])
    num_episodes = episodes.num_rows
    total_frames = int(info["total_frames"])
    video_keys = [k for k, v in info["features"].items() if v.get("dtype") == "video"]
    cols = episodes.column_names
    data_files = sorted({(int(c), int(f)) for c, f in zip(episodes["data/chunk_index"].to_pylist(),
                                                          episodes["data/file_index"].to_pylist())})
    if any(c != 0 for c, _ in data_files):
        raise ValueError("replicate_dataset: base data files beyond chunk-000 are not supported")
    num_data_files = len(data_files)
    video_files = {}
    for key in video_keys:
        pairs = sorted({(int(c), int(f)) for c, f in zip(episodes[f"videos/{key}/chunk_index"].to_pylist(),
                                                         episodes[f"videos/{key}/file_index"].to_pylist())})
        if any(c != 0 for c, _ in pairs):
            raise ValueError("replicate_dataset: base video files beyond chunk-000 are not supported")
        video_files[key] = len(pairs)
    if layout == "concat" and (num_data_files != 1 or any(n != 1 for n in video_files.values())):
        raise ValueError("replicate_dataset: --layout concat needs a base with one data file and one MP4 per "
                         "camera (use --layout files)")

    data_path = info["data_path"]
    video_path = info["video_path"]

    # Data rows: copy c's episodes and index shifted; concat: all in file 0.
    writers = {}
    try:
        for c in range(copies):
            for chunk, fi in data_files:
                pf = pq.ParquetFile(os.path.join(src, data_path.format(chunk_index=chunk, file_index=fi)))
                out_index = 0 if layout == "concat" else c * num_data_files + fi
                if out_index not in writers:
                    out = os.path.join(dst, data_path.format(chunk_index=0, file_index=out_index))
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    writers[out_index] = pq.ParquetWriter(out, pf.schema_arrow, compression="snappy")
                for g in range(pf.num_row_groups):  # one row group per episode
                    t = pf.read_row_group(g)
                    t = replace_column(t, "episode_index",
                                       [v + c * num_episodes for v in t["episode_index"].to_pylist()])
                    t = replace_column(t, "index", [v + c * total_frames for v in t["index"].to_pylist()])
                    writers[out_index].write_table(t)
    finally:
        for w in writers.values():
            w.close()

    # Videos.
    offsets = {}
    for key in video_keys:
        if layout == "concat":
            s = os.path.join(src, video_path.format(video_key=key, chunk_index=0, file_index=0))
            d = os.path.join(dst, video_path.format(video_key=key, chunk_index=0, file_index=0))
            offsets[key] = concat_videos(s, d, copies)
        else:
            for c in range(copies):
                for fi in range(video_files[key]):
                    s = os.path.join(src, video_path.format(video_key=key, chunk_index=0, file_index=fi))
                    d = os.path.join(dst, video_path.format(video_key=key, chunk_index=0,
                                                            file_index=c * video_files[key] + fi))
                    link_or_copy(s, d)

    # meta/episodes: K copies of every row.
    parts = []
    for c in range(copies):
        t = episodes
        t = replace_column(t, "episode_index", [v + c * num_episodes for v in t["episode_index"].to_pylist()])
        for name in ("dataset_from_index", "dataset_to_index"):
            t = replace_column(t, name, [v + c * total_frames for v in t[name].to_pylist()])
        t = replace_column(t, "data/chunk_index", [0] * t.num_rows)
        t = replace_column(t, "data/file_index", [0 if layout == "concat" else v + c * num_data_files
                                                  for v in t["data/file_index"].to_pylist()])
        for key in video_keys:
            name = f"videos/{key}/file_index"
            if layout == "concat":
                t = replace_column(t, name, [0] * t.num_rows)
                for bound in ("from_timestamp", "to_timestamp"):
                    name = f"videos/{key}/{bound}"
                    t = replace_column(t, name, [v + offsets[key][c] for v in t[name].to_pylist()])
            else:
                t = replace_column(t, name, [v + c * video_files[key] for v in t[name].to_pylist()])
        for feature, shift in (("episode_index", c * num_episodes), ("index", c * total_frames)):
            for stat in ("min", "max", "mean"):
                name = f"stats/{feature}/{stat}"
                if name in cols:
                    t = replace_column(t, name, [[x + shift for x in v] for v in t[name].to_pylist()])
        for name in ("meta/episodes/chunk_index", "meta/episodes/file_index"):
            if name in cols:
                t = replace_column(t, name, [0] * t.num_rows)
        parts.append(t)
    out_eps = pa.concat_tables(parts)
    ep_out = os.path.join(dst, "meta", "episodes", "chunk-000", "file-000.parquet")
    os.makedirs(os.path.dirname(ep_out), exist_ok=True)
    pq.write_table(out_eps, ep_out, compression="snappy")

    shutil.copyfile(os.path.join(src, "meta", "tasks.parquet"), os.path.join(dst, "meta", "tasks.parquet"))
    stats_path = os.path.join(src, "meta", "stats.json")
    if os.path.exists(stats_path):
        with open(stats_path) as f:
            stats = json.load(f)
        n_eps, n_frames = num_episodes * copies, total_frames * copies
        for feature, last in (("episode_index", n_eps - 1), ("index", n_frames - 1)):
            if feature in stats:
                st = stats[feature]
                st["min"], st["max"], st["mean"] = [0], [last], [last / 2.0]
                if "count" in st:
                    st["count"] = [n_frames]
        with open(os.path.join(dst, "meta", "stats.json"), "w") as f:
            json.dump(stats, f, indent=4)
    info = dict(info)
    info["total_episodes"] = num_episodes * copies
    info["total_frames"] = total_frames * copies
    info["splits"] = {"train": f"0:{num_episodes * copies}"}
    with open(os.path.join(dst, "meta", "info.json"), "w") as f:
        json.dump(info, f, indent=4)
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--copies", type=int, required=True)
    ap.add_argument("--layout", choices=["concat", "files"], default="concat")
    a = ap.parse_args(argv)
    info = replicate(a.src, a.dst, a.copies, a.layout)
    print(f"{a.dst}: {info['total_episodes']} episodes, {info['total_frames']} frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
