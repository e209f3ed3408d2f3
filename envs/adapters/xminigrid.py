"""XLand-MiniGrid environments (`xminigrid`: MiniGrid's grid worlds in JAX) in the `envs` API.

    env = envs.make("xminigrid", env_id="MiniGrid-DoorKey-6x6")
    env = envs.make("xminigrid", env_id="MiniGrid-Empty-8x8", params={"max_steps": 64})

Needs xminigrid (`pip install -e ".[xminigrid]"`). Its API is dm_env-like (a `TimeStep` carries the state,
step type, reward and discount); the mapping is exact: with `envs.AutoReset` around it, the same keys and
actions give xminigrid's own `GymAutoResetWrapper` env's observations, rewards and flags (an ended episode's
next one is drawn from the key its state carries, as that wrapper does).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from envs.core import Box, Discrete, Environment, override_params


def _xminigrid():
    try:
        import xminigrid
    except ImportError as e:
        raise ImportError('the xminigrid adapter needs xminigrid: pip install -e ".[xminigrid]"') from e
    return xminigrid


class FromXMiniGrid(Environment):
    """An xminigrid `Environment` by id in the `envs` API (single-agent, `Discrete` actions).

    - Observations: the agent's egocentric view, [view, view, 2] (tile and colour indices), flattened to
      float32 [view * view * 2].
    - `done` is the TimeStep's `last()`; `info["terminated"]` where its discount is 0 (the goal was reached),
      `info["truncated"]` where the step limit (`params.max_steps`) ended the episode otherwise.
    - The env state is xminigrid's `TimeStep`; steps are deterministic (the step key is unused).
    - `params=` (a dict) overrides fields of the env's default `EnvParams` (e.g. `max_steps`, `view_size`).
      XLand-MiniGrid's meta-RL ids need a `ruleset` from one of xminigrid's benchmarks (`params={"ruleset": ...}`).
    """

    def __init__(self, env_id: str, params: dict | None = None):
        xminigrid = _xminigrid()
        if env_id not in xminigrid.registered_environments():
            from envs.core import unknown_name
            raise unknown_name("xminigrid environment", env_id, xminigrid.registered_environments())
        self.env, default_params = xminigrid.make(env_id)
        self._default_params = default_params = override_params(default_params, params, env_id)
        self.env_id, self.name = env_id, f"xminigrid-{env_id}"
        self.supports_vma_checks = False  # its actions' lax.cond mixes constants and per-device values
        self.max_episode_steps = int(default_params.max_steps)
        view, view, layers = self.env.observation_shape(default_params)
        self._obs_dim = view * view * layers
        self._num_actions = int(self.env.num_actions(default_params))

    @property
    def default_params(self):
        return self._default_params

    def observation_space(self, params=None) -> Box:
        return Box(low=0.0, high=255.0, shape=(self._obs_dim,))

    def action_space(self, params=None) -> Discrete:
        return Discrete(self._num_actions)

    def _obs(self, timestep) -> jax.Array:
        return jnp.ravel(timestep.observation).astype(jnp.float32)

    def reset(self, key, params=None):
        timestep = self.env.reset(self._params(params), key)
        return self._obs(timestep), timestep

    def restart(self, key, state: Any, params=None):
        """The next episode from the key the ended one's state carries (xminigrid's `GymAutoResetWrapper`)."""
        next_key, _ = jax.random.split(state.state.key)
        return self.reset(next_key, params)

    def step(self, key, state: Any, action, params=None):
        timestep = self.env.step(self._params(params), state, action)
        done = timestep.last()
        terminated = done & (timestep.discount == 0)
        info = {"terminated": terminated, "truncated": done & ~terminated}
        return self._obs(timestep), timestep, jnp.asarray(timestep.reward, jnp.float32), done, info

    def __repr__(self) -> str:
        return f"FromXMiniGrid({self.env_id!r})"
