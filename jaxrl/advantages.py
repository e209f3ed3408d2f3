"""Advantage estimators (pure functions on time-major arrays)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards: jax.Array, values: jax.Array, dones: jax.Array, last_value: jax.Array,
        gamma: float, gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation.

    Args:
      rewards, values, dones: [T, ...]; `dones[t]` means the episode ended with step t, so neither the
        value nor the advantage of step t+1 flows back into step t.
      last_value: [...] value of the observation after the last step.
    Returns:
      (advantages [T, ...], value targets = advantages + values [T, ...])
    """
    not_done = 1.0 - dones.astype(values.dtype)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    deltas = rewards + gamma * next_values * not_done - values

    def backward(carry, x):
        delta, keep = x
        advantage = delta + gamma * gae_lambda * keep * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(last_value), (deltas, not_done), reverse=True)
    return advantages, advantages + values
