"""Video files whose frame count disagrees with their episodes
(docs/reliability.md, "Frame counts that disagree"; src/video/episodes.c).

A make-sample dataset (frames carry their identity: episode, frame, camera)
with several MP4s of one or two episodes each, damaged three ways:

  * cfr_drop: an MP4 of two episodes re-encoded at constant frame rate
    without 10 frames of its first episode. Its pts grid is regular, so
    every later frame sits where the metadata expects another one: matched
    by time, the second episode would be served 10 frames late. Every
    episode of the file is refused (open, items, on_error="skip" in
    LeRobotDataset and every Loader mode, `vlafeed info`, `decode-check
    --thorough`: each names the file, both counts and every episode in it);
    every other file is served exactly. VF_VIDEO_MISMATCH=timestamp (the
    opt-in) serves it by timestamp again, with one warning for the file.
  * swap: an MP4 of two episodes replaced by a shorter recording of another
    episode (by time its first episode would get the other one's frames):
    refused the same way.
  * gap: 10 frames dropped with their timestamps kept (the pts show where
    they are missing): mapped around the gap exactly as before, only the
    episode that lost frames refused.
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

import vlafeed

import damage
import lerobot_reference as R
from damage import CAM

pytestmark = pytest.mark.skipif(subprocess.run(["which", "ffmpeg"], capture_output=True).returncode != 0,
                                reason="ffmpeg command not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPTIONS = dict(episodes=6, cameras=1, size="96x64", codec="h264", min_length=10, max_length=30,
               extra=("--max-video-mb", "0.008"))
X264 = ["-c:v", "libx264", "-g", "2", "-bf", "0", "-pix_fmt", "yuv420p", "-video_track_timescale", "15360"]


def video_rel(file_index):
    return f"videos/{CAM}/chunk-000/file-{file_index:03d}.mp4"


def layout(root):
    """{file_index: [(episode, length), ...]} of the camera, in episode order."""
    rows = pq.read_table(pathlib.Path(root) / damage.EPISODES_FILE).to_pylist()
    files = {}
    for r in rows:
        files.setdefault(r[f"videos/{CAM}/file_index"], []).append((r["episode_index"], r["length"]))
    return files


def two_episode_files(root, first_longer_than=0):
    return [f for f, eps in sorted(layout(root).items()) if len(eps) >= 2 and eps[0][1] > first_longer_than]


def episode_of_items(root):
    """The episode of every item position (episodes in index order)."""
    rows = sorted(pq.read_table(pathlib.Path(root) / damage.EPISODES_FILE).to_pylist(),
                  key=lambda r: r["episode_index"])
    return [r["episode_index"] for r in rows for _ in range(r["length"])]


def reencode(root, file_index, vf, *extra):
    src = pathlib.Path(root) / video_rel(file_index)
    tmp = src.with_suffix(".tmp.mp4")
    damage.ffmpeg("-i", src, "-vf", vf, *X264, *extra, tmp)
    tmp.replace(src)


def cfr_drop(root):
    """File F (two episodes) re-encoded at 30 fps CFR without its frames 5..14."""
    f = two_episode_files(root, 15)[0]
    reencode(root, f, "select='not(between(n\\,5\\,14))',setpts=N/FRAME_RATE/TB", "-r", "30")
    eps = layout(root)[f]
    n = sum(length for _, length in eps)
    return f, [e for e, _ in eps], n - 10, n


def swap(root):
    """File F (two episodes) replaced by a shorter recording of an episode of another file."""
    files = layout(root)
    f = two_episode_files(root)[-1]
    n = sum(length for _, length in files[f])
    other, start, length = next((g, sum(x for _, x in eps[:i]), eps[i][1]) for g, eps in sorted(files.items())
                                if g != f for i in range(len(eps)) if eps[i][1] < n)
    src = pathlib.Path(root) / video_rel(other)
    dst = pathlib.Path(root) / video_rel(f)
    damage.ffmpeg("-i", src, "-vf", f"select='between(n\\,{start}\\,{start + length - 1})',setpts=N/FRAME_RATE/TB",
                  "-r", "30", *X264, dst.with_suffix(".tmp.mp4"))
    dst.with_suffix(".tmp.mp4").replace(dst)
    return f, [e for e, _ in files[f]], length, n


def gap(root):
    """File F's frames 5..14 dropped with the others' timestamps kept (a pts gap)."""
    f = two_episode_files(root, 15)[0]
    reencode(root, f, "select='not(between(n\\,5\\,14))'", "-vsync", "passthrough", "-enc_time_base", "-1")
    return f, [e for e, _ in layout(root)[f]]


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    root = damage.make_sample(cli, tmp_path_factory.mktemp("mismatch") / "base", **OPTIONS)
    if not two_episode_files(root, 15) or len(two_episode_files(root)) < 2:
        pytest.skip(f"make-sample laid the episodes out as {layout(root)}: no two-episode file to damage")
    return root


@pytest.fixture(autouse=True)
def no_opt_in(monkeypatch):
    monkeypatch.delenv("VF_VIDEO_MISMATCH", raising=False)


def damaged(base, tmp_path, how):
    root = damage.copy(base, tmp_path / "ds")
    return root, how(root)


def run_cli(cli, *args, env=None):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def identity(frame):
    return R.read_identity(np.asarray(frame))


def check_items(root, refused, pattern):
    """Every item of a refused episode raises matching pattern; every other item is its own frame."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = vlafeed.LeRobotDataset(root, image_format="uint8_hwc", output="numpy")
    served = 0
    episode_of = episode_of_items(root)
    assert len(ds) == len(episode_of)
    for i in range(len(ds)):
        try:
            item = ds[i]
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            assert episode_of[i] in refused, f"item {i}: {e}"
            assert re.search(pattern, str(e)), f"item {i}: {e}"
            continue
        ep, frame = int(item["episode_index"]), int(item["frame_index"])
        assert ep not in refused, f"item {i} of refused episode {ep} was served"
        assert identity(item[CAM]) == (ep, frame, 0), f"item {i}"
        served += 1
    return served


@pytest.mark.parametrize("how", [cfr_drop, swap], ids=["cfr_drop", "swap"])
def test_open_refuses_every_episode_of_the_file(base, tmp_path, how):
    root, (f, episodes, found, declared) = damaged(base, tmp_path, how)
    counts = f"the file holds {found} frames but its {len(episodes)} episodes declare {declared}"
    problems = vlafeed.LeRobotDatasetMetadata(root).vf_info["problems"]
    errors = [p for p in problems if p["severity"] == "error"]
    whole = [p for p in errors if p["file"] == video_rel(f) and p["episode"] is None]
    assert len(whole) == 1, errors
    assert counts in whole[0]["message"], whole[0]
    assert "no pts gap shows where frames are missing, so no frame of this file can be placed" in whole[0]["message"]
    assert sorted(p["episode"] for p in errors if p["episode"] is not None) == episodes, errors
    assert all(p["file"] == video_rel(f) and counts in p["message"] for p in errors), errors
    total = sum(length for eps in layout(root).values() for _, length in eps)
    served = check_items(root, set(episodes), re.escape(video_rel(f)) + ".*" + re.escape(counts))
    assert served == total - declared


@pytest.mark.parametrize("how", [cfr_drop, swap], ids=["cfr_drop", "swap"])
def test_skip_serves_no_frame_of_the_file(base, tmp_path, how):
    root, (f, episodes, found, declared) = damaged(base, tmp_path, how)
    with pytest.warns(UserWarning, match=re.escape(video_rel(f))):
        ds = vlafeed.LeRobotDataset(root, image_format="uint8_hwc", output="numpy", on_error="skip")
    assert ds.skipped_episodes == episodes
    for i in range(len(ds)):
        item = ds[i]
        assert identity(item[CAM]) == (int(item["episode_index"]), int(item["frame_index"]), 0), f"item {i}"
    for mode in ("stream", "map", "pool"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = vlafeed.Loader(str(root), mode=mode, batch_size=5, seed=3, threads=2, output="numpy",
                                    image_format="uint8_hwc", on_error="skip")
            seen = 0
            for batch in loader:
                for k in range(len(batch["index"])):
                    ep, frame = int(batch["episode_index"][k]), int(batch["frame_index"][k])
                    assert ep not in episodes, f"{mode}: a frame of refused episode {ep} was served"
                    assert identity(batch[CAM][k]) == (ep, frame, 0), f"{mode}: episode {ep} frame {frame}"
                    seen += 1
            stats, skips = loader.stats(), loader.skipped
            loader.close()
        assert seen > 0 and stats["skipped"] > 0, mode
        if mode != "pool":
            assert stats["skipped"] == declared, (mode, stats["skipped"])
        assert skips and all(k["file"].endswith(video_rel(f)) for k in skips), mode


def test_cli_names_the_file_and_every_episode(cli, base, tmp_path):
    root, (f, episodes, found, declared) = damaged(base, tmp_path, cfr_drop)
    counts = f"the file holds {found} frames but its {len(episodes)} episodes declare {declared}"
    info = run_cli(cli, "info", root)
    assert info.returncode == 1, info.stdout
    line = next(x for x in info.stdout.splitlines() if x.strip().startswith(f"error   {video_rel(f)} [{CAM}]:"))
    assert counts in line and "no pts gap shows where frames are missing" in line, line
    for e in episodes:
        assert f"{video_rel(f)} [episode {e}]" in info.stdout, info.stdout
    thorough = run_cli(cli, "decode-check", "--thorough", "--quiet", root)
    assert thorough.returncode == 1, thorough.stdout
    line = next(x for x in thorough.stdout.splitlines() if "file_refused" in x)
    assert video_rel(f) in line and counts in line, line
    for e in episodes:
        assert re.search(rf"{re.escape(video_rel(f))}: unmatched \(camera {re.escape(CAM)}\) \(episode {e}\)",
                         thorough.stdout), thorough.stdout
    others = {e for eps in layout(root).values() for e, _ in eps} - set(episodes)
    assert not any(f"(episode {e})" in thorough.stdout for e in others), thorough.stdout
    report = json.loads(run_cli(cli, "decode-check", "--json", "--no-decode", root).stdout)
    mapping = {x["file"]: x["mapping"] for x in report["cameras"][0]["files"]}
    assert mapping.pop(video_rel(f)) == "refused"
    assert set(mapping.values()) == {"ordinal"}


def test_timestamp_opt_in_serves_by_timestamp_and_warns_once_per_file(cli, base, tmp_path):
    root, (f, episodes, found, declared) = damaged(base, tmp_path, cfr_drop)
    code = (
        "import warnings, vlafeed, lerobot_reference as R\n"
        "warnings.simplefilter('ignore')\n"
        f"ds = vlafeed.LeRobotDataset({str(root)!r}, image_format='uint8_hwc', output='numpy')\n"
        "out = []\n"
        "for i in range(len(ds)):\n"
        "    try:\n"
        "        it = ds[i]\n"
        f"        out.append((int(it['episode_index']), int(it['frame_index']), R.read_identity(it[{CAM!r}])))\n"
        "    except Exception as e:\n"
        "        out.append(None)\n"
        "print(repr(out))\n"
        "print(repr([p for p in ds.meta.vf_info['problems'] if p['severity'] == 'warning']))\n")
    env = dict(os.environ, VF_VIDEO_MISMATCH="timestamp",
               PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", str(ROOT / "python")),
                                           str(ROOT / "tests" / "python")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    items_line, problems_line = r.stdout.strip().splitlines()[-2:]
    items = eval(items_line)  # noqa: S307 - our own repr of ints and tuples
    served = [x for x in items if x is not None and x[0] in episodes]
    # served by timestamp: the first frames are right, those after the drop are other frames
    assert served and any(ident != (ep, frame, 0) for ep, frame, ident in served)
    assert all(ident == (ep, frame, 0) for ep, frame, ident in (x for x in items if x and x[0] not in episodes))
    warns = [x for x in r.stderr.splitlines() if "served by timestamp anyway" in x]
    assert len(warns) == 1 and video_rel(f) in warns[0] and "warning" in warns[0], r.stderr
    problems = eval(problems_line)  # noqa: S307
    assert [p["file"] for p in problems if "served by timestamp anyway" in p["message"]] == [video_rel(f)]
    info = run_cli(cli, "info", root, env=dict(os.environ, VF_VIDEO_MISMATCH="timestamp"))
    assert f"warning {video_rel(f)} [{CAM}]: " in info.stdout and "served by timestamp anyway" in info.stdout, \
        info.stdout


def test_pts_gaps_are_still_mapped_around_exactly(cli, base, tmp_path):
    root, (f, episodes) = damaged(base, tmp_path, gap)
    first, rest = episodes[0], set(episodes[1:])
    served = check_items(root, {first}, re.escape(video_rel(f)) + f".*episode {first}")
    total = sum(length for eps in layout(root).values() for _, length in eps)
    assert served == total - dict(layout(root)[f])[first]
    assert rest  # the episode after the gap, in the same file, served exactly above
    info = run_cli(cli, "info", root)
    assert "no pts gap" not in info.stdout and f"[episode {first}]" in info.stdout, info.stdout
    report = json.loads(run_cli(cli, "decode-check", "--json", "--no-decode", root).stdout)
    mapping = {x["file"]: x["mapping"] for x in report["cameras"][0]["files"]}
    assert mapping[video_rel(f)] == "timestamp"


def test_python_keyword_overrides_the_environment(base, tmp_path, monkeypatch):
    """video_mismatch= on Loader / LeRobotDataset / LeRobotDatasetMetadata: "timestamp" serves the file
    with a LoaderWarning naming it (once per file), "refuse" refuses it even where VF_VIDEO_MISMATCH
    says timestamp, anything else is a ValueError naming the keyword."""
    from vlafeed.data.loader import LoaderWarning
    root, (f, episodes, found, declared) = damaged(base, tmp_path, cfr_drop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = vlafeed.Loader(root, mode="map", batch_size=4, video_mismatch="timestamp", output="numpy")
        next(iter(loader))
        loader.close()
    said = [str(w.message) for w in caught if issubclass(w.category, LoaderWarning)
            and "served by timestamp" in str(w.message)]
    assert len(said) == 1 and video_rel(f) in said[0], [str(w.message) for w in caught]
    monkeypatch.setenv("VF_VIDEO_MISMATCH", "timestamp")
    ds = vlafeed.LeRobotDataset(root, video_mismatch="refuse", on_error="skip")
    assert set(episodes) <= set(ds.skipped_episodes)
    with pytest.raises(ValueError, match="video_mismatch"):
        vlafeed.LeRobotDatasetMetadata(root, video_mismatch="nearest")
