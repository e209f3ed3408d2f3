"""SAC on Brax locomotion, by Brax env name: `halfcheetah` (default), `ant`, `hopper`, ...

    python -m jaxrl.train --config=experiments/brax_sac.py:halfcheetah
    python -m jaxrl.train --config=experiments/brax_sac.py:ant --config.env.kwargs.backend=positional

Many envs, a replay ratio below one: 64 envs step together, and each update of 64 env steps takes 32 gradient
steps on batches of 256 (Brax's own SAC trains the same way, with more envs and gradient steps per step);
256-unit critics and actor, Adam at 3e-4, gamma 0.99, 10,000 random steps first, episodes of 1000 steps. These
settings are a starting point and have not been measured on Brax yet (see benchmarks/RESULTS.md). For TD3 or
TQC on Brax, start from `experiments/pendulum_td3.py` / `pendulum_tqc.py` with `--config.env.name=brax
--config.env.kwargs=...`, or copy this file: an algorithm's own keys come with its default config. Needs
brax: pip install -e ".[brax]".
"""

from ml_collections import ConfigDict

from experiments.brax_ppo import use_brax_env
from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    env_name = arg or "halfcheetah"
    config = algos.default_config("sac")
    config.experiment = f"brax_sac-{env_name}"
    use_brax_env(config, env_name)
    config.total_steps = 5_000_000
    config.num_envs = 64
    config.num_steps = 1
    config.replay.update({"buffer_size": 1_048_576, "batch_size": 256, "gradient_steps": 32,
                          "learning_starts": 10_240})
    config.optim.update({"learning_rate": 3e-4, "critic_learning_rate": 3e-4})
    config.optim.temperature_learning_rate = 3e-4
    config.log.every_steps = 100_032
    config.eval.every_steps = 1_000_064
    config.eval.episodes = 16
    config.checkpoint.every_steps = 1_000_064
    return config_lib.finalize(config, arg=None)
