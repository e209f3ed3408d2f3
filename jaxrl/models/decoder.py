"""`Decoder`: one decoder-only transformer for the Llama, Qwen2, Qwen3 and Gemma 2 families (Flax linen), with the
functional KV cache, the prefix-sharing group decode and the value head of `jaxrl.transformer.TransformerLM`.

The same four ways through the parameters as `TransformerLM` (so `jaxrl.sampling` drives either):

    logits, values = model.apply(params, tokens, positions, attn_mask)                          # full forward
    logits, values, cache = model.apply(params, tokens, positions, attn_mask, cache, index, method="decode")
    last_logits, last_values, prefix = model.apply(params, tokens, positions, attn_mask, method="prefill")
    logits, values, own = model.apply(params, tokens, positions, attn_mask, prefix, prefix_mask, own_cache,
                                      index, method="extend")                # G continuations of B prefixes

Shapes as there: tokens/positions int32 [B, T] (the caller's positions, so left padding shifts nothing),
attn_mask bool (True = real token), logits float32 [B, T, V], values float32 [B, T] or None. The layers are
one `lax.scan` over parameters stacked on a leading layer axis (compile time does not grow with depth), and a
cache is one `LayerCache` whose k and v are [L, B, T, K, Dh] (the batch on axis `cache_batch_axis`).

Parameters (all stacked over L under "layers"): embed [V, D]; attn_norm, mlp_norm [L, D]; q [L, D, N, Dh],
k and v [L, D, K, Dh], o [L, N, Dh, D]; gate and up [L, D, F], down [L, F, D]; optional q_bias/k_bias/v_bias
[L, N or K, Dh] (Qwen2), q_norm/k_norm [L, Dh] (Qwen3), attn_out_norm/mlp_out_norm [L, D] (Gemma 2),
gate_bias/up_bias [L, F] and down_bias [L, D]; final_norm [D]; lm_head [D, V] when not tied; value (the value head).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl.dot import contract
from jaxrl.mesh import DATA_AXIS
from jaxrl.models.config import ModelConfig, rope_frequencies
from jaxrl.transformer import LayerCache, value_inputs, visible

VALUE_HEAD = "value"  # the value head's parameters (the name TransformerLM uses too)

# Masked attention logits: a large finite negative, so a query with no visible key (a left-padding column)
# averages uniformly instead of giving NaN.
MASKED = -1e30


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, offset: float) -> jax.Array:
    """x [..., D] normalised by its root mean square in float32, scaled by (offset + weight [D])."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * (offset + weight.astype(jnp.float32))).astype(x.dtype)


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """positions int [..., S], inv_freq [Dh / 2] -> (cos, sin), each float32 [..., S, 1, Dh] (a head axis to
    broadcast over)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)[..., None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding of x [..., S, H, Dh], halves convention (the first half pairs with the second)."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def attention(q, k, v, mask, scale: float, softcap: float | None) -> jax.Array:
    """Grouped-query attention: q [B, S, N, Dh] over k, v [B, L, K, Dh] (each key head serves N / K query
    heads), mask bool [B, S, L] (query s may see key l) -> [B, S, N, Dh]. Logits and softmax in float32."""
    B, S, N, Dh = q.shape
    K = k.shape[2]
    q = q.reshape(B, S, K, N // K, Dh)
    logits = jnp.einsum("bskgd,blkd->bkgsl", q, k, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(masked_logits(logits, mask[:, None, None], scale, softcap), axis=-1).astype(v.dtype)
    return jnp.einsum("bkgsl,blkd->bskgd", weights, v).reshape(B, S, N, Dh)


def member_attention(q, prefix_k, prefix_v, prefix_mask, own_k, own_v, own_mask, scale: float,
                     softcap: float | None) -> jax.Array:
    """Each member's queries q [B, G, S, N, Dh] over its prompt's shared keys and values prefix_k, prefix_v
    [B, P, K, Dh] (prefix_mask bool [B, G, S, P]) and its own own_k, own_v [B, G, T, K, Dh] (own_mask bool [B, G, S,
    T]) -> [B, G, S, N, Dh]: one softmax over both parts, as `attention` over the member's [prefix; own] keys.

    The parts are never joined: joining them copies every cached key and value of every layer at every step, and
    one attention of the group's G * S queries over all G * T own keys (a block-diagonal mask keeping members
    apart) does G times the own part's work; each member here sees its own T keys only (SmolLM2-135M, 16 prompts x 8
    members: a decode step's forward 262 -> 208 ms, GRPO's forward and backward through `extend` 24 -> 20 s). Only
    the small [..., P + T] logits are joined, for the softmax."""
    B, G, S, N, Dh = q.shape
    K, P = prefix_k.shape[2], prefix_k.shape[1]
    q = q.reshape(B, G, S, K, N // K, Dh)
    logits = jnp.concatenate([
        jnp.einsum("bgskhd,bpkd->bgkhsp", q, prefix_k, preferred_element_type=jnp.float32),
        jnp.einsum("bgskhd,bgtkd->bgkhst", q, own_k, preferred_element_type=jnp.float32)], axis=-1)
    mask = jnp.concatenate([prefix_mask, own_mask], axis=-1)[:, :, None, None]
    weights = jax.nn.softmax(masked_logits(logits, mask, scale, softcap), axis=-1).astype(own_v.dtype)
    y = (jnp.einsum("bgkhsp,bpkd->bgskhd", weights[..., :P], prefix_v.astype(own_v.dtype))
         + jnp.einsum("bgkhst,bgtkd->bgskhd", weights[..., P:], own_v))
    return y.reshape(B, G, S, N, Dh)


def masked_logits(logits, mask, scale: float, softcap: float | None) -> jax.Array:
    """Attention logits (float32) scaled, soft-capped where the family caps them, and set to `MASKED` where mask
    (broadcast to them) is False."""
    logits = logits * scale
    if softcap:
        logits = softcap * jnp.tanh(logits / softcap)
    return jnp.where(mask, logits, MASKED)


def within_window(mask: jax.Array, distance: jax.Array | None, window) -> jax.Array:
    """mask bool [..., S, L] restricted to keys fewer than `window` columns back (distance [S, L] = query
    column - key column); window 0 (may be traced, per layer) keeps the mask as it is."""
    if distance is None:
        return mask
    return mask & ((window == 0) | (distance < window))


def _project(x, p, name: str, c: ModelConfig, bias: bool, contracted: int = 1):
    """x [..., *C] @ p[name] [*C, *F] (+ p[name + "_bias"]) in c.dtype, plus the low-rank adapter
    (x @ p[name + "_lora_a"]) @ p[name + "_lora_b"] scaled by lora_alpha / lora_rank when the layer has one."""
    y = contract(x, p[name].astype(c.dtype), contracted)
    if bias:
        y = y + p[f"{name}_bias"].astype(c.dtype)
    if f"{name}_lora_a" in p:
        low = contract(x, p[f"{name}_lora_a"].astype(c.dtype), contracted)
        y = y + (c.lora_alpha / c.lora_rank) * contract(low, p[f"{name}_lora_b"].astype(c.dtype), 1)
    return y


def block(c: ModelConfig, p: dict, x: jax.Array, cos, sin, attend: Callable) -> tuple[jax.Array, object]:
    """One layer: x [..., S, D] -> ([..., S, D], the layer's new cache). p: this layer's parameters; cos, sin:
    rotary tables for the S new tokens; attend(q [..., S, N, Dh], k, v [..., S, K, Dh]) -> (y [..., S, N, Dh],
    new cache) does the attention (and cache writing) of the calling mode."""
    norm = lambda h, w: rms_norm(h, w, c.norm_eps, c.norm_offset)  # noqa: E731
    h = norm(x, p["attn_norm"])
    q, k, v = (_project(h, p, name, c, c.attention_bias) for name in ("q", "k", "v"))
    if c.qk_norm:
        q, k = norm(q, p["q_norm"]), norm(k, p["k_norm"])
    y, cache = attend(rotate(q, cos, sin), rotate(k, cos, sin), v)
    h = _project(y, p, "o", c, False, contracted=2)
    if c.sandwich_norms:
        h = norm(h, p["attn_out_norm"])
    x = x + h
    h = norm(x, p["mlp_norm"])
    act = jax.nn.silu if c.activation == "silu" else lambda z: jax.nn.gelu(z, approximate=True)
    h = act(_project(h, p, "gate", c, c.mlp_bias)) * _project(h, p, "up", c, c.mlp_bias)
    h = _project(h, p, "down", c, c.mlp_bias)
    if c.sandwich_norms:
        h = norm(h, p["mlp_out_norm"])
    return x + h, cache


def layer_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each stacked layer parameter this config has."""
    L, D, N, K, Dh, F = c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    shapes = {"attn_norm": (L, D), "q": (L, D, N, Dh), "k": (L, D, K, Dh), "v": (L, D, K, Dh), "o": (L, N, Dh, D),
              "mlp_norm": (L, D), "gate": (L, D, F), "up": (L, D, F), "down": (L, F, D)}
    if c.attention_bias:
        shapes.update(q_bias=(L, N, Dh), k_bias=(L, K, Dh), v_bias=(L, K, Dh))
    if c.qk_norm:
        shapes.update(q_norm=(L, Dh), k_norm=(L, Dh))
    if c.sandwich_norms:
        shapes.update(attn_out_norm=(L, D), mlp_out_norm=(L, D))
    if c.mlp_bias:
        shapes.update(gate_bias=(L, F), up_bias=(L, F), down_bias=(L, D))
    if c.lora_rank:  # adapters: [L, *in, r] and [L, r, *out] beside each target [L, *in, *out]
        for name in c.lora_targets:
            contracted = 2 if name == "o" else 1
            shape = shapes[name]
            shapes[f"{name}_lora_a"] = (L, *shape[1:1 + contracted], c.lora_rank)
            shapes[f"{name}_lora_b"] = (L, c.lora_rank, *shape[1 + contracted:])
    return shapes


def param_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> whole shape of every sharding-relevant parameter: the embedding, the untied output head and the
    stacked layer parameters."""
    shapes = {"embed": (c.vocab_size, c.hidden_size), **layer_shapes(c)}
    if not c.tie_embeddings:
        shapes["lm_head"] = (c.hidden_size, c.vocab_size)
    return shapes


def stored_shape(c: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A parameter's shape as one device stores it: its `fsdp_dims` dimension divided over `fsdp_size` devices."""
    dim = dict(c.fsdp_dims).get(name)
    return shape if dim is None else (*shape[:dim], shape[dim] // c.fsdp_size, *shape[dim + 1:])


def is_adapter(name: str) -> bool:
    return "_lora_" in name


def is_norm(name: str) -> bool:
    return name.endswith("norm")


def init_layers(c: ModelConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Fresh stacked layer parameters: weights normal(0.02), biases 0, norms the identity."""
    shapes = layer_shapes(c)
    keys = dict(zip(shapes, jax.random.split(key, len(shapes))))

    def init(name, shape):
        if is_norm(name):
            return jnp.full(shape, 1.0 - c.norm_offset, c.param_dtype)
        if name.endswith(("_bias", "_lora_b")):  # (an adapter starts as the identity: B = 0)
            return jnp.zeros(shape, c.param_dtype)
        if name.endswith("_lora_a"):
            fan_in = math.prod(shape[1:-1])
            return (jax.random.normal(keys[name], shape) / math.sqrt(fan_in)).astype(c.param_dtype)
        return (0.02 * jax.random.normal(keys[name], shape)).astype(c.param_dtype)

    return {name: init(name, stored_shape(c, name, shape)) for name, shape in shapes.items()}


class Decoder(nn.Module):
    """Decoder-only causal LM of any supported family, with an optional per-token value head."""

    config: ModelConfig
    cache_batch_axis: ClassVar[int] = 1  # caches are [L, B, ...]

    def setup(self):
        c = self.config
        init = nn.initializers.normal(0.02)
        self.embed = self.param("embed", init, stored_shape(c, "embed", (c.vocab_size, c.hidden_size)), c.param_dtype)
        self.layers = self.param("layers", lambda key: init_layers(c, key))
        self.final_norm = self.param("final_norm", nn.initializers.constant(1.0 - c.norm_offset), (c.hidden_size,),
                                     c.param_dtype)
        if not c.tie_embeddings:
            self.lm_head = self.param("lm_head", init, stored_shape(c, "lm_head", (c.hidden_size, c.vocab_size)),
                                      c.param_dtype)
        if c.value_head:
            self.value_head = nn.Dense(1, kernel_init=nn.initializers.normal(0.01), name=VALUE_HEAD)

    def _whole(self, name: str, x, in_layer: bool = False):
        """A parameter as the computation needs it: gathered whole over the `data` axis when it is stored sharded
        (`ModelConfig.fsdp_dims`; inside `shard_map`), else as it is. in_layer: x is one layer's slice."""
        dims = dict(self.config.fsdp_dims)
        if name not in dims:
            return x
        return gather_whole(x, dims[name] - int(in_layer))

    def _base(self, x):
        """A pretrained weight as the computation sees it: frozen (no gradient computed for it) under LoRA."""
        return jax.lax.stop_gradient(x) if self.config.lora_rank else x

    def _embed(self, tokens):
        c = self.config
        x = jnp.take(self._base(self._whole("embed", self.embed)), tokens, axis=0).astype(c.dtype)
        return x * jnp.asarray(c.hidden_size ** 0.5, c.dtype) if c.scale_embeddings else x

    def _layers(self, x, positions, caches, attend, state=None):
        """Every layer over x [..., S, D] -> (x, the layers' outputs stacked, or the final `state`).

        attend(q, k, v, layer_caches, state, layer, window) -> (y, out) does one layer's attention: layer_caches
        is this layer's slice of `caches` (read-only inputs stacked over layers, or None); `state` (a cache
        stacked over layers, or None) is carried through the layers and `out` is its new value, updated in place
        at index `layer` (only the new tokens' slots are written: no copy of the whole cache per step); without a
        state, `out` is the layer's output, stacked over layers."""
        c = self.config
        cos, sin = rope_tables(positions, rope_frequencies(c))

        carried = state is not None

        def layer(carry, per_layer):
            x, state = carry
            p, layer_caches, window, index = per_layer
            p = {name: self._whole(name, value, in_layer=True) for name, value in p.items()}
            x, out = block(c, p, x, cos, sin, lambda q, k, v: attend(q, k, v, layer_caches, state, index, window))
            return ((x, out), None) if carried else ((x, None), out)  # the new state, or the layer's output

        if c.remat:
            layer = jax.checkpoint(layer, prevent_cse=False)
        windows = jnp.asarray(c.layer_windows(), jnp.int32)
        layers = {k: v if is_adapter(k) else self._base(v) for k, v in self.layers.items()}
        per_layer = (layers, caches, windows, jnp.arange(c.num_layers))
        if c.exit_layer:  # the first l layers only (BuPO's internal policy; `state` keeps every layer's slots)
            per_layer = jax.tree.map(lambda v: v[:c.exit_layer], per_layer)
        (x, state), outs = jax.lax.scan(layer, (x, state), per_layer)
        return x, state if carried else outs

    def _heads(self, x):
        """Final hidden [..., D] -> (logits float32 [..., V], values float32 [...] or None)."""
        c = self.config
        h = rms_norm(x, self._base(self.final_norm), c.norm_eps, c.norm_offset).astype(jnp.float32)
        head = self._base(self._whole("embed", self.embed).T if c.tie_embeddings
                          else self._whole("lm_head", self.lm_head))
        logits = contract(h, head.astype(jnp.float32), 1)
        if c.final_softcap:
            logits = c.final_softcap * jnp.tanh(logits / c.final_softcap)
        return logits, self.value_head(value_inputs(h, logits, c.value_entropy))[..., 0] if c.value_head else None

    def _distance(self, query_columns, key_columns):
        """Query column - key column [S, L] when some layer slides (else None)."""
        if not self.config.sliding_window:
            return None
        return query_columns[:, None] - key_columns[None, :]

    def _attend(self, mask, distance):
        c = self.config
        return lambda q, k, v, window: attention(q, k, v, within_window(mask, distance, window), c.scale,
                                                 c.attn_softcap)

    def __call__(self, tokens, positions, attn_mask):
        """Full causal forward: tokens, positions int32 [B, T], attn_mask bool [B, T] -> (logits float32
        [B, T, V], values float32 [B, T] or None). Query t sees key s iff s <= t and attn_mask[:, s]."""
        T = tokens.shape[1]
        attend = self._attend(visible(T, attn_mask), self._distance(jnp.arange(T), jnp.arange(T)))
        x, _ = self._layers(self._embed(tokens), positions, None,
                            lambda q, k, v, _, state, layer, window: (attend(q, k, v, window), None))
        return self._heads(x)

    def decode(self, tokens, positions, attn_mask, cache: LayerCache, index):
        """Cached step: write S new tokens' K/V at cache slots [index, index + S) and score them.

        tokens, positions int32 [B, S]; attn_mask bool [B, L]: the cache slots holding real tokens, INCLUDING
        the S being written; cache from `init_cache(B, L)`; index int (may be traced).
        -> (logits float32 [B, S, V], values [B, S] or None, new cache)."""
        S, L = tokens.shape[1], attn_mask.shape[1]
        attend = self._attend(visible(S, attn_mask, index), self._distance(index + jnp.arange(S), jnp.arange(L)))

        def write_and_attend(q, k, v, _, cache, layer, window):
            cache, keys, values = write_layer(cache, k, v, layer, index, 1)
            return attend(q, keys, values, window), cache

        x, cache = self._layers(self._embed(tokens), positions, None, write_and_attend, state=cache)
        return (*self._heads(x), cache)

    def prefill(self, tokens, positions, attn_mask):
        """The prompts' KV cache and what their last column predicts: tokens, positions int32 [B, P],
        attn_mask bool [B, P] -> (logits float32 [B, V], values [B] or None, cache: k, v [L, B, P, K, Dh])."""
        P = tokens.shape[1]
        attend = self._attend(visible(P, attn_mask), self._distance(jnp.arange(P), jnp.arange(P)))
        dtype = self.config.dtype

        def keep_and_attend(q, k, v, _, state, layer, window):
            return attend(q, k, v, window), LayerCache(k.astype(dtype), v.astype(dtype))

        x, cache = self._layers(self._embed(tokens), positions, None, keep_and_attend)
        logits, values = self._heads(x[:, -1])
        return logits, values, cache

    def extend(self, tokens, positions, attn_mask, prefix: LayerCache, prefix_mask, own_cache: LayerCache | None = None,
               index=0):
        """G continuations of each of B prefixes whose keys and values are cached once per prefix.

        tokens, positions int32 [B, G, S]; prefix: k, v [L, B, P, K, Dh] (from `prefill`), prefix_mask bool
        [B, P]. Without `own_cache` the S tokens are the continuations and attn_mask bool [B, G, S] marks the
        real ones; with one (from `init_own_cache(B, G, T)`) their K/V are written at own slots
        [index, index + S) and attn_mask [B, G, T] marks the own slots holding real tokens, INCLUDING the S being
        written. -> (logits float32 [B, G, S, V], values [B, G, S] or None, new own cache or None)."""
        S, P = tokens.shape[2], prefix_mask.shape[1]
        T = S if own_cache is None else attn_mask.shape[2]
        c = self.config
        queries = P + index + jnp.arange(S)  # the new tokens' columns
        shared_mask = jnp.broadcast_to(prefix_mask[:, None, None, :], (*tokens.shape, P))  # [B, G, S, P]
        own_mask = visible(S, attn_mask, index)  # [B, G, S, T]
        prefix_distance = self._distance(queries, jnp.arange(P))
        own_distance = self._distance(queries, P + jnp.arange(T))

        def grouped(q, k, v, layer_prefix, own, layer, window):
            if own is not None:
                own, k, v = write_layer(own, k, v, layer, index, 2)
            y = member_attention(q, layer_prefix.k, layer_prefix.v, within_window(shared_mask, prefix_distance, window),
                                 k, v, within_window(own_mask, own_distance, window), c.scale, c.attn_softcap)
            return y, own

        x, own = self._layers(self._embed(tokens), positions, prefix, grouped, state=own_cache)
        return (*self._heads(x), own if own_cache is not None else None)

    def init_cache(self, batch: int, max_len: int) -> LayerCache:
        """Zero cache for `batch` sequences of at most `max_len` columns: k, v [L, B, max_len, K, Dh]."""
        return zero_cache(self.config, batch, max_len)

    def init_own_cache(self, batch: int, group: int, max_len: int) -> LayerCache:
        """Zero per-member cache for `extend`: k, v [L, B, G, max_len, K, Dh]."""
        return zero_cache(self.config, batch, group, max_len)


def gather_whole(x: jax.Array, axis: int) -> jax.Array:
    """x's parts on every device of the `data` axis (inside shard_map) joined along `axis`; its gradient is the sum
    over devices of the whole's gradient, this device's part of it (all_gather's transpose, a reduce-scatter)."""
    if jax.default_backend() != "cpu":
        return jax.lax.all_gather(x, DATA_AXIS, axis=axis, tiled=True)
    return _gather_whole_on_cpu(x, axis)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_whole_on_cpu(x, axis):
    return jax.lax.all_gather(x, DATA_AXIS, axis=axis, tiled=True)


def _gather_forward(x, axis):
    return _gather_whole_on_cpu(x, axis), None


def _gather_backward(axis, _, cotangent):
    # XLA:CPU's in-process reduce-scatter inside a loop (the layer scan's backward pass) crashes now and then
    # (jaxlib 0.10.2, 8 host devices: a segfault in ReduceScatter<F32>); an all-reduce, then this device's slice of
    # it, is the same sum.
    size = cotangent.shape[axis] // jax.lax.axis_size(DATA_AXIS)
    whole = jax.lax.psum(cotangent, DATA_AXIS)
    return (jax.lax.dynamic_slice_in_dim(whole, jax.lax.axis_index(DATA_AXIS) * size, size, axis),)


_gather_whole_on_cpu.defvjp(_gather_forward, _gather_backward)


def write_layer(cache: LayerCache, k: jax.Array, v: jax.Array, layer, index, axis: int):
    """The new tokens' keys and values [..., S, ...] written into layer `layer` of the layer-stacked `cache` (k, v
    [L, ...]) at slots [index, index + S) of the layer's axis `axis`, in place. -> (cache, the layer's keys, its
    values)."""
    def write(stacked, new):
        start = [0] * stacked.ndim
        start[0], start[axis + 1] = layer, index
        return jax.lax.dynamic_update_slice(stacked, new.astype(stacked.dtype)[None], start)

    cache = LayerCache(write(cache.k, k), write(cache.v, v))
    return (cache, *(jax.lax.dynamic_index_in_dim(x, layer, axis=0, keepdims=False) for x in cache))


def zero_cache(c: ModelConfig, *lead: int) -> LayerCache:
    shape = (c.num_layers, *lead, c.num_kv_heads, c.head_dim)
    return LayerCache(jnp.zeros(shape, c.dtype), jnp.zeros(shape, c.dtype))
