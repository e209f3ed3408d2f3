"""PPO on Craftax (symbolic observations): `classic` (Craftax-Classic, the default) or `full` (Craftax).

    python -m jaxrl.train --config=experiments/craftax_ppo.py:classic
    python -m jaxrl.train --config=experiments/craftax_ppo.py:full --config.total_steps=1000000000

The Craftax authors' PPO baseline: 1024 envs x 64 steps, 4 epochs of 8 minibatches, learning rate 2e-4
annealed to 0, GAE lambda 0.8, three tanh layers of 512. The achievements that episodes unlocked are logged
(`Achievements/<name>`: the percentage of episodes that unlocked it) with Craftax's `score`.
Needs craftax: pip install -e ".[craftax]".
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib

ENV_IDS = {"classic": "Craftax-Classic-Symbolic-v1", "full": "Craftax-Symbolic-v1"}


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "classic"
    if variant not in ENV_IDS:
        raise ValueError(f"experiments/craftax_ppo.py takes classic or full, got {variant!r}")
    config = algos.default_config("ppo")
    config.experiment = f"craftax_ppo-{variant}"
    config.env.name = "craftax"
    config.env.kwargs = ConfigDict({"env_id": ENV_IDS[variant]})
    config.env.reset_ratio = 16  # as Craftax's PPO: world generation costs far more than a step
    config.total_steps = 1_000_000_000
    config.num_envs = 1024
    config.num_steps = 64
    config.optim.num_epochs = 4
    config.optim.num_minibatches = 8
    config.optim.learning_rate = 2e-4
    config.optim.schedule = "linear"
    config.optim.max_grad_norm = 1.0
    config.returns.gamma = 0.99
    config.returns.gae_lambda = 0.8
    config.loss.ent_coef = 0.01
    config.network.hidden_sizes = (512, 512, 512)
    config.network.activation = "tanh"
    config.log.every_steps = 1_048_576
    config.eval.every_steps = 0  # Craftax episodes run to 10,000 (classic) or 100,000 steps: use training curves
    config.eval.episodes = 32
    config.checkpoint.every_steps = 10_485_760
    return config_lib.finalize(config)
