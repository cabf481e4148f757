"""Remote dataset roots over loopback: http:// through tests/python/remote_server.py
(Range support, fault injection) and s3:// through moto's server.

What is proven: `vlafeed info URL` equals the local report (but for the path);
the Loader (stream and map) and LeRobotDataset over a URL give exactly the
local batches/items; metadata files are fetched once per open; retries recover
from 500s, connection resets and truncated bodies, a reset body resuming at
the exact next byte; with the default retry policy a 3 s outage is ridden out,
Retry-After is honoured, 404 is never retried, and an outage longer than the
time budget fails naming the URL, the last status, the attempts and the
budget; exhausted retries, stalls and refused connections fail with messages
naming the URL and the status, within a bounded time (a 503 while listing
meta/episodes too, not "missing"); missing remote files are reported like
local ones, and a file whose HEAD fails until the retries run out (503, 500,
resets) is "unreachable", an error naming URL and status, never "missing";
closing a loader, from its own thread or another, does not wait for reads
riding out an outage (they are cancelled; the iterating thread gets an
error, not a batch); an S3 bucket (SigV4 with dummy credentials, custom endpoint,
path-style) gives the local results too.

All traffic stays on 127.0.0.1; servers stop by themselves; every test runs
under a watchdog (faulthandler) so a hang kills the run instead of blocking it.
"""
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from remote_server import Faults, RemoteServer, s3_env, upload_tree  # noqa: E402

import vlafeed  # noqa: E402

TEST_TIMEOUT_S = 180

# Fast, bounded retries for every client opened by these tests (in-process and CLI).
FAST_HTTP = {
    "VF_HTTP_ATTEMPTS": "4",
    "VF_HTTP_BACKOFF_S": "0.02",
    "VF_HTTP_BACKOFF_MAX_S": "0.1",
    "VF_HTTP_BUDGET_S": "30",
    "VF_HTTP_CONNECT_TIMEOUT_S": "5",
    "VF_HTTP_BLOCK_BYTES": "8192",  # small read-ahead blocks: reads cross block edges
}


@pytest.fixture(autouse=True)
def watchdog(monkeypatch):
    """Per-test timeout: dumps the stacks and exits if a test runs too long.
    (A C-level hang cannot be interrupted from Python; this cannot miss it.)"""
    for k, v in FAST_HTTP.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def run(cli, *args, env=None, timeout=120):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="module")
def served(cli, tmp_path_factory):
    """A make-sample dataset (6 episodes, 2 H.264 cameras 96x64, several MP4
    files per camera) under <top>/ds; returns (top, local root)."""
    top = tmp_path_factory.mktemp("remote")
    root = top / "ds"
    r = run(cli, "make-sample", root, "--episodes", 6, "--codec", "h264", "--size", "96x64", "--fps", 10,
            "--min-length", 10, "--max-length", 30, "--max-video-mb", 0.01, "--quiet")
    assert r.returncode == 0, r.stderr
    assert len(list((root / "videos" / "observation.images.cam0").glob("*/*.mp4"))) > 1
    return top, root


def info_json(cli, path, *extra, env=None):
    r = run(cli, "info", path, "--json", *extra, env=env)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else None), r.stderr


def without_path(doc):
    """An info document less what differs by design between a remote and a
    local root: the path, and the metadata cache (local roots only)."""
    doc = dict(doc)
    doc.pop("path", None)
    doc.pop("meta_cache", None)
    return doc


def batches(loader, limit=None):
    out = []
    for b in loader:
        out.append({k: (list(v) if isinstance(v, list) else np.array(v, copy=True)) for k, v in b.items()})
        if limit is not None and len(out) >= limit:
            break
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            if isinstance(x[k], list):
                assert x[k] == y[k], k
            else:
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
                assert np.array_equal(x[k], y[k]), k


def loader_batches(root, mode, limit=None, **kw):
    args = dict(mode=mode, batch_size=8, seed=5, threads=2, output="numpy", image_format="uint8")
    args.update(kw)
    with vlafeed.Loader(str(root), **args) as loader:
        return batches(loader, limit)


# ---- HTTP --------------------------------------------------------------------------------


def test_info_equals_local(cli, served):
    top, root = served
    with RemoteServer(top) as srv:
        rc_local, local, _ = info_json(cli, root)
        rc_remote, remote, err = info_json(cli, srv.url("ds"))
        assert rc_remote == rc_local == 0, err
        assert remote["path"] == srv.url("ds")
        assert remote["meta_cache"]["enabled"] is False and local["meta_cache"]["enabled"] is True
        assert without_path(remote) == without_path(local)
        # An episode selection and a trailing slash give the same as locally too.
        _, local_sel, _ = info_json(cli, root, "--episodes", "1,3-4")
        _, remote_sel, _ = info_json(cli, srv.url("ds/"), "--episodes", "1,3-4")
        assert without_path(remote_sel) == without_path(local_sel)
        # Metadata is fetched once per open: one GET of each meta file per `info` run.
        gets = [p for m, p, _ in srv.log if m == "GET" and p.endswith("/meta/info.json")]
        assert len(gets) == 2


@pytest.mark.parametrize("mode", ["stream", "map"])
def test_loader_equals_local(served, mode):
    top, root = served
    local = loader_batches(root, mode)
    with RemoteServer(top) as srv:
        remote = loader_batches(srv.url("ds"), mode)
        log = srv.log
    assert_same_batches(remote, local)
    assert any(p.endswith(".mp4") and m == "GET" for m, p, _ in log)
    # Video reads are range requests served by the read-ahead blocks, not whole-file GETs.
    assert all(r is not None for m, p, r in log if m == "GET" and p.endswith(".mp4"))
    meta_gets = [p for m, p, _ in log if m == "GET" and "/meta/" in p and p.endswith(".json")]
    assert len(meta_gets) == len(set(meta_gets))  # each metadata JSON once


def test_pool_prefetch_on_admit_equals_local(served, tmp_path):
    """Pool mode over HTTP with prefetch-on-admit: admitting an episode
    downloads its video files whole into the bounded local cache (in the
    background), decoding reads them there, and the batches are exactly the
    local pool-mode batches; the cache folder is gone after close."""
    top, root = served
    local = loader_batches(root, "pool", episode_pool_size=2)
    cache_dir = tmp_path / "prefetch"
    cache_dir.mkdir()
    with RemoteServer(top) as srv:
        remote = loader_batches(srv.url("ds"), "pool", episode_pool_size=2,
                                prefetch_cache_dir=str(cache_dir), prefetch_cache_bytes=64 << 20)
        log = srv.log
    assert_same_batches(remote, local)
    whole = {p for m, p, rng in log if m == "GET" and p.endswith(".mp4") and rng is None}
    videos = {str(p.relative_to(top)) for p in (root / "videos").rglob("*.mp4")}
    assert {w.lstrip("/") for w in whole} == videos  # every video file downloaded whole, once
    assert list(cache_dir.iterdir()) == []             # the private cache folder was removed


def test_training_from_an_http_served_dataset(served, tmp_path):
    """examples/train_policy.py trains (pool mode) straight from an HTTP root."""
    top, root = served
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with RemoteServer(top) as srv:
        r = subprocess.run([sys.executable, os.path.join(repo, "examples", "train_policy.py"), "--dataset",
                            srv.url("ds"), "--mode", "pool", "--steps", "6", "--batch-size", "4", "--chunk", "3",
                            "--checkpoint-dir", str(tmp_path / "ck")], capture_output=True, text=True, timeout=150,
                           env=env)
        log = srv.log
    assert r.returncode == 0, r.stderr[-2000:]
    assert "samples/s" in r.stdout and "waiting for data" in r.stdout
    assert any(m == "GET" and p.endswith(".mp4") for m, p, _ in log)     # frames came over HTTP
    assert any(m == "GET" and p.endswith(".parquet") for m, p, _ in log)  # and so did the table


def test_lerobot_dataset_items_equal_local(served):
    top, root = served
    local = vlafeed.LeRobotDataset(root, delta_timestamps={"action": [0.0, 0.1]})
    with RemoteServer(top) as srv:
        remote = vlafeed.LeRobotDataset(srv.url("ds"), delta_timestamps={"action": [0.0, 0.1]})
        assert len(remote) == len(local)
        for i in (0, 7, len(local) - 1):
            a, b = local[i], remote[i]
            assert list(a) == list(b)
            for k in a:
                if isinstance(a[k], str):
                    assert a[k] == b[k]
                else:
                    assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


@pytest.mark.parametrize("fault", [
    Faults(match=".mp4", fail_first=2),
    Faults(match=".mp4", reset_first=3),
    Faults(match=".parquet", truncate_first=3),
    Faults(match="/meta/", fail_first=3),
], ids=["500", "reset", "truncated", "meta-500"])
def test_retries_recover(served, fault):
    top, root = served
    local = loader_batches(root, "stream")
    with RemoteServer(top, fault) as srv:
        remote = loader_batches(srv.url("ds"), "stream")
    assert_same_batches(remote, local)
    assert sum(fault.injected.values()) > 0  # the faults really happened


def test_cli_retries_recover_and_exhaust(cli, served):
    top, root = served
    _, local, _ = info_json(cli, root)
    with RemoteServer(top, Faults(match="/meta/info.json", fail_first=2)) as srv:
        rc, remote, err = info_json(cli, srv.url("ds"))
        assert rc == 0, err
        assert without_path(remote) == without_path(local)
    with RemoteServer(top, Faults(match="/meta/info.json", always_fail=True)) as srv:
        rc, _, err = info_json(cli, srv.url("ds"), env={"VF_HTTP_ATTEMPTS": "3"})
        assert rc == 1
        assert srv.url("ds/meta/info.json") in err
        assert "HTTP 503" in err and "gave up after 3 attempts" in err
        assert len([1 for m, p, _ in srv.log if p.endswith("info.json")]) == 3


def test_loader_error_names_the_url(served):
    top, _ = served
    with RemoteServer(top, Faults(match="observation.images.cam1", always_fail=True)) as srv:
        with pytest.raises(Exception) as e:
            loader_batches(srv.url("ds"), "stream", shuffle=False)
        msg = str(e.value)
        assert "observation.images.cam1" in msg and "HTTP 503" in msg and "127.0.0.1" in msg, msg


def test_stall_is_bounded(cli, served):
    top, _ = served
    with RemoteServer(top, Faults(match="/meta/info.json", slow_s=5)) as srv:
        rc, _, err = info_json(cli, srv.url("ds"), env={"VF_HTTP_BUDGET_S": "0.5"})
        assert rc == 1
        assert srv.url("ds/meta/info.json") in err and "gave up" in err, err


def test_refused_connection_and_bad_url(cli, served):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, _, err = info_json(cli, f"http://127.0.0.1:{port}/ds", env={"VF_HTTP_ATTEMPTS": "2"})
    assert rc == 1 and f"http://127.0.0.1:{port}/ds/meta/info.json" in err and "gave up after 2 attempts" in err
    rc, _, err = info_json(cli, "http://127.0.0.1:99999/ds")
    assert rc == 1 and "port" in err
    with pytest.raises(Exception, match="not a LeRobot dataset"):
        top, _ = served
        with RemoteServer(top) as srv:
            vlafeed.Loader(srv.url("nothing-here"))


# ---- the retry policy --------------------------------------------------------------------

RETRY_KNOBS = ("VF_HTTP_ATTEMPTS", "VF_HTTP_BACKOFF_S", "VF_HTTP_BACKOFF_MAX_S", "VF_HTTP_BUDGET_S")


def test_outage_is_ridden_out_with_defaults(cli, served, monkeypatch):
    """Everything under the dataset answers 503 for 3 s, then the server
    serves: with the default retry policy `info` gives the local report.
    (The earlier policy, 5 attempts within ~2-3 s, gave up.)"""
    top, root = served
    for k in RETRY_KNOBS:  # the defaults, not FAST_HTTP's
        monkeypatch.delenv(k, raising=False)
    _, local, _ = info_json(cli, root)
    faults = Faults(match="/ds/", outage_s=3.0)
    with RemoteServer(top, faults) as srv:
        rc, remote, err = info_json(cli, srv.url("ds"), env={"VF_HTTP_RETRY_SEED": "11"})
    assert rc == 0, err
    assert without_path(remote) == without_path(local)
    assert faults.injected["503"] >= 2  # retried through the outage...
    served_at = [t for t, _, _, fault in faults.times if fault is None]
    assert served_at and served_at[0] - faults.first_at >= 3.0  # ...and was served after it


def test_retry_after_is_honoured(cli, served):
    """A 503 with Retry-After: 1 makes the next attempt wait at least 1 s by
    the server's clock, although the backoff alone (FAST_HTTP's 0.02 s base)
    waits a few ms. (Retry-After is honoured within the cap on one wait,
    raised here from FAST_HTTP's 0.1 s.)"""
    top, root = served
    _, local, _ = info_json(cli, root)
    faults = Faults(match="/meta/info.json", unavailable_first=1, retry_after=1)
    with RemoteServer(top, faults) as srv:
        rc, remote, err = info_json(cli, srv.url("ds"), env={"VF_HTTP_BACKOFF_MAX_S": "5"})
    assert rc == 0, err
    assert without_path(remote) == without_path(local)
    (t0, _, _, first), (t1, _, _, second) = faults.times[:2]
    assert first == "503" and second is None
    assert t1 - t0 >= 0.99


def test_outage_beyond_the_budget_fails_clearly(cli, served):
    """An outage longer than the time budget (1 s here): the error names the
    URL, the last status, the attempts, the time and the budget."""
    top, _ = served
    with RemoteServer(top, Faults(match="/meta/info.json", always_fail=True)) as srv:
        t0 = time.monotonic()
        rc, _, err = info_json(cli, srv.url("ds"), env={"VF_HTTP_BUDGET_S": "1", "VF_HTTP_ATTEMPTS": "100"})
        took = time.monotonic() - t0
        attempts = len([1 for _, p, _ in srv.log if p.endswith("info.json")])
    assert rc == 1
    assert srv.url("ds/meta/info.json") in err and "HTTP 503" in err, err
    assert f"gave up after {attempts} attempts in " in err and "the 1 s retry budget is spent" in err, err
    assert attempts >= 2 and took < 60


def test_404_is_not_retried(cli, served):
    top, _ = served
    with RemoteServer(top) as srv:
        rc, _, err = info_json(cli, srv.url("no-such-dataset"), env={"VF_HTTP_ATTEMPTS": "100"})
        log = srv.log
    assert rc == 1 and "meta/info.json not found" in err, err
    assert log and len(log) == len(set(log))  # every request made once: nothing retried


def test_meta_episodes_outage_names_the_status(cli, served):
    """A 503 on the v3.0 episodes metadata that outlasts the retries is
    reported with its status, not as "meta/episodes: missing"."""
    top, _ = served
    with RemoteServer(top, Faults(match="/meta/episodes/", always_fail=True)) as srv:
        r = run(cli, "info", srv.url("ds"), "--json", env={"VF_HTTP_BUDGET_S": "1", "VF_HTTP_ATTEMPTS": "100"})
        url = srv.url("ds/meta/episodes/chunk-000/file-000.parquet")
    out = r.stdout + r.stderr
    assert r.returncode == 1
    assert url in out and "HTTP 503" in out and "retry budget is spent" in out, out
    assert "missing" not in out, out


def _range(rng, size):
    """(first, last) of a Range header value; no Range: the whole file."""
    if rng is None:
        return 0, size - 1
    a, b = rng.split("=", 1)[1].split("-")
    return int(a), (int(b) if b else size - 1)


def test_reset_mid_body_resumes_at_the_exact_byte(cli, served):
    """A connection reset after half of a body: the next request for that
    file asks for the rest of the same range, from a byte inside the part
    sent (the next byte not received), and the report is the local one."""
    top, root = served
    _, local, _ = info_json(cli, root)
    faults = Faults(match=".parquet", reset_first=1)
    with RemoteServer(top, faults) as srv:
        rc, remote, err = info_json(cli, srv.url("ds"))
        log = srv.log
    assert rc == 0, err
    assert without_path(remote) == without_path(local)
    path = next(p for _, m, p, fault in faults.times if fault == "reset")
    size = (top / path.lstrip("/")).stat().st_size
    gets = [rng for m, p, rng in log if m == "GET" and p == path]
    assert len(gets) >= 2
    first, last = _range(gets[0], size)
    resumed_first, resumed_last = _range(gets[1], size)
    assert resumed_last == last
    assert first <= resumed_first <= first + (last - first + 1) // 2


def test_missing_remote_file_is_reported_like_local(cli, served, tmp_path):
    top, root = served
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    victim = sorted((copy / "videos" / "observation.images.cam1").glob("*/*.mp4"))[-1]
    victim.unlink()
    rc_local, local, _ = info_json(cli, copy)
    with RemoteServer(tmp_path) as srv:
        rc_remote, remote, _ = info_json(cli, srv.url("ds"))
    assert rc_local == rc_remote == 1
    assert without_path(remote) == without_path(local)
    assert any("video file missing" in p["message"] for p in remote["problems"])


@pytest.mark.parametrize("fault,status", [
    (dict(always_fail=True), "HTTP 503"),
    (dict(fail_first=10**6), "HTTP 500"),
    (dict(always_drop=True), None),
], ids=["503", "500", "reset"])
def test_unreachable_remote_file_is_not_missing(cli, served, fault, status):
    """A video file whose HEAD fails until the retries run out is an error
    problem saying "unreachable" with the URL, the last status and the
    attempts; it is not a missing file (only 404/410 means missing)."""
    top, root = served
    victim = sorted((root / "videos" / "observation.images.cam1").glob("*/*.mp4"))[-1]
    rel = victim.relative_to(root).as_posix()
    faults = Faults(match="/ds/" + rel, **fault)
    with RemoteServer(top, faults) as srv:
        rc, remote, err = info_json(cli, srv.url("ds"), env={"VF_HTTP_ATTEMPTS": "3"})
        url = srv.url("ds/" + rel)
    assert rc == 1, err
    assert remote["missing_files"] == []
    mine = [p for p in remote["problems"] if p["file"] == rel]
    assert len(mine) == 1 and mine[0]["severity"] == "error", remote["problems"]
    msg = mine[0]["message"]
    assert msg.startswith("video file unreachable: ") and url in msg and "gave up after 3 attempts" in msg, msg
    assert status is None or status in msg, msg
    assert "missing" not in msg, msg
    assert sum(faults.injected.values()) >= 3


# ---- cancellation: closing a loader while its reads ride out an outage ---------------------

# A retry budget far beyond what the tests wait for (the default is 300 s).
LONG_BUDGET = {"VF_HTTP_BUDGET_S": "60", "VF_HTTP_ATTEMPTS": "10000", "VF_HTTP_BACKOFF_S": "0.05",
               "VF_HTTP_BACKOFF_MAX_S": "0.5"}


def _videos_down():
    """Every GET of a video answers 503 (HEAD works, so the dataset opens)."""
    return Faults(match=".mp4", always_fail=True, methods=("GET",))


def _open_retrying_loader(srv, faults):
    """A stream loader over srv's dataset (production starts at open), once its engine
    threads are retrying the videos."""
    loader = vlafeed.Loader(srv.url("ds"), mode="stream", batch_size=4, threads=2, output="numpy",
                            image_format="uint8")
    deadline = time.monotonic() + 20
    while faults.injected["503"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert faults.injected["503"] >= 3  # the reads are retrying now
    return loader


def test_close_does_not_wait_for_the_retry_budget(served, monkeypatch):
    for k, v in LONG_BUDGET.items():
        monkeypatch.setenv(k, v)
    top, _ = served
    faults = _videos_down()
    with RemoteServer(top, faults) as srv:
        loader = _open_retrying_loader(srv, faults)
        t0 = time.monotonic()
        loader.close()
        took = time.monotonic() - t0
    assert took < 2.0, f"close took {took:.1f} s"


def test_close_from_another_thread_ends_the_iteration(served, monkeypatch):
    """close() from another thread while the iterating thread waits for a batch
    whose reads retry a 503 storm: close returns at once and the iteration
    fails within seconds with an error saying so (no batch, partial or not),
    instead of waiting for the retry budget."""
    for k, v in LONG_BUDGET.items():
        monkeypatch.setenv(k, v)
    top, _ = served
    faults = _videos_down()
    outcome = {"batches": 0}

    def iterate(loader):
        try:
            for _ in loader:
                outcome["batches"] += 1
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome["error"] = e
        outcome["ended_at"] = time.monotonic()

    with RemoteServer(top, faults) as srv:
        loader = _open_retrying_loader(srv, faults)
        worker = threading.Thread(target=iterate, args=(loader,), daemon=True)
        worker.start()
        time.sleep(0.3)  # the worker is inside next()
        t0 = time.monotonic()
        loader.close()
        closed_in = time.monotonic() - t0
        worker.join(timeout=5)
        assert not worker.is_alive(), "the iterating thread still waits for the retry budget"
    assert closed_in < 2.0
    assert outcome["batches"] == 0
    err = outcome.get("error")
    assert isinstance(err, ValueError) and "closed" in str(err), repr(err)
    assert outcome["ended_at"] - t0 < 3.0


# ---- S3 (moto) ---------------------------------------------------------------------------


def test_s3_equals_local(cli, served, moto_endpoint, monkeypatch):
    _, root = served
    upload_tree(moto_endpoint, "vf-bucket", root, "datasets/ds")
    env = s3_env(moto_endpoint)
    _, local, _ = info_json(cli, root)
    rc, remote, err = info_json(cli, "s3://vf-bucket/datasets/ds", env=env)
    assert rc == 0, err
    assert remote["path"] == "s3://vf-bucket/datasets/ds"
    assert without_path(remote) == without_path(local)

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for mode in ("stream", "map"):
        assert_same_batches(loader_batches("s3://vf-bucket/datasets/ds", mode), loader_batches(root, mode))

    # Wrong credentials: moto checks nothing by default, so check a missing key instead.
    rc, _, err = info_json(cli, "s3://vf-bucket/datasets/nope", env=env)
    assert rc == 1 and "s3://vf-bucket/datasets/nope" in err


def test_s3_signatures_are_verified(cli, g1_dir, moto_endpoint):
    """With moto's IAM authentication on, every request must carry a valid
    SigV4 signature of a real (moto) access key: the right secret reads the
    dataset, a wrong secret is refused with a message naming the URL and the
    status. Uses the real LeRobot v2.1 fixture (read in place, uploaded to
    moto's memory): v2.1 needs no listing, and moto's signature check of
    list requests is itself broken (it signs the decoded query; boto3's own
    ListObjectsV2 fails the same way), while GET and HEAD are checked right."""
    import boto3
    upload_tree(moto_endpoint, "vf-signed", g1_dir, "g1")
    iam = boto3.client("iam", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="s3-read", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]

    def set_auth(count):
        # The moto server runs in this process: switch its IAM checks directly.
        import moto.settings
        from moto.core.authorization import ActionAuthenticatorMixin
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = float(count)
        ActionAuthenticatorMixin.request_count = 0

    set_auth(0)
    try:
        env = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
               "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"], "AWS_REGION": "us-east-1"}
        rc_local, local, _ = info_json(cli, g1_dir, "--episodes", "1,2,4")
        rc, remote, err = info_json(cli, "s3://vf-signed/g1", "--episodes", "1,2,4", env=env)
        assert rc == rc_local == 0, err
        assert without_path(remote) == without_path(local)
        secret = key["SecretAccessKey"]
        env["AWS_SECRET_ACCESS_KEY"] = secret[:-1] + ("A" if secret[-1] != "A" else "B")
        rc, _, err = info_json(cli, "s3://vf-signed/g1", env=env)
        assert rc == 1
        assert "s3://vf-signed/g1/meta/info.json: HTTP 403" in err and "SignatureDoesNotMatch" in err, err
    finally:
        set_auth("inf")


def test_real_v21_fixture_over_http(cli, g1_dir):
    """The real LeRobot v2.1 fixture, served in place: same report and same
    frames as locally."""
    with RemoteServer(g1_dir) as srv:
        _, local, _ = info_json(cli, g1_dir, "--episodes", "1,2,4")
        _, remote, err = info_json(cli, srv.url(""), "--episodes", "1,2,4")
        assert remote is not None, err
        assert without_path(remote) == without_path(local)
        kw = dict(episodes=[1, 2, 4], batch_size=4, resize=(64, 48))
        a = loader_batches(g1_dir, "map", limit=6, **kw)
        b = loader_batches(srv.url(""), "map", limit=6, **kw)
    assert_same_batches(b, a)


# ---- the prefetch file cache (C API through ctypes) --------------------------------------


class CacheStats(__import__("ctypes").Structure):
    _fields_ = [(name, __import__("ctypes").c_uint64) for name in (
        "hits", "misses", "bytes_downloaded", "downloads", "failures", "evictions", "bytes", "peak_bytes",
        "entries", "waiting_for_space")]


class FileCache:
    """The C file cache (vf_file_cache_*), reached through the extension's
    exported symbols: real HTTP downloads against the fault-injecting server."""

    def __init__(self, directory, max_bytes):
        import ctypes
        from vlafeed import _native
        lib = ctypes.CDLL(_native._core.__file__)
        self.lib, self.ct = lib, ctypes
        p, cp, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64
        lib.vf_file_cache_open.argtypes = [ctypes.POINTER(p), cp, u64]
        lib.vf_file_cache_acquire.argtypes = [p, cp, ctypes.POINTER(cp)]
        lib.vf_file_cache_acquire_nowait.argtypes = [p, cp, ctypes.POINTER(cp)]
        lib.vf_file_cache_release.argtypes = [p, cp]
        lib.vf_file_cache_refs.argtypes = [p, cp]
        lib.vf_file_cache_get_stats.argtypes = [p, ctypes.POINTER(CacheStats)]
        lib.vf_file_cache_get_stats.restype = None
        lib.vf_file_cache_close.argtypes = [p]
        lib.vf_file_cache_close.restype = None
        lib.vf_last_error.restype = cp
        self.handle = p()
        assert lib.vf_file_cache_open(ctypes.byref(self.handle), os.fsencode(directory), max_bytes) == 0, self.error()

    def error(self):
        return self.lib.vf_last_error().decode()

    def acquire(self, url, wait=True):
        path = self.ct.c_char_p()
        fn = self.lib.vf_file_cache_acquire if wait else self.lib.vf_file_cache_acquire_nowait
        rc = fn(self.handle, url.encode(), self.ct.byref(path))
        return rc, (path.value.decode() if path.value else None), (self.error() if rc else "")

    def release(self, url):
        return self.lib.vf_file_cache_release(self.handle, url.encode())

    def refs(self, url):
        return self.lib.vf_file_cache_refs(self.handle, url.encode())

    def stats(self):
        s = CacheStats()
        self.lib.vf_file_cache_get_stats(self.handle, self.ct.byref(s))
        return {name: getattr(s, name) for name, _ in CacheStats._fields_}

    def close(self):
        if self.handle:
            self.lib.vf_file_cache_close(self.handle)
            self.handle = None


def dir_bytes(directory):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(directory) for f in fs)


def test_file_cache_bound_refcounts_and_faults(served, tmp_path):
    top, root = served
    videos = sorted(root.glob("videos/*/*/*.mp4"))
    sizes = {v: v.stat().st_size for v in videos}
    bound = sum(sorted(sizes.values())[-2:]) + 1  # any two files fit, not all of them
    assert bound < sum(sizes.values())
    cache_dir = tmp_path / "cache"
    faults = Faults(match=".mp4", truncate_first=1, reset_first=1)  # 2 faults < 4 attempts
    with RemoteServer(top, faults) as srv:
        cache = FileCache(cache_dir, bound)
        try:
            urls = {v: srv.url("ds/" + str(v.relative_to(root))) for v in videos}
            a, b = videos[0], videos[1]
            # Two episodes share file a: two references, one download.
            rc, pa, err = cache.acquire(urls[a])
            assert rc == 0, err
            rc, pa2, err = cache.acquire(urls[a])
            assert rc == 0 and pa2 == pa and cache.refs(urls[a]) == 2
            assert open(pa, "rb").read() == a.read_bytes()  # exact bytes despite truncation/reset faults
            assert cache.release(urls[a]) == 0 and os.path.exists(pa)  # one user left
            assert cache.release(urls[a]) == 0 and os.path.exists(pa)  # cached, now evictable
            assert cache.release(urls[a]) != 0 and "not acquired" in cache.error()
            # Walk every other file, holding at most one at a time: evictions
            # happen and the bound holds after every step.
            for v in videos[1:]:
                rc, p, err = cache.acquire(urls[v])
                assert rc == 0, err
                assert open(p, "rb").read() == v.read_bytes()
                assert dir_bytes(cache_dir) <= bound
                assert cache.release(urls[v]) == 0
            assert not os.path.exists(pa)  # a was evicted and deleted
            st = cache.stats()
            assert st["peak_bytes"] <= bound and st["bytes"] <= bound
            assert st["evictions"] >= 1 and st["failures"] == 0
            assert st["downloads"] == len(videos)
            # Holding two files, a third must wait: nowait says EAGAIN; it
            # completes once one of the two is released.
            held = [videos[-1], videos[-2]]
            for v in held:
                assert cache.acquire(urls[v])[0] == 0
            rc, _, err = cache.acquire(urls[a], wait=False)
            assert rc != 0 and "in progress" in err
            assert cache.stats()["bytes"] <= bound
            assert cache.release(urls[held[0]]) == 0
            rc, p, err = cache.acquire(urls[a])
            assert rc == 0, err
            assert dir_bytes(cache_dir) <= bound and cache.stats()["peak_bytes"] <= bound
            assert cache.refs(urls[a]) == 2
            for url in (urls[a], urls[a], urls[held[1]]):
                assert cache.release(url) == 0
        finally:
            cache.close()
        assert faults.injected["truncate"] == 1 and faults.injected["reset"] == 1
        # One file alone above the bound: a clear error naming the URL.
        small = FileCache(tmp_path / "small", 100)
        try:
            rc, _, err = small.acquire(urls[a])
            assert rc != 0 and urls[a] in err and "bound 100 bytes" in err
        finally:
            small.close()
    assert not any(os.scandir(cache_dir))  # close removed its private directory


def test_node_cache_counts_reach_python(served, tmp_path):
    """VF_NODE_CACHE_DIR: vlafeed.node_cache_stats() reports what crossed the network (each
    object fetched once into the node's cache) and what a second reader reused; None when it is off."""
    top, root = served
    child = r'''
import json, sys, warnings
import vlafeed
warnings.simplefilter("ignore")
url = sys.argv[1]
def epoch():
    loader = vlafeed.Loader(url, mode="stream", batch_size=4, shuffle=False, output="numpy", image_format="uint8")
    n = sum(len(b["index"]) for b in loader)
    loader.close()
    return n
first = epoch()
after_first = vlafeed.node_cache_stats()
second = epoch()
print(json.dumps([first, second, after_first, vlafeed.node_cache_stats()]))
'''
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    with RemoteServer(top) as srv:
        env = dict(os.environ, VF_NODE_CACHE_DIR=str(tmp_path / "node"), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-c", child, srv.url("ds")], capture_output=True, text=True, timeout=120,
                           env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    first, second, one, two = json.loads(r.stdout.strip().splitlines()[-1])
    assert first == second > 0
    assert one["dir"] == str(tmp_path / "node") and one["process"] == one["node"]
    assert one["process"]["fetches"] > 0 and 0 < one["process"]["bytes_fetched"] <= total
    # the second reader crossed the network for nothing new: every object came from the node's copy
    assert two["process"]["fetches"] == one["process"]["fetches"]
    assert two["process"]["bytes_fetched"] == one["process"]["bytes_fetched"]
    assert two["process"]["hits"] > one["process"]["hits"]
    if not os.environ.get("VF_NODE_CACHE_DIR"):
        assert vlafeed.node_cache_stats() is None  # off in this process
