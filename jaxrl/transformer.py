"""A small decoder-only transformer policy (Flax linen) with a functional KV cache.

Two ways through the same parameters:

    logits, values = model.apply(params, tokens, positions, attn_mask)             # full causal forward
    logits, values, cache = model.apply(params, tokens, positions, attn_mask, cache, index,
                                        method=TransformerLM.decode)               # cached decoding

Shapes: tokens/positions int32 [B, T], attn_mask bool (True = real token), logits float32 [B, T, V],
values float32 [B, T] (or None without a value head). The cache is an explicit pytree passed in and out
(not flax's mutable 'cache' collection), so decoding composes with `lax.scan`, `vmap` and `jit`.

Choices: pre-LayerNorm blocks, learned absolute positions (the caller supplies them, so left padding
does not shift them), output embedding tied to the input embedding (fewer parameters, and the
near-zero initial logits give a near-uniform initial policy), no dropout, no biases in attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp


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
    dtype: Any = jnp.float32  # compute and cache dtype; parameters stay float32

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
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


def init_cache(config: TransformerConfig, batch: int, max_len: int) -> Cache:
    """Zero cache for `batch` sequences of at most `max_len` columns (prompt plus completion)."""
    shape = (batch, max_len, config.num_heads, config.head_dim)
    return tuple(LayerCache(jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype))
                 for _ in range(config.num_layers))


class SelfAttention(nn.Module):
    config: TransformerConfig

    def setup(self):
        c = self.config
        self.qkv = nn.DenseGeneral((3, c.num_heads, c.head_dim), use_bias=False, dtype=c.dtype, name="qkv")
        self.out = nn.DenseGeneral(c.d_model, axis=(-2, -1), use_bias=False, dtype=c.dtype, name="out")

    def __call__(self, x, mask, layer_cache: LayerCache | None = None, index=None):
        """x [B, S, D], mask bool [B, S, K] (query may see key) -> ([B, S, D], new LayerCache or None).

        Without a cache the keys are the S new tokens (K = S); with one, the new K/V are written at
        slots [index, index + S) and the queries attend over all K = L cache slots.
        """
        qkv = self.qkv(x)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, S, H, Dh]
        if layer_cache is not None:
            k = jax.lax.dynamic_update_slice_in_dim(layer_cache.k, k.astype(layer_cache.k.dtype), index, axis=1)
            v = jax.lax.dynamic_update_slice_in_dim(layer_cache.v, v.astype(layer_cache.v.dtype), index, axis=1)
            layer_cache = LayerCache(k, v)
        # Masked logits get a large finite negative (not -inf), so a query row with no visible key
        # (a left-padding column) yields a harmless uniform average instead of NaN. Softmax in float32.
        y = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
        return self.out(y), layer_cache


class Block(nn.Module):
    config: TransformerConfig

    def setup(self):
        c = self.config
        self.ln1 = nn.LayerNorm(dtype=c.dtype, name="ln1")
        self.attn = SelfAttention(c, name="attn")
        self.ln2 = nn.LayerNorm(dtype=c.dtype, name="ln2")
        self.fc = nn.Dense(c.d_ff, dtype=c.dtype, name="fc")
        self.proj = nn.Dense(c.d_model, dtype=c.dtype, name="proj")

    def __call__(self, x, mask, layer_cache=None, index=None):
        h, layer_cache = self.attn(self.ln1(x), mask, layer_cache, index)
        x = x + h
        x = x + self.proj(nn.gelu(self.fc(self.ln2(x))))
        return x, layer_cache


class TransformerLM(nn.Module):
    """Decoder-only causal LM with an optional per-token value head (the PPO critic on tokens)."""

    config: TransformerConfig

    def setup(self):
        c = self.config
        init = nn.initializers.normal(0.02)
        self.embed = nn.Embed(c.vocab_size, c.d_model, embedding_init=init, name="embed")
        self.pos_embed = nn.Embed(c.max_len, c.d_model, embedding_init=init, name="pos_embed")
        self.blocks = [Block(c, name=f"block_{i}") for i in range(c.num_layers)]
        self.ln_f = nn.LayerNorm(dtype=c.dtype, name="ln_f")
        if c.value_head:
            self.value = nn.Dense(1, kernel_init=nn.initializers.normal(0.01), name="value")

    def _run(self, tokens, positions, mask, cache=None, index=None):
        c = self.config
        # Padding columns may carry any position; clip so the lookup is always in range.
        positions = jnp.clip(positions, 0, c.max_len - 1)
        x = (self.embed(tokens) + self.pos_embed(positions)).astype(c.dtype)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, mask, None if cache is None else cache[i], index)
            new_cache.append(layer_cache)
        h = self.ln_f(x)
        logits = self.embed.attend(h.astype(jnp.float32))  # tied output embedding, float32 logits
        values = self.value(h.astype(jnp.float32))[..., 0] if c.value_head else None
        return logits, values, (None if cache is None else tuple(new_cache))

    def __call__(self, tokens, positions, attn_mask):
        """Full causal forward (teacher forcing / scoring).

        tokens int32 [B, T], positions int32 [B, T], attn_mask bool [B, T] (True = real token)
        -> (logits float32 [B, T, V], values float32 [B, T] or None).
        Query t sees key s iff s <= t and attn_mask[:, s]; padded keys are never seen.
        """
        T = tokens.shape[1]
        causal = jnp.tril(jnp.ones((T, T), bool))
        mask = causal[None] & attn_mask[:, None, :]  # [B, T, T]
        logits, values, _ = self._run(tokens, positions, mask)
        return logits, values

    def decode(self, tokens, positions, attn_mask, cache: Cache, index):
        """Cached step: write S new tokens' K/V at cache slots [index, index + S) and score them.

        tokens, positions int32 [B, S]; attn_mask bool [B, L]: which cache slots hold real tokens,
        INCLUDING the S being written; cache from `init_cache(config, B, L)`; index int (may be traced).
        -> (logits float32 [B, S, V], values [B, S] or None, new cache).
        Prefill is S = prompt length at index 0; generation is S = 1 at index = column.
        """
        S, L = tokens.shape[1], cache[0].k.shape[1]
        causal = jnp.arange(L)[None, :] <= index + jnp.arange(S)[:, None]  # [S, L]
        mask = causal[None] & attn_mask[:, None, :]  # [B, S, L]
        return self._run(tokens, positions, mask, cache, index)

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """Zero cache (needs no parameters; callable on an unbound module)."""
        return init_cache(self.config, batch, max_len)
