"""MAPPO on SMAX: shared recurrent actor, centralised critic on the global state. The scenario is the argument.

    python -m jaxrl.train --config=experiments/smax_mappo.py:3m
    python -m jaxrl.train --config=experiments/smax_mappo.py:2s3z --config.total_steps=10000000

The recipe is JaxMARL's recurrent SMAX MAPPO script's (GRU 128, FC 128, relu, lr 2e-3 annealed, clip 0.2,
no entropy bonus, 4 epochs x 4 minibatches, actor and critic each clipping its gradient norm to 0.25, agent
ids for the critic only, every agent's returns running to the end of the battle), with fewer environments
per update (64 x 128 steps rather than 128 x 128), which learns 3m in fewer env steps.
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib

# Env steps per seed for each scenario's default budget; others get DEFAULT_STEPS.
BUDGETS = {"3m": 2_000_000, "2s3z": 10_000_000, "5m_vs_6m": 10_000_000}
DEFAULT_STEPS = 10_000_000


def smax_config(scenario: str, critic_input: str, experiment: str) -> ConfigDict:
    """Shared by the SMAX IPPO and MAPPO experiments: they differ only in what the critic sees."""
    config = algos.default_config("ppo")
    config.experiment = f"{experiment}_{scenario}"
    config.env.name = "smax"
    config.env.kwargs = ConfigDict({"scenario": scenario})
    config.total_steps = BUDGETS.get(scenario, DEFAULT_STEPS)
    config.num_envs = 64
    config.num_steps = 128

    config.network.critic_input = critic_input
    config.optim.num_epochs = 4
    config.optim.num_minibatches = 4
    config.optim.learning_rate = 2e-3
    config.optim.schedule = "linear"
    config.returns.gamma = 0.99
    config.returns.gae_lambda = 0.95
    config.loss.clip_low = 0.2
    config.loss.clip_high = 0.2
    config.loss.value_clip = 0.2
    config.loss.vf_coef = 0.5
    config.loss.ent_coef = 0.0
    config.optim.max_grad_norm = 0.25
    config.optim.grad_clip = "per_network"
    # SMAX pays dead agents the team reward: their returns run on to the end of the battle, so a unit that
    # dies for a win is credited with it (ending them at its death halves the learning speed on 3m).
    config.returns.until = "episode"

    recurrent_network(config)
    # XLA:CPU's YNNPACK dot fusions run each large product ([12288, 128] x [128, 384]) on one core; without
    # them XLA's own multi-threaded products make an update 1.22x faster on 2 cores (and no slower on 1).
    # Not a global default: the text transformer's steps are 1.45x slower without them.
    config.xla_options = config_lib.WITHOUT_YNNPACK

    config.log.every_steps = 65_536
    config.eval.every_steps = 262_144
    config.eval.episodes = 64
    config.checkpoint.every_steps = 1_048_576
    return config


def recurrent_network(config: ConfigDict, agent_id: str = "critic") -> None:
    """The baselines' shared recurrent actor (and critic): GRU 128 between dense layers of 128, relu; by default
    the critic is told the agent's id and the actor sees only its observation."""
    config.network.kind = "gru"
    config.network.fc_size = 128
    config.network.rnn_size = 128
    config.network.activation = "relu"
    config.network.agent_id = agent_id


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(smax_config(arg or "3m", "global_state", "smax_mappo"))
