"""vlafeed.rl exact accounting, placement and fault errors: SIGKILLed rollout workers (once, twice),
a killed policy server and learner actor, stale weight publishes, placement config and resources.

One Ray session (2 CPUs) for the module; each run is a few seconds on the toy env."""
import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("gymnasium")
ray = pytest.importorskip("ray")
pytest.importorskip("psutil")

from vlafeed import rl  # noqa: E402
from vlafeed.rl import RLConfig, RLError  # noqa: E402
from vlafeed.rl import accounting, placement  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(env_kwargs={"size": 5, "max_steps": 16}, num_workers=2, envs_per_worker=2, global_batch=8,
            micro_batch=4, lr=3e-3, stall_timeout_s=60)


@pytest.fixture(scope="module")
def ray_session():
    os.environ["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def check_exact(rep, envs_per_worker=2):
    """produced = trained + stale + env errors + lost to faults + in flight at end + left in queue, by id."""
    a = rep["accounting"]
    ids = a["ids"]
    fates = [t for f in accounting.FATES for t in ids[f]]
    assert len(fates) == len(set(fates)), "an id has two fates"
    assert a["produced"] == sum(a[f] for f in accounting.FATES) == len(fates)
    assert a["trained"] == len(rep["trained_ids"]) == len(set(rep["trained_ids"])), "trained twice"
    assert set(ids["trained"]) == set(rep["trained_ids"])
    # ids are w{worker}.e{counter} with contiguous counters per worker: none skipped, none twice
    per = {}
    for t in fates:
        w, c = t.split(".e")
        per.setdefault(w, []).append(int(c))
    for w, cs in per.items():
        assert sorted(cs) == list(range(len(cs))), (w, sorted(cs)[:20])
    # at most one episode per env in flight when the run stops; at most a worker's envs' worth lost per death
    assert a["in_flight_at_end"] <= rep["config"]["num_workers"] * envs_per_worker
    deaths = sum(n - 1 for n in a["incarnations"])
    assert a["lost_to_faults"] <= deaths * envs_per_worker
    latest = {w: n - 1 for w, n in enumerate(a["incarnations"])}
    for t in ids["lost_to_faults"]:  # only a dead incarnation loses episodes
        w = int(t[1:].split(".")[0])
        inc = a["restarted_ids"].get(t, [w, 0])[1]
        assert inc < latest[w], (t, inc, latest)
    return a


def sigkill_and_wait(worker, old_pid):
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            pid = ray.get(worker.pid.remote(), timeout=30)
            if pid != old_pid:
                return pid
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            pass
        time.sleep(0.1)
    raise AssertionError("the killed worker did not come back")


@pytest.mark.parametrize("kills,async_", [(1, True), (2, True), (1, False)])
def test_sigkilled_worker_exact_accounting(ray_session, kills, async_):
    at = {2: 1, 6: 2}
    killed = []

    def kill(info):
        n = at.get(info["version"])
        if n and n <= kills:
            w = info["workers"][0]
            killed.append(sigkill_and_wait(w, ray.get(w.pid.remote())))

    sw = {} if async_ else dict(train_async=False, rollout_async=False, streamer=False)
    rep = rl.train(RLConfig(steps=12, max_restarts=2, queue_size=8, **sw, **FAST), on_step=kill)
    assert len(killed) == kills
    assert rep["optimizer_steps"] == 12 and rep["trained_trajectories"] == 96
    a = check_exact(rep)
    assert a["incarnations"] == [1 + kills, 1]
    # the restarted worker resumed the counter: its newest incarnation issued ids after the old ones
    newest = sorted(int(t.split(".e")[1]) for t, (w, inc) in a["restarted_ids"].items() if w == 0 and inc == kills)
    older = [int(t.split(".e")[1]) for f in accounting.FATES for t in a["ids"][f]
             if t.startswith("w0.") and a["restarted_ids"].get(t, [0, 0])[1] < kills]
    assert newest and min(newest) > max(older)
    if not async_:
        assert a["dropped_stale"] == 0 and rep["lag_max"] == 0


def test_accounting_without_faults_and_colocated(ray_session):
    rep = rl.train(RLConfig(steps=3, **FAST))
    a = check_exact(rep)
    assert a["lost_to_faults"] == 0 and a["incarnations"] == [1, 1]
    rep = rl.train(RLConfig(placement="colocated", steps=2, **FAST))
    a = rep["accounting"]
    assert a["produced"] == a["trained"] == 16 and a["lost_to_faults"] == 0
    assert rep["cpu_seconds"]["driver"] > 0


def test_fates_catch_double_training_and_unknown_ids():
    snap = {"issued": {"w0.e0": (0, 0, 0), "w0.e1": (0, 0, 1)}, "env_dropped": [], "incarnations": [1], "next": [2]}
    a = accounting.fates(snap, ["w0.e0"], [], ["w0.e1"])
    assert a["produced"] == 2 and a["trained"] == 1 and a["left_in_queue_at_end"] == 1
    with pytest.raises(RLError, match="w0.e0 is both trained and dropped_stale"):
        accounting.fates(snap, ["w0.e0"], ["w0.e0"], [])
    with pytest.raises(RLError, match="w9.e0 .*never produced"):
        accounting.fates(snap, ["w9.e0"], [], [])
    once = accounting.TrainedOnce()
    once.check(["a", "b"])
    with pytest.raises(RLError, match="trajectory a reached the learner twice"):
        once.check(["a"])
    gap = dict(snap, issued={"w0.e0": (0, 0, 0), "w0.e2": (0, 0, 2)}, next=[3])
    with pytest.raises(RLError, match="counters not contiguous"):
        accounting.fates(gap, [], [], [])


def test_killed_policy_server_is_rlerror_naming_it(ray_session):
    pids = []

    def kill(info):
        if info["version"] == 2:
            pids.extend(info["worker_pids"])
            os.kill(info["server_pid"], signal.SIGKILL)

    with pytest.raises(RLError, match=r"policy server actor \(PolicyServer, pid \d+\) died"):
        rl.train(RLConfig(steps=20, **FAST), on_step=kill)
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "workers outlived the dead server's run"


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_killed_learner_actor_is_rlerror_naming_it(ray_session):
    def kill(info):
        if info["version"] == 2:
            os.kill(info["learner_pid"], signal.SIGKILL)

    with pytest.raises(RLError, match=r"learner actor \(LearnerActor, pid \d+\) died"):
        rl.train(RLConfig(placement="hybrid", steps=20, **FAST), on_step=kill)


def test_hybrid_on_cpu_learner_actor_publishes_with_versions(ray_session):
    seen = {}

    def look(info):
        if info["version"] == 1:
            seen["server"] = ray.get(info["server"].placement.remote())
            seen["learner"] = ray.get(info["learner"].placement.remote())

    rep = rl.train(RLConfig(placement="hybrid", steps=4, torch_threads=1, **FAST), on_step=look)
    assert rep["placement"] == "hybrid" and rep["placement_options"]["learner_actor"]
    assert seen["server"]["torch_threads"] == 1 and seen["learner"]["torch_threads"] == 1
    assert seen["server"]["pid"] != seen["learner"]["pid"]
    assert rep["server"]["version"] == 4 and rep["server"]["publishes"] == 4
    assert rep["server"]["ignored_stale_publishes"] == 0
    check_exact(rep)
    assert set(rep["cpu_seconds"]) == {"workers", "server", "learner", "driver"}
    assert rep["cpu_seconds"]["learner"] > 0


def test_stale_publish_is_ignored(ray_session):
    from vlafeed.rl.learner import Learner, _spaces
    from vlafeed.rl.server import policy_server_class
    cfg = RLConfig(**FAST)
    obs_space, act_space = _spaces(2, 5)
    weights = Learner(cfg, obs_space, act_space).state()
    server = policy_server_class().options(num_cpus=0).remote(cfg, obs_space, act_space, weights)
    try:
        assert ray.get(server.set_weights.remote(weights, 3)) is True
        assert ray.get(server.set_weights.remote(weights, 2)) is False  # older stamp: ignored
        assert ray.get(server.set_weights.remote(weights, 3)) is False  # same stamp: ignored
        _a, _lp, version = ray.get(server.act.remote(np.zeros((1, 2), np.float32)))
        assert version == 3
        s = ray.get(server.stats.remote())
        assert s["publishes"] == 1 and s["ignored_stale_publishes"] == 2
    finally:
        ray.kill(server)


def test_placement_config_and_resources_checked():
    with pytest.raises(ValueError, match="placement must be one of colocated, disaggregated, hybrid"):
        RLConfig(placement="split").check()
    with pytest.raises(ValueError, match="learner_resources: unknown key 'gpus'"):
        RLConfig(learner_resources={"gpus": 1}).check()
    with pytest.raises(ValueError, match=r"worker_resources\['num_cpus'\] must be a number >= 0"):
        RLConfig(worker_resources={"num_cpus": -1}).check()
    with pytest.raises(ValueError, match="torch_threads must be >= 1"):
        RLConfig(torch_threads=0).check()
    with pytest.raises(ValueError, match="colocated=True contradicts placement 'hybrid'"):
        RLConfig(colocated=True, placement="hybrid").check()
    c = RLConfig(colocated=True)
    c.check()
    assert c.placement == "colocated"
    h = RLConfig(placement="hybrid")
    h.check()
    assert placement.role_options(h, "server", 1) == {"num_cpus": 0, "num_gpus": 0.5}
    assert placement.role_options(h, "learner", 1) == {"num_cpus": 0, "num_gpus": 0.5}
    assert placement.role_options(h, "worker", 1) == {"num_cpus": 0, "num_gpus": 0}
    assert placement.role_options(h, "server", 0)["num_gpus"] == 0
    d = RLConfig(learner_resources={"num_cpus": 1})
    d.check()
    assert placement.learner_is_actor(d) and not placement.learner_is_actor(RLConfig())
    with pytest.raises(RLError, match="asks for 1 GPUs .* the Ray cluster has 0"):
        placement.check_resources(RLConfig(learner_resources={"num_gpus": 1}), {"CPU": 2})
    with pytest.raises(RLError, match="asks for 4 CPUs"):
        placement.check_resources(RLConfig(worker_resources={"num_cpus": 2}), {"CPU": 2})


def test_hybrid_server_and_learner_share_one_gpu(ray_session):
    """GPU path: with a GPU, hybrid gives the server and the learner 0.5 GPU each, on the same device."""
    if ray.cluster_resources().get("GPU", 0) < 1:
        print("skip: the Ray cluster has no GPU (hybrid GPU sharing needs one)")
        pytest.skip("the Ray cluster has no GPU (hybrid GPU sharing needs one)")
    seen = {}

    def look(info):
        if info["version"] == 1:
            seen["server"] = ray.get(info["server"].placement.remote())
            seen["learner"] = ray.get(info["learner"].placement.remote())

    rep = rl.train(RLConfig(placement="hybrid", steps=3, **FAST), on_step=look)
    assert rep["placement_options"]["server"]["num_gpus"] == 0.5
    assert rep["placement_options"]["learner"]["num_gpus"] == 0.5
    assert seen["server"]["gpu_ids"] and seen["server"]["gpu_ids"] == seen["learner"]["gpu_ids"]
    assert seen["server"]["device"].startswith("cuda") and seen["learner"]["torch_cuda"]
    check_exact(rep)


def test_cli_placement_and_accounting_line(cli):
    import json
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([cli, "rl", "--placement", "nowhere"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "--placement" in r.stderr
    r = subprocess.run([cli, "rl", "--placement", "colocated", "--steps", "1", "--global-batch", "4"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "produced 4 = trained 4 + stale 0 + env errors 0 + lost to faults 0" in r.stdout
    r = subprocess.run([cli, "rl", "--placement", "colocated", "--steps", "1", "--global-batch", "4", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    rep = json.loads(r.stdout)
    assert rep["placement"] == "colocated" and rep["accounting"]["trained"] == 4
