"""TQC on Pendulum-v1 (gymnax): two critics of 25 quantiles each; the target drops the 2 largest atoms per
critic (4 of 50) from the pooled next-state atoms.

    python -m jaxrl.train --config=experiments/pendulum_tqc.py

Settings after SB3-contrib's and sbx's TQC: 256-unit ReLU layers, Adam at 3e-4, batches of 256, a learned
temperature, 5,000 random steps first.
"""

from ml_collections import ConfigDict

from experiments.pendulum_sac import pendulum_config
from jaxrl import config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(pendulum_config("tqc"), arg)
