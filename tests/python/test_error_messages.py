"""Error messages that used to be vague (issue 10): each names the file and
the cause.

  * an HTTP outage in the middle of reading a video: the HTTP status and
    the URL, not "corrupt (truncated?) video packet";
  * a damaged moov box (sample table): "the container's index cannot serve
    it (corrupt ... moov box?)", not errno's "Operation not permitted"; an
    absurd count in it: a named corrupt-file error, not a bare MemoryError;
  * messages that joined camera and episode without a separator
    ("camera imageepisode 4") and `decode-check` lines saying
    "(episode -1)" for a whole-file problem.
"""
import os
import pathlib
import re
import struct
import subprocess
import sys
import warnings

import pytest

import vlafeed

import damage
from corpus_variants import BASE_OPTIONS, VARIANTS
from remote_server import Faults, RemoteServer

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("messages") / "base", **BASE_OPTIONS)


def boxes(raw):
    """{box type: offset} of the MP4 box tree (first occurrence of each)."""
    found = {}

    def walk(a, b):
        while a + 8 <= b:
            size, typ = struct.unpack(">I4s", raw[a:a + 8])
            found.setdefault(typ.decode("latin-1"), a)
            if typ in (b"moov", b"trak", b"mdia", b"minf", b"stbl"):
                walk(a + 8, a + size)
            if size < 8:
                break
            a += size
    walk(0, len(raw))
    return found


def first_error(root):
    """The first error reading the dataset (open or items), or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = vlafeed.LeRobotDataset(str(root), output="numpy")
            for i in range(len(ds)):
                ds[i]
        except Exception as e:  # noqa: BLE001 - the caller asserts type and message
            return e
    return None


# (box, byte offset inside it): the stss box's first keyframe entry, the
# stsd box's entry count, the mvhd box's type.
MOOV_DAMAGE = [("stss", 17), ("stsd", 17), ("mvhd", 4)]


@pytest.mark.parametrize("box,offset", MOOV_DAMAGE, ids=[b for b, _ in MOOV_DAMAGE])
def test_damaged_moov_is_named_with_its_cause(base, tmp_path, box, offset):
    root = damage.copy(base, tmp_path / "ds")
    path = root / damage.VIDEO_FILE
    raw = path.read_bytes()
    at = boxes(raw)[box] + offset
    damage.flip_byte(path, at)
    e = first_error(root)
    assert e is not None, f"flipping {box}+{offset} went unnoticed"
    msg = str(e)
    assert not isinstance(e, MemoryError), repr(e)
    assert str(path) in msg, msg
    assert "Operation not permitted" not in msg, msg
    assert re.search(r"moov|corrupt|truncated|damaged", msg), msg


def test_the_two_rewritten_causes(base, tmp_path):
    """The stss and stsd flips give exactly the two new messages."""
    got = {}
    for box in ("stss", "stsd"):
        root = damage.copy(base, tmp_path / box)
        path = root / damage.VIDEO_FILE
        damage.flip_byte(path, boxes(path.read_bytes())[box] + 17)
        got[box] = str(first_error(root))
    assert "seek failed: the container's index cannot serve it (corrupt or inconsistent sample table in the moov " \
           "box?)" in got["stss"], got["stss"]
    assert "FFmpeg could not allocate memory for it (a corrupt count or size in the file?)" in got["stsd"], got["stsd"]


def test_http_outage_mid_video_names_the_status_and_url(cli, tmp_path, monkeypatch):
    """The MP4 (read in 4 KiB range requests) answers its first N requests,
    then 503 for good: whichever read meets the outage (the index at open, a
    packet while decoding), the error carries HTTP 503 and the URL. Before
    the fix, N = 13 gave "corrupt (truncated?) video packet"."""
    monkeypatch.setenv("VF_HTTP_ATTEMPTS", "2")
    monkeypatch.setenv("VF_HTTP_BLOCK_BYTES", "4096")
    root = damage.make_sample(cli, tmp_path / "ds", episodes=4, cameras=1, size="320x240", min_length=40,
                              max_length=60)
    failed_while_decoding = 0
    for served_first in (2, 5, 8, 13):
        with RemoteServer(tmp_path, Faults(match="file-000.mp4", fail_after=served_first)) as srv:
            e = first_error(srv.url("ds"))
            video_url = srv.url(f"ds/{damage.VIDEO_FILE}")
        assert e is not None, f"the outage after {served_first} requests went unnoticed"
        msg = str(e)
        assert "corrupt (truncated?) video packet" not in msg, msg
        assert "HTTP 503" in msg and video_url in msg, msg
        failed_while_decoding += "frame" in msg  # "episode E frame F": an item's read, not the open
    assert failed_while_decoding > 0


def test_span_messages_separate_camera_and_episode(cli, base, tmp_path):
    """Frames 40-49 dropped with their timestamps kept (a pts gap shows where):
    frames are matched by timestamp around the gap and the missing ones
    reported for the episode that lost them."""
    root = damage.copy(base, tmp_path / "ds")
    VARIANTS["video_frames_dropped_pts_kept"].mutate(root)
    code = f"import vlafeed\nds = vlafeed.LeRobotDataset({str(root)!r})\nds[0]\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"camera {damage.CAM}: episode 2: frames 1..10 (10 of" in out, out
    assert not re.search(rf"{re.escape(damage.CAM)}episode", out), out


def test_decode_check_whole_file_problem_has_no_episode_minus_one(cli, base, tmp_path):
    root = damage.copy(base, tmp_path / "ds")
    (root / damage.VIDEO_FILE).unlink()
    r = subprocess.run([cli, "decode-check", str(root)], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "(episode -1)" not in out, out
    assert damage.VIDEO_FILE in out and f"(camera {damage.CAM})" in out, out


def test_resume_state_errors_name_the_real_cause(base):
    """A state with a negative epoch or a negative samples_consumed is refused
    for that reason (samples_consumed -8 used to be refused as "not a multiple
    of world_size 1"); an unknown key is a KeyError-style message naming the
    dataset's features."""
    loader = vlafeed.Loader(str(base), batch_size=4, rank=0, world_size=1)
    good = loader.state_dict()
    for field, value, says in [("epoch", -1, "epoch -1 is negative"),
                               ("samples_consumed", -8, "samples_consumed -8 is negative")]:
        bad = dict(good, **{field: value})
        other = vlafeed.Loader(str(base), batch_size=4, rank=0, world_size=1)
        with pytest.raises(ValueError, match=re.escape(says)):
            other.load_state_dict(bad)
        other.close()
    with pytest.raises(ValueError, match=r"unknown key 'nope' \(the dataset's features: .*observation\.state"):
        vlafeed.Loader(str(base), batch_size=4, keys=["nope"])
    loader.close()


def test_negative_batch_count_is_named(base):
    """The state after -1 batches is refused as negative, not as "-1 batches is past the epoch"."""
    from vlafeed import _native
    d = _native.Dataset(str(base))
    with pytest.raises(IndexError, match=re.escape("loader state: batches -1 is negative")):
        _native.loader_state(d, batch_size=4, batches=-1)
    assert _native.loader_state(d, batch_size=4, batches=1)["samples_consumed"] == 4


def test_memory_error_says_what_could_not_be_allocated(base):
    """A batch that cannot be allocated (here 16M samples of 1024x1024 frames, ~400 TB) raises a
    MemoryError saying what and how much, not a bare MemoryError."""
    with pytest.raises(MemoryError, match=r"vlafeed: out of memory allocating a batch buffer of \d+ bytes"):
        loader = vlafeed.Loader(str(base), batch_size=16777216, resize=(1024, 1024), output="numpy")
        next(iter(loader))
