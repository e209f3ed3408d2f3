"""Jitted autoregressive sampling from a language model with a KV cache (`jaxrl.transformer.TransformerLM` or
`jaxrl.models.Decoder`: the same four methods), and teacher-forced scoring.

Conventions shared by `sample` and `score`:
- prompts int32 [B, P] are LEFT-padded with `pad_id`: every prompt ends at column P-1, and a row's real
  tokens are everything from its first non-pad column on (so a pad_id inside a prompt stays real);
- positions count real tokens only (first real token is position 0), so the amount of left padding
  changes nothing; attention never sees padding;
- completions [B, N]: column t of a completion sits at sequence column P + t. After a row emits EOS all
  later tokens are pad_id with mask 0, and they are never attended to.
- log_probs are log softmax of the model's raw logits (temperature 1, no top-k/top-p) at the sampled
  token: the policy probability the RL loss needs, not the probability under the sampling
  distribution actually used (they coincide for temperature 1, top_k 0, top_p 1).
- values[:, t] is the value head at the column that PREDICTS token t (the state before emitting it).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl import distributions
from jaxrl.loops import scan_until
from jaxrl.transformer import TransformerLM


CDF_BLOCK = 128  # indices per block of `inverse_cdf`'s first level


class Samples(NamedTuple):
    """Output of `sample`: leaves [B, N] (N = max_new_tokens) or [B, G, N] from `sample_groups`."""

    tokens: jax.Array  # int32, pad_id after EOS
    log_probs: jax.Array  # float32, log p(token) under the model at temperature 1; 0 where mask is 0
    mask: jax.Array  # float32, 1 for generated tokens up to and including EOS
    lengths: jax.Array  # int32 [B] (or [B, G]), number of generated tokens = mask.sum(-1)
    values: jax.Array | None = None  # float32, value before each token; None without a value head
    decided: jax.Array | None = None  # int32 [B]: columns whose tokens are final, when decoding may stop early
    pruned: jax.Array | None = None  # bool [B, G]: members stopped by `prune_below`, when pruning
    branched_at: jax.Array | None = None  # int32 [B, G]: column where a member left its leader (`branch_entropy`)


def is_eos(tokens: jax.Array, eos_id) -> jax.Array:
    """tokens int [...] -> bool [...]: the token is eos_id (an id, or any of the ids [E])."""
    eos = jnp.asarray(eos_id)
    return tokens == eos if eos.ndim == 0 else jnp.any(tokens[..., None] == eos, axis=-1)


def prompt_layout(prompts: jax.Array, pad_id) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Left-padded prompts [B, P] -> (real bool [B, P], positions int32 [B, P], lengths int32 [B])."""
    real = jnp.cumsum(prompts != pad_id, axis=1) > 0
    positions = jnp.maximum(jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1, 0)
    return real, positions, real.sum(axis=1, dtype=jnp.int32)


def filter_logits(logits: jax.Array, top_k: int = 0, top_p=1.0, *, bisect_steps: int = 32) -> jax.Array:
    """Set logits outside the top-k and outside the nucleus to -inf. [B, V] -> [B, V].

    top_k (static int): keep the k largest (0 = off). top_p (may be traced): keep token i iff the
    probability of the tokens strictly more likely than i is below top_p (the smallest most-likely
    set reaching top_p); the most likely token is always kept. Ties at a threshold are all kept.

    The nucleus threshold is found by bisection on the probability (each step one masked sum over V)
    instead of sorting: XLA's sort is ~20x slower on CPU (3 ms vs 0.15 ms for [64, 512]). After
    `bisect_steps` halvings of [0, max p], only tokens within max_p * 2**-bisect_steps below the exact
    threshold can be misclassified (they are kept): near-ties, like exact ties.
    """
    if top_k > 0:
        # min, not [..., -1:]: XLA's CPU compiler turns top_k followed by a slice into a full sort (50x slower).
        kth = jnp.min(jax.lax.top_k(logits, top_k)[0], axis=-1, keepdims=True)
        logits = jnp.where(logits < kth, -jnp.inf, logits)

    def nucleus(logits):
        probs = jax.nn.softmax(logits, axis=-1)
        p_max = jnp.max(probs, axis=-1, keepdims=True)

        def halve(_, bounds):  # invariant: mass above lo >= top_p > mass above hi
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            enough = jnp.sum(jnp.where(probs > mid, probs, 0.0), axis=-1, keepdims=True) >= top_p
            return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

        lo, _ = jax.lax.fori_loop(0, bisect_steps, halve, (jnp.zeros_like(p_max), p_max))
        keep = (probs > lo) | (probs >= p_max)
        return jnp.where(keep, logits, -jnp.inf)

    # Skipped at run time when top_p >= 1 (top_p is a scalar, so this stays a real branch even under
    # vmap over keys or prompts).
    return jax.lax.cond(jnp.asarray(top_p) < 1.0, nucleus, lambda x: x, logits)


def sample_token(logits: jax.Array, key: jax.Array, temperature=1.0, top_k: int = 0, top_p=1.0):
    """One token per row from logits [..., V] -> (token int32 [...], log p(token) at temperature 1 [...]).

    temperature == 0 is greedy (argmax of the raw logits); no division by zero happens. Draws by
    inverse CDF with one uniform per row: V times fewer random bits than Gumbel-max, whose
    [B, V] noise dominated a CPU decoding step. A filtered token (probability exactly 0) leaves the
    CDF flat and so can never be drawn.
    """
    token = _draw_token(logits, jax.random.uniform(key, logits.shape[:-1] + (1,)), temperature, top_k, top_p)
    return token, _token_log_prob(logits, token)


def _draw_token(logits, uniform, temperature, top_k, top_p) -> jax.Array:
    """`sample_token`'s token given its uniforms [..., 1] in [0, 1)."""
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)
    kept = filter_logits(scaled, top_k, top_p)
    # Unnormalised: inverse_cdf reaches a fraction of the total (with the normalising softmax XLA:CPU fused the draw
    # into a pass 5x slower than both apart).
    drawn = inverse_cdf(jnp.exp(kept - jnp.max(kept, axis=-1, keepdims=True)), 1.0 - uniform)
    return jnp.where(greedy, distributions.greedy(logits), drawn).astype(jnp.int32)


def inverse_cdf(weights: jax.Array, fraction: jax.Array, block: int = CDF_BLOCK) -> jax.Array:
    """The first index whose running sum of weights [..., V] (>= 0, not all 0) reaches fraction [..., 1] (in (0, 1])
    of their total -> int32 [...]: a draw from the weights normalised. An index of weight 0 is never returned.

    In two levels: the blocks of `block` consecutive indices by their totals' running sum, then the indices of the
    one block reached. A running sum over all V (`jnp.cumsum`, a reduce-window on CPU) took 22 ms of a 30 ms
    sampling step at 128 x 49,152 (SmolLM2's vocabulary); the two levels add each weight once.
    """
    blocks = distributions.in_blocks(weights, block, 0.0)  # [..., n, block]
    totals = blocks.sum(axis=-1)  # [..., n]
    reached = jnp.cumsum(totals, axis=-1)
    target = fraction * reached[..., -1:]  # in (0, total]
    first = jnp.minimum(jnp.sum(reached < target, axis=-1), totals.shape[-1] - 1)  # [...]
    preceding = jnp.concatenate([jnp.zeros_like(reached[..., :1]), reached[..., :-1]], axis=-1)
    before = jnp.take_along_axis(preceding, first[..., None], axis=-1)  # the mass of the blocks before it: below target
    inside = distributions.block_at(blocks, first)  # [..., block]
    # target > before, so target - before > 0 and the block's leading zeros are passed; where rounding leaves the
    # block's own running sum short of it, its last nonzero index is taken.
    index = jnp.sum(jnp.cumsum(inside, axis=-1) < target - before, axis=-1)
    last_nonzero = jnp.max(jnp.where(inside > 0, jnp.arange(block), 0), axis=-1)
    return (first * block + jnp.minimum(index, last_nonzero)).astype(jnp.int32)


def _token_log_prob(logits: jax.Array, token: jax.Array) -> jax.Array:
    """log p(token) at temperature 1: logits [..., V], token [...] -> [...]. `jax.nn.log_softmax`'s arithmetic on the
    token's logit alone: XLA:CPU fused log_softmax-then-gather with the draw into a pass 5x slower."""
    largest = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    shifted = jnp.take_along_axis(logits, token[..., None], axis=-1) - largest
    return (shifted - jnp.log(jnp.sum(jnp.exp(logits - largest), axis=-1, keepdims=True)))[..., 0]


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "top_k"))
def sample(model: TransformerLM, params, prompts: jax.Array, key: jax.Array, *, max_new_tokens: int,
           eos_id, pad_id, temperature=1.0, top_k: int = 0, top_p=1.0) -> Samples:
    """Sample N = max_new_tokens tokens after left-padded prompts [B, P] -> `Samples` with leaves [B, N].

    One prefill call writes the whole prompt into the KV cache, then `lax.scan` runs single-token
    steps. Step t draws row b's token with `jax.random.uniform(jax.random.split(key, N)[t], (B, 1))[b]`.
    Static: model, max_new_tokens, top_k; temperature, top_p, eos_id (one id, or several [E]: any ends a
    sample) and pad_id may be traced. Each step
    attends over the P prompt columns and the tokens generated so far. Pure: `vmap` over keys or prompts works.
    """
    out = _sample_members(model, params, prompts, key[None], max_new_tokens=max_new_tokens, eos_id=eos_id,
                          pad_id=pad_id, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.tree.map(lambda x: x[:, 0], out)


@functools.partial(jax.jit, static_argnames=("model", "group_size", "max_new_tokens", "top_k"))
def sample_groups(model: TransformerLM, params, prompts: jax.Array, key: jax.Array, *, group_size: int,
                  max_new_tokens: int, eos_id, pad_id, temperature=1.0, top_k: int = 0,
                  top_p=1.0) -> Samples:
    """G = group_size samples per prompt: prompts [B, P] -> `Samples` with leaves [B, G, N].

    Member g is `sample` with key `jax.random.split(key, G)[g]`. The prompt is prefilled once and its
    keys and values are shared by the group (never copied G times); each member caches only its own tokens.
    """
    return _sample_members(model, params, prompts, jax.random.split(key, group_size), max_new_tokens=max_new_tokens,
                           eos_id=eos_id, pad_id=pad_id, temperature=temperature, top_k=top_k, top_p=top_p)


@functools.partial(jax.jit, static_argnames=("model", "group_size", "max_new_tokens", "top_k", "branches", "depth",
                                             "stop_slots", "stop_axis", "prune_keep"))
def sample_groups_per_prompt(model: TransformerLM, params, prompts: jax.Array, keys: jax.Array, *, group_size: int,
                             max_new_tokens: int, eos_id, pad_id, temperature=1.0, top_k: int = 0,
                             top_p=1.0, forced: jax.Array | None = None,
                             forced_len: jax.Array | None = None, branches: int = 0, depth: int = 0,
                             resume: Resume | None = None, stop_slots: int = 0,
                             stop_axis: str | None = None, prune_at=None,
                             prune_below: jax.Array | None = None, prune_keep: int = 0,
                             branch_entropy=None, length_cap: jax.Array | None = None) -> Samples:
    """`sample_groups` with a key per prompt: prompts [B, P], keys [B] -> `Samples` with leaves [B, G, N].

    Prompt b's group equals `sample_groups(prompts[b:b+1], keys[b])`: a prompt's samples depend on its key
    only, not on the batch it is drawn in (what a batch split over devices needs), computed as one batch.

    `forced` int32 [B, N] with `forced_len` int32 [B]: every member of prompt b starts with the tokens
    forced[b, :forced_len[b]] instead of drawing them (a hint: the model continues from them; forced_len [B, G]:
    member g of prompt b starts with forced[b, :forced_len[b, g]]). They are real
    tokens of the completion (mask 1, log-probabilities the model's own); the caller decides whether a loss
    trains on them.

    `branches` > 0 samples each group as a tree: its G members form `branches` branches of G / branches
    members that draw their first `depth` tokens with their branch leader's (its first member's) random
    numbers, so they share that prefix exactly and differ after it. With `branch_entropy` a branch splits
    earlier, at its first column whose next-token entropy (temperature 1) reaches it: the most uncertain token
    is the first a member draws on its own (`Samples.branched_at`; `depth` if none does).

    `resume` continues partly generated groups: group b keeps its members' tokens before column
    resume.start[b] (their keys and values come from one teacher-forced pass, their log-probabilities are the
    current model's) and draws from that column on. Column c of every member draws with the random numbers of
    column c, resumed or not.

    `stop_slots` = O > 0 stops decoding early: the B groups form B / O slots of O consecutive groups, and
    decoding stops once every slot holds a finished group (every member has emitted EOS or reached column N;
    with `stop_axis`, every slot on every device of that mesh axis). `Samples.decided` [B] then says how many
    columns of each group are final; the columns after it are pad with mask 0, to be resumed later.

    `prune_below` float32 [B] with `prune_at` (int32 [B] or one column) prunes members online (the model needs a
    value head): a member still going at its group's column `prune_at` whose predicted value there is below its
    group's `prune_below` stops before drawing that column (`Samples.pruned`); decoding ends when every member
    has. `prune_keep` > 0 keeps groups balanced (`balanced_cut`): each side of predicted value 1/2 keeps its
    `prune_keep` highest-predicted members still going.

    `length_cap` int32 [B] (traced) shortens prompt b's completions to its first length_cap[b] columns (of the
    static N): a member still going there ends as at column N (no EOS; later columns pad with mask 0), and
    decoding stops once every member has ended or reached its cap.
    """
    member_keys = jax.vmap(lambda k: jax.random.split(k, group_size))(keys)  # [B, G]
    return _sample_members(model, params, prompts, member_keys, max_new_tokens=max_new_tokens, eos_id=eos_id,
                           pad_id=pad_id, temperature=temperature, top_k=top_k, top_p=top_p, per_prompt=True,
                           forced=forced, forced_len=forced_len, branches=branches, depth=depth, resume=resume,
                           stop_slots=stop_slots, stop_axis=stop_axis, prune_at=prune_at, prune_below=prune_below,
                           prune_keep=prune_keep, branch_entropy=branch_entropy, length_cap=length_cap)


def balanced_cut(value: jax.Array, going: jax.Array, below: jax.Array, keep: int = 0) -> jax.Array:
    """bool [B, G]: the members to prune now, from their predicted values float32 [B, G], which are still going
    (bool [B, G]) and each group's threshold float32 [B].

    A going member predicted below its group's threshold is pruned, except, with `keep` > 0, the balance of
    ARRoL ("prune as you generate"): each side of predicted value 1/2 (predicted-wrong, predicted-right) keeps
    its `keep` highest-predicted going members (ties: the lower index), so pruning goes lowest first and stops
    `keep` members short on each side. Why: a group whose survivors all sit on one side has (by the head) no
    advantage variance and teaches nothing. A side with at most `keep` going members loses none of them;
    members that already ended are not counted (they have no prediction at the pruning column). `keep` = 0 is
    the plain threshold. Groups are whole on a device, so the result does not depend on the device count.
    ARRoL's re-batching of survivors (a speed-up) is not done: shapes are static, so a pruned member's slot
    stays in the batch until the group's decoding ends."""
    cut = going & (value < below[:, None])
    if not keep:
        return cut
    right = value >= 0.5
    same_side = going[:, None, :] & (right[:, :, None] == right[:, None, :])  # [B, G (member), G (other)]
    index = jnp.arange(value.shape[1])
    ahead = (value[:, None, :] > value[:, :, None]) | ((value[:, None, :] == value[:, :, None])
                                                         & (index[None, :] < index[:, None])[None])
    rank = jnp.sum(same_side & ahead, axis=-1)  # going members of the same side ranked above this one
    return cut & (rank >= keep)


class Resume(NamedTuple):
    """Partly generated groups for `sample_groups_per_prompt` to continue: E of the B groups (all by default)."""

    tokens: jax.Array  # int32 [E, G, N]: the members' tokens so far (columns before `start`)
    mask: jax.Array  # float32 [E, G, N]: real tokens among them
    start: jax.Array  # int32 [B]: the column where drawing resumes (0: a fresh group; 0 outside `rows`)
    rows: jax.Array | None = None  # int32 [E]: the groups that may resume (their teacher-forced pass is all
    #                                that is computed for resumed tokens); None: all B
    stopped: jax.Array | None = None  # bool [E, G]: members that ended without EOS (pruned)


def _column_uniforms(step_keys, B: int, per_prompt: bool) -> jax.Array:
    """The uniform in [0, 1) that each member draws its token of each column with: step_keys [N, B, G]
    (per_prompt) or [N, G] -> [N, B, G]. Member (b, g) at column t uses jax.random.uniform(step_keys[t, b, g],
    (1,)), or jax.random.uniform(step_keys[t, g], (B, 1))[b]: the numbers `sample` draws."""
    if per_prompt:
        return jax.vmap(jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, (1,))[0])))(step_keys)
    return jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, (B,)), out_axes=1))(step_keys)


def _resumed_prefix(model, params, prefix, real, prompt_len, logits, value, resume: Resume):
    """The kept tokens of resumed groups, teacher-forced: (kept bool [B, G, N], stopped bool [B, G] (members
    pruned before), their tokens [B, G, N], current
    log-probabilities [B, G, N], values before them [B, G, N] or None, own cache [B, G, N, ...] with their keys
    and values, and the logits [B, G, V] and value [B, G] that predict column `start`). logits, value: the
    prompt's, [B, G, ...]. Only the rows of `resume.rows` are computed; the others start afresh."""
    B = logits.shape[0]
    E, G, N = resume.tokens.shape
    axis = model.cache_batch_axis
    rows = jnp.arange(B) if resume.rows is None else resume.rows
    start = resume.start[rows]
    columns = jnp.arange(N)
    kept = (resume.mask > 0) & (columns < start[:, None, None])  # [E, G, N]
    fed_positions = jnp.broadcast_to(prompt_len[rows, None, None] + columns, (E, G, N))
    fed_logits, fed_values, cache = model.apply(
        params, resume.tokens, fed_positions, kept, jax.tree.map(lambda x: jnp.take(x, rows, axis), prefix),
        real[rows], model.init_own_cache(E, G, N), 0, method="extend")
    # Column c is predicted by the prompt (c = 0) or by column c - 1; the next draw by column start - 1.
    predicting = jnp.concatenate([logits[rows, :, None], fed_logits], axis=2)  # [E, G, N + 1, V]
    log_probs = _token_log_prob(predicting[:, :, :N], resume.tokens) * kept
    at_start = lambda x: jnp.take_along_axis(x, start[:, None, None, *([None] * (x.ndim - 3))], axis=2)[:, :, 0]
    scatter = lambda full, part: full.at[rows].set(part)  # the E rows into the B
    scatter_cache = lambda c: jnp.moveaxis(  # noqa: E731
        scatter(jnp.zeros((B, *jnp.moveaxis(c, axis, 0).shape[1:]), c.dtype), jnp.moveaxis(c, axis, 0)), 0, axis)
    blank = lambda shape, dtype: jnp.zeros((B, *shape), dtype)
    out_kept = scatter(blank((G, N), bool), kept)
    stopped = scatter(blank((G,), bool), jnp.zeros((E, G), bool) if resume.stopped is None else resume.stopped)
    tokens = scatter(blank((G, N), jnp.int32), resume.tokens)
    log_probs = scatter(blank((G, N), log_probs.dtype), log_probs)
    own_cache = jax.tree.map(scatter_cache, cache)
    logits = scatter(logits, at_start(predicting))
    if value is None:
        return out_kept, stopped, tokens, log_probs, None, own_cache, logits, None
    values_before = jnp.concatenate([value[rows, :, None], fed_values], axis=2)  # [E, G, N + 1]
    values = scatter(blank((G, N), values_before.dtype), values_before[:, :, :N] * kept)
    return out_kept, stopped, tokens, log_probs, values, own_cache, logits, scatter(value, at_start(values_before))


def _sample_members(model: TransformerLM, params, prompts, member_keys, *, max_new_tokens, eos_id, pad_id,
                    temperature, top_k, top_p, per_prompt: bool = False, forced=None, forced_len=None,
                    branches: int = 0, depth: int = 0, resume: Resume | None = None, stop_slots: int = 0,
                    stop_axis: str | None = None, prune_at=None, prune_below=None, prune_keep: int = 0,
                    branch_entropy=None, length_cap=None) -> Samples:
    """prompts [B, P] -> `Samples` with leaves [B, G, N]. member_keys [G]: member g of every prompt draws as
    `sample` with key g; per_prompt, [B, G]: member g of prompt b draws as `sample` of that prompt alone
    with key (b, g). forced, forced_len, resume, stop_slots, stop_axis, prune_at, prune_below, prune_keep,
    branch_entropy, length_cap: see `sample_groups_per_prompt`.

    Without `resume`, `stop_slots`, pruning or `branch_entropy`, a `lax.scan` of N-1 cached steps and a last
    draw (a fixed-depth tree's leaders decode its shared prefix alone). With any of them, a `lax.while_loop` in
    which group b writes column start[b] + s at step s: its own cache then holds the N resumed columns first and
    the new tokens after them (attention ignores slot order: positions are in the keys)."""
    B, P = prompts.shape
    G, N = member_keys.shape[1 if per_prompt else 0], max_new_tokens
    if P + N > model.config.max_len:
        raise ValueError(f"prompt {P} + {N} new tokens exceeds max_len {model.config.max_len}")
    pruning = prune_below is not None
    if pruning and not model.config.value_head:
        raise ValueError("pruning members by their predicted value needs a model with a value head")
    real, positions, prompt_len = prompt_layout(prompts, pad_id)
    # Left padding puts every prompt's last token at column P-1: its logits predict token 0.
    logits, value, prefix = model.apply(params, prompts, positions, real, method="prefill")
    logits = jnp.broadcast_to(logits[:, None], (B, G, logits.shape[-1]))
    value = None if value is None else jnp.broadcast_to(value[:, None], (B, G))
    split = lambda k: jax.random.split(k, N)
    over_members = jax.vmap(split, out_axes=1)
    step_keys = jax.vmap(over_members, out_axes=1)(member_keys) if per_prompt else over_members(member_keys)
    # step_keys [N, B, G] or [N, G]
    by_entropy = branches and branch_entropy is not None
    per_branch = G // branches if branches else G
    leader = (jnp.arange(G) // per_branch) * per_branch  # each member's branch leader (the branch's first)
    if branches and not by_entropy:  # members take their branch leader's keys for the first `depth` steps
        source = jnp.where(jnp.arange(N)[:, None] < depth, leader[None, :], jnp.arange(G)[None, :])  # [N, G]
        step_keys = jax.vmap(lambda k, i: k[:, i] if per_prompt else k[i])(step_keys, source)
    uniforms = _column_uniforms(step_keys, B, per_prompt)  # [N, B, G]

    def pick(logits, done, uniform, column):  # logits [B, G, V], done and uniform [B, G], column [B]
        token = _draw_token(logits, uniform[..., None], temperature, top_k, top_p)
        if forced is not None:  # a hint's tokens replace the drawn ones
            hinted = jnp.take_along_axis(forced, jnp.minimum(column, N - 1)[:, None], axis=1)  # [B, 1]
            token = jnp.where(column[:, None] < (forced_len if forced_len.ndim == 2 else forced_len[:, None]), hinted,
                              token)
        log_p = _token_log_prob(logits, token)
        live = ~done & ~capped(column)
        token = jnp.where(live, token, jnp.asarray(pad_id, jnp.int32))
        return token, jnp.where(live, log_p, 0.0), live, done | (live & is_eos(token, eos_id)) | capped(column + 1)

    def capped(column):  # bool [B, 1]: column lies at or past the prompt's length cap (none: never)
        return (column >= (N if length_cap is None else length_cap))[:, None]

    def forward(cache, own_mask, token, column, slot):  # the model on each member's newest token
        logits, values, cache = model.apply(params, token[..., None], (prompt_len + column)[:, None, None]
                                            + jnp.zeros_like(token[..., None]), own_mask, prefix, real, cache, slot,
                                            method="extend")
        return cache, logits[:, :, 0], None if values is None else values[..., 0]

    # The carry's zeros derive from the prompts so that under shard_map they vary over devices like the rest.
    no = jnp.zeros_like(real[:, :1, None])  # [B, 1, 1] False
    batch_axis = model.cache_batch_axis  # caches are [B, ...] or [layers, B, ...]
    varying_zeros = lambda x: x + jnp.expand_dims(jnp.zeros_like(real[:, 0], x.dtype),  # noqa: E731
                                                  [a for a in range(x.ndim) if a != batch_axis])
    if resume is None and not stop_slots and not pruning and not by_entropy:
        def step(carry, xs):
            cache, own_mask, logits, value, done = carry
            t, uniform = xs
            column = jnp.full((B,), t)
            token, log_p, live, done = pick(logits, done, uniform, column)
            # Tokens after EOS are written to the cache but stay masked, so nothing ever attends to them.
            own_mask = jax.lax.dynamic_update_slice_in_dim(own_mask, live[..., None], t, axis=2)
            out = (token, log_p, live, value)
            cache, logits, value = forward(cache, own_mask, token, column, t)
            return (cache, own_mask, logits, value, done), out

        # N-1 cached steps (own cache slots 0..N-2); the last token needs no forward pass after it. A tree's shared
        # prefix (its first `depth` columns) is decoded once per branch, by the leaders, whose keys, values and
        # state every member of the branch then starts from.
        shared = depth if branches and 0 < depth < N - 1 else 0
        drawing = leader[::per_branch] if shared else jnp.arange(G)  # the members decoded from column 0
        width = drawing.shape[0]
        own_cache = jax.tree.map(varying_zeros, model.init_own_cache(B, width, N - 1))
        carry = (own_cache, no & jnp.zeros((B, width, N - 1), bool), logits[:, drawing],
                 None if value is None else value[:, drawing], no[..., 0] & jnp.zeros((B, width), bool))
        first = shared or N - 1  # the steps decoded before any member takes its leader's state
        # Decoding stops once every member has ended (`scan_until`; the steps not taken leave zeros, read as
        # pad tokens below).
        all_done = lambda carry: carry[4].all()  # noqa: E731
        carry, outs = scan_until(step, carry, (jnp.arange(first), uniforms[:first, :, drawing]), all_done)
        if shared:  # every member takes its leader's state: [B, branches, ...] -> [B, G, ...]
            copy = lambda x, axis=1: None if x is None else jnp.repeat(x, per_branch, axis=axis)
            carry = (jax.tree.map(lambda x: copy(x, batch_axis + 1), carry[0]), *map(copy, carry[1:]))
            carry, rest = scan_until(step, carry, (jnp.arange(shared, N - 1), uniforms[shared:-1]), all_done)
            outs = jax.tree.map(lambda a, b: jnp.concatenate([jnp.repeat(a, per_branch, axis=2), b]), outs, rest)
        tokens, log_probs, live, vals = outs
        tokens = jnp.where(live, tokens, jnp.asarray(pad_id, jnp.int32))  # (steps not taken left zeros)
        _, _, logits, value, done = carry
        last_token, last_log_p, last_live, _ = pick(logits, done, uniforms[-1], jnp.full((B,), N - 1))

        def finish(seq, last):  # [N-1, B, G] + [B, G] -> [B, G, N]
            return jnp.moveaxis(jnp.concatenate([seq, last[None]], axis=0), 0, -1)

        mask = finish(live, last_live).astype(jnp.float32)
        return Samples(tokens=finish(tokens, last_token), log_probs=finish(log_probs, last_log_p), mask=mask,
                       lengths=mask.sum(axis=-1).astype(jnp.int32),
                       values=None if value is None else finish(vals, value) * mask)

    columns = jnp.arange(N)
    if resume is None:
        start, resumed_slots = jnp.zeros((B,), jnp.int32), 0
        kept = no & jnp.zeros((B, G, N), bool)
        tokens = jnp.where(kept, 0, jnp.asarray(pad_id, jnp.int32))
        log_probs = kept * 0.0
        values = None if value is None else kept * 0.0
        own_cache = jax.tree.map(varying_zeros, model.init_own_cache(B, G, N))
        own_mask = kept
        ended = kept.any(axis=-1)
    else:
        start, resumed_slots = resume.start, N
        kept, ended, tokens, log_probs, values, resumed_cache, logits, value = _resumed_prefix(
            model, params, prefix, real, prompt_len, logits, value, resume)
        ended = ended | (kept & is_eos(tokens, eos_id)).any(axis=-1)
        tokens = jnp.where(kept, tokens, jnp.asarray(pad_id, jnp.int32))
        # Slots [0, N): the resumed columns; [N, 2N): the new tokens (the slot axis follows the batch and member axes).
        own_cache = jax.tree.map(
            lambda c: varying_zeros(jnp.concatenate([c, jnp.zeros_like(c)], axis=batch_axis + 2)), resumed_cache)
        own_mask = jnp.concatenate([kept, jnp.zeros_like(kept)], axis=2)
    done = ended | (start >= N)[:, None]

    def finished(done):  # every slot holds a group whose members are all done (on every device of stop_axis)
        if not stop_slots:
            lacking = jnp.sum(~done.all())
        else:
            lacking = jnp.sum(~done.all(axis=1).reshape(-1, stop_slots).any(axis=1))
        return (jax.lax.psum(lacking, stop_axis) if stop_axis else lacking) == 0

    def keep_going(carry):
        return (carry[0] < N) & ~finished(carry[5])

    def body(carry):
        s, cache, own_mask, logits, value, done, tokens, log_probs, live_mask, values, pruned, shared, split = carry
        column = start + s
        if pruning:  # members whose predicted value at column prune_at is too low stop before drawing it
            cut = (column == prune_at)[:, None] & balanced_cut(value, ~done, prune_below, prune_keep)
            pruned, done = pruned | cut, done | cut
        uniform = jnp.take_along_axis(uniforms, jnp.minimum(column, N - 1)[None, :, None], axis=0)[0]
        if by_entropy:  # a member follows its leader until the first uncertain column (or `depth`)
            log_softmax = jax.nn.log_softmax(logits, axis=-1)
            entropy = -jnp.sum(jnp.exp(log_softmax) * log_softmax, axis=-1)
            still = shared & (column < depth)[:, None] & (entropy < branch_entropy)
            split = jnp.where(shared & ~still, column[:, None], split)
            shared = still
            uniform = jnp.where(shared, uniform[:, leader], uniform)
        token, log_p, live, done = pick(logits, done, uniform, column)  # (done at the last column or the cap)
        here = columns[None, None, :] == column[:, None, None]  # [B, 1, N]
        put = lambda buffer, x: jnp.where(here, x[..., None], buffer)
        tokens, log_probs, live_mask = put(tokens, token), put(log_probs, log_p), put(live_mask, live)
        values = None if value is None else put(values, jnp.where(live, value, 0.0))
        own_mask = jax.lax.dynamic_update_slice_in_dim(own_mask, live[..., None], resumed_slots + s, axis=2)
        cache, logits, value = forward(cache, own_mask, token, column, resumed_slots + s)
        return s + 1, cache, own_mask, logits, value, done, tokens, log_probs, live_mask, values, pruned, shared, split

    # A resumed group does not know where its members split: it continues as independent samples.
    shared = ~ended & (start == 0)[:, None]
    carry = (jnp.int32(0), own_cache, own_mask, logits, value, done, tokens, log_probs, kept, values, ended & False,
             shared, jnp.where(shared, depth, jnp.minimum(start, depth)[:, None]).astype(jnp.int32))
    steps, _, _, _, _, _, tokens, log_probs, live_mask, values, pruned, _, split = jax.lax.while_loop(
        keep_going, body, carry)
    mask = live_mask.astype(jnp.float32)
    return Samples(tokens=tokens, log_probs=log_probs, mask=mask, lengths=mask.sum(axis=-1).astype(jnp.int32),
                   values=values, decided=jnp.minimum(start + steps, N), pruned=pruned if pruning else None,
                   branched_at=split if by_entropy else None)


@functools.partial(jax.jit, static_argnames=("model",))
def score(model: TransformerLM, params, prompts: jax.Array, completions: jax.Array,
          completion_mask: jax.Array, pad_id, attend: jax.Array | None = None):
    """Teacher-forced log-probs of completions: one full forward over prompt + completion.

    prompts int32 [B, P] (left-padded), completions int32 [B, N], completion_mask [B, N] (1 = real)
    -> (log_probs [B, N], entropy [B, N], values [B, N] or None), all at temperature 1 and zero where
    the mask is 0. log_probs match `sample`'s; this is the function the policy loss differentiates.
    `attend` bool [B, N]: the real tokens when they are more than the scored ones (a multi-turn episode's
    environment tokens, `jaxrl.multi_turn`); each scored token is then predicted by the last real column before it.
    """
    logits, values = completion_logits(model, params, prompts, completions, completion_mask, pad_id, attend)
    return _completion_scores(logits, values, completions, completion_mask > 0)


def completion_logits(model: TransformerLM, params, prompts: jax.Array, completions: jax.Array,
                      completion_mask: jax.Array, pad_id, attend: jax.Array | None = None):
    """`score`'s forward: the logits [B, N, V] (and values [B, N] or None) of the columns predicting each completion
    token, teacher-forced."""
    P = prompts.shape[1]
    real, _, _ = prompt_layout(prompts, pad_id)
    completion_real = completion_mask > 0
    seen = completion_real if attend is None else attend
    # The last completion token predicts nothing we score, so it is not fed.
    tokens = jnp.concatenate([prompts, completions[:, :-1]], axis=1)
    attn_mask = jnp.concatenate([real, seen[:, :-1]], axis=1)
    positions = jnp.maximum(jnp.cumsum(attn_mask, axis=1, dtype=jnp.int32) - 1, 0)
    logits, values = model.apply(params, tokens, positions, attn_mask)
    # Column P-1+t predicts token t (with `attend`: the last real column before it).
    logits, values = logits[:, P - 1:], None if values is None else values[:, P - 1:]
    if attend is not None:
        logits, values = _at_predicting_columns(logits, values, attend)
    return logits, values


def _at_predicting_columns(logits, values, attend):
    """Logits [..., N, V] and values [..., N] (or None) of the columns after the prompt's last, column t + 1 = after
    slot t, -> those predicting each slot t: the column after the last real slot before t (the prompt's for
    none)."""
    N = attend.shape[-1]
    real_at = jnp.where(attend, jnp.arange(N), -1)
    last_real = jax.lax.cummax(real_at, axis=real_at.ndim - 1)
    predicting = jnp.concatenate([jnp.full_like(last_real[..., :1], -1), last_real[..., :-1]], axis=-1) + 1
    logits = jnp.take_along_axis(logits, predicting[..., None], axis=-2)
    return logits, None if values is None else jnp.take_along_axis(values, predicting, axis=-1)


def _completion_scores(logits, values, completions, completion_real):
    """Logits [B, N, V] and values [B, N] (or None) at the columns predicting completions [B, N] ->
    (log_probs, entropy, values), zero where `completion_real` is false."""
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    m = completion_real.astype(jnp.float32)
    log_probs = jnp.take_along_axis(logp_all, completions[..., None], axis=-1)[..., 0] * m
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1) * m
    return log_probs, entropy, None if values is None else values * m


@functools.partial(jax.jit, static_argnames=("model",))
def score_groups(model: TransformerLM, params, prompts: jax.Array, completions: jax.Array,
                 completion_mask: jax.Array, pad_id, attend: jax.Array | None = None):
    """`score` for a group of G completions per prompt, computing each prompt's forward pass once.

    prompts int32 [B, P] (left-padded), completions int32 [B, G, N], completion_mask [B, G, N]
    -> (log_probs, entropy, values or None), each [B, G, N]: equal to `score` on the prompts repeated G
    times. The prompts run once; the members' N-1 fed tokens then run as one block attending to their
    prompt's keys and values, which are shared, never copied G times. That computes B*P + B*G*(N-1)
    positions instead of B*G*(P+N-1) (a GRPO update on short answers spends most of its time on prompts).
    `attend` bool [B, G, N]: the real tokens, as `score` takes it (multi-turn episodes).
    """
    logits, values = group_logits(model, params, prompts, completions, completion_mask, pad_id, attend)
    return _completion_scores(logits, values, completions, completion_mask > 0)  # column t predicts token t


def tempered_entropy(model: TransformerLM, params, prompts: jax.Array, completions: jax.Array,
                     completion_mask: jax.Array, pad_id, temperature, attend: jax.Array | None = None) -> jax.Array:
    """The entropy of the distribution tokens are drawn from at `temperature`, softmax(logits / T), at every
    completion token [B, G, N] (`score_groups`'s inputs; zero where the mask is 0): the temperature-adjusted
    entropy (AceReason-Nemotron 1.1)."""
    logits, _ = group_logits(model, params, prompts, completions, completion_mask, pad_id, attend)
    log_p = jax.nn.log_softmax(logits / temperature, axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1) * (completion_mask > 0)


def group_logits(model: TransformerLM, params, prompts: jax.Array, completions: jax.Array,
                 completion_mask: jax.Array, pad_id, attend: jax.Array | None = None):
    """`score_groups`'s forward: the logits [B, G, N, V] (and values [B, G, N] or None) of the columns predicting
    each completion token, teacher-forced, each prompt run once (a judge's, `judge_layers`, once per member: its
    values read the whole sequence, which the cached prefix does not keep)."""
    B, G, N = completions.shape
    if getattr(model.config, "judge_layers", 0):
        flat = lambda x: None if x is None else x.reshape(B * G, *x.shape[2:])  # noqa: E731
        logits, values = completion_logits(model, params, jnp.repeat(prompts, G, axis=0), flat(completions),
                                           flat(completion_mask), pad_id, flat(attend))
        return logits.reshape(B, G, N, -1), None if values is None else values.reshape(B, G, N)
    real, positions, prompt_len = prompt_layout(prompts, pad_id)
    logits, values, prefix = model.apply(params, prompts, positions, real, method="prefill")
    # The prompt's last column predicts every member's token 0.
    logits = jnp.broadcast_to(logits[:, None, None], (B, G, 1, logits.shape[-1]))
    values = None if values is None else jnp.broadcast_to(values[:, None, None], (B, G, 1))
    completion_real = completion_mask > 0
    if N > 1:  # the last completion token predicts nothing we score, so it is not fed
        if attend is None:
            fed_positions = jnp.broadcast_to(prompt_len[:, None, None] + jnp.arange(N - 1, dtype=jnp.int32),
                                             (B, G, N - 1))
        else:  # positions count real tokens only
            fed_positions = prompt_len[:, None, None] + jnp.cumsum(attend[..., :-1], -1, dtype=jnp.int32) - 1
        seen = completion_real if attend is None else attend
        rest_logits, rest_values, _ = model.apply(params, completions[..., :-1], fed_positions,
                                                  seen[..., :-1], prefix, real, method="extend")
        logits = jnp.concatenate([logits, rest_logits], axis=2)
        values = None if values is None else jnp.concatenate([values, rest_values], axis=2)
    if attend is not None:
        logits, values = _at_predicting_columns(logits, values, attend)
    return logits, values
