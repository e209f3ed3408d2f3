"""PPO on a gymnasium environment stepped on the host (`pip install -e ".[gymnasium]"`; Atari: ".[atari]"), by
its gymnasium id: each step of the envs is a host callback inside the compiled update (`envs.adapters.gymnasium`).

    python -m jaxrl.train --config=experiments/gymnasium_ppo.py:CartPole-v1
    python -m jaxrl.train --config=experiments/gymnasium_ppo.py:CartPole-v1 --config.actor.max_staleness=1 \\
        --config.mesh.split_actor=true          # Sebulba: one device steps the envs while another learns

With `mesh.split_actor` the actor devices roll out (the host steps the envs) while the learner devices learn
from the previous rollout (Cleanba's lag of one update at `actor.max_staleness=1`); `advantage.estimator=impala`
with `returns.gae_values=current` corrects for the lag with V-trace. On a CPU, give the process two devices
(XLA_FLAGS=--xla_force_host_platform_device_count=2). Host envs are not in the checkpoint: a resumed run starts
its envs' episodes again.
"""

from ml_collections import ConfigDict

from experiments.cartpole_ppo import purejaxrl_recipe
from jaxrl import algos, config as config_lib

# Per environment: config keys that differ from the shared defaults below.
TUNED = {
    "CartPole-v1": {"total_steps": 200_000, "num_envs": 8},
    "Acrobot-v1": {"total_steps": 500_000, "num_envs": 16, "num_steps": 32, "optim.learning_rate": 5e-4,
                   "optim.schedule": "constant", "optim.max_grad_norm": 1.0, "optim.num_epochs": 8},
}


def get_config(arg: str | None = None) -> ConfigDict:
    env_id = arg or "CartPole-v1"
    config = purejaxrl_recipe(algos.default_config("ppo"))
    config.experiment = f"gymnasium_ppo-{env_id.replace('/', '_')}"
    config.env.name = "gymnasium"
    config.env.kwargs = ConfigDict({"env_id": env_id})
    config.total_steps = 1_000_000
    config.log.every_steps = 16_384
    config.eval.every_steps = 0
    config.checkpoint.every_steps = 100_000
    config.eval.episodes = 8
    return config_lib.finalize(config_lib.set_values(config, TUNED.get(env_id, {})))
