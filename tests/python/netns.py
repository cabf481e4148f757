"""Several "nodes" on one machine, for multi-node tests.

Each node is a Linux network namespace with its own interface (`eth0`,
address 10.213.0.<i+1>/24), its own loopback, its own environment and its
own directory (cache, tmp). The nodes are joined by a bridge that lives in a
further "hub" namespace, so nothing is added to the host's own network: the
addresses are private to the namespaces and two clusters (two test runs at
once) never see each other. Needs root and iproute2's `ip`; `available()`
says why not otherwise, and `cluster()` skips the test with that reason.

    with netns.cluster(2, tmp_path) as c:      # or the `nodes` helper below
        p = c[1].popen([sys.executable, "-c", "..."])
        c[1].kill()                            # SIGKILL every process in node 1
    # namespaces and their processes are gone here, whatever happened

The filesystem is shared (same machine): a checkpoint directory given to
every node behaves like a shared filesystem; each node's `dir` is its own.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "vfnt"  # every namespace this module creates starts with this
SUBNET = "10.213.0"
ROOT = Path(__file__).resolve().parents[2]


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _pids(ns):
    r = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in r.stdout.split() if x.strip().isdigit()]


def _remove(ns):
    for _ in range(50):
        pids = _pids(ns)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    _ip("netns", "del", ns, check=False)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale():
    """Namespaces left by a test process that died before its teardown (named after its pid)."""
    for ns in _namespaces():
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX):].split("-")[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            _remove(ns)


_REASON = []


def available():
    """None when namespaces can be made here, else the reason they cannot (cached)."""
    if _REASON:
        return _REASON[0]
    reason = None
    if sys.platform != "linux":
        reason = "network namespaces need Linux"
    elif shutil.which("ip") is None:
        reason = "iproute2's `ip` is not on PATH"
    elif os.geteuid() != 0:
        reason = "creating network namespaces needs root"
    else:
        probe = f"{PREFIX}{os.getpid()}-probe"
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            reason = f"`ip netns add` failed: {r.stderr.strip()}"
        else:
            r = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
            if r.returncode != 0:
                reason = f"cannot create a bridge in a namespace: {r.stderr.strip()}"
            else:
                r = _ip("-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb", check=False)
                if r.returncode != 0:
                    reason = f"cannot create a veth pair in a namespace: {r.stderr.strip()}"
            _remove(probe)
    _REASON.append(reason)
    return reason


class Node:
    def __init__(self, cluster, index):
        self.cluster = cluster
        self.index = index
        self.ns = f"{cluster.name}-n{index}"
        self.ip = f"{SUBNET}.{index + 1}"
        self.ifname = "eth0"
        self.dir = Path(cluster.base) / f"node{index}"
        self.cache_dir = self.dir / "cache"
        self.tmp = self.dir / "tmp"
        for d in (self.cache_dir, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT / "python"), os.environ.get("PYTHONPATH", "")] if p),
            "VF_NODE_CACHE_DIR": str(self.cache_dir),
            "TMPDIR": str(self.tmp),
            "OMP_NUM_THREADS": "1",
            # gloo and torchrun would otherwise resolve the (shared) hostname to an address of the host
            "GLOO_SOCKET_IFNAME": self.ifname,
            "TP_SOCKET_IFNAME": self.ifname,
            "VF_TEST_NODE": str(index),
            "VF_TEST_NODE_IP": self.ip,
        }
        self.procs = []

    def __repr__(self):
        return f"Node({self.index}, {self.ip})"

    def _argv(self, cmd):
        return ["ip", "netns", "exec", self.ns, *[str(c) for c in cmd]]

    def environ(self, extra=None):
        e = dict(os.environ)
        e.update(self.env)
        e.update(extra or {})
        return e

    def popen(self, cmd, env=None, **kw):
        """Starts cmd inside this node (own session, so kill() and teardown find it either way)."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self._argv(cmd), env=self.environ(env), **kw)
        self.procs.append(p)
        return p

    def run(self, cmd, env=None, timeout=300, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self._argv(cmd), env=self.environ(env), timeout=timeout, **kw)

    def pids(self):
        return _pids(self.ns)

    def kill(self, sig=signal.SIGKILL):
        """Kills every process of this node (as a node failure would), and waits until none is left."""
        for _ in range(100):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(0.05)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)


class Cluster:
    def __init__(self, n, base):
        self.n = n
        self.base = Path(base)
        self.name = f"{PREFIX}{os.getpid()}-{_next_id()}"
        self.hub = f"{self.name}-hub"
        self.nodes = []
        self._made = []

    def __getitem__(self, i):
        return self.nodes[i]

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self):
        return len(self.nodes)

    def up(self):
        _remove_stale()
        _LIVE.add(self)
        _ip("netns", "add", self.hub)
        self._made.append(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        _ip("-n", self.hub, "link", "set", "lo", "up")
        tag = self.name[len(PREFIX):].replace("-", "")[-9:]
        for i in range(self.n):
            node = Node(self, i)
            _ip("netns", "add", node.ns)
            self._made.append(node.ns)
            host_side, node_side = f"h{tag}{i}", f"n{tag}{i}"  # <= 15 characters, gone with the namespaces
            _ip("link", "add", host_side, "type", "veth", "peer", "name", node_side)
            _ip("link", "set", host_side, "netns", self.hub)
            _ip("link", "set", node_side, "netns", node.ns)
            _ip("-n", node.ns, "link", "set", node_side, "name", node.ifname)
            _ip("-n", self.hub, "link", "set", host_side, "master", "br0", "up")
            _ip("-n", node.ns, "addr", "add", f"{node.ip}/24", "dev", node.ifname)
            _ip("-n", node.ns, "link", "set", node.ifname, "up")
            _ip("-n", node.ns, "link", "set", "lo", "up")
            self.nodes.append(node)
        return self

    def down(self):
        for node in self.nodes:
            for p in node.procs:
                if p.poll() is None:
                    with contextlib.suppress(Exception):
                        os.killpg(p.pid, signal.SIGKILL)
        for ns in reversed(self._made):
            _remove(ns)
        self._made.clear()
        for node in self.nodes:
            for p in node.procs:
                with contextlib.suppress(Exception):
                    p.wait(timeout=10)
        _LIVE.discard(self)


_LIVE = set()
_IDS = [0]


def _next_id():
    _IDS[0] += 1
    return _IDS[0]


@atexit.register
def _teardown_all():
    for c in list(_LIVE):
        with contextlib.suppress(Exception):
            c.down()


@contextlib.contextmanager
def cluster(n, base):
    """n nodes under base (a pytest tmp_path); skips the calling test when namespaces are unavailable."""
    reason = available()
    if reason:
        import pytest
        pytest.skip(f"multi-node test skipped: {reason}")
    c = Cluster(n, base)
    try:
        yield c.up()
    finally:
        c.down()


def wait_port(node, host, port, timeout=60):
    """Waits until host:port accepts a TCP connection, seen from inside node."""
    code = (f"import socket,time,sys\nt=time.time()+{timeout}\n"
            f"while time.time()<t:\n"
            f" try:\n  socket.create_connection(({host!r},{port}),1).close();sys.exit(0)\n"
            f" except OSError: time.sleep(0.2)\nsys.exit(1)")
    return node.run([sys.executable, "-c", code], timeout=timeout + 10).returncode == 0
