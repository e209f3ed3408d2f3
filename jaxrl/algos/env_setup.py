"""What the algorithms that learn on environments share: the env, network and policy a config names, the keys
they read (declared once here), their run sizes and optimiser (`run_sizes`), and their checks."""

from __future__ import annotations


import jax
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

import envs
from jaxrl import config as config_lib, distributions, knobs
from jaxrl.algos.env_policy import AGENT_ID_INPUTS, CRITIC_INPUTS, EnvPolicy
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import OptimizerSettings, minibatch_block_size
from jaxrl.knobs import Knob
from jaxrl.losses import ENT_COEF, VF_COEF
from jaxrl.mesh import DATA_AXIS, RUN_AXIS
from jaxrl.networks import ACTIVATIONS, KERNEL_INITS, LOG_STDS, ActorCritic, RecurrentActorCritic

NETWORKS = ("mlp", "gru")


def _positive_ints(sizes) -> bool:
    return bool(sizes) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)


# The keys of the algorithms that learn on environments (each family may set its own defaults)
NUM_ENVS = Knob("num_envs", 4, "parallel environments per seed, split over devices", minimum=1)
NUM_STEPS = Knob("num_steps", 128, "env steps per env per update", minimum=1)
ROLLOUT_UNROLL = Knob("rollout_unroll", 1, "lax.scan unroll of the rollout loop (a speed knob)", minimum=1)
ENV_NAME = Knob("env.name", "CartPole-v1", "a registered environment (envs.registered())")
ENV_KWARGS = Knob("env.kwargs", {}, "the environment's own arguments, e.g. {scenario: 3m}")
RESET_RATIO = Knob("env.reset_ratio", 1, "training envs compute one restart per reset_ratio envs per step, shared "
                   "when more end at once (for envs whose reset costs much more than a step: Craftax)", minimum=1)
GAMMA = Knob("returns.gamma", 0.99, "the discount factor", traced=True, minimum=0.0, maximum=1.0)
REWARD_SCALE = Knob("returns.reward_scale", 1.0, "rewards are learned multiplied by this (Brax's reward_scaling)",
                    traced=True)
NETWORK_KIND = Knob("network.kind", "mlp", "feed-forward (mlp) or recurrent (gru) actor and critic",
                    choices=NETWORKS)
HIDDEN_SIZES = Knob("network.hidden_sizes", (64, 64), "units of each hidden layer (mlp networks)",
                    rule="positive integers, e.g. (64, 64)", accepts=_positive_ints)
FC_SIZE = Knob("network.fc_size", 128, "gru networks: the dense layer before and after the GRU", minimum=1)
RNN_SIZE = Knob("network.rnn_size", 128, "gru networks: the hidden state's size", minimum=1)
ACTIVATION = Knob("network.activation", "tanh", "the hidden layers' activation", choices=tuple(sorted(ACTIVATIONS)))
LAYER_NORM = Knob("network.layer_norm", False, "LayerNorm before each hidden activation")
CRITIC_INPUT = Knob("network.critic_input", "obs", "what the critic sees: each agent's own view (obs, IPPO) or the "
                    "env's global state (global_state, MAPPO)", choices=CRITIC_INPUTS)
AGENT_ID = Knob("network.agent_id", "both", "multi-agent: which networks see each agent's one-hot index",
                choices=AGENT_ID_INPUTS)
LOG_STD = Knob("network.log_std", "param", "continuous actions: log-stds learned per dimension (param) or computed "
               "by the actor (state)", choices=LOG_STDS)
INIT_LOG_STD = Knob("network.init_log_std", 0.0, "continuous actions: the log-stds' initial value")
STD_TRANSFORM = Knob("network.std_transform", "exp", "continuous actions: exp (log-stds) or softplus (std = "
                     "softplus(x) + 0.001, as Brax's policies)", choices=distributions.STD_TRANSFORMS)
SQUASH = Knob("network.squash", False, "continuous actions: tanh-squash the Gaussian to the bounds")
KERNEL_INIT = Knob("network.kernel_init", "orthogonal", "mlp networks: orthogonal (gain sqrt(2), the heads' own: "
                   "the PPO convention) or lecun_uniform (every layer, as Brax's)", choices=KERNEL_INITS)
ENV_KNOBS = (NUM_ENVS, NUM_STEPS, ROLLOUT_UNROLL, ENV_NAME, ENV_KWARGS, RESET_RATIO, NETWORK_KIND, HIDDEN_SIZES,
             FC_SIZE, RNN_SIZE, ACTIVATION, CRITIC_INPUT, AGENT_ID, LOG_STD, INIT_LOG_STD, STD_TRANSFORM, SQUASH,
             KERNEL_INIT, GAMMA, VF_COEF, ENT_COEF, NUM_EPOCHS, NUM_MINIBATCHES)


def check_minibatch_split(num_envs: int, num_steps: int, num_minibatches: int, num_agents: int, sequences: bool,
                          mesh) -> None:
    """Raise unless an update's units (whole (env, agent) sequences, or single agent-steps) split into
    `num_minibatches` equal minibatches on every device with whole blocks of envs (`deal_minibatches`)."""
    num_local_envs = num_envs // mesh.shape[DATA_AXIS]
    units_per_env = num_agents * (1 if sequences else num_steps)
    block = minibatch_block_size(units_per_env, num_minibatches)
    if num_local_envs % block:
        unit = "sequences (envs x agents)" if sequences else "samples (envs x steps x agents)"
        raise ValueError(
            f"the {num_envs * units_per_env} {unit} of an update cannot be split into "
            f"num_minibatches={num_minibatches} equal minibatches on each of "
            f"{mesh.shape[DATA_AXIS]} devices: the envs on one device ({num_local_envs}) must "
            f"be a multiple of {block}")


def env_config() -> ConfigDict:
    """`config.base_config()` plus the keys every env algorithm reads (`ENV_KNOBS`)."""
    return knobs.fill(config_lib.base_config(), *ENV_KNOBS)


def sample_trajectory(rollout, state, state_specs, mesh, check_vma: bool = True):
    """The trajectory the next update of every run will train on, nothing updated (for inspection and tests):
    `rollout(state of one run, rollout key) -> trajectory [T, n, ...]` under the mesh, with the key the
    update draws (the second of three from the state's key). Returns leaves [S, T, N, ...]."""
    local = jax.vmap(lambda st: rollout(st, jax.random.split(st.key, 3)[1]))
    fn = jax.shard_map(local, mesh=mesh, in_specs=(state_specs,), out_specs=P(RUN_AXIS, None, DATA_AXIS),
                       check_vma=check_vma)
    return jax.jit(fn)(state)


def make_network(config: ConfigDict, env: envs.Environment, critic: bool = True):
    """The actor-critic named by `config.network.kind` for `env`'s actions: logits, or a Gaussian's means and
    log-stds (`network.log_std`) (without a value network when `critic` is false)."""
    n = config.network
    dist = distributions.for_action_space(env.action_space(), n.squash, n.std_transform)
    gaussian = {}
    if isinstance(dist, distributions.DiagGaussian):
        gaussian = dict(log_std=n.log_std, init_std_output=dist.std_output(n.init_log_std))
    if n.kind == "mlp":
        return ActorCritic(dist.num_outputs, tuple(n.hidden_sizes), n.activation, critic=critic,
                           kernel_init=n.kernel_init, **gaussian)
    if n.kind == "gru":
        return RecurrentActorCritic(dist.num_outputs, n.fc_size, n.rnn_size, n.activation, critic=critic, **gaussian)
    raise ValueError(f"unknown config.network.kind {n.kind!r}; known: {', '.join(NETWORKS)}")


def make_env(config: ConfigDict):
    """(env, the step cap of an evaluation episode)."""
    env = envs.make(config.env.name, **config.env.kwargs.to_dict())
    return env, config.eval.max_steps or env.max_episode_steps or 1000


def make_policy(config: ConfigDict, critic: bool = True, **normalize) -> EnvPolicy:
    """The env a config names, seen through the actor-critic it names (`normalize`: `EnvPolicy`'s
    normalize_obs and obs_clip)."""
    env, eval_max_steps = make_env(config)
    n = config.network
    return EnvPolicy(env, make_network(config, env, critic), n.agent_id, n.critic_input, eval_max_steps, n.squash,
                     std_transform=n.std_transform, **normalize)


def run_sizes(config: ConfigDict) -> dict:
    """The settings fields a config gives other than key by key: the run's updates, its XLA options parsed and
    the optimiser."""
    num_updates = config.total_steps // (config.num_envs * config.num_steps)
    return dict(num_updates=num_updates, xla_options=config_lib.xla_options(config),
                optimizer=knobs.read(OptimizerSettings, config, num_updates=num_updates))


def check_env_config(config: ConfigDict) -> None:
    """The keys every env algorithm reads."""
    if config.network.kind != "mlp" and config.network.kernel_init != "orthogonal":
        raise ValueError(f"config.network.kernel_init={config.network.kernel_init!r} applies to mlp networks; "
                         f"network.kind={config.network.kind!r} starts orthogonal")
    check_env_and_length(config)


def check_env_and_length(config: ConfigDict) -> None:
    """The env is a registered one and the run at least one update long (every algorithm that learns on envs,
    off-policy ones too)."""
    if config.env.name not in envs.registered():
        raise ValueError(f"unknown config.env.name {config.env.name!r}; known environments: "
                         f"{', '.join(envs.registered())}")
    batch = config.num_envs * config.num_steps
    if config.total_steps < batch:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update "
                         f"(num_envs * num_steps = {batch})")
