"""Running statistics for observation normalisation and reward scaling, combined exactly across devices.

A learner keeps `Moments` (count, mean and summed squared deviations) in its training state and updates
them once per rollout with the whole batch: each device reduces its share, then the shares are combined over
the mesh's data axis with the pairwise formula of Chan et al., so that the statistics equal those of the
whole batch on one device (up to float rounding), and every device holds the same numbers.

    obs_in = normalize(moments, obs, clip=10.0)              # what the policy sees
    moments = update(moments, observations_of_the_rollout, DATA_AXIS)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Moments:
    """Statistics of everything seen so far, per feature: count [], mean [d], m2 [d] (sum of squared
    deviations from the mean). A fresh one (count 0) normalises nothing: mean 0, variance 1."""

    count: jax.Array
    mean: jax.Array
    m2: jax.Array


def init(shape: tuple[int, ...]) -> Moments:
    return Moments(jnp.zeros((), jnp.float32), jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))


def combine(a: Moments, b: Moments) -> Moments:
    """The statistics of two disjoint sets from theirs (Chan, Golub and LeVeque's pairwise update)."""
    count = a.count + b.count
    safe = jnp.maximum(count, 1.0)
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / safe)
    m2 = a.m2 + b.m2 + delta * delta * (a.count * b.count / safe)
    return Moments(count, mean, m2)


def of_batch(x: jax.Array, axis_name: str | None = None) -> Moments:
    """The statistics of x [..., d] over all leading axes, and over the devices of `axis_name` (inside
    shard_map): the devices' counts and sums are added, then each device's squared deviations are taken
    about the global mean, so that no device's share is weighted wrongly."""
    x = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    count = jnp.float32(x.shape[0])
    total = x.sum(0)
    if axis_name is not None:
        count, total = jax.lax.psum((count, total), axis_name)
    mean = total / count
    m2 = jnp.sum((x - mean) ** 2, axis=0)
    if axis_name is not None:
        m2 = jax.lax.psum(m2, axis_name)
    return Moments(count, mean, m2)


def update(moments: Moments, x: jax.Array, axis_name: str | None = None) -> Moments:
    """`moments` with the batch x [..., d] added (see `of_batch`)."""
    return combine(moments, of_batch(x, axis_name))


def variance(moments: Moments) -> jax.Array:
    """[..., d]: the population variance; 1 before anything was seen (leading axes, e.g. seeds, allowed)."""
    count = moments.count[..., None]
    return jnp.where(count > 0, moments.m2 / jnp.maximum(count, 1.0), 1.0)


def normalize(moments: Moments, x: jax.Array, clip: float, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / std, clipped to [-clip, clip]. x [..., d] -> [..., d]"""
    z = (x - moments.mean) * jax.lax.rsqrt(variance(moments) + eps)
    return jnp.clip(z, -clip, clip).astype(x.dtype)


def scale(moments: Moments, reward: jax.Array, eps: float = 1e-8) -> jax.Array:
    """reward / std of the discounted return (moments of returns, d = 1): rewards on a scale near one whatever
    the env's units, without moving their zero (reward scaling as in SB3's VecNormalize)."""
    return reward * jax.lax.rsqrt(variance(moments)[0] + eps)
