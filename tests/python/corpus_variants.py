"""The damaged variants of the corruption corpus (test_corruption_corpus.py):
name -> (mutation, expected outcome). A mutation takes the root of a fresh
copy of the base dataset (4 episodes, one H.264 camera, see BASE_OPTIONS)
and damages it; the outcome says what vlafeed must do with it.

Outcomes:
  Ok(info_rc, note)          every item equals the undamaged dataset's item;
                             `vlafeed info` exits info_rc, and its output
                             contains note when given (a warning);
                             `decode-check --thorough` exits check_rc (3:
                             served otherwise than the metadata says, with a
                             LoaderWarning in Python), else info_rc.
  OpenError(pattern)         the Python open raises, message matching pattern
                             (which names the file, and key/episode where
                             they apply); `vlafeed info` exits non-zero.
  EpisodeError(eps, pattern) the open succeeds; every item of the episodes
                             in eps raises, matching pattern (file, episode);
                             every other item equals the undamaged one;
                             `vlafeed info` exits 1 naming the episode.
"""
import json
import pathlib
import shutil
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import damage
from damage import CAM, DATA_FILE, EPISODES_FILE, VIDEO_FILE

BASE_OPTIONS = dict(episodes=4, cameras=1, size="64x48", codec="h264", min_length=12, max_length=24)
SPAN_FROM = f"videos/{CAM}/from_timestamp"
SPAN_TO = f"videos/{CAM}/to_timestamp"


@dataclass
class Ok:
    info_rc: int = 0
    note: str = None
    forbid: str = None  # must NOT appear in `vlafeed info`'s output
    check_rc: int = None  # `decode-check --thorough`'s exit status, when not info_rc: 3 when the
                          # loaders serve something otherwise than the metadata says (and warn)
    left_out: tuple = ()  # keys the items lack (a feature the loaders leave out, and say so)


@dataclass
class OpenError:
    pattern: str


@dataclass
class EpisodeError:
    episodes: set
    pattern: str


@dataclass
class Variant:
    mutate: object
    expect: object
    fifo: bool = False
    needs: dict = field(default_factory=dict)


VARIANTS = {}


def variant(name, expect, **kw):
    def wrap(fn):
        assert name not in VARIANTS
        VARIANTS[name] = Variant(fn, expect, **kw)
        return fn
    return wrap


def simple(name, expect, fn, **kw):
    VARIANTS[name] = Variant(fn, expect, **kw)


def size_of(root, rel):
    return (pathlib.Path(root) / rel).stat().st_size


# ---- data Parquet ------------------------------------------------------------------

simple("data_truncated_half", OpenError(f"{DATA_FILE}"),
       lambda r: damage.truncate(r / DATA_FILE, size_of(r, DATA_FILE) // 2))
simple("data_truncated_footer", OpenError(f"{DATA_FILE}"),
       lambda r: damage.truncate(r / DATA_FILE, size_of(r, DATA_FILE) - 5))
simple("data_empty", OpenError(f"{DATA_FILE}"), lambda r: damage.truncate(r / DATA_FILE, 0))
simple("data_flipped_tail_magic", OpenError(f"{DATA_FILE}"),
       lambda r: damage.flip_byte(r / DATA_FILE, size_of(r, DATA_FILE) - 1))
simple("data_garbage", OpenError(f"{DATA_FILE}"),
       lambda r: (r / DATA_FILE).write_bytes(bytes(range(256)) * 40))
simple("data_missing", OpenError(f"{DATA_FILE}"), lambda r: (r / DATA_FILE).unlink())
simple("data_directory", OpenError(f"{DATA_FILE}.*not a regular file"), lambda r: damage.replace_with_dir(r / DATA_FILE))
simple("data_fifo", OpenError(f"{DATA_FILE}.*not a regular file \\(a FIFO\\)"),
       lambda r: damage.replace_with_fifo(r / DATA_FILE), fifo=True)


@variant("data_page_crc_flip", OpenError(f"{DATA_FILE}.*page CRC mismatch"))
def _(r):
    damage.edit_data(r, lambda t: t, compression="none", write_page_checksum=True, use_dictionary=False)
    raw = (r / DATA_FILE).read_bytes()
    first = pq.read_table(r / DATA_FILE, columns=["action"]).column(0)[0].as_py()[0]
    damage.flip_byte(r / DATA_FILE, raw.find(np.float32(first).tobytes()) + 3)


simple("data_missing_column", OpenError(f"{DATA_FILE}.*action"), lambda r: damage.edit_data(r, lambda t: t.drop(["action"])))
simple("data_column_renamed", OpenError(f"{DATA_FILE}.*observation.state"),
       lambda r: damage.edit_data(r, lambda t: t.rename_columns(
           ["obs" if c == "observation.state" else c for c in t.column_names])))


def _set_column(t, name, values):
    i = t.column_names.index(name)
    return t.set_column(i, pa.field(name, t.schema.field(name).type), pa.array(values, t.schema.field(name).type))


@variant("data_index_gap", OpenError(f"{DATA_FILE}.*index"))
def _(r):
    def fn(t):
        idx = t.column("index").to_pylist()
        return _set_column(t, "index", [v + (5 if i >= 20 else 0) for i, v in enumerate(idx)])
    damage.edit_data(r, fn)


# Table rows are read lazily (issue 9), per episode: a damaged data file fails
# the episodes whose rows are wrong or missing, when they are read, naming
# the file and episode; every other episode is served exactly.
@variant("data_episode_index_wrong", EpisodeError({0}, f"{DATA_FILE}.*episode 0"), needs={"info_blind": True})
def _(r):
    def fn(t):
        ep = t.column("episode_index").to_pylist()
        return _set_column(t, "episode_index", [1 if (e == 0 and i == 0) else e for i, e in enumerate(ep)])
    damage.edit_data(r, fn)


simple("data_rows_dropped", EpisodeError({3}, f"{DATA_FILE}.*episode 3"),
       lambda r: damage.edit_data(r, lambda t: t.slice(0, t.num_rows - 3)))
simple("data_rows_added", Ok(1, "file has 82 rows, the episodes stored in it have 80"),
       lambda r: damage.edit_data(r, lambda t: pa.concat_tables([t, t.slice(t.num_rows - 2, 2)])))

# ---- meta/episodes -----------------------------------------------------------------


def _rows(fn):
    return lambda r: damage.edit_episodes(r, fn)


simple("episodes_duplicate_row", OpenError("meta/episodes.*episode 0 is listed twice"), _rows(lambda rows: rows[:1] + rows))
simple("episodes_missing_row", OpenError("meta/episodes.*3 episodes"), _rows(lambda rows: rows[:2] + rows[3:]))


@variant("episodes_extra_file", OpenError("meta/episodes.*episodes"))
def _(r):
    damage.write_episodes(r, damage.read_episodes(r).slice(3, 1), rel="meta/episodes/chunk-000/file-001.parquet")


simple("episodes_overlap", OpenError("meta/episodes.*not contiguous"),
       _rows(lambda rows: [dict(x, dataset_from_index=x["dataset_from_index"] - (2 if i == 2 else 0),
                                length=x["length"] + (2 if i == 2 else 0)) for i, x in enumerate(rows)]))
simple("episodes_length_huge", OpenError("meta/episodes"),
       _rows(lambda rows: [dict(x, length=10**12 if i == 1 else x["length"]) for i, x in enumerate(rows)]))
simple("episodes_length_negative", OpenError("meta/episodes.*length"),
       _rows(lambda rows: [dict(x, length=-3 if i == 1 else x["length"]) for i, x in enumerate(rows)]))
simple("episodes_empty_file", OpenError(EPISODES_FILE), lambda r: damage.truncate(r / EPISODES_FILE, 0))
simple("episodes_truncated", OpenError(EPISODES_FILE),
       lambda r: damage.truncate(r / EPISODES_FILE, size_of(r, EPISODES_FILE) // 3))
simple("episodes_directory", OpenError("meta/episodes"), lambda r: damage.replace_with_dir(r / EPISODES_FILE))
simple("episodes_fifo", OpenError(f"{EPISODES_FILE}.*a FIFO"), lambda r: damage.replace_with_fifo(r / EPISODES_FILE),
       fifo=True)


def _swap_spans(a, b):
    def fn(rows):
        rows = [dict(x) for x in rows]
        for key in (SPAN_FROM, SPAN_TO):
            rows[a][key], rows[b][key] = rows[b][key], rows[a][key]
        return rows
    return fn


simple("episodes_video_spans_swapped", EpisodeError({1, 2}, f"{VIDEO_FILE}.*episode [12]"), _rows(_swap_spans(1, 2)))
simple("episodes_from_past_end", EpisodeError({3}, f"{VIDEO_FILE}.*episode 3"),
       _rows(lambda rows: [dict(x, **{SPAN_FROM: x[SPAN_FROM] + 50.0, SPAN_TO: x[SPAN_TO] + 50.0}) if i == 3 else x
                           for i, x in enumerate(rows)]))
simple("episodes_span_shifted_one_frame", EpisodeError({2}, f"{VIDEO_FILE}.*episode 2"),
       _rows(lambda rows: [dict(x, **{SPAN_FROM: x[SPAN_FROM] + 1 / 30, SPAN_TO: x[SPAN_TO] + 1 / 30}) if i == 2 else x
                           for i, x in enumerate(rows)]))
# to_timestamp = the last frame's time (some converters): no false span warning.
simple("episodes_to_is_last_frame", Ok(0, forbid="span"),
       _rows(lambda rows: [dict(x, **{SPAN_TO: x[SPAN_TO] - 1 / 30}) for x in rows]))
# Episode 2 now points to a missing file, and file-000 holds more frames than
# the episodes said to be in it: all four are refused.
simple("episodes_video_file_index_wrong",
       EpisodeError({0, 1, 2, 3}, "file-007.mp4: cannot open: No such file|file-000.mp4.*another file in its place"),
       _rows(lambda rows: [dict(x, **{f"videos/{CAM}/file_index": 7}) if i == 2 else x for i, x in enumerate(rows)]))
simple("episodes_data_file_index_wrong", EpisodeError({1}, "data/chunk-000/file-005.parquet.*(episode 1|No such file)"),
       _rows(lambda rows: [dict(x, **{"data/file_index": 5}) if i == 1 else x for i, x in enumerate(rows)]))
simple("episodes_unknown_task", Ok(0, "is not in meta/tasks.parquet"),
       _rows(lambda rows: [dict(x, tasks=["an unknown task"]) if i == 0 else x for i, x in enumerate(rows)]))

# ---- meta/info.json ----------------------------------------------------------------


def _info(fn):
    return lambda r: damage.edit_info(r, fn)


simple("info_not_json", OpenError("meta/info.json"), lambda r: (r / "meta/info.json").write_text("{ not json"))
simple("info_empty", OpenError("meta/info.json"), lambda r: (r / "meta/info.json").write_text(""))
simple("info_directory", OpenError("meta/info.json.*not a regular file"),
       lambda r: damage.replace_with_dir(r / "meta/info.json"))
simple("info_fifo", OpenError("meta/info.json.*a FIFO"), lambda r: damage.replace_with_fifo(r / "meta/info.json"),
       fifo=True)
simple("info_fps_string", OpenError("meta/info.json.*fps"), _info(lambda i: i.__setitem__("fps", "30")))
simple("info_fps_zero", OpenError("meta/info.json.*fps"), _info(lambda i: i.__setitem__("fps", 0)))
simple("info_total_episodes_wrong", OpenError("total_episodes"), _info(lambda i: i.__setitem__("total_episodes", 5)))
simple("info_total_frames_wrong", OpenError("total_frames"),
       _info(lambda i: i.__setitem__("total_frames", i["total_frames"] + 1)))
simple("info_features_missing", OpenError("meta/info.json.*features"), _info(lambda i: i.pop("features")))
simple("info_shape_string", OpenError("meta/info.json.*action"),
       _info(lambda i: i["features"]["action"].__setitem__("shape", "6")))
simple("info_version_unsupported", OpenError("meta/info.json.*codebase_version"),
       _info(lambda i: i.__setitem__("codebase_version", "v9.0")))
simple("info_data_path_escape", OpenError("meta/info.json.*data_path.*dataset root"),
       _info(lambda i: i.__setitem__("data_path", "../{chunk_index:03d}/{file_index:03d}.parquet")))
simple("info_video_path_absolute", OpenError("meta/info.json.*video_path.*dataset root"),
       _info(lambda i: i.__setitem__("video_path", "/tmp/{video_key}/{file_index:03d}.mp4")))
simple("info_codec_says_mpeg4", Ok(0, "codec is h264 in the file, info.json says mpeg4"),
       _info(lambda i: i["features"][CAM]["info"].__setitem__("video.codec", "mpeg4")))
simple("info_pix_fmt_says_yuv444p", Ok(0, "pixel format is yuv420p in the file, info.json says yuv444p"),
       _info(lambda i: i["features"][CAM]["info"].__setitem__("video.pix_fmt", "yuv444p")))


STATE = "observation.state"


def _feature(key, **changes):
    return _info(lambda i: i["features"][key].update(changes))


# info.json's feature types against the data file's: the loaders refuse what would come out wrong
# (a float column declared integer would be truncated, a shape the rows do not have), serve what
# converts exactly (float32 values declared float64), and leave out what they cannot read, saying so.
simple("info_state_shape_wrong", EpisodeError({0, 1, 2, 3}, f"{DATA_FILE}.*episode [0-3].*column '{STATE}'"),
       _feature(STATE, shape=[3]), needs={"info_blind": True})
simple("info_state_declared_int64", EpisodeError({0, 1, 2, 3}, f"{DATA_FILE}.*column '{STATE}'.*declares dtype "
                                                                "int64.*float values"),
       _feature(STATE, dtype="int64"), needs={"info_blind": True})
simple("info_state_declared_float64", Ok(0), _feature(STATE, dtype="float64"))
simple("info_state_dtype_unreadable", Ok(0, "unknown dtype 'complex128'", check_rc=3, left_out=(STATE,)),
       _feature(STATE, dtype="complex128"))
simple("info_camera_fps_differs", Ok(0, "camera fps 15 differs from dataset fps", check_rc=3),
       _info(lambda i: i["features"][CAM]["info"].__setitem__("video.fps", 15)))


@variant("info_resolution_wrong", Ok(0, "frames are 64x48 in the file, info.json says 32x24", check_rc=3))
def _(r):
    def fn(i):
        f = i["features"][CAM]
        f["shape"] = [24, 32, 3]
        f["info"]["video.height"], f["info"]["video.width"] = 24, 32
    damage.edit_info(r, fn)


# ---- tasks and stats -------------------------------------------------------------

simple("tasks_missing", OpenError("meta/tasks.parquet"), lambda r: (r / "meta/tasks.parquet").unlink())
simple("tasks_truncated", OpenError("meta/tasks.parquet"),
       lambda r: damage.truncate(r / "meta/tasks.parquet", size_of(r, "meta/tasks.parquet") // 2))


@variant("tasks_one_removed", OpenError("meta/tasks.parquet.*total_tasks"))
def _(r):
    t = pq.read_table(r / "meta/tasks.parquet")
    pq.write_table(t.slice(0, t.num_rows - 1), r / "meta/tasks.parquet")


simple("stats_missing", Ok(0), lambda r: (r / "meta/stats.json").unlink())
simple("stats_garbage", Ok(1, "meta/stats.json"), lambda r: (r / "meta/stats.json").write_text("[1, 2"))

# ---- videos ----------------------------------------------------------------------


def _faststart(r):
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-c", "copy", "-movflags", "+faststart", tmp)
    tmp.replace(src)


simple("video_truncated_moov_last", EpisodeError({0, 1, 2, 3}, VIDEO_FILE),
       lambda r: damage.truncate(r / VIDEO_FILE, size_of(r, VIDEO_FILE) - 200))


@variant("video_truncated_moov_first", EpisodeError({0, 1, 2, 3}, VIDEO_FILE))
def _(r):
    _faststart(r)
    damage.truncate(r / VIDEO_FILE, size_of(r, VIDEO_FILE) * 2 // 3)


simple("video_empty", EpisodeError({0, 1, 2, 3}, f"{VIDEO_FILE}.*empty"), lambda r: damage.truncate(r / VIDEO_FILE, 0))
simple("video_missing", EpisodeError({0, 1, 2, 3}, f"{VIDEO_FILE}: cannot open: No such file"),
       lambda r: (r / VIDEO_FILE).unlink())
simple("video_directory", EpisodeError({0, 1, 2, 3}, VIDEO_FILE), lambda r: damage.replace_with_dir(r / VIDEO_FILE))
simple("video_fifo", OpenError(f"{VIDEO_FILE}.*a FIFO"), lambda r: damage.replace_with_fifo(r / VIDEO_FILE), fifo=True)
simple("video_garbage", EpisodeError({0, 1, 2, 3}, VIDEO_FILE),
       lambda r: (r / VIDEO_FILE).write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20))
simple("video_moov_flipped", EpisodeError({0, 1, 2, 3}, VIDEO_FILE),
       lambda r: damage.flip_byte(r / VIDEO_FILE, (r / VIDEO_FILE).read_bytes().rfind(b"moov") + 1))


@variant("video_faststart_intact", Ok(0))
def _(r):
    _faststart(r)


@variant("video_reencoded_mpeg4", Ok(0, "codec is mpeg4 in the file, info.json says h264"), needs={"exact": False})
def _(r):
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-c:v", "mpeg4", "-q:v", "2", "-vsync", "passthrough", "-enc_time_base", "-1",
                  "-video_track_timescale", "15360", tmp)
    tmp.replace(src)


def _reencode_cfr_dropping(r, first, count):
    """Re-encodes at constant frame rate without frames [first, first+count):
    later frames move `count` frames earlier in time, as a CFR re-encode
    after a drop does."""
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-vf", f"select='not(between(n\\,{first}\\,{first + count - 1}))',setpts=N/30/TB",
                  "-c:v", "libx264", "-g", "2", "-bf", "0", "-pix_fmt", "yuv420p", "-video_track_timescale", "15360",
                  tmp)
    tmp.replace(src)


# Counts that disagree with no pts gap to say where (docs/reliability.md,
# "Frame counts that disagree"): by time every frame after the drop would be
# served as another row's, so no frame of the file is placed: every episode
# in it is refused, the message naming the file and both counts.
NO_GAP = f"{VIDEO_FILE}.*holds 70 frames but its 4 episodes declare 80; no pts gap shows where frames are missing"
simple("video_frames_dropped_cfr", EpisodeError({0, 1, 2, 3}, NO_GAP), lambda r: _reencode_cfr_dropping(r, 30, 10))


@variant("video_frames_dropped_pts_kept", EpisodeError({2}, f"{VIDEO_FILE}.*episode 2.*(no video frame|refused)"),
         needs={"exact": False})
def _(r):
    """Frames 40..49 (episode 2's 1..10) dropped, every other frame keeping
    its timestamp: the pts gap shows where, so only episode 2 is refused and
    the others are mapped around the gap exactly (re-encoded: pixels differ)."""
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-vf", "select='not(between(n\\,40\\,49))'", "-c:v", "libx264", "-g", "2", "-bf", "0",
                  "-pix_fmt", "yuv420p", "-vsync", "passthrough", "-enc_time_base", "-1", "-video_track_timescale",
                  "15360", tmp)
    tmp.replace(src)


@variant("video_replaced_by_shorter_recording",
         EpisodeError({0, 1, 2, 3}, f"{VIDEO_FILE}.*holds 18 frames but its 4 episodes declare 80; no pts gap"))
def _(r):
    """The file of the 4 episodes replaced by a recording of episode 1 alone
    (its 18 frames from pts 0): by time, episode 0 would be served episode
    1's frames."""
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-vf", "select='between(n\\,21\\,38)',setpts=N/FRAME_RATE/TB", "-r", "30", "-c:v",
                  "libx264", "-g", "2", "-bf", "0", "-pix_fmt", "yuv420p", "-video_track_timescale", "15360", tmp)
    tmp.replace(src)


@variant("video_swapped_with_longer", EpisodeError({0, 1, 2, 3}, f"{VIDEO_FILE}.*another file in its place"))
def _(r):
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-i", src, "-filter_complex", "[0:v][1:v]concat=n=2:v=1[v]", "-map", "[v]", "-c:v",
                  "libx264", "-g", "2", "-bf", "0", "-video_track_timescale", "15360", tmp)
    tmp.replace(src)


# The last 5 frames cut: a regular pts grid 5 frames short, exactly what a
# CFR re-encode dropping 5 frames anywhere looks like: the whole file refused.
@variant("video_shortened",
         EpisodeError({0, 1, 2, 3}, f"{VIDEO_FILE}.*holds 75 frames but its 4 episodes declare 80; no pts gap"))
def _(r):
    src = r / VIDEO_FILE
    n = len(damage.ffprobe_frames(src))
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-frames:v", n - 5, "-c", "copy", tmp)
    tmp.replace(src)


@variant("video_other_resolution", Ok(0, "frames are 32x24 in the file, info.json says 64x48", check_rc=3),
         needs={"exact": False})
def _(r):
    src = r / VIDEO_FILE
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-vf", "scale=32:24", "-c:v", "libx264", "-g", "2", "-bf", "0", "-vsync", "passthrough",
                  "-enc_time_base", "-1", "-video_track_timescale", "15360", tmp)
    tmp.replace(src)
