"""Ray across two network-namespace nodes (tests/python/netns.py): a Ray head
in node 0 (`ray start --head`), a worker node in node 1 (`ray start
--address`), 1 CPU each, each with its own temp dir.

The LeRobot datasource's read tasks (1 CPU each) run on both nodes' CPUs:
every row of the dataset arrives once, and the processes that ran the read
tasks (their pids, from source.report()) are found in both namespaces.

Ray Train (examples/ray_finetune.py --data loader, one worker per node):
node 1 is killed whole mid-epoch once a checkpoint is registered; with a
replacement node started, FailureConfig restarts the worker group from the
last checkpoint, and each rank's data continues exactly from its loader
state (every attempt trains on its uninterrupted order from the step it
resumed at).
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import netns

pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::vlafeed.loader.LoaderWarning")

DRIVER = r"""
import json, os, sys, time
import ray, vlafeed.ray
t0 = time.time()
ray.init(address=sys.argv[1], include_dashboard=False)
ray.data.DataContext.get_current().enable_progress_bars = False
nodes = [n for n in ray.nodes() if n["Alive"]]
source = vlafeed.ray.LeRobotDatasource(sys.argv[2], keys=["index", "observation.images.cam0"])
ds = ray.data.read_datasource(source, ray_remote_args={"num_cpus": 1})
first, idx = None, []
for b in ds.iter_batches(batch_size=16, batch_format="numpy"):
    if first is None:
        first = time.time() - t0
    idx.extend(int(i) for i in b["index"])
tasks = source.report()["tasks"]
where = {}
for t in tasks:
    try:
        where[t["pid"]] = os.readlink(f"/proc/{t['pid']}/ns/net")
    except OSError:
        where[t["pid"]] = None
print(json.dumps({"nodes": [n["NodeManagerAddress"] for n in nodes], "indices": idx, "first_batch_s": first,
                  "total_s": time.time() - t0, "tasks": tasks, "netns": where}))
ray.shutdown()
"""


def ray_env(token):
    """Ray 2.60 asks a node joining a cluster for a token: the test's own, never a file of the user's."""
    return {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def ray_start(node, tmp, token, head_ip=None):
    ray = shutil.which("ray")
    args = [ray, "start", f"--node-ip-address={node.ip}", "--num-cpus=1", f"--temp-dir={tmp}",
            "--object-store-memory=100000000", "--disable-usage-stats"]
    if head_ip is None:
        args += ["--head", "--port=6379", "--include-dashboard=false"]
    else:
        args += [f"--address={head_ip}:6379"]
    t0 = time.time()
    r = node.run(args, timeout=180, env=ray_env(token))
    assert r.returncode == 0, f"ray start on {node}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return time.time() - t0


@pytest.fixture(scope="module")
def dataset(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode_ray") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "6", "--codec", "h264", "--size", "64x48",
                        "--fps", "10", "--min-length", "10", "--max-length", "20", "--max-video-mb", "0.005",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


@pytest.mark.skipif(shutil.which("ray") is None, reason="the ray command is not on PATH")
def test_ray_datasource_reads_on_both_nodes(dataset, tmp_path):
    with netns.cluster(2, tmp_path) as c:
        # Short temp dirs: Ray's Unix socket paths must stay under 108 characters.
        tmps = [f"/tmp/vfr{os.getpid()}n{i}" for i in range(2)]
        try:
            token = os.urandom(16).hex()
            t_head = ray_start(c[0], tmps[0], token)
            t_worker = ray_start(c[1], tmps[1], token, head_ip=c[0].ip)
            r = c[0].run([sys.executable, "-c", DRIVER, f"{c[0].ip}:6379", str(dataset)], timeout=300,
                         env=ray_env(token))
            assert r.returncode == 0, r.stderr[-4000:]
            out = json.loads(r.stdout.strip().splitlines()[-1])
            inode = {n.index: f"net:[{os.stat(f'/run/netns/{n.ns}').st_ino}]" for n in c}
        finally:
            for n in c:
                n.kill()
            for t in tmps:
                shutil.rmtree(t, ignore_errors=True)
    import vlafeed._native as native
    n_rows = sum(e["length"] for e in native.Dataset(str(dataset)).episodes)
    assert sorted(out["indices"]) == list(range(n_rows))
    assert sorted(out["nodes"]) == sorted([c[0].ip, c[1].ip])
    assert len(out["tasks"]) >= 2 and sum(t["rows"] for t in out["tasks"]) == n_rows
    on = {}
    for pid, ns in out["netns"].items():
        node = next((i for i, v in inode.items() if v == ns), None)
        on.setdefault(node, []).append(pid)
    assert 0 in on and 1 in on, f"read tasks ran in {on} (node inodes {inode})"
    print(f"\nmultinode ray: ray start head {t_head:.1f}s, worker {t_worker:.1f}s; "
          f"{len(out['tasks'])} read tasks, processes per node {({k: len(v) for k, v in on.items()})}; "
          f"first batch {out['first_batch_s']:.1f}s, all {out['total_s']:.1f}s after ray.init")


EXAMPLE = netns.ROOT / "examples" / "ray_finetune.py"
CAM0 = "observation.images.cam0"


def rank_logs(log_dir, rank):
    p = log_dir / f"rank{rank}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.mark.skipif(shutil.which("ray") is None, reason="the ray command is not on PATH")
def test_ray_train_survives_losing_a_worker_node(dataset, tmp_path):
    """examples/ray_finetune.py --data loader with one Ray Train worker per node (1 CPU each). Once a
    checkpoint exists, node 1 is killed whole (raylet and worker); a fresh `ray start --address` on node 1
    lets FailureConfig restart the worker group, which resumes from the last checkpoint: each rank's
    samples, attempt by attempt, are exactly its uninterrupted order from the checkpoint it resumed from."""
    import vlafeed
    epochs, batch, every = 2, 8, 2
    log_dir = tmp_path / "logs"
    with netns.cluster(2, tmp_path) as c:
        tmps = [f"/tmp/vfr{os.getpid()}t{i}" for i in range(3)]
        try:
            token = os.urandom(16).hex()
            ray_start(c[0], tmps[0], token)
            ray_start(c[1], tmps[1], token, head_ip=c[0].ip)
            env = dict(ray_env(token), RAY_ADDRESS=f"{c[0].ip}:6379", RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.5")
            out = open(tmp_path / "driver.out", "w")
            driver = c[0].popen([sys.executable, str(EXAMPLE), "--dataset", str(dataset), "--data", "loader",
                                 "--epochs", str(epochs), "--batch-size", str(batch), "--accum", "1",
                                 "--checkpoint-every", str(every), "--workers", "2", "--cpus-per-worker", "1",
                                 "--max-failures", "3", "--log-dir", str(log_dir),
                                 "--storage", str(tmp_path / "storage")], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
            deadline = time.time() + 300
            # Ray Train counts a checkpoint once its controller has registered it (the snapshot file).
            snapshot = tmp_path / "storage" / "vlafeed-ray-finetune" / "checkpoint_manager_snapshot.json"
            while not (snapshot.exists() and any(d["step"] > every for d in rank_logs(log_dir, 1))):
                assert driver.poll() is None and time.time() < deadline, \
                    (tmp_path / "driver.out").read_text()[-4000:]
                time.sleep(0.2)
            t_kill = time.time()
            c[1].kill()
            ray_start(c[1], tmps[2], token, head_ip=c[0].ip)  # the node comes back (a replacement)
            rc = driver.wait(timeout=400)
            recovery = time.time() - t_kill
            text = (tmp_path / "driver.out").read_text()
            assert rc == 0, text[-5000:]
        finally:
            for n in c:
                n.kill()
            for t in tmps:
                shutil.rmtree(t, ignore_errors=True)
    expected = {}
    for rank in (0, 1):
        loader = vlafeed.Loader(str(dataset), mode="stream", batch_size=batch, seed=0, drop_last=True, rank=rank,
                                world_size=2, threads=1, keys=[CAM0, "observation.state", "action", "index"],
                                renames={CAM0: "front"}, image_format="float32")
        seq = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            seq += [b["index"].tolist() for b in loader]
        loader.close()
        expected[rank] = seq
    for rank in (0, 1):
        attempts = {}
        for d in rank_logs(log_dir, rank):
            attempts.setdefault(d["pid"], []).append(d)
        runs = list(attempts.values())
        assert len(runs) >= 2, f"rank {rank}: no restart seen"
        for run in runs:
            start = run[0]["resumed_from"] or 0
            assert [d["index"] for d in run] == expected[rank][start:start + len(run)], (rank, start)
        assert runs[-1][0]["resumed_from"] >= every and runs[-1][-1]["step"] == len(expected[rank])
    print(f"\nmultinode ray train: node 1 killed, run finished {recovery:.1f}s later; attempts per rank "
          f"{[len({d['pid'] for d in rank_logs(log_dir, r)}) for r in (0, 1)]}")
