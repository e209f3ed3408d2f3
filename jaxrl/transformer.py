"""A small decoder-only transformer policy (Flax linen) with a functional KV cache.

Four ways through the same parameters:

    logits, values = model.apply(params, tokens, positions, attn_mask)             # full causal forward
    logits, values, cache = model.apply(params, tokens, positions, attn_mask, cache, index,
                                        method=TransformerLM.decode)               # cached decoding
    last_logits, last_values, prefix = model.apply(params, tokens, positions, attn_mask,
                                                   method=TransformerLM.prefill)   # prompts: cache + last column
    logits, values, own = model.apply(params, tokens, positions, attn_mask, prefix, prefix_mask,
                                      own_cache, index, method=TransformerLM.extend)  # G continuations
                                                                                      # of B cached prefixes

Shapes: tokens/positions int32 [B, T], attn_mask bool (True = real token), logits float32 [B, T, V],
values float32 [B, T] (or None without a value head). `extend` works on [B, G, S]: G continuations of
each prefix (a GRPO group), attending to the prefix's cached keys and values without copying them G
times. Caches are explicit pytrees passed in and out (not flax's mutable 'cache' collection), so
decoding composes with `lax.scan`, `vmap` and `jit`. Dense layers are `jaxrl.dot.Dense` (and its `dot_general`
in the attention projections).

Choices: pre-LayerNorm blocks, learned absolute positions (the caller supplies them, so left padding
does not shift them), output embedding tied to the input embedding (fewer parameters, and the
near-zero initial logits give a near-uniform initial policy), no dropout, no biases in attention.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl.dot import Dense, dot_general


def entropy_features(logits: jax.Array) -> jax.Array:
    """POISE's token-entropy statistics of the policy's own distribution ("Your Language Model is Its Own Critic"):
    logits [..., V] -> float32 [..., 2], the entropy H = -sum_v p_v log p_v of softmax(logits) and H^2 (under
    stop_gradient: features the value head reads, not a path for its loss into the policy). Mean-pooled over a
    completion by `advantages.cross_rollout_baseline` they are its token entropy's first two moments."""
    entropy = _entropy(_read_log_probs(logits))
    return jnp.stack([entropy, entropy ** 2], axis=-1)


def _read_log_probs(logits: jax.Array) -> jax.Array:
    """log softmax(logits) [..., V] in float32, under stop_gradient: what a value head reads of the policy."""
    return jax.nn.log_softmax(jax.lax.stop_gradient(logits.astype(jnp.float32)), axis=-1)


def _entropy(log_p: jax.Array) -> jax.Array:
    """log-probabilities [..., V] -> the distribution's entropy [...]."""
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def value_inputs(h: jax.Array, logits: jax.Array, with_entropy: bool) -> jax.Array:
    """The value head's input: the final hidden state h [..., D], with `with_entropy` (POISE) followed by
    `entropy_features(logits)` -> [..., D + 2]."""
    return jnp.concatenate([h, entropy_features(logits)], axis=-1) if with_entropy else h


def read_surprise(logits: jax.Array, tokens: jax.Array, attn_mask: jax.Array) -> jax.Array:
    """How likely the model found each token it reads: logits [B, T, V] (column t predicting token t + 1), tokens
    int32 [B, T], attn_mask bool [B, T] -> float32 [B, T, 3] at column t: the log-probability the column before gave
    token t, its gap below that column's most likely token's (0 where token t was the model's own choice), and that
    column's entropy; zeros where either column is not real (the first column, left padding). Under stop_gradient:
    features a judge reads, not a path for its loss into the policy."""
    log_p = _read_log_probs(logits[:, :-1])  # the columns predicting tokens 1..T-1
    written = jnp.take_along_axis(log_p, tokens[:, 1:, None], axis=-1)[..., 0]
    gap = jnp.max(log_p, axis=-1) - written
    entropy = _entropy(log_p)
    both_real = (attn_mask[:, 1:] & attn_mask[:, :-1])[..., None]
    features = jnp.where(both_real, jnp.stack([written, gap, entropy], axis=-1), 0.0)
    return jnp.concatenate([jnp.zeros_like(features[:, :1]), features], axis=1)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Static (hashable) architecture of `TransformerLM`; `d_ff=None` means 4 * d_model."""

    vocab_size: int
    max_len: int
    num_layers: int = 2
    d_model: int = 64
    num_heads: int = 4
    d_ff: int | None = None
    value_head: bool = False
    # POISE: the value head also reads the entropy H of the token distribution at its column, and H^2
    # (`entropy_features`)
    value_entropy: bool = False
    dtype: Any = jnp.float32  # compute and cache dtype; parameters stay float32
    # l in 1..num_layers-1: the heads read the hidden state after block l (an internal layer policy, BuPO); the later
    # blocks' parameters are kept, unused. 0: after the last block (the model's own policy)
    exit_layer: int = 0
    # a judge's value head: it reads through this many more blocks over the body's last hidden state, each column
    # also given how likely the body found the token it reads (`read_surprise`), so that a later layer can compare a
    # written token with the one predicted. Values then need the whole sequence: the full forward only
    judge_layers: int = 0

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if not 0 <= self.exit_layer < self.num_layers:
            raise ValueError(f"exit_layer={self.exit_layer} must be in 0..num_layers-1 = {self.num_layers - 1}")
        if self.judge_layers < 0 or (self.judge_layers and not self.value_head):
            raise ValueError(f"judge_layers={self.judge_layers}: judge layers feed a value head (value_head=True), "
                             "and their number is at least 0")
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class LayerCache(NamedTuple):
    """One layer's keys and values, each [B, L, heads, head_dim]; slot i holds sequence column i."""

    k: jax.Array
    v: jax.Array


Cache = tuple  # tuple[LayerCache, ...], one per layer


def _zero_cache(config: TransformerConfig, *lead: int) -> Cache:
    """Per layer zero K/V of shape [*lead, H, Dh]."""
    shape = (*lead, config.num_heads, config.head_dim)
    return tuple(LayerCache(jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype))
                 for _ in range(config.num_layers))


def init_cache(config: TransformerConfig, batch: int, max_len: int) -> Cache:
    """Zero cache for `batch` sequences of at most `max_len` columns (prompt plus completion)."""
    return _zero_cache(config, batch, max_len)


def init_own_cache(config: TransformerConfig, batch: int, group: int, max_len: int) -> Cache:
    """Zero per-member cache for `TransformerLM.extend`: per layer K/V [B, G, T, H, Dh]."""
    return _zero_cache(config, batch, group, max_len)


def visible(num_queries: int, attn_mask: jax.Array, index=0) -> jax.Array:
    """Which keys each of `num_queries` new tokens sees: attn_mask bool [..., L] (real key slots) ->
    bool [..., S, L]. New token s sits at slot index + s and sees slot l iff l <= index + s and the slot
    is real."""
    L = attn_mask.shape[-1]
    causal = jnp.arange(L)[None, :] <= index + jnp.arange(num_queries)[:, None]  # [S, L]
    return causal & attn_mask[..., None, :]


class SelfAttention(nn.Module):
    config: TransformerConfig

    def setup(self):
        c = self.config
        dense = functools.partial(nn.DenseGeneral, use_bias=False, dtype=c.dtype, dot_general=dot_general)
        self.qkv = dense((3, c.num_heads, c.head_dim), name="qkv")
        self.out = dense(c.d_model, axis=(-2, -1), name="out")

    def _project(self, x, cache: LayerCache | None, index, axis: int):
        """x [..., S, D] -> (q, k, v), each [..., S, H, Dh] (k, v: the cache with them written at slots
        [index, index + S) of `axis` when there is a cache), and the new cache or None."""
        qkv = self.qkv(x)
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        if cache is not None:
            write = lambda old, new: jax.lax.dynamic_update_slice_in_dim(old, new.astype(old.dtype), index, axis)
            k, v = write(cache.k, k), write(cache.v, v)
            cache = LayerCache(k, v)
        return q, k, v, cache

    def __call__(self, x, mask, layer_cache: LayerCache | None = None, index=None, last_only: bool = False):
        """x [B, S, D], mask bool [B, S, K] (query may see key) -> ([B, S, D], new LayerCache or None).

        Without a cache the keys are the S new tokens (K = S); with one, the new K/V are written at
        slots [index, index + S) and the queries attend over all K = L cache slots. `last_only`: every
        token's K/V, but only the last token's output ([B, 1, D]).
        """
        q, k, v, layer_cache = self._project(x, layer_cache, index, axis=1)
        if last_only:
            q, mask = q[:, -1:], mask[:, -1:]
        # Masked logits get a large finite negative (not -inf), so a query row with no visible key
        # (a left-padding column) yields a harmless uniform average instead of NaN. Softmax in float32.
        y = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
        return self.out(y), layer_cache

    def grouped(self, x, own_mask, prefix: LayerCache, prefix_mask, own_cache: LayerCache | None = None, index=None):
        """G continuations of each of B shared prefixes.

        x [B, G, S, D]; prefix: the prefixes' keys and values [B, P, H, Dh], prefix_mask bool [B, P] (True =
        a key every continuation of that prefix may see); own_mask bool [B, G, S, T]: which of its own T keys
        each query sees. Without `own_cache` the own keys are the S new tokens (T = S); with one ([B, G, T,
        H, Dh], from `init_own_cache`) the new K/V are first written at slots [index, index + S).
        -> ([B, G, S, D], new own cache or None).
        """
        q, k, v, own_cache = self._project(x, own_cache, index, axis=2)
        y = prefix_attention(q, k, v, own_mask, prefix.k, prefix.v, prefix_mask)
        return self.out(y), own_cache


def prefix_attention(q, k, v, own_mask, prefix_k, prefix_v, prefix_mask):
    """Softmax attention of q [B, G, S, H, Dh] over its group's shared prefix keys and values [B, P, H, Dh]
    (prefix_mask bool [B, P]: real prefix tokens) and its own keys and values k, v [B, G, T, H, Dh]
    (own_mask bool [B, G, S, T]: which own keys each query sees) -> [B, G, S, H, Dh].

    Equal to attention over each member's concatenated [prefix; own] keys (the prefix repeated G times),
    but per (prompt, head) it is one attention of the group's G * S queries over the P prefix keys and all
    G * T own keys, with a block-diagonal mask keeping members apart: one matmul per (prompt, head) instead
    of one per (prompt, member, head) for the own part, which on CPU cost more than everything else in the
    attention's backward pass. The prefix is never repeated, and its gradient sums over the group inside
    that matmul.
    """
    B, G, S, H, Dh = q.shape
    T, P = k.shape[2], prefix_k.shape[1]
    keys = jnp.concatenate([prefix_k.astype(k.dtype), k.reshape(B, G * T, H, Dh)], axis=1)
    values = jnp.concatenate([prefix_v.astype(v.dtype), v.reshape(B, G * T, H, Dh)], axis=1)
    same_member = jnp.eye(G, dtype=bool)[:, None, :, None]  # [G, 1, G, 1]
    own = (same_member & own_mask[:, :, :, None, :]).reshape(B, G * S, G * T)
    mask = jnp.concatenate([jnp.broadcast_to(prefix_mask[:, None, :], (B, G * S, P)), own], axis=-1)
    # Masked logits get a large finite negative, so a query with no visible key averages uniformly, not NaN.
    y = jax.nn.dot_product_attention(q.reshape(B, G * S, H, Dh), keys, values, mask=mask[:, None])
    return y.reshape(B, G, S, H, Dh)


class Block(nn.Module):
    config: TransformerConfig

    def setup(self):
        c = self.config
        self.ln1 = nn.LayerNorm(dtype=c.dtype, name="ln1")
        self.attn = SelfAttention(c, name="attn")
        self.ln2 = nn.LayerNorm(dtype=c.dtype, name="ln2")
        self.fc = Dense(c.d_ff, dtype=c.dtype, name="fc")
        self.proj = Dense(c.d_model, dtype=c.dtype, name="proj")

    def __call__(self, x, mask, layer_cache=None, index=None, last_only: bool = False):
        h, layer_cache = self.attn(self.ln1(x), mask, layer_cache, index, last_only)
        return self._mlp((x[:, -1:] if last_only else x) + h), layer_cache

    def grouped(self, x, own_mask, prefix, prefix_mask, own_cache=None, index=None):
        """`SelfAttention.grouped` in place of `SelfAttention.__call__`."""
        h, own_cache = self.attn.grouped(self.ln1(x), own_mask, prefix, prefix_mask, own_cache, index)
        return self._mlp(x + h), own_cache

    def _mlp(self, x):
        return x + self.proj(nn.gelu(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    """Decoder-only causal LM with an optional per-token value head (the PPO critic on tokens)."""

    config: TransformerConfig
    cache_batch_axis: ClassVar[int] = 0  # caches are tuples of per-layer [B, ...]

    def setup(self):
        c = self.config
        init = nn.initializers.normal(0.02)
        self.embed = nn.Embed(c.vocab_size, c.d_model, embedding_init=init, name="embed")
        self.pos_embed = nn.Embed(c.max_len, c.d_model, embedding_init=init, name="pos_embed")
        self.blocks = [Block(c, name=f"block_{i}") for i in range(c.num_layers)]
        self.ln_f = nn.LayerNorm(dtype=c.dtype, name="ln_f")
        if c.value_head:
            self.value = nn.Dense(1, kernel_init=nn.initializers.normal(0.01), name="value")
        if c.judge_layers:
            self.judge_in = Dense(c.d_model, dtype=c.dtype, name="judge_in")
            self.judge_blocks = [Block(c, name=f"judge_{i}") for i in range(c.judge_layers)]
            self.judge_ln = nn.LayerNorm(dtype=c.dtype, name="judge_ln")

    def _run(self, tokens, positions, apply_block, whole: jax.Array | None = None):
        """Embed, then x, layer_cache = apply_block(i, block, x) per block, then the heads; `whole`: the full
        forward's attn_mask [B, T] (None on the cached paths), which a judge's value head reads through its blocks."""
        c = self.config
        # Padding columns may carry any position; clip so the lookup is always in range.
        positions = jnp.clip(positions, 0, c.max_len - 1)
        x = (self.embed(tokens) + self.pos_embed(positions)).astype(c.dtype)
        new_cache = []
        for i, block in enumerate(self.blocks[:c.exit_layer or c.num_layers]):
            x, layer_cache = apply_block(i, block, x)
            new_cache.append(layer_cache)
        h = self.ln_f(x)
        logits = self.embed.attend(h.astype(jnp.float32))  # tied output embedding, float32 logits
        if c.judge_layers:
            if whole is None:
                raise ValueError("a judge's values (judge_layers > 0) read the whole sequence: score it with the full "
                                 "forward (`TransformerLM.__call__`, `sampling.score`), and sample with a model "
                                 "without judge layers")
            x = x + self.judge_in(read_surprise(logits, tokens, whole)).astype(c.dtype)
            judge_mask = visible(tokens.shape[1], whole)  # (the body's mask again: XLA computes it once)
            for block in self.judge_blocks:
                x, _ = block(x, judge_mask)
            h = self.judge_ln(x)
        values = self.value(value_inputs(h.astype(jnp.float32), logits, c.value_entropy))[..., 0] if c.value_head \
            else None
        return logits, values, tuple(new_cache)

    def __call__(self, tokens, positions, attn_mask):
        """Full causal forward (teacher forcing / scoring).

        tokens int32 [B, T], positions int32 [B, T], attn_mask bool [B, T] (True = real token)
        -> (logits float32 [B, T, V], values float32 [B, T] or None).
        Query t sees key s iff s <= t and attn_mask[:, s]; padded keys are never seen.
        """
        mask = visible(tokens.shape[1], attn_mask)  # [B, T, T]
        logits, values, _ = self._run(tokens, positions, lambda i, block, x: block(x, mask), attn_mask)
        return logits, values

    def decode(self, tokens, positions, attn_mask, cache: Cache, index):
        """Cached step: write S new tokens' K/V at cache slots [index, index + S) and score them.

        tokens, positions int32 [B, S]; attn_mask bool [B, L]: which cache slots hold real tokens,
        INCLUDING the S being written; cache from `init_cache(config, B, L)`; index int (may be traced).
        -> (logits float32 [B, S, V], values [B, S] or None, new cache).
        Prefill is S = prompt length at index 0; generation is S = 1 at index = column.
        """
        mask = visible(tokens.shape[1], attn_mask, index)  # [B, S, L]
        return self._run(tokens, positions, lambda i, block, x: block(x, mask, cache[i], index))

    def prefill(self, tokens, positions, attn_mask):
        """The prompts' KV cache and what their last column predicts.

        tokens, positions int32 [B, P], attn_mask bool [B, P] -> (logits float32 [B, V], values [B] or None,
        cache: per layer K/V [B, P, H, Dh]). Equal to `decode` into `init_cache(config, B, P)` at index 0,
        keeping column P-1, but the last layer's attention output and MLP run for that column only (the
        other columns' outputs feed nothing).
        """
        B, P = tokens.shape
        mask, cache = visible(P, attn_mask), init_cache(self.config, B, P)
        last = (self.config.exit_layer or self.config.num_layers) - 1
        logits, values, cache = self._run(tokens, positions,
                                          lambda i, block, x: block(x, mask, cache[i], 0, last_only=i == last))
        return logits[:, -1], None if values is None else values[:, -1], cache

    def extend(self, tokens, positions, attn_mask, prefix: Cache, prefix_mask, own_cache: Cache | None = None,
               index=0):
        """G continuations of each of B prefixes whose keys and values are cached once per prefix.

        tokens, positions int32 [B, G, S]; prefix: per layer K/V [B, P, H, Dh] (e.g. from `prefill`),
        prefix_mask bool [B, P] (True = real prefix token).
        Without `own_cache`: the S tokens are the continuations (T = S) and attn_mask bool [B, G, S] marks
        the real ones. With `own_cache` (from `init_own_cache(config, B, G, T)`): the S tokens' K/V are
        written at own slots [index, index + S) and attn_mask [B, G, T] marks which own slots hold real
        tokens, INCLUDING the S being written.
        Own slot t is seen by new token s iff t <= index + s and attn_mask says so; real prefix tokens
        are seen by every token. -> (logits float32 [B, G, S, V], values [B, G, S] or None, new own cache).
        """
        own_mask = visible(tokens.shape[2], attn_mask, index)  # [B, G, S, T]
        def apply_block(i, block, x):
            return block.grouped(x, own_mask, prefix[i], prefix_mask, None if own_cache is None else own_cache[i],
                                 index)
        logits, values, new_cache = self._run(tokens, positions, apply_block)
        return logits, values, None if own_cache is None else new_cache

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """Zero cache (needs no parameters; callable on an unbound module)."""
        return init_cache(self.config, batch, max_len)

    def init_own_cache(self, batch: int, group: int, max_len: int) -> Cache:
        """Zero per-member cache for `extend` (needs no parameters)."""
        return init_own_cache(self.config, batch, group, max_len)
