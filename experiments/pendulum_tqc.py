"""TQC on Pendulum-v1 (gymnax): five critics of 25 quantiles, the 2 largest of each dropped from the target.

    python -m jaxrl.train --config=experiments/pendulum_tqc.py
    python -m jaxrl.train --config=experiments/pendulum_tqc.py --config.num_seeds=3

Settings after CleanRL's continuous SAC: two 256-unit ReLU critics, Adam at 3e-4 (actor) and 1e-3 (critics and
temperature), batches of 256, one gradient step per env step, 5,000 random steps first, Polyak tau 0.005.
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    config = algos.default_config("tqc")
    config.experiment = "pendulum_tqc"
    config.env.name = "gymnax"
    config.env.kwargs = ConfigDict({"env_id": "Pendulum-v1"})
    config.total_steps = 50_000
    config.replay.buffer_size = 50_000
    config.log.every_steps = 5_000
    config.eval.every_steps = 10_000
    config.eval.num_envs = 16
    config.checkpoint.every_steps = 25_000
    return config_lib.finalize(config, arg)
