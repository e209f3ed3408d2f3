"""IQL on SMAX: `experiments/smax_qmix.py`'s agents and settings with no mixer: every agent learns its own action values from
the team reward (independent Q-learning with one shared network). The scenario is the argument.

    python -m jaxrl.train --config=experiments/smax_iql.py:3m
"""

from ml_collections import ConfigDict

from experiments.smax_qmix import smax_value_config
from jaxrl import config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(smax_value_config("iql", arg or "3m"))
