"""Hugging Face checkpoints: a directory with config.json, *.safetensors (one file, or shards with
model.safetensors.index.json), generation_config.json and the tokenizer, read into `Decoder` parameters and
written back from them.

Parameters are built tensor by tensor from memory-mapped files, and with `shardings` each device's shard is
cut from the host copy of one tensor at a time (`jax.make_array_from_callback`): a model larger than one
device's memory is never assembled whole on one device.
"""

from __future__ import annotations

import json
import os
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import files
from jaxrl.models import safetensors_io
from jaxrl.models.config import ModelConfig, from_hf_config, to_hf_config
from jaxrl.models.decoder import layer_shapes

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
INDEX = "model.safetensors.index.json"
WEIGHTS = "model.safetensors"


def layer_names(c: ModelConfig) -> dict[str, str]:
    """Our stacked layer parameter -> its name inside `model.layers.{i}.` in Hugging Face's checkpoints."""
    names = {"attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
             "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight",
             "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
             "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
             "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
             "gate_bias": "mlp.gate_proj.bias", "up_bias": "mlp.up_proj.bias", "down_bias": "mlp.down_proj.bias"}
    if c.sandwich_norms:  # Gemma 2: post_attention_layernorm is the attention's output norm
        names.update(attn_out_norm="post_attention_layernorm.weight", mlp_norm="pre_feedforward_layernorm.weight",
                     mlp_out_norm="post_feedforward_layernorm.weight")
    else:
        names["mlp_norm"] = "post_attention_layernorm.weight"
    return {ours: names[ours] for ours in layer_shapes(c)}


def from_hf_layout(name: str, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """One layer's Hugging Face tensor -> our layout of `shape` (without the layer axis). Linear weights are
    stored [out, in]; ours are [in, *out] (q, k, v: [D, heads, Dh]; o: [heads, Dh, D])."""
    if name in ("q", "k", "v", "o", "gate", "up", "down"):
        return w.T.reshape(shape)
    return w.reshape(shape)


def to_hf_layout(name: str, w: np.ndarray) -> np.ndarray:
    """Inverse of `from_hf_layout`."""
    if name in ("q", "k", "v"):
        return w.reshape(w.shape[0], -1).T
    if name == "o":
        return w.reshape(-1, w.shape[-1]).T
    if name in ("gate", "up", "down"):
        return w.T
    return w.reshape(-1)


def read_config(directory: str, **overrides) -> ModelConfig:
    path = os.path.join(directory, CONFIG)
    if not os.path.exists(path):
        raise ValueError(f"{directory} has no config.json: not a Hugging Face model directory")
    hf = json.load(open(path))
    generation_path = os.path.join(directory, GENERATION_CONFIG)
    generation = json.load(open(generation_path)) if os.path.exists(generation_path) else None
    return from_hf_config(hf, generation, **overrides)


def open_checkpoint(directory: str) -> dict[str, np.ndarray]:
    """Tensor name -> memory-mapped array, over every safetensors file of the directory."""
    index = os.path.join(directory, INDEX)
    if os.path.exists(index):
        shards = sorted(set(json.load(open(index))["weight_map"].values()))
    elif os.path.exists(os.path.join(directory, WEIGHTS)):
        shards = [WEIGHTS]
    else:
        raise ValueError(f"{directory} has no {WEIGHTS} nor {INDEX}")
    tensors = {}
    for file in shards:
        tensors.update(safetensors_io.open_tensors(os.path.join(directory, file)))
    return tensors


def param_builders(c: ModelConfig, tensors: dict[str, np.ndarray]) -> dict:
    """Our parameter tree with, at each leaf, (shape, build(index) -> numpy slice of the leaf): a leaf is
    built only for the slice a device holds, from the layers that slice spans."""
    def get(name):
        if name not in tensors:
            raise ValueError(f"the checkpoint has no tensor {name} (a {c.family} model with this config.json needs it)")
        return tensors[name]

    def whole(name, shape, transform=lambda w: w):
        return shape, lambda index: np.asarray(transform(get(name)))[index]

    def stacked(ours, hf_suffix, shape):
        def build(index):
            layers = range(c.num_layers)[index[0]]
            return np.stack([from_hf_layout(ours, get(f"model.layers.{i}.{hf_suffix}"), shape[1:])[index[1:]]
                             for i in layers])
        return shape, build

    shapes = layer_shapes(c)
    tree = {"embed": whole("model.embed_tokens.weight", (c.vocab_size, c.hidden_size)),
            "final_norm": whole("model.norm.weight", (c.hidden_size,)),
            "layers": {ours: stacked(ours, hf, shapes[ours]) for ours, hf in layer_names(c).items()}}
    if not c.tie_embeddings:
        tree["lm_head"] = whole("lm_head.weight", (c.hidden_size, c.vocab_size), lambda w: w.T)
    return tree


def place(builders: dict, dtype, shardings=None) -> dict:
    """Builders from `param_builders` -> arrays of `dtype`, each sharded as `shardings` (a matching tree of
    `jax.sharding.Sharding`; None: the default device)."""
    is_builder = lambda x: isinstance(x, tuple) and len(x) == 2 and callable(x[1])  # noqa: E731

    def make(builder, sharding=None):
        shape, build = builder
        convert = lambda index: np.asarray(build(index), dtype=dtype)  # noqa: E731
        if sharding is None:
            return jnp.asarray(convert(tuple(slice(None) for _ in shape)))
        return jax.make_array_from_callback(shape, sharding, convert)

    if shardings is None:
        return jax.tree.map(make, builders, is_leaf=is_builder)
    return jax.tree.map(make, builders, shardings, is_leaf=is_builder)


def check_vocab(c: ModelConfig, tensors) -> None:
    name = "model.embed_tokens.weight"
    if name in tensors:
        shape = tensors.shape_of(name) if hasattr(tensors, "shape_of") else tensors[name].shape
        if tuple(shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(f"the checkpoint's embedding is {list(shape)}, its config says "
                             f"[{c.vocab_size}, {c.hidden_size}]")


def load_params(directory: str, c: ModelConfig, shardings=None) -> dict:
    """A Hugging Face directory's weights as our parameter tree ({"params": ...}), in c.param_dtype."""
    tensors = open_checkpoint(directory)
    check_vocab(c, tensors)
    return {"params": place(param_builders(c, tensors), c.param_dtype,
                            None if shardings is None else shardings["params"])}


def hf_tensors(c: ModelConfig, params: dict, dtype=None) -> dict[str, np.ndarray]:
    """Our parameters ({"params": ...}) -> Hugging Face tensor name -> numpy array (in `dtype`, default the
    parameters' own; bfloat16 as ml_dtypes.bfloat16)."""
    p = params["params"]
    cast = lambda a: np.asarray(jax.device_get(a)).astype(dtype or np.asarray(a).dtype)  # noqa: E731
    out = {"model.embed_tokens.weight": cast(p["embed"]), "model.norm.weight": cast(p["final_norm"])}
    if not c.tie_embeddings:
        out["lm_head.weight"] = cast(p["lm_head"]).T
    for ours, hf in layer_names(c).items():
        stacked = cast(p["layers"][ours])
        for i in range(c.num_layers):
            out[f"model.layers.{i}.{hf}"] = to_hf_layout(ours, stacked[i])
    return out


def write_spec(c: ModelConfig, directory: str, extra_files: dict[str, str] | None = None,
               weights_dtype: str | None = None) -> None:
    """config.json, generation_config.json and `extra_files` (the tokenizer's): a model directory without its
    weights, which `jaxrl.models.read_spec` reads (a run directory keeps its model's this way). weights_dtype:
    the safetensors' dtype when it differs from the parameters' (config.json's torch_dtype)."""
    os.makedirs(directory, exist_ok=True)
    hf = to_hf_config(c)
    if weights_dtype is not None:
        hf["torch_dtype"] = weights_dtype
    files.write_atomic(os.path.join(directory, CONFIG), json.dumps(hf, indent=2))
    generation = {"bos_token_id": c.bos_id, "eos_token_id": list(c.eos_ids) or None, "pad_token_id": c.pad_id}
    files.write_atomic(os.path.join(directory, GENERATION_CONFIG),
                       json.dumps({k: v for k, v in generation.items() if v is not None}, indent=2))
    for name, text in (extra_files or {}).items():
        files.write_atomic(os.path.join(directory, name), text)


def save_directory(c: ModelConfig, params: dict, directory: str, *, extra_files: dict[str, str] | None = None,
                   dtype=None, max_shard_bytes: int = 4 << 30) -> None:
    """Write a Hugging Face directory transformers (and vLLM) load: config.json, generation_config.json,
    model.safetensors (sharded with an index past `max_shard_bytes`), and `extra_files` (name -> text: the
    tokenizer's files)."""
    os.makedirs(directory, exist_ok=True)
    tensors = hf_tensors(c, params, dtype)
    shards, size = [[]], 0
    for name, a in tensors.items():
        if shards[-1] and size + a.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += a.nbytes
    if len(shards) == 1:
        safetensors_io.save(tensors, os.path.join(directory, WEIGHTS), {"format": "pt"})
    else:
        weight_map = {}
        for i, names in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            safetensors_io.save({n: tensors[n] for n in names}, os.path.join(directory, file), {"format": "pt"})
            weight_map.update(dict.fromkeys(names, file))
        total = sum(a.nbytes for a in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        files.write_atomic(os.path.join(directory, INDEX), json.dumps(index, indent=2))
    write_spec(c, directory, extra_files, None if dtype is None else np.dtype(dtype).name)

