"""What a group's sampled completions earn, shaped before their advantages, and which of their tokens carry loss:
label-free majority votes (TTRL, MM-UPT) and ECHO's vote confidence, ARLCP's length penalty, PRS's progressive
shaping, AHPO's sparse-reward gate, RCRL's return-marked prompts, DAPO's overlong filtering, and best-of-k by a value
head (ARRoL). Pure functions of arrays: n groups, G members, N tokens, K reward components."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl import sampling


def return_tokens(vocab) -> tuple[int, int]:
    """RCRL's two return marks (high, low) of the small model's vocabulary: its BOS, which opens every prompt the
    task renders (so sampling and greedy evaluation ask for a success as they are, and a warm start's SFT on
    correct answers already reads it so), and EOS, which no prompt holds, in BOS's place for a failure. Reusing
    these two specials keeps the vocabulary, and with it a warm start's embedding, unchanged."""
    return vocab.bos_id, vocab.eos_id


def return_prompts(prompts: jax.Array, success: jax.Array, vocab) -> jax.Array:
    """Return-conditioned RL's prompts (Havrilla et al. 2024): left-padded prompts [b, P] -> [b, G, P], member g's
    prompt with its BOS replaced by the mark of its return (`return_tokens`: high where `success` bool [b, G],
    low elsewhere)."""
    high, low = return_tokens(vocab)
    mark = jnp.where(success, high, low).astype(prompts.dtype)[..., None]  # [b, G, 1]
    tiled = jnp.broadcast_to(prompts[:, None], (*success.shape, prompts.shape[-1]))
    return jnp.where(tiled == vocab.bos_id, mark, tiled)


def length_penalised(rewards: jax.Array, lengths: jax.Array, difficulty: jax.Array, correct: int, penalty: float,
                     max_length: int) -> jax.Array:
    """ARLCP's complexity-calibrated length penalty: rewards [n, G, K] whose `correct` component, where positive, loses
    penalty x (1 - difficulty [n]) x lengths [n, G] / max_length: the easier the problem, the more a long correct
    answer costs; wrong answers are not charged."""
    cost = penalty * (1.0 - difficulty)[:, None] * lengths / max_length
    return rewards.at[..., correct].add(-jnp.where(rewards[..., correct] > 0, cost, 0.0))


def progressive_rewards(rewards: jax.Array, update_step, updates: int, correct: int, formed: int) -> jax.Array:
    """PRS's progressive reward shaping (Enhancing Agentic RL with Progressive Reward Shaping and Value-based Sampling
    Policy Optimization): first master the format, then correctness. Our reading of its stage-wise rewards: a linear
    curriculum over `updates` updates, a = min(update_step / updates, 1) (traced), in which the `correct` component
    of rewards [n, G, K] becomes a c + (1 - a) f, f the `formed` (well_formed) component. Under the weights
    (w_c, w_f) the weighted reward is then a w_c c + (w_f + (1 - a) w_c) f: at update 0 all the weight is on the
    format (w_c + w_f, the reward's scale kept), from update `updates` on it is the configured weighting. Mixing the
    components rather than the weights keeps the estimators' weights static."""
    a = jnp.minimum(jnp.asarray(update_step, jnp.float32) / updates, 1.0)
    return rewards.at[..., correct].set(a * rewards[..., correct] + (1.0 - a) * rewards[..., formed])


def sparse_rewards(correct: jax.Array, sampled: jax.Array, below: float) -> jax.Array:
    """bool [n]: AHPO's gate (MM-HELIX), a group's pass rate is at most `below`; the rate over its members the policy
    sampled (`sampled` bool [n, G]: replays excluded, the reference answer of replay=reference among them) of
    `correct` bool [n, G]; a group with none sampled has rate 0."""
    rate = jnp.sum(correct & sampled, axis=-1) / jnp.maximum(jnp.sum(sampled, axis=-1), 1)
    return rate <= below


def majority_votes(tokens: jax.Array, mask: jax.Array, formed: jax.Array) -> jax.Array:
    """bool [n, G]: each completion agrees with its group's majority answer, the most common of the well-formed
    (`formed` [n, G]) completions [n, G, N] (identical tokens up to their end; ties to the earliest); a group with no
    well-formed completion has no majority."""
    answers = jnp.where(mask > 0, tokens, -1)
    same = jnp.all(answers[:, :, None] == answers[:, None, :], axis=-1)  # [n, G, G]
    votes = jnp.sum(same & formed[:, None, :], axis=-1)  # [n, G]: well-formed completions agreeing with each
    winner = jnp.argmax(jnp.where(formed, votes, -1), axis=1)  # [n]
    agrees = jnp.take_along_axis(same, winner[:, None, None], axis=1)[:, 0]  # [n, G]
    return agrees & formed & formed.any(axis=1, keepdims=True)


def vote_confidence(agrees: jax.Array, formed: jax.Array) -> jax.Array:
    """float32 [n]: ECHO's confidence in each group's majority-vote pseudo-label, the share of its well-formed
    completions (`formed` bool [n, G]) that agree with it (`agrees` bool [n, G], `majority_votes`): in [1/G, 1], 0
    for a group with none well-formed (it has no label)."""
    return jnp.sum(agrees & formed, axis=-1) / jnp.maximum(jnp.sum(formed, axis=-1), 1)


def head_scores(values: jax.Array, mask: jax.Array) -> jax.Array:
    """float32 [..., k]: each of k samples' success as the value head last predicted it, before the sample's last
    token (values, mask float32 [..., k, N]: `Samples.values`, `Samples.mask`; an empty sample: column 0). The last
    prediction is the head's best-informed one (ARRoL reuses its rollout quality head at test time)."""
    last = jnp.maximum(mask.sum(-1).astype(jnp.int32) - 1, 0)
    return jnp.take_along_axis(values, last[..., None], axis=-1)[..., 0]


def best_by_head(rewards: jax.Array, scores: jax.Array) -> jax.Array:
    """[...]: the reward of the sample the head scores highest among k (rewards, scores [..., k]; a tie: the
    first), best-of-k by the value head (ARRoL's test-time selection): between pass@1 and pass@k."""
    pick = jnp.argmax(scores, axis=-1)
    return jnp.take_along_axis(rewards, pick[..., None], axis=-1)[..., 0]


def truncated(tokens: jax.Array, mask: jax.Array, eos_id: int, pruned: jax.Array | None = None) -> jax.Array:
    """bool [..., G]: completions [..., G, N] cut off by the length limit, without an EOS among their tokens (members a
    Control strategy stopped early, `pruned`, were not cut off)."""
    cut = ~(sampling.is_eos(tokens, eos_id) & (mask > 0)).any(-1)
    return cut if pruned is None else cut & ~pruned


def kept_tokens(cut: jax.Array, advantages: jax.Array, how: str) -> jax.Array:
    """float32 [..., G, N]: 0 on the tokens loss.truncated drops: every token of a cut-off completion (mask), or those
    whose advantage is negative (mask_negative); 1 elsewhere."""
    dropped = cut[..., None] & ((advantages < 0) if how == "mask_negative" else True)
    return (~dropped).astype(jnp.float32)
