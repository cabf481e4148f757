"""vlafeed.rl.evaluate and `vlafeed eval`: seeded episodes with scripted policies on gymnasium's
CartPole and MuJoCo InvertedPendulum (pixels + state), Ray workers against in-process, the
report's schema, the MP4, absent simulators and bad checkpoints. A LeRobot ACT policy folder
runs through `vlafeed eval` in LeRobot 0.6's venv (skips with the reason where that is absent)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
gym = pytest.importorskip("gymnasium")

from vlafeed import rl  # noqa: E402
from vlafeed.rl import RLError, evaluate  # noqa: E402
from vlafeed.rl import sims  # noqa: E402
from vlafeed.rl.evaluation import format_table, load_policy  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
HAVE_MUJOCO = importlib.util.find_spec("mujoco") is not None
needs_mujoco = pytest.mark.skipif(not HAVE_MUJOCO, reason="needs mujoco (scripts/install-deps.sh installs it)")


class NoisyCartPole:
    """Pushes towards the pole's lean; with deterministic=False a torch-random push 20% of the time."""

    def act(self, obs, deterministic=True):
        x, xd, th, thd = obs[0].tolist()
        a = int(th + 0.5 * thd > 0)
        if not deterministic and torch.rand(()) < 0.2:
            a = int(torch.randint(0, 2, ()))
        return torch.tensor([a])


class PD:
    """A PD controller on InvertedPendulum's state (the scripted expert); noise when stochastic."""

    def __init__(self, gain=1.0):
        self.gain = gain

    def act(self, obs, deterministic=True):
        s = obs["state"] if isinstance(obs, dict) else obs
        x, th, xd, thd = s[0].tolist()
        a = self.gain * (x + 10 * th + xd + thd)
        if not deterministic:
            a += float(torch.randn(())) * 0.5
        return torch.tensor([[float(np.clip(a, -3, 3))]])


def episodes_of(rep):
    return [{k: v for k, v in e.items() if k != "video"} for e in rep["per_episode"]]


def test_seeded_episodes_are_a_function_of_the_seed():
    a = evaluate(NoisyCartPole(), "CartPole-v1", episodes=4, seed=7, deterministic=False, max_steps=200)
    b = evaluate(NoisyCartPole(), "CartPole-v1", episodes=4, seed=7, deterministic=False, max_steps=200)
    c = evaluate(NoisyCartPole(), "CartPole-v1", episodes=4, seed=8, deterministic=False, max_steps=200)
    assert episodes_of(a) == episodes_of(b)
    assert [e["seed"] for e in a["per_episode"]] == [7, 8, 9, 10]
    # seed 8's episode 0 is seed 7's episode 1: same env seed, same torch seed, same record
    assert episodes_of(c)[0] == {**episodes_of(a)[1], "episode_ix": 0}
    assert episodes_of(c) != episodes_of(a)


def test_success_rule_and_aggregates():
    good = evaluate(NoisyCartPole(), "CartPole-v1", episodes=3, seed=0, max_steps=60)
    assert [e["success"] for e in good["per_episode"]] == [True] * 3   # survives to the step limit
    assert all(e["truncated"] and not e["terminated"] and e["length"] == 60 for e in good["per_episode"])
    assert good["aggregated"]["pc_success"] == 100.0 and good["aggregated"]["avg_sum_reward"] == 60.0

    class Push:  # always pushes left: the pole falls within a few dozen steps
        def act(self, obs, deterministic=True):
            return torch.zeros(1, dtype=torch.long)

    bad = evaluate(Push(), "CartPole-v1", episodes=3, seed=0, max_steps=60)
    assert all(e["terminated"] and e["success"] is False and e["length"] < 60 for e in bad["per_episode"])
    assert bad["aggregated"]["pc_success"] == 0.0
    assert bad["success_rule"]["CartPole-v1"].startswith("episode reached the step limit")


def test_env_without_success_rule_reports_null():
    class Zero:
        def act(self, obs, deterministic=True):
            return torch.zeros(1, 1)

    rep = evaluate(Zero(), "Pendulum-v1", episodes=2, seed=0, max_steps=5)
    assert [e["success"] for e in rep["per_episode"]] == [None, None]
    assert rep["aggregated"]["pc_success"] is None and rep["aggregated"]["avg_length"] == 5.0
    assert "null" in rep["success_rule"]["Pendulum-v1"]


def test_report_schema_json_round_trip_and_table(tmp_path):
    rep = evaluate(NoisyCartPole(), ["CartPole-v1", "CartPole-v0"], episodes=2, seed=0, max_steps=30)
    back = json.loads(json.dumps(rep))
    assert back == rep
    assert set(rep) >= {"env", "policy", "episodes", "seed", "num_workers", "per_episode", "per_task", "aggregated",
                        "success_rule", "video_paths"}
    assert rep["env"] == ["CartPole-v1", "CartPole-v0"] and rep["policy"] == "NoisyCartPole"
    assert len(rep["per_episode"]) == 4 and [e["task"] for e in rep["per_episode"]] == ["CartPole-v1"] * 2 + [
        "CartPole-v0"] * 2
    for e in rep["per_episode"]:
        assert set(e) == {"episode_ix", "task", "seed", "sum_reward", "max_reward", "length", "success", "terminated",
                          "truncated", "video"}
    assert set(rep["per_task"]) == {"CartPole-v1", "CartPole-v0"}
    for agg in list(rep["per_task"].values()) + [rep["aggregated"]]:
        assert set(agg) == {"n_episodes", "pc_success", "avg_sum_reward", "avg_max_reward", "avg_length", "eval_s",
                            "eval_ep_s"}
    assert rep["aggregated"]["n_episodes"] == 4
    table = format_table(rep)
    assert "overall" in table and "CartPole-v0" in table and "success %" in table


@needs_mujoco
def test_pixels_and_state_env_with_video(tmp_path):
    from vlafeed import _native
    rep = evaluate(PD(), "pendulum-pixels", episodes=2, seed=3, max_steps=40, video_dir=tmp_path / "v",
                   video_episodes=1)
    assert rep["aggregated"]["pc_success"] == 100.0            # the expert holds the pole for 40 steps
    assert [e["length"] for e in rep["per_episode"]] == [40, 40]
    assert len(rep["video_paths"]) == 1 and rep["per_episode"][1]["video"] is None
    mp4 = rep["video_paths"][0]
    info = _native.video_info(mp4)
    assert info["frames"] == 41 and (info["width"], info["height"]) == (64, 64)   # reset frame + 40 steps
    h, w, frame = _native.video_frame(mp4, 20)
    assert (h, w) == (64, 64) and np.frombuffer(frame, np.uint8).std() > 5       # a picture, not a blank
    r = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-show_entries", "stream=nb_read_frames,codec_name",
                        "-of", "json", mp4], capture_output=True, text=True)
    if r.returncode == 0:
        s = json.loads(r.stdout)["streams"][0]
        assert s["codec_name"] == "h264" and int(s["nb_read_frames"]) == 41
    # a weak controller drops the pole: the survive rule says failure
    weak = evaluate(PD(gain=-1.0), "pendulum-pixels", episodes=2, seed=3, max_steps=40)
    assert weak["aggregated"]["pc_success"] == 0.0


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    # the workers import vlafeed from the source tree and this module (the scripted policies) by name
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(HERE), os.environ.get("PYTHONPATH", "")])
    if ray.is_initialized():
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_workers_give_the_in_process_results(ray_session):
    kw = dict(episodes=5, seed=11, deterministic=False, max_steps=120)
    local = evaluate(NoisyCartPole(), "CartPole-v1", num_workers=0, **kw)
    two = evaluate(NoisyCartPole(), "CartPole-v1", num_workers=2, **kw)
    assert episodes_of(two) == episodes_of(local)
    assert two["num_workers"] == 2 and two["aggregated"]["pc_success"] == local["aggregated"]["pc_success"]


def test_ray_worker_error_is_an_rl_error(ray_session):
    class Broken:
        def act(self, obs, deterministic=True):
            raise ValueError("policy exploded")

    with pytest.raises(RLError, match="policy exploded"):
        evaluate(Broken(), "CartPole-v1", episodes=2, num_workers=2)


def test_absent_simulator_names_the_pip_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "gym_pusht", None)   # import gym_pusht -> ImportError
    with pytest.raises(sims.SimulatorMissing, match=r"gym-pusht==0\.1\.8"):
        evaluate(PD(), "pusht", episodes=1)
    with pytest.raises(RLError, match="gym-nosuchsim"):
        sims.make_sim("gym_nosuchsim/Foo-v0")
    with pytest.raises(RLError, match="NoSuchEnv-v0.*known simulators: pusht"):
        sims.make_sim("NoSuchEnv-v0")


def test_bad_checkpoints(tmp_path):
    with pytest.raises(RLError, match="no such file"):
        load_policy(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RLError, match="not a folder"):
        load_policy(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RLError, match="neither vlafeed_rl.json nor config.json"):
        load_policy(tmp_path / "empty")
    bad = tmp_path / "badjson"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(RLError, match=r"badjson: cannot read config.json"):
        load_policy(bad)
    notype = tmp_path / "notype"
    notype.mkdir()
    (notype / "config.json").write_text('{"hidden": 3}')
    with pytest.raises(RLError, match='has no "type"'):
        load_policy(notype)
    with pytest.raises(RLError, match="no such file"):   # the path is checked before Ray starts
        evaluate(str(tmp_path / "missing"), "CartPole-v1", num_workers=2)
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        evaluate(NoisyCartPole(), "CartPole-v1", episodes=0)


def test_lerobot_folder_without_lerobot_names_the_venv(tmp_path):
    try:
        import lerobot  # noqa: F401
        pytest.skip("LeRobot is importable in this interpreter")
    except ImportError:
        pass
    d = tmp_path / "pretrained_model"
    d.mkdir()
    (d / "config.json").write_text('{"type": "act"}')
    with pytest.raises(RLError, match="LeRobot is not importable.*venv312"):
        load_policy(tmp_path)     # the parent of pretrained_model/ is accepted too


def _cli():
    exe = os.environ.get("VF_CLI") or str(ROOT / "build" / "vlafeed")
    if not os.path.exists(exe):
        pytest.skip(f"no vlafeed CLI at {exe} (make build)")
    return exe


def test_cli_errors(tmp_path):
    cli = _cli()
    r = subprocess.run([cli, "eval", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--episodes" in r.stdout and "--video-dir" in r.stdout
    r = subprocess.run([cli, "eval", str(tmp_path / "nope"), "--env", "CartPole-v1"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "nope: no such file" in r.stderr
    r = subprocess.run([cli, "eval", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--env are required" in r.stderr
    (tmp_path / "config.json").write_text('{"type": "act"}')
    r = subprocess.run([cli, "eval", str(tmp_path), "--env", "gym_nosuchsim/Foo-v0"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "gym-nosuchsim" in r.stderr, r.stderr


def test_vlafeed_rl_checkpoint(tmp_path):
    try:
        from vlafeed.rl import checkpoint
        from vlafeed.rl.learner import Learner
        from vlafeed.rl.policies import load_policy as _  # noqa: F401
    except ImportError as e:
        pytest.skip(f"needs vlafeed.rl.policies and vlafeed.rl.checkpoint (rl-policy's checkpoints): {e}")
    env = gym.make("CartPole-v1")
    learner = Learner(rl.RLConfig(env="CartPole-v1"), env.observation_space, env.action_space)
    folder = checkpoint.save(learner, tmp_path / "ckpt")
    for path in (folder, tmp_path / "ckpt"):          # one step folder, or the checkpoint_dir (its latest)
        rep = evaluate(str(path), "CartPole-v1", episodes=2, seed=0, max_steps=50)
        assert rep["aggregated"]["n_episodes"] == 2 and rep["policy"] == str(path)
        assert all(1 <= e["length"] <= 50 for e in rep["per_episode"])
    # the command line, on 2 Ray workers, gives the in-process episodes
    local = evaluate(str(folder), "CartPole-v1", episodes=4, seed=5, max_steps=80)
    out = tmp_path / "eval.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([_cli(), "eval", str(folder), "--env", "CartPole-v1", "--episodes", "4", "--seed", "5",
                        "--max-steps", "80", "--workers", "2", "--num-cpus", "2", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CartPole-v1" in r.stdout and "success %" in r.stdout
    assert episodes_of(json.loads(out.read_text())) == episodes_of(local)


# ---------------------------------------------------------------- a LeRobot ACT folder, in LeRobot's venv

MAKE_ACT = r'''
import sys, torch
from lerobot.configs.types import FeatureType, PolicyFeature, NormalizationMode
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
torch.manual_seed(0)
cfg = ACTConfig(input_features={"observation.image": PolicyFeature(FeatureType.VISUAL, (3, 64, 64)),
                                "observation.state": PolicyFeature(FeatureType.STATE, (4,))},
                output_features={"action": PolicyFeature(FeatureType.ACTION, (1,))},
                chunk_size=4, n_action_steps=4, dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=1,
                n_decoder_layers=1, use_vae=False, pretrained_backbone_weights=None, device="cpu")
stats = {"observation.image": {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)},
         "observation.state": {"mean": torch.zeros(4), "std": torch.ones(4)},
         "action": {"mean": torch.zeros(1), "std": torch.ones(1)}}
policy = ACTPolicy(cfg)
pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
out = sys.argv[1]
policy.save_pretrained(out); pre.save_pretrained(out); post.save_pretrained(out)
'''


def test_lerobot_act_folder_through_vlafeed_eval(tmp_path):
    import lerobot_venv
    py, why = lerobot_venv.lerobot06_python(tmp_path)
    if py is None:
        pytest.skip(why)
    probe = subprocess.run([py, "-c", "import vlafeed._native._core, mujoco, vlafeed.rl"], capture_output=True,
                           text=True, env={**lerobot_venv.env(tmp_path), "PYTHONPATH": str(ROOT / "python")})
    if probe.returncode != 0:
        pytest.skip("LeRobot's venv lacks vlafeed's 3.12 extension (make py312-inplace) or mujoco "
                    f"(tests/python/install_lerobot06.sh): {probe.stderr.strip()[-300:]}")
    model = tmp_path / "act" / "pretrained_model"
    r = subprocess.run([py, "-c", MAKE_ACT, str(model)], capture_output=True, text=True, env=lerobot_venv.env(tmp_path),
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    cli = _cli()
    out = tmp_path / "eval.json"
    env = {**lerobot_venv.env(tmp_path), "VF_PYTHON": py}
    r = subprocess.run([cli, "eval", str(model.parent), "--env", "pendulum-pixels", "--episodes", "2", "--max-steps",
                        "12", "--json", str(out), "--video-dir", str(tmp_path / "vid")], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["policy"] == str(model.parent) and rep["aggregated"]["n_episodes"] == 2
    assert all(1 <= e["length"] <= 12 for e in rep["per_episode"])
    assert "pendulum-pixels" in r.stdout and len(rep["video_paths"]) == 1 and Path(rep["video_paths"][0]).stat().st_size
    # the same folder in this interpreter (no LeRobot): the message names the venv
    if importlib.util.find_spec("lerobot") is None:
        r = subprocess.run([cli, "eval", str(model.parent), "--env", "pendulum-pixels"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 1 and "venv312" in r.stderr
