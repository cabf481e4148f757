"""vlafeed.rl: the asynchronous RL pipeline on Ray actors, on a toy reaching task.

One Ray session (2 CPUs) is shared by the module; each run is a few seconds."""
import os
import time
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
gym = pytest.importorskip("gymnasium")
ray = pytest.importorskip("ray")

from vlafeed import rl  # noqa: E402
from vlafeed.rl import RLConfig, RLError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(env_kwargs={"size": 5, "max_steps": 16}, num_workers=2, envs_per_worker=2, global_batch=8,
            micro_batch=4, lr=3e-3, stall_timeout_s=60)


@pytest.fixture(scope="module")
def ray_session():
    # the workers import vlafeed from the source tree
    os.environ["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if ray.is_initialized():  # another module's session: share it
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def check_accounting(rep):
    """Every trajectory pushed is trained, dropped as stale or left unused at shutdown: exactly once."""
    trained = rep["trained_ids"]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    fates = trained + rep["dropped_stale_ids"] + rep["unused_ids"]
    assert Counter(fates) == Counter(rep["pushed_ids"])
    assert not set(rep["dropped_env_ids"]) & set(fates)


def gone(pids):
    deadline = time.time() + 20
    while time.time() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_toy_env_follows_the_gymnasium_api():
    from gymnasium.utils.env_checker import check_env
    check_env(rl.ToyReachEnv(), skip_render_check=True)
    env = rl.ToyReachEnv(fail_every=1, fail_at_step=2)
    env.reset(seed=0)
    env.step(0)
    with pytest.raises(RuntimeError, match="simulated failure"):
        env.step(0)


def test_config_checked():
    with pytest.raises(ValueError, match="multiple of micro_batch"):
        RLConfig(global_batch=10, micro_batch=4).check()
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        RLConfig(num_workers=0).check()
    with pytest.raises(ValueError, match="server_device must be 'cpu' or 'cuda'"):
        RLConfig(server_device="gpu").check()


def test_server_device_cuda_without_a_gpu_fails_at_start(ray_session):
    """server_device="cuda" asks Ray for a GPU for the policy server: on a cluster without one the
    run stops at once with RLError naming it (instead of waiting for an actor that cannot be placed)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RLError, match="server_device 'cuda': the Ray cluster has no GPU"):
        rl.train(RLConfig(server_device="cuda", **FAST))


def test_cli(cli):
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([cli, "rl", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "--max-wait-ms" in r.stdout and "--no-streamer" in r.stdout
    r = subprocess.run([cli, "rl", "--global-batch", "10", "--micro-batch", "4"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "not a multiple of micro_batch" in r.stderr
    r = subprocess.run([cli, "rl", "--colocated", "--steps", "2", "--global-batch", "4", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads(r.stdout)
    assert rep["optimizer_steps"] == 2 and rep["trained_trajectories"] == 8 and rep["mode"] == "sync colocated"


def test_colocated_baseline_improves_without_ray():
    rep = rl.train(RLConfig(colocated=True, steps=25, **FAST))
    assert rep["mode"] == "sync colocated"
    assert rep["optimizer_steps"] == 25 and rep["trained_trajectories"] == 25 * 8
    assert rep["last_return"] > rep["first_return"] + 0.15, (rep["first_return"], rep["last_return"])
    assert rep["lag_max"] == 0


def test_async_pipeline_improves_and_accounts_for_every_trajectory(ray_session):
    cfg = RLConfig(steps=40, train_async=True, rollout_async=True, streamer=True, max_lag=2, queue_size=16, **FAST)
    rep = rl.train(cfg)
    assert rep["mode"] == "disaggregated + train async + rollout async + streamer"
    assert rep["optimizer_steps"] == 40 and rep["trained_trajectories"] == 40 * 8
    assert rep["last_return"] > rep["first_return"] + 0.15, (rep["first_return"], rep["last_return"])
    check_accounting(rep)
    assert rep["lag_max"] <= cfg.max_lag
    assert sum(rep["lag_histogram"].values()) == rep["trained_trajectories"]
    assert rep["server"]["version"] == 40 and rep["server"]["max_batch"] <= cfg.max_batch_size
    assert rep["env_errors"] == 0 and rep["worker_restarts"] == 0
    assert gone(rep["worker_pids"]), "rollout workers still running after train() returned"


def test_sync_disaggregated_trains_every_trajectory_on_policy(ray_session):
    rep = rl.train(RLConfig(steps=3, train_async=False, rollout_async=False, streamer=False, **FAST))
    assert rep["mode"] == "sync disaggregated"
    check_accounting(rep)
    assert rep["unused_ids"] == [] and rep["dropped_stale_ids"] == []
    assert sorted(rep["trained_ids"]) == sorted(rep["pushed_ids"])
    assert rep["lag_histogram"] == {"0": 24}
    # lockstep: one request per step for both of a worker's envs
    assert rep["server"]["max_batch"] >= 2


def test_env_that_raises_is_counted_then_fatal(ray_session):
    rep = rl.train(RLConfig(steps=3, env_kwargs={"size": 5, "max_steps": 16, "fail_every": 3}, **{
        k: v for k, v in FAST.items() if k != "env_kwargs"}))
    assert rep["env_errors"] > 0 and len(rep["dropped_env_ids"]) == rep["env_errors"]
    assert "simulated failure" in rep["first_env_error"] and "ToyReachEnv" in rep["first_env_error"]
    check_accounting(rep)
    assert rep["optimizer_steps"] == 3
    cfg = RLConfig(steps=3, max_env_errors=3, env_kwargs={"size": 5, "max_steps": 16, "fail_every": 1},
                   **{k: v for k, v in FAST.items() if k != "env_kwargs"})
    with pytest.raises(RLError, match=r"environment kept raising .*ToyReachEnv.*simulated failure"):
        rl.train(cfg)


def test_stalled_env_times_out_instead_of_hanging(ray_session):
    cfg = RLConfig(steps=2, stall_timeout_s=2, env_kwargs={"size": 5, "max_steps": 16, "step_delay_ms": 3000},
                   **{k: v for k, v in FAST.items() if k not in ("env_kwargs", "stall_timeout_s")})
    with pytest.raises(RLError, match="no trajectory arrived for 2 s"):
        rl.train(cfg)


def test_interrupt_stops_every_actor(ray_session):
    """Ctrl-C in the driver (KeyboardInterrupt) propagates, and no worker process is left behind."""
    pids = []

    def interrupt(info):
        pids.extend(info["worker_pids"])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rl.train(RLConfig(steps=5, **FAST), on_step=interrupt)
    assert len(pids) == 2 and gone(pids)


def test_killed_worker_is_restarted_and_a_dead_one_is_an_error(ray_session):
    def kill_once(info, done=[]):
        if info["version"] == 2 and not done:
            done.append(1)
            w = info["workers"][0]
            ray.kill(w, no_restart=False)
            for _ in range(600):  # wait for Ray to bring it back, so the next steps use it
                try:
                    ray.get(w.pid.remote(), timeout=30)
                    break
                except ray.exceptions.ActorUnavailableError:
                    time.sleep(0.1)

    # a short queue and 12 steps after the kill (96 trajectories), so the steps after the kill
    # need trajectories made after the restart (with 4 steps, a CI run on a loaded machine fed
    # them all from the other worker while Ray was still restarting this one)
    rep = rl.train(RLConfig(steps=14, max_restarts=1, queue_size=8, **FAST), on_step=kill_once)
    assert rep["optimizer_steps"] == 14
    assert rep["worker_restarts"] == 1
    trained = rep["trained_ids"]
    assert len(trained) == len(set(trained))
    # the run was resubmitted to the restarted actor: it finished its run, or (on a loaded
    # machine, when the other worker's backlog fed the last steps) at least pushed trajectories
    w0_after = {t for t, (w, inc) in rep["accounting"]["restarted_ids"].items() if w == 0 and inc == 1}
    runs = [{k: r[k] for k in ("worker", "incarnation")} for r in rep["worker_runs"]]
    assert ({"worker": 0, "incarnation": 1} in runs
            or any(t in w0_after for t in rep["pushed_ids"])), (runs, sorted(rep["pushed_ids"])[-5:])
    assert all(t not in w0_after or t in rep["pushed_ids"] for t in trained)

    def kill_for_good(info):
        if info["version"] == 1:
            ray.kill(info["workers"][1], no_restart=True)

    with pytest.raises(RLError, match="rollout worker 1 died and was not restarted"):
        rl.train(RLConfig(steps=20, max_restarts=1, **FAST), on_step=kill_for_good)
