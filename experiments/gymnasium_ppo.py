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

from experiments import gymnax_ppo

# Per environment: config keys that differ from the shared defaults (gymnax_ppo.py's settings for the same envs).
TUNED = {**gymnax_ppo.TUNED, "CartPole-v1": {"total_steps": 200_000, "num_envs": 8}}


def get_config(arg: str | None = None) -> ConfigDict:
    return gymnax_ppo.library_ppo("gymnasium", arg or "CartPole-v1", TUNED, **{
        "log.every_steps": 16_384, "eval.every_steps": 0, "checkpoint.every_steps": 100_000, "eval.episodes": 8})
