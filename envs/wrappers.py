"""Wrappers that keep the functional API: auto-reset and episode statistics."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Environment


def _forwarded(name: str) -> property:
    """A read-only property that returns the wrapped env's attribute `name`."""
    return property(lambda self: getattr(self.env, name), doc=f"The wrapped env's `{name}`.")


class Wrapper(Environment):
    """Forwards everything it does not override to the wrapped env."""

    def __init__(self, env: Environment):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    @property
    def unwrapped(self) -> Environment:
        return getattr(self.env, "unwrapped", self.env)

    # The base class defines these, so `__getattr__` would not reach them: forward them explicitly.
    default_params = _forwarded("default_params")
    num_actions = _forwarded("num_actions")
    obs_dim = _forwarded("obs_dim")
    num_agents = _forwarded("num_agents")
    name = _forwarded("name")
    has_action_masks = _forwarded("has_action_masks")
    multi_agent = _forwarded("multi_agent")
    supports_vma_checks = _forwarded("supports_vma_checks")
    host_state = _forwarded("host_state")
    max_episode_steps = _forwarded("max_episode_steps")
    episode_info_keys = _forwarded("episode_info_keys")

    def reset(self, key, params=None):
        return self.env.reset(key, params)

    def step(self, key, state, action, params=None):
        return self.env.step(key, state, action, params)

    def observation_space(self, params=None):
        return self.env.observation_space(params)

    def action_space(self, params=None):
        return self.env.action_space(params)

    def avail_actions(self, state, params=None):
        return self.env.avail_actions(state, params)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def episode_over(done: jax.Array, info: dict) -> jax.Array:
    """Scalar bool: the whole episode ended (multi-agent envs report it in `info`)."""
    return info["episode_over"] if "episode_over" in info else done


def select(pred: jax.Array, on_true, on_false):
    """Leaf by leaf `where(pred, on_true, on_false)` for one env's pytrees (vmap it for a batch)."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class AutoReset(Wrapper):
    """Starts a new episode inside `step` when one ends.

    The returned obs is the first of the new episode (the env's `restart`: a fresh reset for most envs); the
    last obs and state of the finished one are kept in `info["final_obs"]` and `info["final_state"]` so that a
    learner can bootstrap a time-limit truncation from them (unused entries cost nothing under jit).

    `reset_ratio` only changes `batch_step`. Under `vmap` every env computes its restart at every step and
    keeps it only if its episode ended; for envs whose reset is costly (Craftax generates a world) that is most
    of a step. With `reset_ratio = k > 1`, a batch of n envs computes m = max(1, n // k) restarts per step: the
    first m envs that ended (in batch order) each get their own, from their own key, exactly as `step` gives
    it; when more than m end on one step, the others take copies of those m (an "optimistic" reset, as
    Craftax's own PPO does), so such episodes start from a state another env also starts from.
    """

    def __init__(self, env: Environment, reset_ratio: int = 1):
        if not isinstance(reset_ratio, int) or isinstance(reset_ratio, bool) or reset_ratio < 1:
            raise ValueError(f"reset_ratio must be an integer >= 1 (1: every env its own restart), got {reset_ratio!r}")
        super().__init__(env)
        self.reset_ratio = reset_ratio

    def step(self, key, state, action, params=None):
        step_key, reset_key = jax.random.split(key)
        obs, next_state, reward, done, info = self.env.step(step_key, state, action, params)
        reset_obs, reset_state = self.env.restart(reset_key, next_state, params)
        over = episode_over(done, info)
        info = dict(info, final_obs=obs, final_state=next_state)
        return (*self._next(over, (reset_obs, reset_state), (obs, next_state), params), reward, done, info)

    def _next(self, over, restarted, stepped, params):
        """One env's next (obs, state): `restarted` where its episode is `over`, else `stepped`. An env that can
        observe a state (`Environment.observe`) observes only the state kept, and XLA drops the two observations
        computed with the step and the restart."""
        state = select(over, restarted[1], stepped[1])
        if self.env.observe is None:
            return select(over, restarted[0], stepped[0]), state
        return self.env.observe(state, params), state

    def batch_step(self, keys, states, actions, params=None):
        num_envs = keys.shape[0]
        num_restarts = max(1, num_envs // self.reset_ratio)
        if num_restarts == num_envs:
            return super().batch_step(keys, states, actions, params)
        step_keys, reset_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        obs, next_state, reward, done, info = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
            step_keys, states, actions, params)
        over = jax.vmap(episode_over)(done, info)
        restarted = jnp.nonzero(over, size=num_restarts, fill_value=0)[0]  # [m]: the first m envs that ended
        reset_obs, reset_state = jax.vmap(self.env.restart, in_axes=(0, 0, None))(
            reset_keys[restarted], take(next_state, restarted), params)
        # the j-th env that ended starts from restart j mod m: its own for j < m
        source = (jnp.cumsum(over) - 1) % num_restarts  # [n]
        reset_obs, reset_state = take((reset_obs, reset_state), source)
        info = dict(info, final_obs=obs, final_state=next_state)
        next_obs, next_state = jax.vmap(self._next, in_axes=(0, 0, 0, None))(
            over, (reset_obs, reset_state), (obs, next_state), params)
        return next_obs, next_state, reward, done, info

    def __repr__(self) -> str:
        ratio = f", reset_ratio={self.reset_ratio}" if self.reset_ratio != 1 else ""
        return f"AutoReset({self.env!r}{ratio})"


def take(tree, indices: jax.Array):
    """Rows `indices` of every leaf of a batched pytree."""
    return jax.tree.map(lambda leaf: leaf[indices], tree)


@struct.dataclass
class EpisodeStatsState:
    env_state: Any
    episode_return: jax.Array  # running sum of this episode's rewards
    episode_length: jax.Array


class EpisodeStatistics(Wrapper):
    """Adds `info["episode_return"]` and `info["episode_length"]` of the episode that just ended.

    The values are meaningful where `info["returned_episode"]` is true (an episode ended on this step).
    Wrap it around `AutoReset` so that the counters restart with each episode.
    """

    def reset(self, key, params=None):
        obs, env_state = self.env.reset(key, params)
        reward_shape = (self.num_agents,) if self.multi_agent else ()
        return obs, EpisodeStatsState(env_state, jnp.zeros(reward_shape), jnp.int32(0))

    def step(self, key, state, action, params=None):
        return self._count(state, self.env.step(key, state.env_state, action, params))

    def batch_step(self, keys, states, actions, params=None):
        return jax.vmap(self._count)(states, self.env.batch_step(keys, states.env_state, actions, params))

    @staticmethod
    def _count(state, transition):
        """One env's step `transition` with this episode's counters added to its info."""
        obs, env_state, reward, done, info = transition
        over = episode_over(done, info)
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        info = dict(info, returned_episode=over, episode_return=episode_return,
                    episode_length=episode_length)
        state = EpisodeStatsState(env_state, jnp.where(over, 0.0, episode_return),
                                  jnp.where(over, 0, episode_length))
        return obs, state, reward, done, info

    def avail_actions(self, state, params=None):
        return self.env.avail_actions(state.env_state, params)

    def global_state(self, state, params=None):
        """The wrapped env's global state (multi-agent envs with a centralised critic)."""
        return self.env.global_state(state.env_state, params)


class AgentAxis(Wrapper):
    """A single-agent env seen as a multi-agent one with one agent, so that one learner serves both.

    obs [1, obs_dim], reward and done [1], avail_actions [1, num_actions]; `info["episode_over"]` is the
    scalar done and `global_state` is the observation.
    """

    multi_agent = True

    def __init__(self, env: Environment):
        if env.multi_agent:
            raise ValueError(f"AgentAxis wraps single-agent envs; {env!r} already has an agent axis")
        super().__init__(env)

    def reset(self, key, params=None):
        obs, state = self.env.reset(key, params)
        return obs[None], state

    def step(self, key, state, action, params=None):
        obs, state, reward, done, info = self.env.step(key, state, action[0], params)
        return obs[None], state, reward[None], done[None], dict(info, episode_over=done)

    def avail_actions(self, state, params=None):
        return self.env.avail_actions(state, params)[None]

    def restart(self, key, state, params=None):
        obs, state = self.env.restart(key, state, params)
        return obs[None], state


def as_multi_agent(env: Environment) -> Environment:
    """`env` itself when it has an agent axis, else wrapped in `AgentAxis`."""
    return env if env.multi_agent else AgentAxis(env)
