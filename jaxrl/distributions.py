"""Action distributions: what a policy network's outputs mean.

A distribution object is static (hashable, no arrays) and reads the network's outputs `out` [..., P]:

    dist = distributions.for_action_space(env.action_space(), squash=False)
    out = network(...)                               # [..., dist.num_outputs]
    out = dist.with_mask(out, mask)                  # illegal actions (categorical only)
    action = dist.sample_with_noise(out, noise)      # noise = dist.noise(key, batch_shape), drawn up front
    dist.log_prob(out, action), dist.entropy(out), dist.mode(out)
    env_action = dist.to_env(action)                 # what the env is given

`Categorical` (discrete actions: logits) and `DiagGaussian` (continuous: mean and log-std per dimension, an
optional tanh squashing). The categorical free functions below also serve token sampling.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

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


GREEDY_BLOCK = 128  # choices per block of `greedy`'s first level, over more of them than this


def greedy(logits: jax.Array) -> jax.Array:
    """int32 [...]: the most likely action, `jnp.argmax(logits, axis=-1)` (the first of equal largest) for logits
    [..., A] without NaN. Over more than GREEDY_BLOCK choices (a vocabulary) in two levels: the first block holding
    the largest, then its first index in that block. XLA:CPU's argmax over all of a vocabulary (a reduction of
    value-index pairs, not vectorised) took 15 ms at 128 x 49,152; the blocks' maxima take under 1."""
    if logits.shape[-1] <= GREEDY_BLOCK:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    blocks = in_blocks(logits, GREEDY_BLOCK, -jnp.inf)
    first = jnp.argmax(blocks.max(axis=-1), axis=-1)
    return (first * GREEDY_BLOCK + jnp.argmax(block_at(blocks, first), axis=-1)).astype(jnp.int32)


def in_blocks(x: jax.Array, block: int, fill) -> jax.Array:
    """x [..., V] padded with `fill` to whole blocks -> [..., ceil(V / block), block]."""
    blocks = -(-x.shape[-1] // block)
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, blocks * block - x.shape[-1])], constant_values=fill)
    return padded.reshape(*x.shape[:-1], blocks, block)


def block_at(blocks: jax.Array, index: jax.Array) -> jax.Array:
    """blocks [..., n, block], index int [...] -> the indexed block of each row [..., block]."""
    return jnp.take_along_axis(blocks, index[..., None, None], axis=-2)[..., 0, :]


def log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    """log pi(action) [...] for logits [..., A] and int actions [...]."""
    log_p = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(log_p, action[..., None], axis=-1)[..., 0]


def entropy(logits: jax.Array) -> jax.Array:
    """H(pi) [...]; masked actions (logit -1e9) contribute exactly zero."""
    log_p = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


@dataclasses.dataclass(frozen=True)
class Categorical:
    """Discrete actions: `num_outputs` = K logits; actions int32 [...]."""

    num_actions: int

    @property
    def num_outputs(self) -> int:
        return self.num_actions

    def noise(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """Gumbel(0, 1) noise [*shape, K] for `sample_with_noise`."""
        return jax.random.gumbel(key, (*shape, self.num_actions))

    def with_mask(self, out: jax.Array, mask: jax.Array | None) -> jax.Array:
        return masked_logits(out, mask)

    def sample_with_noise(self, out, noise) -> jax.Array:
        return sample_with_noise(out, noise)

    def sample(self, key: jax.Array, out: jax.Array) -> jax.Array:
        return sample(key, out)

    def mode(self, out: jax.Array) -> jax.Array:
        return greedy(out)

    def log_prob(self, out: jax.Array, action: jax.Array) -> jax.Array:
        return log_prob(out, action)

    def entropy(self, out: jax.Array) -> jax.Array:
        return entropy(out)

    def to_env(self, action: jax.Array) -> jax.Array:
        return action


_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
# Gauss-Hermite nodes and weights for E[f(Z)], Z ~ N(0, 1): E[f(Z)] ~ sum_i w_i f(sqrt(2) x_i) / sqrt(pi).
# 32 nodes integrate the smooth log-Jacobian of tanh to float32 precision for the log-stds a policy uses.
_HERMITE_X, _HERMITE_W = np.polynomial.hermite.hermgauss(32)
_NORMAL_NODES = (np.sqrt(2.0) * _HERMITE_X).astype(np.float32)
_NORMAL_WEIGHTS = (_HERMITE_W / np.sqrt(np.pi)).astype(np.float32)


# How the network's second half of outputs becomes the standard deviation: "exp" reads it as the log-std;
# "softplus" (Brax's and gymnax-blines' policies) takes std = softplus(x) + SOFTPLUS_MIN_STD, which grows
# linearly rather than exponentially in x and never reaches zero.
STD_TRANSFORMS = ("exp", "softplus")
SOFTPLUS_MIN_STD = 0.001


def tanh_log_jacobian(u: jax.Array) -> jax.Array:
    """log(1 - tanh(u)^2), elementwise, without cancellation for large |u|: 2 (log 2 - u - softplus(-2u))."""
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


@dataclasses.dataclass(frozen=True)
class DiagGaussian:
    """Continuous actions [..., D]: a Gaussian with diagonal covariance, optionally squashed by tanh.

    The network outputs [..., 2D]: the mean, then the std outputs (which the network may produce from the
    state or take from a free parameter, `networks`), read as log-stds or through a softplus
    (`std_transform`, see `STD_TRANSFORMS`). The policy's action is the Gaussian sample u (what rollouts
    store and log-probabilities are of); the env is given `to_env(u)`:
    - `squash=False`: u clipped to the action bounds (the clipping is the env's boundary, not part of the
      distribution, as in the usual PPO for continuous control);
    - `squash=True`: a = tanh(u) rescaled from [-1, 1] to the bounds; log-probabilities and entropy are
      those of tanh(u): log N(u) - sum log(1 - tanh(u)^2) (up to the rescaling's constant).
    `low`, `high`: the bounds per dimension (tuples of D floats).
    """

    action_dim: int
    low: tuple[float, ...]
    high: tuple[float, ...]
    squash: bool = False
    std_transform: str = "exp"
    min_log_std: float = -20.0
    max_log_std: float = 2.0

    def __post_init__(self):
        if self.std_transform not in STD_TRANSFORMS:
            raise ValueError(f"unknown std_transform {self.std_transform!r}; known: {', '.join(STD_TRANSFORMS)}")

    @property
    def num_outputs(self) -> int:
        return 2 * self.action_dim

    def split(self, out: jax.Array) -> tuple[jax.Array, jax.Array]:
        """[..., 2D] -> (mean [..., D], log_std [..., D]): "exp" clips the log-std outputs to [min_log_std,
        max_log_std]; "softplus" takes log(softplus(x) + SOFTPLUS_MIN_STD)."""
        mean, std_out = jnp.split(out, 2, axis=-1)
        if self.std_transform == "softplus":
            return mean, jnp.log(jax.nn.softplus(std_out) + SOFTPLUS_MIN_STD)
        return mean, jnp.clip(std_out, self.min_log_std, self.max_log_std)

    def std_output(self, log_std: float) -> float:
        """The std output that gives the log-std `log_std` (inverse of `split`'s transform), for a network's
        initial std."""
        if self.std_transform == "softplus":
            std = math.exp(log_std) - SOFTPLUS_MIN_STD
            if not std > 0:
                raise ValueError(f"a softplus std cannot start at exp({log_std}) <= {SOFTPLUS_MIN_STD}")
            return float(std + math.log(-math.expm1(-std)))  # softplus^-1(std), stable for large std
        return float(log_std)

    def noise(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """N(0, 1) noise [*shape, D] for `sample_with_noise`."""
        return jax.random.normal(key, (*shape, self.action_dim))

    def with_mask(self, out: jax.Array, mask) -> jax.Array:
        if mask is not None:
            raise ValueError("continuous actions take no action masks")
        return out

    def sample_with_noise(self, out: jax.Array, noise: jax.Array) -> jax.Array:
        mean, log_std = self.split(out)
        return mean + jnp.exp(log_std) * noise

    def sample(self, key: jax.Array, out: jax.Array) -> jax.Array:
        return self.sample_with_noise(out, self.noise(key, out.shape[:-1]))

    def mode(self, out: jax.Array) -> jax.Array:
        """The Gaussian's mean (for `squash`, tanh of it is the env action: the squashed mode's best proxy)."""
        return self.split(out)[0]

    def log_prob(self, out: jax.Array, action: jax.Array) -> jax.Array:
        """[...]: log-density of the policy's action (u, before squashing) under the policy's distribution."""
        mean, log_std = self.split(out)
        z = (action - mean) * jnp.exp(-log_std)
        log_p = jnp.sum(-0.5 * z * z - log_std - _LOG_SQRT_2PI, axis=-1)
        if self.squash:
            log_p = log_p - jnp.sum(tanh_log_jacobian(action), axis=-1)
        return log_p

    def entropy(self, out: jax.Array) -> jax.Array:
        """[...]: the Gaussian's entropy sum(log_std + log sqrt(2 pi e)); with `squash`, that of tanh(u),
        H(u) + E[sum log(1 - tanh(u)^2)], the expectation by 32-node Gauss-Hermite quadrature per dimension
        (deterministic and differentiable, where a one-sample estimate would be noisy)."""
        mean, log_std = self.split(out)
        h = jnp.sum(log_std + _LOG_SQRT_2PI + 0.5, axis=-1)
        if self.squash:
            u = mean[..., None] + jnp.exp(log_std)[..., None] * _NORMAL_NODES  # [..., D, 32]
            h = h + jnp.sum(tanh_log_jacobian(u) @ _NORMAL_WEIGHTS, axis=-1)
        return h

    def to_env(self, action: jax.Array) -> jax.Array:
        if self.squash:
            return self.from_unit_box(jnp.tanh(action))
        return jnp.clip(action, jnp.asarray(self.low, jnp.float32), jnp.asarray(self.high, jnp.float32))

    def from_unit_box(self, a: jax.Array) -> jax.Array:
        """Actions in [-1, 1]^D (a squashed sample) -> the env's bounds, linearly. [..., D] -> [..., D]"""
        low, high = jnp.asarray(self.low, jnp.float32), jnp.asarray(self.high, jnp.float32)
        return low + 0.5 * (a + 1.0) * (high - low)


def for_action_space(space, squash: bool = False, std_transform: str = "exp"):
    """The distribution for an env's action space: `Categorical` for `Discrete(n)`, `DiagGaussian` for a
    `Box` of shape [D] (`squash`: tanh to the bounds, which must then be finite; `std_transform`: see
    `STD_TRANSFORMS`)."""
    if hasattr(space, "n"):
        return Categorical(int(space.n))
    shape = tuple(space.shape)
    if len(shape) != 1:
        raise ValueError(f"continuous actions must be a vector [d]; this action space has shape {shape}")
    low = tuple(float(x) for x in np.broadcast_to(np.asarray(space.low, np.float32), shape))
    high = tuple(float(x) for x in np.broadcast_to(np.asarray(space.high, np.float32), shape))
    if squash and not all(np.isfinite(low + high)):
        raise ValueError(f"tanh squashing needs finite action bounds; got low={low}, high={high}")
    return DiagGaussian(shape[0], low, high, squash, std_transform)
