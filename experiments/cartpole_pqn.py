"""PQN on CartPole-v1: 32 envs x 64 steps per update, Q(0.65) targets, a layer-normalised 128x128 ReLU Q-network,
4 epochs of 16 minibatches, no replay buffer and no target network.

    python -m jaxrl.train --config=experiments/cartpole_pqn.py

Settings of the PQN authors' CartPole config (purejaxql) but for two: the learning rate (3e-4, decayed linearly)
and lambda (0.9). With theirs (1e-4, 0.65) the greedy return at 500k over 4 seeds was 400 [104, 695] (mean, 95%
interval); with these, 500 for every seed (`python -m jaxrl.sweep --config=experiments/cartpole_pqn.py
--sweep.seeds=4 --sweep.lr=5e-5,1e-4,3e-4 --sweep.returns.q_lambda=0.65,0.9`, 2026-11-24). Gamma 0.99, epsilon
from 1 to 0.05 over the first 20% of the run.
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    config = algos.default_config("pqn")
    config.experiment = "cartpole_pqn"
    config.env.name = "CartPole-v1"
    config.total_steps = 500_000
    config.network.hidden_sizes = (128, 128)
    config.optim.learning_rate = 3e-4
    config.returns.q_lambda = 0.9
    config.log.every_steps = 20_480
    config.eval.every_steps = 102_400
    config.checkpoint.every_steps = 102_400
    return config_lib.finalize(config, arg)
