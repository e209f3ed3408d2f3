"""Verifiable tasks posed to a pretrained chat model: the question in words, inside the model's chat template
(after a system prompt), tokenised by the model's own tokenizer; the reply decoded, its final answer extracted
from free text and checked. `ChatTask` wraps a `Task` (addition, multiplication, countdown) or a `DatasetTask` (a
user's file of question / answer pairs) and offers what the token-level algorithms call on a task, with the
model's token ids:

    task = ChatTask(make_task("addition"), encode, decode, render, pad_id=2, eos_id=2, answer_length=64)
    prompts = task.prompts(problems, vocab)                   # int32 [B, P] chat prompts, left-padded
    rewards = task.jax_rewards(problems, completions, vocab)  # float32 [..., 2]: correct, well_formed

Rendering, tokenising and verifying run on the host (`jax.pure_callback`, through `tasks.host_call`): they are
string work. The problems themselves are drawn in JAX as before, so sampling, held-out splits and pools are the
wrapped task's.

An answer is the text after the last `marker` ("Answer:" by default) on its line, or with marker '' the reply's
last number; a numeric answer is correct when it equals the target (commas, a trailing period and surrounding `$`
or `**` allowed), a Countdown answer when its expression is (`verify.check_countdown`). well_formed: there is an
answer and it parses.
"""

from __future__ import annotations

import json
import os
import re
from fractions import Fraction
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.text.tasks import REWARD_NAMES, Arithmetic, Countdown, Problems, Task, host_call
from envs.text.tokenizer import Vocab
from envs.text.verify import check_countdown

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
DEFAULT_MARKER = "Answer:"


@struct.dataclass
class ModelVocab:
    """What the token-level algorithms read of a vocabulary, for a pretrained model's tokenizer (all static)."""

    size: int = struct.field(pytree_node=False)
    pad_id: int = struct.field(pytree_node=False)
    eos_id: int = struct.field(pytree_node=False)


def parse_number(text: str) -> Fraction | None:
    """The first number in `text` ("1,234", "-5", "3.25"), exactly, or None."""
    match = NUMBER.search(text)
    if match is None:
        return None
    try:
        return Fraction(match.group().replace(",", ""))
    except ValueError:
        return None


def final_answer(reply: str, marker: str = DEFAULT_MARKER, numeric: bool = True) -> str | None:
    """The reply's final answer: the text after the last `marker`, up to the end of its line, stripped of markdown
    and a final period; without a marker ('') the reply's last number (numeric answers) or the left side of its
    last line's '=' (expressions). None when there is none."""
    if not marker:
        if numeric:
            numbers = NUMBER.findall(reply)
            return numbers[-1] if numbers else None
        lines = [line for line in reply.strip().split("\n") if line.strip()]
        return lines[-1].split("=")[0].strip() or None if lines else None
    at = reply.lower().rfind(marker.lower())
    if at < 0:
        return None
    answer = reply[at + len(marker):].strip().split("\n")[0].strip()
    return answer.rstrip(".").strip("*$ ").rstrip(".").strip() or None


class DatasetTask:
    """Question / numeric-answer pairs from a user's file (jsonl, or parquet with pyarrow installed), e.g. GSM8K:

        {"question": "Natalia sold clips to 48 ...", "answer": "... #### 72"}

    The answer is the number after "####" when there is one, else the answer field as a number. When rows have a
    `split` field, those saying "test" are held out; in a file without one, a fixed 10% of rows (by a hash of the
    row index) is.
    A problem is the row's index (`Problems.numbers[..., 0]`)."""

    host_verifier = True
    reward_names = REWARD_NAMES

    def __init__(self, path: str, question_key: str = "question", answer_key: str = "answer", split_seed: int = 0):
        self.name, self.path = "dataset", path
        rows = read_rows(path)
        if not rows:
            raise ValueError(f"task.kwargs.path={path}: the file has no rows")
        self.questions, self.answers, heldout = [], [], []
        marked = any("split" in row for row in rows)
        for i, row in enumerate(rows):
            for key in (question_key, answer_key):
                if key not in row:
                    raise ValueError(f"task.kwargs.path={path}: row {i} has no {key!r} field (it has "
                                     f"{sorted(row)}); set task.kwargs.question_key / answer_key")
            gold = str(row[answer_key])
            value = parse_number(gold.split("####")[-1])
            if value is None:
                raise ValueError(f"task.kwargs.path={path}: row {i}'s answer {gold[-40:]!r} has no number")
            self.questions.append(str(row[question_key]))
            self.answers.append(value)
            held = row.get("split") == "test" if marked else (_row_hash(i, split_seed) % 1000) < 100
            heldout.append(held)
        self.test_rows = np.flatnonzero(heldout).astype(np.int32)
        self.train_rows = np.flatnonzero(~np.asarray(heldout)).astype(np.int32)
        if not len(self.train_rows) or not len(self.test_rows):
            raise ValueError(f"task.kwargs.path={path}: {len(self.train_rows)} training and {len(self.test_rows)} "
                             "held-out rows; both splits need at least one")

    def _problems(self, rows: jax.Array) -> Problems:
        return Problems(rows[..., None].astype(jnp.int32), jnp.zeros(rows.shape, jnp.int32),
                        jnp.zeros((*rows.shape, 0, 3), jnp.int32))

    def sample(self, key: jax.Array, batch: int, split: str, level=None) -> Problems:
        rows = jnp.asarray(self.test_rows if split == "test" else self.train_rows)
        return self._problems(rows[jax.random.randint(key, (batch,), 0, rows.shape[0])])

    def heldout(self, num: int, seed: int = 0) -> Problems:
        if num > len(self.test_rows):
            raise ValueError(f"{num} held-out problems asked for; {self.path} holds {len(self.test_rows)} "
                             "(set eval.episodes to at most that)")
        return self._problems(jnp.asarray(self.test_rows[:num]))

    def difficulty(self, problems: Problems) -> jax.Array:
        raise ValueError("a dataset file's problems have no difficulty level: a curriculum needs a generated task")


def read_rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        raise ValueError(f"task.kwargs.path={path} does not exist")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError("reading a parquet file needs pyarrow: pip install pyarrow") from None
        return pq.read_table(path).to_pylist()
    with open(path) as f:
        try:
            return [json.loads(line) for line in f if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"task.kwargs.path={path} is not JSON lines ({e})") from None


def _row_hash(i: int, seed: int) -> int:
    h = (i * 2654435761 + seed * 40503 + 12345) & 0xFFFFFFFF
    h ^= h >> 16
    return (h * 0x45D9F3B) & 0xFFFFFFFF


def question_text(task, numbers: np.ndarray, target: int) -> str:
    """One problem in words (host)."""
    if isinstance(task, DatasetTask):
        return task.questions[int(numbers[0])]
    if isinstance(task, Arithmetic):
        return f"What is {int(numbers[0])} {task.op} {int(numbers[1])}?"
    if isinstance(task, Countdown):
        given = ", ".join(str(int(n)) for n in numbers)
        return (f"Using the numbers {given}, each at most once, and + - * / with parentheses, write an expression "
                f"that equals {int(target)}.")
    raise ValueError(f"task {task.name!r} cannot be posed to a chat model")


def answer_format(task) -> str:
    return "an expression" if isinstance(task, Countdown) else "a number"


def check(task, numbers: np.ndarray, target: int, answer: str | None) -> tuple[bool, bool]:
    """(correct, well_formed) of one extracted answer."""
    if answer is None:
        return False, False
    if isinstance(task, Countdown):
        return check_countdown(answer.replace(" ", ""), [int(n) for n in numbers], int(target))
    value = parse_number(answer)
    if value is None:
        return False, False
    gold = task.answers[int(numbers[0])] if isinstance(task, DatasetTask) else Fraction(int(target))
    return value == gold, True


def _varying_zeros(like: jax.Array, dtype) -> jax.Array:
    """Zeros shaped like `like` that vary over the mesh axes it varies over: a callback's result says nothing of
    them, and under `shard_map` a loop carry built from it must match one built from the task's other arrays."""
    return jnp.zeros_like(like, dtype)


class ChatTask:
    """A task posed through a chat template (see the module docstring). encode(text) -> ids, decode(ids) -> text,
    render(messages) -> the prompt text with the generation prompt; pad_id, eos_id: the model's."""

    host_verifier = True
    reward_names = REWARD_NAMES

    def __init__(self, task: Task | DatasetTask, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 render: Callable[[list[dict]], str], *, pad_id: int, eos_id: int, answer_length: int,
                 system_prompt: str = "", instruction: str = "", marker: str = DEFAULT_MARKER,
                 prompt_length: int = 0, probe: int = 256):
        self.task, self.encode, self.decode, self.render = task, encode, decode, render
        self.pad_id, self.eos_id, self.answer_length = pad_id, eos_id, answer_length
        self.name, self.marker, self.system_prompt = task.name, marker, system_prompt
        self.instruction = instruction or (f"Give your final answer as '{marker} <{answer_format(task)}>'." if marker
                                           else f"Give the final answer as {answer_format(task)}.")
        self.alphabet = Vocab.from_alphabet()
        self.prompt_length = prompt_length or self._measured_prompt_length(probe)

    def _measured_prompt_length(self, probe: int) -> int:
        """The longest prompt, plus slack, rounded up to a multiple of 8: among every row of a dataset file, else
        among `probe` training problems and the first `probe` held-out ones."""
        if isinstance(self.task, DatasetTask):
            problems = [self.task._problems(jnp.arange(len(self.task.questions)))]
        else:
            problems = [self.task.sample(jax.random.key(0), probe, "train"), self.task.heldout(probe)]
        longest = max(len(ids) for p in problems for ids in self._prompt_ids(jax.device_get(p)))
        return -(-(longest + 8) // 8) * 8

    # ---- host side ----
    def messages(self, question: str) -> list[dict]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": f"{question}\n{self.instruction}"}]

    def _prompt_ids(self, problems: Problems) -> list[list[int]]:
        numbers, target = np.asarray(problems.numbers), np.asarray(problems.target)
        return [self.encode(self.render(self.messages(question_text(self.task, n, t))))
                for n, t in zip(numbers.reshape(-1, numbers.shape[-1]), target.reshape(-1))]

    def _host_prompts(self, numbers, target, recipe):
        ids = self._prompt_ids(Problems(numbers, target, recipe))
        out = np.full((len(ids), self.prompt_length), self.pad_id, np.int32)
        for row, prompt in enumerate(ids):
            if len(prompt) > self.prompt_length:
                raise ValueError(f"a prompt of {len(prompt)} tokens exceeds prompt_length {self.prompt_length}")
            out[row, self.prompt_length - len(prompt):] = prompt
        return out.reshape(*np.shape(target), self.prompt_length)

    def question_prompts(self, questions: Sequence[str]) -> np.ndarray:
        """int32 [B, prompt_length]: questions in words, each posed as this task poses its own (host)."""
        ids = [self.encode(self.render(self.messages(q))) for q in questions]
        width = max(self.prompt_length, *(len(i) for i in ids))
        return np.asarray([[self.pad_id] * (width - len(i)) + i for i in ids], np.int32)

    def reference_text(self, numbers, target, reference_chars) -> str:
        if isinstance(self.task, DatasetTask):
            gold = self.task.answers[int(numbers[0])]
            answer = str(gold.numerator if gold.denominator == 1 else float(gold))
        else:
            answer = self.alphabet.text(reference_chars)
        return f"{self.marker} {answer}" if self.marker else answer

    def _host_answers(self, numbers, target, reference_chars):
        flat = numbers.reshape(-1, numbers.shape[-1]), target.reshape(-1), reference_chars.reshape(
            -1, reference_chars.shape[-1])
        out = np.full((flat[1].shape[0], self.answer_length), self.pad_id, np.int32)
        for row, (n, t, chars) in enumerate(zip(*flat)):
            ids = [*self.encode(self.reference_text(n, t, chars)), self.eos_id][:self.answer_length]
            out[row, :len(ids)] = ids
        return out.reshape(*target.shape, self.answer_length)

    def _host_rewards(self, numbers, target, completions):
        lead = completions.shape[:-1]
        extra = (1,) * (len(lead) - target.ndim)  # completions [..., G, N] of problems [...]: one per group member
        numbers = np.broadcast_to(numbers.reshape(*target.shape, *extra, numbers.shape[-1]),
                                  (*lead, numbers.shape[-1])).reshape(-1, numbers.shape[-1])
        target = np.broadcast_to(target.reshape(*target.shape, *extra), lead).reshape(-1)
        out = np.zeros((numbers.shape[0], 2), np.float32)
        for row, (n, t, ids) in enumerate(zip(numbers, target, completions.reshape(-1, completions.shape[-1]))):
            answer = final_answer(self.reply(ids), self.marker, numeric=not isinstance(self.task, Countdown))
            out[row] = check(self.task, n, t, answer)
        return out.reshape(*lead, 2)

    def reply(self, ids: Sequence[int]) -> str:
        """A completion's text: up to its first end-of-sequence token, padding dropped."""
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.decode([i for i in ids if i != self.pad_id])

    # ---- what the algorithms call (jittable) ----
    def sample(self, key, batch: int, split: str, level=None) -> Problems:
        return self.task.sample(key, batch, split, level)

    def heldout(self, num: int, seed: int = 0) -> Problems:
        return self.task.heldout(num, seed)

    def difficulty(self, problems: Problems):
        return self.task.difficulty(problems)

    def prompts(self, problems: Problems, vocab=None) -> jax.Array:
        """int32 [B, prompt_length]: each problem's chat prompt, left-padded with pad_id."""
        shape = jax.ShapeDtypeStruct((*problems.target.shape, self.prompt_length), jnp.int32)
        out = host_call(self._host_prompts, shape, problems.numbers, problems.target, problems.recipe)
        return out + _varying_zeros(problems.target[..., None], out.dtype)

    def reference_answers(self, problems: Problems, vocab=None) -> jax.Array:
        """int32 [B, answer_length]: "<marker> <answer>" then EOS, right-padded with pad_id."""
        if isinstance(self.task, DatasetTask):
            chars = jnp.zeros((*problems.target.shape, 1), jnp.int32)
        else:
            chars = self.task.reference_answers(problems, self.alphabet)
        shape = jax.ShapeDtypeStruct((*problems.target.shape, self.answer_length), jnp.int32)
        out = host_call(self._host_answers, shape, problems.numbers, problems.target, chars)
        return out + _varying_zeros(problems.target[..., None], out.dtype)

    def jax_rewards(self, problems: Problems, completions: jax.Array, vocab=None) -> jax.Array:
        """float32 [..., 2] (correct, well_formed) for completions [..., N] of problems [...] (broadcast)."""
        shape = jax.ShapeDtypeStruct((*completions.shape[:-1], 2), jnp.float32)
        out = host_call(self._host_rewards, shape, problems.numbers, problems.target, completions)
        return out + _varying_zeros(completions[..., :1], out.dtype)

    rewards = jax_rewards

    def texts(self, problems: Problems) -> list[tuple[str, str]]:
        """(prompt, reference answer) strings, host-side."""
        problems = jax.device_get(problems)
        numbers, target = np.asarray(problems.numbers), np.asarray(problems.target)
        chars = (np.zeros((len(target), 1), np.int32) if isinstance(self.task, DatasetTask)
                 else np.asarray(self.task.reference_answers(problems, self.alphabet)))
        return [(self.render(self.messages(question_text(self.task, n, t))), self.reference_text(n, t, c))
                for n, t, c in zip(numbers, target, chars)]

    def __repr__(self) -> str:
        return f"ChatTask({self.task!r}, prompt_length={self.prompt_length}, answer_length={self.answer_length})"
