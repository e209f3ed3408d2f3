"""PPO on CartPole-v1: the PureJaxRL recipe (4 envs x 128 steps, 4 epochs, 4 minibatches, 64-64 tanh).

    python -m jaxrl.train --config=experiments/cartpole_ppo.py --config.total_steps=200000
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def purejaxrl_recipe(config: ConfigDict) -> ConfigDict:
    """PureJaxRL's PPO settings for classic control (4 envs x 128 steps, 64-64 tanh), also the shared defaults
    of experiments/gymnax_ppo.py."""
    config.num_envs = 4
    config.num_steps = 128
    config.optim.num_epochs = 4
    config.optim.num_minibatches = 4
    config.optim.learning_rate = 2.5e-4
    config.optim.schedule = "linear"
    config.returns.gamma = 0.99
    config.returns.gae_lambda = 0.95
    config.loss.clip_low = 0.2
    config.loss.clip_high = 0.2
    config.loss.value_clip = 0.2
    config.loss.vf_coef = 0.5
    config.loss.ent_coef = 0.01
    config.optim.max_grad_norm = 0.5

    config.network.hidden_sizes = (64, 64)
    config.network.activation = "tanh"
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    config = purejaxrl_recipe(algos.default_config("ppo"))
    config.experiment = "cartpole_ppo"
    config.env.name = "CartPole-v1"
    config.total_steps = 500_000
    config.log.every_steps = 25_000
    config.eval.every_steps = 100_000
    config.checkpoint.every_steps = 100_000
    config.eval.episodes = 32
    return config_lib.finalize(config, arg)
