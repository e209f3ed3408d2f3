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
last number (a judge's: its last yes or no); a numeric answer is correct when it equals the target (commas, a
trailing period and surrounding `$` or `**` allowed), a Countdown answer when its expression is
(`verify.check_countdown`), a judge's verdict when it is the truth. well_formed: there is an answer and it parses.
"""

from __future__ import annotations

import functools
import json
import os
import re
from fractions import Fraction
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.text import render
from envs.text.judge import ArithmeticJudge
from envs.text.tasks import REWARD_NAMES, Arithmetic, Countdown, Problems, Task, host_call
from envs.text.tokenizer import ALPHABET, Vocab
from envs.text.turns import MultiTurnTask
from envs.text.verify import check_countdown

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
ANSWER_KINDS = ("number", "expression", "verdict")
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


def final_answer(reply: str, marker: str = DEFAULT_MARKER, kind: str = "number") -> str | None:
    """The reply's final answer: the text after the last `marker`, up to the end of its line, stripped of markdown
    and a final period; without a marker ('') the reply's last number (`kind` number), the left side of its last
    line's '=' (expression) or its last yes or no (verdict). None when there is none."""
    if not marker:
        if kind == "number":
            numbers = NUMBER.findall(reply)
            return numbers[-1] if numbers else None
        if kind == "verdict":
            verdicts = VERDICT.findall(reply)
            return verdicts[-1] if verdicts else None
        lines = [line for line in reply.strip().split("\n") if line.strip()]
        return lines[-1].split("=")[0].strip() or None if lines else None
    at = reply.lower().rfind(marker.lower())
    if at < 0:
        return None
    answer = reply[at + len(marker):].strip().split("\n")[0].strip()
    return answer.rstrip(".").strip("*$ ").rstrip(".").strip() or None


def answer_kind(task) -> str:
    """What a task's answers are (`ANSWER_KINDS`)."""
    if isinstance(task, Countdown):
        return "expression"
    return "verdict" if isinstance(task, ArithmeticJudge) else "number"


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
    if isinstance(task, ArithmeticJudge):
        return f"Is {int(numbers[0])} {task.op} {int(numbers[1])} = {int(numbers[2])}?"
    if isinstance(task, Countdown):
        given = ", ".join(str(int(n)) for n in numbers)
        return (f"Using the numbers {given}, each at most once, and + - * / with parentheses, write an expression "
                f"that equals {int(target)}.")
    raise ValueError(f"task {task.name!r} cannot be posed to a chat model")


def answer_format(task) -> str:
    return {"number": "a number", "expression": "an expression", "verdict": "Yes or No"}[answer_kind(task)]


def check(task, numbers: np.ndarray, target: int, answer: str | None) -> tuple[bool, bool]:
    """(correct, well_formed) of one extracted answer."""
    if answer is None:
        return False, False
    if isinstance(task, Countdown):
        return check_countdown(answer.replace(" ", ""), [int(n) for n in numbers], int(target))
    if isinstance(task, ArithmeticJudge):
        said = VERDICT.findall(answer)
        if not said:
            return False, False
        return (said[-1].lower() == "yes") == bool(task.right(numbers, target)), True
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
        self.alphabet = Vocab.from_alphabet(getattr(task, "alphabet", ALPHABET))  # the wrapped task's characters
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
        elif isinstance(self.task, ArithmeticJudge):  # its working, the result, then the verdict
            answer = (f"{int(numbers[0])} {self.task.op} {int(numbers[1])} = {int(target)}. "
                      f"{'Yes' if self.task.right(numbers, target) else 'No'}")
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
            answer = final_answer(self.reply(ids), self.marker, answer_kind(self.task))
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


class ChatTurns(MultiTurnTask):
    """A multi-turn task (`envs.text.turns`) played by a pretrained chat model: the rules and the first observation
    posed in words through the chat template, each environment answer wrapped as a `role` message ("user", or
    "tool" where the template has that role) and followed by the assistant's header, all in the model's token ids.

    Environment turns stay pure JAX: a model turn's tokens map to the wrapped task's characters through a table
    (each token id's text, spaces and newlines dropped; a token with any other character outside the task's
    alphabet reads as an invalid character, so the turn is malformed), the wrapped task answers, and its answer's
    characters map back to the model's single-character tokens between the role's constant header and footer.
    Only the prompt is rendered on the host. The model's end-of-sequence token ends its turns (SmolLM2's, Qwen's
    <|im_end|>). Demonstrations (`reference_answers`) are the wrapped task's, mapped the same way."""

    def __init__(self, task: MultiTurnTask, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 render: Callable[..., str], *, vocab_size: int, pad_id: int, eos_id: int, system_prompt: str = "",
                 instruction: str = "", role: str = "user", max_token_chars: int = 8):
        self.task, self.name, self.max_turns, self.alphabet = task, task.name, task.max_turns, task.alphabet
        self.roles = task.roles
        self.pad_id, self.eos_id, self.system_prompt, self.role = pad_id, eos_id, system_prompt, role
        self.instruction = instruction or task.instructions
        self.split_seed = task.split_seed
        self._encode, self._decode, self._render = encode, decode, render
        self._chars = Vocab.from_alphabet(task.alphabet)
        self._token_chars = _token_characters(decode, vocab_size, self._chars, (pad_id, eos_id), max_token_chars)
        self._char_tokens = _character_tokens(encode, self._chars)
        self._before, self._after = (np.asarray(encode(part), np.int32) for part in _role_wrap(render, role))
        self.turn_length = task.turn_length + 2  # model tokens: at most one per character, and a space or two
        self.observation_length = len(self._before) + task.observation_length + len(self._after)
        problems = task.sample(jax.random.key(0), 64, "train")
        longest = max(len(self._prompt_ids(p)) for p in np.asarray(task.prompts(problems, self._chars)))
        self.prompt_length = -(-(longest + 8) // 8) * 8

    # ---- host side ----
    def _prompt_ids(self, char_prompt) -> list[int]:
        observation = "".join(self._chars.tokens[int(i)] for i in char_prompt if i > self._chars.eos_id)
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return self._encode(self._render([*system, {"role": "user", "content": f"{self.instruction}\n{observation}"}]))

    def _host_prompts(self, char_prompts):
        flat = char_prompts.reshape(-1, char_prompts.shape[-1])
        out = np.full((flat.shape[0], self.prompt_length), self.pad_id, np.int32)
        for row, chars in enumerate(flat):
            ids = self._prompt_ids(chars)
            if len(ids) > self.prompt_length:
                raise ValueError(f"a prompt of {len(ids)} tokens exceeds prompt_length {self.prompt_length}")
            out[row, self.prompt_length - len(ids):] = ids
        return out.reshape(*char_prompts.shape[:-1], self.prompt_length)

    # ---- JAX side ----
    def _settings(self) -> tuple:  # (the tables are derived from the tokenizer, whose name the run's config holds)
        return (type(self), self.task._settings(), self.pad_id, self.eos_id, self.system_prompt, self.instruction,
                self.role, self._token_chars.shape)

    def sample(self, key, batch: int, split: str, level=None):
        return self.task.sample(key, batch, split, level)

    def heldout(self, num: int, seed: int = 0):
        return self.task.heldout(num, seed)

    def difficulty(self, problems):
        return self.task.difficulty(problems)

    def prompts(self, problems, vocab=None) -> jax.Array:
        """int32 [B, prompt_length]: the rules and the first observation as a chat prompt, left-padded."""
        char_prompts = self.task.prompts(problems, self._chars)
        shape = jax.ShapeDtypeStruct((*problems.target.shape, self.prompt_length), jnp.int32)
        return host_call(self._host_prompts, shape, char_prompts) + _varying_zeros(problems.target[..., None],
                                                                                   jnp.int32)

    def start(self, problem):
        return self.task.start(problem)

    def credit(self, turns: dict) -> dict:
        return self.task.credit(turns)

    def _characters(self, turn: jax.Array) -> jax.Array:
        """The model's turn (ids [T], up to its EOS) as the wrapped task's turn: characters then its EOS [T']."""
        width, chars = self.task.turn_length, self._chars
        before_eos = jnp.cumsum(turn == self.eos_id) == 0
        ended = jnp.any(turn == self.eos_id)
        table = jnp.asarray(self._token_chars)[turn]  # [T, L], -1: no character
        flat = jnp.where(before_eos[:, None], table, -1).reshape(-1)
        count = jnp.cumsum(flat >= 0)
        slots = jnp.where(flat >= 0, count - 1, width)
        out = jnp.full((width,), chars.pad_id, jnp.int32).at[slots].set(flat, mode="drop")
        n = count[-1]
        return jnp.where(ended & (jnp.arange(width) == n), chars.eos_id, out)  # (no room for EOS: malformed)

    def _wrap(self, observation, length) -> tuple[jax.Array, jax.Array]:
        """The wrapped task's answer (character ids) in the model's tokens, between the role's header and footer."""
        tokens = jnp.asarray(self._char_tokens)[observation]
        return render.concat([(jnp.asarray(self._before), len(self._before)), (tokens, length),
                              (jnp.asarray(self._after), len(self._after))], self.observation_length, self.pad_id)

    def respond(self, problem, state, turn, turn_index, vocab):
        reply = self.task.respond(problem, state, self._characters(turn), turn_index, self._chars)
        observation, length = self._wrap(reply.observation, reply.observation_length)
        return reply.replace(observation=observation, observation_length=length)

    def imitated_turns(self, played) -> jax.Array:
        return self.task.imitated_turns(played)

    @functools.partial(jax.jit, static_argnums=0)
    def reference_answers(self, problems, vocab=None) -> jax.Array:
        """The wrapped task's demonstrations in the model's tokens and this layout: int32 [B, N]."""
        chars, model = self._chars, self
        episodes = self.task.reference_answers(problems, chars)
        K, T, O = self.max_turns, self.task.turn_length, self.task.observation_length

        def turn(block):  # [T + O] characters -> [turn_length + observation_length] tokens
            said, answer = block[:T], block[T:]
            n = jnp.sum((said != chars.pad_id) & (said != chars.eos_id))
            played = jnp.any(said == chars.eos_id)
            written = jnp.where(jnp.arange(T) < n, jnp.asarray(model._char_tokens)[said], model.pad_id)
            written = jnp.concatenate([written, jnp.full((model.turn_length - T,), model.pad_id)])
            written = jnp.where(jnp.arange(model.turn_length) == n, model.eos_id, written)
            shown = jnp.sum(answer != chars.pad_id)
            wrapped, length = model._wrap(answer, shown)
            wrapped = jnp.where(jnp.arange(model.observation_length) < length, wrapped, model.pad_id)
            return jnp.where(played, jnp.concatenate([written, wrapped]), model.pad_id)

        return jax.vmap(lambda e: jax.vmap(turn)(e.reshape(K, T + O)).reshape(-1))(episodes)

    def texts(self, problems) -> list[tuple[str, str]]:
        """(prompt, demonstration episode) strings, special tokens shown (host)."""
        show = lambda ids: self._decode([int(i) for i in ids if i != self.pad_id], skip_special_tokens=False)  # noqa
        return [(show(p), show(e)) for p, e in zip(np.asarray(self.prompts(problems)),
                                                    np.asarray(self.reference_answers(problems)))]

    def __repr__(self) -> str:
        return f"ChatTurns({self.task!r}, prompt_length={self.prompt_length}, turn_length={self.turn_length})"


def _token_characters(decode, vocab_size: int, chars: Vocab, specials, width: int) -> np.ndarray:
    """int32 [V, width]: the characters (ids of `chars`) of each token's text, spaces and newlines dropped, -1 after
    them; a token whose text has another character outside the alphabet (or is longer): one invalid character
    (`chars.bos_id`, which no task accepts in a turn)."""
    table = np.full((vocab_size, width), -1, np.int32)
    known = {c: i for i, c in enumerate(chars.tokens) if len(c) == 1}
    for token in range(vocab_size):
        if token in specials:
            continue
        text = decode([token]).replace(" ", "").replace("\n", "")
        if all(c in known for c in text) and len(text) <= width:
            table[token, :len(text)] = [known[c] for c in text]
        else:
            table[token, 0] = chars.bos_id
    return table


def _character_tokens(encode, chars: Vocab) -> np.ndarray:
    """int32 [size of `chars`]: the model's token of each character of the alphabet (one token each)."""
    out = np.zeros(chars.size, np.int32)
    for i, c in enumerate(chars.tokens):
        if len(c) != 1:
            continue
        ids = encode(c)
        if len(ids) != 1:
            raise ValueError(f"the model's tokenizer writes {c!r} as {len(ids)} tokens; the task's answers need one "
                             "token per character")
        out[i] = ids[0]
    return out


def _role_wrap(render, role: str) -> tuple[str, str]:
    """The chat template's text between an assistant's end-of-turn token and a `role` message's content (its
    header: the assistant's EOS is the model's own last token), and after that content up to the next assistant
    turn's start (its footer and the assistant header)."""
    marker, answer = "\x00OBSERVATION\x00", "\x00ANSWER\x00"
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": answer},
                {"role": role, "content": marker}]
    full = render(messages, add_generation_prompt=True)
    between = full[full.index(answer) + len(answer):full.index(marker)]
    upto_eos = render(messages[:2], add_generation_prompt=False)
    end_of_turn = upto_eos[upto_eos.index(answer) + len(answer):]
    header = between[len(end_of_turn.rstrip("\n")):] if between.startswith(end_of_turn.rstrip("\n")) else between
    return header, full[full.index(marker) + len(marker):]
