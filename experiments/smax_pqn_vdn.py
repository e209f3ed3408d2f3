"""PQN-VDN on SMAX: parallel Q-learning (no replay buffer, no target network, layer-normalised Q-network,
Q(lambda) targets over each rollout) on the team's value, the sum of the agents'. The scenario is the argument.

    python -m jaxrl.train --config=experiments/smax_pqn_vdn.py:3m

JaxMARL's PQN-VDN SMAX settings where they carry over (lambda 0.85, learning rate 2.5e-4 decaying linearly,
gradient norm clipped to 1, 4 epochs x 16 minibatches, epsilon 1 -> 0.01 over the first 10%, rewards x 10)
with feed-forward agents (two layer-normalised layers of 128, told their ids; JaxMARL's SMAX agents are
recurrent, 512 wide) and 64 envs x 64 steps per update.
"""

from ml_collections import ConfigDict

from experiments.smax_qmix import BUDGETS, DEFAULT_STEPS
from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    scenario = arg or "3m"
    config = algos.default_config("pqn_vdn")
    config.experiment = f"smax_pqn_vdn_{scenario}"
    config.env.kwargs = ConfigDict({"scenario": scenario})
    config.total_steps = BUDGETS.get(scenario, DEFAULT_STEPS)
    config.num_envs, config.num_steps = 64, 64
    config.network.update({"hidden_sizes": (128, 128), "layer_norm": True})
    config.returns.update({"q_lambda": 0.85, "reward_scale": 10.0})
    config.explore.update({"epsilon_end": 0.01, "fraction": 0.1})
    config.optim.update({"learning_rate": 2.5e-4, "schedule": "linear", "max_grad_norm": 1.0, "num_epochs": 4,
                         "num_minibatches": 16})
    config.log.every_steps = 65_536
    config.eval.every_steps = 262_144
    config.eval.episodes = 64
    config.checkpoint.every_steps = 1_048_576
    return config_lib.finalize(config)
