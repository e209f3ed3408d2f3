"""GGUF files (llama.cpp's format) as a Hugging Face config and Hugging Face-named tensors, dequantised to float32
tensor by tensor with the `gguf` package, so that `jaxrl.models.hf` builds the parameters as it does from a
safetensors directory.

Two conversions undo what llama.cpp's converter did: Llama's query and key rows are permuted back from llama.cpp's
interleaved rotary layout to Hugging Face's halves layout, and Gemma's norm weights, stored as 1 + w, lose the 1.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

# GGUF architecture -> Hugging Face model_type (the families jaxrl.models runs).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2"}

LAYER_TENSORS = {  # llama.cpp's name inside `blk.{i}.` -> Hugging Face's inside `model.layers.{i}.`
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
NORMS = {  # the MLP's input norm is ffn_norm in both layouts; Gemma 2 adds norms after attention and MLP
    "llama": {"ffn_norm.weight": "post_attention_layernorm.weight"},
    "gemma2": {"ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_attention_norm.weight": "post_attention_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
}
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # memory-mapped: uint8 [rows, bytes per row] when quantised, else [*reversed(shape)]


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[TensorInfo]


# Metadata value types: struct format of the scalar ones; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_package():
    """The gguf package (its quantisation types and dequantisation), which reading a GGUF file needs."""
    try:
        import gguf
    except ImportError as e:
        raise ImportError(f'reading a GGUF file needs the gguf package: pip install -e ".[models]" ({e})') from None
    return gguf


def open_reader(path: str) -> GGUFFile:
    """A GGUF file's metadata and tensors (memory-mapped). Read here rather than with gguf.GGUFReader, which parses
    every entry of a 49,152-token vocabulary into numpy views (7.5 s on 2 cores)."""
    gguf = gguf_package()  # (outside the try: a missing package is not a bad file)
    try:
        return _read(path, gguf)
    except Exception as e:  # noqa: BLE001 (whatever fails to parse, the file is not a GGUF we can read)
        raise ValueError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def _read(path: str, gguf) -> GGUFFile:
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buffer = memoryview(data)
    if bytes(buffer[:4]) != b"GGUF":
        raise ValueError("no GGUF magic number")
    version, num_tensors, num_values = struct.unpack_from("<IQQ", buffer, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} (2 or later is read)")
    at = 24

    def scalar(fmt):
        nonlocal at
        (value,) = struct.unpack_from(fmt, buffer, at)
        at += struct.calcsize(fmt)
        return value

    def string():
        nonlocal at
        size = scalar("<Q")
        at += size
        return bytes(buffer[at - size:at]).decode("utf-8", errors="replace")

    def value(kind):
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item, count = scalar("<I"), scalar("<Q")
            return [value(item) for _ in range(count)]
        return scalar(_SCALARS[kind])

    metadata = {}
    for _ in range(num_values):
        key = string()
        metadata[key] = value(scalar("<I"))
    infos = []
    for _ in range(num_tensors):
        name = string()
        shape = tuple(scalar("<Q") for _ in range(scalar("<I")))
        infos.append((name, shape, gguf.GGMLQuantizationType(scalar("<I")), scalar("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    start = -(-at // alignment) * alignment
    tensors = []
    for name, shape, kind, offset in infos:
        block, type_size = gguf.GGML_QUANT_SIZES[kind]
        rows, row = int(np.prod(shape[1:])), shape[0] // block * type_size
        raw = data[start + offset:start + offset + rows * row]
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            array = raw.view(np.float32 if kind == gguf.GGMLQuantizationType.F32 else np.float16)
            array = array.reshape(tuple(reversed(shape)))
        else:
            array = raw.reshape(rows, row)
        tensors.append(TensorInfo(name, shape, kind, array))
    return GGUFFile(metadata, tensors)


def field(reader: GGUFFile, key: str, default=None):
    return reader.metadata.get(key, default)


def hf_config(reader) -> dict:
    """The file's metadata as a Hugging Face config.json dict."""
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    get = lambda key, default=None: field(reader, f"{arch}.{key}", default)  # noqa: E731
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    hf = {"model_type": ARCHITECTURES[arch], "hidden_size": hidden, "num_hidden_layers": int(get("block_count")),
          "num_attention_heads": heads, "num_key_value_heads": int(get("attention.head_count_kv", heads)),
          "head_dim": int(get("attention.key_length", hidden // heads)),
          "intermediate_size": int(get("feed_forward_length")),
          "max_position_embeddings": int(get("context_length", 8192)),
          "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
          "rope_theta": float(get("rope.freq_base", 10000.0)),
          "vocab_size": int(get("vocab_size", len(tokens) if tokens else 0)),
          "tie_word_embeddings": "output.weight" not in names,
          "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
          "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
          "pad_token_id": field(reader, "tokenizer.ggml.padding_token_id")}
    if "rope_freqs.weight" in names or get("rope.scaling.type") not in (None, "none"):
        raise ValueError(f"{arch} GGUF files with scaled rotary frequencies are not supported; load the model's "
                         "Hugging Face directory instead")
    if arch == "gemma2":
        hf.update(hidden_activation="gelu_pytorch_tanh", sliding_window=get("attention.sliding_window"),
                  attn_logit_softcapping=get("attn_logit_softcapping"),
                  final_logit_softcapping=get("final_logit_softcapping"), query_pre_attn_scalar=hf["head_dim"])
    return hf


def unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Llama query/key rows [heads * Dh, D] (each head's dimensions interleaved in pairs) -> Hugging
    Face's halves layout."""
    dh_half = w.shape[0] // heads // 2
    return w.reshape(heads, dh_half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Tensors(Mapping):
    """Hugging Face tensor name -> float32 numpy array, dequantised from the file when looked up."""

    def __init__(self, reader, hf: dict):
        self.family = hf["model_type"]
        self.heads = {"q": hf["num_attention_heads"], "k": hf["num_key_value_heads"]}
        layer_names = {**LAYER_TENSORS, **NORMS["gemma2" if self.family == "gemma2" else "llama"]}
        self.sources = {}
        for t in reader.tensors:
            name = GLOBAL_TENSORS.get(t.name)
            if t.name.startswith("blk."):
                _, i, rest = t.name.split(".", 2)
                name = f"model.layers.{i}.{layer_names[rest]}" if rest in layer_names else None
            if name is not None:
                self.sources[name] = t

    def __getitem__(self, name: str) -> np.ndarray:
        gguf = gguf_package()

        t = self.sources[name]
        try:
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        except NotImplementedError:
            raise ValueError(f"GGUF tensor {t.name} is stored as {t.tensor_type.name}, which the gguf package cannot "
                             "dequantise") from None
        w = w.reshape(self.shape_of(name))
        if self.family == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = unpermute_rotary(w, self.heads[name.split(".")[-2][0]])
        if self.family == "gemma2" and name.endswith("norm.weight"):
            w = w - 1.0
        return w

    def __contains__(self, name) -> bool:  # (Mapping's default would dequantise the tensor)
        return name in self.sources

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(reversed([int(n) for n in self.sources[name].shape]))

    def __iter__(self):
        return iter(self.sources)

    def __len__(self):
        return len(self.sources)
