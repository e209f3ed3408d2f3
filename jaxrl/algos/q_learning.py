"""What Q-learners share: a Q-network acting epsilon-greedily (`off_policy.OffPolicyLearner` runs the envs; DQN
learns from a replay buffer, PQN from each rollout directly), and the config keys they all read.

The Q-network (`networks.QNetwork`) has the actor-critic calling convention, so `EnvPolicy` serves it (greedy
evaluation is argmax Q). In a multi-agent env every agent acts with the shared network (independent
Q-learning). Shapes: A agents, K actions, d observation size.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

import envs
from jaxrl import config as config_lib, knobs
from jaxrl.advantages import lambda_targets
from jaxrl.algos.env_policy import PolicyStep
from jaxrl.algos.env_setup import ACTIVATION, HIDDEN_SIZES, LAYER_NORM, EnvSettings
from jaxrl.algos.off_policy import OffPolicyLearner, off_policy_config
from jaxrl.knobs import Knob
from jaxrl.networks import QNetwork

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


def team_values(agent_values: jax.Array, mixer: str) -> jax.Array:
    """[..., A] -> what a learner without a mixing network learns: the agents' own values (mixer "none") or the
    team's, their sum [...] ("sum", VDN)."""
    return agent_values.sum(-1) if mixer == "sum" else agent_values


def team_reward(reward: jax.Array, mixer: str) -> jax.Array:
    """The rewards [..., A] the targets use: the agents' own without a mixer, else the team's [...], the agents'
    mean (SMAX pays each the team's)."""
    return reward if mixer == "none" else reward.mean(-1)


class QLearner(OffPolicyLearner):
    """Acting epsilon-greedily on a Q-network. Hyperparameters carry epsilon_start, epsilon_end and
    epsilon_fraction."""

    def __init__(self, env: envs.Environment, network: QNetwork, settings: EnvSettings, mesh=None,
                 eval_max_steps: int = 1000, **policy_kwargs):
        super().__init__(env, network, settings, mesh, eval_max_steps, **policy_kwargs)
        if not self.discrete:
            raise ValueError(f"Q-learning needs discrete actions; {env!r} has {env.action_space()!r}")

    def epsilon(self, hp: Any, update_step: jax.Array) -> jax.Array:
        """Exploration rate at `update_step`: linear from epsilon_start to epsilon_end over epsilon_fraction of
        the run's updates, then constant."""
        span = jnp.maximum(hp.epsilon_fraction * self.settings.num_updates, 1.0)
        progress = jnp.clip(update_step / span, 0.0, 1.0)
        return hp.epsilon_start + progress * (hp.epsilon_end - hp.epsilon_start)

    def exploration_metrics(self, hp: Any, update_step: jax.Array) -> dict:
        return {"epsilon": self.epsilon(hp, update_step)}

    def explore(self, key: jax.Array, q: jax.Array, mask: jax.Array | None, epsilon) -> jax.Array:
        """Epsilon-greedy actions [A] from masked Q-values [A, K]: with probability epsilon a legal action
        uniformly at random, else the greedy one."""
        coin_key, random_key = jax.random.split(key)
        legal = jnp.ones(q.shape, bool) if mask is None else mask
        random_action = jax.random.categorical(random_key, jnp.where(legal, 0.0, -jnp.inf))
        explore = jax.random.uniform(coin_key, q.shape[:-1]) < epsilon
        return jnp.where(explore, random_action, jnp.argmax(q, axis=-1)).astype(jnp.int32)

    def act(self, key: jax.Array, policy: PolicyStep, hp: Any, update_step: jax.Array):
        action = self.explore(key, policy.policy_out, policy.mask, self.epsilon(hp, update_step))
        return action, action

    def q_values(self, params, obs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """[..., A, K] masked Q-values of observations [..., A, d]."""
        actor_in = self.policy.actor_inputs(obs)
        return self.policy.dist.with_mask(self.network.apply(params, (), actor_in, None)[1], mask)


def q_config(name: str) -> ConfigDict:
    """The keys every Q-learner reads: env, network, gamma, exploration; the learner adds its own."""
    config = off_policy_config(name)
    config.update(knobs.defaults(HIDDEN_SIZES, ACTIVATION, DUELING, LAYER_NORM, EPSILON_START, EPSILON_END,
                                 EPSILON_FRACTION))
    config.network.activation = "relu"
    config.optim.update({"max_grad_norm": 10.0, "schedule": "constant"})
    # XLA:CPU runs the layer norms' gradient sums as single-threaded YNNPACK fusions (about 0.4 ms each for
    # [8 runs, 128, 64] -> [8, 64]); XLA's own kernels: PQN 1.45x, DQN 1.34x faster on CartPole (2026-11-25).
    # (SAC's 256-wide products are faster with YNNPACK, so this is the Q-learners' default, not the engine's;
    # the value-decomposition learners inherit it, as the SMAX experiments already had it.)
    config.xla_options = config_lib.WITHOUT_YNNPACK
    return config


def q_network(config: ConfigDict, env: envs.Environment) -> QNetwork:
    n, space = config.network, env.action_space()
    if not hasattr(space, "n"):
        raise ValueError(f"config.algorithm={config.algorithm!r} needs discrete actions; {config.env.name!r} "
                         f"has {space!r}")
    return QNetwork(space.n, tuple(n.hidden_sizes), n.activation, n.dueling, n.layer_norm)


