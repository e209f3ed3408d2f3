"""A character-level HuggingFace tokenizer for the text tasks, and its array view for JAX code.

    tok = train_tokenizer(corpus([make_task("addition")], 1000))   # tokenizers.Tokenizer
    save_tokenizer(tok, "run/tokenizer.json"); tok = load_tokenizer("run/tokenizer.json")
    vocab = Vocab.from_tokenizer(tok)          # static ids + lookup tables usable inside jit
    ids = encode(tok, ["12+3="], 8)            # int32 [1, 8]: PAD.. BOS 1 2 + 3 =
    decode(tok, ids)                           # ["12+3="]

Every character is one token (a WordLevel model behind a pre-tokenizer that isolates each character), so
token positions are character positions and JAX code can render numbers digit by digit. The specials are
fixed: `<pad>` 0, `<bos>` 1, `<eos>` 2; characters follow in sorted order, so the same character set
always gives the same ids.
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

import jax.numpy as jnp
import numpy as np
from flax import struct
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
# Every character any task prints: always in the vocabulary, so a policy can emit any of them even when
# the corpus a tokenizer was trained on happened to miss one (e.g. no parentheses in a small sample).
ALPHABET = "0123456789+-*/=() >"


def train_tokenizer(texts: Iterable[str], alphabet: str = ALPHABET) -> Tokenizer:
    """A character-level `tokenizers.Tokenizer` over the characters of `texts` plus `alphabet`.

    Ids: the specials 0..2, then the characters in sorted order (deterministic for a character set).
    Encoding a character outside the vocabulary raises (there is no `<unk>`: an unknown character is a
    bug in a task, not something to learn around).
    """
    chars = set(alphabet)
    for text in texts:
        chars.update(text)
    vocab = {token: i for i, token in enumerate([*SPECIALS, *sorted(chars)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    # One token per character; (?m) lets "." match newlines too in the Oniguruma regex syntax.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # join characters without the default separating spaces
    tok.add_special_tokens(list(SPECIALS))  # so "<eos>" in a text is one token, and skippable on decode
    return tok


def save_tokenizer(tok: Tokenizer, path: str) -> None:
    """Write `tok` as a `tokenizer.json` that `load_tokenizer` (or `Tokenizer.from_file`) reads back."""
    tok.save(str(path))


def load_tokenizer(path: str) -> Tokenizer:
    """Read a tokenizer written by `save_tokenizer`."""
    return Tokenizer.from_file(str(path))


@struct.dataclass
class Vocab:
    """The token table of a tokenizer as static data that jitted code can close over or take as argument.

    All fields are static (no array leaves), so a `Vocab` may be passed to `jax.jit`-ed functions; the
    lookup tables are numpy constants that become XLA constants when used.

    tokens: the token string of each id, `tokens[id]`.
    """

    tokens: tuple[str, ...] = struct.field(pytree_node=False)

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> "Vocab":
        tokens = tuple(tok.id_to_token(i) for i in range(tok.get_vocab_size()))
        vocab = cls(tokens)
        if (vocab.pad_id, vocab.bos_id, vocab.eos_id) != (0, 1, 2):
            raise ValueError(f"tokenizer specials must be {PAD}=0 {BOS}=1 {EOS}=2, got {tokens[:3]}")
        return vocab

    @classmethod
    def from_alphabet(cls, alphabet: str = ALPHABET) -> "Vocab":
        """The vocabulary `train_tokenizer` builds for a corpus over `alphabet`, without a tokenizer."""
        return cls((*SPECIALS, *sorted(set(alphabet))))

    @property
    def size(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    def id_of(self, token: str) -> int:
        """The id of a character or special, as a Python int (for static characters in JAX code)."""
        try:
            return self._index[token]
        except KeyError:
            raise KeyError(f"{token!r} is not in the vocabulary {''.join(self.tokens[3:])!r}") from None

    @property
    def pad_id(self) -> int:
        return self.id_of(PAD)

    @property
    def bos_id(self) -> int:
        return self.id_of(BOS)

    @property
    def eos_id(self) -> int:
        return self.id_of(EOS)

    def ids_of(self, chars: str) -> np.ndarray:
        """int32 [len(chars)]: the ids of `chars`, a static table to index with traced values."""
        return np.array([self.id_of(c) for c in chars], np.int32)

    @property
    def digit_ids(self) -> jnp.ndarray:
        """int32 [10]: `digit_ids[d]` is the id of the character `str(d)`."""
        return jnp.asarray(self.ids_of("0123456789"))

    @functools.cached_property
    def char_ids(self) -> np.ndarray:
        """int32 [128]: the id of each ASCII character (`char_ids[ord(c)]`), -1 where it has none."""
        table = np.full(128, -1, np.int32)
        for i, token in enumerate(self.tokens):
            if len(token) == 1 and ord(token) < 128:
                table[ord(token)] = i
        return table

    @functools.cached_property
    def digit_values(self) -> np.ndarray:
        """int32 [size]: the digit each token id stands for, -1 for non-digits (inverse of digit_ids)."""
        table = np.full(self.size, -1, np.int32)
        for d in range(10):
            table[self.id_of(str(d))] = d
        return table

    def text(self, ids: Sequence[int]) -> str | None:
        """Host-side: the characters before the first EOS, or None if there is no EOS or a special/unknown
        id precedes it (a completion that is not a plain answer)."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                return "".join(out)
            if not 0 <= i < self.size or self.tokens[i] in SPECIALS:
                return None
            out.append(self.tokens[i])
        return None


def encode(tok: Tokenizer, texts: Sequence[str], length: int, left_pad: bool = True, *,
           bos: bool | None = None, eos: bool | None = None) -> np.ndarray:
    """int32 [B, length]: `texts` as padded id rows.

    `left_pad=True` lays out prompts (BOS, text, padded on the left, as `Task.prompts` renders them);
    `left_pad=False` lays out answers (text, EOS, padded on the right, as `Task.reference_answers`).
    `bos` / `eos` override whether BOS / EOS are added. A text longer than `length` raises.
    """
    bos = left_pad if bos is None else bos
    eos = (not left_pad) if eos is None else eos
    out = np.full((len(texts), length), tok.token_to_id(PAD), np.int32)
    for row, encoding in enumerate(tok.encode_batch(list(texts), add_special_tokens=False)):
        ids = [tok.token_to_id(BOS)] * bos + encoding.ids + [tok.token_to_id(EOS)] * eos
        if len(ids) > length:
            raise ValueError(f"{texts[row]!r} needs {len(ids)} tokens, more than length={length}")
        if left_pad:
            out[row, length - len(ids):] = ids
        else:
            out[row, :len(ids)] = ids
    return out


def decode(tok: Tokenizer, ids) -> list[str]:
    """The text of each row of `ids` [B, T]: PAD and BOS dropped, everything from the first EOS cut."""
    pad, bos, eos = (tok.token_to_id(t) for t in SPECIALS)
    rows = []
    for row in np.asarray(ids).tolist():
        if eos in row:
            row = row[:row.index(eos)]
        rows.append([i for i in row if i not in (pad, bos)])
    return tok.decode_batch(rows, skip_special_tokens=False)
