"""What the algorithms that learn on environments share: the env and network a config names, the settings
read from the same keys, and their checks."""

from __future__ import annotations

import dataclasses

import jax
from ml_collections import ConfigDict

import envs
from jaxrl import config as config_lib
from jaxrl.engine import GRAD_CLIPS, linear_decay, make_optimizer, minibatch_block_size
from jaxrl.mesh import DATA_AXIS
from jaxrl.networks import ActorCritic, RecurrentActorCritic

NETWORKS = ("mlp", "gru")
CRITIC_INPUTS = ("obs", "global_state")  # the critic sees each agent's view (IPPO) or the env's global state (MAPPO)
AGENT_ID_INPUTS = ("both", "critic", "actor", "none")  # which networks see each agent's one-hot index


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """Static sizes and choices every env algorithm has: changing one compiles a new program."""

    num_envs: int = 4
    num_steps: int = 128
    num_epochs: int = 4
    num_minibatches: int = 4
    num_updates: int = 1  # total over the run, for learning-rate annealing
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    rollout_unroll: int = 1
    critic_input: str = "obs"  # "obs": a value per agent from its own view (IPPO); "global_state" (MAPPO)
    agent_id: str = "both"  # which networks see each agent's one-hot index (parameters are shared): AGENT_ID_INPUTS
    grad_clip: str = "joint"  # max_grad_norm clips all parameters' gradient together, or each network's alone
    xla_options: tuple[tuple[str, str | bool], ...] = ()  # XLA compile options of the training program

    @property
    def batch_size(self) -> int:
        """Environment steps per update, over all devices."""
        return self.num_envs * self.num_steps


def env_optimizer(settings: EnvSettings, hp, update_step: jax.Array):
    """The optimiser of update `update_step`: Adam with `hp.max_grad_norm` clipping (`settings.grad_clip`),
    the learning rate decaying linearly to zero over the run when `settings.anneal_lr`."""
    learning_rate = (linear_decay(hp.learning_rate, update_step, settings.num_updates) if settings.anneal_lr
                     else hp.learning_rate)
    return make_optimizer(learning_rate, hp.max_grad_norm, settings.adam_eps, settings.grad_clip)


def check_minibatch_split(settings: EnvSettings, num_agents: int, sequences: bool, mesh) -> None:
    """Raise unless an update's units (whole (env, agent) sequences, or single agent-steps) split into
    `num_minibatches` equal minibatches on every device with whole blocks of envs (`deal_minibatches`)."""
    num_local_envs = settings.num_envs // mesh.shape[DATA_AXIS]
    units_per_env = num_agents * (1 if sequences else settings.num_steps)
    block = minibatch_block_size(units_per_env, settings.num_minibatches)
    if num_local_envs % block:
        unit = "sequences (envs x agents)" if sequences else "samples (envs x steps x agents)"
        raise ValueError(
            f"the {settings.num_envs * units_per_env} {unit} of an update cannot be split into "
            f"num_minibatches={settings.num_minibatches} equal minibatches on each of "
            f"{mesh.shape[DATA_AXIS]} devices: the envs on one device ({num_local_envs}) must "
            f"be a multiple of {block}")


def make_network(config: ConfigDict, num_actions: int, critic: bool = True):
    """The actor-critic named by `config.network.kind` (without a value network when `critic` is false)."""
    n = config.network
    if n.kind == "mlp":
        return ActorCritic(num_actions, tuple(n.hidden_sizes), n.activation, critic=critic)
    if n.kind == "gru":
        return RecurrentActorCritic(num_actions, n.fc_size, n.rnn_size, n.activation, critic=critic)
    raise ValueError(f"unknown config.network.kind {n.kind!r}; known: {', '.join(NETWORKS)}")


def make_env(config: ConfigDict):
    """(env, the step cap of an evaluation episode)."""
    env = envs.make(config.env.name, **config.env.kwargs.to_dict())
    return env, config.eval.max_steps or env.max_episode_steps or 1000


def env_settings(config: ConfigDict) -> dict:
    """Settings fields that every env algorithm reads from the same keys."""
    c = config.ppo
    return dict(num_envs=config.num_envs, num_steps=config.num_steps, num_epochs=c.num_epochs,
                num_minibatches=c.num_minibatches,
                num_updates=config.total_steps // (config.num_envs * config.num_steps),
                anneal_lr=c.anneal_lr, adam_eps=c.adam_eps, rollout_unroll=config.rollout_unroll,
                critic_input=c.critic_input, agent_id=config.network.agent_id, grad_clip=c.grad_clip,
                xla_options=config_lib.xla_options(config))


def check_env_config(config: ConfigDict) -> None:
    """The keys every env algorithm reads."""
    one_of = config_lib.one_of
    one_of(config.ppo.critic_input, CRITIC_INPUTS, "ppo.critic_input")
    one_of(config.ppo.grad_clip, GRAD_CLIPS, "ppo.grad_clip")
    one_of(config.network.agent_id, AGENT_ID_INPUTS, "network.agent_id")
    one_of(config.network.kind, NETWORKS, "network.kind")
    if config.env.name not in envs.registered():
        raise ValueError(f"unknown config.env.name {config.env.name!r}; known environments: "
                         f"{', '.join(envs.registered())}")
    config_lib.positive(config, "num_envs", "num_steps", "rollout_unroll", "ppo.num_epochs", "ppo.num_minibatches",
                        "network.fc_size", "network.rnn_size")
    batch = config.num_envs * config.num_steps
    if config.total_steps < batch:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update "
                         f"(num_envs * num_steps = {batch})")
    for key in ("learning_rate", "max_grad_norm", "adam_eps"):
        if not config.ppo[key] > 0:
            raise ValueError(f"config.ppo.{key} must be > 0, got {config.ppo[key]!r}")
    config_lib.unit_interval(config.ppo.gamma, "ppo.gamma")
