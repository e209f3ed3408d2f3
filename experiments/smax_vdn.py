"""VDN on SMAX: `experiments/smax_qmix.py`'s agents and settings, the team's value the sum of the agents' (no
mixing network). The scenario is the argument.

    python -m jaxrl.train --config=experiments/smax_vdn.py:3m
"""

from ml_collections import ConfigDict

from experiments.smax_qmix import smax_value_config
from jaxrl import config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(smax_value_config("vdn", arg or "3m"))
