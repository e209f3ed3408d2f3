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


STEP_SEPARATOR = ";"


def _signed(text: str) -> int:
    """An integer with an optional leading minus (no leading zeros)."""
    digits = text[1:] if text.startswith("-") else text
    if not digits or any(c not in "0123456789" for c in digits) or (len(digits) > 1 and digits[0] == "0"):
        raise ExpressionError(f"not an integer: {text!r}")
    return int(text)


def check_countdown_steps(text: str | None, numbers: Sequence[int], target: int,
                          use_all: bool = False) -> tuple[bool, bool, list[bool]]:
    """(correct, well_formed, step_correct) for a Countdown answer written as steps `a op b=v;c op d=w`.

    Each step combines two available values (given numbers and earlier steps' results, each used at most once;
    operands may be negative) into the written integer v, which becomes available. well_formed: every step has that
    shape. step_correct[k]: step k's operands were available and v is exactly `a op b` (a step after a wrong one
    may still be right). correct: well formed, every step right, the last result is `target` (and with `use_all`,
    every given number used).
    """
    if text is None or not text:
        return False, False, []
    available = Counter(int(n) for n in numbers)
    steps, checks = text.split(STEP_SEPARATOR), []
    result = None
    for step in steps:
        left, _, written = step.partition("=")
        split_at = next((k for k in range(1, len(left)) if left[k] in OPERATORS), None)
        if not _ or split_at is None:
            return False, False, checks
        try:
            a, b, result = _signed(left[:split_at]), _signed(left[split_at + 1:]), _signed(written)
        except ExpressionError:
            return False, False, checks
        op, operands = left[split_at], Counter([a, b])
        usable = operands <= available
        if usable:
            available -= operands
        exact = {"+": Fraction(a + b), "-": Fraction(a - b), "*": Fraction(a * b),
                 "/": Fraction(a, b) if b else None}[op]
        checks.append(bool(usable and exact is not None and exact == result))
        available[result] += 1
    numbers_ok = not use_all or len(steps) == len(numbers) - 1  # (N - 1 right steps use up every number)
    return bool(all(checks) and result == target and numbers_ok), True, checks
