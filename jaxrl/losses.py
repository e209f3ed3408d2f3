"""Policy and value loss terms.

The element-wise terms (`ppo_clip_loss`, `clip_fraction`, `value_loss`, `kl_estimate`) return one value per
sample and leave aggregation to the caller. For sequence data (GRPO family) the shapes are `[S, T]`: S sequences,
T steps/tokens, with a float 0/1 `mask` marking valid steps; `aggregate` reduces such values and `policy_loss`
composes the parts. Hyperparameter numbers may be traced arrays; static choices are strings.
"""

from __future__ import annotations

import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl.knobs import Knob


def _check(name: str, known, key: str) -> str:
    if name not in known:
        raise ValueError(f"unknown {key} {name!r}; known: {', '.join(known)}")
    return name


def _lookup(registry: dict, name: str, key: str):
    return registry[_check(name, registry, key)]


def ppo_clip_loss(log_ratio: jax.Array, advantages: jax.Array, clip_low, clip_high=None,
                  dual_clip=None) -> jax.Array:
    """PPO's clipped surrogate, negated to be minimised. [...] -> [...]

    loss = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(log_ratio); `clip_high` defaults to
    `clip_low` (symmetric clipping; a larger `clip_high` is DAPO's clip-higher). `dual_clip` = c > 1 (dual-clip
    PPO, Ye et al. 2020) additionally caps the loss at -c A where A < 0; None turns it off.
    """
    clip_high = clip_low if clip_high is None else clip_high
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -jnp.minimum(ratio * advantages, clipped * advantages)
    if dual_clip is not None:
        # Only concrete Python numbers can be checked here; a traced c is the caller's responsibility.
        if isinstance(dual_clip, numbers.Real) and not dual_clip > 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        # For A < 0 the plain surrogate grows without bound in r; the cap stops one stale, very unlikely
        # sample from dominating the update (and zeroes its gradient there).
        loss = jnp.where(advantages < 0, jnp.minimum(loss, -dual_clip * advantages), loss)
    return loss


def clip_fraction(log_ratio: jax.Array, clip_low, clip_high=None) -> jax.Array:
    """1.0 where the ratio lies outside the clip range, else 0.0. [...] -> [...]"""
    clip_high = clip_low if clip_high is None else clip_high
    ratio = jnp.exp(log_ratio)
    return ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).astype(jnp.float32)


def value_loss(values: jax.Array, old_values: jax.Array | None, targets: jax.Array,
               clip_eps: float | None) -> jax.Array:
    """0.5 * squared error, pessimistic over the clipped update when `clip_eps` is set (then `old_values` is
    needed). [...] -> [...]"""
    loss = jnp.square(values - targets)
    if clip_eps is not None:
        clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        loss = jnp.maximum(loss, jnp.square(clipped - targets))
    return 0.5 * loss


def sequence_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO's length-normalised sequence log-ratio. [S, T], [S, T] -> [S]

    sum_t mask * log_ratio / max(sum_t mask, 1): the log of the geometric mean of the token ratios, so the
    clip range means the same for short and long sequences.
    """
    mask = jnp.asarray(mask, log_ratio.dtype)
    total = jnp.sum(jnp.where(mask > 0, log_ratio * mask, 0.0), axis=-1)
    return total / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)


# Schulman's estimators of KL(current || ref) from samples of the current policy, as functions of
# x = ref_log_prob - log_prob. k1 and k3 are unbiased in value, k3 is also never negative and of low variance;
# k2 is biased in value, but differentiated through log_prob it gives an unbiased gradient of that KL.
KL_ESTIMATORS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "k1": lambda x: -x,
    "k2": lambda x: 0.5 * jnp.square(x),
    "k3": lambda x: jnp.expm1(x) - x,  # expm1: exact near x = 0, where the policies barely differ
}


def kl_estimate(log_prob: jax.Array, ref_log_prob: jax.Array, estimator: str) -> jax.Array:
    """Per-sample estimate of KL(current || ref) for actions drawn from the current policy. [...] -> [...]"""
    return _lookup(KL_ESTIMATORS, estimator, "kl estimator")(ref_log_prob - log_prob)


# Each aggregation returns a local (numerator, denominator) from the masked values [S, T] so that `aggregate`
# can combine denominators across devices in one place.
def _token_mean(weighted, mask, constant_length):
    """Every valid token weighs the same, so long sequences are not down-weighted (DAPO)."""
    return jnp.sum(weighted), jnp.sum(mask)


def _sequence_mean(weighted, mask, constant_length):
    """Mean over tokens within a sequence, then over non-empty sequences (original GRPO)."""
    lengths = jnp.sum(mask, axis=-1)
    per_sequence = jnp.sum(weighted, axis=-1) / jnp.maximum(lengths, 1.0)
    return jnp.sum(per_sequence), jnp.sum(lengths > 0, dtype=weighted.dtype)


def _constant_mean(weighted, mask, constant_length):
    """Token sum over a fixed length per non-empty sequence: no length bias in either direction (Dr. GRPO)."""
    length = weighted.shape[-1] if constant_length is None else constant_length
    return jnp.sum(weighted), jnp.sum(jnp.sum(mask, axis=-1) > 0, dtype=weighted.dtype) * length


AGGREGATIONS: dict[str, Callable] = {"token": _token_mean, "sequence": _sequence_mean,
                                     "constant": _constant_mean}


def aggregate(values: jax.Array, mask: jax.Array, how: str, constant_length=None,
              axis_name: str | None = None) -> jax.Array:
    """Reduce per-step `values` [S, T] with a 0/1 float `mask` [S, T] to a scalar; see `AGGREGATIONS`.

    `constant_length` (only for "constant") defaults to T. With `axis_name`, each device holds part of the batch:
    denominators are summed over that axis and the result scaled by its size, so the mean over devices of the
    per-device values and gradients equals the aggregate over the whole batch (callers pmean gradients).
    An all-masked batch gives 0.
    """
    reduce = _lookup(AGGREGATIONS, how, "aggregate")
    mask = jnp.asarray(mask, values.dtype)
    # `where`, not only `* mask`: padding may hold inf/NaN, and inf * 0 is NaN.
    numerator, denominator = reduce(jnp.where(mask > 0, values * mask, 0.0), mask, constant_length)
    scale = 1.0
    if axis_name is not None:
        denominator = jax.lax.psum(denominator, axis_name)
        scale = jax.lax.psum(1, axis_name)  # axis size
    return scale * numerator / jnp.maximum(denominator, 1.0)


_aggregate = aggregate  # `policy_loss` takes a parameter named `aggregate`


RATIO_LEVELS = ("token", "sequence")


def policy_loss(log_prob: jax.Array, old_log_prob: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                clip_low, clip_high=None, dual_clip=None, ratio: str = "token", aggregate: str = "token",
                constant_length=None, ref_log_prob: jax.Array | None = None, kl: str = "k3", kl_coef=0.0,
                entropy: jax.Array | None = None, ent_coef=0.0, weight: jax.Array | None = None,
                axis_name: str | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO-family policy loss from per-step inputs [S, T] -> (scalar loss, metrics of scalars).

    loss = agg(ppo_clip_loss) + kl_coef * agg(kl_estimate vs `ref_log_prob`) - ent_coef * agg(entropy), the
    last two only when their inputs are given, all with the one aggregation `aggregate` (see `AGGREGATIONS`;
    `constant_length` and `axis_name` as in `aggregate`). `ratio`: "token" clips per-token ratios, "sequence"
    (GSPO) clips each sequence's `sequence_log_ratio`, shared by (and differentiated through) its tokens.
    `weight` [S, T]: a multiplier of each step's clipped surrogate, outside the aggregation's denominator (an
    off-policy correction's, `jaxrl.corrections`; `old_log_prob` is then its anchor).
    Metrics: policy_loss, clip_fraction (of the ratio that is clipped), approx_kl (k3 between old and new policy
    on the per-token log ratio), and kl / entropy when given.
    """
    _check(ratio, RATIO_LEVELS, "ratio")
    _check(aggregate, AGGREGATIONS, "aggregate")
    _check(kl, KL_ESTIMATORS, "kl estimator")

    mask = jnp.asarray(mask, log_prob.dtype)
    valid = mask > 0

    def clean(x):
        # Zero padding before any nonlinearity: garbage there (e.g. -inf log-probs) would otherwise turn into
        # NaN values or gradients through exp, which masking afterwards cannot undo.
        return jnp.where(valid, x, 0.0)

    def agg(values):
        return _aggregate(values, mask, aggregate, constant_length, axis_name)

    log_prob, old_log_prob, advantages = clean(log_prob), clean(old_log_prob), clean(advantages)
    token_log_ratio = log_prob - old_log_prob
    log_ratio = token_log_ratio
    if ratio == "sequence":
        log_ratio = jnp.broadcast_to(sequence_log_ratio(token_log_ratio, mask)[:, None], token_log_ratio.shape)

    surrogate = ppo_clip_loss(log_ratio, advantages, clip_low, clip_high, dual_clip)
    clip_term = agg(surrogate if weight is None else clean(weight) * surrogate)
    metrics = {"policy_loss": clip_term,
               "clip_fraction": agg(clip_fraction(log_ratio, clip_low, clip_high)),
               "approx_kl": agg(KL_ESTIMATORS["k3"](token_log_ratio))}
    loss = clip_term
    if ref_log_prob is not None:
        metrics["kl"] = agg(kl_estimate(log_prob, clean(ref_log_prob), kl))
        loss = loss + kl_coef * metrics["kl"]
    if entropy is not None:
        metrics["entropy"] = agg(clean(entropy))
        loss = loss - ent_coef * metrics["entropy"]
    return loss, metrics


# The policy and value loss's config keys, read by PPO and the GRPO family alike (each may set its own defaults)
CLIP_LOW = Knob("loss.clip_low", 0.2, "the policy ratio is clipped to [1 - clip_low, 1 + clip_high]", traced=True,
                above=0.0)
CLIP_HIGH = Knob("loss.clip_high", 0.2, "the ratio's upper clip, 1 + clip_high (> clip_low: DAPO's clip-higher)",
                 traced=True, above=0.0)
DUAL_CLIP = Knob("loss.dual_clip", 0.0, "> 1: the loss of negative advantages capped at -dual_clip * A (dual-clip "
                 "PPO); 0: off", rule="0 (off) or > 1", accepts=lambda c: c == 0 or c > 1)
RATIO = Knob("loss.ratio", "token", "the importance ratio per token, or per sequence (GSPO)", choices=RATIO_LEVELS)
AGGREGATE = Knob("loss.aggregate", "token", "how per-token losses are averaged: over tokens, per sequence, or by a "
                 "constant length (Dr. GRPO)", choices=tuple(AGGREGATIONS))
VF_COEF = Knob("loss.vf_coef", 0.5, "the value loss's weight", traced=True, minimum=0.0)
ENT_COEF = Knob("loss.ent_coef", 0.01, "the entropy bonus's weight", traced=True, minimum=0.0)
