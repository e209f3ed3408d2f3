"""envs.text: tokenizer round trips, prompt rendering, exact verifiers and the held-out split."""

import ast
import collections
import operator
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers

from envs import text

TASK_NAMES = ("addition", "multiplication", "countdown")
BATCH = 256  # one batch size everywhere, so each task's programs compile once


@pytest.fixture(scope="module")
def tasks():
    return {name: text.make_task(name) for name in TASK_NAMES}


@pytest.fixture(scope="module")
def problems(tasks):
    """{(task name, split): Problems [BATCH]}."""
    return {(name, split): task.sample(jax.random.key(7), BATCH, split)
            for name, task in tasks.items() for split in text.SPLITS}


@pytest.fixture(scope="module")
def tok(tasks):
    return text.train_tokenizer(text.corpus(list(tasks.values()), 2 * BATCH))


@pytest.fixture(scope="module")
def vocab(tok):
    return text.Vocab.from_tokenizer(tok)


def python_prompt(name, numbers, target):
    """The prompt formats, written independently of the JAX renderer."""
    if name == "addition":
        return f"{numbers[0]}+{numbers[1]}="
    if name == "multiplication":
        return f"{numbers[0]}*{numbers[1]}="
    return " ".join(str(n) for n in numbers) + f">{target}="


def python_value(expression):
    """Exact value of an arithmetic expression via Python's own parser (independent of envs.text.verify)."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

    def value(node):
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # a negative operand, "(-19)"
            return -value(node.operand)
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return Fraction(node.value)
    return value(ast.parse(expression, mode="eval").body)


def completions(tok, answers, length):
    """int32 [B, length]: answer strings laid out as completions: answer, EOS, PAD..."""
    return text.encode(tok, answers, length, left_pad=False)


def rewards_of(task, problems, ids, vocab):
    return np.asarray(task.jax_rewards(problems, jnp.asarray(ids), vocab))


# --- tokenizer -------------------------------------------------------------------------------------------

def test_tokenizer_round_trips_every_task_string_and_survives_save_load(tasks, tok, problems, tmp_path):
    assert [tok.token_to_id(t) for t in text.SPECIALS] == [0, 1, 2]
    strings = text.corpus(list(tasks.values()), 2 * BATCH, seed=3)
    strings += [p + a for (name, _), probs in problems.items() for p, a in tasks[name].texts(probs)]
    assert len(set(strings)) > 500
    length = 2 + max(len(s) for s in strings)
    prompts = text.encode(tok, strings, length)
    answers = text.encode(tok, strings, length, left_pad=False)
    assert text.decode(tok, prompts) == strings and text.decode(tok, answers) == strings
    assert (prompts != 0).sum(1).tolist() == [len(s) + 1 for s in strings]  # one token per character
    assert (prompts[np.arange(len(strings)), length - 1 - np.array([len(s) for s in strings])] == 1).all()
    assert (answers[np.arange(len(strings)), [len(s) for s in strings]] == 2).all()

    path = tmp_path / "tokenizer.json"
    text.save_tokenizer(tok, path)
    for loaded in (text.load_tokenizer(path), tokenizers.Tokenizer.from_file(str(path))):
        np.testing.assert_array_equal(text.encode(loaded, strings, length), prompts)
        assert text.Vocab.from_tokenizer(loaded) == text.Vocab.from_tokenizer(tok)
        assert text.decode(loaded, prompts) == strings


def test_vocab_tables_and_decode_edges(tok, vocab):
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.size) == (0, 1, 2, tok.get_vocab_size())
    assert [tok.id_to_token(int(i)) for i in vocab.digit_ids] == list("0123456789")
    assert vocab.char_ids[ord("+")] == tok.token_to_id("+") == vocab.id_of("+")
    assert vocab.char_ids[ord("x")] == -1
    assert vocab == text.Vocab.from_alphabet()  # the default alphabet covers every task
    ids = np.array([[0, 0, 1] + text.encode(tok, ["12+3"], 4, bos=False)[0].tolist() + [2, 5, 6, 0]])
    assert text.decode(tok, ids) == ["12+3"]  # PAD and BOS dropped, cut at EOS
    with pytest.raises(ValueError, match="more than length"):
        text.encode(tok, ["12345"], 5)  # BOS + 5 characters do not fit


# --- rendering -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TASK_NAMES)
def test_prompts_and_answers_render_the_python_formats(name, tasks, problems, tok, vocab):
    task, probs = tasks[name], problems[(name, "train")]
    prompts = np.asarray(task.prompts(probs, vocab))
    answers = np.asarray(task.reference_answers(probs, vocab))
    assert prompts.shape == (BATCH, task.prompt_length) and prompts.dtype == np.int32
    assert answers.shape == (BATCH, task.answer_length) and answers.dtype == np.int32
    numbers, targets = np.asarray(probs.numbers), np.asarray(probs.target)
    expected = [python_prompt(name, n.tolist(), int(t)) for n, t in zip(numbers, targets)]
    assert text.decode(tok, prompts) == expected
    # The layout is exactly what host-side `encode` produces: BOS first, padding on the left.
    np.testing.assert_array_equal(prompts, text.encode(tok, expected, task.prompt_length))
    answer_texts = text.decode(tok, answers)
    np.testing.assert_array_equal(answers, completions(tok, answer_texts, task.answer_length))
    if name == "countdown":  # the reference expression reaches the target (checked without the verifier)
        assert [python_value(e) for e in answer_texts] == targets.tolist()
    else:
        op = (lambda a, b: a + b) if name == "addition" else (lambda a, b: a * b)
        assert answer_texts == [str(op(int(a), int(b))) for a, b in numbers]
        assert (targets == op(numbers[:, 0], numbers[:, 1])).all()


def test_countdown_problems_follow_their_settings(tasks, problems):
    task = tasks["countdown"]
    for split in text.SPLITS:
        numbers, targets = np.asarray(problems[("countdown", split)].numbers), \
            np.asarray(problems[("countdown", split)].target)
        assert numbers.min() >= task.min_number and numbers.max() <= task.max_number
        assert targets.min() >= task.min_target and targets.max() <= task.max_target
        assert not (numbers == targets[:, None]).any()  # never a one-number answer
    assert len({tuple(n) for n in numbers.tolist()}) > BATCH * 0.9  # varied, not one problem repeated


# --- verifiers -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("split", text.SPLITS)
def test_verifier_accepts_every_reference_answer(name, split, tasks, problems, vocab):
    task, probs = tasks[name], problems[(name, split)]
    answers = task.reference_answers(probs, vocab)
    np.testing.assert_array_equal(rewards_of(task, probs, answers, vocab), np.ones((BATCH, 2)))
    # Longer completions (generation budgets exceed the answer) and junk after EOS change nothing.
    padded = jnp.pad(answers, ((0, 0), (0, 5)), constant_values=vocab.id_of("7"))
    np.testing.assert_array_equal(rewards_of(task, probs, padded, vocab), np.ones((BATCH, 2)))


@pytest.mark.parametrize("name", ["addition", "multiplication"])
def test_arithmetic_verifier_rejects_corrupted_answers(name, tasks, problems, tok, vocab):
    task, probs = tasks[name], problems[(name, "test")]
    refs = text.decode(tok, task.reference_answers(probs, vocab))
    rng = np.random.default_rng(0)

    def changed_digit(s):
        k = rng.integers(len(s))
        return s[:k] + str((int(s[k]) + rng.integers(1, 10)) % 10) + s[k + 1:]

    length = task.answer_length + 2
    cases = {  # corruption -> expected (correct, well_formed) for every problem
        "changed digit": ([changed_digit(s) for s in refs], (0, 1)),
        "leading zero": (["0" + s for s in refs], (0, 1)),
        "junk after answer": ([s + "+" for s in refs], (0, 0)),
        "space in answer": ([s[:1] + " " + s[1:] for s in refs], (0, 0)),
        "operator": (["-" + s for s in refs], (0, 0)),
    }
    for label, (answers, expected) in cases.items():
        got = rewards_of(task, probs, completions(tok, answers, length), vocab)
        assert (got == expected).all(), label
    truncated = rewards_of(task, probs, completions(tok, [s[:-1] for s in refs], length), vocab)
    assert (truncated[:, 0] == 0).all()
    assert (truncated[:, 1] == np.array([len(s) > 1 for s in refs])).all()  # "" then EOS is malformed
    no_eos = text.encode(tok, refs, length, left_pad=False, eos=False)
    assert (rewards_of(task, probs, no_eos, vocab) == 0).all()
    out_of_vocab = np.full((BATCH, length), vocab.size + 3, np.int32)  # ids no token has
    assert (rewards_of(task, probs, out_of_vocab, vocab) == 0).all()


# (answer, expected (correct, well_formed)) for numbers [2, 5, 5, 8] and target 16.
COUNTDOWN_CASES = [
    ("2*8", (1, 1)), ("8*2", (1, 1)), ("(8)*((2))", (1, 1)),
    ("5+5+8-2", (1, 1)),            # 5 is given twice, so it may be used twice
    ("2*8+5-5", (1, 1)),
    ("16", (0, 1)),                 # a number that is not given
    ("8+8", (0, 1)),                # 8 used twice, given once
    ("5+5+5+1", (0, 1)),
    ("2*5+8", (0, 1)),              # wrong value (18)
    ("2*8+5/(5-5)", (0, 1)),        # division by zero
    ("2*(8", (0, 0)), ("2*8)", (0, 0)), ("(2*8", (0, 0)), ("()", (0, 0)),  # unbalanced / empty parentheses
    ("2**8", (0, 0)), ("2*08", (0, 0)), ("-2+18", (0, 0)), ("2 * 8", (0, 0)), ("2*8=", (0, 0)),
    ("", (0, 0)), ("2*8x", (0, 0)),
]


def test_countdown_verifier_rejects_corrupted_answers(tasks, tok, vocab):
    task = tasks["countdown"]
    answers = [a for a, _ in COUNTDOWN_CASES]
    expected = np.array([e for _, e in COUNTDOWN_CASES], np.float32)
    probs = text.Problems(np.tile([2, 5, 5, 8], (len(answers), 1)), np.full(len(answers), 16),
                          np.zeros((len(answers), 3, 3), np.int32))
    tok_x = text.train_tokenizer([], text.ALPHABET + "x")  # "x" only to spell a junk character
    ids = text.encode(tok_x, answers, 16, left_pad=False)
    vocab_x = text.Vocab.from_tokenizer(tok_x)
    got = task.rewards(probs, ids, vocab_x)
    for (answer, want), row in zip(COUNTDOWN_CASES, got):
        assert tuple(row) == want, answer
    jitted = jax.jit(task.jax_rewards, static_argnums=2)
    np.testing.assert_array_equal(np.asarray(jitted(probs, ids, vocab_x)), expected)
    # Exact rational arithmetic: 8/(3-8/3) = 24 needs the fraction 1/3 on the way.
    fraction = text.Problems(np.array([[3, 3, 8, 8]]), np.array([24]), np.zeros((1, 3, 3), np.int32))
    ids = completions(tok, ["8/(3-8/3)", "8/(3-8/3)+3-3"], 16)
    fraction = jax.tree.map(lambda x: np.repeat(x, 2, 0), fraction)
    assert task.rewards(fraction, ids, vocab).tolist() == [[1, 1], [0, 1]]  # the second uses 3 three times
    # TinyZero's rule: every number exactly once.
    use_all = text.make_task("countdown", use_all=True)
    ids = completions(tok, ["2*8", "2*8+5-5"], 16)
    two = probs[:2]
    assert use_all.rewards(two, ids, vocab).tolist() == [[0, 1], [1, 1]]
    # Without EOS nothing is an answer.
    no_eos = text.encode(tok, ["2*8", "8*2"], 16, left_pad=False, eos=False)
    assert (task.rewards(two, no_eos, vocab) == 0).all()


def test_countdown_verifier_rejects_corrupted_references(tasks, problems, tok, vocab):
    task, probs = tasks["countdown"], problems[("countdown", "test")]
    refs = text.decode(tok, task.reference_answers(probs, vocab))
    length = task.answer_length + 3
    cases = {
        "number not given": ([s + "*0" for s in refs], (0, 1)),  # numbers start at 1
        "number used twice": ([f"({s})*{n}" for s, n in zip(refs, np.asarray(probs.numbers)[:, 0])], (0, 1)),
        "junk after answer": ([s + "+" for s in refs], (0, 0)),
        "unbalanced": (["(" + s for s in refs], (0, 0)),
    }
    for label, (answers, expected) in cases.items():
        got = task.rewards(probs, completions(tok, answers, length), vocab)
        assert (got == expected).all(), label
    no_eos = text.encode(tok, refs, length, left_pad=False, eos=False)
    assert (task.rewards(probs, no_eos, vocab) == 0).all()


# --- split -------------------------------------------------------------------------------------------------

def problem_keys(problems):
    numbers, targets = np.sort(np.asarray(problems.numbers), 1), np.asarray(problems.target)
    return {(*n, t) for n, t in zip(numbers.tolist(), targets.tolist())}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_train_never_samples_a_heldout_problem(name, tasks, problems):
    task = tasks[name]
    heldout = task.heldout(BATCH)
    assert jax.tree.all(jax.tree.map(np.array_equal, heldout, task.heldout(BATCH)))  # deterministic
    assert not np.array_equal(heldout.numbers, task.heldout(BATCH, seed=1).numbers)
    assert np.asarray(task.is_heldout(heldout)).all()
    train = set()
    for seed in range(8):
        batch = task.sample(jax.random.key(100 + seed), BATCH, "train")
        assert not np.asarray(task.is_heldout(batch)).any()
        train |= problem_keys(batch)
    test = problem_keys(heldout) | problem_keys(problems[(name, "test")])
    assert not train & test
    assert len(test) > 50 and len(train) > 500
    # Swapped operands / permuted numbers are the same problem, in the same split.
    swapped = text.Problems(heldout.numbers[:, ::-1], heldout.target, heldout.recipe)
    assert np.asarray(task.is_heldout(swapped)).all()
    # About 10% of all problems are held out.
    proposals, _ = jax.jit(task._propose, static_argnums=1)(jax.random.key(1), 4096)
    assert 0.07 < float(task.is_heldout(proposals).mean()) < 0.13


# --- jit / vmap ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["addition", "multiplication"])
def test_arithmetic_pipeline_under_jit_and_vmap(name, tasks, problems, vocab):
    task = tasks[name]

    @jax.jit
    def episode(key):  # sample, render, verify: all inside one compiled program
        probs = task.sample(key, BATCH, "train")
        answers = task.reference_answers(probs, vocab)
        leading = jnp.asarray(vocab.digit_values)[answers[:, 0]]
        wrong = answers.at[:, 0].set(vocab.digit_ids[leading % 9 + 1])  # another digit, never a leading 0
        rewards = task.rewards(probs, answers, vocab), task.rewards(probs, wrong, vocab)
        return task.prompts(probs, vocab), *rewards

    prompts, right, wrong = episode(jax.random.key(3))
    assert prompts.shape == (BATCH, task.prompt_length)
    assert (right == 1).all() and (wrong[:, 0] == 0).all() and (wrong[:, 1] == 1).all()

    # Group axes: vmap over [G, B/G] problems matches the flat batch.
    probs = problems[(name, "train")]
    grouped = jax.tree.map(lambda x: x.reshape(8, BATCH // 8, *x.shape[1:]), probs)
    answers = task.reference_answers(probs, vocab)
    vmapped_prompts = jax.vmap(task.prompts, in_axes=(0, None))(grouped, vocab)
    np.testing.assert_array_equal(vmapped_prompts.reshape(BATCH, -1), task.prompts(probs, vocab))
    vmapped = jax.jit(jax.vmap(task.rewards, in_axes=(0, 0, None)), static_argnums=2)(
        grouped, answers.reshape(8, BATCH // 8, -1), vocab)
    assert vmapped.shape == (8, BATCH // 8, 2) and (vmapped == 1).all()


def test_countdown_jax_rewards_vmap_through_the_callback(tasks, problems, vocab):
    task, probs = tasks["countdown"], problems[("countdown", "train")]
    answers = task.reference_answers(probs, vocab)
    grouped = jax.tree.map(lambda x: x.reshape(4, BATCH // 4, *x.shape[1:]), probs)
    got = jax.jit(jax.vmap(task.jax_rewards, in_axes=(0, 0, None)), static_argnums=2)(
        grouped, answers.reshape(4, BATCH // 4, -1), vocab)
    assert got.shape == (4, BATCH // 4, 2) and (got == 1).all()


def test_make_task_names_and_kwargs():
    with pytest.raises(ValueError, match="addition, addition_judge, countdown, countdown_judge, countdown_refine, "
                                         "countdown_steps, countdown_tools, expression_steps, grid, guess, lookup, "
                                         "multiplication"):
        text.make_task("additon")
    assert text.make_task("addition", max_digits=5).prompt_length == 1 + 5 + 1 + 5 + 1
    assert text.make_task("countdown", num_numbers=3).num_numbers == 3
    with pytest.raises(ValueError):
        text.make_task("multiplication", max_digits=6)  # results would not fit int32


def test_tasks_with_equal_settings_are_equal_and_share_compiled_functions():
    a, b = text.make_task("addition", max_digits=3), text.make_task("addition", max_digits=3)
    assert a == b and hash(a) == hash(b)
    assert a != text.make_task("addition", max_digits=4) and a != text.make_task("multiplication")


# --- Countdown in steps ----------------------------------------------------------------------------------


def test_countdown_steps_references_are_right_step_by_step():
    task = text.make_task("countdown_steps", num_numbers=4, max_number=50)
    vocab = text.Vocab.from_alphabet(task.alphabet)
    probs = task.sample(jax.random.key(3), BATCH, "train")
    answers = task.reference_answers(probs, vocab)
    np.testing.assert_array_equal(rewards_of(task, probs, answers, vocab), np.ones((BATCH, 2)))
    for (prompt, answer), numbers, target in zip(task.texts(probs), np.asarray(probs.numbers),
                                                  np.asarray(probs.target)):
        pool = list(numbers)
        for step in answer.split(";"):  # Python's own arithmetic on each written step
            left, written = step.split("=")
            op_at = next(k for k in range(1, len(left)) if left[k] in "+-*/")
            a, b = int(left[:op_at]), int(left[op_at + 1:])
            pool.remove(a)
            pool.remove(b)
            ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
            assert ops[left[op_at]](Fraction(a), Fraction(b)) == int(written), (prompt, answer)
            pool.append(int(written))
        assert pool == [target], (prompt, answer)


@pytest.mark.parametrize("answer, expected", [
    ("12+7=19;19*4=76", (True, True, [True, True])),
    ("12+7=20;20*4=80", (False, True, [False, True])),   # a wrong step, then a right one from its result
    ("12+7=19;19*5=95", (False, True, [True, False])),   # 5 is not available
    ("12+7=19;12*4=48", (False, True, [True, False])),   # 12 was used up by the first step
    ("4-12=-8;-8*7=-56", (False, True, [True, True])),   # right steps, the wrong target
    ("12+7=19;19*4", (False, False, [True])),             # no result written
    ("12+7=19;;", (False, False, [True])),
])
def test_countdown_steps_verifier_judges_each_step(answer, expected):
    from envs.text.verify import check_countdown_steps

    assert check_countdown_steps(answer, [12, 7, 4], 76) == expected


def test_expression_steps_prompts_are_the_expressions_their_references_evaluate():
    task = text.make_task("expression_steps", num_numbers=4)
    vocab = text.Vocab.from_alphabet(task.alphabet)
    probs = task.sample(jax.random.key(5), BATCH, "train")
    np.testing.assert_array_equal(rewards_of(task, probs, task.reference_answers(probs, vocab), vocab),
                                  np.ones((BATCH, 2)))
    for (prompt, answer), target in zip(task.texts(probs), np.asarray(probs.target)):
        assert prompt.endswith("=") and len(prompt) <= task.prompt_length - 1  # (BOS aside)
        # Python's own arithmetic on the prompt: the value the steps end on, which the prompt does not show
        assert Fraction(eval(prompt[:-1].replace("/", "*Fraction(1)/"))) == target == int(answer.rsplit("=")[-1])


def test_expression_steps_verifier_follows_a_slip_through_later_steps():
    task = text.make_task("expression_steps")  # (12+7)*4 = 76
    vocab = text.Vocab.from_alphabet(task.alphabet)
    probs = text.Problems(numbers=jnp.asarray([[12, 7, 4]]), target=jnp.asarray([76]), recipe=jnp.zeros((1, 2, 3), int))
    answers = {"12+7=19;19*4=76": 1, "7*4=28;12*4=48": 0, "12+7=20;20*4=80": 0, "12+7=19;19*4=80": 0,
               "12+7=19": 0}  # right / a number used twice / a slip carried on / the last step's slip / one unused
    for answer, right in answers.items():
        ids = jnp.asarray([[vocab.id_of(c) for c in answer] + [vocab.eos_id]])
        assert rewards_of(task, probs, ids, vocab)[0, 0] == right, answer


def test_operators_restrict_the_problems_and_size_the_steps():
    sums = text.make_task("expression_steps", num_numbers=5, operators="+")
    vocab = text.Vocab.from_alphabet(sums.alphabet)
    probs = sums.sample(jax.random.key(6), BATCH, "train")
    assert set(np.asarray(probs.recipe)[..., 2].ravel()) == {0}  # (+ is OPERATORS' first)
    for (prompt, answer), numbers in zip(sums.texts(probs), np.asarray(probs.numbers)):
        assert set(prompt) <= set("0123456789+=") and int(answer.rsplit("=")[-1]) == numbers.sum()
    np.testing.assert_array_equal(rewards_of(sums, probs, sums.reference_answers(probs, vocab), vocab),
                                  np.ones((BATCH, 2)))
    # a value is a sum of at most 4 numbers <= 25: a sign and 3 digits, where products of 4 would need 6
    assert sums.value_width == 4 and text.make_task("expression_steps", num_numbers=5).value_width == 7
    mixed = text.make_task("countdown", operators="*-").sample(jax.random.key(7), BATCH, "train")
    assert set(np.asarray(mixed.recipe)[..., 2].ravel()) == {1, 2}
    for wrong in ("", "+x", "++"):
        with pytest.raises(ValueError, match="operators must be distinct ones"):
            text.make_task("countdown_steps", operators=wrong)


def test_step_ends_mark_each_step_s_last_token():
    task = text.make_task("countdown_steps")
    vocab = text.Vocab.from_alphabet(task.alphabet)
    ids = [vocab.id_of(c) for c in "1+2=3;3*4=12"] + [vocab.eos_id, vocab.pad_id, vocab.id_of("7")]
    ends = np.asarray(task.step_ends(jnp.asarray([ids]), vocab))[0]
    assert np.flatnonzero(ends).tolist() == [4, 11]  # the "3" before ";" and the "2" before EOS


# --- judging Countdown solutions -------------------------------------------------------------------------


def test_countdown_judge_references_judge_right_and_the_verdict_alone_is_rewarded():
    task = text.make_task("countdown_judge")
    vocab = text.Vocab.from_alphabet(task.alphabet)
    probs = task.sample(jax.random.key(5), BATCH, "train")
    answers = task.reference_answers(probs, vocab)
    np.testing.assert_array_equal(rewards_of(task, probs, answers, vocab), np.ones((BATCH, 2)))
    right = 0
    for (prompt, answer), numbers, target in zip(task.texts(probs), np.asarray(probs.numbers),
                                                  np.asarray(probs.target)):
        candidate = prompt.split("=", 1)[1].rstrip("?")
        truth = text.check_countdown(candidate, numbers, int(target))[0]  # the host verifier, independently
        assert answer[-1] == ("Y" if truth else "N"), (prompt, answer)
        assert Fraction(answer[:-1]) == python_value(candidate), (prompt, answer)  # the critique: the value
        right += truth
    assert 0.35 < right / BATCH < 0.65  # wrong_share 0.5 (a redrawn candidate may still be right)
    # The reward reads the verdict only: a bare verdict is judged, a flipped one is wrong, none is ill-formed
    flipped = [("N" if a[-1] == "Y" else "Y") for _, a in task.texts(probs)]
    bare = [a[-1] for _, a in task.texts(probs)]
    ids = lambda texts: jnp.asarray([[vocab.id_of(c) for c in t] + [vocab.eos_id] + [vocab.pad_id] * (  # noqa: E731
        task.answer_length - len(t) - 1) for t in texts])
    np.testing.assert_array_equal(rewards_of(task, probs, ids(bare), vocab), np.ones((BATCH, 2)))
    np.testing.assert_array_equal(rewards_of(task, probs, ids(flipped), vocab)[:, 0], np.zeros(BATCH))
    assert rewards_of(task, probs, ids(["25"] * BATCH), vocab)[:, 1].sum() == 0


def test_countdown_judge_step_critique_checks_each_merge_of_the_candidate_exactly():
    task = text.make_task("countdown_judge", critique="steps")
    vocab = text.Vocab.from_alphabet(task.alphabet)
    probs = task.sample(jax.random.key(6), 4 * BATCH, "train")
    np.testing.assert_array_equal(rewards_of(task, probs, task.reference_answers(probs, vocab), vocab),
                                  np.ones((4 * BATCH, 2)))
    fractions = negatives = 0
    for (prompt, answer), numbers in zip(task.texts(probs), np.asarray(probs.numbers)):
        candidate = prompt.split("=", 1)[1].rstrip("?")
        available = collections.Counter(Fraction(int(x)) for x in numbers)
        steps = answer[:-1].split(";")
        for k, step in enumerate(steps):
            left, written = step.split("=")
            merge = ast.parse(left, mode="eval").body
            operands = [python_value(ast.unparse(side)) for side in (merge.left, merge.right)]
            for x in operands:  # each operand a given number or an earlier step's result, each used once
                assert available[x] > 0, (prompt, answer)
                available[x] -= 1
            if not written:  # a division by zero: the last step written, the verdict N
                assert k == len(steps) - 1 and operands[1] == 0 and answer[-1] == "N", (prompt, answer)
                break
            assert Fraction(written) == python_value(left), (prompt, answer)  # the step's value, exact
            available[Fraction(written)] += 1
            fractions += "/" in written
            negatives += written.startswith("-")
        else:  # one step per merge, ending at the candidate's value
            assert len(steps) == len(numbers) - 1 and Fraction(written) == python_value(candidate), (prompt, answer)
    assert fractions and negatives  # the sample reaches the parenthesised operands
    # the verdict alone, and an unknown form refused
    bare = text.make_task("countdown_judge", critique="none")
    assert [a for _, a in bare.texts(probs)] == [a[-1] for _, a in task.texts(probs)] and bare.answer_length == 2
    with pytest.raises(ValueError, match="critique must be one of value, steps, none, got 'proof'"):
        text.make_task("countdown_judge", critique="proof")


def test_addition_judge_claims_are_the_sum_or_a_slip_and_the_verdict_is_rewarded():
    task = text.make_task("addition_judge", min_digits=1, max_digits=2)
    vocab = text.Vocab.from_alphabet(task.alphabet)
    probs = task.sample(jax.random.key(3), BATCH, "train")
    numbers, target = np.asarray(probs.numbers), np.asarray(probs.target)
    np.testing.assert_array_equal(target, numbers[:, 0] + numbers[:, 1])
    slips = numbers[:, 2] - target
    assert set(np.abs(slips)) <= {0, 1, 2, 10} and (numbers[:, 2] >= 0).all()
    assert 0.35 < np.mean(slips == 0) < 0.65  # wrong_share 0.5
    for (prompt, answer), (a, b, claim) in zip(task.texts(probs), numbers):
        assert prompt == f"{a}+{b}={claim}?" and answer == f"{a + b}" + ("Y" if claim == a + b else "N")
    answers = task.reference_answers(probs, vocab)
    np.testing.assert_array_equal(rewards_of(task, probs, answers, vocab), np.ones((BATCH, 2)))
    flipped = jnp.where(answers == vocab.id_of("Y"), vocab.id_of("N"), jnp.where(answers == vocab.id_of("N"),
                                                                                  vocab.id_of("Y"), answers))
    np.testing.assert_array_equal(rewards_of(task, probs, flipped, vocab), np.tile([0.0, 1.0], (BATCH, 1)))
    verdicts = jnp.asarray([vocab.id_of("Y" if c == a + b else "N") for a, b, c in numbers])
    bare = jnp.full_like(answers, vocab.pad_id).at[:, 0].set(verdicts).at[:, 1].set(vocab.eos_id)
    np.testing.assert_array_equal(rewards_of(task, probs, bare, vocab), np.ones((BATCH, 2)))  # the verdict alone
    assert text.make_task("addition_judge", wrong_share=0.0).heldout(64).numbers[:, 2].tolist() == \
        text.make_task("addition_judge", wrong_share=0.0).heldout(64).target.tolist()
    with pytest.raises(ValueError, match="wrong_share"):
        text.make_task("addition_judge", wrong_share=1.5)


def test_countdown_answer_slack_adds_room_after_the_longest_expression(tasks, problems, vocab):
    """answer_slack k: k more completion tokens; the reference answers are the same, padded further; a completion that
    runs on through the room without its EOS is not an answer."""
    plain, roomy = text.make_task("countdown"), text.make_task("countdown", answer_slack=12)
    problems = problems[("countdown", "train")]
    assert roomy.answer_length == plain.answer_length + 12 and roomy.prompt_length == plain.prompt_length
    short, long = plain.reference_answers(problems, vocab), roomy.reference_answers(problems, vocab)
    np.testing.assert_array_equal(long[:, :plain.answer_length], short)
    assert (np.asarray(long[:, plain.answer_length:]) == vocab.pad_id).all()
    assert (np.asarray(roomy.rewards(problems, long, vocab))[:, 0] == 1).all()
    run_on = np.where(np.asarray(long) == vocab.eos_id, vocab.id_of("1"), np.asarray(long))
    run_on = np.where(run_on == vocab.pad_id, vocab.id_of("1"), run_on)
    assert (np.asarray(roomy.rewards(problems, run_on, vocab)) == 0).all()
    with pytest.raises(ValueError, match="answer_slack must be >= 0"):
        text.make_task("countdown", answer_slack=-1)


def test_countdown_filler_thinks_longer_on_harder_problems_with_a_long_tail(vocab):
    """filler_scale s: the reference writes the expression, then min(slack, floor(-s ln(1 - d))) spaces, d the
    difficulty (where the largest number lies in 1..25), then EOS: lengths with a long tail (the hardest problems at
    the cap); the verifier ignores the spaces only with a filler."""
    s, slack = 8.0, 40
    task = text.make_task("countdown", num_numbers=2, answer_slack=slack, filler_scale=s)
    problems = task.sample(jax.random.key(3), 4096, "train")
    answers = np.asarray(task.reference_answers(problems, vocab))
    spaces = (answers == vocab.id_of(" ")).sum(-1)  # the filler (a two-number expression holds no space)
    difficulty = (np.asarray(problems.numbers).max(-1) - 1) / 24
    with np.errstate(divide="ignore"):
        expected = np.minimum(np.floor(-s * np.log1p(-difficulty)), slack)
    assert np.abs(spaces - expected).max() <= 1 and (spaces == expected).mean() > 0.99  # (float32 at floor's edges)
    assert (spaces == slack).mean() > 0.05  # largest number 25: 1 - (24/25)^2 = 7.8% of the problems
    assert np.percentile(spaces, 90) >= 3 * np.percentile(spaces, 50)  # a long tail: 25 against 8
    assert (task.rewards(problems, answers, vocab)[:, 0] == 1).all()
    without = text.make_task("countdown", num_numbers=2, answer_slack=slack)
    assert without.rewards(problems, answers, vocab)[spaces > 0, 1].max() == 0  # trailing spaces: not an expression
    with pytest.raises(ValueError, match="needs answer_slack > 0"):
        text.make_task("countdown", filler_scale=2.0)
