"""Deep Q-learning from a replay buffer (DQN; Mnih et al., 2015), with double Q-learning, dueling heads,
n-step returns and prioritised replay as options, written for a device mesh and many seeds at once.

One update, for one run on this device's n envs (inside `engine.compile_chunk`):

    rollout: T steps of every env, epsilon-greedy on the online network (`EnvPolicy.step`)
      -> `replay.add` (the steps go into each env's row of the run's buffer)
      -> G gradient steps, each on `batch_size / num_envs` sequences of `n_step` steps per env
         (`replay.sample`), target = `advantages.lambda_targets` with lam = 1 (n-step, truncated at episode
         ends, bootstrapped from the target network at time limits), Huber or squared TD loss weighted by the
         importance weights, new priorities |TD|; the target network moves towards the online one every
         `target.every` gradient steps by `target.tau` (1: a copy)
    before `learning_starts` env steps (per run) the gradient steps leave everything unchanged.

Envs are seen with an agent axis (`envs.AgentAxis`), so one agent's Q-network serves every agent of a
multi-agent env (independent Q-learning with shared parameters; masks restrict actions). Shapes: n envs, A
agents, K actions, T steps per update, k sequences per env, L = n_step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from ml_collections import ConfigDict

from jaxrl import knobs, replay
from jaxrl.algos.env_policy import trainable
from jaxrl.algos.env_setup import env_optimizer, make_env
from jaxrl.algos.off_policy import (GAMMA, PRIORITY_ALPHA, PRIORITY_BETA, REWARD_SCALE, TAU, ReplayLearner,
                                    ReplaySettings, ReplayState, check_off_policy_config, check_replay_config,
                                    off_policy_settings, replay_config)
from jaxrl.algos.q_learning import (EPSILON_END, EPSILON_FRACTION, EPSILON_START, QLearner, bootstrap_values,
                                    q_config, q_network, sequence_targets)
from jaxrl.algos.registry import Recipe, register
from jaxrl.engine import gradient_step
from jaxrl.knobs import knob

TD_LOSSES = ("huber", "squared")


def per_sequence(x: jax.Array) -> jax.Array:
    """[B, ...] -> [B]: the mean over each sampled sequence's steps and agents."""
    return x.reshape(x.shape[0], -1).mean(-1)


@struct.dataclass
class DQNHyperparams:
    """Traced numbers: one compiled program serves a sweep over them."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    gamma: float = GAMMA.field()
    reward_scale: float = REWARD_SCALE.field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()
    tau: float = TAU.field()  # every `target_every` gradient steps
    epsilon_start: float = EPSILON_START.field()
    epsilon_end: float = EPSILON_END.field()
    epsilon_fraction: float = EPSILON_FRACTION.field()
    priority_alpha: float = PRIORITY_ALPHA.field()
    priority_beta: float = PRIORITY_BETA.field()


@dataclasses.dataclass(frozen=True)
class DQNSettings(ReplaySettings):
    sequence_length: int = knob("returns.n_step", 1, "n-step returns: the target sums n rewards before it "
                                "bootstraps", minimum=1)
    double: bool = knob("loss.double", True, "double Q-learning: the target network values the online "
                        "network's greedy action")
    td_loss: str = knob("loss.td", "huber", "the TD error's loss", choices=TD_LOSSES)


class DQN(QLearner, ReplayLearner):
    """DQN for single- and multi-agent envs with discrete actions (see the module's docstring)."""

    settings: DQNSettings

    def init_learned(self, key: jax.Array, obs: jax.Array, env_state: Any) -> tuple:
        params = self.policy.init_params(key, self.env, obs, env_state)
        optimizer = env_optimizer(self.settings, DQNHyperparams(), jnp.int32(0))
        return params, params, optimizer.init(trainable(params))

    # ----------------------------------------------------------------------------------------------
    # One update of one run on this device's envs

    def _td(self, params, target_params, seq: dict, hp: DQNHyperparams):
        """(Q [B, A] of each sequence's first step and action, its n-step target [B, A]) for sequences [B, L, ...]."""
        mask = seq.get("next_mask")
        online_q = self.q_values(params, seq["next_obs"], mask) if self.settings.double else None
        next_values = jax.lax.stop_gradient(bootstrap_values(self.q_values(target_params, seq["next_obs"], mask),
                                                             online_q))  # [B, L, A]
        targets = sequence_targets(seq["reward"], next_values, seq["terminated"], seq["done"], hp.gamma, 1.0)[:, 0]
        q = jnp.take_along_axis(self.q_values(params, seq["obs"][:, 0]), seq["action"][:, 0, :, None], axis=-1)
        return q[..., 0], targets

    def _loss(self, params, batch: dict, hp: DQNHyperparams):
        """Importance-weighted TD loss of a batch of sequences (`_td`: q and targets [B, ...])."""
        q, targets = self._td(params, batch["target_params"], batch["items"], hp)
        if self.settings.td_loss == "huber":
            per_sample = per_sequence(optax.huber_loss(q, targets))
        else:
            per_sample = per_sequence(0.5 * jnp.square(targets - q))
        loss = jnp.mean(batch["weights"] * per_sample)
        return loss, {"td_loss": loss, "q_mean": jnp.mean(q), "td_error": jnp.mean(jnp.abs(targets - q))}

    def _train(self, state: ReplayState, buffer: replay.Buffer, hp: DQNHyperparams, key: jax.Array):
        optimizer = env_optimizer(self.settings, hp, state.update_step)

        def gradient(carry, xs):
            params, target_params, opt_state, buffer = carry
            key, count = xs
            batch, sample = self.sample_batch(buffer, key, hp.priority_alpha, hp.priority_beta)
            batch["target_params"] = target_params
            if self.settings.prioritised:  # this device's |TD| before the step (the loss's own are averaged over devices)
                q, targets = self._td(params, target_params, batch["items"], hp)
                priorities = per_sequence(jnp.abs(targets - q)).reshape(sample.columns.shape)
                buffer = replay.update_priorities(buffer, sample.columns, priorities)
            trained, opt_state, aux = gradient_step(self._loss, optimizer, trainable(params), opt_state, batch, hp)
            params = {**params, **trained}
            target_params = optax.incremental_update(params, target_params, jnp.where(self.target_due(count), hp.tau, 0.0))
            return (params, target_params, opt_state, buffer), aux

        carry = (state.params, state.target_params, state.opt_state, buffer)
        xs = (jax.random.split(key, self.settings.gradient_steps), self.gradient_counts(state.update_step))
        (*learned, buffer), aux = jax.lax.scan(gradient, carry, xs)
        return tuple(learned), buffer, jax.tree.map(jnp.mean, aux)


# -------------------------------------------------------------------------------------------------
# From a config


def dqn_config() -> ConfigDict:
    config = q_config("dqn")
    config.replay = replay_config()
    config.target = ConfigDict({"every": 250, "tau": 1.0})  # 1.0: a copy
    knobs.fill(config, DQNHyperparams, DQNSettings)
    config.optim.learning_rate = 2.5e-4
    return config


def build_dqn(config: ConfigDict, mesh) -> DQN:
    env, eval_max_steps = make_env(config)
    settings = knobs.read(DQNSettings, config, **off_policy_settings(config))
    return DQN(env, q_network(config, env), settings, mesh, eval_max_steps)


def check_dqn_config(config: ConfigDict) -> None:
    check_off_policy_config(config)
    check_replay_config(config, config.returns.n_step)


register("dqn", Recipe(build_dqn, DQNHyperparams, check=check_dqn_config, defaults=dqn_config))
