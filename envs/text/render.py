"""Token-array building blocks shared by the text tasks: render numbers and glue pieces, parse decimals.

Everything here is pure JAX on int32 ids with static shapes. A variable-length string is carried as a
pair `(ids [W], length)`: the first `length` entries are the string, the rest are padding. The rendering
functions work on one example; tasks `vmap` them over the batch.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from envs.text.tokenizer import Vocab

# 10**k for the exponents an int32 can hold; larger exponents only appear for numbers that are rejected.
_POW10 = np.array([10 ** k for k in range(10)], np.int32)

Piece = tuple[jnp.ndarray, jnp.ndarray]  # (ids [W], length)


def num_digits(x) -> jnp.ndarray:
    """int32 [...]: decimal digits of non-negative `x` [...] (1 for 0)."""
    x = jnp.asarray(x, jnp.int32)
    return 1 + jnp.sum(x[..., None] >= _POW10[1:], axis=-1, dtype=jnp.int32)


def max_digits(x: int) -> int:
    """Static: decimal digits of the non-negative Python int `x`."""
    return len(str(int(x)))


def number(x, width: int, vocab: Vocab) -> Piece:
    """Non-negative scalar `x` in decimal: (ids [width], length). `width` must hold all its digits."""
    n = num_digits(x)
    exponent = n - 1 - jnp.arange(width)
    digit = (x // jnp.asarray(_POW10)[jnp.clip(exponent, 0, 9)]) % 10
    return jnp.where(exponent >= 0, vocab.digit_ids[digit], vocab.pad_id), n


def char(c: str, vocab: Vocab, present=True) -> Piece:
    """The static character `c` as a piece; `present` (bool, may be traced) false gives the empty piece."""
    return jnp.full((1,), vocab.id_of(c), jnp.int32), jnp.asarray(present, jnp.int32)


def token(id_, present=True) -> Piece:
    """A single (possibly traced) token id as a piece."""
    return jnp.reshape(jnp.asarray(id_, jnp.int32), (1,)), jnp.asarray(present, jnp.int32)


def concat(pieces: Sequence[Piece], width: int, pad_id: int) -> Piece:
    """The pieces one after another, packed to the left of `width` slots: (ids [width], total length).

    Output slot p takes the piece whose span covers p, found by comparing p with the running end offsets,
    so the lengths may be traced. Characters beyond `width` are cut (callers size `width` statically from
    the longest possible string).
    """
    w = max(ids.shape[0] for ids, _ in pieces)
    ids = jnp.stack([jnp.pad(ids, (0, w - ids.shape[0]), constant_values=pad_id) for ids, _ in pieces])
    lengths = jnp.stack([jnp.asarray(n, jnp.int32) for _, n in pieces])  # [K]
    ends = jnp.cumsum(lengths)
    starts = ends - lengths
    p = jnp.arange(width)
    k = jnp.minimum(jnp.sum(p[:, None] >= ends[None, :], axis=1), len(pieces) - 1)  # piece under slot p
    out = ids[k, jnp.clip(p - starts[k], 0, w - 1)]
    return jnp.where(p < ends[-1], out, pad_id), ends[-1]


def before_eos(ids: jnp.ndarray, eos_id: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """ids [..., T] -> (int32 [...]: the slots before the first EOS, all T where there is none; bool [...]: there
    is one)."""
    is_eos = ids == eos_id
    ended = is_eos.any(-1)
    return jnp.where(ended, jnp.argmax(is_eos, -1), ids.shape[-1]).astype(jnp.int32), ended


def through_first_eos(ids: jnp.ndarray, eos_id: int) -> jnp.ndarray:
    """bool [..., T]: the slots of ids [..., T] up to and including the first EOS (all where there is none), whatever
    the padding after it is (also the EOS itself, as SmolLM2's <|im_end|>)."""
    is_eos = ids == eos_id
    return jnp.cumsum(is_eos, axis=-1) - is_eos == 0


def widen(piece: Piece, width: int, pad_id: int) -> Piece:
    """The piece with its ids padded to `width` slots (width >= its ids')."""
    ids, length = piece
    return jnp.pad(ids, (0, width - ids.shape[0]), constant_values=pad_id), length


def align_right(piece: Piece, pad_id: int) -> jnp.ndarray:
    """ids [W]: a left-packed piece moved to the right end, padded on the left (the prompt layout, so
    that generation continues right after the last prompt token)."""
    ids, length = piece
    shift = ids.shape[0] - length
    return jnp.where(jnp.arange(ids.shape[0]) >= shift, jnp.roll(ids, shift), pad_id)


def parse_decimal(completions: jnp.ndarray, vocab: Vocab, max_len: int):
    """Read completions as `<digits><EOS>`, batched over any leading axes.

    completions: int32 [..., T]. Returns (value int32 [...], length int32 [...], well_formed bool [...]):
    well_formed is "at least one token before the first EOS, all of them digits"; length counts those
    digits; value is their decimal value, meaningful only when `well_formed` and `length <= max_len <= 9`
    (longer strings would overflow int32, and are never a right answer of `max_len` digits).
    """
    t = completions.shape[-1]
    length, ended = before_eos(completions, vocab.eos_id)
    digit = jnp.take(jnp.asarray(vocab.digit_values), completions, mode="fill", fill_value=-1)
    inside = jnp.arange(t) < length[..., None]
    well_formed = ended & (length >= 1) & jnp.all(~inside | (digit >= 0), axis=-1)
    exponent = jnp.clip(length[..., None] - 1 - jnp.arange(t), 0, min(max_len, 9))
    value = jnp.sum(jnp.where(inside, digit * jnp.asarray(_POW10)[exponent], 0), axis=-1)
    return value, length, well_formed
