"""Procedurally generated arithmetic tasks with exact verifiers, as integer token arrays for JAX.

    task = make_task("addition", max_digits=3)
    problems = task.sample(key, 256, "train")                 # Problems, leaves [B, ...]
    prompts = task.prompts(problems, vocab)                   # int32 [B, prompt_length]: PAD.. BOS 12+345=
    answers = task.reference_answers(problems, vocab)         # int32 [B, answer_length]: 357 EOS PAD..
    rewards = task.rewards(problems, completions, vocab)      # float32 [B, 2]: task.reward_names

Prompt formats (after BOS): addition `"12+345="`, multiplication `"12*34="`, countdown `"3 5 7 1>24="`
(the given numbers, then `>` and the target). Answers: the decimal result, or for countdown an expression
over the given numbers with `+ - * /` and parentheses, then EOS.

Sampling, prompts and reference answers are jittable for every task (`sample` takes `batch` and `split`
statically); rewards are jittable for addition and multiplication. Countdown checks answers on the host
(`host_verifier = True`): its `rewards` takes numpy arrays, and `jax_rewards` wraps it in a
`jax.pure_callback` for use inside jit.

Held-out problems: a problem is held out when a cheap integer hash of its sorted numbers and target
(salted by `split_seed`) falls in a fixed 10% bucket. `sample(key, batch, "train")` only returns the other
90%, `"test"` only the held-out ones (rejection sampling inside a `lax.while_loop`), and
`heldout(num, seed)` is a fixed test set. Sorting makes `a+b` and `b+a` (and permuted Countdown numbers)
one problem, so swapping operands never leaks a test problem into training.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import unknown_name, vary_over, varying_axes
from envs.text import render
from envs.text.render import Piece
from envs.text.tokenizer import ALPHABET, BOS, EOS, Vocab
from envs.text.verify import OPERATORS, STEP_SEPARATOR, check_countdown, check_countdown_steps

REWARD_NAMES = ("correct", "well_formed")
SPLITS = ("train", "test")
HELDOUT_PER_MILLE = 100  # 10% of problems are held out


@struct.dataclass
class Problems:
    """A batch of problems. Shapes `[B, ...]` (any leading axes work where a docstring says `[...]`).

    numbers: int32 [B, N] the operands (addition, multiplication: N=2) or the given Countdown numbers.
    target:  int32 [B] the answer value.
    recipe:  int32 [B, N-1, 3] for Countdown, rows (i, j, op): how the reference solution combines the
             numbers (see `Countdown`); [B, 0, 3] for tasks whose prompt is the expression itself.
    """

    numbers: jax.Array
    target: jax.Array
    recipe: jax.Array

    def __getitem__(self, index) -> "Problems":
        return jax.tree.map(lambda x: x[index], self)


def split_hash(problems: Problems, seed: int = 0) -> jax.Array:
    """uint32 [...]: an order-insensitive hash of (numbers, target), salted by `seed` (FNV-1a steps and
    murmur3's finaliser: cheap, and its low bits are well mixed so `% 1000` buckets are uniform)."""
    columns = [*jnp.moveaxis(jnp.sort(problems.numbers, axis=-1), -1, 0), problems.target]
    h = jnp.full(problems.target.shape, (0x811C9DC5 + seed * 0x9E3779B9) % 2**32, jnp.uint32)
    for column in columns:
        h = (h ^ column.astype(jnp.uint32)) * jnp.uint32(0x01000193)
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


class Task:
    """A family of problems: static sizes, jittable samplers and renderers, a verifier.

    The array methods are compiled once per (task, vocab, shapes): the task and the vocab are static.

    Subclasses define `_propose` (candidate problems and whether each is valid), `_prompt_pieces` and
    `_answer_pieces` (one problem's text as pieces, see `envs.text.render`) and `rewards`. A task object
    is static configuration: pass it by closure (or as a static argument), never as a traced value.
    """

    name: str
    prompt_length: int  # tokens, BOS included
    answer_length: int  # tokens, EOS included
    reward_names: tuple[str, ...] = REWARD_NAMES
    host_verifier: bool = False
    alphabet: str = ALPHABET  # every character its prompts and answers use (the tokenizer's base vocabulary)
    expression_answers: bool = False  # its answers are arithmetic expressions the calculator evaluates

    def __init__(self, split_seed: int = 0):
        self.split_seed = int(split_seed)

    # --- subclass hooks -------------------------------------------------------------------------------
    def _propose(self, key: jax.Array, n: int, level=None) -> tuple[Problems, jax.Array]:
        """n candidate problems and bool [n] saying which are acceptable; `level` (a traced float in [0, 1],
        None: 1) scales the task's difficulty knob from its easiest setting to the configured one."""
        raise NotImplementedError

    def difficulty(self, problems: Problems) -> jax.Array:
        """float32 [...] in [0, 1]: the lowest `level` at which `_propose` can produce each problem."""
        raise NotImplementedError

    def _prompt_pieces(self, problem: Problems, vocab: Vocab) -> list[Piece]:
        """One problem's prompt text (without BOS)."""
        raise NotImplementedError

    def _answer_pieces(self, problem: Problems, vocab: Vocab) -> list[Piece]:
        """One problem's reference answer text (without EOS)."""
        raise NotImplementedError

    def rewards(self, problems: Problems, completions, vocab: Vocab):
        """float32 [..., K] reward components (`reward_names`) for completions [..., T], T any length."""
        raise NotImplementedError

    # --- shared machinery -----------------------------------------------------------------------------
    def jax_rewards(self, problems: Problems, completions: jax.Array, vocab: Vocab) -> jax.Array:
        """`rewards`, callable inside jit (for host verifiers through a callback)."""
        return self.rewards(problems, completions, vocab)

    def is_heldout(self, problems: Problems) -> jax.Array:
        """bool [...]: whether each problem belongs to the held-out (test) split."""
        return split_hash(problems, self.split_seed) % 1000 < HELDOUT_PER_MILLE

    def sample(self, key: jax.Array, batch: int, split: str, level=None) -> Problems:
        """`batch` random problems of `split` ("train" or "test"); jittable with batch static. `level`
        (float in [0, 1], may be traced; None: the full task) turns the task's difficulty knob down (a
        curriculum's): `difficulty(problem) <= level` for every problem drawn."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return _rejection_sample(self, key, batch, split == "test", level)

    def heldout(self, num: int, seed: int = 0) -> Problems:
        """A fixed set of `num` test-split problems: the same for the same (task config, num, seed)."""
        return self.sample(jax.random.key(seed), num, "test")

    @functools.partial(jax.jit, static_argnums=0)
    def prompts(self, problems: Problems, vocab: Vocab) -> jax.Array:
        """int32 [B, prompt_length]: BOS then the prompt, padded with PAD on the left."""
        def one(problem):
            pieces = [render.char(BOS, vocab), *self._prompt_pieces(problem, vocab)]
            return render.align_right(render.concat(pieces, self.prompt_length, vocab.pad_id), vocab.pad_id)
        return jax.vmap(one)(problems)

    @functools.partial(jax.jit, static_argnums=0)
    def reference_answers(self, problems: Problems, vocab: Vocab) -> jax.Array:
        """int32 [B, answer_length]: the reference answer then EOS, padded with PAD on the right."""
        def one(problem):
            pieces = [*self._answer_pieces(problem, vocab), render.char(EOS, vocab)]
            return render.concat(pieces, self.answer_length, vocab.pad_id)[0]
        return jax.vmap(one)(problems)

    def texts(self, problems: Problems) -> list[tuple[str, str]]:
        """Host-side, for humans and tokenizer corpora: (prompt, answer) strings without specials."""
        vocab = Vocab.from_alphabet(self.alphabet)
        prompts = np.asarray(self.prompts(problems, vocab))
        answers = np.asarray(self.reference_answers(problems, vocab))
        return [("".join(vocab.tokens[i] for i in p if i > vocab.eos_id), vocab.text(a))
                for p, a in zip(prompts, answers)]

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({settings})"

    # Equal settings, equal task: the jitted methods (static in `self`) then compile once per task
    # configuration, not once per Task object, and the jit cache does not grow with every object made.
    def _settings(self) -> tuple:
        return (type(self), tuple(sorted((k, v) for k, v in vars(self).items() if not k.startswith("_"))))

    def __eq__(self, other) -> bool:
        return isinstance(other, Task) and self._settings() == other._settings()

    def __hash__(self) -> int:
        return hash(self._settings())


@functools.partial(jax.jit, static_argnums=(0, 2))
def _rejection_sample(task: Task, key: jax.Array, batch: int, heldout: bool | jax.Array, level=None) -> Problems:
    """Propose `batch` candidates per round and keep the acceptable ones of the wanted split, in order,
    until `batch` are filled. Loops for ever only if a task's settings admit no problem of the split; the
    task constructors reject settings that obviously do. `heldout` is traced, not static: both splits of one
    batch size are one compiled program (a tokenizer corpus draws both)."""
    def round_(carry):
        key, filled, out = carry
        key, sub = jax.random.split(key)
        candidates, valid = task._propose(sub, batch, level)
        keep = valid & (task.is_heldout(candidates) == heldout)
        slot = jnp.where(keep, filled + jnp.cumsum(keep) - 1, batch)  # slot >= batch: dropped
        out = jax.tree.map(lambda o, c: o.at[slot].set(c, mode="drop"), out, candidates)
        return key, jnp.minimum(filled + keep.sum(), batch), out

    template = jax.eval_shape(lambda k: task._propose(k, batch, level)[0], key)
    start = (key, jnp.int32(0), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), template))
    # Under shard_map a loop's carry must vary over the mesh axes its body's values vary over (the key's, and a
    # traced level's): the constants that start it are cast so, the types read from the round traced abstractly
    # (no first round outside the loop: the round, the costly part to compile, is compiled once).
    start = jax.tree.map(lambda x, like: vary_over(x, varying_axes(like)), start, jax.eval_shape(round_, start))
    _, _, out = jax.lax.while_loop(lambda c: c[1] < batch, round_, start)
    return out


class Arithmetic(Task):
    """`a <op> b =` with operands of `min_digits..max_digits` digits (the digit count is drawn uniformly
    first, so short and long operands are equally common). Answers are the canonical decimal result."""

    expression_answers = True  # (a number)

    def __init__(self, op: str, name: str, min_digits: int, max_digits: int, split_seed: int = 0):
        super().__init__(split_seed)
        if op not in "+*" or len(op) != 1:
            raise ValueError(f"op must be '+' or '*', got {op!r}")
        limit = 8 if op == "+" else 4  # results must fit 9 digits (int32 parsing)
        if not 1 <= min_digits <= max_digits <= limit:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= {limit}, got {min_digits}, {max_digits}")
        self.name, self.op, self.min_digits, self.max_digits = name, op, min_digits, max_digits
        largest = 10 ** max_digits - 1
        self.answer_digits = render.max_digits(largest + largest if op == "+" else largest * largest)
        self.prompt_length = 1 + 2 * max_digits + 2
        self.answer_length = self.answer_digits + 1

    def _combine(self, a, b):
        return a + b if self.op == "+" else a * b

    def _propose(self, key, n, level=None):
        k_digits, k_value = jax.random.split(key)
        digits = jax.random.randint(k_digits, (n, 2), self.min_digits, _knob(self.min_digits, self.max_digits, level) + 1)
        low = jnp.where(digits == 1, 0, 10 ** (digits - 1))  # one-digit operands include 0
        numbers = jax.random.randint(k_value, (n, 2), low, 10 ** digits)
        problems = Problems(numbers, self._combine(numbers[:, 0], numbers[:, 1]),
                            jnp.zeros((n, 0, 3), jnp.int32))
        return problems, jnp.ones(n, bool)

    def difficulty(self, problems):
        """Where the longer operand's digit count lies between min_digits and max_digits."""
        digits = 1 + sum((problems.numbers >= 10 ** k).astype(jnp.int32) for k in range(1, self.max_digits))
        digits = jnp.maximum(jnp.max(digits, axis=-1), self.min_digits)
        return (digits - self.min_digits) / max(self.max_digits - self.min_digits, 1)

    def _prompt_pieces(self, problem, vocab):
        a, b = (render.number(x, self.max_digits, vocab) for x in problem.numbers)
        return [a, render.char(self.op, vocab), b, render.char("=", vocab)]

    def _answer_pieces(self, problem, vocab):
        return [render.number(problem.target, self.answer_digits, vocab)]

    @functools.partial(jax.jit, static_argnums=0)
    def rewards(self, problems, completions, vocab):
        """float32 [..., 2] (correct, well_formed), in JAX over completions [..., T].

        well_formed: one or more digits, then EOS (anything after EOS is ignored). correct: well formed
        and exactly the canonical decimal of the result (so no leading zeros).
        """
        value, length, well_formed = render.parse_decimal(completions, vocab, self.answer_digits)
        correct = well_formed & (length == render.num_digits(problems.target)) & (value == problems.target)
        return jnp.stack([correct, well_formed], axis=-1).astype(jnp.float32)


def _knob(easiest: int, hardest: int, level):
    """The integer setting at `level` in [0, 1] between the easiest and the configured (hardest) one, rounded
    down, so that a problem of difficulty d is drawn from level d on; None: the hardest."""
    if level is None:
        return hardest
    return easiest + jnp.floor(jnp.clip(level, 0.0, 1.0) * (hardest - easiest) + 1e-6).astype(jnp.int32)


# Operator codes in recipes index OPERATORS ("+-*/"); precedence 1 for + -, 2 for * /, 3 for a number.
_PRECEDENCE = np.array([1, 1, 2, 2], np.int32)
_ATOM = 3
_MAX_VALUE = 2 ** 24  # bound on intermediate values: keeps every product of two of them inside int32


class Countdown(Task):
    """Reach `target` with `num_numbers` given numbers, `+ - * /` and parentheses.

    Rule (the Countdown game's, as in TinyZero's prompt): each given number may be used at most once
    (a number given twice may be used twice); with `use_all=True`, each exactly once (TinyZero's
    verifier). Any intermediate value is allowed, fractions included: answers are evaluated exactly with
    `Fraction`s, and dividing by zero is wrong.

    Problems are built backwards, so every one is solvable: N-1 random merges (recipe rows (i, j, op):
    replace item i by `item_i op item_j`, then move the last live item into slot j), over integer
    intermediates of magnitude < 2**24 with exact divisions, must end on a target in
    [min_target, max_target] that is not itself one of the numbers (that would be a one-token answer).
    The reference answer prints that recipe with minimal parentheses, and uses every number. `answer_slack` adds
    room for that many tokens after the longest expression: a completion that misses its EOS runs on into it (and is
    not well-formed). `filler_scale` s > 0 makes the reference write a run of min(answer_slack, floor(-s ln(1 - d)))
    spaces after its expression (before EOS), d the problem's difficulty (`difficulty`: the harder the problem, the
    longer; for d uniform, geometric lengths of mean about s), and the verifier then ignores trailing spaces. A model
    trained on it writes completions of long-tailed lengths, as reasoning models do (what partial rollouts and pruning
    are for). After the expression, not before it: a one-layer model loses the prompt's numbers behind a long run of
    spaces (a warm start trained on a leading filler answered none of the held-out problems). `operators`: those the
    problems' recipes draw from (the verifier accepts any): `+-` makes problems of sums and differences alone.
    """

    name = "countdown"
    expression_answers = True
    host_verifier = True

    def __init__(self, num_numbers: int = 4, min_number: int = 1, max_number: int = 25,
                 min_target: int = 1, max_target: int = 100, use_all: bool = False, split_seed: int = 0,
                 answer_slack: int = 0, filler_scale: float = 0.0, operators: str = OPERATORS):
        super().__init__(split_seed)
        if not operators or not set(operators) <= set(OPERATORS) or len(set(operators)) < len(operators):
            raise ValueError(f"operators must be distinct ones of {OPERATORS!r}, got {operators!r}")
        if answer_slack < 0:
            raise ValueError(f"answer_slack must be >= 0, got {answer_slack}")
        if filler_scale < 0 or (filler_scale > 0 and answer_slack == 0):
            raise ValueError(f"filler_scale must be >= 0, and needs answer_slack > 0 to write its filler in; got "
                             f"filler_scale={filler_scale}, answer_slack={answer_slack}")
        if not 2 <= num_numbers <= 8:
            raise ValueError(f"num_numbers must be in 2..8, got {num_numbers}")
        if not 1 <= min_number <= max_number < _MAX_VALUE:
            raise ValueError(f"need 1 <= min_number <= max_number, got {min_number}, {max_number}")
        self.num_numbers, self.min_number, self.max_number = num_numbers, min_number, max_number
        self.operators = operators
        if not 1 <= min_target <= max_target < _MAX_VALUE or min_target > self.largest_value(num_numbers):
            raise ValueError(f"no target in [{min_target}, {max_target}] is reachable")
        self.min_target, self.max_target, self.use_all = min_target, max_target, use_all
        self.number_digits = render.max_digits(max_number)
        self.target_digits = render.max_digits(max_target)
        # BOS, numbers and separating spaces, ">", target, "=".
        self.prompt_length = 1 + num_numbers * (self.number_digits + 1) + self.target_digits + 1
        # Numbers, N-1 operators, and at most two pairs of parentheses per operator.
        self.expression_length = num_numbers * self.number_digits + 5 * (num_numbers - 1)
        # answer_slack: room beyond the longest expression, where a completion that misses its EOS runs on (a long
        # tail of completion lengths, as reasoning models' are: what partial rollouts are for)
        self.answer_length = self.expression_length + 1 + answer_slack
        self.answer_slack, self.filler_scale = answer_slack, float(filler_scale)

    def largest_value(self, merged: int) -> int:
        """A bound on the magnitude of a value that merges `merged` given numbers (capped at the bound every
        intermediate is held under): a product of them where `*` is among the operators, else their sum."""
        largest = self.max_number ** merged if "*" in self.operators else merged * self.max_number
        return min(largest, _MAX_VALUE)

    def _propose(self, key, n, level=None):
        k_numbers, k_i, k_j, k_op = jax.random.split(key, 4)
        steps = self.num_numbers - 1
        alive = self.num_numbers - jnp.arange(steps)  # live items before each merge
        numbers = jax.random.randint(k_numbers, (n, self.num_numbers), self.min_number,
                                     _knob(self.min_number, self.max_number, level) + 1)
        i = jax.random.randint(k_i, (n, steps), 0, alive)
        j = (i + jax.random.randint(k_j, (n, steps), 1, alive)) % alive  # any live item but i
        codes = jnp.asarray([OPERATORS.index(op) for op in self.operators], jnp.int32)
        recipe = jnp.stack([i, j, codes[jax.random.randint(k_op, (n, steps), 0, len(codes))]], axis=-1)
        value, ok = jax.vmap(lambda x, r: recipe_merges((x, jnp.ones_like(x, bool)), r, _combine_values)[1])(
            numbers, recipe)
        valid = (ok & (value >= self.min_target) & (value <= self.max_target)
                 & ~jnp.any(numbers == value[:, None], axis=-1))
        return Problems(numbers, value, recipe), valid

    def difficulty(self, problems):
        """Where the largest given number lies between min_number and max_number."""
        largest = jnp.max(problems.numbers, axis=-1).astype(jnp.float32)
        return jnp.clip((largest - self.min_number) / max(self.max_number - self.min_number, 1), 0.0, 1.0)

    def _prompt_pieces(self, problem, vocab):
        pieces = []
        for k, x in enumerate(problem.numbers):
            pieces += [render.char(" ", vocab, k > 0), render.number(x, self.number_digits, vocab)]
        return [*pieces, render.char(">", vocab), render.number(problem.target, self.target_digits, vocab),
                render.char("=", vocab)]

    def _expression(self, problem, vocab) -> Piece:
        """The problem's recipe as one expression with minimal parentheses (`expression_length` slots)."""
        width = self.expression_length
        ids, lengths = jax.vmap(lambda x: render.number(x, self.number_digits, vocab))(problem.numbers)
        ids = jnp.pad(ids, ((0, 0), (0, width - self.number_digits)), constant_values=vocab.pad_id)
        leaves = (ids, lengths, jnp.full(self.num_numbers, _ATOM))
        _, (ids, length, _) = recipe_merges(leaves, problem.recipe, functools.partial(_combine_text, vocab, width))
        return ids, length

    def _answer_pieces(self, problem, vocab):
        pieces = [self._expression(problem, vocab)]
        if self.filler_scale:
            pieces.append((jnp.full((self.answer_slack,), vocab.id_of(" "), jnp.int32), self._filler_length(problem)))
        return pieces

    def _filler_length(self, problem) -> jax.Array:
        """int32 []: the spaces the reference writes after its expression (see the class doc)."""
        longer = jnp.floor(-self.filler_scale * jnp.log1p(-self.difficulty(problem)))  # (+inf at difficulty 1)
        return jnp.minimum(longer, self.answer_slack).astype(jnp.int32)

    def rewards(self, problems, completions, vocab) -> np.ndarray:
        """float32 [..., 2] (correct, well_formed), on the host: numpy in, one Python parse per row.

        well_formed: the tokens before the first EOS (less trailing spaces, with `filler_scale`) form an expression
        (`envs.text.verify` grammar);
        correct: it also follows the number rule and equals the target exactly (see the class doc).
        """
        completions = np.asarray(completions)
        numbers = np.asarray(problems.numbers).reshape(-1, self.num_numbers)
        targets = np.asarray(problems.target).reshape(-1)
        rows = completions.reshape(-1, completions.shape[-1])
        texts = [vocab.text(row) for row in rows]
        if self.filler_scale:  # (the filler after the expression)
            texts = [None if text is None else text.rstrip(" ") for text in texts]
        out = [check_countdown(text, nums, int(t), self.use_all) for text, nums, t in zip(texts, numbers, targets)]
        return np.asarray(out, np.float32).reshape(*completions.shape[:-1], len(self.reward_names))

    def jax_rewards(self, problems, completions, vocab):
        """`rewards` through `jax.pure_callback`: usable inside jit and vmap, but each call stops the
        device, copies the batch to the host and parses it in Python (tens of microseconds per row), so
        call it once per batch, never per token."""
        shape = jax.ShapeDtypeStruct((*completions.shape[:-1], len(self.reward_names)), jnp.float32)
        return host_call(functools.partial(self.rewards, vocab=vocab), shape, problems, completions)


class CountdownSteps(Countdown):
    """Countdown answered in steps, one merge each: `12 7 4>76=` -> `12+7=19;19*4=76`. A step combines two available
    values (the given numbers, and earlier steps' results) and writes its result; the last result must be the
    target. The steps give process supervision something to hold on to: `step_ends` marks where each ends, and the
    verifier (`envs.text.verify.check_countdown_steps`) also says which steps are right. The reference performs the
    problem's recipe, one step per merge."""

    name = "countdown_steps"
    alphabet = ALPHABET + STEP_SEPARATOR
    expression_answers = False  # (steps, not one expression)

    def __init__(self, num_numbers: int = 3, min_number: int = 1, max_number: int = 25, min_target: int = 1,
                 max_target: int = 100, use_all: bool = False, split_seed: int = 0, operators: str = OPERATORS):
        super().__init__(num_numbers, min_number, max_number, min_target, max_target, use_all, split_seed,
                         operators=operators)
        # A value: a sign and the digits of the largest intermediate (a merge of N - 1 numbers).
        self.value_width = 1 + render.max_digits(self.largest_value(num_numbers - 1))
        self.step_width = 3 * self.value_width + 3  # a op b=v;
        self.max_steps = num_numbers - 1  # (a right answer's steps)
        self.answer_length = self.max_steps * self.step_width + 1

    def _signed(self, x, vocab: Vocab) -> Piece:
        return render.concat([render.char("-", vocab, x < 0), render.number(jnp.abs(x), self.value_width - 1, vocab)],
                             self.value_width, vocab.pad_id)

    def _answer_pieces(self, problem, vocab):
        exact = lambda a, b, op: _combine_values((a, True), (b, True), op)[0]  # noqa: E731
        merges, _ = recipe_merges(problem.numbers, problem.recipe, exact)
        pieces = []
        for step, (a, b, op, merged) in enumerate(merges):
            pieces += [render.char(STEP_SEPARATOR, vocab, step > 0), self._signed(a, vocab),
                       render.token(jnp.asarray(vocab.ids_of(OPERATORS))[op]), self._signed(b, vocab),
                       render.char("=", vocab), self._signed(merged, vocab)]
        return [render.concat(pieces, self.answer_length - 1, vocab.pad_id)]

    def step_ends(self, completions: jax.Array, vocab: Vocab) -> jax.Array:
        """bool [..., N]: the last token of each step of completions [..., N] (the one before a separator, and the
        one before the first EOS)."""
        real = jnp.cumsum(completions == vocab.eos_id, axis=-1) == 0
        following = jnp.concatenate([completions[..., 1:], jnp.full_like(completions[..., :1], vocab.pad_id)], -1)
        return real & ((following == vocab.id_of(STEP_SEPARATOR)) | (following == vocab.eos_id))

    def checks(self, problems, completions, vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
        """The verifier's verdicts on completions [..., N], one parse of each (`check_countdown_steps`, on the host):
        (rewards float32 [..., 2]: correct, well_formed; each of the first `max_steps` steps' bool [..., max_steps],
        false for a step not written or not well formed)."""
        completions = np.asarray(completions)
        numbers = np.asarray(problems.numbers).reshape(-1, self.num_numbers)
        targets = np.asarray(problems.target).reshape(-1)
        rows = completions.reshape(-1, completions.shape[-1])
        rewards = np.zeros((len(rows), len(self.reward_names)), np.float32)
        steps = np.zeros((len(rows), self.max_steps), bool)
        for k, (row, nums, t) in enumerate(zip(rows, numbers, targets)):
            correct, well_formed, step_right = check_countdown_steps(vocab.text(row), nums, int(t), self.use_all)
            rewards[k] = correct, well_formed
            step_right = step_right[:self.max_steps]
            steps[k, :len(step_right)] = step_right
        lead = completions.shape[:-1]
        return rewards.reshape(*lead, len(self.reward_names)), steps.reshape(*lead, self.max_steps)

    def rewards(self, problems, completions, vocab) -> np.ndarray:
        """float32 [..., 2] (correct, well_formed) on the host (`checks`)."""
        return self.checks(problems, completions, vocab)[0]

    def step_verdicts(self, problems, completions, vocab) -> np.ndarray:
        """bool [..., max_steps]: whether each step of completions [..., N] is right, on the host (`checks`)."""
        return self.checks(problems, completions, vocab)[1]

    def jax_checks(self, problems, completions: jax.Array, vocab: Vocab) -> tuple[jax.Array, jax.Array]:
        """`checks` through the host (`host_call`), as `jax_rewards` is: usable inside jit and vmap; one parse gives
        both the outcome and the steps (a process model's checked labels)."""
        lead = completions.shape[:-1]
        shapes = (jax.ShapeDtypeStruct((*lead, len(self.reward_names)), jnp.float32),
                  jax.ShapeDtypeStruct((*lead, self.max_steps), jnp.bool_))
        return host_call(functools.partial(self.checks, vocab=vocab), shapes, problems, completions)


class ExpressionSteps(CountdownSteps):
    """Evaluate an expression in steps, one operation each: `(12+7)*4=` -> `12+7=19;19*4=76`. The problems are
    Countdown's (the expression is a recipe's, as Countdown's reference answer prints it), but the value is
    not shown: a slip in one step carries into every later one, so a wrong answer's first wrong step can lie anywhere
    in it, as in a long derivation, and checking the answer alone means evaluating the whole expression again. That
    is where step labels can teach a judge more than an outcome label (Lightman et al. 2023), unlike Countdown's steps,
    whose wrong answers mostly err in their last step (they write the target whatever the operands give). Any steps
    that use every number once and end on the expression's value are right (`use_all`; the order is free)."""

    name = "expression_steps"

    def __init__(self, num_numbers: int = 3, min_number: int = 1, max_number: int = 25, min_target: int = 1,
                 max_target: int = 100, split_seed: int = 0, operators: str = OPERATORS):
        super().__init__(num_numbers, min_number, max_number, min_target, max_target, True, split_seed, operators)
        # Printed with minimal parentheses, only an operand that is itself a merge is wrapped, and the whole
        # expression is not: N numbers, N - 1 operators and at most N - 2 pairs (Countdown's bound allows 2 N - 2).
        self.expression_length = num_numbers * self.number_digits + (num_numbers - 1) + 2 * (num_numbers - 2)
        self.prompt_length = 1 + self.expression_length + 1  # BOS, the expression, "="

    def _prompt_pieces(self, problem, vocab):
        return [self._expression(problem, vocab), render.char("=", vocab)]


def host_call(fn: Callable, result: jax.ShapeDtypeStruct, *args):
    """`fn(*args)` on the host (`jax.pure_callback`, vmapped by broadcasting), from any program: inside a
    `shard_map` that leaves some mesh axes to XLA (a training program whose model is split over a `model` axis),
    where XLA cannot place a callback, it runs under a nested `shard_map` over those axes, each of their devices
    calling it with the same (whole) arguments."""
    def call(*args):
        return jax.pure_callback(fn, result, *args, vmap_method="broadcast_all")

    mesh = jax.sharding.get_abstract_mesh()
    automatic = {name for name, kind in zip(mesh.axis_names, mesh.axis_types) if kind != jax.sharding.AxisType.Manual}
    if not automatic or automatic == set(mesh.axis_names):  # (no mesh, or one XLA places the callback in)
        return call(*args)
    whole = jax.sharding.PartitionSpec()
    return jax.shard_map(call, mesh=mesh, in_specs=whole, out_specs=whole, axis_names=automatic,
                         check_vma=False)(*args)


def recipe_merges(leaves, recipe, combine: Callable) -> tuple[list, object]:
    """Fold N items by a Countdown recipe [N-1, 3]: item i := combine(item i, item j, op), then the last live item
    moves into slot j so that live items stay in slots 0..m-1. `leaves` is a pytree of [N] arrays. -> ([(item i,
    item j, op, merged) per step], the final item (slot 0)). Shared by evaluation, rendering and what writes a
    recipe out one merge at a time, so they cannot disagree."""
    items, merges = leaves, []
    last = jax.tree.leaves(leaves)[0].shape[0] - 1
    for step in range(recipe.shape[0]):
        i, j, op = recipe[step]
        take = lambda k: jax.tree.map(lambda x: x[k], items)  # noqa: E731
        a, b = take(i), take(j)
        merged = combine(a, b, op)
        merges.append((a, b, op, merged))
        items = jax.tree.map(lambda x, m: x.at[i].set(m), items, merged)
        moved = take(last - step)
        items = jax.tree.map(lambda x, m: x.at[j].set(m), items, moved)
    return merges, jax.tree.map(lambda x: x[0], items)


def _combine_values(a, b, op):
    """(value, ok) of `a op b` on integers; ok is false for an inexact or zero division or a value out
    of bounds, and stays false once false."""
    (x, x_ok), (y, y_ok) = a, b
    safe_y = jnp.where(y == 0, 1, y)
    value = jnp.select([op == 0, op == 1, op == 2], [x + y, x - y, x * y], x // safe_y)
    # Bound the product in float before trusting the int32 one, which may have wrapped.
    in_range = jnp.abs(x.astype(jnp.float32) * y.astype(jnp.float32)) < _MAX_VALUE
    ok = jnp.where(op == 3, (y != 0) & (x % safe_y == 0), True) & jnp.where(op == 2, in_range, True)
    return value, x_ok & y_ok & ok & (jnp.abs(value) < _MAX_VALUE)


def _combine_text(vocab: Vocab, width: int, a, b, op):
    """(ids [width], length, precedence) of `a op b` with the fewest parentheses that keep the meaning
    under left-to-right evaluation: the left operand needs them when it binds looser than `op`, the right
    one also when it binds equally and `op` is - or / (a-(b-c), a/(b*c))."""
    (a_ids, a_len, a_prec), (b_ids, b_len, b_prec) = a, b
    prec = jnp.asarray(_PRECEDENCE)[op]
    left = a_prec < prec
    right = (b_prec < prec) | ((b_prec == prec) & ((op == 1) | (op == 3)))
    ids, length = render.concat([
        render.char("(", vocab, left), (a_ids, a_len), render.char(")", vocab, left),
        render.token(jnp.asarray(vocab.ids_of(OPERATORS))[op]),
        render.char("(", vocab, right), (b_ids, b_len), render.char(")", vocab, right),
    ], width, vocab.pad_id)
    return ids, length, prec


def addition(min_digits: int = 1, max_digits: int = 3, split_seed: int = 0) -> Arithmetic:
    """`"12+345="` -> `"357"`."""
    return Arithmetic("+", "addition", min_digits, max_digits, split_seed)


def multiplication(min_digits: int = 1, max_digits: int = 2, split_seed: int = 0) -> Arithmetic:
    """`"12*34="` -> `"408"`."""
    return Arithmetic("*", "multiplication", min_digits, max_digits, split_seed)


TASKS: dict[str, Callable[..., Task]] = {
    "addition": addition,
    "multiplication": multiplication,
    "countdown": Countdown,
    "countdown_steps": CountdownSteps,
    "expression_steps": ExpressionSteps,
}


def make_task(name: str, **kwargs) -> Task:
    """Build a registered task; an unknown name lists the known ones."""
    if name not in TASKS:
        raise unknown_name("text task", name, TASKS)
    return TASKS[name](**kwargs)


def task_options(name: str) -> dict:
    """The keyword options of a registered task and their defaults (what a config may override)."""
    import inspect

    if name not in TASKS:
        raise unknown_name("text task", name, TASKS)
    return {k: p.default for k, p in inspect.signature(TASKS[name]).parameters.items()
            if p.default is not inspect.Parameter.empty}


def corpus(tasks: Sequence[Task], num: int, seed: int = 0) -> list[str]:
    """`num` prompt+answer strings per task (both splits): the text a tokenizer is trained on."""
    texts = []
    for k, task in enumerate(tasks):
        for split in SPLITS:
            problems = task.sample(jax.random.key(seed * 1000 + 2 * k + (split == "test")), num // 2, split)
            texts += [prompt + answer for prompt, answer in task.texts(problems)]
    return texts
