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


def gru_step(h: jax.Array, x_proj: jax.Array, restart: jax.Array, w_h: jax.Array, b_hn: jax.Array) -> jax.Array:
    """One GRU step, restarting from zero where `restart` is true.

    h [*B, H], x_proj [*B, 3H] (the input's projection), restart bool [*B] -> h [*B, H]. Gates as in flax's
    GRUCell: r, z = sigmoid(.), n = tanh(W_in x + r * (W_hn h + b_hn)).
    """
    H = h.shape[-1]
    h = jnp.where(restart[..., None], 0.0, h)
    hp = h @ w_h
    r = nn.sigmoid(x_proj[..., :H] + hp[..., :H])
    z = nn.sigmoid(x_proj[..., H:2 * H] + hp[..., H:2 * H])
    n = jnp.tanh(x_proj[..., 2 * H:] + r * (hp[..., 2 * H:] + b_hn))
    return (1.0 - z) * n + z * h


def scan_grus(hs: tuple, x_projs: tuple, first: jax.Array, weights: tuple) -> tuple[tuple, tuple]:
    """Several GRUs over one time-major sequence in a single loop: (h_T per GRU, outputs [T, *B, H] per GRU).

    hs: ([*B, H], ...), x_projs: ([T, *B, 3H], ...), first bool [T, *B], weights: ((w_h [H, 3H], b_hn [H]), ...).
    One loop rather than one per GRU: on a CPU the sequential steps, not their arithmetic, bound the speed.
    """
    def step(hs, inputs):
        x_projs, restart = inputs
        hs = tuple(gru_step(h, xp, restart, *w) for h, xp, w in zip(hs, x_projs, weights))
        return hs, hs

    return jax.lax.scan(step, tuple(hs), (tuple(x_projs), first))


class ResetGRU(nn.Module):
    """A GRU over a time-major sequence whose state restarts at zero where `first` is true.

    (h [*B, H], x [T, *B, d], first bool [T, *B]) -> (h_T [*B, H], outputs [T, *B, H])

    The input projections of all T steps are one matmul before the loop (`project`); only the recurrent
    projection runs step by step (`scan_grus`), so that several GRUs can share one loop.
    """

    features: int

    def setup(self):
        H = self.features
        self.input = nn.Dense(3 * H, kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                              bias_init=nn.initializers.zeros)
        self.recurrent_kernel = self.param("recurrent_kernel", nn.initializers.orthogonal(), (H, 3 * H))
        self.recurrent_bias = self.param("recurrent_bias", nn.initializers.zeros, (H,))

    def project(self, x: jax.Array) -> jax.Array:
        """[T, *B, d] -> [T, *B, 3H]"""
        return self.input(x)

    def weights(self) -> tuple[jax.Array, jax.Array]:
        return self.recurrent_kernel, self.recurrent_bias

    def __call__(self, h: jax.Array, x: jax.Array, first: jax.Array):
        (h,), (out,) = scan_grus((h,), (self.project(x),), first, (self.weights(),))
        return h, out


class RecurrentTower(nn.Module):
    """Dense -> GRU -> Dense -> linear head (the recurrent SMAX baselines' layout).

    (h [*B, H], x [T, *B, d], first [T, *B]) -> (h, out [T, *B, out_dim]). `project` and `read_out` are the
    parts before and after the GRU, so that `RecurrentActorCritic` can step two towers' GRUs in one loop.
    """

    out_dim: int
    fc_size: int = 128
    rnn_size: int = 128
    activation: str = "relu"
    head_scale: float = 1.0

    def setup(self):
        self.embed = orthogonal_dense(self.fc_size, np.sqrt(2))
        self.gru = ResetGRU(self.rnn_size)
        self.hidden = orthogonal_dense(self.fc_size, np.sqrt(2))
        self.head = orthogonal_dense(self.out_dim, self.head_scale)

    def project(self, x: jax.Array) -> jax.Array:
        """[T, *B, d] -> the GRU's input projection [T, *B, 3H]"""
        return self.gru.project(activation_fn(self.activation)(self.embed(x)))

    def gru_weights(self) -> tuple[jax.Array, jax.Array]:
        return self.gru.weights()

    def read_out(self, h_seq: jax.Array) -> jax.Array:
        """GRU outputs [T, *B, H] -> [T, *B, out_dim]"""
        return self.head(activation_fn(self.activation)(self.hidden(h_seq)))

    def __call__(self, h, x, first):
        (h,), (out,) = scan_grus((h,), (self.project(x),), first, (self.gru_weights(),))
        return h, self.read_out(out)


class RecurrentActorCritic(nn.Module):
    """Separate recurrent actor and critic towers; the carry is (actor h, critic h), each [*B, rnn_size].

    The two GRUs step in one loop (`scan_grus`). With `critic=False` there is no critic tower, value is 0
    and the critic's h stays 0.
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
        actor = tower(self.num_actions, head_scale=0.01, name="actor")
        if not self.critic:
            actor_h, logits = actor(actor_h, actor_in, first)
            return (actor_h, critic_h), logits, jnp.zeros(logits.shape[:-1], logits.dtype)
        critic = tower(1, head_scale=1.0, name="critic")
        hs, (actor_out, critic_out) = scan_grus(carry, (actor.project(actor_in), critic.project(critic_in)), first,
                                                (actor.gru_weights(), critic.gru_weights()))
        return hs, actor.read_out(actor_out), jnp.squeeze(critic.read_out(critic_out), -1)
