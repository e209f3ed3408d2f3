"""Host-side exact checking of Countdown answers: a tiny recursive-descent parser (never `eval`).

Grammar (no spaces, no unary minus, no leading zeros):

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := NUMBER | "(" expr ")"
    NUMBER := "0" | [1-9][0-9]*

Values are `fractions.Fraction`s, so division is exact and `(7-3)/8*6` is 3 as on paper.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Sequence

OPERATORS = "+-*/"


class ExpressionError(ValueError):
    """The text is not an expression of the grammar above."""


def parse_expression(text: str) -> tuple[Fraction | None, list[int]]:
    """(value, numbers): the exact value of `text` (None when it divides by zero) and the number literals
    it uses, in order. Raises ExpressionError when `text` is not a grammatical expression."""
    pos = 0

    def peek() -> str:
        return text[pos] if pos < len(text) else ""

    def literal() -> int:
        nonlocal pos
        start = pos
        while peek() and peek() in "0123456789":  # not str.isdigit, which also accepts e.g. "²"
            pos += 1
        digits = text[start:pos]
        if not digits:
            raise ExpressionError(f"expected a number or '(' at {start} in {text!r}")
        if len(digits) > 1 and digits[0] == "0":
            raise ExpressionError(f"leading zero in {digits!r}")
        numbers.append(int(digits))
        return int(digits)

    def factor() -> Fraction | None:
        nonlocal pos
        if peek() == "(":
            pos += 1
            value = expr()
            if peek() != ")":
                raise ExpressionError(f"unbalanced '(' in {text!r}")
            pos += 1
            return value
        return Fraction(literal())

    def binary(operand, ops: str) -> Fraction | None:
        nonlocal pos
        value = operand()
        while peek() and peek() in ops:
            op = peek()
            pos += 1
            right = operand()
            # Keep parsing after a division by zero (value None) so that syntax errors are still reported.
            if value is None or right is None or (op == "/" and right == 0):
                value = None
            elif op == "+":
                value = value + right
            elif op == "-":
                value = value - right
            elif op == "*":
                value = value * right
            else:
                value = value / right
        return value

    def term() -> Fraction | None:
        return binary(factor, "*/")

    def expr() -> Fraction | None:
        return binary(term, "+-")

    numbers: list[int] = []
    try:
        value = expr()
    except RecursionError:  # absurdly deep nesting: not an answer
        raise ExpressionError("expression nested too deeply") from None
    if pos != len(text):
        raise ExpressionError(f"unexpected {text[pos]!r} at {pos} in {text!r}")
    return value, numbers


def check_countdown(text: str | None, numbers: Sequence[int], target: int,
                    use_all: bool = False) -> tuple[bool, bool]:
    """(correct, well_formed) for a Countdown answer.

    well_formed: `text` is a grammatical expression (None, e.g. a completion without EOS, is not).
    correct: well formed, and its number literals are drawn from `numbers` with each given number used at
    most once (exactly once with `use_all`, TinyZero's rule), it never divides by zero, and its exact
    value is `target`.
    """
    if text is None:
        return False, False
    try:
        value, used = parse_expression(text)
    except ExpressionError:
        return False, False
    given, used = Counter(int(n) for n in numbers), Counter(used)
    numbers_ok = used == given if use_all else used <= given
    return bool(numbers_ok and value is not None and value == target), True
