"""Q-learning on a Q-network acting epsilon-greedily: DQN, PQN, IQL, VDN, QMIX and PQN-VDN as one learner whose
differences are parameters (`VARIANTS`, by the algorithm's name), for a device mesh and many seeds at once.

    replay   a replay buffer (DQN, IQL, VDN, QMIX), or none: PQN learns from each rollout, with many envs and a
             layer-normalised network in place of a buffer and a target network (Gallici et al., 2024)
    targets  "n_step": each replayed sequence's first step learns its n-step return (DQN; Mnih et al., 2015);
             "lambda": every step of a replayed sequence past its burn-in, or of the rollout, its Q(lambda) return
    mixer    "none": each agent learns its own Q (independent Q-learners sharing one network); "sum": the team's
             value is the sum of the agents' (VDN; Sunehag et al., 2018); "qmix": a monotonic mix with weights from
             hypernetworks on the global state (Rashid et al., 2018). A team learns from the agents' mean reward

One update, for one run on this device's n envs: T steps of every env, epsilon-greedy (`engine.acting.rollout`);
then with replay (`engine.acting.replay_update`) G gradient steps, each on batch_size / num_envs sequences of L
steps per env: the online and target networks over each sequence (a recurrent one from a zero hidden state that
restarts at episode starts; the next observation's values continue from the hidden state its step left),
double-Q next values, targets `advantages.lambda_targets` (lam 1 over n steps: n-step returns), a Huber or
squared TD loss weighted by the importance weights, new priorities |TD|, the target network moved every
`target.every` steps by `target.tau` (1: a copy); or, PQN, Q(lambda) targets over the rollout from the network as
it was, then epochs x minibatches of the squared error (`engine.optimise`).

Envs are seen with an agent axis: one Q-network acts for every agent (masks restrict actions). It has the
actor-critic calling convention, so `EnvPolicy` serves it (greedy evaluation is argmax Q). Shapes: n envs, A
agents, K actions, T steps per update, B sequences of L steps, S global state size.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

from jaxrl import config as config_lib, engine, knobs, mesh as mesh_lib
from jaxrl.advantages import lambda_targets
from jaxrl.algos.env_policy import EnvOnMesh, EnvPolicy, PolicyStep, trainable
from jaxrl.algos.env_setup import (ACTIVATION, HIDDEN_SIZES, LAYER_NORM, check_minibatch_split, make_env)
from jaxrl.algos.off_policy import (GAMMA, PRIORITY_ALPHA, PRIORITY_BETA, REWARD_SCALE, TAU, OffPolicySettings,
                                    check_off_policy_config, off_policy_algorithm, off_policy_config,
                                    off_policy_settings, replay_config)
from jaxrl.algos.registry import Recipe, register
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import acting as acting_lib
from jaxrl.knobs import Knob
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS
from jaxrl.networks import QMixer, QNetwork, RecurrentQNetwork

# algorithm name -> (mixer, targets, the key of a replayed sequence's length; None: no replay buffer)
VARIANTS = {"dqn": ("none", "n_step", "returns.n_step"), "iql": ("none", "lambda", "replay.sequence_length"),
            "vdn": ("sum", "lambda", "replay.sequence_length"), "qmix": ("qmix", "lambda", "replay.sequence_length"),
            "pqn": ("none", "lambda", None), "pqn_vdn": ("sum", "lambda", None)}
TD_LOSSES = ("huber", "squared")

# Exploration: epsilon falls linearly from epsilon_start to epsilon_end over `fraction` of the run's updates
EPSILON_START = Knob("explore.epsilon_start", 1.0, "the exploration rate at the start", traced=True, minimum=0.0,
                     maximum=1.0)
EPSILON_END = Knob("explore.epsilon_end", 0.05, "the exploration rate after explore.fraction of the run",
                   traced=True, minimum=0.0, maximum=1.0)
EPSILON_FRACTION = Knob("explore.fraction", 0.5, "the fraction of the run's updates over which epsilon falls",
                        traced=True, minimum=0.0, maximum=1.0)
DUELING = Knob("network.dueling", False, "dueling heads: Q = V + A - mean(A)")
Q_LAMBDA = Knob("returns.q_lambda", 0.65, "Q(lambda) targets: 0 one-step, 1 the rest of the sequence's return",
                traced=True, minimum=0.0, maximum=1.0)
N_STEP = Knob("returns.n_step", 1, "n-step returns: the target sums n rewards before it bootstraps", minimum=1)
SEQUENCE_LENGTH = Knob("replay.sequence_length", 64, "steps per sampled sequence (the recurrent network unrolls "
                       "over it)", minimum=1)
DOUBLE = Knob("loss.double", True, "double Q-learning: the target network values the online network's greedy action")
TD_LOSS = Knob("loss.td", "huber", "the TD error's loss", choices=TD_LOSSES)
BURN_IN = Knob("replay.burn_in", 0, "steps at each sequence's start that only warm the hidden state up", minimum=0)
# QMIX's mixing network: an embedding, hypernetworks of one hidden layer, every layer's initial weights orthogonal
MIXER_KNOBS = (Knob("mixer.embed_size", 32, "QMIX: the mixing network's embedding size", minimum=1),
               Knob("mixer.hypernet_size", 64, "QMIX: the hypernetworks' hidden layer size", minimum=1),
               Knob("mixer.init_scale", 0.001, "QMIX: the gain of every mixing layer's initial orthogonal weights",
                    above=0.0))


@struct.dataclass
class QHyperparams:
    """Traced numbers: one compiled program serves a sweep over them (a variant reads those its config holds)."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    gamma: float = GAMMA.field()
    reward_scale: float = REWARD_SCALE.field()
    q_lambda: float = Q_LAMBDA.field()  # lambda targets
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()
    epsilon_start: float = EPSILON_START.field()
    epsilon_end: float = EPSILON_END.field()
    epsilon_fraction: float = EPSILON_FRACTION.field()
    tau: float = TAU.field()  # replay: every `target.every` gradient steps
    priority_alpha: float = PRIORITY_ALPHA.field()
    priority_beta: float = PRIORITY_BETA.field()


@dataclasses.dataclass(frozen=True)
class QRules:
    """A Q-learner's static choices: mixer and targets by its name (`VARIANTS`), the rest read from its config
    (where a variant's config lacks a key, its default stands unused)."""

    mixer: str = "none"
    targets: str = "lambda"
    double: bool = DOUBLE.field()  # replay
    td_loss: str = TD_LOSS.field()  # replay
    burn_in: int = BURN_IN.field()  # replayed lambda targets
    num_epochs: int = NUM_EPOCHS.field()  # PQN
    num_minibatches: int = NUM_MINIBATCHES.field()  # PQN


@struct.dataclass
class PQNState:
    """Everything needed to continue training exactly. Leaves carry a leading run axis [R, ...]."""

    params: Any
    opt_state: Any
    acting: acting_lib.Acting  # [R, N, ...]
    key: jax.Array  # [R, 2]
    update_step: jax.Array  # [R] int32


def bootstrap_values(target_q: jax.Array, online_q: jax.Array | None = None) -> jax.Array:
    """The value of next observations from Q-values [..., K]: the target network's maximum, or with `online_q`
    (double Q-learning, van Hasselt et al. 2016) the target network's value of the online network's argmax."""
    if online_q is None:
        return jnp.max(target_q, axis=-1)
    return jnp.take_along_axis(target_q, jnp.argmax(online_q, axis=-1)[..., None], axis=-1)[..., 0]


def sequence_targets(reward: jax.Array, next_values: jax.Array, terminated: jax.Array, done: jax.Array, gamma,
                     lam) -> jax.Array:
    """`advantages.lambda_targets` over batch-major sequences: reward and next_values [B, L, ...], the episode
    flags [B, L] (one per env step, whatever the values' trailing axes, e.g. agents) -> targets [B, L, ...]."""
    per_value = lambda x: jnp.broadcast_to(x.reshape(x.shape + (1,) * (next_values.ndim - 2)),  # noqa: E731
                                           next_values.shape)
    time_major = (jnp.swapaxes(x, 0, 1) for x in (reward, next_values, per_value(terminated), per_value(done)))
    return jnp.swapaxes(lambda_targets(*time_major, gamma, lam), 0, 1)


def team_reward(reward: jax.Array, mixer: str) -> jax.Array:
    """The rewards [..., A] the targets use: the agents' own without a mixer, else the team's [...] (their mean)."""
    return reward if mixer == "none" else reward.mean(-1)


@dataclasses.dataclass(frozen=True, eq=False)
class QLearner:
    """A Q-learner's static parts (its policy on the env, the envs on the mesh, a mixing network or None, the
    settings) and its computations; `build_q_learning` makes its `engine.Algorithm`."""

    policy: EnvPolicy
    envs: EnvOnMesh
    mixer: QMixer | None
    settings: OffPolicySettings

    @property
    def rules(self) -> QRules:
        """`settings.rules` (shorthand: the computations read them throughout)."""
        return self.settings.rules

    # ----------------------------------------------------------------------------------------------
    # Acting

    def epsilon(self, hp: QHyperparams, update_step: jax.Array) -> jax.Array:
        """Exploration rate at `update_step`: linear from epsilon_start to epsilon_end over epsilon_fraction of
        the run's updates, then constant."""
        span = jnp.maximum(hp.epsilon_fraction * self.settings.num_updates, 1.0)
        progress = jnp.clip(update_step / span, 0.0, 1.0)
        return hp.epsilon_start + progress * (hp.epsilon_end - hp.epsilon_start)

    def act(self, key: jax.Array, policy: PolicyStep, hp: QHyperparams, update_step: jax.Array):
        """One env's epsilon-greedy actions [A] from its masked Q-values [A, K]: with probability epsilon a legal
        action uniformly at random, else the greedy one (stored, and given to the env)."""
        q, epsilon = policy.policy_out, self.epsilon(hp, update_step)
        coin_key, random_key = jax.random.split(key)
        legal = jnp.ones(q.shape, bool) if policy.mask is None else policy.mask
        random_action = jax.random.categorical(random_key, jnp.where(legal, 0.0, -jnp.inf))
        explore = jax.random.uniform(coin_key, q.shape[:-1]) < epsilon
        action = jnp.where(explore, random_action, jnp.argmax(q, axis=-1)).astype(jnp.int32)
        return action, action

    # ----------------------------------------------------------------------------------------------
    # The networks

    def q_values(self, params, obs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """[..., A, K] masked Q-values of observations [..., A, d] (a feed-forward network)."""
        actor_in = self.policy.actor_inputs(obs)
        return self.policy.dist.with_mask(self.policy.network.apply(params, (), actor_in, None)[1], mask)

    def sequence_q(self, params, seq: dict) -> tuple[jax.Array, jax.Array]:
        """(masked Q [B, L, A, K] of each step's obs, of its next obs) over sequences [B, L, ...] from a zero
        hidden state that restarts at episode starts."""
        B, L, A = seq["obs"].shape[:3]
        network, dist = self.policy.network, self.policy.dist
        time_major = lambda x: jnp.swapaxes(self.policy.actor_inputs(x), 0, 1)  # noqa: E731  [L, B, A, d]
        first = jnp.broadcast_to(jnp.swapaxes(seq["first"], 0, 1)[..., None], (L, B, A))
        start = mesh_lib.varying(network.initial_carry((B, A)))  # (per device, like the sequences)
        q, next_q = network.apply(params, start, time_major(seq["obs"]), time_major(seq["next_obs"]), first,
                                  method="sequence_values")
        return (dist.with_mask(jnp.swapaxes(q, 0, 1), seq.get("mask")),
                dist.with_mask(jnp.swapaxes(next_q, 0, 1), seq.get("next_mask")))

    def mix(self, params, agent_values: jax.Array, state: jax.Array | None) -> jax.Array:
        """The agents' values [..., A] -> the learned ones: their own (mixer "none"), or the team's [...], their
        sum ("sum", VDN) or QMIX's mix of them on the global state [..., S]."""
        if self.rules.mixer == "qmix":
            return self.mixer.apply({"params": params["mixer"]}, agent_values, state)
        return agent_values.sum(-1) if self.rules.mixer == "sum" else agent_values

    def init_params(self, key: jax.Array, obs: jax.Array, env_state) -> dict:
        """A new run's parameters, from the observations [n, A, d] and states of its n envs. The learners of
        replayed lambda targets draw the agents' and the mixer's keys apart; a mixing network's parameters are a
        collection of their own, which acting, evaluation and loaded policies ignore."""
        if self.settings.replay is None or self.rules.targets == "n_step":
            return self.policy.init_params(key, self.envs.env, obs, env_state)
        agent_key, mixer_key = jax.random.split(key)
        params = self.policy.init_params(agent_key, self.envs.env, obs, env_state)
        if self.mixer is not None:
            state = self.policy.global_state(self.envs.env, env_state)  # [n, S]
            params = {**params, "mixer": self.mixer.init(mixer_key, jnp.zeros(obs.shape[:2]), state)["params"]}
        return params

    def init(self, key: jax.Array) -> acting_lib.ReplayState | PQNState:
        optimizer = self.settings.optimizer(QHyperparams(), jnp.int32(0))

        def learned(key, obs, env_state):
            params = self.init_params(key, obs, env_state)
            return params, params, optimizer.init(trainable(params))

        if self.settings.replay is not None:
            return acting_lib.init_replay(self, learned, key)
        param_key, env_key, state_key = jax.random.split(key, 3)
        acting = acting_lib.start(self, env_key)
        params, _, opt_state = learned(param_key, acting.obs, acting.env_state)
        return PQNState(params, opt_state, acting, state_key, jnp.int32(0))

    def state_specs(self, state: acting_lib.ReplayState | PQNState):
        if self.settings.replay is not None:
            return acting_lib.replay_specs(state)
        return PQNState(params=RUNS, opt_state=RUNS, acting=P(RUN_AXIS, DATA_AXIS), key=RUNS, update_step=RUNS)

    # ----------------------------------------------------------------------------------------------
    # Learning from replayed sequences

    def td(self, params, target_params, seq: dict, hp: QHyperparams) -> tuple[jax.Array, jax.Array]:
        """(Q of the stored actions, their targets) for sequences [B, L, ...]: n-step, [B, A] of each sequence's
        first step; lambda, [B, L', A] past the burn-in, or the team's [B, L'] with a mixer."""
        if self.rules.targets == "n_step":
            mask = seq.get("next_mask")
            online_q = self.q_values(params, seq["next_obs"], mask) if self.rules.double else None
            next_values = jax.lax.stop_gradient(bootstrap_values(self.q_values(target_params, seq["next_obs"], mask),
                                                                 online_q))  # [B, L, A]
            targets = sequence_targets(seq["reward"], next_values, seq["terminated"], seq["done"], hp.gamma, 1.0)
            q = jnp.take_along_axis(self.q_values(params, seq["obs"][:, 0]), seq["action"][:, 0, :, None], axis=-1)
            return q[..., 0], targets[:, 0]
        q, online_next_q = self.sequence_q(params, seq)
        target_next_q = self.sequence_q(target_params, seq)[1]
        next_values = jax.lax.stop_gradient(
            bootstrap_values(target_next_q, online_next_q if self.rules.double else None))  # [B, L, A]
        chosen = jnp.take_along_axis(q, seq["action"][..., None], axis=-1)[..., 0]  # [B, L, A]
        q = self.mix(params, chosen, seq.get("state"))
        next_values = jax.lax.stop_gradient(self.mix(target_params, next_values, seq.get("next_state")))
        targets = sequence_targets(team_reward(seq["reward"], self.rules.mixer), next_values, seq["terminated"],
                                   seq["done"], hp.gamma, hp.q_lambda)
        burn_in = self.rules.burn_in
        return q[:, burn_in:], targets[:, burn_in:]

    def replay_loss(self, params, batch: dict, hp: QHyperparams):
        """Importance-weighted TD loss of a batch of sequences (`td`: q and targets [B, ...])."""
        q, targets = self.td(params, batch["target_params"], batch["items"], hp)
        if self.rules.td_loss == "huber":
            per_sample = acting_lib.per_sample(optax.huber_loss(q, targets))
        else:
            per_sample = acting_lib.per_sample(0.5 * jnp.square(targets - q))
        loss = jnp.mean(batch["weights"] * per_sample)
        return loss, {"td_loss": loss, "q_mean": jnp.mean(q), "td_error": jnp.mean(jnp.abs(targets - q))}

    def train(self, state: acting_lib.ReplayState, buffer, hp: QHyperparams, key: jax.Array):
        """The update's G gradient steps: ((params, target_params, opt_state), buffer with new priorities,
        metrics averaged over the steps)."""
        s = self.settings
        optimizer = s.optimizer(hp, state.update_step)

        def gradient(carry, xs):
            params, target_params, opt_state, buffer = carry
            key, count = xs
            batch, sample = acting_lib.sample_batch(s, buffer, key, hp.priority_alpha, hp.priority_beta)
            batch["target_params"] = target_params
            if s.replay.prioritised:
                q, targets = self.td(params, target_params, batch["items"], hp)
                buffer = acting_lib.reprioritised(buffer, sample, jnp.abs(targets - q))
            trained, opt_state, aux = engine.gradient_step(self.replay_loss, optimizer, trainable(params), opt_state,
                                                           batch, hp)
            params = {**params, **trained}
            target_params = acting_lib.moved_target(s, params, target_params, hp.tau, count)
            return (params, target_params, opt_state, buffer), aux

        carry = (state.params, state.target_params, state.opt_state, buffer)
        xs = (jax.random.split(key, s.replay.gradient_steps), acting_lib.gradient_counts(s, state.update_step))
        (*learned, buffer), aux = jax.lax.scan(gradient, carry, xs)
        return tuple(learned), buffer, jax.tree.map(jnp.mean, aux)

    # ----------------------------------------------------------------------------------------------
    # Learning from each rollout (PQN)

    def rollout_loss(self, params, batch: dict, hp: QHyperparams):
        """Squared error of Q(obs, action) [B, A] (the team's [B] with a mixer) against the lambda-targets."""
        q = jnp.take_along_axis(self.q_values(params, batch["obs"]), batch["action"][..., None], axis=-1)[..., 0]
        q = self.mix(params, q, None)
        loss = 0.5 * jnp.mean(jnp.square(q - batch["targets"]))
        return loss, {"td_loss": loss, "q_mean": jnp.mean(q), "td_error": jnp.mean(jnp.abs(q - batch["targets"]))}

    def rollout_update(self, state: PQNState, hp: QHyperparams):
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        acting, steps, episode = acting_lib.rollout(self, state.params, state.acting, hp, rollout_key,
                                                    state.update_step)
        next_q = self.q_values(state.params, steps["next_obs"], steps.get("next_mask"))  # steps [n, T, ...]
        next_values = self.mix(state.params, bootstrap_values(next_q), None)  # [n, T(, A)]
        targets = sequence_targets(team_reward(steps["reward"], self.rules.mixer), next_values, steps["terminated"],
                                   steps["done"], hp.gamma, hp.q_lambda)  # [n, T(, A)]
        units = {"obs": steps["obs"], "action": steps["action"], "targets": targets}  # [n, T, ...]: a step per unit
        optimizer = self.settings.optimizer(hp, state.update_step)
        params, opt_state, aux = engine.optimise(self.rollout_loss, optimizer, trainable(state.params),
                                                 state.opt_state, units, hp, epoch_key, self.rules.num_epochs,
                                                 self.rules.num_minibatches)
        metrics = {**jax.tree.map(jnp.mean, aux), "epsilon": self.epsilon(hp, state.update_step), **episode}
        return PQNState({**state.params, **params}, opt_state, acting, key, state.update_step + 1), metrics

    def update(self, state: acting_lib.ReplayState | PQNState, hp: QHyperparams):
        if self.settings.replay is None:
            return self.rollout_update(state, hp)
        r = self.settings.replay  # a gradient step learns from each sequence's first step, or all past the burn-in
        learned_steps = 1 if self.rules.targets == "n_step" else r.sequence_length - self.rules.burn_in
        epsilon = {"epsilon": self.epsilon(hp, state.update_step)}
        return acting_lib.replay_update(self, state, hp, learned_steps, epsilon)


# -------------------------------------------------------------------------------------------------
# From a config


def q_config(name: str) -> ConfigDict:
    """Every key the Q-learner `name` reads, at its defaults: DQN and PQN on CartPole; IQL, VDN, QMIX (with recurrent
    agents, PyMARL's sizes, and JaxMARL's SMAX settings) and PQN-VDN on SMAX 3m."""
    mixer, targets, sequence_key = VARIANTS[name]
    config = off_policy_config(name)
    config.update(knobs.defaults(HIDDEN_SIZES, ACTIVATION, DUELING, LAYER_NORM, EPSILON_START, EPSILON_END,
                                 EPSILON_FRACTION))
    config.network.activation = "relu"
    config.optim.update({"max_grad_norm": 10.0, "schedule": "constant"})
    # XLA:CPU runs the layer norms' gradient sums as single-threaded YNNPACK fusions (about 0.4 ms each for
    # [8 runs, 128, 64] -> [8, 64]); XLA's own kernels: PQN 1.45x, DQN 1.34x faster on CartPole (2026-11-25).
    # (SAC's 256-wide products are faster with YNNPACK, so this is the Q-learners' default, not the engine's.)
    config.xla_options = config_lib.WITHOUT_YNNPACK
    if name not in ("dqn", "pqn"):
        config.env.name, config.env.kwargs = "smax", ConfigDict({"scenario": "3m"})
    if sequence_key is None:  # PQN
        config.num_envs, config.num_steps = 32, 64
        config.network.layer_norm = True
        config.returns.q_lambda = 0.65
        config.explore.fraction = 0.2
        config.optim.update({"learning_rate": 1e-4, "num_epochs": 4, "num_minibatches": 16, "schedule": "linear"})
        return config
    config.replay = replay_config()
    config.target = ConfigDict({"every": 250, "tau": 1.0})  # 1.0: a copy
    knobs.fill(config, *([N_STEP] if targets == "n_step" else []), DOUBLE, TD_LOSS)
    config.optim.learning_rate = 2.5e-4
    if targets == "n_step":
        return config
    config.num_envs, config.num_steps = 16, 128
    # kind "gru": fc_size -> GRU rnn_size -> fc_size -> Q; "mlp": hidden_sizes. agent_id: the agents' one-hot
    # ids appended to their observations ("actor") or not ("none")
    config.network = ConfigDict({"kind": "gru", "fc_size": 64, "rnn_size": 64, "hidden_sizes": (64, 64),
                                 "activation": "relu", "agent_id": "actor", "layer_norm": False})
    knobs.fill(config, *MIXER_KNOBS, SEQUENCE_LENGTH, BURN_IN)
    config.replay.update({"buffer_size": 327_680, "batch_size": 32, "gradient_steps": 8, "learning_starts": 10_240})
    config.returns.update({"q_lambda": 0.0, "reward_scale": 10.0})
    config.target.every = 80
    config.loss.td = "squared"
    config.explore.update({"epsilon_start": 1.0, "epsilon_end": 0.05, "fraction": 0.1})
    config.optim.update({"learning_rate": 5e-4, "max_grad_norm": 10.0})
    config.total_steps = 2_000_000
    return config


def q_network(config: ConfigDict, env) -> QNetwork | RecurrentQNetwork:
    n, space = config.network, env.action_space()
    if not hasattr(space, "n"):
        raise ValueError(f"config.algorithm={config.algorithm!r} needs discrete actions; {config.env.name!r} "
                         f"has {space!r}")
    if n.get("kind") == "gru":
        return RecurrentQNetwork(space.n, n.fc_size, n.rnn_size, n.activation)
    return QNetwork(space.n, tuple(n.hidden_sizes), n.activation, n.get("dueling", False), n.layer_norm)


def build_q_learning(config: ConfigDict, mesh) -> engine.Algorithm:
    mixer, targets, sequence_key = VARIANTS[config.algorithm]
    env, eval_max_steps = make_env(config)
    # (the global state is stored with every step when the mixer reads it)
    policy = EnvPolicy(env, q_network(config, env), config.network.get("agent_id", "both"),
                       "global_state" if mixer == "qmix" else "obs", eval_max_steps)
    # (the keys a variant's config lacks read as their defaults)
    rules = knobs.read(QRules, knobs.fill(config.copy_and_resolve_references(), QRules), mixer=mixer, targets=targets)
    settings = off_policy_settings(config, rules, sequence_key)
    on_mesh = EnvOnMesh.of(policy, settings.num_envs, settings.reset_ratio, mesh)
    if settings.replay is None:
        check_minibatch_split(settings.num_envs, settings.num_steps, rules.num_minibatches, 1, False, on_mesh.mesh)
    m = config.get("mixer")
    mixing = QMixer(m.embed_size, m.hypernet_size, m.init_scale) if mixer == "qmix" else None
    learner = QLearner(policy, on_mesh, mixing, settings)
    return off_policy_algorithm(learner, learner.state_specs)


def check_q_config(config: ConfigDict) -> None:
    sequence_key = VARIANTS[config.algorithm][2]
    check_off_policy_config(config, sequence_key)
    batch = config.num_envs * config.num_steps
    if sequence_key is None and batch % config.optim.num_minibatches:
        raise ValueError(f"num_envs * num_steps = {config.num_envs} * {config.num_steps} = {batch} is not "
                         f"divisible by optim.num_minibatches = {config.optim.num_minibatches}")
    r = config.get("replay")
    if sequence_key == SEQUENCE_LENGTH.key and not 0 <= r.burn_in < r.sequence_length:
        raise ValueError(f"config.replay.burn_in = {r.burn_in} must lie in [0, replay.sequence_length = "
                         f"{r.sequence_length}): the loss needs at least one step")


def traced_keys_held(config: ConfigDict) -> dict:
    """The hyperparameters a variant's config holds: field -> key (`Recipe.keys`)."""
    held = config_lib.flat_keys(config_lib.to_dict(config))
    return {field: key for field, key in knobs.traced_keys(QHyperparams).items() if key in held}


for _name in VARIANTS:
    _defaults = functools.partial(q_config, _name)
    register(_name, Recipe(build_q_learning, QHyperparams, traced_keys_held(_defaults()), check=check_q_config,
                           defaults=_defaults))
