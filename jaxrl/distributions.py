"""Categorical policies over legal actions, as plain functions on logits [..., A] and masks [..., A]."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Finite rather than -inf so that a fully masked row still has a defined (uniform) distribution
# and gradients stay finite.
_MASKED_LOGIT = -1e9


def masked_logits(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Illegal actions get a logit of -1e9: probability zero, no NaNs. [..., A] -> [..., A]"""
    if mask is None:
        return logits
    return jnp.where(mask, logits, _MASKED_LOGIT)


def sample(key: jax.Array, logits: jax.Array) -> jax.Array:
    """int32 [...] drawn from softmax(logits) [..., A]."""
    return jax.random.categorical(key, logits).astype(jnp.int32)


def sample_with_noise(logits: jax.Array, gumbel_noise: jax.Array) -> jax.Array:
    """int32 [...]: the Gumbel-max sample argmax(logits + noise), noise ~ Gumbel(0, 1) of shape [..., A].

    Lets a caller draw all the noise of a rollout in one batched op before the loop.
    """
    return jnp.argmax(logits + gumbel_noise, axis=-1).astype(jnp.int32)


def greedy(logits: jax.Array) -> jax.Array:
    """int32 [...]: the most likely action."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    """log pi(action) [...] for logits [..., A] and int actions [...]."""
    log_p = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(log_p, action[..., None], axis=-1)[..., 0]


def entropy(logits: jax.Array) -> jax.Array:
    """H(pi) [...]; masked actions (logit -1e9) contribute exactly zero."""
    log_p = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
