"""Ray across two network-namespace nodes (tests/python/netns.py): a Ray head
in node 0 (`ray start --head`), a worker node in node 1 (`ray start
--address`), 1 CPU each, each with its own temp dir.

The LeRobot datasource's read tasks (1 CPU each) run on both nodes' CPUs:
every row of the dataset arrives once, and the processes that ran the read
tasks (their pids, from source.report()) are found in both namespaces.
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
