"""PPO on Brax locomotion (continuous actions), by Brax env name: `halfcheetah` (default), `ant`, `hopper`, ...

    python -m jaxrl.train --config=experiments/brax_ppo.py:halfcheetah
    python -m jaxrl.train --config=experiments/brax_ppo.py:ant --config.env.kwargs.backend=positional

Brax's own PPO settings for these tasks where they carry over: observation normalisation, discount 0.95 (0.97
for ant), learning rate 3e-4, entropy cost 1e-3 (1e-2 for ant), 2048 envs, a tanh-squashed Gaussian policy with
state-dependent standard deviations; a time limit of 1000 steps. Brax's GAE restarts every 20-step unroll;
here the whole rollout of `num_steps` is one unroll. Needs brax: pip install -e ".[brax]".
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib

TUNED = {
    "halfcheetah": {"total_steps": 50_000_000, "returns.gamma": 0.95, "returns.reward_scale": 1.0},
    "ant": {"total_steps": 50_000_000, "returns.gamma": 0.97, "loss.ent_coef": 1e-2, "returns.reward_scale": 10.0,
            "env.kwargs.backend": "positional"},
}


def use_brax_env(config: ConfigDict, env_name: str) -> None:
    """Point `config.env` at Brax's `env_name`: the generalized backend, episodes of 1000 steps, no action repeat
    (each a `config.env.kwargs` key the command line can change)."""
    config.env.name = "brax"
    config.env.kwargs = ConfigDict({"env_name": env_name, "backend": "generalized", "episode_length": 1000,
                                    "action_repeat": 1})


def get_config(arg: str | None = None) -> ConfigDict:
    env_name = arg or "halfcheetah"
    config = algos.default_config("ppo")
    config.experiment = f"brax_ppo-{env_name}"
    use_brax_env(config, env_name)
    config.total_steps = 50_000_000
    config.num_envs = 2048
    config.num_steps = 20
    config.optim.num_epochs = 4
    config.optim.num_minibatches = 32
    config.optim.learning_rate = 3e-4
    config.optim.schedule = "constant"
    config.optim.max_grad_norm = 1.0
    config.returns.gamma = 0.95
    config.returns.gae_lambda = 0.95
    config.loss.ent_coef = 1e-3
    config.loss.vf_coef = 0.5
    config.normalize.obs = True
    config.network.hidden_sizes = (256, 256, 256, 256)
    config.network.activation = "swish"
    config.network.squash = True
    config.network.log_std = "state"
    config.log.every_steps = 1_000_000
    config.eval.every_steps = 5_000_000
    config.eval.episodes = 64
    config.checkpoint.every_steps = 5_000_000
    return config_lib.finalize(config_lib.set_values(config, TUNED.get(env_name, {})))
