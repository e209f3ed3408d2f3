"""Policy and value loss terms.

The element-wise terms (`ppo_clip_loss`, `clip_fraction`, `value_loss`, `kl_estimate`) return one value per
sample and leave aggregation to the caller. For sequence data (GRPO family) the shapes are `[S, T]`: S sequences,
T steps/tokens, with a float 0/1 `mask` marking valid steps; `aggregate` reduces such values and `policy_loss`
composes the parts. Hyperparameter numbers may be traced arrays; static choices are strings.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable, NamedTuple

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


def completion_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of each completion's valid values: sum_t mask * values / max(sum_t mask, 1). [..., T], [..., T] ->
    [...]; padding never leaks (garbage there, inf included, counts as 0)."""
    mask = jnp.asarray(mask, values.dtype)
    total = jnp.sum(jnp.where(mask > 0, values * mask, 0.0), axis=-1)
    return total / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)


def sequence_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO's length-normalised sequence log-ratio. [S, T], [S, T] -> [S]

    The `completion_mean` of the token log-ratios: the log of the geometric mean of the token ratios, so the clip
    range means the same for short and long sequences.
    """
    return completion_mean(log_ratio, mask)


def segment_log_ratio(log_ratio: jax.Array, mask: jax.Array, segments: jax.Array, num_segments: int) -> jax.Array:
    """Rank-GRPO's segment-level ratio: each token's log-ratio replaced by its segment's length-normalised one, the
    log of the geometric mean of the segment's token ratios (`sequence_log_ratio` within each segment: one segment
    is GSPO's). log_ratio, mask [S, T]; segments int [T]: each position's segment in 0..num_segments-1 -> [S, T]."""
    mask = jnp.asarray(mask, log_ratio.dtype)
    one_hot = jax.nn.one_hot(segments, num_segments, dtype=log_ratio.dtype)  # [T, K]
    total = jnp.where(mask > 0, log_ratio * mask, 0.0) @ one_hot  # [S, K]
    count = mask @ one_hot
    return (total / jnp.maximum(count, 1.0)) @ one_hot.T


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


def expert_nll(log_probs: jax.Array, mask: jax.Array, gate: jax.Array, axis_name: str | None = None) -> jax.Array:
    """AHPO's expert term (MM-HELIX, "Adaptive Hybrid Policy Optimization"): the mean over the batch's B prompts of
    gate_b x the mean token negative log-likelihood of prompt b's expert answer, (1 / B) sum_b gate_b x
    sum_t -mask log p / sum_t mask. log_probs, mask [B, A] (the answers' tokens; 0/1 mask), gate [B] 0/1 -> scalar.
    Ungated prompts count in B: the term fades as fewer prompts need supervision. `axis_name` as in `aggregate`."""
    return aggregate(-log_probs * gate[:, None], mask, "sequence", axis_name=axis_name)


RATIO_LEVELS = ("token", "sequence", "turn")


class Outcome(NamedTuple):
    """Per completion [S], for the objectives that learn from the verifier's label rather than an advantage."""

    correct: jax.Array  # float32 [S] in {0, 1}: the verifier's correct label
    pass_rate: jax.Array  # float32 [S]: the mean label of the completion's group
    group_size: int  # G: completions are grouped [S / G, G], members adjacent


class Surrogate(NamedTuple):
    """What an objective reads, per token [S, T] unless said otherwise (padding already zeroed)."""

    log_ratio: jax.Array  # log pi - log pi_old, per token (per sequence, shared by its tokens, with ratio=sequence)
    advantages: jax.Array
    mask: jax.Array  # float32 0/1
    log_prob: jax.Array  # the current policy's
    ref_log_prob: jax.Array | None  # the frozen reference policy's (objectives that need one)
    outcome: Outcome | None


def _clip(x: Surrogate, clip_low, clip_high, dual_clip, score_scale):
    """PPO's clipped surrogate (`ppo_clip_loss`)."""
    return ppo_clip_loss(x.log_ratio, x.advantages, clip_low, clip_high, dual_clip)


def _cispo(x: Surrogate, clip_low, clip_high, dual_clip, score_scale):
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi. The importance weight is clipped and
    held constant, so every token keeps a gradient (PPO's clip drops the tokens it clips); MiniMax-M1 leaves the
    lower bound off (loss.clip_low = 1). log pi enters as log r (the same gradient, 0 at r = 1)."""
    weight = jnp.clip(jnp.exp(x.log_ratio), 1.0 - clip_low, 1.0 + clip_high)
    return -jax.lax.stop_gradient(weight) * x.advantages * x.log_ratio


NFT_FLOOR = 0.05  # the implicit negative policy's ratio is floored here: it must stay positive to take its log


def _nft(x: Surrogate, clip_low, clip_high, dual_clip, score_scale):
    """NFT (negative-aware fine-tuning): maximum likelihood on correct completions, and on the incorrect ones of
    the implicit negative policy pi- = (pi_old - r pi) / (1 - r), r the group's pass rate, which the policy pi
    itself parameterises: per token, -log min(R, 1 + clip_high) on correct, -log max((1 - r R) / (1 - r), floor)
    on incorrect completions, R = pi / pi_old. On-policy its gradient is GRPO's with advantage 1 (correct) and
    -r / (1 - r) (incorrect): (label - r) / (1 - r), a group-mean baseline."""
    ratio = jnp.exp(x.log_ratio)
    correct, rate = (v[:, None] for v in (x.outcome.correct, x.outcome.pass_rate))
    positive = -jnp.minimum(x.log_ratio, jnp.log1p(clip_high))
    negative_ratio = (1.0 - rate * ratio) / jnp.maximum(1.0 - rate, 1e-6)
    negative = -jnp.log(jnp.maximum(negative_ratio, NFT_FLOOR))
    return jnp.where(correct > 0, positive, negative)


def _pacs(x: Surrogate, clip_low, clip_high, dual_clip, score_scale):
    """PACS (implicit actor-critic by supervised learning): the verifier's label is predicted from the score
    psi = beta (s_i - mean_{j != i} s_j), s = log pi(y|x) - log pi_ref(y|x) summed over the completion (its
    implicit reward, centred leave-one-out in the group), by cross-entropy: BCE(sigmoid(psi), label). Its gradient
    is beta (sigmoid(psi) - label) d psi: a policy gradient whose baseline sigmoid(psi) is a critic the policy
    itself parameterises; at psi = 0 it is RLOO's. Every token carries its completion's loss (the aggregation
    then averages completions as it averages tokens)."""
    G = x.outcome.group_size
    s = jnp.sum((x.log_prob - x.ref_log_prob) * x.mask, axis=-1).reshape(-1, G)  # [S / G, G]
    others = (s.sum(-1, keepdims=True) - s) / (G - 1)
    psi = (score_scale * (s - others)).reshape(-1)
    label = x.outcome.correct
    per_completion = -(label * jax.nn.log_sigmoid(psi) + (1.0 - label) * jax.nn.log_sigmoid(-psi))
    return jnp.broadcast_to(per_completion[:, None], x.log_ratio.shape)


@dataclasses.dataclass(frozen=True)
class Objective:
    """An entry of `OBJECTIVES`: fn(Surrogate, clip_low, clip_high, dual_clip, score_scale) -> per-token loss [S, T]."""

    fn: Callable
    needs_reference: bool = False  # reads the frozen reference policy's log-probabilities
    needs_outcome: bool = False  # reads the verifier's label (`Outcome`), not only the advantages


# The per-token policy objective by name (config loss.objective)
OBJECTIVES: dict[str, Objective] = {"clip": Objective(_clip), "cispo": Objective(_cispo),
                                    "nft": Objective(_nft, needs_outcome=True),
                                    "pacs": Objective(_pacs, needs_reference=True, needs_outcome=True)}


def confidence_shaped(advantages: jax.Array, log_prob: jax.Array, ref_log_prob: jax.Array, mask: jax.Array,
                      penalty) -> jax.Array:
    """ACE (asymmetric confidence-aware error penalty): each negative advantage scaled by 1 + penalty max(c, 0),
    c = sum_t log pi(y_t) / pi_ref(y_t) over the completion (held constant): errors the policy has grown more
    confident in than the reference (c > 0, overconfident) are penalised more, the others as before, and positive
    advantages are unchanged. [S, T] -> [S, T]. (A softplus in place of max(c, 0) would also scale, by 1 + penalty
    log 2, every error the policy has not moved on: with it a run from a warm start drifts down.)"""
    c = jax.lax.stop_gradient(jnp.sum((log_prob - ref_log_prob) * mask, axis=-1, keepdims=True))
    return jnp.where(advantages < 0, advantages * (1.0 + penalty * jnp.maximum(c, 0.0)), advantages)


def novelty_sharpened(advantages: jax.Array, log_probs: jax.Array, mask: jax.Array, strength, floor=1.0) -> jax.Array:
    """Each positive advantage ([B, G], or per token [B, G, N]) scaled by max(1 + strength (l_bar - l_i), floor),
    l_i the completion's mean token log-likelihood under the policy that drew it (log_probs, mask [B, G, N]) and
    l_bar its group's mean; every negative advantage is left as it was. -l_i, the completion's mean surprisal, is a
    one-sample estimate of its mean token entropy, so l_bar - l_i = H_i - mean_group H.
    floor 1: XRPO's novelty-aware sharpening, 1 + strength max(l_bar - l_i, 0): correct answers the policy found
    unlikely are amplified, the likely ones stay. floor < 1: ETTRL's entropy-based advantage reshaping (EAR; our
    reading of the abstract, the clipped linear form): the likely (low-entropy, overconfident) correct answers are
    also damped, down to floor x A, against the early-stage bias that sharpens test-time RL prematurely."""
    likelihood = completion_mean(log_probs, mask)  # [B, G]
    factor = jnp.maximum(1.0 + strength * (likelihood.mean(axis=1, keepdims=True) - likelihood), floor)
    factor = factor.reshape(factor.shape + (1,) * (advantages.ndim - 2))
    return jnp.where(advantages > 0, advantages * factor, advantages)


def confidence_clip_range(clip_low, clip_high, confidence: jax.Array, floor) -> tuple[jax.Array, jax.Array]:
    """ECHO's confidence-adaptive clipping ("Entropy-Confidence Hybrid Optimization for Test-Time Reinforcement
    Learning"; our reading of the abstract): each sequence's clip range scaled by its group's vote confidence c [S]
    (`vote_confidence`), eps_g = eps max(c, floor) on both sides: a pseudo-label few of the group agreed on (noisy,
    early in test-time RL) gets a narrower trust region. -> (clip_low, clip_high), each [S, 1]."""
    scale = jnp.maximum(confidence, floor)[:, None]
    return clip_low * scale, clip_high * scale


def confidence_entropy_shaped(advantages: jax.Array, confidence: jax.Array, entropy: jax.Array, mask: jax.Array,
                              share, vocab_size: int) -> jax.Array:
    """ECHO's entropy-confidence hybrid advantage shaping (our reading of the abstract): A' = A (w c + (1 - w)
    (1 - H / log V)) per token [S, T], c the group's vote confidence [S], H the completion's mean token entropy
    (`entropy`, mask [S, T]; held constant), V the vocabulary size, w = `share`. The factor lies in [0, 1]:
    advantages only shrink, most where the pseudo-label is uncertain (few voted for it) or the policy that wrote the
    completion was (high entropy), so early, biased labels move the policy less."""
    certainty = 1.0 - completion_mean(jax.lax.stop_gradient(entropy), mask) / jnp.log(vocab_size)
    factor = share * confidence + (1.0 - share) * jnp.clip(certainty, 0.0, 1.0)
    return advantages * factor[:, None]


def hint_modulated(weight: jax.Array, advantages: jax.Array, log_probs: jax.Array, hint: jax.Array) -> jax.Array:
    """ADHint's Consistency-based Gradient Modulation and Selective Masking for Hint Preservation ("ADHint: Adaptive
    Hints with Difficulty Priors for Reinforcement Learning"): the loss weights of hint tokens. weight, advantages,
    log_probs (the sampler's log pi_old of each token) and hint (1 on a member's forced hint tokens) [..., N] -> the
    weights [..., N]. Our reading of the abstract: a hint token, off-policy (forced, not drawn), is trained with weight
    pi_old(y_t) = exp(log_probs), its consistency with the policy (a token the policy already agrees with moves it
    fully, an unlikely one, whose gradient would be biased and large, barely), and only where its member's advantage
    is > 0 (selective masking: a failed hinted rollout never pushes the hint's correct tokens down). Off the hint the
    weights are unchanged."""
    return jnp.where(hint > 0, jnp.exp(log_probs) * (advantages > 0), weight)


def soft_advantages(advantages: jax.Array, tau) -> jax.Array:
    """TempSamp-R1's non-linear soft advantage ("TempSamp-R1: Effective Temporal Sampling with Reinforcement
    Fine-Tuning for Video LLMs"): an asymmetric transform applied after the estimator, any shape -> the same shape.
    Our reading of the abstract: A' = tau log(1 + A / tau) for A > 0, A' = A for A <= 0.
    Why: an off-policy ground-truth member (`rollout.replay=reference`) has a far higher reward than the on-policy
    members, so its positive advantage dominates the update while the std it inflates squashes theirs. The outlier is
    always on the positive side (the ground truth has the best reward), so only positive advantages are compressed:
    the on-policy members it pushes below the mean keep their exact differences. log1p rather than tanh: its slope is
    1 at 0 (small advantages barely change) and it never saturates, so the positive advantages keep their order
    (tanh would tie every A >> tau at tau)."""
    tau = jnp.maximum(tau, 1e-8)  # (tau -> 0 compresses every positive advantage to 0: the limit, not a NaN)
    return jnp.where(advantages > 0, tau * jnp.log1p(jnp.maximum(advantages, 0.0) / tau), advantages)


def one_token_rollouts(logits: jax.Array, targets: jax.Array, key: jax.Array, samples: int) -> jax.Array:
    """OTR's per-token loss [B, N] from logits [B, N, V] at the columns predicting the reference tokens `targets`
    [B, N]: each column draws `samples` tokens from the policy (a one-step rollout), the reference token rewards
    the draws that match it, and the policy gradient with the draws' mean as baseline is taken,
    -mean_k (r_k - mean r) log pi(y_k). Its expected gradient is that of pi(target): SFT's direction weighted by
    how likely the policy already finds the token (SFT's log pi(target) divides by it)."""
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    drawn = jax.random.categorical(key, jax.lax.stop_gradient(logits), axis=-1, shape=(samples, *targets.shape))
    rewards = (drawn == targets[None]).astype(log_probs.dtype)  # [K, B, N]
    advantages = rewards - rewards.mean(axis=0, keepdims=True)
    drawn_log_probs = jnp.take_along_axis(log_probs[None], drawn[..., None], axis=-1)[..., 0]
    return -jnp.mean(advantages * drawn_log_probs, axis=0)


def informative_tokens(advantages: jax.Array, entropy: jax.Array, mask: jax.Array, keep) -> jax.Array:
    """D3S's token-level down-sampling: float32 [S, T] 1 on the valid tokens whose |A| x entropy is among the largest
    `keep` share of this batch's valid tokens (on this device; ties kept), 0 elsewhere: the updates go where the
    policy is both uncertain and the advantage large. `keep` 1 keeps every valid token."""
    score = jax.lax.stop_gradient(jnp.abs(advantages) * entropy)
    valid = mask > 0
    threshold = jnp.nanquantile(jnp.where(valid, score, jnp.nan), 1.0 - keep, method="higher")
    return (valid & (score >= threshold)).astype(mask.dtype)


def relaxed_keep(keep, update_step, schedule: int):
    """D3S's dynamic down-sampling schedule: a kept share that starts at `keep` and rises linearly to 1 over
    `schedule` updates (aggressive selection early, when it speeds learning, relaxed later against overfitting
    the high-signal samples); `schedule` 0 keeps `keep` throughout. Scalars -> scalar."""
    if not schedule:
        return keep
    progress = jnp.minimum(jnp.asarray(update_step, jnp.float32) / schedule, 1.0)
    return keep + (1.0 - keep) * progress


def varied_samples(advantages: jax.Array, keep) -> jax.Array:
    """D3S's sample-level down-sampling: float32 [B, G] 1 on the k = clip(round(keep G), 2, G) members of each group
    whose advantages [B, G] have the largest variance, 0 on the others. A subset of k values of largest variance
    holds the i largest and k - i smallest for some i (moving a middle value outwards never lowers the spread), so
    the k + 1 such splits are compared (ties: the fewest largest)."""
    B, G = advantages.shape
    k = jnp.clip(jnp.round(keep * G), 2, G).astype(jnp.int32)
    order = jnp.argsort(advantages, axis=1)
    ranked = jnp.take_along_axis(advantages, order, axis=1)  # ascending
    zero = jnp.zeros((B, 1), ranked.dtype)
    low1 = jnp.concatenate([zero, jnp.cumsum(ranked, 1)], 1)  # [B, G + 1]: sums of the j smallest
    low2 = jnp.concatenate([zero, jnp.cumsum(ranked ** 2, 1)], 1)
    i = jnp.arange(G + 1)  # how many of the largest
    j = jnp.clip(k - i, 0, G)  # and of the smallest
    high1, high2 = low1[:, -1:] - low1[:, G - i], low2[:, -1:] - low2[:, G - i]
    mean = (high1 + low1[:, j]) / k
    variance = (high2 + low2[:, j]) / k - mean ** 2
    best = jnp.argmax(jnp.where(i <= k, variance, -jnp.inf), axis=1)[:, None]  # [B, 1]
    position = jnp.arange(G)
    kept_ranked = (position < k - best) | (position >= G - best)
    return jnp.take_along_axis(kept_ranked, jnp.argsort(order, axis=1), axis=1).astype(jnp.float32)


def distinct_samples(tokens: jax.Array, mask: jax.Array, advantages: jax.Array, min_distinctiveness) -> jax.Array:
    """DaGRPO's sequence-level gradient rectification: float32 [B, G], 0 on every member of a pair of completions
    (tokens, mask [B, G, N]) whose advantages [B, G] have opposite signs and whose distinctiveness is below
    `min_distinctiveness`, 1 elsewhere. Distinctiveness: the share of positions, of the longer completion's, where
    the two differ. Near-identical completions pushed in opposite directions cancel on the tokens they share (a
    gradient conflict) while the rest of each gets a large update."""
    present = mask > 0
    either = present[:, :, None] | present[:, None]  # [B, G, G, N]
    differ = jnp.sum(either & (tokens[:, :, None] != tokens[:, None]), axis=-1)
    length = jnp.maximum(jnp.sum(either, axis=-1), 1)
    distinctiveness = differ / length  # [B, G, G]
    opposed = advantages[:, :, None] * advantages[:, None] < 0
    conflicted = jnp.any(opposed & (distinctiveness < min_distinctiveness), axis=-1)
    return (~conflicted).astype(jnp.float32)


def entropy_shaped(advantages: jax.Array, entropy: jax.Array, coef, bound) -> jax.Array:
    """Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective";
    MSSR's stabiliser of single-rollout RLVR): A + min(coef sg(H_t), |A| / bound) per token [S, T]: uncertain
    tokens gain, never more than 1 / bound of the advantage's own size (a zero advantage stays zero, and the shaping
    cannot flip a negative advantage's sign for bound > 1)."""
    bonus = jnp.minimum(coef * jax.lax.stop_gradient(entropy), jnp.abs(advantages) / bound)
    return advantages + bonus


def value_smoothed_clip(value: jax.Array, strength, axis_name: str | None = None) -> jax.Array:
    """VSPO's value-smoothing clipping (Enhancing Agentic RL with Progressive Reward Shaping and Value-based Sampling
    Policy Optimization), our reading of its abstract: the factor [n] of each group's clip range,
    max(0, 1 + strength x (v_g - mean v)), v [n] the groups' task values, the mean over all groups (every device's
    with `axis_name`). The trust region widens smoothly for the groups worth learning from (uncertain and hard) and
    narrows for the rest, instead of one range for all; its mean stays 1 (before the floor at 0)."""
    mean = jnp.mean(value) if axis_name is None else jax.lax.pmean(jnp.mean(value), axis_name)
    return jnp.maximum(0.0, 1.0 + strength * (value - mean))


def policy_loss(log_prob: jax.Array, old_log_prob: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                clip_low, clip_high=None, dual_clip=None, ratio: str = "token", aggregate: str = "token",
                constant_length=None, ref_log_prob: jax.Array | None = None, kl: str = "k3", kl_coef=0.0,
                entropy: jax.Array | None = None, ent_coef=0.0, weight: jax.Array | None = None,
                objective: str = "clip", outcome: Outcome | None = None, score_scale=1.0, confidence_penalty=None,
                segments: tuple[jax.Array, int] | None = None,
                axis_name: str | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO-family policy loss from per-step inputs [S, T] -> (scalar loss, metrics of scalars).

    loss = agg(objective) + kl_coef * agg(kl_estimate vs `ref_log_prob`) - ent_coef * agg(entropy), the
    last two only when their inputs are given, all with the one aggregation `aggregate` (see `AGGREGATIONS`;
    `constant_length` and `axis_name` as in `aggregate`). `objective` (`OBJECTIVES`): PPO's clipped surrogate
    (`clip`), CISPO's, NFT's or PACS's (`score_scale` its beta); the last two read `outcome`. `ratio`: "token"
    clips per-token ratios, "sequence" (GSPO) clips each sequence's `sequence_log_ratio`, shared by (and
    differentiated through) its tokens, "turn" (Rank-GRPO's segment units) each turn's `segment_log_ratio`, `segments`
    = (each position's turn [T], the number of turns). `confidence_penalty` (None: off): ACE's shaping of negative advantages
    (`confidence_shaped`, needs `ref_log_prob`). `weight` [S, T]: a multiplier of each step's objective, outside the
    aggregation's denominator (an off-policy correction's, `jaxrl.corrections`; `old_log_prob` is then its anchor).
    Metrics: policy_loss, clip_fraction (of the ratio that is clipped), approx_kl (k3 between old and new policy
    on the per-token log ratio), and kl / entropy when given.
    """
    _check(ratio, RATIO_LEVELS, "ratio")
    _check(aggregate, AGGREGATIONS, "aggregate")
    _check(kl, KL_ESTIMATORS, "kl estimator")
    chosen = _lookup(OBJECTIVES, objective, "objective")
    if chosen.needs_outcome and outcome is None:
        raise ValueError(f"the {objective!r} objective learns from the verifier's label: pass `outcome`")
    if (chosen.needs_reference or confidence_penalty is not None) and ref_log_prob is None:
        raise ValueError(f"the {objective!r} objective / the confidence penalty reads the reference policy: pass "
                         "`ref_log_prob`")

    mask = jnp.asarray(mask, log_prob.dtype)
    valid = mask > 0

    def clean(x):
        # Zero padding before any nonlinearity: garbage there (e.g. -inf log-probs) would otherwise turn into
        # NaN values or gradients through exp, which masking afterwards cannot undo.
        return jnp.where(valid, x, 0.0)

    def agg(values):
        return _aggregate(values, mask, aggregate, constant_length, axis_name)

    log_prob, old_log_prob, advantages = clean(log_prob), clean(old_log_prob), clean(advantages)
    ref_log_prob = None if ref_log_prob is None else clean(ref_log_prob)
    token_log_ratio = log_prob - old_log_prob
    log_ratio = token_log_ratio
    if ratio == "sequence":
        log_ratio = jnp.broadcast_to(sequence_log_ratio(token_log_ratio, mask)[:, None], token_log_ratio.shape)
    if ratio == "turn":
        if segments is None:
            raise ValueError("ratio='turn' takes each position's turn: pass `segments` (turns [T], how many)")
        log_ratio = segment_log_ratio(token_log_ratio, mask, *segments)
    if confidence_penalty is not None:
        advantages = confidence_shaped(advantages, log_prob, ref_log_prob, mask, confidence_penalty)

    surrogate = chosen.fn(Surrogate(log_ratio, advantages, mask, log_prob, ref_log_prob, outcome), clip_low,
                          clip_high if clip_high is not None else clip_low, dual_clip, score_scale)
    clip_term = agg(surrogate if weight is None else clean(weight) * surrogate)
    metrics = {"policy_loss": clip_term,
               "clip_fraction": agg(clip_fraction(log_ratio, clip_low, clip_high)),
               "approx_kl": agg(KL_ESTIMATORS["k3"](token_log_ratio))}
    loss = clip_term
    if ref_log_prob is not None:
        metrics["kl"] = agg(kl_estimate(log_prob, ref_log_prob, kl))
        loss = loss + kl_coef * metrics["kl"]
    if entropy is not None:
        metrics["entropy"] = agg(clean(entropy))
        loss = loss - ent_coef * metrics["entropy"]
    return loss, metrics


def behaviour_cloning(dist, out: jax.Array, teacher_action: jax.Array) -> jax.Array:
    """The behaviour-cloning term of RPD ("Refined Policy Distillation: From VLA Generalists to RL Experts") per
    sample: -log pi(a_teacher | s), the student's negative log-likelihood of the teacher's action. `dist`: the
    student's action distribution (`jaxrl.distributions`), `out` [..., P] its outputs, `teacher_action` [...]
    (discrete: the teacher's greedy action) or [..., D] (continuous: the teacher's mean, scored by the student's
    log-density). Returns [...]."""
    return -dist.log_prob(out, teacher_action)


# The policy and value loss's config keys, read by PPO and the GRPO family alike (each may set its own defaults)
CLIP_LOW = Knob("loss.clip_low", 0.2, "the policy ratio is clipped to [1 - clip_low, 1 + clip_high]", traced=True,
                above=0.0)
CLIP_HIGH = Knob("loss.clip_high", 0.2, "the ratio's upper clip, 1 + clip_high (> clip_low: DAPO's clip-higher)",
                 traced=True, above=0.0)
DUAL_CLIP = Knob("loss.dual_clip", 0.0, "> 1: the loss of negative advantages capped at -dual_clip * A (dual-clip "
                 "PPO); 0: off", rule="0 (off) or > 1", accepts=lambda c: c == 0 or c > 1)
RATIO = Knob("loss.ratio", "token", "the importance ratio per token, per sequence (GSPO), or per turn of multi-turn "
             "episodes (Rank-GRPO's segment units)", choices=RATIO_LEVELS)
AGGREGATE = Knob("loss.aggregate", "token", "how per-token losses are averaged: over tokens, per sequence, or by a "
                 "constant length (Dr. GRPO)", choices=tuple(AGGREGATIONS))
VF_COEF = Knob("loss.vf_coef", 0.5, "the value loss's weight", traced=True, minimum=0.0)
VALUE_ENTROPY = Knob("loss.value_entropy", False, "with loss.critic_weight > 0: POISE's token-entropy statistics, the "
                     "value head reads the entropy H of the policy's token distribution at each column and H^2 beside "
                     "the hidden state (mean-pooled over a completion: its token entropy's first two moments)")
ENT_COEF = Knob("loss.ent_coef", 0.01, "the entropy bonus's weight", traced=True, minimum=0.0)
OBJECTIVE = Knob("loss.objective", "clip", "the policy objective per token: PPO's clipped surrogate (clip), CISPO's "
                 "clipped and held importance weight (cispo), NFT's implicit negative policy (nft), PACS's cross-entropy "
                 "on the verifier's label (pacs)", choices=tuple(OBJECTIVES))
SCORE_SCALE = Knob("loss.score_scale", 1.0, "pacs: beta of the score beta log pi / pi_ref that predicts the label",
                   traced=True, above=0.0)
CONFIDENCE_PENALTY = Knob("loss.confidence_penalty", 0.0, "> 0: ACE, negative advantages scaled by 1 + this x "
                          "max(log pi / pi_ref of the completion, 0): overconfident errors penalised more", traced=True,
                          minimum=0.0)
TOKEN_KEEP = Knob("loss.token_keep", 1.0, "< 1: D3S's token-level down-sampling, only this share of each batch's "
                  "tokens carries the policy loss, those of largest |advantage| x entropy", traced=True, above=0.0,
                  maximum=1.0)
SAMPLE_KEEP = Knob("loss.sample_keep", 1.0, "< 1: D3S's sample-level down-sampling, only this share of each group's "
                   "members carries the policy loss, the subset whose advantages vary most", traced=True, above=0.0,
                   maximum=1.0)
KEEP_SCHEDULE = Knob("loss.keep_schedule", 0, "> 0: D3S's dynamic schedule, loss.sample_keep and loss.token_keep rise "
                     "linearly to 1 over this many updates; 0: fixed", minimum=0)
MIN_DISTINCTIVENESS = Knob("loss.min_distinctiveness", 0.0, "> 0: DaGRPO, both completions of a pair with opposite "
                           "advantages differing at fewer than this share of positions carry no loss", traced=True,
                           minimum=0.0, maximum=1.0)
NOVELTY_SHARPENING = Knob("advantage.novelty_sharpening", 0.0, "> 0: XRPO, each positive advantage scaled by 1 + this "
                          "x how far its completion's mean log-likelihood lies below its group's", traced=True,
                          minimum=0.0)
NOVELTY_FLOOR = Knob("advantage.novelty_floor", 1.0, "with advantage.novelty_sharpening: the positive advantages' factor "
                     "is at least this; < 1: ETTRL's EAR, the correct completions more likely (lower entropy) than "
                     "their group's mean damped, down to this x A; 1: XRPO, none damped", traced=True, minimum=0.0,
                     maximum=1.0)
CONFIDENCE_CLIP = Knob("loss.confidence_clip", 0.0, "> 0, with reward.label_free: ECHO's confidence-adaptive "
                       "clipping, each group's clip_low and clip_high scaled by max(its vote confidence, this); 0: off",
                       traced=True, minimum=0.0, maximum=1.0)
CONFIDENCE_SHARE = Knob("advantage.confidence_share", 0.5, "with advantage.confidence_entropy_shaping: w, the "
                        "confidence's share of the factor w c + (1 - w)(1 - H / log V)", traced=True, minimum=0.0,
                        maximum=1.0)

SOFT_ADVANTAGE = Knob("advantage.soft", 0.0, "tau > 0: TempSamp-R1's soft advantage, each positive advantage "
                      "becomes tau log(1 + A / tau) (an off-policy ground-truth member's outlier compressed), the "
                      "negative ones unchanged; 0: off", traced=True, minimum=0.0)
CLIP_SMOOTHING = Knob("loss.clip_smoothing", 0.0, "> 0: VSPO's value-smoothing clipping: each group's clip range "
                      "(clip_low and clip_high) x max(0, 1 + this x (v - mean v)), v its task value sqrt(p (1 - p)) "
                      "(1 - p) at pass rate p, the mean over the update's groups (`value_smoothed_clip`)", traced=True,
                      minimum=0.0)
ENTROPY_SHAPING = Knob("advantage.entropy_shaping", 0.0, "> 0: each token's advantage gains min(this x its entropy, "
                       "|A| / advantage.entropy_bound) (entropy-based shaping, MSSR)", traced=True, minimum=0.0)
ENTROPY_BOUND = Knob("advantage.entropy_bound", 2.0, "with advantage.entropy_shaping: the bonus is at most |A| / this",
                     traced=True, above=0.0)
# A frozen teacher pulling the policy towards it: one pair of keys for text GRPO (KDRL) and env PPO (RPD)
TEACHER = Knob("loss.teacher", "", "a frozen teacher the policy is pulled towards: text GRPO, KL(pi || teacher) per "
               "token (KDRL), the teacher a text run directory of the same tokenizer (an earlier checkpoint, a larger "
               "SFT run) or a pretrained model (jaxrl.models: a name, a Hugging Face directory, a .gguf file); env "
               "PPO, -log pi(the teacher's greedy action) on the rollout's states (RPD), the teacher a feed-forward "
               "ppo run directory of the same env; '': none")
TEACHER_COEF = Knob("loss.teacher_coef", 0.1, "with loss.teacher: the weight of its term (text GRPO: the KL to the "
                    "teacher; env PPO: the behaviour cloning of its actions)", traced=True, minimum=0.0)
