"""CartPole-v1 with the classic-control dynamics (explicit Euler), step for step equal to gymnax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Discrete, Environment


@struct.dataclass
class CartPoleState:
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array  # int32 steps taken in this episode


@struct.dataclass
class CartPoleParams:
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02  # seconds per step
    theta_threshold_radians: float = 12 * 2 * jnp.pi / 360
    x_threshold: float = 2.4
    max_steps_in_episode: int = 500


def _observation(state: CartPoleState) -> jax.Array:
    """[4] float32: x, x_dot, theta, theta_dot."""
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot]).astype(jnp.float32)


def _fell(state: CartPoleState, params: CartPoleParams) -> jax.Array:
    out_of_track = jnp.abs(state.x) > params.x_threshold
    pole_down = jnp.abs(state.theta) > params.theta_threshold_radians
    return out_of_track | pole_down


class CartPole(Environment):
    """Push a cart left (0) or right (1) to keep a pole upright; +1 per step, 500 steps at most."""

    name = "CartPole-v1"
    max_episode_steps = CartPoleParams.max_steps_in_episode

    @property
    def default_params(self) -> CartPoleParams:
        return CartPoleParams()

    def reset(self, key, params=None):
        init = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
        state = CartPoleState(init[0], init[1], init[2], init[3], jnp.int32(0))
        return _observation(state), state

    def step(self, key, state, action, params=None):
        p = self._params(params)
        was_over = _fell(state, p) | (state.time >= p.max_steps_in_episode)
        total_mass = p.masspole + p.masscart
        polemass_length = p.masspole * p.length
        force = p.force_mag * action - p.force_mag * (1 - action)
        cos, sin = jnp.cos(state.theta), jnp.sin(state.theta)
        temp = (force + polemass_length * state.theta_dot**2 * sin) / total_mass
        theta_acc = (p.gravity * sin - cos * temp) / (
            p.length * (4.0 / 3.0 - p.masspole * cos**2 / total_mass))
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        state = CartPoleState(
            x=state.x + p.tau * state.x_dot,
            x_dot=state.x_dot + p.tau * x_acc,
            theta=state.theta + p.tau * state.theta_dot,
            theta_dot=state.theta_dot + p.tau * theta_acc,
            time=state.time + 1,
        )
        terminated = _fell(state, p)
        truncated = (state.time >= p.max_steps_in_episode) & ~terminated
        reward = 1.0 - was_over.astype(jnp.float32)
        info = {"terminated": terminated, "truncated": truncated}
        return _observation(state), state, reward, terminated | truncated, info

    def observation_space(self, params=None):
        p = self._params(params)
        big = float(jnp.finfo(jnp.float32).max)
        high = (p.x_threshold * 2, big, p.theta_threshold_radians * 2, big)
        return Box(low=tuple(-h for h in high), high=high, shape=(4,))

    def action_space(self, params=None):
        return Discrete(2)
