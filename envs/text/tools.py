"""Tools for multi-turn text agents, as pure JAX functions of token arrays: a calculator and a table lookup.

    value = calculator(tokens, length, vocab)     # Calculation: exact rational value, error flag, literals used
    piece = render_value(value, width, vocab)     # "15", "-3", "7/2" as (ids [width], length)

The calculator reads the grammar of `envs.text.verify` (the host-side Countdown checker): numbers without
leading zeros, `+ - * /`, parentheses, no unary minus, no spaces. It evaluates exactly, on fractions of int32
numerators and denominators reduced after every operation, so that `(7-3)/8*6` is 3 as on paper. A text that is
not an expression, a division by zero, or a value beyond `MAX_MAGNITUDE` is an error (never a crash, never a
wrong number). One expression is one `lax.scan` over its tokens with two stacks (shunting-yard); it jits
and vmaps like any other array function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.text import render
from envs.text.tokenizer import Vocab
from envs.text.verify import OPERATORS

MAX_MAGNITUDE = 2 ** 24  # numerators and denominators stay below this: every product of two fits an int32
MAX_LITERAL = 10 ** 6  # a number literal of more digits is an error
_OPEN = 4  # the operator stack's code for "(" (0..3 index OPERATORS)
# + - * / ( (numpy: a jax array made at import would start jax's runtime in every process that imports envs)
_PRECEDENCE = np.array([1, 1, 2, 2, 0], np.int32)


@struct.dataclass
class Calculation:
    """One expression's outcome. numerator, denominator int32 (denominator > 0, reduced); error bool: not an
    expression, a division by zero or a value out of range; literals int32 [W] with `num_literals` of them
    real: the numbers the expression uses, in order (Countdown's rule checks them)."""

    numerator: jax.Array
    denominator: jax.Array
    error: jax.Array
    literals: jax.Array
    num_literals: jax.Array


def _reduce(n, d):
    """n / d with d > 0 and gcd 1 (0 is 0/1)."""
    g = jnp.maximum(jnp.gcd(n, d), 1)
    n, d = n // g, d // g
    return jnp.where(d < 0, -n, n), jnp.abs(d)


def apply_operator(op, a, b):
    """(numerator, denominator, error) of a `op` b (op an index of OPERATORS) on reduced fractions a = (n, d),
    b = (n, d): exact, an error on a division by zero or a value beyond MAX_MAGNITUDE."""
    (an, ad), (bn, bd) = a, b
    big = lambda x, y: jnp.abs(x.astype(jnp.float32) * y.astype(jnp.float32)) >= MAX_MAGNITUDE  # noqa: E731
    cross = big(an, bd) | big(bn, ad) | big(ad, bd)
    add_n = an * bd + bn * ad
    n = jnp.select([op == 0, op == 1, op == 2], [add_n, an * bd - bn * ad, an * bn], an * bd)
    d = jnp.select([op == 2, op == 3], [ad * bd, ad * jnp.where(bn == 0, 1, bn)], ad * bd)
    overflow = jnp.select([op == 2, op == 3], [big(an, bn) | big(ad, bd), big(an, bd) | big(ad, bn)], cross)
    error = overflow | ((op == 3) & (bn == 0))
    n, d = _reduce(jnp.where(error, 0, n), jnp.where(error, 1, d))
    return n, d, error | (jnp.abs(n) >= MAX_MAGNITUDE) | (d >= MAX_MAGNITUDE)


def calculator(tokens: jax.Array, length, vocab: Vocab) -> Calculation:
    """Evaluate the expression in tokens[:length] (int32 [W] ids of `vocab`)."""
    W = tokens.shape[0]
    digit = jnp.take(jnp.asarray(vocab.digit_values), tokens, mode="fill", fill_value=-1)
    op_ids = jnp.asarray(vocab.ids_of(OPERATORS))
    op_code = jnp.where(tokens[:, None] == op_ids, jnp.arange(4), 4).min(axis=1)  # 4: not an operator
    is_open, is_close = tokens == vocab.id_of("("), tokens == vocab.id_of(")")

    def reduce_top(s, stop):
        """Apply the operators on top of the stack while `stop(top operator)` is false."""
        def keep_going(s):
            return (s["osp"] > 0) & ~stop(s["ops"][s["osp"] - 1]) & ~s["error"]

        def apply_top(s):
            op = s["ops"][s["osp"] - 1]
            i = s["vsp"] - 2
            n, d, error = apply_operator(op, (s["num"][i], s["den"][i]), (s["num"][i + 1], s["den"][i + 1]))
            return {**s, "num": s["num"].at[i].set(n), "den": s["den"].at[i].set(d), "vsp": s["vsp"] - 1,
                    "osp": s["osp"] - 1, "error": s["error"] | error | (s["vsp"] < 2)}
        return jax.lax.while_loop(keep_going, apply_top, s)

    def flush(s, when=True):
        """Push the number being read (if any, and `when`) as a value and a literal."""
        push = s["reading"] & when
        return {**s, "num": jnp.where(push, s["num"].at[s["vsp"]].set(s["value"]), s["num"]),
                "den": jnp.where(push, s["den"].at[s["vsp"]].set(1), s["den"]),
                "literals": jnp.where(push, s["literals"].at[s["nlit"]].set(s["value"]), s["literals"]),
                "vsp": s["vsp"] + push, "nlit": s["nlit"] + push, "reading": s["reading"] & ~push}

    def step(s, xs):
        """One token (selects rather than branches: inside vmap and shard_map both sides run anyway)."""
        i, d, op, opening, closing = xs
        is_digit = d >= 0
        # a digit starts a number where an operand is due, or extends one that does not start with 0
        bad_digit = is_digit & ~(s["operand_due"] | (s["reading"] & ~s["leading_zero"]))
        value = jnp.where(s["reading"], s["value"] * 10 + d, d)
        t = {**s, "value": jnp.where(is_digit, value, s["value"]),
             "leading_zero": jnp.where(is_digit & ~s["reading"], d == 0, s["leading_zero"]),
             "error": s["error"] | bad_digit | (is_digit & (value >= MAX_LITERAL)),
             "operand_due": s["operand_due"] & ~is_digit, "reading": s["reading"] | is_digit}
        t = flush(t, ~is_digit)
        # "(" where an operand is due; ")" and operators after an operand
        known = is_digit | opening | closing | (op < 4)
        misplaced = jnp.where(opening, ~t["operand_due"], ~is_digit & t["operand_due"])
        t = {**t, "error": t["error"] | ~known | (misplaced & known & ~is_digit)}
        # ")" applies the operators back to its "(", an operator those that bind at least as tightly
        precedence = jnp.asarray(_PRECEDENCE)
        stop = lambda top: jnp.where(closing, top == _OPEN,  # noqa: E731
                                     jnp.where(op < 4, precedence[top] < precedence[jnp.minimum(op, 3)], True))
        t = reduce_top(t, stop)
        opened = (t["osp"] > 0) & (t["ops"][jnp.maximum(t["osp"] - 1, 0)] == _OPEN)
        t = {**t, "osp": t["osp"] - (closing & opened), "error": t["error"] | (closing & ~opened)}
        pushed = jnp.where(opening, _OPEN, op)
        push = (opening | (op < 4)) & ~t["error"]
        t = {**t, "ops": jnp.where(push, t["ops"].at[t["osp"]].set(pushed), t["ops"]),
             "osp": t["osp"] + push, "operand_due": t["operand_due"] | push}
        active = (i < length) & ~s["error"]
        return jax.tree.map(lambda new, old: jnp.where(active, new, old), t, s), None

    zeros = jnp.zeros(W + 1, jnp.int32)
    state = {"num": zeros, "den": zeros + 1, "vsp": jnp.int32(0), "ops": zeros, "osp": jnp.int32(0),
             "value": jnp.int32(0), "reading": jnp.bool_(False), "leading_zero": jnp.bool_(False),
             "operand_due": jnp.bool_(True), "error": jnp.bool_(False), "literals": zeros, "nlit": jnp.int32(0)}
    # (derived from the inputs, the loop's state varies over devices as they do inside `shard_map`)
    zero = jnp.sum(tokens) * 0 + jnp.asarray(length, jnp.int32) * 0
    state = jax.tree.map(lambda x: x ^ (zero != 0) if x.dtype == bool else x + zero.astype(x.dtype), state)
    state, _ = jax.lax.scan(step, state, (jnp.arange(W), digit, op_code, is_open, is_close))
    state = flush(state)
    state = {**state, "error": state["error"] | state["operand_due"]}  # empty, or ends on an operator or "("
    state = reduce_top(state, lambda top: top == _OPEN)
    error = state["error"] | (state["osp"] > 0) | (state["vsp"] != 1)  # an unclosed "("
    return Calculation(jnp.where(error, 0, state["num"][0]), jnp.where(error, 1, state["den"][0]), error,
                       state["literals"][:W], state["nlit"])


def uses_given_numbers(calc: Calculation, numbers: jax.Array, use_all: bool = False) -> jax.Array:
    """bool: each literal of the expression is one of `numbers` [N], each given number used at most once (a number
    given twice may be used twice); with `use_all`, each exactly once. Countdown's rule (`check_countdown`)."""
    W = calc.literals.shape[0]
    real = jnp.arange(W) < calc.num_literals
    used = jnp.sum((calc.literals[:, None] == calc.literals[None, :]) & real[None, :], axis=1)
    given = jnp.sum(calc.literals[:, None] == numbers[None, :], axis=1)
    within = jnp.all(~real | (used <= given))
    return within & (calc.num_literals == numbers.shape[0]) if use_all else within


def value_width(max_magnitude: int = MAX_MAGNITUDE) -> int:
    """Characters of the longest value `render_value` writes: a sign, a numerator, "/" and a denominator."""
    digits = render.max_digits(max_magnitude - 1)
    return 1 + digits + 1 + digits


def render_value(calc: Calculation, width: int, vocab: Vocab) -> render.Piece:
    """`-7/2`, `15`: the value as text (ids [width], length); width from `value_width` holds any value."""
    return render_fraction(calc.numerator, calc.denominator, width, vocab)


def render_fraction(numerator, denominator, width: int, vocab: Vocab) -> render.Piece:
    """A reduced fraction (int32 scalars, denominator > 0, both below MAX_MAGNITUDE) as `render_value` writes it."""
    digits = render.max_digits(MAX_MAGNITUDE - 1)
    fraction = denominator != 1
    return render.concat([render.char("-", vocab, numerator < 0), render.number(jnp.abs(numerator), digits, vocab),
                          render.char("/", vocab, fraction),
                          _present(render.number(denominator, digits, vocab), fraction)], width, vocab.pad_id)


def _present(piece: render.Piece, present) -> render.Piece:
    ids, length = piece
    return ids, jnp.where(present, length, 0)
