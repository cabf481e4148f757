"""python -m vlafeed.train under torchrun across two network-namespace nodes
(tests/python/netns.py): c10d rendezvous on node 0's address, 2 ranks per
node, FSDP2 over gloo between the nodes, fed by vlafeed.Loader.

One run, four generations:
  1. 2 nodes x 2 ranks (world 4), checkpoints every 2 steps; once a
     checkpoint exists, every process of node 1 is killed (SIGKILL) mid-epoch
     and node 0's ranks fail on their next collective;
  2. 1 node x 2 ranks resumes from the last checkpoint (DCP reshards the
     model and optimizer 4 -> 2; the loader continues by elastic resume);
  3. 2 nodes x 2 ranks again (2 -> 4) to the end of epoch 1.
Checked: every sample of epoch 0 and of epoch 1 is trained on exactly once
over the steps that count (those up to the checkpoint each generation
resumed from), the losses continue step by step and stay finite, and each
generation reports the world size it ran at. The sample log is
train.sample_log; the dataset size is chosen so that no generation drops a
remainder (drop_last), so "exactly once" means every index once.
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns

pytest.importorskip("yaml")
torch = pytest.importorskip("torch")

EPISODES, LENGTH, BATCH = 12, 10, 2  # 120 samples: 15 steps per epoch at world 4, 30 at world 2
N = EPISODES * LENGTH
PORT = 29400
CONFIG = """
data: {{dataset: {root}, batch_size: {batch}, chunk: 2, mode: stream, seed: 3, loader_threads: 1}}
model: {{d_model: 16, layers: 1, heads: 2, patch: 16, max_text_tokens: 8}}
parallel: {{fsdp: true, backend: gloo, device: cpu}}
train: {{steps: 100, grad_accum: 1, precision: fp32, warmup_steps: 1, log_every: 1, threads: 1}}
checkpoint: {{dir: {ck}, every: 2, resume: auto, keep: 0}}
"""


@pytest.fixture(scope="module")
def dataset(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode_torchrun") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", str(EPISODES), "--cameras", "1", "--codec",
                        "h264", "--size", "32x32", "--min-length", str(LENGTH), "--max-length", str(LENGTH),
                        "--seed", "5", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


def torchrun(node, nnodes, cfg, tag, args, rdzv_ip, port):
    """torchrun on one node; is_host tells the c10d rendezvous which node serves its store."""
    exe = shutil.which("torchrun")
    conf = f"is_host={1 if node.ip == rdzv_ip else 0},join_timeout=120"
    cmd = [exe, f"--nnodes={nnodes}", "--nproc_per_node=2", "--rdzv_backend=c10d",
           f"--rdzv_endpoint={rdzv_ip}:{port}", f"--rdzv_id=vf{port}", f"--rdzv_conf={conf}",
           f"--local_addr={node.ip}", "--max_restarts=0", "-m", "vlafeed.train", "--config", str(cfg)] + args
    out = open(node.dir / f"{tag}.out", "w")
    return node.popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def tail(node, tag):
    p = node.dir / f"{tag}.out"
    return p.read_text()[-4000:] if p.exists() else "(no output)"


def latest_step(ck):
    f = Path(ck) / "latest"
    if not f.exists():
        return 0
    name = f.read_text().strip()
    return int(name.rsplit("_", 1)[1]) if name else 0


def samples(prefix, ranks, upto=None):
    """[(step, epoch, rank, [index...])] from each rank's sample log, steps <= upto."""
    out = []
    for r in range(ranks):
        p = Path(f"{prefix}.rank{r}.jsonl")
        for line in p.read_text().splitlines():
            rec = json.loads(line)
            if upto is None or rec["step"] <= upto:
                out.append((rec["step"], rec["epoch"], r, rec["index"], rec["time"]))
    return out


def losses(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]  # a step re-run after a resume replaces the lost one
    return out


def wait_all(procs, nodes, tags, timeout):
    for p, node, tag in zip(procs, nodes, tags):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{tag} on {node} did not finish:\n{tail(node, tag)}")
        assert rc == 0, f"{tag} on {node} exited {rc}:\n{tail(node, tag)}"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_two_nodes_lose_one_resume_on_one_then_two(dataset, tmp_path):
    with netns.cluster(2, tmp_path) as c:
        ck = tmp_path / "ckpt"  # shared by both nodes, as a shared filesystem would be
        ck.mkdir()
        cfg = tmp_path / "run.yaml"
        cfg.write_text(CONFIG.format(root=dataset, batch=BATCH, ck=ck))
        log = tmp_path / "loss.jsonl"
        rdzv = c[0].ip
        timing = {}

        # 1. 2 nodes x 2 ranks until a checkpoint exists, then node 1 dies.
        gen1 = ["--train.sample_log", str(tmp_path / "g1"), "--train.log_file", str(log)]
        t0 = time.time()
        p1 = [torchrun(n, 2, cfg, "g1", gen1, rdzv, PORT) for n in c]
        deadline = time.time() + 240
        while latest_step(ck) < 2:
            assert time.time() < deadline and all(p.poll() is None for p in p1), \
                f"generation 1 made no checkpoint:\n{tail(c[0], 'g1')}\n{tail(c[1], 'g1')}"
            time.sleep(0.05)
        c[1].kill()
        try:  # node 0's ranks fail on their next collective with node 1 gone; their torchrun gives up
            rc0 = p1[0].wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc0 = "hung"
            c[0].kill()
        assert rc0 != 0, "node 0 finished although node 1 was killed"
        c1 = latest_step(ck)
        timing["g1"] = samples(tmp_path / "g1", 4)
        assert 2 <= c1 < N // (4 * BATCH), f"killed after the end of epoch 0 (checkpoint {c1})"
        g1 = samples(tmp_path / "g1", 4, upto=c1)

        # 2. 1 node x 2 ranks resumes 4 -> 2 for 4 steps; the global batch stays 8 (train.grad_accum 1 -> 2).
        c2 = c1 + 4
        gen2 = ["--train.sample_log", str(tmp_path / "g2"), "--train.log_file", str(log),
                "--train.stop_at", str(c2)]
        p2 = torchrun(c[0], 1, cfg, "g2", gen2, rdzv, PORT + 1)
        wait_all([p2], [c[0]], ["g2"], 240)
        assert latest_step(ck) == c2
        out2 = (c[0].dir / "g2.out").read_text()
        assert f"saved at world size 4, now 2; data continues from the loader's elastic resume" in out2, out2
        assert "global batch 8 (the checkpoint's global batch) at world size 2: train.grad_accum 1 -> 2" in out2
        g2 = samples(tmp_path / "g2", 2)

        # 3. 2 nodes x 2 ranks again (2 -> 4) to the end of epoch 1.
        left0 = N - 8 * c2  # 8 samples per step at either world size
        end = c2 + left0 // (4 * BATCH) + N // (4 * BATCH)
        gen3 = ["--train.sample_log", str(tmp_path / "g3"), "--train.log_file", str(log),
                "--train.steps", str(end)]
        p3 = [torchrun(n, 2, cfg, "g3", gen3, rdzv, PORT + 2) for n in c]
        wait_all(p3, list(c), ["g3", "g3"], 300)
        out3 = (c[0].dir / "g3.out").read_text()
        assert "saved at world size 2, now 4" in out3 and "exactly-once" not in out3.replace(
            "NOT exactly-once", "!"), out3
        g3 = samples(tmp_path / "g3", 4)
        elapsed = time.time() - t0

    per_epoch = {}
    for step, epoch, rank, idx, _ in g1 + g2 + g3:
        per_epoch.setdefault(epoch, []).extend(idx)
    assert sorted(per_epoch) == [0, 1], sorted(per_epoch)
    for epoch, idx in per_epoch.items():
        assert sorted(idx) == list(range(N)), \
            f"epoch {epoch}: {len(idx)} deliveries of {len(set(idx))} samples, {N} in the epoch"
    # Each generation ran at its world size: ranks 0-3, then 0-1, then 0-3 again.
    assert {r for *_, r, _i, _t in [(s, e, r, i, t) for s, e, r, i, t in g1]} == {0, 1, 2, 3}
    assert {r for _s, _e, r, _i, _t in g2} == {0, 1} and {r for _s, _e, r, _i, _t in g3} == {0, 1, 2, 3}
    # Losses: one per step from 1 to the end, finite, steps continuing across both resumes.
    ls = losses(log)
    assert sorted(ls) == list(range(1, end + 1)), sorted(ls)
    assert all(v == v and abs(v) != float("inf") for v in ls.values())
    summary = json.loads((ck / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["steps"] == end and summary["resumed_from"].endswith(
        f"step_{c2:08d}")
    first = {}
    for step, _e, rank, _i, t in timing["g1"]:
        first[rank] = min(first.get(rank, t), t)
    print(f"\nmultinode torchrun: killed after checkpoint {c1}, 1x2 to {c2}, 2x2 to {end}; "
          f"{elapsed:.1f}s in all; first batch per rank (s after launch) "
          + ", ".join(f"{r}: {first[r] - t0:.1f}" for r in sorted(first)))


def counted(prefix, ranks):
    """Sample-log lines that count: a process's generation is cut where the next generation resumed.

    Every worker process (pid) belongs to one generation, which starts at the step after the checkpoint it
    resumed from; the steps of a generation at or past the next generation's first step were lost with it."""
    procs = {}
    for r in range(ranks):
        p = Path(f"{prefix}.rank{r}.jsonl")
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            rec = json.loads(line)
            procs.setdefault(rec["pid"], []).append(rec)
    gens = {}
    for recs in procs.values():
        first = min(x["step"] for x in recs)
        gens.setdefault((first, recs[0]["world"]), []).extend(recs)
    order = sorted(gens)
    out = []
    for i, key in enumerate(order):
        cut = order[i + 1][0] if i + 1 < len(order) else None
        out.extend(x for x in gens[key] if cut is None or x["step"] < cut)
    return [k for k in order], out


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_elastic_membership_nnodes_1_to_2(dataset, tmp_path):
    """torchrun --nnodes 1:2 --max_restarts 3 on both nodes: when node 1 dies, node 0's launcher (not
    restarted by anyone) re-forms the job as 1 node x 2 ranks; when torchrun starts on node 1 again, the
    job grows back to 2 nodes x 2. vlafeed.train resumes from the latest checkpoint each time (4 -> 2 -> 4
    ranks); every finished epoch is trained on exactly once, the last (partial) one without repeats.
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the store shared across rounds (the default), a node that
    joins a running job waits forever for the round's MASTER_ADDR, which node 0 does not publish again."""
    steps = 60
    with netns.cluster(2, tmp_path) as c:
        ck = tmp_path / "ckpt"
        ck.mkdir()
        cfg = tmp_path / "run.yaml"
        cfg.write_text(CONFIG.format(root=dataset, batch=BATCH, ck=ck).replace("steps: 100", f"steps: {steps}"))
        log = tmp_path / "loss.jsonl"
        args = ["--train.sample_log", str(tmp_path / "s"), "--train.log_file", str(log)]
        exe = shutil.which("torchrun")

        def launch(node, tag):
            conf = f"is_host={1 if node.index == 0 else 0},join_timeout=120,last_call_timeout=2"
            cmd = [exe, "--nnodes=1:2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                   f"--rdzv_endpoint={c[0].ip}:{PORT + 3}", "--rdzv_id=vfelastic", f"--rdzv_conf={conf}",
                   f"--local_addr={node.ip}", "--max_restarts=3", "--monitor_interval=0.5", "-m", "vlafeed.train",
                   "--config", str(cfg)] + args
            return node.popen(cmd, stdout=open(node.dir / f"{tag}.out", "w"), stderr=subprocess.STDOUT,
                              env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})

        def wait_for(pred, what, timeout=240):
            deadline = time.time() + timeout
            while not pred():
                assert time.time() < deadline and p0.poll() is None, f"{what}:\n{tail(c[0], 'e0')}"
                time.sleep(0.05)

        p0 = launch(c[0], "e0")
        p1 = launch(c[1], "e1")
        wait_for(lambda: latest_step(ck) >= 2, "no first checkpoint at world 4")
        c[1].kill()
        assert p1.poll() is not None
        c1 = latest_step(ck)
        wait_for(lambda: "now 2;" in (c[0].dir / "e0.out").read_text() and latest_step(ck) > c1,
                 "node 0 did not continue alone")
        p1b = launch(c[1], "e1b")
        try:
            rc = p0.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the elastic run did not finish:\n{tail(c[0], 'e0')}")
        out0 = (c[0].dir / "e0.out").read_text()
        assert rc == 0, out0[-4000:]
        assert p1b.wait(timeout=60) == 0, tail(c[1], "e1b")
    resumes = [line for line in out0.splitlines() if line.startswith("resumed from")]
    assert any("saved at world size 4, now 2; data continues from the loader's elastic resume" in x
               for x in resumes), resumes
    assert any("saved at world size 2, now 4; data continues from the loader's elastic resume" in x
               for x in resumes), resumes
    gens, recs = counted(tmp_path / "s", 4)
    worlds = [w for _f, w in gens]
    assert worlds[0] == 4 and 2 in worlds and worlds[-1] == 4, gens
    per_epoch = {}
    for x in recs:
        per_epoch.setdefault(x["epoch"], []).extend(x["index"])
    last = max(per_epoch)
    for e, idx in per_epoch.items():
        if e < last:
            assert sorted(idx) == list(range(N)), f"epoch {e}: {len(idx)} deliveries of {len(set(idx))}"
        else:
            assert len(idx) == len(set(idx)), f"epoch {e}: a sample trained on twice"
    ls = losses(log)
    assert sorted(ls) == list(range(1, steps + 1)) and all(v == v for v in ls.values())
    print(f"\nelastic membership: generations (first step, world) {gens}, epochs {sorted(per_epoch)}")
