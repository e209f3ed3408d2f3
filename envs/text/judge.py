"""Judging tasks: a model reads a problem and a candidate solution, writes a critique, then a verdict. The reward is
whether the verdict is right (the task's own verifier knows), whatever the critique says: the critique is the
model's working, learned because it helps the verdict (a generative verifier; the "critique RL" of Critique-Coder
and J1, where the judgment's correctness is the reward).

`countdown_judge`: `7 1 18>25=7+1*18?` -> `25Y` (the candidate's value, then Y: it reaches the target by the rules; N:
it does not). The candidates are the problem's reference solution with its operators redrawn on about half the
problems (`wrong_share`), so about half are wrong; a redrawn one that still reaches the target is right. The
critique's form is an option (`critique`): the value alone; DeepCritic's step-wise critique, each merge of the
candidate checked in turn (`1*18=18;7+18=25Y`: one operation per step, operands in parentheses where negative or a
fraction); or none, the verdict alone.

`addition_judge`: `64+79=173?` -> `143N`, a claimed result judged: the sum, then Y (the claim is the sum) or N. About
half the claims are off by a slip (`SLIPS`), so the verdict needs the sum, not the look of the claim. Posed to a chat
model: "Is 64 + 79 = 173?" -> "64 + 79 = 143. No", judged by the reply's last yes or no, whatever working comes first.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from envs.text import render, tools
from envs.text.tasks import TASKS, Arithmetic, Countdown, Problems, Task, addition, recipe_merges, split_hash
from envs.text.tokenizer import ALPHABET, Vocab
from envs.text.verify import OPERATORS, STEP_SEPARATOR

VERDICTS = "YN"  # right, wrong


# Who writes a critique's value of a Countdown expression: the model itself, or the calculator, a tool the critic
# calls (CRITIC, Gou et al. 2024: tool-interactive critiquing), the critic then writing only its verdict.
CRITICS = ("model", "calculator")
# What a Countdown judge writes before its verdict: the candidate's value, its merges one step each (DeepCritic's
# step-wise critique), or nothing
CRITIQUE_FORMS = ("value", "steps", "none")


class CountdownJudge(Task):
    """Judge a candidate Countdown solution (see the module docstring). Rewards: correct (the verdict, the last
    character before EOS, is the truth) and well_formed (the reply ends in a verdict)."""

    name = "countdown_judge"

    def __init__(self, num_numbers: int = 3, min_number: int = 1, max_number: int = 25, min_target: int = 1,
                 max_target: int = 100, *, wrong_share: float = 0.5, critique: str = "value", split_seed: int = 0):
        super().__init__(split_seed)
        if not 0.0 <= wrong_share <= 1.0:
            raise ValueError(f"wrong_share must be in [0, 1], got {wrong_share}")
        if critique not in CRITIQUE_FORMS:
            raise ValueError(f"critique must be one of {', '.join(CRITIQUE_FORMS)}, got {critique!r}")
        self.base = Countdown(num_numbers, min_number, max_number, min_target, max_target, False, split_seed)
        self.wrong_share, self.critique = float(wrong_share), critique
        self.alphabet = ALPHABET + "?" + VERDICTS + (STEP_SEPARATOR if critique == "steps" else "")
        self.value_width = tools.value_width()
        # a step's values stay within the product of all the given numbers (a denominator: of all but one)
        self.step_value_width = tools.value_width(min(max_number ** num_numbers + 1, tools.MAX_MAGNITUDE))
        self.step_width = 2 * (self.step_value_width + 2) + 3 + self.step_value_width  # (a)op(b)=v;
        self.prompt_length = self.base.prompt_length + self.base.expression_length + 1
        critique_length = {"value": self.value_width, "steps": (num_numbers - 1) * self.step_width - 1, "none": 0}
        self.answer_length = critique_length[critique] + 2  # the critique, the verdict, EOS

    def _propose(self, key, n, level=None):
        return self.base._propose(key, n, level)

    def difficulty(self, problems):
        return self.base.difficulty(problems)

    def candidate_recipe(self, problem: Problems) -> jax.Array:
        """int32 [N-1, 3]: one problem's candidate's merges: the reference's, or (on about `wrong_share` of problems,
        by their hash) the reference's with every operator redrawn to a different one."""
        redraw = (split_hash(problem, self.split_seed + 7) % 1000) < 1000 * self.wrong_share
        steps = problem.recipe.shape[0]
        bits = split_hash(problem, self.split_seed + 8)
        offsets = 1 + (bits >> (2 * jnp.arange(steps, dtype=jnp.uint32))) % 3  # 1..3: never the same operator
        ops = (problem.recipe[:, 2] + jnp.where(redraw, offsets.astype(problem.recipe.dtype), 0)) % 4
        return problem.recipe.at[:, 2].set(ops)

    def candidate(self, problem: Problems, vocab: Vocab) -> render.Piece:
        """One problem's candidate expression (its merges written as one expression)."""
        return self.base._answer_pieces(problem.replace(recipe=self.candidate_recipe(problem)), vocab)[0]

    def step_critique(self, problem: Problems, vocab: Vocab) -> render.Piece:
        """The candidate checked one merge at a time, in the order its expression evaluates them: `1*18=18;7+18=25`
        for `7+1*18`, exact (an operand in parentheses where it is negative or a fraction, so that each step reads as
        an expression); the steps after a division by zero are not written (that step ends at its `=`)."""
        width, ok, pieces = self.step_value_width, jnp.bool_(True), []

        def operand(n, d, present):
            bracket = present & ((n < 0) | (d != 1))
            ids, length = render.concat([render.char("(", vocab, bracket), tools.render_fraction(n, d, width, vocab),
                                         render.char(")", vocab, bracket)], width + 2, vocab.pad_id)
            return ids, jnp.where(present, length, 0)

        # items (numerator, denominator, whether the merge that made it failed); the given numbers are exact
        numbers = problem.numbers.astype(jnp.int32)
        merges, _ = recipe_merges((numbers, jnp.ones_like(numbers), jnp.zeros_like(numbers, bool)),
                                  self.candidate_recipe(problem), lambda a, b, op: tools.apply_operator(op, a[:2], b[:2]))
        for step, ((an, ad, _), (bn, bd, _), op, (n, d, error)) in enumerate(merges):
            value = tools.render_fraction(n, d, width, vocab)
            pieces += [render.char(STEP_SEPARATOR, vocab, ok & (step > 0)), operand(an, ad, ok),
                       render.token(jnp.asarray(vocab.ids_of(OPERATORS))[op], ok), operand(bn, bd, ok),
                       render.char("=", vocab, ok), (value[0], jnp.where(ok & ~error, value[1], 0))]
            ok = ok & ~error
        return render.concat(pieces, self.answer_length - 2, vocab.pad_id)

    def _judgement(self, problem: Problems, vocab: Vocab) -> tuple[tools.Calculation, jax.Array]:
        """(the candidate's value, whether it reaches the target: exactly, an integer)."""
        ids, length = self.candidate(problem, vocab)
        calc = tools.calculator(ids, length, vocab)
        return calc, ~calc.error & (calc.denominator == 1) & (calc.numerator == problem.target)

    def _prompt_pieces(self, problem, vocab):
        return [*self.base._prompt_pieces(problem, vocab), self.candidate(problem, vocab), render.char("?", vocab)]

    def _answer_pieces(self, problem, vocab):
        calc, right = self._judgement(problem, vocab)
        verdict = render.token(jnp.asarray(vocab.ids_of(VERDICTS))[jnp.where(right, 0, 1)])
        critique = {"value": lambda: [tools.render_value(calc, self.value_width, vocab)],
                    "steps": lambda: [self.step_critique(problem, vocab)], "none": lambda: []}[self.critique]()
        return [*critique, verdict]

    @functools.partial(jax.jit, static_argnums=0)
    def rewards(self, problems, completions, vocab):
        """float32 [..., 2] (correct, well_formed) in JAX over completions [..., T] (`verdict_rewards`)."""
        right = jax.vmap(lambda p: self._judgement(p, vocab)[1])(jax.tree.map(lambda x: x.reshape(-1, *x.shape[
            problems.target.ndim:]), problems)).reshape(problems.target.shape)
        return verdict_rewards(right, completions, vocab)


def verdict_rewards(right: jax.Array, completions: jax.Array, vocab: Vocab) -> jax.Array:
    """float32 [..., 2] (correct, well_formed) of a judge's completions [..., T] on problems whose candidate is right
    where `right` [...] (broadcast to the completions' leading axes): the verdict is the token before the first EOS;
    well formed when there is one, correct when it is the truth."""
    is_eos = completions == vocab.eos_id
    ended = jnp.any(is_eos, axis=-1)
    last = jnp.maximum(jnp.argmax(is_eos, axis=-1) - 1, 0)
    verdict = jnp.take_along_axis(completions, last[..., None], axis=-1)[..., 0]
    said_right, said_wrong = verdict == vocab.id_of(VERDICTS[0]), verdict == vocab.id_of(VERDICTS[1])
    well_formed = ended & (jnp.argmax(is_eos, axis=-1) > 0) & (said_right | said_wrong)
    right = jnp.broadcast_to(right.reshape(*right.shape, *(1,) * (well_formed.ndim - right.ndim)), well_formed.shape)
    correct = well_formed & jnp.where(right, said_right, said_wrong)
    return jnp.stack([correct, well_formed], axis=-1).astype(jnp.float32)


# How a wrong claim differs from the true result: a unit or two, or a ten (a carry dropped or doubled), either sign
SLIPS = (1, 2, 10)


class ArithmeticJudge(Task):
    """Judge a claimed result of an arithmetic problem (see the module docstring). Problems: numbers [..., 3] (a, b,
    the claim), target the true result; on about `wrong_share` of them (by their hash) the claim is the result off by
    a slip, never below 0. Rewards as `countdown_judge`'s (`verdict_rewards`)."""

    alphabet = ALPHABET + "?" + VERDICTS

    def __init__(self, base: Arithmetic, wrong_share: float = 0.5):
        super().__init__(base.split_seed)
        if not 0.0 <= wrong_share <= 1.0:
            raise ValueError(f"wrong_share must be in [0, 1], got {wrong_share}")
        self.base, self.wrong_share = base, float(wrong_share)
        self.name, self.op = f"{base.name}_judge", base.op
        largest = 10 ** base.max_digits - 1
        self.claim_digits = render.max_digits(base._combine(largest, largest) + max(SLIPS))
        self.prompt_length = base.prompt_length + self.claim_digits + 1
        self.answer_length = base.answer_digits + 2  # the result, the verdict, EOS

    def claims(self, problems: Problems) -> jax.Array:
        """int32 [...]: the claimed results of the base task's problems [...]."""
        bits = split_hash(problems, self.split_seed + 7)
        wrong = bits % 1000 < 1000 * self.wrong_share
        slip = jnp.asarray(SLIPS)[(bits >> 10) % len(SLIPS)] * jnp.where(((bits >> 13) & 1) == 1, 1, -1)
        slip = jnp.where(problems.target + slip < 0, -slip, slip)
        return problems.target + jnp.where(wrong, slip, 0)

    def _propose(self, key, n, level=None):
        problems, valid = self.base._propose(key, n, level)
        claims = self.claims(problems)
        return problems.replace(numbers=jnp.concatenate([problems.numbers, claims[:, None]], axis=-1)), valid

    def difficulty(self, problems):
        return self.base.difficulty(problems.replace(numbers=problems.numbers[..., :2]))

    @staticmethod
    def right(numbers, target):
        """bool [...]: whether each problem's claim is its result, from its numbers [..., 3] and target [...] (NumPy
        or JAX arrays)."""
        return numbers[..., 2] == target

    def _prompt_pieces(self, problem, vocab):
        a, b = (render.number(x, self.base.max_digits, vocab) for x in problem.numbers[:2])
        return [a, render.char(self.op, vocab), b, render.char("=", vocab),
                render.number(problem.numbers[2], self.claim_digits, vocab), render.char("?", vocab)]

    def _answer_pieces(self, problem, vocab):
        verdict = jnp.asarray(vocab.ids_of(VERDICTS))[jnp.where(self.right(problem.numbers, problem.target), 0, 1)]
        return [*self.base._answer_pieces(problem, vocab), render.token(verdict)]

    @functools.partial(jax.jit, static_argnums=0)
    def rewards(self, problems, completions, vocab):
        """float32 [..., 2] (correct, well_formed) in JAX over completions [..., T] (`verdict_rewards`)."""
        return verdict_rewards(self.right(problems.numbers, problems.target), completions, vocab)


def addition_judge(min_digits: int = 1, max_digits: int = 2, wrong_share: float = 0.5,
                   split_seed: int = 0) -> ArithmeticJudge:
    """`"64+79=173?"` -> `"N"`."""
    return ArithmeticJudge(addition(min_digits, max_digits, split_seed), wrong_share)


TASKS.update({CountdownJudge.name: CountdownJudge, "addition_judge": addition_judge})


# -------------------------------------------------------------------------------------------------
# Value critiques: a generative verifier's working on another model's completion (jaxrl.reward_models' `generative`)

OPENING = "="  # written after a completion: what follows evaluates it
# Values a critique writes: numerators and denominators below this (Countdown's, three numbers up to 25, stay within
# 25^3); a larger or undefined value is written as nothing.
CRITIQUE_MAGNITUDE = 100_000


GOAL = ">"  # a prompt's goal follows this mark (Countdown's target): a critique is written before it is shown


def goal_width(task) -> int:
    """Slots of the goal a task's prompts end with (`>` and Countdown's target digits); 0: no goal to hide."""
    digits = getattr(task, "target_digits", 0)
    return 1 + digits if digits else 0


def hide_goal(prompt: jax.Array, vocab: Vocab, width: int) -> tuple[jax.Array, render.Piece]:
    """A left-padded prompt [P] whose goal a critique must not see: the GOAL mark and what follows it, up to the
    prompt's last token (Countdown's `>25` in `1 7 18>25=`) -> (the prompt with those slots pad, the goal (ids
    [width], length)). Without the mark: the prompt whole and an empty goal. A critique that saw the target could
    copy it instead of computing (a small judge does)."""
    P = prompt.shape[0]
    is_mark = prompt == vocab.id_of(GOAL)
    start = jnp.where(is_mark.any(), jnp.argmax(is_mark), P - 1)
    hidden = (jnp.arange(P) >= start) & (jnp.arange(P) < P - 1)
    goal = jnp.roll(prompt, -start)[:width]
    return jnp.where(hidden, vocab.pad_id, prompt), (goal, jnp.minimum(P - 1 - start, width))


def closing(critique: jax.Array, goal: render.Piece, vocab: Vocab) -> render.Piece:
    """A critique [W] (a completion, "=", the value, EOS) with the goal shown after it, where the verdict is read:
    `7+1*18=25` + `>25` + EOS -> (ids [W + goal width], length)."""
    length, _ = render.before_eos(critique, vocab.eos_id)
    return render.concat([(critique, length), goal, render.token(vocab.eos_id)], critique.shape[0] + goal[0].shape[0],
                         vocab.pad_id)


def critique_width() -> int:
    """Slots a value critique adds after a completion of N: the opening "=" (when the completion has no EOS to
    become it), the value and EOS."""
    return tools.value_width(CRITIQUE_MAGNITUDE) + 2


def opening(completion: jax.Array, vocab: Vocab) -> render.Piece:
    """A completion [N] opened for its critique: its tokens before EOS, then "=" -> (ids [N + critique_width()],
    length): the forced prefix a generative verifier continues with the value it computes."""
    width = completion.shape[0] + critique_width()
    return render.concat([(completion, render.before_eos(completion, vocab.eos_id)[0]), render.char(OPENING, vocab)],
                         width, vocab.pad_id)


def critique_value(expression: jax.Array, vocab: Vocab) -> render.Piece:
    """The calculator's value of an expression [N] (its tokens before EOS) as a critique writes it: (ids
    [tools.value_width(CRITIQUE_MAGNITUDE)], length), empty where it is no expression or its value is out of
    `CRITIQUE_MAGNITUDE`."""
    calc = tools.calculator(expression, render.before_eos(expression, vocab.eos_id)[0], vocab)
    ids, length = tools.render_value(calc, tools.value_width(CRITIQUE_MAGNITUDE), vocab)
    written = ~calc.error & (jnp.abs(calc.numerator) < CRITIQUE_MAGNITUDE) & (calc.denominator < CRITIQUE_MAGNITUDE)
    return ids, jnp.where(written, length, 0)


def value_critique(completion: jax.Array, vocab: Vocab) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The critique a generative verifier learns to write after a completion [N] read as an arithmetic
    expression: `7+1*18=25` + EOS, the value as the calculator computes it (nothing where it is not an
    expression or its value is out of `CRITIQUE_MAGNITUDE`) -> (ids [N + critique_width()], the opened length (where
    the critique starts), the total length)."""
    length, _ = render.before_eos(completion, vocab.eos_id)
    ids, total = render.concat([(completion, length), render.char(OPENING, vocab), critique_value(completion, vocab),
                                render.token(vocab.eos_id)], completion.shape[0] + critique_width(), vocab.pad_id)
    return ids, length + 1, total
