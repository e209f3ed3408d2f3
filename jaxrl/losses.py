"""Policy and value loss terms, per sample; callers choose how to aggregate."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def ppo_clip_loss(log_ratio: jax.Array, advantages: jax.Array, clip_low: float,
                  clip_high: float | None = None) -> jax.Array:
    """PPO's clipped surrogate, negated to be minimised. [...] -> [...]

    loss = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(log_ratio); `clip_high`
    defaults to `clip_low` (symmetric clipping).
    """
    clip_high = clip_low if clip_high is None else clip_high
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -jnp.minimum(ratio * advantages, clipped * advantages)


def clip_fraction(log_ratio: jax.Array, clip_low: float, clip_high: float | None = None) -> jax.Array:
    """1.0 where the ratio lies outside the clip range, else 0.0. [...] -> [...]"""
    clip_high = clip_low if clip_high is None else clip_high
    ratio = jnp.exp(log_ratio)
    return ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).astype(jnp.float32)


def value_loss(values: jax.Array, old_values: jax.Array, targets: jax.Array,
               clip_eps: float | None) -> jax.Array:
    """0.5 * squared error, pessimistic over the clipped update when `clip_eps` is set. [...] -> [...]"""
    loss = jnp.square(values - targets)
    if clip_eps is not None:
        clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        loss = jnp.maximum(loss, jnp.square(clipped - targets))
    return 0.5 * loss
