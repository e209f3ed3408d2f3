"""Tokenizers of pretrained models (the `tokenizers` library) and their chat templates, rendered as Hugging
Face's `apply_chat_template` renders them (a sandboxed jinja2 environment with the same options, globals and
filters).

`TokenizerFiles` is what a model directory holds: tokenizer.json, and the special tokens and chat template from
tokenizer_config.json (or chat_template.jinja); `from_gguf` builds the same from a GGUF file's metadata.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

# Pre-tokenizers of byte-level vocabularies, by llama.cpp's `tokenizer.ggml.pre` name: how text is split before
# the merges apply (they were learned on the splits this gives).
_GPT2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(regex: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


PRE_TOKENIZERS = {
    "gpt2": lambda: _GPT2,
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2]),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}


@dataclasses.dataclass
class TokenizerFiles:
    """A pretrained model's tokenizer: the `tokenizers.Tokenizer`, its special tokens and its chat template."""

    tokenizer: tokenizers.Tokenizer
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    add_bos: bool = False  # prepend bos_token to encoded text (not to a rendered chat: the template writes it)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.token_id(self.bos_token)
        return [bos, *ids] if self.add_bos and bos is not None else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """The conversation as the model's chat template writes it (what transformers' apply_chat_template with
        tokenize=False returns)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template (tokenizer_config.json names none)")
        try:
            template = _environment().from_string(self.chat_template)
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                   pad_token=self.pad_token or "", **variables)
        except Exception as e:  # noqa: BLE001 (a template error of any kind is the user's template, not ours)
            raise ValueError(f"the chat template failed to render: {type(e).__name__}: {e}") from None

    def files(self) -> dict[str, str]:
        """File name -> text of the tokenizer files a Hugging Face directory holds."""
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": self.add_bos,
                  "clean_up_tokenization_spaces": False}
        for key in ("bos_token", "eos_token", "pad_token", "chat_template"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        return {"tokenizer.json": self.tokenizer.to_str(), "tokenizer_config.json": json.dumps(config, indent=2)}


def _environment():
    """jinja2 as transformers configures it for chat templates."""
    import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def _token_content(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def from_directory(directory: str) -> TokenizerFiles:
    """tokenizer.json plus tokenizer_config.json (special tokens, chat template) or chat_template.jinja."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
        raise ValueError(f"{directory} has no tokenizer.json")
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = json.load(open(config_path)) if os.path.exists(config_path) else {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.exists(jinja):
        template = open(jinja).read()
    return TokenizerFiles(tokenizers.Tokenizer.from_file(path), template,
                          _token_content(config.get("bos_token")), _token_content(config.get("eos_token")),
                          _token_content(config.get("pad_token")), bool(config.get("add_bos_token", False)))


def from_gguf(reader) -> TokenizerFiles:
    """A byte-level BPE tokenizer (`tokenizer.ggml.model` gpt2) from a GGUF file's vocabulary and merges, with the
    file's control tokens as special tokens."""
    from jaxrl.models.gguf_file import field

    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {kind!r} is not supported (supported: gpt2, the byte-level BPE of Llama 3, "
                         "Qwen and SmolLM2); load the model's Hugging Face directory instead")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    pre = field(reader, "tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")
    tokenizer = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    control, user = 3, 4  # llama.cpp's token types
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == control])
    tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == user])
    name = lambda key: None if field(reader, key) is None else tokens[int(field(reader, key))]  # noqa: E731
    return TokenizerFiles(tokenizer, field(reader, "tokenizer.chat_template"), name("tokenizer.ggml.bos_token_id"),
                          name("tokenizer.ggml.eos_token_id"), name("tokenizer.ggml.padding_token_id"),
                          bool(field(reader, "tokenizer.ggml.add_bos_token", False)))
