"""PQN on CartPole-v1: 32 envs x 64 steps per update, Q(0.65) targets, a layer-normalised 128x128 ReLU Q-network,
4 epochs of 16 minibatches, no replay buffer and no target network.

    python -m jaxrl.train --config=experiments/cartpole_pqn.py

Settings of the PQN authors' CartPole config (purejaxql): learning rate 1e-4 decayed linearly, gamma 0.99,
epsilon from 1 to 0.05 over the first 20% of the run.
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    config = algos.default_config("pqn")
    config.experiment = "cartpole_pqn"
    config.env.name = "CartPole-v1"
    config.total_steps = 500_000
    config.network.hidden_sizes = (128, 128)
    config.log.every_steps = 20_480
    config.eval.every_steps = 102_400
    config.checkpoint.every_steps = 102_400
    return config_lib.finalize(config, arg)
