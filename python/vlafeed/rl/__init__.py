"""vlafeed.rl: asynchronous RL training on Ray actors: rollout workers, a batching policy server, a streaming learner.

    from vlafeed.rl import RLConfig, train
    report = train(RLConfig(env="toy-reach", num_workers=2, steps=30,
                            train_async=True, rollout_async=True, streamer=True))

The pieces (RL-VLA3's three levels of asynchrony, each behind a switch so the
ablation can be run):

- RolloutWorker (Ray actor, `max_restarts`): steps `envs_per_worker`
  Gymnasium-API environments. Actions come from the PolicyServer. Each step
  records the policy version that chose it. With `rollout_async` each env
  runs on its own: the worker waits for whichever env's action comes back
  first (ray.wait), and a finished trajectory goes into the bounded queue at
  once. Without it, the worker's envs step in lockstep (one action request
  for all of them per step), and the round's trajectories are delivered
  together when the round ends.
- PolicyServer (async Ray actor): dynamic batching. Requests wait until
  `max_batch_size` are queued or `max_wait_ms` has passed since the first
  one. Under load the batches are large; when idle a lone request waits at
  most max_wait_ms. It holds the latest weights that the learner publishes.
- Learner (in the calling process): takes trajectories from the queue.
  With `streamer` it runs forward/backward on each micro-batch
  (`micro_batch` trajectories) as soon as it is complete; without it, only
  once the whole global batch is in. Gradients accumulate; after
  `global_batch` trajectories the optimizer steps, the version goes up, and
  the weights go to the server.
- `train_async`: the workers keep generating while the learner trains
  (bounded by the queue and by `max_lag`). Without it, rollouts run in
  rounds: the workers make one global batch with the current weights and
  stop, then the learner trains.
- `colocated` (sync baseline): no Ray. One process steps all envs in lockstep
  with a local copy of the policy, then trains.

Policy-version lag = learner version at training time minus the oldest
version that acted in the trajectory. It is recorded per trajectory.
Trajectories with lag > `max_lag` are dropped and counted. The default loss
(`algorithm`: reinforce | ppo | grpo, see vlafeed.rl.algos) is
REINFORCE with a running-mean baseline and a PPO-style clipped importance
ratio against the behaviour log-probabilities, so slightly stale samples are
corrected.

Faults: an environment that raises in reset/step loses the trajectory in
progress (counted in `env_errors`, the first message kept); past
`max_env_errors` in total, the run stops with an error naming the env and
the exception. A worker that dies is restarted by Ray (`max_restarts`);
its episode in flight is lost and counted in `worker_restarts`. Its run is
resubmitted. A worker dead for good, a dead server, or no trajectory for
`stall_timeout_s` ends the run with RLError. Every exit path (Ctrl-C
included) stops the workers, kills the actors and reports what was dropped.

Modules: ``config`` (RLConfig, RLError), ``envs`` (ToyReachEnv, make_env,
the vlafeed/InvertedPendulumPixels-v0 env), ``policies`` (the policy protocol,
make_policy, load_policy, the nn.Module and LeRobot adapters), ``spaces``
(supported spaces, stack), ``algos`` (reinforce/ppo/grpo advantages),
``checkpoint`` (learner checkpoints, resume), ``policy`` (the old PolicyNet,
act_batch), ``learner`` (Learner: the loss and the optimizer step), ``server`` (PolicyServer), ``workers`` (RolloutWorker),
``run`` (train, train_colocated, the report and the command line), ``placement`` (colocated /
disaggregated / hybrid, per-role Ray resources, the learner actor, CPU seconds), ``accounting``
(the Ledger of trajectory ids and each id's fate), ``evaluation`` and ``sims`` (vlafeed eval, simulators).
"""
from vlafeed.rl.config import RLConfig, RLError
from vlafeed.rl.envs import ToyReachEnv, env_dims, env_spaces, make_env
from vlafeed.rl.learner import Learner
from vlafeed.rl.policies import ActOut, load_policy, make_policy
from vlafeed.rl.policy import PolicyNet, act_batch
from vlafeed.rl.run import main, mode_name, train, train_colocated
# evaluation and simulators (rl-eval): vlafeed.rl.evaluate, vlafeed eval
from vlafeed.rl.evaluation import evaluate, load_policy as load_eval_policy

__all__ = ["RLConfig", "RLError", "ToyReachEnv", "make_env", "env_dims", "env_spaces", "ActOut", "make_policy",
           "load_policy", "PolicyNet", "act_batch", "Learner",
           "train", "train_colocated", "mode_name", "main", "evaluate", "load_eval_policy"]
