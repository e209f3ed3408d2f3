"""IPPO on SMAX: shared recurrent actor and critic, each agent's value from its own observation.

    python -m jaxrl.train --config=experiments/smax_ippo.py:3m

Identical to experiments/smax_mappo.py except for the critic's input.
"""

from ml_collections import ConfigDict

from experiments.smax_mappo import smax_config
from jaxrl import config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(smax_config(arg or "3m", "obs", "smax_ippo"))
