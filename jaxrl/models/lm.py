"""`LanguageModel`: a pretrained model's config, parameters and tokenizer together, with `logits`, `generate` and
`chat`; `from_pretrained` reads one by name, from a Hugging Face directory or from a GGUF file, and
`save_pretrained` writes the Hugging Face directory transformers and vLLM serve.

    lm = models.from_pretrained("smollm2-135m-instruct")
    logits = lm.logits(jnp.asarray([lm.tokenizer.encode("The capital of France is").ids]))  # [1, T, V]
    text = lm.generate("The capital of France is", max_new_tokens=32)                      # greedy by default
    reply = lm.chat([{"role": "user", "content": "What is 7 * 8?"}], max_new_tokens=32)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.models import gguf_file, hf, installed, lora
from jaxrl.models.config import ModelConfig, from_hf_config
from jaxrl.models.decoder import VALUE_HEAD, Decoder
from jaxrl.models.tokenizer import TokenizerFiles, from_directory, from_gguf


@dataclasses.dataclass
class LanguageModel:
    config: ModelConfig
    params: Any  # {"params": ...} of `Decoder(config)`
    tokenizer_files: TokenizerFiles
    source: str = ""  # where it was read from

    @property
    def module(self) -> Decoder:
        return Decoder(self.config)

    @property
    def tokenizer(self):
        """The `tokenizers.Tokenizer` (encode(text).ids, decode(ids))."""
        return self.tokenizer_files.tokenizer

    @property
    def pad_id(self) -> int:
        """The id prompts are left-padded with: the checkpoint's pad token, else its first end-of-sequence id."""
        for candidate in (self.tokenizer_files.token_id(self.tokenizer_files.pad_token), self.config.pad_id,
                          *self.eos_ids):
            if candidate is not None:
                return int(candidate)
        return 0

    @property
    def eos_ids(self) -> tuple[int, ...]:
        ids = list(self.config.eos_ids)
        eos = self.tokenizer_files.token_id(self.tokenizer_files.eos_token)
        if eos is not None and eos not in ids:
            ids.append(eos)
        return tuple(ids)

    def logits(self, tokens: jax.Array, attn_mask: jax.Array | None = None) -> jax.Array:
        """tokens int32 [B, T] (left-padded where attn_mask [B, T] is False) -> logits float32 [B, T, V]."""
        tokens = jnp.asarray(tokens, jnp.int32)
        real = jnp.ones(tokens.shape, bool) if attn_mask is None else jnp.asarray(attn_mask, bool)
        positions = jnp.maximum(jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1, 0)
        return _forward(self.module, self.params, tokens, positions, real)[0]

    def encode_batch(self, texts: Sequence[str]) -> jax.Array:
        """Texts -> int32 [B, P], left-padded with `pad_id`."""
        ids = [self.tokenizer_files.encode(t) for t in texts]
        width = max(len(i) for i in ids)
        return jnp.asarray([[self.pad_id] * (width - len(i)) + i for i in ids], jnp.int32)

    def generate(self, prompt: str | Sequence[str], max_new_tokens: int = 32, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, skip_special_tokens: bool = True):
        """Continue the prompt (or each of a list of prompts, as one batch): greedy at temperature 0. -> the new
        text (or a list of them), up to and without the end-of-sequence token."""
        from jaxrl.sampling import sample

        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        tokens = self.encode_batch(prompts)
        if tokens.shape[1] + max_new_tokens > self.config.max_len:
            raise ValueError(f"prompt {tokens.shape[1]} + {max_new_tokens} new tokens exceed the model's "
                             f"{self.config.max_len} positions")
        out = sample(self.module, self.params, tokens, jax.random.key(seed), max_new_tokens=max_new_tokens,
                     eos_id=jnp.asarray(self.eos_ids or (-1,), jnp.int32), pad_id=self.pad_id,
                     temperature=temperature, top_k=top_k, top_p=top_p)
        texts = [self.decode(row, mask, skip_special_tokens) for row, mask in zip(np.asarray(out.tokens),
                                                                                 np.asarray(out.mask))]
        return texts[0] if isinstance(prompt, str) else texts

    def decode(self, ids, mask=None, skip_special_tokens: bool = True) -> str:
        """Token ids (those where mask > 0, without a final end-of-sequence token) -> text."""
        ids = [int(i) for i, m in zip(ids, np.ones(len(ids)) if mask is None else mask) if m > 0]
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self.tokenizer_files.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        return self.tokenizer_files.render_chat(messages, add_generation_prompt, **variables)

    def chat(self, messages: list[dict], max_new_tokens: int = 256, **sampling) -> str:
        """The assistant's reply to a conversation (rendered with the model's chat template)."""
        return self.generate(self.render_chat(messages), max_new_tokens, **sampling)


@functools.partial(jax.jit, static_argnums=0)
def _forward(module, params, tokens, positions, real):
    return module.apply(params, tokens, positions, real)


def is_pretrained(path: str) -> bool:
    """Whether `path` names a pretrained model: an installed name, a .gguf file or a Hugging Face directory."""
    if path in installed.INSTALLED or (path.endswith(".gguf") and os.path.isfile(path)):
        return True
    config = os.path.join(path, hf.CONFIG)  # (a run directory has a config.json too: jaxrl's, without model_type)
    if not os.path.isfile(config):
        return False
    try:
        return "model_type" in json.load(open(config))
    except ValueError:
        return False


def source_path(name_or_path: str, download: bool = True) -> str:
    """An installed model's file (fetched when absent), or the path itself once it is checked to be a model."""
    if name_or_path in installed.INSTALLED:
        return installed.resolve(name_or_path, download=download)
    if os.path.isdir(name_or_path) or (name_or_path.endswith(".gguf") and os.path.isfile(name_or_path)):
        return name_or_path
    if not os.path.exists(name_or_path):
        raise ValueError(f"model {name_or_path!r} is neither a known name ({', '.join(installed.INSTALLED)}) nor an "
                         "existing path")
    raise ValueError(f"{name_or_path} is neither a Hugging Face model directory nor a .gguf file")


@functools.lru_cache(maxsize=2)
def _gguf(path: str, modified: float):
    """(reader, Hugging Face config) of a GGUF file, read once per file version (parsing its metadata takes seconds)."""
    reader = gguf_file.open_reader(path)
    return reader, gguf_file.hf_config(reader)


def read_spec(name_or_path: str, *, download: bool = True, **overrides) -> tuple[ModelConfig, TokenizerFiles]:
    """A pretrained model's architecture and tokenizer, without its weights. overrides: ModelConfig fields (dtype,
    param_dtype, remat, value_head)."""
    path = source_path(name_or_path, download)
    if os.path.isdir(path):
        config, files = hf.read_config(path, **overrides), from_directory(path)
    else:
        reader, hf_config = _gguf(path, os.path.getmtime(path))
        config, files = from_hf_config(hf_config, **overrides), from_gguf(reader)
    check_tokenizer(config, files)
    return config, files


def read_params(name_or_path: str, config: ModelConfig, shardings=None) -> dict:
    """A pretrained model's weights as `Decoder(config)` parameters ({"params": ...}, without a value head), each
    device given only its shard when `shardings` (a tree of `jax.sharding.Sharding`) is."""
    path = source_path(name_or_path)
    config = dataclasses.replace(config, lora_rank=0)  # (a checkpoint holds the base weights only)
    if os.path.isdir(path):
        tensors = hf.open_checkpoint(path)
    else:
        reader, hf_config = _gguf(path, os.path.getmtime(path))
        tensors = gguf_file.Tensors(reader, hf_config)
    hf.check_vocab(config, tensors)
    return {"params": hf.place(hf.param_builders(config, tensors), config.param_dtype,
                               None if shardings is None else shardings["params"])}


def from_pretrained(name_or_path: str, *, dtype=None, param_dtype=None, value_head: bool = False,
                    remat: bool = False, shardings=None, download: bool = True) -> LanguageModel:
    """A pretrained model: an installed name (`smollm2-135m-instruct`), a Hugging Face directory or a .gguf file.

    dtype: compute dtype (default float32); param_dtype: the parameters' (default float32); value_head: add a
    per-token value head (zero-initialised: it predicts 0 until trained); shardings: a tree of
    `jax.sharding.Sharding` matching the parameters (`jaxrl.models.sharding.param_shardings`), each device then
    receives only its shard."""
    overrides = {k: v for k, v in dict(dtype=dtype, param_dtype=param_dtype, value_head=value_head,
                                       remat=remat).items() if v is not None}
    config, files = read_spec(name_or_path, download=download, **overrides)
    params = read_params(name_or_path, config, shardings)
    if value_head:
        params["params"][VALUE_HEAD] = {"kernel": jnp.zeros((config.hidden_size, 1), jnp.float32),
                                        "bias": jnp.zeros((1,), jnp.float32)}
    return LanguageModel(config, params, files, source_path(name_or_path, download))


def check_tokenizer(config: ModelConfig, files: TokenizerFiles) -> None:
    size = files.tokenizer.get_vocab_size(with_added_tokens=True)
    if size > config.vocab_size:
        raise ValueError(f"the tokenizer has {size} tokens but the model's embedding has {config.vocab_size} rows")


def save_pretrained(model: LanguageModel, directory: str, *, params=None, dtype=None) -> str:
    """Write `model` (with `params` in place of its own when given: a trained run's) as a Hugging Face directory:
    config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json."""
    params = lora.merge(model.config, model.params if params is None else params)  # adapters folded in
    params = {"params": {k: v for k, v in params["params"].items() if k != VALUE_HEAD}}
    config = dataclasses.replace(model.config, lora_rank=0, value_head=False)
    hf.save_directory(config, params, directory, extra_files=model.tokenizer_files.files(), dtype=dtype)
    return directory
