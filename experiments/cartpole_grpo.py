"""Critic-free GRPO on CartPole-v1: groups of 8 episodes from one start state, 500 steps each.

    python -m jaxrl.train --config=experiments/cartpole_grpo.py
    python -m jaxrl.train --config=experiments/cartpole_grpo.py --config.advantage.estimator=median --config.loss.clip_high=0.28

`env_steps` counts groups x size x 500 steps per update, including the masked steps after an episode ended
(computed until every episode on the device has ended); `acting_fraction` in metrics.jsonl says how many trained.
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    config = algos.default_config("grpo")
    config.experiment = "cartpole_grpo"
    config.env.name = "CartPole-v1"
    config.total_steps = 1_536_000  # solved (return 500) by about 0.7M
    config.num_envs = 64  # 8 groups of 8
    config.num_steps = 500  # the episode cap

    config.group.size = 8
    config.group.returns = "to_go"
    config.advantage.estimator = "grpo"
    config.returns.gamma = 1.0
    config.optim.num_epochs = 4
    config.optim.num_minibatches = 4
    config.optim.learning_rate = 1e-3
    config.optim.schedule = "linear"
    config.optim.max_grad_norm = 0.5
    config.loss.clip_low = 0.2
    config.loss.clip_high = 0.2
    config.loss.aggregate = "token"

    config.network.hidden_sizes = (64, 64)
    config.network.activation = "tanh"

    config.log.every_steps = 128_000
    config.eval.every_steps = 512_000
    config.eval.episodes = 32
    config.checkpoint.every_steps = 1_024_000
    return config_lib.finalize(config, arg)
