"""A remote (http://) dataset read by 2 nodes x 2 ranks over network
namespaces (tests/python/netns.py), with and without the node cache.

Node 2 is the storage node: tests/python/remote_server.py's handler, bound to
node 2's address, logs every request with the client's address, so the
bytes served to each node are known. Nodes 0 and 1 each run 2 ranks of a
4-rank epoch (vlafeed.Loader, frames decoded); on each node one rank reads
in-process and the other through a torch DataLoader with 2 workers.

With VF_NODE_CACHE_DIR (one directory per node, from the harness): every
file a node reads is fetched by exactly one GET per node, whatever the
number of processes on it, the bytes served to the node equal the sizes of
those files, and the node's counters (<cache>/.stats) agree with the server.
Without it (the baseline) the same epoch costs more requests and bytes per
node; both are printed for docs/multi-node.md. The same with s3:// from
moto's server (wrapped to log each request's client) on node 2.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns

HERE = Path(__file__).resolve().parent
PORT = 8123

SERVER = r"""
import http.server, json, os, sys, threading, time, urllib.parse
sys.path.insert(0, sys.argv[1])
import remote_server
root, host, port, logpath = os.path.realpath(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
lock = threading.Lock()
out = open(logpath, "a", buffering=1)

class Handler(remote_server._Handler):
    def _serve(self):
        with lock:
            out.write(json.dumps([self.client_address[0], self.command, urllib.parse.urlsplit(self.path).path,
                                  self.headers.get("Range")]) + "\n")
        super()._serve()

httpd = http.server.ThreadingHTTPServer((host, port), Handler)
httpd.daemon_threads = True
httpd.root, httpd.faults, httpd.log, httpd.log_lock = root, None, [], threading.Lock()
threading.Timer(600, httpd.shutdown).start()
httpd.serve_forever(poll_interval=0.05)
"""

READER = r"""
import json, os, sys, time
t0 = time.time()
import vlafeed, vlafeed.torch
url, rank, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kw = dict(batch_size=4, mode="stream", seed=1, rank=rank, world_size=4, keys=["index", "observation.images.cam0"],
          image_format="uint8")
first, seen = None, []
if workers:
    ds = vlafeed.torch.IterableDataset(url, **kw)
    it = vlafeed.torch.DataLoader(ds, num_workers=workers)
else:
    it = vlafeed.Loader(url, threads=1, **kw)
for b in it:
    if first is None:
        first = time.time() - t0
    seen.extend(b["index"].tolist())
print(json.dumps({"rank": rank, "first_batch_s": first, "total_s": time.time() - t0, "indices": seen}))
"""


@pytest.fixture(scope="module")
def dataset(cli, tmp_path_factory):
    top = tmp_path_factory.mktemp("multinode_remote")
    r = subprocess.run([cli, "make-sample", str(top / "ds"), "--episodes", "8", "--cameras", "1", "--codec",
                        "h264", "--size", "64x48", "--min-length", "10", "--max-length", "20", "--seed", "2",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return top


def served_bytes(top, path, rng):
    size = os.path.getsize(os.path.join(top, path.lstrip("/")))
    if not rng:
        return size
    a, b = rng.split("=", 1)[1].split("-")
    if a == "":
        return min(size, int(b))
    end = min(int(b), size - 1) if b else size - 1
    return end - int(a) + 1


def epoch(c, url, node_cache, extra_env=None):
    """Both compute nodes read one epoch at once; returns (per-rank results, seconds)."""
    procs = []
    t0 = time.time()
    for node in c[:2]:
        env = dict(extra_env or {})
        if not node_cache:
            env["VF_NODE_CACHE_DIR"] = ""
        for local in range(2):
            rank = 2 * node.index + local
            procs.append((node, rank, node.popen([sys.executable, "-c", READER, url, str(rank), str(2 * local)],
                                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                 text=True)))
    results = []
    for node, rank, p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"rank {rank} on {node}: {err[-3000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results, time.time() - t0


def test_remote_dataset_crosses_the_network_once_per_node(dataset, tmp_path):
    top = dataset
    with netns.cluster(3, tmp_path) as c:
        storage = c[2]
        log = tmp_path / "requests.jsonl"
        storage.popen([sys.executable, "-c", SERVER, str(HERE), str(top), storage.ip, str(PORT), str(log)])
        assert netns.wait_port(c[0], storage.ip, PORT, timeout=30)
        url = f"http://{storage.ip}:{PORT}/ds"
        import vlafeed._native as native
        n = sum(e["length"] for e in native.Dataset(str(top / "ds")).episodes)

        report = {}
        for phase, cached in (("baseline", False), ("node_cache", True)):
            start = len(log.read_text().splitlines()) if log.exists() else 0
            results, seconds = epoch(c, url, cached)
            time.sleep(0.2)
            reqs = [json.loads(x) for x in log.read_text().splitlines()[start:]]
            delivered = sorted(i for r in results for i in r["indices"])
            # 4 ranks, no drop_last: every sample at least once, repeats only the wrap padding.
            assert set(delivered) == set(range(n)) and len(delivered) - n < 4
            per = {}
            for node in c[:2]:
                gets = [(p, rng) for ip, m, p, rng in reqs if ip == node.ip and m == "GET"]
                per[node.index] = {
                    "gets": len(gets), "files": len({p for p, _ in gets}),
                    "bytes": sum(served_bytes(top, p, rng) for p, rng in gets),
                    "heads": sum(1 for ip, m, *_ in reqs if ip == node.ip and m == "HEAD"),
                    "first_batch_s": sorted(round(r["first_batch_s"], 2) for r in results
                                            if r["rank"] // 2 == node.index),
                }
            report[phase] = {"seconds": round(seconds, 1), "nodes": per}
            if cached:
                for node in c[:2]:
                    gets = [(p, rng) for ip, m, p, rng in reqs if ip == node.ip and m == "GET"]
                    paths = [p for p, _ in gets]
                    twice = sorted({p for p in paths if paths.count(p) > 1})
                    assert not twice, f"{node}: fetched more than once: {twice}"
                    assert all(rng is None for _, rng in gets), "the node cache fetches whole objects"
                    sizes = sum(os.path.getsize(os.path.join(top, p.lstrip("/"))) for p in paths)
                    assert per[node.index]["bytes"] == sizes
                    stats = dict(line.split() for line in (node.cache_dir / ".stats").read_text().splitlines())
                    assert int(stats["fetches"]) == len(paths) and int(stats["bytes_fetched"]) == sizes, stats
                    assert int(stats["hits"]) > 0 and int(stats["evictions"]) == 0, stats
                    report[phase]["nodes"][node.index]["stats"] = {k: int(v) for k, v in stats.items()}
        base, cached = report["baseline"]["nodes"], report["node_cache"]["nodes"]
        for i in (0, 1):
            assert cached[i]["bytes"] <= base[i]["bytes"] and cached[i]["gets"] < base[i]["gets"]
    print("\nmultinode remote: " + json.dumps(report))


S3SERVER = r"""
import json, sys, threading
from werkzeug.serving import make_server
from moto.server import DomainDispatcherApplication, create_backend_app
host, port, logpath = sys.argv[1], int(sys.argv[2]), sys.argv[3]
app = DomainDispatcherApplication(create_backend_app)
out, lock = open(logpath, "a", buffering=1), threading.Lock()

def logged(environ, start_response):
    with lock:
        out.write(json.dumps([environ.get("REMOTE_ADDR"), environ["REQUEST_METHOD"], environ.get("PATH_INFO"),
                              environ.get("HTTP_RANGE"), environ.get("QUERY_STRING", "")]) + "\n")
    return app(environ, start_response)

make_server(host, port, logged, threaded=True).serve_forever()
"""

UPLOAD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import remote_server
remote_server.upload_tree(sys.argv[2], "vfbucket", sys.argv[3], "ds")
"""


def test_s3_dataset_crosses_the_network_once_per_node(dataset, tmp_path):
    pytest.importorskip("moto")
    pytest.importorskip("boto3")
    from remote_server import s3_env
    top = dataset
    with netns.cluster(3, tmp_path) as c:
        storage = c[2]
        log = tmp_path / "s3requests.jsonl"
        storage.popen([sys.executable, "-c", S3SERVER, storage.ip, str(PORT), str(log)],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert netns.wait_port(c[0], storage.ip, PORT, timeout=60)
        endpoint = f"http://{storage.ip}:{PORT}"
        r = storage.run([sys.executable, "-c", UPLOAD, str(HERE), endpoint, str(top / "ds")], timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        start = len(log.read_text().splitlines())
        results, seconds = epoch(c, "s3://vfbucket/ds", True, s3_env(endpoint))
        time.sleep(0.2)
        reqs = [json.loads(x) for x in log.read_text().splitlines()[start:]]
    import vlafeed._native as native
    n = sum(e["length"] for e in native.Dataset(str(top / "ds")).episodes)
    delivered = [i for r in results for i in r["indices"]]
    assert set(delivered) == set(range(n))
    report = {}
    for node in c[:2]:
        gets = [(p, rng) for ip, m, p, rng, q in reqs if ip == node.ip and m == "GET" and not q]
        paths = [p for p, _ in gets]
        twice = sorted({p for p in paths if paths.count(p) > 1})
        assert not twice, f"{node}: fetched more than once: {twice}"
        sizes = sum(os.path.getsize(top / p.split("/", 2)[2]) for p in paths)
        stats = dict(line.split() for line in (node.cache_dir / ".stats").read_text().splitlines())
        assert int(stats["fetches"]) == len(paths) and int(stats["bytes_fetched"]) == sizes, stats
        report[node.index] = {"gets": len(gets), "bytes": sizes, "stats": stats,
                              "lists": sum(1 for ip, m, p, rng, q in reqs if ip == node.ip and q),
                              "heads": sum(1 for ip, m, *_ in reqs if ip == node.ip and m == "HEAD")}
    print("\nmultinode s3: " + json.dumps({"seconds": round(seconds, 1), "nodes": report}))
