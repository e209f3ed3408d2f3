"""Brax environments (locomotion and control) in the `envs` API.

    env = envs.make("brax", env_name="halfcheetah")                        # backend "generalized"
    env = envs.make("brax", env_name="ant", backend="positional", episode_length=1000, action_repeat=1)

Needs brax (`pip install -e ".[brax]"`). Episodes are Brax's own: its `EpisodeWrapper` counts the time limit
and repeats actions, and an ended episode restarts from the first state of that env's episode, as Brax's
`AutoResetWrapper` does (a fresh reset would cost about a physics step); with `envs.AutoReset` around it,
the same keys and actions give Brax's `envs.create(...)` env's observations, rewards and flags.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Environment


def _brax_envs():
    try:
        from brax import envs as brax_envs
    except ImportError as e:
        raise ImportError('the Brax adapter needs brax: pip install -e ".[brax]"') from e
    return brax_envs


@struct.dataclass
class BraxEnvState:
    current: Any  # brax's State (with EpisodeWrapper's step counter in its info)
    start: Any  # the State this episode started from: where the next episode restarts


class FromBrax(Environment):
    """A Brax `Env` by name in the `envs` API (single-agent, continuous actions in [-1, 1]^action_size).

    - `done` = Brax's done (terminated or the time limit). `info["truncated"]` is Brax's `truncation` (the limit
      cut an episode that had not ended), `info["terminated"]` the rest. Brax's per-step metrics (e.g.
      `x_velocity`, `reward_ctrl`) are passed on in `info`.
    - `episode_length` counts physics steps as Brax does; with `action_repeat` r an episode lasts
      ceil(episode_length / r) env steps (`max_episode_steps`).
    - `restart` returns to the episode's first state (Brax's auto-reset); `reset` draws a new one.
    - `params` are not used (Brax keeps its settings on the env object).
    """

    def __init__(self, env_name: str, episode_length: int = 1000, action_repeat: int = 1,
                 backend: str = "generalized", **kwargs):
        brax_envs = _brax_envs()
        if env_name not in brax_envs._envs:  # (brax has no public list of its registry)
            from envs.core import unknown_name
            raise unknown_name("Brax environment", env_name, brax_envs._envs)
        if episode_length < 1 or action_repeat < 1:
            raise ValueError(f"episode_length and action_repeat must be >= 1; got {episode_length}, {action_repeat}")
        env = brax_envs.get_environment(env_name, backend=backend, **kwargs)
        self.env = brax_envs.training.EpisodeWrapper(env, episode_length, action_repeat)
        self.env_name, self.backend = env_name, backend
        self.name = f"brax-{env_name}"
        self.supports_vma_checks = False  # Brax's pipelines mix per-device and replicated values in lax.cond
        self.max_episode_steps = math.ceil(episode_length / action_repeat)
        # Brax's `observation_size` runs a reset op by op (about 220 small compiles); its shape alone is traced
        self._obs_dim = int(jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs.shape[-1])
        self._action_dim = int(env.action_size)

    @property
    def obs_dim(self) -> int:
        return self._obs_dim

    def observation_space(self, params=None) -> Box:
        return Box(low=-float("inf"), high=float("inf"), shape=(self._obs_dim,))

    def action_space(self, params=None) -> Box:
        return Box(low=-1.0, high=1.0, shape=(self._action_dim,))

    def reset(self, key, params=None):
        state = self.env.reset(key)
        return state.obs, BraxEnvState(state, state)

    def restart(self, key, state: BraxEnvState, params=None):
        return state.start.obs, BraxEnvState(state.start, state.start)

    def step(self, key, state: BraxEnvState, action, params=None):
        current = self.env.step(state.current, action)
        done = current.done > 0
        truncated = current.info["truncation"] > 0
        info = {**current.metrics, "terminated": done & ~truncated, "truncated": truncated}
        return current.obs, BraxEnvState(current, state.start), current.reward.astype(jnp.float32), done, info

    def __repr__(self) -> str:
        return f"FromBrax({self.env_name!r}, backend={self.backend!r})"
