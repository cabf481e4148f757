"""`vlafeed bench` and the bench/ scripts on a tiny make-sample dataset
(H.264 96x64): the JSON/CSV schema, sane metrics, the decode limit's ratio,
usage errors, and the helpers compare.py relies on (dataset replication,
the PyAV peer, the chart). No timing thresholds: every figure is only
checked for being present, finite and consistent."""
import csv
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

CSV_FIELDS = ["config", "mode", "loader", "batch_size", "threads", "image_format", "batches", "samples", "frames",
              "wallclock_s", "cpu_s", "frames_per_s_node", "frames_per_cpu_s", "samples_per_s",
              "first_batch_latency_s", "p50_sample_ms", "p95_sample_ms", "p99_sample_ms", "decoded_per_emitted",
              "cache_hits", "cache_misses", "cache_evictions", "cache_hit_rate", "cache_size", "cache_capacity",
              "peak_rss_mb", "loadavg_1m", "busy", "limit_kind", "limit_frames_per_s", "limit_frames_per_cpu_s",
              "ratio_limit_wall", "ratio_limit_cpu", "repeat", "ratio_limit_cpu_median", "ratio_limit_cpu_min",
              "ratio_limit_cpu_max", "ratio_limit_wall_median"]


@pytest.fixture(scope="module")
def tiny(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny"
    subprocess.run([cli, "make-sample", str(out), "--codec", "h264", "--size", "96x64", "--episodes", "4",
                    "--cameras", "2", "--min-length", "20", "--max-length", "30", "--quiet"], check=True)
    return out


def bench(cli, dataset, out_dir, *args):
    p = subprocess.run([cli, "bench", str(dataset), "--out-dir", str(out_dir), "--json", "--quiet", *args],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def positive(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def check_doc(doc, mode, loader, batch, batches, frames_per_sample):
    assert doc["schema"] == "vlafeed-bench/1"
    assert doc["config"] == f"{mode}-{loader}-b{batch}-t{doc['settings']['threads']}"
    s, r, m = doc["settings"], doc["results"], doc["machine"]
    assert (s["mode"], s["loader"], s["batch_size"], s["num_batches"]) == (mode, loader, batch, batches)
    assert m["cores"] >= 1 and isinstance(m["busy"], bool) and len(m["loadavg_before"]) == 3
    assert 0 <= m["spin_test_cpu_share"] <= 1.5
    assert r["batches"] == batches
    assert r["samples"] == batches * batch  # the tiny dataset holds more than batches x batch frames
    assert r["frames_per_sample"] == frames_per_sample
    assert r["frames"] == r["samples"] * frames_per_sample
    for key in ("wallclock_s", "cpu_s", "frames_per_s_node", "frames_per_cpu_s", "samples_per_s",
                "first_batch_latency_s", "peak_rss_mb", "batch_bytes"):
        assert positive(r[key]), key
    assert r["first_batch_latency_s"] <= r["wallclock_s"]
    assert math.isclose(r["frames_per_s_node"], r["frames"] / r["wallclock_s"], rel_tol=1e-4)
    assert math.isclose(r["samples_per_s"], r["samples"] / r["wallclock_s"], rel_tol=1e-4)
    lat = r["sample_latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
    assert r["frames_decoded"] > 0 and r["frames_assembled"] >= r["frames"]
    assert math.isclose(r["decoded_per_emitted"], r["frames_decoded"] / r["frames_assembled"], rel_tol=1e-4)
    c = r["decoder_cache"]
    assert c["misses"] >= 1 and c["hits"] >= 0 and c["evictions"] >= 0
    assert 0.0 <= c["hit_rate"] <= 1.0
    assert math.isclose(c["hit_rate"], c["hits"] / (c["hits"] + c["misses"]), rel_tol=1e-4)
    assert 1 <= c["size"] <= c["capacity"]
    assert r["peak_rss_mb"] >= r["rss_after_open_mb"] > 0
    assert doc["gpu_copy"]["done"] is False and doc["gpu_copy"]["reason"]


def check_limit(doc, kind):
    lim, ratios = doc["limit"], doc["ratios"]
    assert lim["kind"] == kind
    assert lim["threads"] == doc["settings"]["threads"]
    assert lim["frames"] >= 1 and lim["frames_decoded"] >= lim["frames"]
    assert lim["decoded_per_emitted"] >= 1.0
    for key in ("wallclock_s", "cpu_s", "frames_per_s", "frames_per_cpu_s"):
        assert positive(lim[key]), key
    assert positive(ratios["loader_vs_limit_wall"]) and positive(ratios["loader_vs_limit_cpu"])
    r = doc["results"]
    assert math.isclose(ratios["loader_vs_limit_wall"], r["frames_per_s_node"] / lim["frames_per_s"], rel_tol=1e-4)
    assert math.isclose(ratios["loader_vs_limit_cpu"], r["frames_per_cpu_s"] / lim["frames_per_cpu_s"], rel_tol=1e-4)


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 2 and rows[0] == CSV_FIELDS and len(rows[1]) == len(CSV_FIELDS)
    return dict(zip(rows[0], rows[1]))


def test_single_stream_with_limit_json_and_csv(cli, tiny, tmp_path):
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--loader", "stream", "--batch-size", "8",
                "--num-batches", "6", "--threads", "2", "--with-limit")
    check_doc(doc, "single", "stream", 8, 6, 2)
    assert doc["results"]["decoded_per_emitted"] >= 1.0
    check_limit(doc, "sequential")
    name = "single-stream-b8-t2"
    with open(tmp_path / f"{name}.json") as f:
        assert json.load(f) == doc
    row = read_csv(tmp_path / f"{name}.csv")
    assert row["config"] == name and row["mode"] == "single" and row["loader"] == "stream"
    assert float(row["frames_per_s_node"]) == pytest.approx(doc["results"]["frames_per_s_node"], rel=1e-4)
    assert float(row["ratio_limit_cpu"]) == pytest.approx(doc["ratios"]["loader_vs_limit_cpu"], rel=1e-4)
    assert row["limit_kind"] == "sequential" and row["busy"] in ("true", "false")
    assert 0.0 <= float(row["cache_hit_rate"]) <= 1.0


@pytest.mark.parametrize("loader", ["map", "pool"])
def test_single_random_access_with_limit(cli, tiny, tmp_path, loader):
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--loader", loader, "--batch-size", "8",
                "--num-batches", "4", "--threads", "1", "--with-limit", "--format", "uint8")
    assert doc["config"] == f"single-{loader}-b8-t1-u8"
    doc["config"] = f"single-{loader}-b8-t1"  # the uint8 suffix aside, the same checks
    check_doc(doc, "single", loader, 8, 4, 2)
    assert doc["settings"]["image_format"] == "uint8_chw" and doc["limit"]["image_format"] == "uint8_chw"
    assert doc["results"]["decoded_per_emitted"] >= 1.0
    check_limit(doc, "random")
    if loader == "pool":
        assert doc["results"]["pool"]["admitted"] >= 1
    assert (tmp_path / f"single-{loader}-b8-t1-u8.csv").exists()


def test_sarm_windows(cli, tiny, tmp_path):
    doc = bench(cli, tiny, tmp_path, "--mode", "sarm", "--loader", "map", "--batch-size", "4", "--num-batches",
                "3", "--threads", "2", "--with-limit", "--name", "my-sarm")
    check_doc(doc | {"config": "sarm-map-b4-t2"}, "sarm", "map", 4, 3, 16)  # 8 steps x 2 cameras
    assert doc["config"] == "my-sarm"
    assert doc["settings"]["delta_timestamps_s"] == [-7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0]
    # episodes of 20-30 frames: most look-back steps clamp to frame 0 and are decoded once
    assert 0 < doc["results"]["decoded_per_emitted"] < 1.0
    check_limit(doc, "random")
    assert (tmp_path / "my-sarm.json").exists() and (tmp_path / "my-sarm.csv").exists()


def test_more_batches_than_an_epoch_wraps(cli, tiny, tmp_path):
    frames = json.loads(subprocess.run([cli, "info", str(tiny), "--json"], capture_output=True, text=True,
                                       check=True).stdout)["total_frames"]
    batches = frames // 16 + 3
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--loader", "map", "--batch-size", "16", "--num-batches",
                str(batches), "--threads", "1")
    r = doc["results"]
    assert r["batches"] == batches and r["epochs"] == 2
    assert doc["limit"] is None and doc["ratios"] is None


def test_repeat_alternates_pairs_and_reports_median_and_spread(cli, tiny, tmp_path):
    """--repeat 4: four loader / limit pairs, the limit first in the odd ones; the median and the min-max of
    the per-pair ratios are computed from the pairs (checked here), pair 0 is the `results` / `limit` run,
    and the CSV carries the same summary."""
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--loader", "stream", "--batch-size", "8",
                "--num-batches", "6", "--threads", "2", "--with-limit", "--repeat", "4", "--name", "rep")
    check_doc(doc | {"config": "single-stream-b8-t2"}, "single", "stream", 8, 6, 2)
    check_limit(doc, "sequential")
    rep = doc["repeat"]
    assert rep["pairs"] == 4 and len(rep["runs"]) == 4
    assert [p["first"] for p in rep["runs"]] == ["loader", "limit", "loader", "limit"]
    for p in rep["runs"]:
        for key in ("loader_cpu_s", "loader_wallclock_s", "loader_frames_per_cpu_s", "limit_cpu_s",
                    "limit_wallclock_s", "limit_frames_per_cpu_s", "loader_vs_limit_cpu", "loader_vs_limit_wall"):
            assert positive(p[key]), key
        assert 0 <= p["loader_cpu_sys_s"] <= p["loader_cpu_s"] and 0 <= p["limit_cpu_sys_s"] <= p["limit_cpu_s"]
        assert p["loader_vs_limit_cpu"] == pytest.approx(p["loader_frames_per_cpu_s"] / p["limit_frames_per_cpu_s"],
                                                         rel=1e-4)
        # every loader run delivers the same frames, and every limit run decodes as many
        assert p["loader_frames_per_cpu_s"] * p["loader_cpu_s"] == pytest.approx(doc["results"]["frames"], rel=1e-4)
        assert p["limit_frames_per_cpu_s"] * p["limit_cpu_s"] == pytest.approx(doc["limit"]["frames"], rel=1e-4)
    first = rep["runs"][0]
    assert first["loader_vs_limit_cpu"] == pytest.approx(doc["ratios"]["loader_vs_limit_cpu"], rel=1e-4)
    assert first["loader_cpu_s"] == pytest.approx(doc["results"]["cpu_s"], rel=1e-4)
    for key in ("loader_vs_limit_cpu", "loader_vs_limit_wall"):
        values = sorted(p[key] for p in rep["runs"])
        assert rep[key]["min"] == pytest.approx(values[0], rel=1e-6)
        assert rep[key]["max"] == pytest.approx(values[-1], rel=1e-6)
        assert rep[key]["median"] == pytest.approx((values[1] + values[2]) / 2, rel=1e-6)  # even count: mean of two
    # 6 batches are too few for a steady state: no figure rather than a made-up one
    assert all(p["loader_steady_frames_per_cpu_s"] is None for p in rep["runs"])
    assert rep["loader_steady_vs_limit_cpu"] == {"median": None, "min": None, "max": None}
    row = read_csv(tmp_path / "rep.csv")
    assert row["repeat"] == "4"
    assert float(row["ratio_limit_cpu_median"]) == pytest.approx(rep["loader_vs_limit_cpu"]["median"], rel=1e-4)
    assert float(row["ratio_limit_cpu_min"]) <= float(row["ratio_limit_cpu_median"]) <= float(
        row["ratio_limit_cpu_max"])


def test_repeat_odd_count_median_is_the_middle_pair(cli, tiny, tmp_path):
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--loader", "map", "--batch-size", "4",
                "--num-batches", "2", "--threads", "1", "--with-limit", "--repeat", "3")
    rep = doc["repeat"]
    values = sorted(p["loader_vs_limit_cpu"] for p in rep["runs"])
    assert rep["loader_vs_limit_cpu"]["median"] == pytest.approx(values[1], rel=1e-6)
    assert doc["limit"]["kind"] == "random"


def test_without_repeat_the_summary_is_the_single_pair(cli, tiny, tmp_path):
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--batch-size", "4", "--num-batches", "2", "--with-limit")
    rep = doc["repeat"]
    assert rep["pairs"] == 1 and rep["runs"][0]["first"] == "loader"
    r = doc["ratios"]["loader_vs_limit_cpu"]
    assert rep["loader_vs_limit_cpu"] == pytest.approx({"median": r, "min": r, "max": r}, rel=1e-6)
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--batch-size", "4", "--num-batches", "2")
    assert doc["repeat"] is None


def test_summary_text(cli, tiny, tmp_path):
    p = subprocess.run([cli, "bench", str(tiny), "--mode", "single", "--batch-size", "4", "--num-batches", "2",
                        "--with-limit", "--quiet"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for line in ("frames/s (node)", "decoded per emitted", "decoder cache", "peak RSS", "gpu copy",
                 "decode limit", "loader / limit"):
        assert line in p.stdout
    assert "pairs (alternating order)" not in p.stdout
    p = subprocess.run([cli, "bench", str(tiny), "--mode", "single", "--batch-size", "4", "--num-batches", "2",
                        "--with-limit", "--repeat", "3", "--quiet"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "loader / limit, 3 pairs (alternating order)" in p.stdout
    per_pair = [line for line in p.stdout.splitlines() if "per pair, CPU" in line]
    assert len(per_pair) == 1 and len(per_pair[0].split("CPU")[1].split(",")) == 3


@pytest.mark.parametrize("args, code, message", [
    ([], 2, "--mode single|sarm is required"),
    (["--mode", "both"], 2, "--mode must be single or sarm"),
    (["--mode", "single", "--loader", "fast"], 2, "--loader must be stream, map or pool"),
    (["--mode", "single", "--batch-size", "0"], 2, "--batch-size"),
    (["--mode", "single", "--format", "f16"], 2, "--format must be float32 or uint8"),
    (["--mode", "single", "--bogus"], 2, "unknown option '--bogus'"),
    (["--mode", "single", "--repeat", "3"], 2, "--repeat needs --with-limit"),
    (["--mode", "single", "--with-limit", "--repeat", "0"], 2, "--repeat"),
])
def test_usage_errors(cli, tiny, args, code, message):
    p = subprocess.run([cli, "bench", str(tiny), *args], capture_output=True, text=True)
    assert p.returncode == code and message in p.stderr


def test_missing_dataset_names_it(cli, tmp_path):
    p = subprocess.run([cli, "bench", str(tmp_path / "nope"), "--mode", "single"], capture_output=True, text=True)
    assert p.returncode == 1 and "nope" in p.stderr


def test_pool_size_and_cache_settings_are_recorded(cli, tiny, tmp_path):
    doc = bench(cli, tiny, tmp_path, "--mode", "single", "--loader", "pool", "--batch-size", "4", "--num-batches",
                "2", "--pool-size", "2", "--cache-entries", "3", "--threads", "1")
    assert doc["settings"]["episode_pool_size"] == 2 and doc["settings"]["decoder_cache_entries"] == 3
    assert doc["results"]["decoder_cache"]["capacity"] == 3


def test_replicate_dataset_concat_and_files(cli, tiny, tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import replicate_dataset
    finally:
        sys.path.pop(0)
    base_info = json.loads((tiny / "meta" / "info.json").read_text())
    for layout in ("concat", "files"):
        dst = tmp_path / layout
        replicate_dataset.replicate(str(tiny), str(dst), 3, layout)
        info = json.loads(subprocess.run([cli, "info", str(dst), "--json"], capture_output=True, text=True,
                                         check=True).stdout)
        assert info["total_episodes"] == 3 * base_info["total_episodes"]
        assert info["total_frames"] == 3 * base_info["total_frames"]
        p = subprocess.run([cli, "decode-check", str(dst), "--json", "--quiet"], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr
        mp4s = sorted(dst.glob("videos/*/chunk-000/*.mp4"))
        assert len(mp4s) == (2 if layout == "concat" else 6)
    with pytest.raises(FileExistsError):
        replicate_dataset.replicate(str(tiny), str(tmp_path / "concat"), 2)


def test_pyav_peer_writes_the_same_schema(tiny, tmp_path):
    p = subprocess.run([sys.executable, str(BENCH / "peers" / "pyav_peer.py"), str(tiny), "--mode", "sarm",
                        "--num-batches", "2", "--batch-size", "2", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "peer-pyav-sarm-span-w0.json").read_text())
    r = doc["results"]
    assert doc["settings"]["mode"] == "sarm" and r["batches"] == 2 and r["samples"] == 4
    assert r["frames"] == 4 * 8 * 2
    for key in ("frames_per_s_node", "frames_per_cpu_s", "samples_per_s", "first_batch_latency_s", "peak_rss_mb"):
        assert positive(r[key]), key
    assert r["decoded_per_emitted"] > 0


def test_plot_bench_draws_the_runs(cli, tiny, tmp_path):
    pytest.importorskip("matplotlib")
    bench(cli, tiny, tmp_path, "--mode", "single", "--batch-size", "4", "--num-batches", "2", "--with-limit")
    bench(cli, tiny, tmp_path, "--mode", "sarm", "--batch-size", "2", "--num-batches", "2")
    png = tmp_path / "chart.png"
    p = subprocess.run([sys.executable, str(BENCH / "plot_bench.py"), str(tmp_path), "--out", str(png)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_map_mode_decoder_cache_holds_every_file(cli, tiny, tmp_path):
    """Map mode's default cache bound is the video files (at least 32, at most
    128), whatever the thread count: a batch of random positions touches every
    file, and the engine threads share one reader per file (they used to check
    out one each, and the bound was files x threads)."""
    sys.path.insert(0, str(BENCH))
    try:
        import replicate_dataset
    finally:
        sys.path.pop(0)
    many = tmp_path / "many"
    replicate_dataset.replicate(str(tiny), str(many), 20, "files")  # 20 MP4s per camera, 40 in all
    for threads in (1, 2, 8):
        doc = bench(cli, many, tmp_path, "--mode", "single", "--loader", "map", "--batch-size", "32",
                    "--num-batches", "3", "--threads", str(threads), "--format", "uint8")
        c = doc["results"]["decoder_cache"]
        assert c["capacity"] == 40
        assert c["evictions"] == 0  # every file's reader fits, at any thread count
    doc = bench(cli, many, tmp_path, "--mode", "single", "--loader", "stream", "--batch-size", "8",
                "--num-batches", "2", "--threads", "2")
    assert doc["results"]["decoder_cache"]["capacity"] == 32  # stream mode: unchanged


def _droid_bench():
    sys.path.insert(0, str(BENCH))
    try:
        import droid_bench
    finally:
        sys.path.remove(str(BENCH))
    return droid_bench


def test_droid_bench_served_bytes(tmp_path):
    """The remote figure counts each GET's range as served (open ends clipped to the file, suffix ranges,
    whole files without a Range), and nothing for HEADs."""
    db = _droid_bench()
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.bin").write_bytes(b"x" * 1000)
    log = [("HEAD", "/ds/a.bin", None), ("GET", "/ds/a.bin", "bytes=0-99"), ("GET", "/ds/a.bin", "bytes=900-"),
           ("GET", "/ds/a.bin", "bytes=-50"), ("GET", "/ds/a.bin", None), ("GET", "/ds/a.bin", "bytes=990-5000")]
    total, requests = db.served_bytes(log, str(tmp_path), "")
    assert requests == 5
    assert total == 100 + 100 + 50 + 1000 + 10


def test_droid_bench_gop_floor(tiny):
    """The floor of a frame is the bytes from its GOP's keyframe to it: a keyframe costs its own packet, every
    frame costs at least that, and the mean over frames lies between the smallest packet and the file size."""
    av = pytest.importorskip("av")
    db = _droid_bench()
    mp4 = sorted((tiny / "videos").rglob("*.mp4"))[0]
    cost = db.packet_index(str(mp4))
    with av.open(str(mp4)) as c:
        pkts = [(p.pts, p.size, p.is_keyframe) for p in c.demux(c.streams.video[0]) if p.size > 0]
    by_pts = sorted(pkts)
    assert len(cost) == len(by_pts)
    for (pts, size, key), c in zip(by_pts, cost):
        assert c >= size
        if key:
            assert c == size
    assert any(c > s for (_, s, _), c in zip(by_pts, cost))  # GOP 2: some frames need their keyframe too
    video, table = db.sample_floor(str(tiny))
    assert 0 < table < video < sum(s for _, s, _ in pkts) * 2
