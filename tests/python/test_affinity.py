"""Placement of the engine threads (docs/gpus.md "Placement"): an explicit
affinity list pins the engine threads (seen in /proc/self/task/*/status),
bad lists are refused naming the CPUs, "auto" without a GPU pins nothing
and says why, the NUMA discovery on fake sysfs trees (tmp dirs), the split
among local ranks, decode_threads=0, and the data-wait figures of stats()."""
import os
import subprocess
import time
import types

import pytest

import vlafeed
from vlafeed import _affinity


@pytest.fixture(scope="module")
def sample_root(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("affinity") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "3", "--codec", "h264", "--size", "96x64",
                        "--fps", "10", "--min-length", "20", "--max-length", "30", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


def cpu_lists_of_threads():
    """{tid: Cpus_allowed_list} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = line.split(":", 1)[1].strip()
        except OSError:
            pass
    return out


# ---- explicit lists ------------------------------------------------------------------------

def test_explicit_list_pins_the_engine_threads(sample_root):
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1]
    before = set(cpu_lists_of_threads())
    loader = vlafeed.Loader(sample_root, mode="stream", batch_size=4, threads=2, affinity=[cpu], output="numpy")
    try:
        st = loader.stats()
        assert st["affinity"] == {"cpus": [cpu], "reason": f"explicit: CPUs {cpu}"}
        assert st["pinned_cpus"] == 1 and st["engine_threads"] == 2
        new = {tid: cpus for tid, cpus in cpu_lists_of_threads().items() if tid not in before}
        assert len(new) >= 2, new  # the two engine threads (decoders may add theirs)
        assert all(cpus == str(cpu) for cpus in new.values()), new
        # the caller's thread is left alone
        assert cpu_lists_of_threads()[os.getpid()] == _affinity.format_cpulist(allowed)
        assert sum(len(next(iter(b.values()))) for b in loader) == loader.num_samples
    finally:
        loader.close()


def test_cpulist_string_and_threads_zero(sample_root):
    cpus = sorted(os.sched_getaffinity(0))
    text = _affinity.format_cpulist(cpus)
    with vlafeed.Loader(sample_root, mode="stream", batch_size=4, affinity=text, decode_threads=0,
                        output="numpy") as loader:
        st = loader.stats()
        assert st["affinity"]["cpus"] == cpus
        assert st["engine_threads"] == len(cpus)  # threads=0 with a CPU set: one per CPU
        assert st["decode_threads"] == 1  # every core already has an engine thread


@pytest.mark.parametrize("bad, named", [([60000], "60000"), ([0, 60000, 60001], "60000-60001"),
                                        ("5000-5001", "5000-5001")])
def test_bad_lists_are_refused(sample_root, bad, named):
    with pytest.raises(ValueError, match=f"CPU\\(s\\) {named} do not exist or are not allowed"):
        vlafeed.Loader(sample_root, mode="stream", affinity=bad)


@pytest.mark.parametrize("bad", [[], "fast", ["x"], "3-1"])
def test_malformed_settings_are_refused(sample_root, bad):
    with pytest.raises(ValueError):
        vlafeed.Loader(sample_root, mode="stream", affinity=bad)


def test_native_keyword_checks_too(sample_root):
    ds = vlafeed._native.Dataset(str(sample_root))
    with pytest.raises(ValueError, match="loader: cpus: CPU list: CPU 60000 does not exist or is not allowed"):
        vlafeed._native.Loader(ds, mode="stream", cpus=[60000])
    with pytest.raises(ValueError, match="CPU id out of range"):
        vlafeed._native.Loader(ds, mode="stream", cpus=[-1])
    with pytest.raises(TypeError, match="cpus must be a sequence"):
        vlafeed._native.Loader(ds, mode="stream", cpus=3)


# ---- auto / none -----------------------------------------------------------------------------

def test_none_is_the_default(sample_root):
    with vlafeed.Loader(sample_root, mode="stream", output="numpy") as loader:
        st = loader.stats()
        assert st["affinity"] == {"cpus": None, "reason": "affinity='none': not pinned"}
        assert st["pinned_cpus"] == 0


def test_auto_without_gpu_reports_why(sample_root):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with vlafeed.Loader(sample_root, mode="stream", affinity="auto", output="numpy") as loader:
        st = loader.stats()
        assert st["affinity"] == {"cpus": None, "reason": "auto: not pinned: " + _affinity.NO_CUDA}
        assert st["pinned_cpus"] == 0


# ---- NUMA discovery on fake sysfs trees ------------------------------------------------------

def fake_sysfs(tmp_path, gpus, nodes):
    """gpus: {bus id: numa_node}; nodes: {node: cpulist}."""
    for bus, node in gpus.items():
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    for node, cpulist in nodes.items():
        d = tmp_path / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    return str(tmp_path)


TWO_NODES = {0: "0-7,16-23", 1: "8-15,24-31"}
FOUR_GPUS = {"0000:1b:00.0": 0, "0000:3b:00.0": 0, "0000:86:00.0": 1, "0000:af:00.0": 1}


def test_cpulist_parsing():
    assert _affinity.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert _affinity.parse_cpulist("") == []
    assert _affinity.format_cpulist([5, 0, 1, 2, 8, 9]) == "0-2,5,8-9"
    for bad in ("a", "3-1", "1-x", "-2"):
        with pytest.raises(ValueError):
            _affinity.parse_cpulist(bad)


def test_pci_ids_and_nodes(tmp_path):
    sysfs = fake_sysfs(tmp_path, {"0000:3b:00.0": 1, "0000:5e:00.0": -1}, TWO_NODES)
    assert _affinity.normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"  # nvidia-smi's form
    assert _affinity.pci_numa_node("00000000:3B:00.0", sysfs) == 1
    assert _affinity.pci_numa_node("0000:5e:00.0", sysfs) is None  # -1: unknown
    assert _affinity.pci_numa_node("0000:99:00.0", sysfs) is None  # no such device
    assert _affinity.node_cpus(1, sysfs) == list(range(8, 16)) + list(range(24, 32))
    assert _affinity.node_cpus(7, sysfs) is None
    with pytest.raises(ValueError):
        _affinity.normalize_pci_bus_id("3b00")


def test_split_share():
    cpus = list(range(10))
    shares = [_affinity.split_share(cpus, i, 3) for i in range(3)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert _affinity.split_share([4, 5], 3, 4) == [5]  # more ranks than CPUs: they share
    assert _affinity.split_share(cpus, 0, 1) == cpus


def auto(sysfs, env, allowed=range(32), ids=tuple(FOUR_GPUS)):
    return _affinity.resolve("auto", sysfs=sysfs, allowed=set(allowed), env=env,
                             bus_ids=lambda: (list(ids), "test"))


def test_auto_splits_the_gpus_node_among_its_local_ranks(tmp_path):
    sysfs = fake_sysfs(tmp_path, FOUR_GPUS, TWO_NODES)
    node0 = list(range(0, 8)) + list(range(16, 24))
    node1 = list(range(8, 16)) + list(range(24, 32))
    got = [auto(sysfs, {"LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "4"}) for r in range(4)]
    assert [g["cpus"] for g in got] == [node0[:8], node0[8:], node1[:8], node1[8:]]
    assert "NUMA node 1" in got[3]["reason"] and "share 2 of 2" in got[3]["reason"]
    # one rank per node: the whole node
    assert auto(sysfs, {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "1"})["cpus"] == node1
    # the process may not run everywhere: the intersection
    assert auto(sysfs, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, allowed=[1, 2, 3, 40])["cpus"] == [1, 2, 3]


def test_auto_pins_nothing_when_it_cannot_tell(tmp_path):
    sysfs = fake_sysfs(tmp_path, {"0000:3b:00.0": -1}, TWO_NODES)
    got = auto(sysfs, {"LOCAL_RANK": "0"}, ids=["0000:3b:00.0"])
    assert got["cpus"] is None and "NUMA node of GPU 0 (0000:3b:00.0) is unknown" in got["reason"]
    sysfs2 = fake_sysfs(tmp_path / "b", {"0000:3b:00.0": 1}, TWO_NODES)
    got = auto(sysfs2, {"LOCAL_RANK": "0"}, allowed=[0, 1], ids=["0000:3b:00.0"])
    assert got["cpus"] is None and "none of NUMA node 1's CPUs is allowed" in got["reason"]
    got = _affinity.resolve("auto", sysfs=sysfs, allowed={0}, env={}, bus_ids=lambda: (None, "no GPU here"))
    assert got == {"cpus": None, "reason": "auto: not pinned: no GPU here"}


def test_bus_ids_from_torch_or_nvidia_smi():
    def fake_torch(props):
        cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: len(props),
                                     get_device_properties=lambda i: props[i])
        return types.SimpleNamespace(cuda=cuda)
    with_ids = fake_torch([types.SimpleNamespace(pci_bus_id="0000:3b:00.0")])
    assert _affinity.gpu_pci_bus_ids(with_ids) == (["0000:3b:00.0"], "torch")
    without = fake_torch([types.SimpleNamespace(name="H100"), types.SimpleNamespace(name="H100")])
    smi = types.SimpleNamespace(stdout="00000000:1B:00.0\n00000000:3B:00.0\n")
    ids, how = _affinity.gpu_pci_bus_ids(without, run=lambda *a, **k: smi)
    assert (ids, how) == (["00000000:1B:00.0", "00000000:3B:00.0"], "nvidia-smi")
    no_cuda = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    assert _affinity.gpu_pci_bus_ids(no_cuda) == (None, _affinity.NO_CUDA)


def test_decode_threads_rule():
    assert _affinity.decode_threads_for(16, 2) == 8
    assert _affinity.decode_threads_for(64, 2) == 8  # at most 8
    assert _affinity.decode_threads_for(6, 4) == 1
    assert _affinity.decode_threads_for(1, 4) == 1  # at least 1


# ---- data wait ---------------------------------------------------------------------------------

def test_data_wait_stats(sample_root):
    with vlafeed.Loader(sample_root, mode="stream", batch_size=4, threads=1, output="numpy") as loader:
        st = loader.stats()
        assert st["data_wait_fraction"] is None and st["data_wait_s"] == 0.0
        steps = 0
        for _ in loader:
            time.sleep(0.003)  # the "training step"
            steps += 1
        st = loader.stats()
    assert steps >= 3
    assert st["data_wait_s"] == st["wait_seconds"] >= st["wait_after_first_seconds"] >= 0
    assert st["handout_seconds"] >= 0.003 * (steps - 1) * 0.9
    assert 0.0 <= st["data_wait_fraction"] <= 1.0
    assert st["data_wait_fraction"] == pytest.approx(st["wait_after_first_seconds"] / st["handout_seconds"])
