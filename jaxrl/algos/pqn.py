"""PQN, parallel Q-learning (Gallici et al., 2024, "Simplifying Deep Temporal Difference Learning"): many
vectorised envs instead of a replay buffer, a layer-normalised Q-network instead of a target network, and
Q(lambda) targets over each rollout.

One update, for one run on this device's n envs (inside `engine.compile_chunk`):

    rollout: T steps of every env, epsilon-greedy (`QLearner.rollout`)
      -> targets: `advantages.lambda_targets` over the rollout, bootstrapped from max_a Q(next obs, a) of the
         network as it was before the update (at time limits from the final observation)
      -> epochs x minibatches of the squared error between Q(obs, action) and the targets (`engine.optimise`)

PQN-VDN (`pqn_vdn`, for cooperative multi-agent envs): the same with the team's values, the sum of the agents'
action values (VDN), learning from the team reward (the agents' mean reward); the agents are feed-forward.

Shapes: n envs, A agents, K actions, T steps per update.
"""

from __future__ import annotations

from typing import Any

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

from jaxrl.algos.env_policy import trainable
from jaxrl.algos.env_setup import EnvSettings, check_minibatch_split, env_optimizer, make_env
from jaxrl import knobs
from jaxrl.algos.off_policy import GAMMA, REWARD_SCALE, Acting, check_off_policy_config, off_policy_settings
from jaxrl.algos.q_learning import (EPSILON_END, EPSILON_FRACTION, EPSILON_START, Q_LAMBDA, QLearner,
                                    bootstrap_values, q_config, q_network, sequence_targets,
                                    team_reward, team_values)
from jaxrl.algos.registry import Recipe, register
from jaxrl.engine import optimise
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS


@struct.dataclass
class PQNHyperparams:
    """Traced numbers: one compiled program serves a sweep over them."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    gamma: float = GAMMA.field()
    reward_scale: float = REWARD_SCALE.field()
    q_lambda: float = Q_LAMBDA.field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()
    epsilon_start: float = EPSILON_START.field()
    epsilon_end: float = EPSILON_END.field()
    epsilon_fraction: float = EPSILON_FRACTION.field()


@struct.dataclass
class PQNState:
    """Everything needed to continue training exactly. Leaves carry a leading run axis [R, ...]."""

    params: Any
    opt_state: Any
    acting: Acting  # [R, N, ...]
    key: jax.Array  # [R, 2]
    update_step: jax.Array  # [R] int32


@dataclasses.dataclass(frozen=True)
class PQNSettings(EnvSettings):
    mixer: str = "none"  # "sum": the team's value is the sum of the agents' (PQN-VDN)


class PQN(QLearner):
    """PQN and PQN-VDN for single- and multi-agent envs with discrete actions (see the module's docstring)."""

    settings: PQNSettings

    def __init__(self, env, network, settings: PQNSettings, mesh=None, eval_max_steps: int = 1000):
        super().__init__(env, network, settings, mesh, eval_max_steps)
        check_minibatch_split(settings, 1, False, self.mesh)

    def init(self, key: jax.Array) -> PQNState:
        param_key, env_key, state_key = jax.random.split(key, 3)
        acting = self.start_acting(env_key)
        params = self.policy.init_params(param_key, self.env, acting.obs, acting.env_state)
        optimizer = env_optimizer(self.settings, PQNHyperparams(), jnp.int32(0))
        return PQNState(params, optimizer.init(trainable(params)), acting, state_key, jnp.int32(0))

    def chunk_specs(self, state: PQNState) -> PQNState:
        split = P(RUN_AXIS, DATA_AXIS)
        return PQNState(params=RUNS, opt_state=RUNS, acting=split, key=RUNS, update_step=RUNS)

    def _loss(self, params, batch: dict, hp: PQNHyperparams):
        """Squared error of Q(obs, action) [B, A] (the team's [B] with a mixer) against the lambda-targets."""
        q = jnp.take_along_axis(self.q_values(params, batch["obs"]), batch["action"][..., None], axis=-1)[..., 0]
        q = team_values(q, self.settings.mixer)
        loss = 0.5 * jnp.mean(jnp.square(q - batch["targets"]))
        return loss, {"td_loss": loss, "q_mean": jnp.mean(q), "td_error": jnp.mean(jnp.abs(q - batch["targets"]))}

    def _update(self, state: PQNState, hp: PQNHyperparams):
        s = self.settings
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        acting, steps, episode = self.rollout(state.params, state.acting, hp, rollout_key,
                                              state.update_step)  # steps [n, T, ...]
        mixer = self.settings.mixer
        next_values = team_values(bootstrap_values(self.q_values(state.params, steps["next_obs"],
                                                                 steps.get("next_mask"))), mixer)  # [n, T(, A)]
        targets = sequence_targets(team_reward(steps["reward"], mixer), next_values, steps["terminated"],
                                   steps["done"], hp.gamma, hp.q_lambda)  # [n, T(, A)]
        units = {"obs": steps["obs"], "action": steps["action"], "targets": targets}  # [n, T, ...]: a step per unit
        optimizer = env_optimizer(s, hp, state.update_step)
        params, opt_state, aux = optimise(self._loss, optimizer, trainable(state.params), state.opt_state, units, hp,
                                          epoch_key, s.num_epochs, s.num_minibatches)
        metrics = {**jax.tree.map(jnp.mean, aux), "epsilon": self.epsilon(hp, state.update_step)}
        metrics.update(jax.lax.psum(episode, DATA_AXIS))
        state = PQNState({**state.params, **params}, opt_state, acting, key, state.update_step + 1)
        return state, metrics


# -------------------------------------------------------------------------------------------------
# From a config


MIXERS = {"pqn": "none", "pqn_vdn": "sum"}  # algorithm name -> how agents' values make the learned ones


def pqn_config(name: str = "pqn") -> ConfigDict:
    """PQN on CartPole; PQN-VDN (`name` "pqn_vdn") on SMAX 3m."""
    config = q_config(name)
    if name == "pqn_vdn":
        config.env.name, config.env.kwargs = "smax", ConfigDict({"scenario": "3m"})
    config.num_envs, config.num_steps = 32, 64
    config.network.layer_norm = True
    config.returns.q_lambda = 0.65
    config.explore.fraction = 0.2
    config.optim.update({"learning_rate": 1e-4, "num_epochs": 4, "num_minibatches": 16, "schedule": "linear"})
    return config


def build_pqn(config: ConfigDict, mesh) -> PQN:
    env, eval_max_steps = make_env(config)
    settings = PQNSettings(**off_policy_settings(config), num_epochs=config.optim.num_epochs,
                           num_minibatches=config.optim.num_minibatches, mixer=MIXERS[config.algorithm])
    return PQN(env, q_network(config, env), settings, mesh, eval_max_steps)


def check_pqn_config(config: ConfigDict) -> None:
    check_off_policy_config(config)
    batch = config.num_envs * config.num_steps
    if batch % config.optim.num_minibatches:
        raise ValueError(f"num_envs * num_steps = {config.num_envs} * {config.num_steps} = {batch} is not "
                         f"divisible by optim.num_minibatches = {config.optim.num_minibatches}")


for _name in MIXERS:
    register(_name, Recipe(build_pqn, PQNHyperparams, check=check_pqn_config,
                           defaults=functools.partial(pqn_config, _name)))
