"""Runs in LeRobot 0.6's venv (test_rl_policies.py::test_lerobot_policy_adapter): a LeRobot policy
type ("lerobot:act", fresh, no pretrained backbone) as a vlafeed.rl policy on Dict(pixels,
agent_pos) observations with Box actions: act/evaluate agree, gradients reach LeRobot's
weights and the log-std, a colocated PPO step trains it and writes a checkpoint that
load_policy reads back, and the saved pretrained_model/ folder loads as "lerobot:DIR". Prints one JSON line; exit status 3 when the policy type cannot be
built here (its extras are missing), with the reason."""
import json
import sys

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces as gs

from vlafeed import rl
from vlafeed.rl import RLConfig, RLError, policies
from vlafeed.rl import spaces as S

typ, out_dir = sys.argv[1], sys.argv[2]
torch.set_num_threads(2)
OBS = gs.Dict({"pixels": gs.Box(0, 255, (32, 32, 3), np.uint8), "agent_pos": gs.Box(-1, 1, (2,), np.float32)})
ACT = gs.Box(-1, 1, (2,), np.float32)


class DictEnv(gym.Env):
    def __init__(self):
        self.observation_space, self.action_space = OBS, ACT

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        OBS.seed(int(self.np_random.integers(1 << 30)))
        self.t = 0
        return OBS.sample(), {}

    def step(self, action):
        assert ACT.contains(np.asarray(action, np.float32)), action
        self.t += 1
        return OBS.sample(), float(action[0] > 0), False, self.t >= 3, {}


torch.manual_seed(0)
try:
    pol = policies.make_policy(OBS, ACT, "lerobot:" + typ, squash="clip")
except RLError as e:
    print(json.dumps({"skip": str(e)}))
    sys.exit(3)
OBS.seed(0)
batch = S.stack([OBS.sample() for _ in range(3)], OBS)
out = pol.act(batch)
logp, ent, value = pol.evaluate(batch, out.action)
logp.sum().backward()
grads = sum(1 for p in pol.module.parameters() if p.grad is not None and p.grad.abs().sum() > 0)
res = {"module": type(pol.module).__name__, "action_shape": list(out.action.shape),
       "in_bounds": bool(all(ACT.contains(a) for a in out.action.numpy())),
       "logp_diff": float((logp.detach() - out.logp).abs().max()), "value": value,
       "module_params_with_grad": grads, "log_std_grad": bool(pol.log_std.grad is not None)}
rep = rl.train(RLConfig(colocated=True, env=lambda: DictEnv(), steps=1, global_batch=2, micro_batch=2, num_workers=1,
                        envs_per_worker=2, policy="lerobot:" + typ, action_squash="clip", algorithm="reinforce",
                        checkpoint_dir=out_dir, lr=1e-4))
res["trained"] = rep["trained_trajectories"]
loaded = policies.load_policy(out_dir)
a1 = loaded.act(batch, deterministic=True).action
res["loaded_module"] = type(loaded.module).__name__
res["loaded_deterministic"] = bool(torch.equal(a1, loaded.act(batch, deterministic=True).action))
# a pretrained_model/ folder as LeRobot writes it: "lerobot:DIR" loads it with from_pretrained
pm = out_dir + "/pretrained_model"
loaded.module.save_pretrained(pm)
from_dir = policies.make_policy(OBS, ACT, "lerobot:" + pm, squash="clip")
res["from_dir_same_mean"] = bool(torch.allclose(from_dir.act(batch, deterministic=True).action, a1, atol=1e-5))
print(json.dumps(res))
