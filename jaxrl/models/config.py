"""`ModelConfig`: the static architecture of a decoder-only language model, and its translation from and to a
Hugging Face config.json.

The families differ only in these fields (what each family sets is in `FAMILIES`):

    Llama 3 / 3.1 / 3.2, SmolLM2   RMSNorm, rotary positions (llama3 frequency scaling from 3.1 on),
                                   grouped-query attention, SiLU-gated MLP, tied or untied embeddings
    Qwen2 / Qwen2.5                 the same, with biases on the query, key and value projections
    Qwen3                           no biases; RMSNorm on each query and key head (q/k norm), explicit head_dim
    Gemma 2                         GELU(tanh)-gated MLP, norms before and after attention and MLP, RMSNorm as
                                    x * (1 + w), embeddings scaled by sqrt(hidden), attention scaled by
                                    query_pre_attn_scalar, soft-capped attention and final logits, sliding-window
                                    attention on every other layer
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

# Hugging Face `model_type` -> the family name used here; the families `from_hf_config` reads.
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2"}
ACTIVATIONS = ("silu", "gelu_tanh")
ROPE_TYPES = ("default", "linear", "llama3")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # the projections an adapter may sit on


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static (hashable) architecture of `jaxrl.models.Decoder`.

    Sizes: V = vocab_size, D = hidden_size, L = num_layers, N = num_heads, K = num_kv_heads (N % K == 0),
    Dh = head_dim, F = intermediate_size.
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_len: int = 8192  # positions the model was trained on (max_position_embeddings)
    norm_eps: float = 1e-6
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w): Gemma stores w - 1
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0  # linear and llama3 scaling
    rope_low_freq_factor: float = 1.0  # llama3 scaling
    rope_high_freq_factor: float = 4.0  # llama3 scaling
    rope_original_max_len: int = 8192  # llama3 scaling
    attention_bias: bool = False  # biases on q, k, v (Qwen2); o never has one
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head's query and key (Qwen3)
    sandwich_norms: bool = False  # norms on the attention's and the MLP's outputs too (Gemma 2)
    activation: str = "silu"
    scale_embeddings: bool = False  # embeddings times sqrt(D) (Gemma)
    tie_embeddings: bool = True
    query_scale: float | None = None  # attention logits' scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    final_softcap: float | None = None
    sliding_window: int | None = None  # keys at most this many columns back, on the layers marked below
    sliding_layers: tuple[bool, ...] | None = None  # per layer; None: every layer when sliding_window is set
    value_head: bool = False  # a per-token value head (the PPO critic on tokens)
    value_entropy: bool = False  # POISE: the value head also reads its column's token entropy H and H^2
    dtype: Any = jnp.float32  # compute and KV-cache dtype
    param_dtype: Any = jnp.float32
    remat: bool = False  # recompute each layer's activations in the backward pass instead of keeping them
    exit_layer: int = 0  # l in 1..L-1: the heads read the hidden state after layer l (BuPO's internal policy); 0: last
    lora_rank: int = 0  # > 0: low-rank adapters on `lora_targets`, the only weights that train (with a value head)
    lora_alpha: float = 16.0  # adapters' output scaled by lora_alpha / lora_rank
    lora_targets: tuple[str, ...] = LORA_TARGETS
    # Fully sharded data parallel inside `shard_map`: (parameter name, the dimension of its stored shape split over
    # the mesh's `data` axis); each layer's weights are gathered whole as the layer runs (`jaxrl.models.sharding`)
    fsdp_dims: tuple[tuple[str, int], ...] = ()
    fsdp_size: int = 1  # the devices of that axis: each holds 1 / fsdp_size of those dimensions
    pad_id: int | None = None  # the tokenizer's padding token, when the checkpoint names one
    eos_ids: tuple[int, ...] = ()  # tokens that end a generation (generation_config.json)
    bos_id: int | None = None

    def __post_init__(self):
        problems = []
        if self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation {self.activation!r} is not one of {ACTIVATIONS}")
        if self.rope_type not in ROPE_TYPES:
            problems.append(f"rope scaling {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} is odd (rotary positions rotate pairs)")
        if self.sliding_layers is not None and len(self.sliding_layers) != self.num_layers:
            problems.append(f"sliding_layers has {len(self.sliding_layers)} entries for {self.num_layers} layers")
        if set(self.lora_targets) - set(LORA_TARGETS):
            problems.append(f"lora_targets {sorted(set(self.lora_targets) - set(LORA_TARGETS))} are not among "
                            f"{', '.join(LORA_TARGETS)}")
        if not 0 <= self.exit_layer < self.num_layers:
            problems.append(f"exit_layer={self.exit_layer} is not in 0..num_layers-1 = {self.num_layers - 1}")
        if problems:
            raise ValueError("model config: " + "; ".join(problems))

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5 if self.query_scale is None else self.query_scale

    def layer_windows(self) -> tuple[int, ...]:
        """Per layer, how many columns back a query sees (its own included); 0 = all of them."""
        if not self.sliding_window:
            return (0,) * self.num_layers
        sliding = self.sliding_layers or (True,) * self.num_layers
        return tuple(self.sliding_window if s else 0 for s in sliding)

    def num_params(self) -> int:
        D, F, V, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        attn = D * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * D * F + D * (4 if self.sandwich_norms else 2)
        return V * D * (1 if self.tie_embeddings else 2) + L * per_layer + D


def _rope(hf: dict) -> dict:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", scaling.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    out = {"rope_theta": float(theta), "rope_type": kind}
    if kind in ("linear", "llama3"):
        out["rope_factor"] = float(scaling["factor"])
    if kind == "llama3":
        out.update(rope_low_freq_factor=float(scaling["low_freq_factor"]),
                   rope_high_freq_factor=float(scaling["high_freq_factor"]),
                   rope_original_max_len=int(scaling["original_max_position_embeddings"]))
    return out


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


def from_hf_config(hf: dict, generation: dict | None = None, **overrides) -> ModelConfig:
    """A Hugging Face config.json (and generation_config.json) as dicts -> ModelConfig. `overrides`: fields
    to set on top (dtype, param_dtype, remat, value_head)."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported (supported: {', '.join(FAMILIES)})")
    family = FAMILIES[model_type]
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    layers = int(hf["num_hidden_layers"])
    generation = generation or {}
    fields: dict[str, Any] = dict(
        family=family, vocab_size=int(hf["vocab_size"]), hidden_size=hidden, num_layers=layers,
        num_heads=num_heads, num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden // num_heads), intermediate_size=int(hf["intermediate_size"]),
        max_len=int(hf.get("max_position_embeddings", 8192)), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family == "gemma2")), **_rope(hf),
        pad_id=hf.get("pad_token_id") if hf.get("pad_token_id") is not None else generation.get("pad_token_id"),
        eos_ids=_ids(generation.get("eos_token_id", hf.get("eos_token_id"))),
        bos_id=hf.get("bos_token_id", generation.get("bos_token_id")))
    activation = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    fields["activation"] = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}.get(
        activation, activation)
    if family == "llama":
        fields.update(attention_bias=bool(hf.get("attention_bias", False)), mlp_bias=bool(hf.get("mlp_bias", False)))
    elif family == "qwen2":
        fields.update(attention_bias=True)
        if hf.get("use_sliding_window"):
            raise ValueError("Qwen2 with use_sliding_window=true is not supported")
    elif family == "qwen3":
        fields.update(qk_norm=True, attention_bias=bool(hf.get("attention_bias", False)))
    elif family == "gemma2":
        fields.update(norm_offset=1.0, sandwich_norms=True, scale_embeddings=True,
                      query_scale=float(hf.get("query_pre_attn_scalar", fields["head_dim"])) ** -0.5,
                      attn_softcap=hf.get("attn_logit_softcapping"), final_softcap=hf.get("final_logit_softcapping"),
                      sliding_window=hf.get("sliding_window"))
        types = hf.get("layer_types")
        fields["sliding_layers"] = (tuple(t == "sliding_attention" for t in types) if types
                                    else tuple(i % 2 == 0 for i in range(layers)))
    fields.update(overrides)
    return ModelConfig(**fields)


HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                    "gemma2": "Gemma2ForCausalLM"}


def to_hf_config(c: ModelConfig) -> dict:
    """ModelConfig -> a Hugging Face config.json dict that transformers loads as the same model."""
    hf = {"architectures": [HF_ARCHITECTURES[c.family]], "model_type": c.family, "vocab_size": c.vocab_size,
          "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
          "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
          "max_position_embeddings": c.max_len, "rms_norm_eps": c.norm_eps, "tie_word_embeddings": c.tie_embeddings,
          "rope_theta": c.rope_theta, "torch_dtype": "float32" if c.param_dtype == jnp.float32 else "bfloat16"}
    if c.rope_type != "default":
        hf["rope_scaling"] = {"rope_type": c.rope_type, "factor": c.rope_factor}
        if c.rope_type == "llama3":
            hf["rope_scaling"].update(low_freq_factor=c.rope_low_freq_factor, high_freq_factor=c.rope_high_freq_factor,
                                      original_max_position_embeddings=c.rope_original_max_len)
    act = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}[c.activation]
    hf["hidden_act"] = act
    if c.family == "llama":
        hf.update(attention_bias=c.attention_bias, mlp_bias=c.mlp_bias)
    if c.family == "qwen3":
        hf.update(attention_bias=c.attention_bias)
    if c.family == "gemma2":
        hf.update(hidden_activation=act, query_pre_attn_scalar=round(c.scale ** -2),
                  attn_logit_softcapping=c.attn_softcap, final_logit_softcapping=c.final_softcap,
                  sliding_window=c.sliding_window,
                  layer_types=["sliding_attention" if w else "full_attention" for w in c.layer_windows()])
    for key, value in (("pad_token_id", c.pad_id), ("bos_token_id", c.bos_id)):
        if value is not None:
            hf[key] = value
    if c.eos_ids:
        hf["eos_token_id"] = list(c.eos_ids) if len(c.eos_ids) > 1 else c.eos_ids[0]
    return hf


def rope_frequencies(c: ModelConfig) -> jnp.ndarray:
    """Inverse frequencies [Dh / 2] of the rotary embedding, with the config's scaling (float32)."""
    inv_freq = 1.0 / (c.rope_theta ** (jnp.arange(0, c.head_dim, 2, dtype=jnp.float32) / c.head_dim))
    if c.rope_type == "linear":
        return inv_freq / c.rope_factor
    if c.rope_type == "llama3":
        # Llama 3.1: long wavelengths divided by the factor, short ones kept, a smooth blend in between.
        low_wavelen = c.rope_original_max_len / c.rope_low_freq_factor
        high_wavelen = c.rope_original_max_len / c.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq)
        smooth = (c.rope_original_max_len / wavelen - c.rope_low_freq_factor) / (
            c.rope_high_freq_factor - c.rope_low_freq_factor)
        blended = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(medium, blended, scaled)
    return inv_freq
