"""gymnax environments (classic control, MinAtar, bsuite, misc) in the `envs` API.

    env = envs.make("gymnax", env_id="Acrobot-v1")
    env = envs.make("gymnax", env_id="Breakout-MinAtar")                # obs [10 * 10 * 4], flattened
    env = envs.make("gymnax", env_id="Pendulum-v1", params={"max_steps_in_episode": 100})

Needs gymnax >= 1.0 (`pip install -e ".[gymnax]"`), whose steps report `terminated` and the time limit
(`is_truncated`) apart. The mapping is exact: with `envs.AutoReset` around it, the same keys and actions
give gymnax's own auto-resetting `step`'s observations, rewards, flags and final observations (both split
the step key the same way).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import Box, Discrete, Environment, override_params


def _gymnax():
    try:
        import gymnax
    except ImportError as e:
        raise ImportError('the gymnax adapter needs gymnax>=1.0: pip install -e ".[gymnax]"') from e
    if not hasattr(gymnax.environments.environment.Environment, "is_truncated"):
        raise ImportError("the gymnax adapter needs gymnax>=1.0 (terminated and truncated apart); this is an "
                          'older gymnax: pip install -e ".[gymnax]" (rejax\'s benchmark pins gymnax<1.0 in its '
                          "own environment, see setup.py)")
    return gymnax


def _bounds(value, shape) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, np.float32), shape).reshape(-1)


class GymnaxStyle(Environment):
    """An env with gymnax's functional API (`reset_env`, `step_env`, `EnvParams`, gymnax-like spaces) in the
    `envs` API, single-agent; subclasses say which endings are terminal (`_end_flags`) and which info entries
    to pass on (`_info`). Craftax shares this API (`envs.adapters.craftax`).

    - Observations are flattened to float32 [obs_dim] (MinAtar's [10, 10, C] booleans become [100 * C]).
    - Actions: `Discrete(n)` (int32 scalars) or a `Box` of shape [d] (continuous control), passed as given.
    - `done` = terminated | time limit; `info["truncated"]` is the time limit where the episode did not also
      terminate: a terminal state is never bootstrapped.
    - `params` are the library's `EnvParams`; `params=` (a dict) overrides fields of the defaults. A sweep may
      vary them like any env params.
    - Steps call `step_env`, so episodes do not restart on their own: wrap with `envs.AutoReset` (as the
      learners do).
    """

    def __init__(self, env: Any, env_id: str, default_params, params: dict | None, limit_field: str):
        self.env, self.env_id = env, env_id
        default_params = override_params(default_params, params, env_id)
        self._default_params = default_params
        limit = getattr(default_params, limit_field, None)
        self.max_episode_steps = None if limit is None else int(limit)
        self._observation_space = self._convert_observation_space(env.observation_space(default_params))
        self._action_space = self._convert_action_space(env.action_space(default_params))

    @property
    def default_params(self):
        return self._default_params

    def _convert_observation_space(self, space) -> Box:
        shape = tuple(space.shape)
        size = int(np.prod(shape)) if shape else 1
        if hasattr(space, "n"):  # a discrete observation (e.g. a bandit's): its index as one number
            return Box(low=0.0, high=float(space.n - 1), shape=(1,))
        return Box(low=_bounds(space.low, shape), high=_bounds(space.high, shape), shape=(size,))

    def _convert_action_space(self, space):
        if hasattr(space, "n"):
            return Discrete(int(space.n))
        shape = tuple(space.shape)
        if len(shape) != 1:
            raise NotImplementedError(f"{self.env_id}: continuous actions of shape {shape}; only [d] is supported")
        return Box(low=_bounds(space.low, shape), high=_bounds(space.high, shape), shape=shape)

    def observation_space(self, params=None) -> Box:
        return self._observation_space

    def action_space(self, params=None):
        return self._action_space

    def _obs(self, obs) -> jax.Array:
        return jnp.ravel(jnp.asarray(obs)).astype(jnp.float32)

    def _end_flags(self, state, params, done: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(terminated, time limit reached) after a step that reported `done`."""
        raise NotImplementedError

    def _info(self, info: dict) -> dict:
        """The library's info entries to pass on."""
        return {}

    def reset(self, key, params=None):
        obs, state = self.env.reset_env(key, self._params(params))
        return self._obs(obs), state

    def step(self, key, state, action, params=None):
        params = self._params(params)
        obs, state, reward, done, info = self.env.step_env(key, state, action, params)
        terminated, time_limit = self._end_flags(state, params, jnp.asarray(done, bool))
        info = {**self._info(info), "terminated": terminated, "truncated": time_limit & ~terminated}
        return self._obs(obs), state, jnp.asarray(reward, jnp.float32), terminated | time_limit, info

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env_id!r})"


class FromGymnax(GymnaxStyle):
    """A gymnax (>= 1.0) `Environment` in the `envs` API (see `GymnaxStyle`).

    `info["terminated"]` is gymnax's own flag, the time limit its `is_truncated`; gymnax's own info entries
    (e.g. `discount`) are passed on. `params=` overrides e.g. `max_steps_in_episode`. One difference with
    gymnax's `step`: bsuite's DeepSea keeps two counters across episodes in its state (bad episodes,
    denoised return); here they restart with each episode. They are not part of the observation or reward.
    """

    def __init__(self, env: Any, params: dict | None = None, **kwargs):
        if isinstance(env, str):
            gymnax = _gymnax()
            if env not in gymnax.registered_envs:
                from envs.core import unknown_name
                raise unknown_name("gymnax environment", env, gymnax.registered_envs)
            env_id = env
            env, default_params = gymnax.make(env, **kwargs)
        elif kwargs:
            raise TypeError("keyword arguments are only accepted together with an environment id")
        else:
            env_id, default_params = type(env).__name__, env.default_params
        super().__init__(env, env_id, default_params, params, "max_steps_in_episode")
        self.name = f"gymnax-{env_id}"

    def _end_flags(self, state, params, done):
        return done, jnp.asarray(self.env.is_truncated(state, params), bool)  # step_env's done: terminated only

    def _info(self, info):
        return {k: v for k, v in info.items() if isinstance(v, (jax.Array, np.ndarray, float, int, bool))}
