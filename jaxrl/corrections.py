"""Off-policy corrections of the policy loss: what to do when the tokens (or actions) a batch learns from were
drawn by a policy other than the one the update starts from.

Three policies meet in an update. mu, the *behaviour* policy, drew the samples (an older version of the
parameters in an asynchronous or partial rollout, or the sampler's own numerics); pi_prox, the *proximal*
policy, is the learner's parameters at the start of the update, scoring the same samples; pi_theta is the
policy being optimised. PPO's clipped ratio keeps pi_theta near its *anchor*; a correction says which log-
probabilities are the anchor and which per-step weight (no gradient) multiplies the clipped surrogate:

    loss = agg(weight * ppo_clip_loss(log pi_theta - anchor, A))

With rho_t = pi_prox(y_t) / mu(y_t) per token and rho = prod_t rho_t per sequence (over its valid tokens):

    none          anchor mu,       weight 1                         (naive PPO on stale samples)
    tis_token     anchor pi_prox,  weight min(rho_t, high)          (truncated importance sampling, per token)
    tis_sequence  anchor pi_prox,  weight min(rho, high)            (... per sequence)
    mis_token     anchor pi_prox,  weight rho_t if low <= rho_t <= high else 0   (masked importance sampling)
    mis_sequence  anchor pi_prox,  weight rho if low <= rho <= high else 0
    decoupled     anchor pi_prox,  weight rho_t                     (AReaL's decoupled PPO objective)

Truncated IS (Ionides 2008; the training-inference mismatch fix of Yao et al. 2025) bounds each weight; masked IS
drops the samples whose ratio leaves a trust band instead of bounding them; AReaL (Fu et al. 2025) clips against
the proximal policy and reweights by rho_t, so that a stale sample's update stays in a trust region of the
current policy. `register` adds an entry; `loss.correction` names one.

`diagnostics` gives what every asynchronous run should log: the weights' effective sample size (VCPO, "Stable
Asynchrony": a collapsing ESS predicts the variance that destabilises training), their mean, the fraction
zeroed, and the mismatch between the log-probabilities the sampler drew with and the learner's.
`loss.ess_step` scales each update's step by that ESS (VCPO's learning rate scaled by ESS), so that a batch a
few heavy weights dominate moves the policy less.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl.knobs import Knob


class Correction(NamedTuple):
    """What the policy loss learns against, per step [..., T] (sequences of T steps): `anchor`, the log-
    probabilities the clipped ratio is taken from, and `weight`, a multiplier of each step's clipped surrogate (0
    on padding)."""

    anchor: jax.Array
    weight: jax.Array


# name -> f(behaviour [..., T], proximal [..., T], mask [..., T], low, high) -> Correction
CORRECTIONS: dict[str, Callable[..., Correction]] = {}


def register(name: str):
    """Decorator: `@register("name")` on f(behaviour, proximal, mask, low, high) -> Correction."""
    def add(fn):
        CORRECTIONS[name] = fn
        return fn
    return add


def log_ratios(behaviour: jax.Array, proximal: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log rho_t = log pi_prox - log mu per token [..., T] (0 on padding), and log rho per sequence [...]
    (their sum over the valid tokens)."""
    per_token = jnp.where(mask > 0, proximal - behaviour, 0.0)
    return per_token, jnp.sum(per_token, axis=-1)


def _per_token(weight: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask > 0, weight, 0.0)


def _per_sequence(weight: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask > 0, weight[..., None], 0.0)


def _truncated(log_rho: jax.Array, high) -> jax.Array:
    """min(rho, high), from log rho (no overflow however stale the sample)."""
    return jnp.exp(jnp.minimum(log_rho, jnp.log(high)))


def _in_band(log_rho: jax.Array, low, high) -> jax.Array:
    """rho where low <= rho <= high, else 0, from log rho."""
    rho = _truncated(log_rho, high)
    return jnp.where((log_rho <= jnp.log(high)) & (rho >= low), rho, 0.0)


@register("none")
def no_correction(behaviour, proximal, mask, low, high) -> Correction:
    """The ratio from the behaviour policy, every step weighted 1: today's synchronous loss."""
    return Correction(behaviour, jnp.asarray(mask > 0, behaviour.dtype))


@register("tis_token")
def truncated_per_token(behaviour, proximal, mask, low, high) -> Correction:
    """Truncated importance sampling per token: weight min(rho_t, high)."""
    log_rho, _ = log_ratios(behaviour, proximal, mask)
    return Correction(proximal, _per_token(_truncated(log_rho, high), mask))


@register("tis_sequence")
def truncated_per_sequence(behaviour, proximal, mask, low, high) -> Correction:
    """Truncated importance sampling per sequence: every token of a sequence weighted min(rho, high)."""
    _, log_rho = log_ratios(behaviour, proximal, mask)
    return Correction(proximal, _per_sequence(_truncated(log_rho, high), mask))


@register("mis_token")
def masked_per_token(behaviour, proximal, mask, low, high) -> Correction:
    """Masked importance sampling per token: weight rho_t inside [low, high], 0 outside."""
    log_rho, _ = log_ratios(behaviour, proximal, mask)
    return Correction(proximal, _per_token(_in_band(log_rho, low, high), mask))


@register("mis_sequence")
def masked_per_sequence(behaviour, proximal, mask, low, high) -> Correction:
    """Masked importance sampling per sequence: a sequence's tokens weighted rho inside [low, high], else 0."""
    _, log_rho = log_ratios(behaviour, proximal, mask)
    return Correction(proximal, _per_sequence(_in_band(log_rho, low, high), mask))


@register("decoupled")
def decoupled(behaviour, proximal, mask, low, high) -> Correction:
    """AReaL's decoupled PPO objective: clipped against the proximal policy, weighted by rho_t (untruncated;
    its log capped at 80, where float32 still holds it)."""
    log_rho, _ = log_ratios(behaviour, proximal, mask)
    return Correction(proximal, _per_token(jnp.exp(jnp.minimum(log_rho, 80.0)), mask))


def correct(name: str, behaviour: jax.Array, proximal: jax.Array, mask: jax.Array, low=0.0,
            high=2.0) -> Correction:
    """The correction `name` (see `CORRECTIONS`) of steps drawn by `behaviour` and scored by `proximal` (log-
    probabilities [..., T]; padding may hold anything), `mask` [..., T] 0/1. Weights carry no gradient."""
    if name not in CORRECTIONS:
        raise ValueError(f"unknown loss.correction {name!r}; known: {', '.join(sorted(CORRECTIONS))}")
    mask = jnp.asarray(mask, behaviour.dtype)
    behaviour, proximal = (jax.lax.stop_gradient(jnp.where(mask > 0, x, 0.0)) for x in (behaviour, proximal))
    anchor, weight = CORRECTIONS[name](behaviour, proximal, mask, low, high)
    return Correction(anchor, jax.lax.stop_gradient(weight))


def _valid_sums(mask: jax.Array, axis_name: str | None, *values: jax.Array) -> jax.Array:
    """[len(values) + 1]: each of `values` [..., T] summed over the valid steps, then the number of valid steps;
    summed over the devices of `axis_name` in one psum."""
    valid = mask > 0
    sums = jnp.stack([*(jnp.sum(jnp.where(valid, v, 0.0)) for v in values), jnp.sum(valid, dtype=mask.dtype)])
    return sums if axis_name is None else jax.lax.psum(sums, axis_name)


def _ess(total, squares, n):
    return jnp.where(squares > 0, total * total / jnp.maximum(n * squares, 1e-30), 0.0)


def effective_sample_size(weight: jax.Array, mask: jax.Array, axis_name: str | None = None) -> jax.Array:
    """The weights' normalised effective sample size (sum w)^2 / (n sum w^2) over the n valid steps, in (0, 1]:
    1 when every weight is equal, 1/n when one step holds them all (0 when all are 0). [..., T] x2 -> []"""
    return _ess(*_valid_sums(jnp.asarray(mask, weight.dtype), axis_name, weight, weight * weight))


def diagnostics(correction: Correction, behaviour: jax.Array, proximal: jax.Array, mask: jax.Array,
                axis_name: str | None = None) -> dict[str, jax.Array]:
    """Scalars over the valid steps (of every device with `axis_name`): correction_ess
    (`effective_sample_size`), correction_weight (the weights' mean), correction_zeroed (the fraction weighted
    0) and logp_mismatch (the mean |log pi_prox - log mu|: the sampler's log-probabilities against the
    learner's)."""
    w = correction.weight
    total, squares, zeroed, mismatch, n = _valid_sums(
        jnp.asarray(mask, w.dtype), axis_name, w, w * w, (w == 0).astype(w.dtype), jnp.abs(proximal - behaviour))
    per_step = 1.0 / jnp.maximum(n, 1.0)
    return {"correction_ess": _ess(total, squares, n), "correction_weight": total * per_step,
            "correction_zeroed": zeroed * per_step, "logp_mismatch": mismatch * per_step}


CORRECTION = Knob("loss.correction", "none", "how the loss corrects for samples drawn by another policy than "
                  "the update's: none, truncated (tis_*) or masked (mis_*) importance sampling, or decoupled "
                  "(AReaL)", choices=lambda: sorted(CORRECTIONS))
CORRECTION_LOW = Knob("loss.correction_low", 0.0, "masked importance sampling drops ratios below it",
                      traced=True, minimum=0.0)
CORRECTION_HIGH = Knob("loss.correction_high", 2.0, "truncated importance sampling caps ratios at it; masked "
                       "drops ratios above it", traced=True, above=0.0)
ESS_STEP = Knob("loss.ess_step", False, "scale each update's step by the correction weights' effective sample "
                "size (VCPO): a batch that few samples dominate moves the policy less")
