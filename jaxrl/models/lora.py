"""Low-rank adapters (LoRA) on a `Decoder`'s projections: with `ModelConfig.lora_rank` r > 0 each target weight
W [*in, *out] gains A [*in, r] (random) and B [r, *out] (zero: the adapted model starts as the base), the layer
computes x W + (alpha / r) (x A) B, and only A, B (and a value head) train: the base weights are under
`stop_gradient` and the optimiser keeps no state for them (`trainable`).

    config = dataclasses.replace(config, lora_rank=8)
    optimizer = optax.multi_transform({True: adam, False: optax.set_to_zero()}, trainable(params))
    reference = base_only(params)         # the frozen base as the KL reference: no second copy of the model
    merged = merge(config, params)        # adapters folded into the weights, for export
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.models.config import ModelConfig
from jaxrl.models.decoder import VALUE_HEAD, is_adapter


def _name(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def trainable(params) -> dict:
    """A tree of bools matching `params`: True for adapters and the value head, False for the frozen base."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: is_adapter(_name(path)) or f"/{VALUE_HEAD}/" in f"/{_name(path)}/", params)


def base_only(params) -> dict:
    """`params` with every adapter's B zeroed: the base model's outputs (its arrays shared, not copied)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if _name(path).endswith("_lora_b") else x, params)


def merge(config: ModelConfig, params) -> dict:
    """The adapters folded into their weights (W + alpha / r A B) and dropped: plain base-layout parameters."""
    if not config.lora_rank:
        return params
    scale = config.lora_alpha / config.lora_rank
    layers = dict(params["params"]["layers"])
    for name in config.lora_targets:
        a, b = layers.pop(f"{name}_lora_a"), layers.pop(f"{name}_lora_b")
        low = a.reshape(a.shape[0], -1, a.shape[-1]).astype(jnp.float32)  # [L, in, r]
        update = jnp.einsum("lir,lro->lio", low, b.reshape(b.shape[0], b.shape[1], -1).astype(jnp.float32))
        w = layers[name]
        layers[name] = (w.astype(jnp.float32) + scale * update.reshape(w.shape)).astype(w.dtype)
    return {"params": dict(params["params"], layers=layers)}
