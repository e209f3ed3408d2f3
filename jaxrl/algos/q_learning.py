"""What Q-learners share: a Q-network acting epsilon-greedily in auto-resetting envs, on a device mesh, for many
runs at once (DQN learns from a replay buffer, PQN from each rollout directly).

The Q-network (`networks.QNetwork`) has the actor-critic calling convention, so `EnvPolicy` serves it: what an
agent sees, action masks, greedy evaluation (argmax Q), loaded actors. Envs are seen with an agent axis: in a
multi-agent env every agent acts with the shared network (independent Q-learning). Shapes: n envs on this
device, A agents, K actions, T steps per update, d observation size.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from ml_collections import ConfigDict

import envs
from jaxrl import config as config_lib, mesh as mesh_lib
from jaxrl.algos.env_policy import ActsThroughPolicy, EnvPolicy
from jaxrl.algos.env_setup import EnvSettings
from jaxrl.engine import compile_chunk, seed_keys
from jaxrl.jitting import jit_method
from jaxrl.mesh import DATA_AXIS
from jaxrl.networks import QNetwork


def bootstrap_values(target_q: jax.Array, online_q: jax.Array | None = None) -> jax.Array:
    """The value of next observations from Q-values [..., K]: the target network's maximum, or with `online_q`
    (double Q-learning, van Hasselt et al. 2016) the target network's value of the online network's argmax."""
    if online_q is None:
        return jnp.max(target_q, axis=-1)
    return jnp.take_along_axis(target_q, jnp.argmax(online_q, axis=-1)[..., None], axis=-1)[..., 0]


class QLearner(ActsThroughPolicy):
    """The acting half of a Q-learner. A subclass supplies `init(key)` (one run's state, with `params`,
    `env_state`, `obs`, `update_step`), `_state_specs(state)` and `_update(state, hp)`; hyperparameters carry
    epsilon_start, epsilon_end and epsilon_fraction."""

    def __init__(self, env: envs.Environment, network: QNetwork, settings: EnvSettings, mesh=None,
                 eval_max_steps: int = 1000):
        self.policy = EnvPolicy(env, network, "both", "obs", eval_max_steps)
        if not hasattr(self.policy.dist, "num_actions"):
            raise ValueError(f"Q-learning needs discrete actions; {env!r} has {env.action_space()!r}")
        self.agent_env, self.network, self.num_agents = self.policy.agent_env, network, self.policy.num_agents
        self.env = envs.EpisodeStatistics(envs.AutoReset(self.agent_env, settings.reset_ratio))
        self.settings = settings
        self.mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        mesh_lib.check_divisible("num_envs", settings.num_envs, self.mesh)
        self.num_local_envs = settings.num_envs // self.mesh.shape[DATA_AXIS]
        self._chunk_fn = None
        self.compile_seconds = 0.0

    def state_shardings(self, state: Any) -> Any:
        return jax.tree.map(lambda spec, _: NamedSharding(self.mesh, spec), self._state_specs(state), state,
                            is_leaf=lambda x: isinstance(x, P))

    @jit_method
    def _init_runs(self, keys: jax.Array) -> Any:
        return jax.lax.map(self.init, keys)

    def init_seeds(self, seed: int, num_seeds: int, num_settings: int = 1) -> Any:
        keys = seed_keys(seed, num_seeds, num_settings)
        mesh_lib.check_runs(len(keys), self.mesh)
        state = self._init_runs(keys)
        return jax.device_put(state, self.state_shardings(state))

    def epsilon(self, hp: Any, update_step: jax.Array) -> jax.Array:
        """Exploration rate at `update_step`: linear from epsilon_start to epsilon_end over epsilon_fraction of
        the run's updates, then constant."""
        span = jnp.maximum(hp.epsilon_fraction * self.settings.num_updates, 1.0)
        progress = jnp.clip(update_step / span, 0.0, 1.0)
        return hp.epsilon_start + progress * (hp.epsilon_end - hp.epsilon_start)

    def explore(self, key: jax.Array, q: jax.Array, mask: jax.Array | None, epsilon) -> jax.Array:
        """Epsilon-greedy actions [n, A] from masked Q-values [n, A, K]: with probability epsilon a legal action
        uniformly at random, else the greedy one."""
        coin_key, random_key = jax.random.split(key)
        legal = jnp.ones(q.shape, bool) if mask is None else mask
        random_action = jax.random.categorical(random_key, jnp.where(legal, 0.0, -jnp.inf))
        explore = jax.random.uniform(coin_key, q.shape[:-1]) < epsilon
        return jnp.where(explore, random_action, jnp.argmax(q, axis=-1)).astype(jnp.int32)

    def rollout(self, params, state: Any, hp: Any, key: jax.Array):
        """T steps of this device's n envs. Returns (env_state, obs after, steps [n, T, ...] to store, episode
        sums)."""
        s = self.settings
        step_keys = jax.random.split(key, s.num_steps)
        env_keys = mesh_lib.local_share(jax.vmap(lambda k: jax.random.split(k, s.num_envs))(step_keys), axis=1)
        act_keys = jax.vmap(lambda k: mesh_lib.per_item_keys(jax.random.fold_in(k, 1), self.num_local_envs))(step_keys)
        epsilon = self.epsilon(hp, state.update_step)
        first = jnp.zeros((self.num_local_envs,), bool)

        def step(carry, xs):
            env_state, obs = carry
            env_key, act_key = xs
            policy = self.policy.step(params, self.env, env_state, obs, (), first)
            action = jax.vmap(self.explore, (0, 0, 0 if policy.mask is not None else None, None))(
                act_key, policy.policy_out, policy.mask, epsilon)
            next_obs, env_state, reward, done, info = self.env.batch_step(env_key, env_state, action)
            ended = info["returned_episode"]
            stored = {"obs": obs, "action": action, "reward": reward, "next_obs": info["final_obs"],
                      "terminated": ended & ~info["truncated"], "done": ended}
            if self.agent_env.has_action_masks:
                stored["next_mask"] = jax.vmap(self.agent_env.avail_actions)(info["final_state"])
            episode = {"episode_return_sum": jnp.where(ended, info["episode_return"].mean(-1), 0.0),
                       "episode_length_sum": jnp.where(ended, info["episode_length"], 0), "episodes": ended}
            if self.policy.reports_wins:
                episode["win_rate_sum"] = ended & info["won"]
            return (env_state, next_obs), (stored, episode)

        (env_state, obs), (steps, episode) = jax.lax.scan(step, (state.env_state, state.obs), (env_keys, act_keys))
        return env_state, obs, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), jax.tree.map(jnp.sum, episode)

    def q_values(self, params, obs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """[..., A, K] masked Q-values of observations [..., A, d]."""
        actor_in = self.policy.inputs(obs, None)[0]
        return self.policy.dist.with_mask(self.network.apply(params, (), actor_in, None)[1], mask)

    def run_chunk(self, state: Any, hp: Any, num_updates: int):
        num_updates = jnp.int32(num_updates)
        hp = mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh)
        if self._chunk_fn is None:
            self._chunk_fn, self.compile_seconds = compile_chunk(
                self._update, state, hp, num_updates, self.mesh, self._state_specs(state),
                xla_options=self.settings.xla_options, check_vma=self.agent_env.supports_vma_checks)
        return self._chunk_fn(state, hp, num_updates)




def q_config(name: str) -> ConfigDict:
    """The keys every Q-learner reads: env, network, gamma, exploration; the learner adds its own."""
    config = config_lib.base_config()
    config.algorithm = name
    config.update(ConfigDict({
        "num_envs": 4,  # parallel environments per seed, split over devices
        "num_steps": 4,  # env steps per env per update
        "env": {"name": "CartPole-v1", "kwargs": ConfigDict(), "reset_ratio": 1},
        # dueling: Q = V + A - mean(A); layer_norm: LayerNorm before each hidden activation
        "network": {"hidden_sizes": (64, 64), "activation": "relu", "dueling": False, "layer_norm": False},
        "returns": {"gamma": 0.99},
        # epsilon falls linearly from epsilon_start to epsilon_end over `fraction` of the run's updates
        "explore": {"epsilon_start": 1.0, "epsilon_end": 0.05, "fraction": 0.5},
    }))
    config.optim.update({"max_grad_norm": 10.0, "schedule": "constant"})
    return config


def q_network(config: ConfigDict, env: envs.Environment) -> QNetwork:
    n, space = config.network, env.action_space()
    if not hasattr(space, "n"):
        raise ValueError(f"config.algorithm={config.algorithm!r} needs discrete actions; {config.env.name!r} "
                         f"has {space!r}")
    return QNetwork(space.n, tuple(n.hidden_sizes), n.activation, n.dueling, n.layer_norm)


def q_settings(config: ConfigDict) -> dict:
    """EnvSettings fields every Q-learner reads."""
    o = config.optim
    return dict(num_envs=config.num_envs, num_steps=config.num_steps,
                num_updates=config.total_steps // (config.num_envs * config.num_steps), schedule=o.schedule,
                warmup_updates=o.warmup_updates, adam_eps=o.adam_eps, weight_decay=o.weight_decay > 0,
                grad_clip=o.grad_clip, xla_options=config_lib.xla_options(config), reset_ratio=config.env.reset_ratio)


def check_q_config(config: ConfigDict) -> None:
    if config.env.name not in envs.registered():
        raise ValueError(f"unknown config.env.name {config.env.name!r}; known environments: "
                         f"{', '.join(envs.registered())}")
    config_lib.positive(config, "num_envs", "num_steps", "env.reset_ratio")
    batch = config.num_envs * config.num_steps
    if config.total_steps < batch:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update (num_envs * num_steps = {batch})")
    for key in ("returns.gamma", "explore.epsilon_start", "explore.epsilon_end", "explore.fraction"):
        config_lib.unit_interval(config_lib.get_value(config, key), key)


EXPLORE_KEYS = {"epsilon_start": "explore.epsilon_start", "epsilon_end": "explore.epsilon_end",
                "epsilon_fraction": "explore.fraction"}
