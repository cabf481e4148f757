"""vlafeed.ray.LeRobotDatasource / read_lerobot on a local Ray (2 CPUs, one
session for the module).

What is proven: the metadata is read on the driver and no data or video
file is fetched until a task runs (HTTP server log); the read tasks are the
public task list (file groups, episodes, sequential runs); every row comes
exactly once and equals vlafeed.LeRobotDataset's item (images in the chosen
layout, renames, delta windows with LeRobot's pads, normalization); blocks
hold at most rows_per_block rows; each MP4 of a task is opened once;
RANK/WORLD_SIZE in a worker's environment change nothing;
iter_torch_batches gives tensors (task as its index); http:// and s3://
roots equal the local one; a missing dataset, a corrupt MP4 inside one task
(raise names the file and the task; skip drops exactly that task's episodes
and counts them) and Ray's retry setting.
"""
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(__file__))
from remote_server import RemoteServer, s3_env, upload_tree  # noqa: E402

import vlafeed  # noqa: E402
import vlafeed.plan  # noqa: E402
import vlafeed.ray as vray  # noqa: E402

CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"


def run(cli, *args):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    """6 episodes, 2 H.264 cameras 96x64, several MP4 files per camera, under <top>/ds."""
    top = tmp_path_factory.mktemp("raydata")
    root = top / "ds"
    r = run(cli, "make-sample", root, "--episodes", 6, "--codec", "h264", "--size", "96x64", "--fps", 10,
            "--min-length", 10, "--max-length", 30, "--max-video-mb", 0.01, "--quiet")
    assert r.returncode == 0, r.stderr
    assert len(list((root / "videos" / CAM0).glob("*/*.mp4"))) > 1
    return top, root


def rows_by_index(ds):
    rows = ds.take_all()
    by = {}
    for r in rows:
        i = int(r["index"])
        assert i not in by, f"row {i} twice"
        by[i] = r
    return rows, by


def test_meta_eager_and_no_file_read_before_tasks(sample, ray_session):
    top, root = sample
    with RemoteServer(top) as srv:
        source = vray.LeRobotDatasource(srv.url("ds"))
        tasks = source.get_read_tasks(4)
        fetched = [p for m, p, _ in srv.log if "/data/" in p or "/videos/" in p]
        assert fetched == [], f"files read on the driver: {fetched}"
    meta = vlafeed.LeRobotDatasetMetadata(root)
    assert source.meta.total_frames == meta.total_frames
    assert source.meta.total_episodes == meta.total_episodes
    assert source.meta.video_keys == [CAM0, CAM1]
    assert source.meta.tasks == meta.task_list
    np.testing.assert_array_equal(source.meta.stats["action"]["mean"], meta.stats["action"]["mean"])
    # One read task per file group, with rows, a decoded-size estimate and the task's files.
    plan = vlafeed.plan.tasks(str(root))
    assert len(tasks) == len(plan) > 1
    for t, p in zip(tasks, plan):
        assert t.metadata.num_rows == p["rows"][1]
        assert t.metadata.size_bytes >= p["rows"][1] * 2 * 96 * 64 * 3
        assert sorted(os.path.basename(f) for f in t.metadata.input_files) == \
            sorted(os.path.basename(f) for cam in p["video_files"].values() for f in cam)
        assert len(t.metadata.input_files) == 2
    # The source pickles (Ray ships it) and the copy plans the same tasks.
    again = pickle.loads(pickle.dumps(vray.LeRobotDatasource(root)))
    assert [t["episode_indices"] for t in again.read_tasks_plan()] == [
        t["episode_indices"] for t in vray.LeRobotDatasource(root).read_tasks_plan()]


def test_rows_equal_lerobot_items(sample, ray_session):
    _, root = sample
    deltas = {"action": [-0.1, 0.0, 0.1, 0.2], CAM1: [-0.1, 0.0]}
    source = vray.LeRobotDatasource(root, rows_per_block=7, delta_timestamps=deltas, image_format="float32",
                                    renames={CAM0: "front"})
    ds = ray.data.read_datasource(source)
    rows, by = rows_by_index(ds)
    ref = vlafeed.LeRobotDataset(root, delta_timestamps=deltas)
    assert sorted(by) == list(range(len(ref)))
    for i in range(len(ref)):
        item, row = ref[i], by[i]
        np.testing.assert_array_equal(row["front"], item[CAM0].numpy())
        np.testing.assert_array_equal(row[CAM1], item[CAM1].numpy())
        for key in ("action", "action_is_pad", f"{CAM1}_is_pad", "observation.state", "episode_index",
                    "frame_index", "task_index"):
            np.testing.assert_array_equal(np.asarray(row[key]), item[key].numpy(), err_msg=key)
        assert row["task"] == item["task"]
    # Windows padded at the episode ends as LeRobot does (first row of each episode).
    firsts = [by[i] for i in by if int(by[i]["frame_index"]) == 0]
    assert len(firsts) == source.meta.total_episodes
    assert all(np.asarray(r["action_is_pad"]).tolist() == [True, False, False, False] for r in firsts)
    # Blocks of at most rows_per_block rows; each MP4 of a task opened once.
    sizes = [len(b["index"]) for b in ds.iter_batches(batch_size=None, batch_format="numpy")]  # whole blocks
    assert max(sizes) <= 7 and sum(sizes) == len(ref)
    report = source.report()["tasks"]
    by_task = {}
    for r in report:
        by_task.setdefault(r["task"], r)
    plan = {t["id"]: t for t in source.read_tasks_plan()}
    assert set(by_task) == set(plan)
    for tid, r in by_task.items():
        assert r["video_opens"] == len(plan[tid]["video_files"]) >= 2, (tid, r, plan[tid]["video_files"])
        assert r["rows"] == plan[tid]["rows"] and r["skipped_rows"] == 0


def test_uint8_hwc_normalize_and_partitionings(sample, ray_session):
    _, root = sample
    ref = vlafeed.LeRobotDataset(root)
    source = vray.LeRobotDatasource(root, partitioning="episode", normalize={"observation.state": "mean_std"})
    assert len(source.read_tasks_plan()) == source.meta.total_episodes
    _, by = rows_by_index(ray.data.read_datasource(source))
    stats = source.meta.stats["observation.state"]
    for i in (0, 11, len(ref) - 1):
        item = ref[i]
        hwc = by[i][CAM0]
        assert hwc.dtype == np.uint8 and hwc.shape == (64, 96, 3)
        # uint8 HWC is the float32 CHW item scaled back to bytes.
        np.testing.assert_allclose(hwc.transpose(2, 0, 1) / 255.0, item[CAM0].numpy(), atol=1e-6)
        want = (item["observation.state"].numpy() - stats["mean"]) / stats["std"]
        np.testing.assert_allclose(by[i]["observation.state"], want, rtol=1e-5, atol=1e-5)
    # Sequential: override_num_blocks contiguous runs of episodes covering everything once.
    seq = vray.LeRobotDatasource(root, partitioning="sequential", keys=["observation.state", "index"])
    runs = seq.read_tasks_plan(3)
    assert len(runs) == 3 and sum(t["rows"] for t in runs) == seq.meta.total_frames
    rows, by = rows_by_index(ray.data.read_datasource(seq, override_num_blocks=3))
    assert sorted(by) == list(range(seq.meta.total_frames))
    with pytest.raises(ValueError, match="partitioning"):
        vray.LeRobotDatasource(root, partitioning="shards")


def test_rank_pinned_inside_tasks(sample, ray_session):
    """RANK/WORLD_SIZE in the workers' environment would make a plain Loader read half."""
    _, root = sample
    source = vray.LeRobotDatasource(root, keys=["observation.state", "index"])
    ds = ray.data.read_datasource(source, ray_remote_args={"runtime_env": {"env_vars": {"RANK": "1",
                                                                                     "WORLD_SIZE": "2"}}})
    _, by = rows_by_index(ds)
    assert sorted(by) == list(range(source.meta.total_frames))


def test_iter_torch_batches(sample, ray_session):
    _, root = sample
    source = vray.LeRobotDatasource(root, image_format="float32", rows_per_block=16)
    ds = ray.data.read_datasource(source)
    # Ray's default collate rejects the string column; vlafeed's collate gives its index.
    with pytest.raises(Exception, match="str"):
        next(iter(ds.iter_torch_batches(batch_size=8)))
    seen = 0
    for batch in ds.iter_torch_batches(batch_size=8, collate_fn=vray.TorchCollate(strings=True)):
        assert batch[CAM0].dtype == torch.float32 and batch[CAM0].shape[1:] == (3, 64, 96)
        assert batch["task"].dtype == torch.int64
        assert torch.equal(batch["task"], batch["task_index"])
        assert batch["task_str"] == [source.meta.tasks[int(t)] for t in batch["task"]]
        seen += len(batch["task"])
    assert seen == source.meta.total_frames


def test_http_and_s3_roots_equal_local(sample, ray_session, monkeypatch, request):
    top, root = sample
    keys = ["observation.state", CAM0, "index"]
    _, local = rows_by_index(ray.data.read_datasource(vray.LeRobotDatasource(root, keys=keys)))

    def same(by):
        assert sorted(by) == sorted(local)
        for i in local:
            np.testing.assert_array_equal(by[i][CAM0], local[i][CAM0])
            np.testing.assert_array_equal(by[i]["observation.state"], local[i]["observation.state"])

    with RemoteServer(top) as srv:
        _, by = rows_by_index(ray.data.read_datasource(vray.LeRobotDatasource(srv.url("ds"), keys=keys)))
        same(by)
        assert any("/videos/" in p for m, p, _ in srv.log)

    endpoint = request.getfixturevalue("moto_endpoint")  # skips here, after the http part, without moto
    env = s3_env(endpoint)
    upload_tree(endpoint, "vf-ray", root, "ds")
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the driver reads the metadata
    source = vray.LeRobotDatasource("s3://vf-ray/ds", keys=keys)
    ds = ray.data.read_datasource(source, ray_remote_args={"runtime_env": {"env_vars": env}})
    _, by = rows_by_index(ds)
    same(by)


@pytest.fixture()
def corrupt(sample, tmp_path):
    """A copy whose second cam0 MP4 is cut to its first 300 bytes."""
    _, root = sample
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    victim = sorted((bad / "videos" / CAM0).glob("*/*.mp4"))[1]
    with open(victim, "r+b") as f:
        f.truncate(300)
    return bad, victim


def test_missing_dataset_and_bad_arguments(tmp_path, ray_session):
    with pytest.raises((vlafeed.VlafeedError, OSError), match="nope"):
        vray.LeRobotDatasource(tmp_path / "nope")
    with pytest.raises(ValueError, match="on_error"):
        vray.LeRobotDatasource(tmp_path / "nope", on_error="ignore")


def test_corrupt_file_raise_names_file_and_task(corrupt, ray_session):
    bad, victim = corrupt
    source = vray.LeRobotDatasource(bad, keys=[CAM0, "index"])
    owners = [t for t in source.read_tasks_plan() if any(f == str(victim).replace(str(bad), str(bad)) and CAM0 in f
                                                         for f in t["video_files"])]
    assert owners
    ds = ray.data.read_datasource(source, ray_remote_args={"max_retries": 0})
    with pytest.raises(Exception) as info:
        ds.take_all()
    text = str(info.value)
    assert victim.name in text and "vlafeed.ray task" in text
    assert any(f"task {t['id']} " in text for t in owners), text


def test_corrupt_file_skip_counts_rows(corrupt, sample, ray_session):
    bad, victim = corrupt
    source = vray.LeRobotDatasource(bad, keys=[CAM0, "observation.state", "index", "episode_index"], on_error="skip")
    _, by = rows_by_index(ray.data.read_datasource(source))
    skipped = source.skipped()
    assert skipped, "nothing recorded as skipped"
    lost_eps = {r["episode"] for r in skipped}
    assert all(victim.name in r["error"] for r in skipped)
    lengths = {int(e["episode_index"]): int(e["length"]) for e in source.meta.episodes}
    # Every row is either delivered or counted as skipped, never both, never neither.
    assert len(by) + source.skipped_rows() == source.meta.total_frames
    assert {int(r["episode_index"]) for r in by.values()}.isdisjoint(lost_eps)
    assert source.skipped_rows() == sum(lengths[e] for e in lost_eps)
    # Rows delivered equal the intact dataset's.
    ref = vlafeed.LeRobotDataset(sample[1])
    for i in list(by)[:: max(1, len(by) // 5)]:
        np.testing.assert_array_equal(by[i][CAM0].transpose(2, 0, 1) / np.float32(255),
                                      ref[i][CAM0].numpy())


class _KillOnce:
    """Wraps a read task: after its first block, SIGKILLs the worker process once (marker file)."""

    def __init__(self, read_fn, marker):
        self.read_fn, self.marker = read_fn, marker

    def __call__(self):
        for i, block in enumerate(self.read_fn()):
            yield block
            if i == 0 and not os.path.exists(self.marker):
                with open(self.marker, "w") as f:
                    f.write(str(os.getpid()))
                os.kill(os.getpid(), 9)


class _KillingSource(vray.LeRobotDatasource):
    marker = None

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
        tasks = super().get_read_tasks(parallelism, per_task_row_limit, data_context)
        # Kill the worker in the middle of the second task.
        tasks[1] = type(tasks[1])(_KillOnce(tasks[1]._read_fn, self.marker), tasks[1].metadata)
        return tasks


def test_task_killed_is_retried_or_reported(sample, ray_session, tmp_path):
    """A read task whose worker is SIGKILLed after its first block: with Ray's retries the
    dataset still holds every row exactly once; with max_retries=0 the read fails (no row is
    silently lost)."""
    from ray import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    _, root = sample
    keys = ["observation.state", "index"]
    source = _KillingSource(root, keys=keys, rows_per_block=8)
    source.marker = str(tmp_path / "killed-1")
    _, by = rows_by_index(ray.data.read_datasource(source, ray_remote_args={"max_retries": 2}))
    assert os.path.exists(source.marker), "the task was not killed"
    assert sorted(by) == list(range(source.meta.total_frames))
    source = _KillingSource(root, keys=keys, rows_per_block=8)
    source.marker = str(tmp_path / "killed-2")
    with pytest.raises(Exception, match="(?i)worker|died|crash|exit"):
        ray.data.read_datasource(source, ray_remote_args={"max_retries": 0}).take_all()
    assert os.path.exists(source.marker)


def test_real_lerobot_v21_fixture(g1_dir, ray_session):
    """The real LeRobot v2.1 recording (one MP4 per episode; only episodes 1, 2 and 4 have their
    video): one read task per episode file, rows equal vlafeed.LeRobotDataset's items."""
    if not (g1_dir / "meta" / "info.json").is_file():
        pytest.skip("G1 fixture missing")
    cam = "observation.images.cam_high"
    source = vray.LeRobotDatasource(g1_dir, episodes=[1, 2], keys=[cam, "observation.state", "index"],
                                    rows_per_block=64)
    assert len(source.read_tasks_plan()) == 2
    _, by = rows_by_index(ray.data.read_datasource(source))
    ref = vlafeed.LeRobotDataset(g1_dir, episodes=[1, 2], image_format="uint8_hwc")
    assert len(by) == len(ref) == source.meta.total_frames
    first = min(by)
    for pos in (0, len(ref) // 2, len(ref) - 1):
        item = ref[pos]
        row = by[int(item["index"])]
        np.testing.assert_array_equal(row[cam], item[cam].numpy())
        np.testing.assert_array_equal(row["observation.state"], item["observation.state"].numpy())
    assert first == int(ref[0]["index"])
