"""Flax linen policy and value networks (pure `init`/`apply`)."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "swish": nn.swish, "elu": nn.elu}


def activation_fn(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def orthogonal_dense(features: int, scale: float) -> nn.Dense:
    """Dense layer with orthogonal weights of gain `scale` and zero bias (the PPO convention)."""
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale),
                    bias_init=nn.initializers.zeros)


class MLP(nn.Module):
    """Hidden layers with gain sqrt(2), then a linear head with gain `head_scale`.

    [..., in] -> [..., out_dim]
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    head_scale: float = 1.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = activation_fn(self.activation)
        for size in self.hidden_sizes:
            x = act(orthogonal_dense(size, np.sqrt(2))(x))
        return orthogonal_dense(self.out_dim, self.head_scale)(x)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs on the same observation.

    obs [..., obs_dim] -> (logits [..., num_actions], value [...])
    """

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = MLP(self.hidden_sizes, self.num_actions, self.activation, head_scale=0.01, name="actor")(obs)
        value = MLP(self.hidden_sizes, 1, self.activation, head_scale=1.0, name="critic")(obs)
        return logits, jnp.squeeze(value, -1)
