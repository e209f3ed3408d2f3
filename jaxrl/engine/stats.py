"""Statistics over the global batch, inside shard_map: every device holds an equal share along `data`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.mesh import DATA_AXIS


def global_mean(x: jax.Array) -> jax.Array:
    """Mean over every device's share (shares are equal in size)."""
    return jax.lax.pmean(jnp.mean(x), DATA_AXIS)


def normalize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / (std + eps) with statistics over the global minibatch (PPO's advantage normalisation)."""
    mean = global_mean(x)
    var = global_mean(jnp.square(x)) - jnp.square(mean)
    return (x - mean) / (jnp.sqrt(jnp.maximum(var, 0.0)) + eps)


def standardise(x: jax.Array, weight: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / (std + eps) over the weighted entries of every device's share."""
    total = jax.lax.psum(jnp.sum(weight), DATA_AXIS)
    mean = jax.lax.psum(jnp.sum(x * weight), DATA_AXIS) / total
    var = jax.lax.psum(jnp.sum(jnp.square(x - mean) * weight), DATA_AXIS) / total
    return (x - mean) / (jnp.sqrt(var) + eps)
