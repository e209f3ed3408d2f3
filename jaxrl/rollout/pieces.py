"""Pieces the built-in token strategies share (`jaxrl.rollout.tokens`): pure functions, tested on their own.
Shapes: n groups of G members, N completion tokens, C candidates."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def last_occurrence(ids: jax.Array, write: jax.Array) -> jax.Array:
    """bool [n]: write[i], and no later j with write[j] has the same id. Scattering only these rows makes a
    write with repeated ids deterministic (the last one wins, on any number of devices)."""
    same = (ids[:, None] == ids[None, :]) & write[None, :]
    later = jnp.triu(same, k=1).any(axis=1)
    return write & ~later


def first_per_slot(ok: jax.Array, oversample: int, score: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """ok bool [b * O], O candidates per slot (slot-major) -> (index [b] of each slot's first candidate that
    is ok, else its last; filled bool [b]: one was). With `score` [b * O]: the ok candidate of highest score (the
    first among equals) rather than the first."""
    ok = ok.reshape(-1, oversample)
    filled = ok.any(axis=1)
    rank = ok if score is None else jnp.where(ok, score.reshape(ok.shape), -jnp.inf)  # (argmax: the first maximum)
    return jnp.arange(ok.shape[0]) * oversample + jnp.where(filled, jnp.argmax(rank, axis=1), oversample - 1), filled


def tie_ranks(scores: jax.Array) -> jax.Array:
    """[n, G] -> [n, G] ranks within each group centred on 0 and spread over [-1/2, 1/2] (the highest
    score +1/2); equal scores rank by position."""
    G = scores.shape[-1]
    ranks = jnp.argsort(jnp.argsort(scores, axis=-1, stable=True), axis=-1, stable=True)
    return ranks / max(G - 1, 1) - 0.5


def importance_weights(log_probs: jax.Array, behaviour_log_probs: jax.Array, mask: jax.Array, cap: float):
    """Per-token truncated importance weights min(pi(y_t) / mu(y_t), cap), 0 where `mask` is 0.

    pi: the current policy, mu: the one that drew the tokens (as V-trace's truncated rho). [..., N] each."""
    ratio = jnp.exp(jnp.where(mask > 0, log_probs - behaviour_log_probs, 0.0))
    return jnp.minimum(ratio, cap) * mask


def tree_advantages(rewards: jax.Array, in_tree: jax.Array, branches: int, depth, length: int, *,
                    scale: bool, eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Per-token advantages and loss weights [n, G, N] of groups sampled as trees.

    rewards [n, G]: each member's reward; a group's G members form `branches` branches of k = G / branches
    that share their first `depth` tokens (an int, or int32 [n, G]: each member's branch point). in_tree [n, G]:
    the member belongs to its branch (a replayed one does not, and is scored as an independent sample). With the group mean m and the branch mean m_b (over
    its members in the tree):
      shared prefix (t < depth): m_b - m, weight 1 / k (the k copies of one prefix count once);
      after the branch point:    r - m_b, weight 1;
      a member not in the tree:  r - m everywhere, weight 1.
    Prefix and suffix advantages add up to the flat r - m. `scale` divides by the group's std (+ eps)."""
    n, G = rewards.shape
    k = G // branches
    inside = in_tree.reshape(n, branches, k).astype(rewards.dtype)
    branch_mean = jnp.sum(rewards.reshape(n, branches, k) * inside, -1) / jnp.maximum(inside.sum(-1), 1.0)
    branch_mean = jnp.repeat(branch_mean, k, axis=1)  # [n, G]
    mean = rewards.mean(axis=1, keepdims=True)
    depth = jnp.asarray(depth)
    prefix = jnp.arange(length) < (depth[..., None] if depth.ndim else depth)  # [N] or [n, G, N]
    tree = jnp.where(prefix, (branch_mean - mean)[..., None], (rewards - branch_mean)[..., None])
    advantages = jnp.where(in_tree[..., None], tree, (rewards - mean)[..., None])
    weights = jnp.where(in_tree[..., None] & prefix, 1.0 / k, 1.0)
    if scale:
        advantages = advantages / (rewards.std(axis=1, keepdims=True)[..., None] + eps)
    return advantages, jnp.broadcast_to(weights, advantages.shape)


def allocate_groups(uncertainty: jax.Array, num_groups: int, max_groups: int) -> jax.Array:
    """Spend `num_groups` groups on candidates by their uncertainty [C] (>= 0): the candidate of each group
    [num_groups], sorted. Group k + 1 of a candidate is worth uncertainty / (k + 1) (diminishing returns), and
    the `num_groups` most valuable (candidate, k) pairs with k < max_groups are taken: the most uncertain
    candidates get up to `max_groups` groups, the least (predicted always right or always wrong) none. Never
    more than `num_groups` groups, never more than `max_groups` per candidate; ties go to the earlier one."""
    C = uncertainty.shape[0]
    if num_groups > C * max_groups:
        raise ValueError(f"{num_groups} groups cannot be spread over {C} candidates at most {max_groups} each")
    value = uncertainty[:, None] / jnp.arange(1, max_groups + 1, dtype=uncertainty.dtype)  # [C, M]
    _, best = jax.lax.top_k(value.reshape(-1), num_groups)
    return jnp.sort(best // max_groups)


def hint_update(tier: jax.Array, streak: jax.Array, pass_rate: jax.Array, *, patience: int, tiers: int,
                recover: float) -> tuple[jax.Array, jax.Array]:
    """One observation of a prompt's group -> its (tier, streak); all int32 [n] except pass_rate [n].

    A prompt that no member solves `patience` times in a row moves one hint tier up (at most `tiers`);
    one whose pass rate reaches `recover` moves one tier down (hints are taken away as it recovers)."""
    stuck = pass_rate <= 0
    streak = jnp.where(stuck, streak + 1, 0)
    up = stuck & (streak >= patience) & (tier < tiers)
    down = (pass_rate >= recover) & (tier > 0)
    tier = tier + up.astype(tier.dtype) - down.astype(tier.dtype)
    return tier, jnp.where(up, 0, streak)


def hint_lengths(tier: jax.Array, answer_lengths: jax.Array, tiers: int) -> jax.Array:
    """Tokens of the reference answer (lengths [n], EOS excluded) revealed at `tier` of `tiers`: tier k
    reveals floor(k / (tiers + 1)) of it, so even the top tier leaves the end of the answer to the model."""
    return (tier * answer_lengths) // (tiers + 1)


def difficulty_tier(pass_rate: jax.Array, tiers: int) -> jax.Array:
    """ADHint's Adaptive Hint with Sample Difficulty Prior: int32 [n] hint tier of each prompt from its pass rate
    [n] without hints under the policy (its unhinted members' at its last observation). Our reading of the
    abstract: the difficulty 1 - p sets the hint ratio, quantised to the tiers of `hint_lengths`:
    tier = floor((1 - p) * tiers + 1/2) (p = 0: the top tier, p = 1: no hint)."""
    return jnp.floor((1.0 - pass_rate) * tiers + 0.5).astype(jnp.int32)


def member_hint_lengths(hint_len: jax.Array, hinted_members: jax.Array | None, group_size: int) -> jax.Array:
    """int32 [n, G]: each member's forced hint tokens, of the group's hint_len [n]. hinted_members int32 [n] (ADHint:
    the first hinted_members[i] members of group i get the hint, the rest sample without it), or None: all do."""
    if hinted_members is None:
        return jnp.broadcast_to(hint_len[:, None], (hint_len.shape[0], group_size))
    return jnp.where(jnp.arange(group_size)[None, :] < hinted_members[:, None], hint_len[:, None], 0)


def distinct_share(tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """float32 [n]: each group's number of distinct completions / G, of tokens and mask [n, G, N]. Two members are
    the same completion where their masks agree and so do their tokens under them (padding never tells apart)."""
    shown = jnp.where(mask > 0, tokens, -1)
    same = jnp.all(shown[:, :, None] == shown[:, None, :], axis=-1)  # [n, G, G]
    repeats = jnp.tril(same, k=-1).any(axis=-1)  # an earlier member is the same: counted once, at the first
    return 1.0 - repeats.mean(axis=-1)
