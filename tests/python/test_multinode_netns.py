"""The network-namespace harness (tests/python/netns.py) itself: nodes have
their own addresses and reach each other over the bridge, each has its own
loopback and environment, kill() ends every process of one node only, and
teardown leaves no namespace behind, also after a failure inside the block.
"""
import subprocess
import sys

import pytest

import netns

SERVE = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
         "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen(4)\n"
         "while True:\n c,_=s.accept();c.sendall(sys.argv[2].encode());c.close()\n")
ASK = ("import socket,sys\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])),3)\n"
       "print(c.recv(100).decode())\n")


def test_nodes_talk_over_the_bridge_and_die_alone(tmp_path):
    with netns.cluster(3, tmp_path) as c:
        names = [n.ns for n in c]
        servers = [n.popen([sys.executable, "-c", SERVE, "7001", f"node{n.index}"]) for n in c]
        for n in c:
            assert netns.wait_port(c[0], n.ip, 7001, timeout=20), n
        r = c[2].run([sys.executable, "-c", ASK, c[1].ip, "7001"], timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == "node1", r.stderr
        # Each node has its own loopback: 127.0.0.1:7001 in node 2 is node 2's own server.
        r = c[2].run([sys.executable, "-c", ASK, "127.0.0.1", "7001"], timeout=30)
        assert r.stdout.strip() == "node2"
        r = c[0].run([sys.executable, "-c", "import os;print(os.environ['VF_NODE_CACHE_DIR'])"])
        assert r.stdout.strip() == str(c[0].cache_dir) and c[0].cache_dir != c[1].cache_dir
        c[1].kill()
        assert servers[1].wait(10) is not None and not c[1].pids()
        assert servers[0].poll() is None and servers[2].poll() is None
        r = c[0].run([sys.executable, "-c", ASK, c[1].ip, "7001"], timeout=30)
        assert r.returncode != 0
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in left for n in names) and c.hub not in left
    assert all(p.poll() is not None for p in servers)


def test_teardown_after_a_failure(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with netns.cluster(2, tmp_path) as c:
            c[0].popen([sys.executable, "-c", "import time; time.sleep(600)"])
            names = [n.ns for n in c] + [c.hub]
            raise RuntimeError("boom")
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in left for n in names)
