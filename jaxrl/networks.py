"""Flax linen policy and value networks (pure `init`/`apply`)."""

from __future__ import annotations

import functools
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


# -------------------------------------------------------------------------------------------------
# Actor-critics with one calling convention, feed-forward or recurrent:
#
#     carry, logits, value = net.apply(params, carry, actor_in, critic_in, first)
#
# Inputs are time-major: actor_in [T, *B, d_actor], critic_in [T, *B, d_critic], first bool [T, *B]
# (true where the input is the first of an episode, so the hidden state restarts there); `carry` is
# `net.initial_carry(B)` or what the previous call returned. Outputs: logits [T, *B, num_actions],
# value [T, *B]. Feed-forward nets carry () and ignore `first` (any leading shape works for them).


class ActorCritic(nn.Module):
    """Separate policy and value MLPs.

    (carry=(), actor_in [..., d_a], critic_in [..., d_c], first) -> ((), logits [..., A], value [...])
    With `critic=False` (critic-free algorithms) there is no value network and value is 0.
    """

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    critic: bool = True

    recurrent = False

    def initial_carry(self, batch_shape: tuple[int, ...]) -> tuple:
        return ()

    @nn.compact
    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array, first: jax.Array | None = None):
        logits = MLP(self.hidden_sizes, self.num_actions, self.activation, head_scale=0.01, name="actor")(actor_in)
        if not self.critic:
            return carry, logits, jnp.zeros(logits.shape[:-1], logits.dtype)
        value = MLP(self.hidden_sizes, 1, self.activation, head_scale=1.0, name="critic")(critic_in)
        return carry, logits, jnp.squeeze(value, -1)


class ResetGRU(nn.Module):
    """A GRU over a time-major sequence whose state restarts at zero where `first` is true.

    (h [*B, H], x [T, *B, d], first bool [T, *B]) -> (h_T [*B, H], outputs [T, *B, H])

    The input projections of all T steps are one matmul before the loop; only the recurrent
    projection runs step by step (the sequential part is what limits speed on CPU).
    Gates as in flax's GRUCell: r, z = sigmoid(.), n = tanh(W_in x + r * (W_hn h + b_hn)).
    """

    features: int

    @nn.compact
    def __call__(self, h: jax.Array, x: jax.Array, first: jax.Array):
        H = self.features
        x_proj = nn.Dense(3 * H, kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                          bias_init=nn.initializers.zeros, name="input")(x)  # [T, *B, 3H]
        w_h = self.param("recurrent_kernel", nn.initializers.orthogonal(), (H, 3 * H))
        b_hn = self.param("recurrent_bias", nn.initializers.zeros, (H,))

        def step(h, inputs):
            xp, restart = inputs
            h = jnp.where(restart[..., None], 0.0, h)
            hp = h @ w_h
            r = nn.sigmoid(xp[..., :H] + hp[..., :H])
            z = nn.sigmoid(xp[..., H:2 * H] + hp[..., H:2 * H])
            n = jnp.tanh(xp[..., 2 * H:] + r * (hp[..., 2 * H:] + b_hn))
            h = (1.0 - z) * n + z * h
            return h, h

        return jax.lax.scan(step, h, (x_proj, first))


class RecurrentTower(nn.Module):
    """Dense -> GRU -> Dense -> linear head (the recurrent SMAX baselines' layout).

    (h [*B, H], x [T, *B, d], first [T, *B]) -> (h, out [T, *B, out_dim])
    """

    out_dim: int
    fc_size: int = 128
    rnn_size: int = 128
    activation: str = "relu"
    head_scale: float = 1.0

    @nn.compact
    def __call__(self, h, x, first):
        act = activation_fn(self.activation)
        x = act(orthogonal_dense(self.fc_size, np.sqrt(2))(x))
        h, x = ResetGRU(self.rnn_size)(h, x, first)
        x = act(orthogonal_dense(self.fc_size, np.sqrt(2))(x))
        return h, orthogonal_dense(self.out_dim, self.head_scale)(x)


class RecurrentActorCritic(nn.Module):
    """Separate recurrent actor and critic towers; the carry is (actor h, critic h), each [*B, rnn_size].

    With `critic=False` there is no critic tower, value is 0 and the critic's h stays 0.
    """

    num_actions: int
    fc_size: int = 128
    rnn_size: int = 128
    activation: str = "relu"
    critic: bool = True

    recurrent = True

    def initial_carry(self, batch_shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
        zeros = jnp.zeros((*batch_shape, self.rnn_size), jnp.float32)
        return zeros, zeros

    @nn.compact
    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array, first: jax.Array):
        actor_h, critic_h = carry
        tower = functools.partial(RecurrentTower, fc_size=self.fc_size, rnn_size=self.rnn_size,
                                  activation=self.activation)
        actor_h, logits = tower(self.num_actions, head_scale=0.01, name="actor")(actor_h, actor_in, first)
        if not self.critic:
            return (actor_h, critic_h), logits, jnp.zeros(logits.shape[:-1], logits.dtype)
        critic_h, value = tower(1, head_scale=1.0, name="critic")(critic_h, critic_in, first)
        return (actor_h, critic_h), logits, jnp.squeeze(value, -1)
