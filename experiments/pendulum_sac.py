"""SAC on Pendulum-v1 (gymnax), with a learned temperature.

    python -m jaxrl.train --config=experiments/pendulum_sac.py
    python -m jaxrl.train --config=experiments/pendulum_sac.py --config.num_seeds=3

Settings after CleanRL's continuous SAC: two 256-unit ReLU critics, Adam at 3e-4 (actor) and 1e-3 (critics and
temperature), batches of 256, one gradient step per env step, 5,000 uniformly random steps first, Polyak tau
0.005. `experiments/pendulum_td3.py` and `pendulum_tqc.py` share this budget and logging (`pendulum_config`).
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def pendulum_config(algorithm: str) -> ConfigDict:
    """`algorithm`'s defaults (sac, td3 or tqc) on Pendulum-v1: 50k env steps, evaluated every 10k."""
    config = algos.default_config(algorithm)
    config.experiment = f"pendulum_{algorithm}"
    config.env.name = "gymnax"
    config.env.kwargs = ConfigDict({"env_id": "Pendulum-v1"})
    config.total_steps = 50_000
    config.replay.buffer_size = 50_000
    config.log.every_steps = 5_000
    config.eval.every_steps = 10_000
    config.eval.episodes = 16
    config.checkpoint.every_steps = 25_000
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(pendulum_config("sac"), arg)
