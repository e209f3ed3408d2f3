"""Advantage estimators: GAE, V-trace and returns-to-go (time-major), group advantages (GRPO family)."""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import einops
import jax
import jax.numpy as jnp

from jaxrl import mesh as mesh_lib
from jaxrl.knobs import Knob
from jaxrl.losses import completion_mean


def gae(rewards: jax.Array, values: jax.Array, dones: jax.Array, last_value: jax.Array,
        gamma: float, gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation.

    Args:
      rewards, values, dones: [T, ...]; `dones[t]` means the episode ended with step t, so neither the
        value nor the advantage of step t+1 flows back into step t.
      last_value: [...] value of the observation after the last step.
    Returns:
      (advantages [T, ...], value targets = advantages + values [T, ...])
    """
    deltas, not_done = _td_errors(rewards, values, dones, last_value, gamma)
    advantages = _discounted_sums(deltas, gamma * gae_lambda * not_done)
    return advantages, advantages + values


def _td_errors(rewards, values, dones, last_value, gamma) -> tuple[jax.Array, jax.Array]:
    """One-step TD errors r_t + gamma V(s_{t+1}) - V(s_t) (no bootstrap after an episode's end) and 1 - done,
    [T, ...] each."""
    not_done = 1.0 - dones.astype(values.dtype)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    return rewards + gamma * next_values * not_done - values, not_done


def _discounted_sums(deltas: jax.Array, discounts: jax.Array) -> jax.Array:
    """x_t = deltas_t + discounts_t x_{t+1} backwards from x_T = 0. [T, ...] x2 -> [T, ...]"""
    def backward(carry, x):
        delta, discount = x
        total = delta + discount * carry
        return total, total

    return jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, discounts), reverse=True)[1]


def vtrace(rewards: jax.Array, values: jax.Array, dones: jax.Array, last_value: jax.Array,
           gamma: float, gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """On-policy V-trace (IMPALA's policy-gradient advantage, and Brax's PPO): the value targets are GAE's
    lambda-returns v_t, and step t's advantage is one reward on the next state's lambda-return,
    r_t + gamma v_{t+1} - V(s_t) (= delta_t + gamma (v_{t+1} - V(s_{t+1})): GAE's with the first lambda of its
    tail left out). Arguments and returns as `gae`."""
    _, targets = gae(rewards, values, dones, last_value, gamma, gae_lambda)
    return _one_reward_on(targets, rewards, values, dones, last_value, gamma), targets


def _one_reward_on(targets, rewards, values, dones, last_value, gamma):
    """r_t + gamma v_{t+1} - V(s_t) [T, ...]: step t's reward on the next state's target (none after an end)."""
    next_targets = jnp.concatenate([targets[1:], last_value[None]], axis=0)
    return rewards + gamma * (1.0 - dones.astype(values.dtype)) * next_targets - values


def impala(rewards: jax.Array, values: jax.Array, dones: jax.Array, last_value: jax.Array, gamma: float,
           gae_lambda: float, log_rhos: jax.Array | None = None, rho_bar: float = 1.0,
           c_bar: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Off-policy V-trace (IMPALA, Espeholt et al. 2018) for steps drawn by a behaviour policy mu and learned by
    pi, `log_rhos` [T, ...] = log pi(a_t|s_t) - log mu(a_t|s_t) (None: 0, on-policy). With
    rho_t = min(rho_bar, pi/mu), c_t = lambda min(c_bar, pi/mu) and delta_t = rho_t (r_t + gamma V(s_{t+1}) -
    V(s_t)), the targets are v_s = V(s) + sum_{t >= s} gamma^{t-s} (prod_{s <= i < t} c_i) delta_t (within the
    episode) and the advantage rho_s (r_s + gamma v_{s+1} - V(s_s)). On-policy it is `vtrace`. Arguments and
    returns otherwise as `gae`."""
    rhos = jnp.ones_like(values) if log_rhos is None else jnp.exp(log_rhos)
    rho, c = jnp.minimum(rho_bar, rhos), gae_lambda * jnp.minimum(c_bar, rhos)
    deltas, not_done = _td_errors(rewards, values, dones, last_value, gamma)
    targets = values + _discounted_sums(rho * deltas, gamma * (c * not_done))
    return rho * _one_reward_on(targets, rewards, values, dones, last_value, gamma), targets


def lambda_targets(rewards: jax.Array, next_values: jax.Array, terminated: jax.Array, dones: jax.Array,
                   gamma, lam) -> jax.Array:
    """Bootstrapped value targets over a time window: lambda-returns, and n-step returns as lam = 1.

    Args:
      rewards: [T, ...], step t's reward.
      next_values: [T, ...], the bootstrap value of the observation after step t (a target network's max, a
        double-Q estimate, ...). At an episode's end this is the value of its final observation.
      terminated: [T, ...], step t reached a terminal state (nothing follows: no bootstrap).
      dones: [T, ...], the episode ended with step t, terminated or cut by a time limit (a cut episode
        bootstraps from next_values[t], not from the next episode).
    Returns:
      [T, ...]: G_t = r_t + gamma (1 - terminated_t) B_t, where B_t = next_values[t] at the window's last
      step and where the episode ends, else (1 - lam) next_values[t] + lam G_{t+1}.
      lam = 0 gives one-step TD targets; lam = 1 the n-step return of the window (n = T - t), truncated at
      episode ends.
    """
    dtype = next_values.dtype
    keep = 1.0 - terminated.astype(dtype)
    continues = 1.0 - dones.astype(dtype)

    def backward(later, x):
        reward, next_value, keep, continues = x
        blend = (1.0 - lam) * next_value + lam * later
        target = reward + gamma * keep * (next_value + continues * (blend - next_value))
        return target, target

    _, targets = jax.lax.scan(backward, next_values[-1], (rewards, next_values, keep, continues), reverse=True)
    return targets


# --------------------------------------------------------------------------------------------------
# Group advantages (GRPO family): B groups of G samples answering the same prompt / starting state,
# each sample's advantage measured against a baseline built from its own group.
# --------------------------------------------------------------------------------------------------

SCALES = ("group", "batch", "none")


class GroupAdvantages(NamedTuple):
    advantages: jax.Array  # [B, G] or [B, G, A] float32; 0 where the sample is invalid or excluded
    weight: jax.Array  # same shape, float32 0/1: 1 where the sample carries gradient
    zero_variance: jax.Array  # [B] bool: all valid rewards of the group are equal (K components: vectors)


@dataclasses.dataclass(frozen=True)
class GroupOptions:
    """Static options handed to every core estimator (hashable, so jit treats them as constants)."""

    scale: str  # resolved: "group" | "batch" | "none"
    eps: float
    reward_weights: tuple[float, ...] | None
    renormalize: bool
    max_reward: float
    has_agents: bool  # rewards carry an agent axis: [B, G, A]
    stratum_weight: float = 0.5  # stratified: the within-stratum advantage's share, the group's the rest
    prior_weight: float = 4.0  # fused: the value prior counts as this many samples where the test accepts it
    prior_z: float = 1.96  # fused: the prior is accepted while the group mean lies within this many standard errors
    rare_weight_max: float = 4.0  # weighted_grpo: the most a group's rare outcome is weighted


# A core maps (rewards, valid, opts) to advantages, or to (advantages, keep) where keep [like rewards]
# is False for valid samples that must not carry gradient. rewards are float32 [B, G(, A)] (or
# [B, G(, A), K] for an estimator registered with combine=False), already 0 where invalid; valid is
# bool [B, G(, A)]. The wrapper from `get` does masking, combining, clipping and zero_variance.
Core = Callable[[jax.Array, jax.Array, GroupOptions], "jax.Array | tuple[jax.Array, jax.Array]"]


@dataclasses.dataclass(frozen=True)
class Estimator:
    """An entry of `ESTIMATORS`. With `needs_critic` (PPO's), `core` is fn(rewards, values, dones, last_value,
    gamma, gae_lambda) -> (advantages, value targets) over time, the targets GAE's lambda-returns; without
    (the GRPO family's), a group core as `Core` describes, called through `get`."""

    core: Callable
    default_scale: str = "group"
    combine: bool = True  # receive sum_k w_k r_k rather than the K raw components
    needs_critic: bool = False
    off_policy: bool = False  # a critic core that takes log_rhos (log pi - log mu of each step's action)
    per_turn: bool = False  # scores each turn of multi-turn episodes (`turn_advantages`), not whole samples
    # What else the core reads, as core(rewards, valid, opts, context): "strata" (each sample's stratum, int
    # [B, G(, A)]), "hinted" (each sample began with a forced hint, bool [B, G]), "baseline" (each group's tracked
    # value, float32 [B]) or "prior" (a value model's prediction of each group's mean reward from its prompt, float32
    # [B]); "": nothing
    reads: str = ""
    # Its statistics are its group's alone (no batch-level ones, nothing else read): the groups of one problem can be
    # pooled into one (`merged_by_problem`)
    merges: bool = False
    # Trains each sample given a prompt that states its return (RCRL: text GRPO rewrites the prompts,
    # `jaxrl.rewards.return_prompts`, and learns by likelihood); no other family can
    conditions: bool = False

    def __call__(self, rewards, valid, opts, context=None):
        return self.core(rewards, valid, opts) if not self.reads else self.core(rewards, valid, opts, context)


# Every advantage estimator by name, the critic's (gae, vtrace, impala) and the groups' (grpo, rloo, ...): the values of
# config.advantage.estimator (`ESTIMATOR`), each family taking the kind it computes (`check_estimator`).
ESTIMATORS: dict[str, Estimator] = {"gae": Estimator(gae, needs_critic=True),
                                    "vtrace": Estimator(vtrace, needs_critic=True),
                                    "impala": Estimator(impala, needs_critic=True, off_policy=True)}
ESTIMATOR = Knob("advantage.estimator", "grpo", "the advantage estimator (jaxrl.advantages): with a critic (gae, "
                 "vtrace, impala: PPO), over a group's samples (grpo, dr_grpo, rloo, ...: the GRPO family) or over "
                 "the turns of multi-turn episodes (turn_grpo, gigpo, mapo)",
                 choices=lambda: sorted(ESTIMATORS))


def names(needs_critic: bool, per_turn: bool = False) -> list[str]:
    """The estimators that need a critic (PPO's), or the group estimators (those of multi-turn episodes' turns with
    `per_turn`)."""
    return sorted(name for name, est in ESTIMATORS.items()
                  if est.needs_critic == needs_critic and est.per_turn == per_turn)


def check_estimator(name: str, needs_critic: bool, family: str) -> None:
    """ValueError naming config.advantage.estimator unless `name` is of the kind `family` computes."""
    if name in ESTIMATORS and ESTIMATORS[name].needs_critic != needs_critic:
        raise ValueError(f"config.advantage.estimator {name!r} is not one {family} takes; known: "
                         f"{', '.join(names(needs_critic))}")


def register(name: str, *, default_scale: str = "group", combine: bool = True, needs_critic: bool = False,
             reads: str = "", merges: bool = False, conditions: bool = False):
    """Decorator adding a core function to ESTIMATORS under `name`; returns the function unchanged. A group
    estimator's core is a `Core`; with `needs_critic` (an estimator PPO takes, as gae) it is fn(rewards, values,
    dones, last_value, gamma, gae_lambda) -> (advantages, value targets). `merges`, `conditions`: see `Estimator`."""
    if default_scale not in SCALES:
        raise ValueError(f"default_scale must be one of {SCALES}, got {default_scale!r}")

    def decorate(core: Core) -> Core:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = Estimator(core, default_scale, combine, needs_critic, reads=reads, merges=merges,
                                     conditions=conditions)
        return core

    return decorate


# ---- shared masked statistics ----------------------------------------------------------------------

def _group_axes(x: jax.Array) -> tuple[int, ...]:
    return tuple(range(1, x.ndim))  # G, and A when present: one baseline shared by the agents


def _moments(x: jax.Array, valid: jax.Array, axes: tuple[int, ...]):
    """Masked mean, population std and count of x over `axes` (reduced axes kept with size 1)."""
    n = valid.sum(axes, keepdims=True)
    # Shift by one valid value first: equal rewards then deviate by exactly 0, whereas a float mean of
    # equal values can be off by an ulp that dividing by (std + eps) would blow up.
    ref = jnp.max(jnp.where(valid, x, -jnp.inf), axes, keepdims=True)
    ref = jnp.where(n > 0, ref, 0.0)
    d = jnp.where(valid, x - ref, 0.0)
    count = jnp.maximum(n, 1)
    mean_d = d.sum(axes, keepdims=True) / count
    var = jnp.where(valid, (d - mean_d) ** 2, 0.0).sum(axes, keepdims=True) / count
    return mean_d + ref, jnp.sqrt(var), n


def _rescale(centered, group_std, x, valid, opts: GroupOptions):
    """Divide by the std the `scale` option names; `x` is what the batch std is taken over."""
    if opts.scale == "group":
        return centered / (group_std + opts.eps)
    if opts.scale == "batch":
        _, batch_std, _ = _moments(x, valid, tuple(range(x.ndim)))
        return centered / (batch_std + opts.eps)
    return centered


def _flat(x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[0], -1)  # [B, G*A], sample order g-major


def _per_group(stat: jax.Array, ndim: int) -> jax.Array:
    return stat.reshape(stat.shape[0], *([1] * (ndim - 1)))  # [B] -> broadcastable to [B, G(, A)]


def _all_equal(x: jax.Array, valid: jax.Array, lead_ndim: int) -> jax.Array:
    """[B] bool: the valid entries of each group are equal (per trailing component, if any)."""
    axes = tuple(range(1, lead_ndim))
    hi = jnp.max(jnp.where(valid, x, -jnp.inf), axes)
    lo = jnp.min(jnp.where(valid, x, jnp.inf), axes)
    return _flat(hi <= lo).all(axis=1)


# ---- estimators ------------------------------------------------------------------------------------

@register("dr_grpo", default_scale="none", merges=True)  # Dr. GRPO: the same centring, without the std division
@register("grpo", merges=True)
def grpo(rewards, valid, opts):
    """(r - group mean) / (group std + eps); [B, G(, A)] -> [B, G(, A)]."""
    mean, std, _ = _moments(rewards, valid, _group_axes(rewards))
    return _rescale(rewards - mean, std, rewards, valid, opts)


@register("rloo", default_scale="none", merges=True)
def rloo(rewards, valid, opts):
    """r_i minus the mean of the group's other valid samples; [B, G(, A)] -> [B, G(, A)]."""
    mean, std, n = _moments(rewards, valid, _group_axes(rewards))
    # Leave-one-out mean: r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean); a lone sample has no baseline.
    factor = jnp.where(n > 1, n / jnp.maximum(n - 1, 1), 0.0)
    return _rescale(factor * (rewards - mean), std, rewards, valid, opts)


@register("median", merges=True)
def median(rewards, valid, opts):
    """MC-GRPO: r - group median; with an odd valid count the median sample is excluded.

    [B, G(, A)] -> ([B, G(, A)] advantages, keep). The pivot is the first valid sample (g-major
    order) equal to the median; its advantage is 0 by construction, so giving it weight 0 lets a
    group of G + 1 samples train G of them.
    """
    r, v = _flat(rewards), _flat(valid)
    n = v.sum(axis=1)
    ranked = jnp.sort(jnp.where(v, r, jnp.inf), axis=1)  # invalid samples sort last
    lo = jnp.take_along_axis(ranked, jnp.maximum((n - 1) // 2, 0)[:, None], axis=1)[:, 0]
    hi = jnp.take_along_axis(ranked, (n // 2)[:, None], axis=1)[:, 0]
    med = jnp.where(n > 0, (lo + hi) / 2, 0.0)  # odd n: lo == hi, and (a + a) / 2 == a exactly
    is_med = v & (r == med[:, None])
    pivot = jax.nn.one_hot(jnp.argmax(is_med, axis=1), r.shape[1], dtype=bool) & (n % 2 == 1)[:, None]
    _, std, _ = _moments(rewards, valid, _group_axes(rewards))
    centered = rewards - _per_group(med, rewards.ndim)
    return _rescale(centered, std, rewards, valid, opts), ~pivot.reshape(rewards.shape)


@register("gdpo", combine=False, merges=True)
def gdpo(rewards, valid, opts):
    """GDPO: normalise each reward component within its group, then combine sum_k w_k A_k.

    rewards [B, G(, A), K] with opts.reward_weights (or [B, G(, A)] without: plain grpo) -> [B, G(, A)].
    Normalising per component keeps a rare component's success from being drowned by a common one,
    which the single std of the weighted sum does not.
    """
    components = rewards if opts.reward_weights is not None else rewards[..., None]
    weights = jnp.asarray(opts.reward_weights or (1.0,), jnp.float32)
    normalised = jax.vmap(lambda c: grpo(c, valid, opts), in_axes=-1, out_axes=-1)(components)
    advantages = normalised @ weights
    if opts.renormalize:  # keep the combined scale independent of K and of the weights
        mean, std, _ = _moments(advantages, valid, tuple(range(advantages.ndim)))
        advantages = (advantages - mean) / (std + opts.eps)
    return advantages


@register("per_agent")
def per_agent(rewards, valid, opts):
    """Dr. MAS: a separate baseline (mean, std over G) for each agent; [B, G, A] -> [B, G, A]."""
    if not opts.has_agents:
        raise ValueError("per_agent needs rewards with an agent axis: [B, G, A] (or [B, G, A, K])")
    mean, std, _ = _moments(rewards, valid, (1,))
    return _rescale(rewards - mean, std, rewards, valid, opts)


@register("calibrated", merges=True)
def calibrated(rewards, valid, opts):
    """NGRPO: statistics include one virtual sample of reward max_reward; [B, G(, A)] -> [B, G(, A)].

    The virtual success keeps an all-failed group informative: its samples get negative advantages
    instead of zeros.
    """
    r, v = _flat(rewards), _flat(valid)
    virtual = jnp.full((r.shape[0], 1), opts.max_reward, r.dtype)
    mean, std, _ = _moments(jnp.concatenate([r, virtual], 1),
                            jnp.concatenate([v, jnp.ones_like(v[:, :1])], 1), (1,))
    centered = rewards - _per_group(mean, rewards.ndim)
    return _rescale(centered, _per_group(std, rewards.ndim), rewards, valid, opts)


@register("expert_iteration", default_scale="none", merges=True)
def expert_iteration(rewards, valid, opts):
    """Expert iteration (Havrilla et al. 2024, "Teaching Large Language Models to Reason with Reinforcement
    Learning"): supervised learning on the policy's own successes. A sample whose reward reaches max_reward (the
    success threshold) gets advantage 1, the others carry no gradient: with token aggregation the policy loss is
    SFT's on the successes. [B, G(, A)] -> ([B, G(, A)], keep)."""
    return jnp.ones_like(rewards), rewards >= opts.max_reward


@register("return_conditioned", default_scale="none", merges=True, conditions=True)
def return_conditioned(rewards, valid, opts):
    """Return-conditioned RL (RCRL; Havrilla et al. 2024, "Teaching Large Language Models to Reason with
    Reinforcement Learning"): supervised learning on every sample, each given a prompt marked with the return it
    achieved (text GRPO: the verifier's correct reward), so that a prompt marked with the high return
    asks for what successes look like. Every valid sample gets advantage 1 (the wrong ones learn too, under their
    own mark); text GRPO rewrites the prompts and takes the mean token NLL (`TextGRPO._conditioned_nll`).
    [B, G(, A)] -> [B, G(, A)]."""
    return jnp.ones_like(rewards)


@register("weighted_grpo", merges=True)
def weighted_grpo(rewards, valid, opts):
    """Weighted GRPO ("Beyond Variance: Prompt-Efficient RLVR via Rare-Event Amplification and Bidirectional
    Pairing"): GRPO's group-normalised advantage A_i (scaled as opts.scale says), multiplied by a weight that amplifies
    the group's rare outcome. Our reading of the abstract: with o_i = 1[r_i >= max_reward] (a success) and p the
    group's success rate,
        w_+ = clip((1 - p) / p, 1, rare_weight_max) on successes,
        w_- = clip(p / (1 - p), 1, rare_weight_max) on failures,
    A'_i = w_{o_i} A_i: a hard-but-solvable prompt (q+, p < 1/2) has its rare successes weighted by how outnumbered
    they are (1 of 8: 7, capped) into sharp positive guidance, an easy-but-brittle one (q-, p > 1/2) its rare failures
    into strong negative penalties; the common outcome keeps weight 1, and p = 1/2 is GRPO. The weights multiply the
    normalised advantages rather than the rewards: a (mean, std) normalisation of two-valued rewards undoes any
    weighting of their values. The paper weighs a pair (q+, q-) of prompts drawn together (`rollout.replay=pairing`);
    each group here takes its weights from its own success rate, which gives the pair's q+ and q- exactly those roles
    and works on any batch. A group of one outcome (p = 0 or 1) weighs 1 throughout: GRPO's advantages (the
    well-formedness reward may still tell its members apart). [B, G(, A)] -> [B, G(, A)]."""
    success = rewards >= opts.max_reward
    p, _, _ = _moments(success.astype(jnp.float32), valid, _group_axes(rewards))
    tiny = 1e-6  # (p = 0: w_+ is never used, and w_- = 0 clips to 1; p = 1 likewise: only the division needs guarding)
    w_plus = jnp.clip((1.0 - p) / jnp.maximum(p, tiny), 1.0, opts.rare_weight_max)
    w_minus = jnp.clip(p / jnp.maximum(1.0 - p, tiny), 1.0, opts.rare_weight_max)
    return jnp.where(success, w_plus, w_minus) * grpo(rewards, valid, opts)


@register("stratified", reads="strata")
def stratified(rewards, valid, opts, strata):
    """Stratified GRPO's SAN: each sample against the members of its group in its own stratum (the same structure,
    e.g. as many tool calls), (r - stratum mean) / (stratum std + eps), blended with the group's advantage:
    w A_stratum + (1 - w) A_group (w: `stratum_weight`). [B, G(, A)], strata int [B, G(, A)] -> [B, G(, A)]. A sample
    alone in its stratum has no peers: its stratum advantage is 0."""
    axes = _group_axes(rewards)
    same = (strata.reshape(strata.shape[0], -1)[:, :, None] == strata.reshape(strata.shape[0], -1)[:, None, :])
    flat_r, flat_v = _flat(rewards), _flat(valid)
    peers = same & flat_v[:, None, :]  # [B, M, M]: valid members of each sample's stratum
    count = jnp.maximum(peers.sum(-1), 1)
    mean = jnp.sum(jnp.where(peers, flat_r[:, None, :], 0.0), -1) / count
    var = jnp.sum(jnp.where(peers, jnp.square(flat_r[:, None, :] - mean[..., None]), 0.0), -1) / count
    within = (flat_r - mean) / (jnp.sqrt(var) + opts.eps) if opts.scale != "none" else flat_r - mean
    group_mean, group_std, _ = _moments(rewards, valid, axes)
    overall = _rescale(rewards - group_mean, group_std, rewards, valid, opts)
    return opts.stratum_weight * within.reshape(rewards.shape) + (1.0 - opts.stratum_weight) * overall


@register("hint_posterior", reads="hinted")
def hint_posterior(rewards, valid, opts, hinted):
    """ADHint's Advantage Estimation with Rollout Difficulty Posterior ("ADHint: Adaptive Hints with Difficulty
    Priors for Reinforcement Learning"): hinted bool [B, G] marks each member that began with the hint
    (`rollout.options.hints.adaptive`). Our reading of the abstract: the group's rollouts with and without the hint
    faced different difficulties, whose posteriors are 1 - the mean reward of each condition's members; each
    rollout is judged against its own condition, A = (r - mean of its condition's rewards) / (group std + eps)
    (scale none: not divided), so hinted successes (easy) are not over-credited and unhinted failures (hard) not
    over-punished. A group of one condition gets GRPO's advantage. [B, G] -> [B, G]."""
    flat_r, flat_v, flat_s = _flat(rewards), _flat(valid), _flat(hinted)
    peers = (flat_s[:, :, None] == flat_s[:, None, :]) & flat_v[:, None, :]  # [B, M, M]
    mean = jnp.sum(jnp.where(peers, flat_r[:, None, :], 0.0), -1) / jnp.maximum(peers.sum(-1), 1)
    _, group_std, _ = _moments(rewards, valid, _group_axes(rewards))
    return _rescale(rewards - mean.reshape(rewards.shape), group_std, rewards, valid, opts)


@register("tracked", default_scale="batch", reads="baseline")
def tracked(rewards, valid, opts, baseline):
    """SPO (single-stream policy optimisation): each sample against its problem's persistent tracked value (the
    baseline [B], read before this update's rewards join it: `rollout.replay=tracker`), not against its group, so
    that one sample per prompt (G = 1) suffices and an all-equal group still teaches; scaled by the batch's std
    (SPO's global normalisation). [B, G(, A)] -> [B, G(, A)]."""
    _, std, _ = _moments(rewards, valid, _group_axes(rewards))
    centered = rewards - _per_group(baseline, rewards.ndim)
    return _rescale(centered, std, centered, valid, opts)  # (scale batch: by the std of the batch's advantages)


@register("fused", default_scale="none", reads="prior", merges=True)  # (a prompt's prior is its groups')
def fused(rewards, valid, opts, prior):
    """V_0.5: the baseline fuses a value model's prior V (its prediction of the group's mean reward from the prompt,
    clipped to the rewards' range [0, max_reward]) with the group's empirical mean m of n samples, after a test of the
    prior's reliability: while |m - V| <= prior_z sqrt(V' (1 - V') / n) (V' = V clipped to [0.01, 0.99]: rewards in
    [0, 1]) the prior is accepted and counts as prior_weight samples, b = (n m + k V) / (n + k) (a lower-variance
    baseline for small groups); else b = m.
    r - b, in the reward's units by default (a group whose rewards tie has std 0 but, against the prior, an advantage:
    dividing by its std would blow it up); scale batch divides by the batch's std. [B, G(, A)] -> [B, G(, A)]."""
    axes = _group_axes(rewards)
    mean, std, n = _moments(rewards, valid, axes)
    v = jnp.clip(_per_group(prior, rewards.ndim), 0.0, opts.max_reward)  # a value model's output may leave that range
    accepted = prior_accepted(mean, v, n, opts.prior_z)
    baseline = jnp.where(accepted, (n * mean + opts.prior_weight * v) / (n + opts.prior_weight), mean)
    return _rescale(rewards - baseline, std, rewards, valid, opts)


def prior_accepted(mean: jax.Array, prior: jax.Array, n: jax.Array, z: float) -> jax.Array:
    """V_0.5's test of a value prior V (clipped to the rewards' range) against a group's mean m of n samples:
    |m - V| <= z sqrt(V' (1 - V') / n), V' = V clipped to [0.01, 0.99] (rewards in [0, 1]). Broadcasting -> bool."""
    p = jnp.clip(prior, 0.01, 0.99)
    return jnp.abs(mean - prior) <= z * jnp.sqrt(p * (1.0 - p) / jnp.maximum(n, 1))


def beta_fit(pass_rates: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Beta(alpha, beta) fitted to the groups' pass rates by the method of moments. [B], [B] bool -> two scalars.

    mean m and variance v over the valid groups: alpha = m k, beta = (1 - m) k, k = m (1 - m) / v - 1 (v kept
    inside (0, m (1 - m)), where a Beta exists)."""
    n = jnp.maximum(valid.sum(), 1)
    m = jnp.clip(jnp.sum(jnp.where(valid, pass_rates, 0.0)) / n, 1e-3, 1.0 - 1e-3)
    v = jnp.sum(jnp.where(valid, jnp.square(pass_rates - m), 0.0)) / n
    v = jnp.clip(v, 1e-6, m * (1.0 - m) * (1.0 - 1e-3))
    k = m * (1.0 - m) / v - 1.0
    return m * k, (1.0 - m) * k


def beta_normalised(rewards: jax.Array, valid: jax.Array, a, b) -> jax.Array:
    """(r - p) / Beta(a, b).pdf(p), p the group's pass rate. [B, G(, A)] -> [B, G(, A)]

    a = b = 1 is REINFORCE with the group mean as baseline, a = b = 3/2 GRPO's (r - p) / sqrt(p (1 - p)) (up to the
    constant B(3/2, 3/2)): the Beta family spans both. A group whose members all agree gets 0."""
    p, _, _ = _moments(rewards, valid, _group_axes(rewards))
    inside = jnp.clip(p, 1e-6, 1.0 - 1e-6)
    log_pdf = (a - 1.0) * jnp.log(inside) + (b - 1.0) * jnp.log1p(-inside) - jax.scipy.special.betaln(a, b)
    return jnp.where(valid, (rewards - p) * jnp.exp(-log_pdf), 0.0)


@register("bnpo", default_scale="none", combine=False)
def bnpo(rewards, valid, opts):
    """BNPO (Beta normalisation): rewards in {0, 1} normalised by a Beta density whose parameters follow the policy.

    rewards [B, G(, A), K] (or [B, G(, A)]) -> [B, G(, A)]. Per reward component: Beta(alpha, beta) is fitted to
    this batch's pass rates (`beta_fit`), and the advantage is `beta_normalised` with a = 1 + alpha / 3,
    b = 1 + beta / 3, BNPO's variance-minimising choice; the components' advantages are then weighted and summed
    (its advantage decomposition). `scale` other than none divides the result once more."""
    components = rewards if opts.reward_weights is not None else rewards[..., None]
    weights = jnp.asarray(opts.reward_weights or (1.0,), jnp.float32)

    def one(component):
        p, _, _ = _moments(component, valid, _group_axes(component))
        alpha, beta = beta_fit(_flat(p)[:, 0], _flat(valid).any(axis=1))
        return beta_normalised(component, valid, 1.0 + alpha / 3.0, 1.0 + beta / 3.0)

    advantages = jax.vmap(one, in_axes=-1, out_axes=-1)(components) @ weights
    _, std, _ = _moments(advantages, valid, _group_axes(advantages))
    return _rescale(advantages, std, advantages, valid, opts)


# ---- public entry points -----------------------------------------------------------------------------

def _broadcast_mask(mask, lead_shape: tuple[int, ...]) -> jax.Array:
    """Leading-aligned broadcast: a [B, G] mask applies to every agent of [B, G, A] rewards."""
    if mask is None:
        return jnp.ones(lead_shape, bool)
    mask = jnp.asarray(mask).astype(bool)
    if mask.ndim > len(lead_shape):
        raise ValueError(f"mask shape {mask.shape} has more axes than the samples {lead_shape}")
    return jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (len(lead_shape) - mask.ndim)), lead_shape)


def get(name: str) -> Callable[..., GroupAdvantages]:
    """The estimator `name` wrapped with masking, component combining, scaling default and clipping.

    The returned fn(rewards, mask=None, *, scale=None, eps=1e-6, clip=None, reward_weights=None,
    renormalize=False, max_reward=1.0, strata=None, hinted=None, baseline=None, prior=None, stratum_weight=0.5,
    prior_weight=4.0, prior_z=1.96, rare_weight_max=4.0) takes rewards [B, G] or [B, G, A] (with a
    trailing K axis when reward_weights has K entries) and a bool mask broadcastable to [B, G(, A)] (leading-aligned);
    `strata` (int, the rewards' leading shape), `baseline` and `prior` (float32 [B]) only for an estimator that reads
    them (`stratified`, `tracked`, `fused`); the other
    options are static Python values, so it can be jitted.
    """
    if name not in names(needs_critic=False):
        per_turn = " (a per-turn estimator: `turn_advantages`)" if name in names(False, per_turn=True) else ""
        raise ValueError(f"unknown group advantage estimator {name!r}{per_turn}; known: {', '.join(names(False))}")
    est = ESTIMATORS[name]

    def estimate(rewards, mask=None, *, scale=None, eps=1e-6, clip=None, reward_weights=None,
                 renormalize=False, max_reward=1.0, strata=None, hinted=None, baseline=None, prior=None,
                 stratum_weight=0.5, prior_weight=4.0, prior_z=1.96, rare_weight_max=4.0) -> GroupAdvantages:
        rewards = jnp.asarray(rewards, jnp.float32)
        k = None if reward_weights is None else len(reward_weights)
        lead = rewards.shape[:-1] if k is not None else rewards.shape
        if len(lead) not in (2, 3):
            raise ValueError(f"{name}: rewards must be [B, G] or [B, G, A]"
                             f"{' plus a K axis' if k is not None else ''}, got shape {rewards.shape}")
        if k is not None and rewards.shape[-1] != k:
            raise ValueError(f"{name}: {k} reward_weights but rewards have {rewards.shape[-1]} components")
        if scale not in (None, *SCALES):
            raise ValueError(f"{name}: scale must be one of {SCALES} or None, got {scale!r}")
        opts = GroupOptions(scale or est.default_scale, float(eps),
                            None if k is None else tuple(float(w) for w in reward_weights),
                            bool(renormalize), float(max_reward), has_agents=len(lead) == 3,
                            stratum_weight=float(stratum_weight), prior_weight=float(prior_weight),
                            prior_z=float(prior_z), rare_weight_max=float(rare_weight_max))
        valid = _broadcast_mask(mask, lead)
        valid_r = valid[..., None] if k is not None else valid
        rewards = jnp.where(valid_r, rewards, 0.0)  # cores may rely on padding being 0 (never NaN or junk)
        zero_variance = _all_equal(rewards, valid_r, len(lead))
        if k is not None and est.combine:
            rewards = rewards @ jnp.asarray(opts.reward_weights, jnp.float32)
        context = {"strata": strata, "hinted": hinted, "baseline": baseline, "prior": prior}.get(est.reads)
        if est.reads and context is None:
            raise ValueError(f"{name}: the estimator reads `{est.reads}`: pass it")
        out = est(rewards, valid, opts, None if context is None else jnp.asarray(context))
        advantages, keep = out if isinstance(out, tuple) else (out, True)
        if clip:
            advantages = jnp.clip(advantages, -clip, clip)
        weight = valid & keep
        return GroupAdvantages(jnp.where(weight, advantages, 0.0).astype(jnp.float32),
                               weight.astype(jnp.float32), zero_variance)

    estimate.__name__ = estimate.__qualname__ = f"{name}_advantages"
    return estimate


def group_advantages(name: str, rewards, mask=None, **options) -> GroupAdvantages:
    """`get(name)(rewards, mask, **options)`: advantages/weight [B, G(, A)], zero_variance [B]."""
    return get(name)(rewards, mask, **options)


def merged_by_problem(estimate: Callable[..., GroupAdvantages], rewards, ids, *, over_devices: bool = False,
                      **options) -> GroupAdvantages:
    """`estimate` (a `get` estimator whose `Estimator.merges`) with the groups of one problem pooled into one group:
    each group's baseline and scale come from all k x G members of its problem's k groups (DARS's enlarged groups,
    "Depth-Breadth Synergy in RLVR"; a prompt given k groups by a budget, or drawn twice from a pool).

    rewards [n, G(, A)(, K)], ids int32 [n] (a problem's id; -1: a group of its own) -> advantages/weight
    [n, G(, A)], zero_variance [n] (of the pooled group). With `over_devices` (inside shard_map over the data axis)
    the groups of every device are pooled, so the result does not depend on how many devices share them. Each of
    the n groups sees all M groups' members masked to those of its problem: O(n M G) memory."""
    rewards, ids = jnp.asarray(rewards, jnp.float32), jnp.asarray(ids)
    n, G = rewards.shape[:2]
    every, every_ids = (mesh_lib.gather_shares((rewards, ids)) if over_devices else (rewards, ids))
    own = mesh_lib.local_indices(n) if over_devices else jnp.arange(n)  # [n]: each group's index among the M
    M = every.shape[0]
    pooled = (every_ids[None, :] == ids[:, None]) & (ids[:, None] >= 0) | (jnp.arange(M)[None, :] == own[:, None])
    out = estimate(jnp.broadcast_to(every.reshape(1, M * G, *every.shape[2:]), (n, M * G, *every.shape[2:])),
                   jnp.repeat(pooled, G, axis=1), **options)  # [n, M x G(, A)]: one pooled group per local group
    mine = lambda x: x.reshape(n, M, G, *x.shape[2:])[jnp.arange(n), own]  # noqa: E731  (its own G members)
    return GroupAdvantages(mine(out.advantages), mine(out.weight), out.zero_variance)


def stepwise_group_advantages(name: str, returns, mask=None, **options) -> GroupAdvantages:
    """A separate group baseline at every time step.

    returns: [B, G, T] or [B, G, T, A] (e.g. returns-to-go; plus a K axis with reward_weights);
    mask broadcastable (leading-aligned) to [B, G, T(, A)]. Returns advantages/weight [B, G, T(, A)]
    and zero_variance [B, T]. Batch-level statistics (scale="batch", renormalize) span all steps.
    """
    returns = jnp.asarray(returns)
    lead = returns.shape[:-1] if options.get("reward_weights") is not None else returns.shape
    if len(lead) not in (3, 4):
        raise ValueError(f"{name}: returns must be [B, G, T] or [B, G, T, A], got shape {returns.shape}")
    steps = lead[2]
    to_batch = lambda x: einops.rearrange(x, "b g t ... -> (b t) g ...")  # noqa: E731
    from_batch = lambda x: einops.rearrange(x, "(b t) g ... -> b g t ...", t=steps)  # noqa: E731
    out = group_advantages(name, to_batch(returns), to_batch(_broadcast_mask(mask, lead)), **options)
    return GroupAdvantages(from_batch(out.advantages), from_batch(out.weight),
                           einops.rearrange(out.zero_variance, "(b t) -> b t", t=steps))


def returns_to_go(rewards: jax.Array, alive: jax.Array, gamma: float) -> jax.Array:
    """R_t = sum_{k>=t} gamma^(k-t) r_k alive_k, time-major: rewards, alive [T, ...] -> [T, ...].

    alive[t] is 1 while the episode runs at step t and 0 after it ended; R_t is 0 where not alive
    (a dead step also cuts the sum, so nothing after it leaks back).
    """
    rewards = jnp.asarray(rewards)
    rewards = rewards.astype(jnp.promote_types(rewards.dtype, jnp.float32))
    alive = jnp.asarray(alive).astype(rewards.dtype)

    def backward(future, x):
        reward, keep = x
        ret = keep * (reward + gamma * future)
        return ret, ret

    _, returns = jax.lax.scan(backward, jnp.zeros_like(rewards[0]), (rewards, alive), reverse=True)
    return returns


# --------------------------------------------------------------------------------------------------
# Turn-level estimators (multi-turn episodes, `jaxrl.multi_turn`): B groups of G episodes of up to K turns, each
# turn scored against baselines built from the group's turns. Inputs: rewards [B, G, K] (each turn's reward),
# taken bool [B, G, K] (the turn was played), anchors int32 [B, G, K] (the environment's state before the turn).
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TurnOptions:
    gamma: float = 1.0  # discount between turns of the returns-to-go
    step_weight: float = 1.0  # gigpo: the step-level advantage's weight beside the episode's
    turn_mix: float = 0.5  # mapo: the turn-level normalisation's share (the batch-level one has the rest)
    eps: float = 1e-6
    scale: bool = True  # divide by the std of the group the baseline comes from


def register_turns(name: str):
    """Decorator adding a turn-level core fn(returns [B, G, K], taken, anchors, opts) -> [B, G, K] to ESTIMATORS."""
    def decorate(core):
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = Estimator(core, per_turn=True)
        return core
    return decorate


def turn_returns(rewards: jax.Array, taken: jax.Array, gamma: float) -> jax.Array:
    """Returns-to-go over turns: R_k = sum_{j >= k} gamma^(j - k) r_j over the turns taken; [B, G, K]."""
    rewards = jnp.where(taken, rewards, 0.0)
    discounts = jnp.full(rewards.shape, gamma, rewards.dtype)
    to_go = _discounted_sums(jnp.moveaxis(rewards, -1, 0), jnp.moveaxis(discounts, -1, 0))
    return jnp.where(taken, jnp.moveaxis(to_go, 0, -1), 0.0)


def _normalised(x, valid, axes, opts: TurnOptions):
    mean, std, _ = _moments(x, valid, axes)
    centred = x - mean
    return jnp.where(valid, centred / (std + opts.eps) if opts.scale else centred, 0.0)


@register_turns("turn_grpo")
def turn_grpo(returns, taken, anchors, opts: TurnOptions):
    """Turn-level GRPO: turn k's return-to-go against the group's episodes at their turn k (each turn index its
    own baseline: `stepwise_group_advantages` over turns)."""
    return _normalised(returns, taken, (1,), opts)


@register_turns("gigpo")
def gigpo(returns, taken, anchors, opts: TurnOptions):
    """GiGPO (Feng et al. 2025, group-in-group policy optimisation): the episode's return against its group's
    (macro, GRPO's, given to every turn) plus `step_weight` x each turn's return-to-go against the turns, across
    the group's episodes and turns, that start from the same anchor state (micro: its step group; a state met
    once gets 0)."""
    first = taken[..., :1]
    episode = _normalised(returns[..., :1], first, (1, 2), opts)  # R_0 = the episode's return
    same = (anchors[:, :, :, None, None] == anchors[:, None, None, :, :]) & taken[:, None, None, :, :]  # [B,G,K,G,K]
    count = same.sum((3, 4))
    mean = jnp.sum(same * returns[:, None, None], (3, 4)) / jnp.maximum(count, 1)
    var = jnp.sum(same * (returns[:, None, None] - mean[..., None, None]) ** 2, (3, 4)) / jnp.maximum(count, 1)
    centred = returns - mean
    step = jnp.where(taken & (count > 1), centred / (jnp.sqrt(var) + opts.eps) if opts.scale else centred, 0.0)
    return jnp.where(taken, episode + opts.step_weight * step, 0.0)


@register_turns("mapo")
def mapo(returns, taken, anchors, opts: TurnOptions):
    """MAPO (mixed advantage policy optimisation): Monte Carlo returns-to-go normalised at the turn level (against
    the group's episodes at the same turn) and at the batch level (against every turn of the batch), mixed
    `turn_mix` : 1 - `turn_mix`."""
    turn = _normalised(returns, taken, (1,), opts)
    batch = _normalised(returns, taken, (0, 1, 2), opts)
    return opts.turn_mix * turn + (1.0 - opts.turn_mix) * batch


def turn_advantages(name: str, rewards: jax.Array, taken: jax.Array, anchors: jax.Array, **options) -> jax.Array:
    """A per-turn estimator's advantages [B, G, K] (0 on turns not taken) from each turn's reward [B, G, K];
    options: `TurnOptions`' fields."""
    if name not in names(needs_critic=False, per_turn=True):
        raise ValueError(f"unknown turn-level advantage estimator {name!r}; known: "
                         f"{', '.join(names(False, per_turn=True))}")
    opts = TurnOptions(**options)
    return ESTIMATORS[name].core(turn_returns(rewards, taken, opts.gamma), taken, anchors, opts)


def process_returns(token_rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """Dense process rewards as advantages before scaling (PRIME, Cui et al. 2025): token_rewards, mask [B, G, N] ->
    [B, G, N]. Each completion's rewards less the leave-one-out baseline of its group (the mean, over the other
    G - 1 completions, of their mean reward per token), then summed to go: A_t = sum_{s >= t} (r_s - b). 0 off the
    mask. The caller scales them (`engine.standardise` over the batch) and adds them to the outcome advantages."""
    real = mask > 0
    G = token_rewards.shape[1]
    per_token = jnp.sum(jnp.where(real, token_rewards, 0.0), -1) / jnp.maximum(jnp.sum(real, -1), 1)  # [B, G]
    others = (jnp.sum(per_token, axis=1, keepdims=True) - per_token) / max(G - 1, 1)
    centred = jnp.where(real, token_rewards - others[..., None], 0.0)
    return jnp.where(real, jnp.flip(jnp.cumsum(jnp.flip(centred, -1), -1), -1), 0.0)


CROSS_ROLLOUT = Knob("advantage.cross_rollout", False, "with loss.critic_weight > 0 and group.size >= 2: POISE's "
                     "cross-rollout baseline, member g's critic term is its weighted reward less the value head's mean "
                     "over the completion of member (g + 1) mod G (another rollout's states; not standardised, so that "
                     "no statistic of its own reward enters its baseline)")


def cross_rollout_baseline(values: jax.Array, mask: jax.Array) -> jax.Array:
    """POISE's cross-rollout baseline ("Your Language Model is Its Own Critic: Reinforcement Learning with Value
    Estimation from Actor's Internal States"): values, mask [B, G, N] (the value head before each completion token,
    G >= 2 independent rollouts of each prompt) -> float32 [B, G].

    Our reading of the abstract: the probe's prediction from a rollout's internal states is the mean of the value head
    over that rollout's completion tokens (a linear probe on its mean-pooled final hidden states, and with
    loss.value_entropy its mean token entropy statistics); member g's baseline is that prediction from member
    (g + 1) mod G, so that it depends on another rollout's tokens only: with the members drawn independently given the
    prompt, E[grad log pi(y_g) * baseline] = 0 and the policy gradient stays unbiased. A completion with no tokens
    predicts 0."""
    return jnp.roll(completion_mean(values, mask), -1, axis=1)  # [:, g] <- member (g + 1) mod G's


def cross_rollout_advantages(returns: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """POISE's critic term: returns [B, G] (each completion's weighted reward), values, mask [B, G, N] -> [B, G, N],
    returns less `cross_rollout_baseline`, broadcast over every token and 0 off the mask (not standardised: a batch
    mean or scale would hold the member's own reward)."""
    advantage = returns - cross_rollout_baseline(values, mask)
    return jnp.where(mask > 0, advantage[..., None], 0.0)
