"""TD3 on Pendulum-v1 (gymnax): twin critics, target-action smoothing, the actor and targets every second
gradient step (an update: 2 env steps, 2 critic steps, 1 policy step).

    python -m jaxrl.train --config=experiments/pendulum_td3.py

Settings after CleanRL's TD3: 256-unit ReLU layers, Adam at 3e-4, batches of 256, exploration noise 0.1 and
target noise 0.2 clipped at 0.5 (in units of the action range's half-width), 5,000 random steps first.
"""

from ml_collections import ConfigDict

from experiments.pendulum_sac import pendulum_config
from jaxrl import config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(pendulum_config("td3"), arg)
