"""Multi-turn text environments: the policy writes a turn, the environment answers with tokens and a reward,
until the episode ends or its turns run out. Every environment turn is a pure JAX function of token arrays, so
a whole conversation runs inside one compiled program (`jaxrl.multi_turn.play`).

    task = text.make_task("guess", high=1024)                # a MultiTurnTask
    problems = task.sample(key, 64, "train")                 # as any Task
    prompts = task.prompts(problems, vocab)                  # int32 [64, P]: the first observation
    state, anchor = task.start(problem)                      # one episode
    reply = task.respond(problem, state, turn, turn_index, vocab)   # turn int32 [T]: the model's tokens

An episode lays out in fixed slots after its prompt: turn k's model tokens in slots [k (T + O), k (T + O) + T)
and the environment's answer in the O slots after them (`turn_slots`), both left-packed, with pad (unreal) slots
after; positions count real tokens only, so the layout equals the packed conversation (the test of the KV cache
across turns). A model turn ends with EOS (for chat models, their end-of-turn token) or after T tokens.

Episode rewards keep the single-turn tasks' components: `correct` (the task's reward: each turn's summed, e.g.
success discounted by the turns used) and `well_formed` (the share of turns that parsed). Tool calls (a
calculator, a lookup into the problem's table) are turns that begin with a tool's mark; a malformed call or a
failing one gets an error observation (`!`) and the episode goes on.

Tasks: `guess` (the number-guessing game, higher/lower feedback), `countdown_tools` (Countdown with a
calculator), `lookup` (a question about a table only tools can read), `retry` (arithmetic with "wrong, try
again" feedback: self-correction), `grid` (a grid world played through tokens). Each has a demonstrator
(`reference_answers`: a whole demonstration episode in the slot layout) for supervised warm starts.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.text import render, tools
from envs.text.render import Piece
from envs.text.tasks import EOS, SPLITS, TASKS, Countdown, Problems, Task, addition, multiplication, split_hash
from envs.text.tokenizer import ALPHABET, Vocab

CALCULATOR, LOOKUP, ERROR = "#", "@", "!"  # a turn starting with # or @ calls a tool; ! answers a failed call


@struct.dataclass
class Reply:
    """The environment's answer to one turn of one episode."""

    state: Any  # the episode's state after the turn
    observation: jax.Array  # int32 [O]: the answer, left-packed, pad after
    observation_length: jax.Array  # int32
    reward: jax.Array  # float32: the task reward this turn earned (summed into the `correct` component)
    done: jax.Array  # bool: the episode ended
    well_formed: jax.Array  # bool: the turn parsed (a valid move, answer or tool call)
    tool_call: jax.Array  # bool: the turn called a tool
    tool_error: jax.Array  # bool: ... and the call was malformed or failed
    solved: jax.Array  # bool: the episode ended with the task solved
    anchor: jax.Array  # int32: the environment's state after the turn as one id (equal ids: the same state)


class MultiTurnTask(Task):
    """A Task played over turns. Subclasses set `turn_length` (T, EOS included), `observation_length` (O),
    `max_turns` (K) and `alphabet` (every character their texts use), and define `_propose`, `_prompt_pieces`,
    `start`, `respond` and `demonstrate`."""

    multi_turn = True
    turn_length: int
    observation_length: int
    max_turns: int
    alphabet: str = ALPHABET
    instructions: str = ""  # the rules in words, for a pretrained chat model (`envs.text.chat.ChatTurns`)
    roles: tuple[str, ...] = ()  # a task of roles: who plays each turn (its reward is that role's: `credit`)

    @property
    def answer_length(self) -> int:
        """N = K (T + O): the episode's slots after the prompt."""
        return self.max_turns * (self.turn_length + self.observation_length)

    @property
    def turn_span(self) -> int:
        return self.turn_length + self.observation_length

    def turn_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """Static (turn index int32 [N], model slot bool [N]): the turn each slot belongs to, and whether it holds
        the model's tokens (else the environment's)."""
        slots = np.arange(self.answer_length)
        return (slots // self.turn_span).astype(np.int32), slots % self.turn_span < self.turn_length

    # --- subclass hooks -------------------------------------------------------------------------------
    def start(self, problem: Problems) -> tuple[Any, jax.Array]:
        """One episode's initial state and its anchor id."""
        raise NotImplementedError

    def respond(self, problem: Problems, state, turn: jax.Array, turn_index, vocab: Vocab) -> Reply:
        """The environment's answer to the model's turn (int32 [T]: up to and including EOS, pad after)."""
        raise NotImplementedError

    def demonstrate(self, problem: Problems, state, turn_index, vocab: Vocab) -> Piece:
        """The demonstrator's next turn (without EOS) in `state`: what `reference_answers` plays. `turn_index` counts
        the demonstrator's own turns: after a learner's roll-in (`reference_answers`' prefix) it is less than the
        turns played."""
        raise NotImplementedError

    def credit(self, turns: dict) -> dict:
        """Per-turn outcomes (`replay`'s, leaves [..., K]) with each reward at the turn it credits: a task whose turn
        earns a reward known only later (a critic's, by the revision after it) moves it there. Default: as played."""
        return turns

    def imitated_turns(self, played: jax.Array) -> jax.Array:
        """bool [B, K]: which of a demonstration's turns a learner imitates, from the turns it played (bool
        [B, K]). A demonstration may play a turn only to show what follows it (a wrong guess, then how the feedback
        is used), which supervised learning must not imitate. Default: every turn played."""
        return played

    @functools.partial(jax.jit, static_argnums=0)
    def imitated_slots(self, episodes: jax.Array, vocab: Vocab) -> jax.Array:
        """bool [B, N]: the slots of demonstration `episodes` [B, N] (`reference_answers`) that supervised learning
        imitates: the model's tokens (not the environment's) of the imitated turns."""
        turn_of, _ = self.turn_slots()
        turns = episodes.reshape(*episodes.shape[:-1], self.max_turns, self.turn_span)
        model = turns[..., :self.turn_length]  # each turn's model slots: its tokens through its EOS, if it was played
        played = model[..., 0] != vocab.pad_id  # (a turn that opens with padding was not; padding may be the EOS)
        written = render.through_first_eos(model, vocab.eos_id) & played[..., None]
        written = jnp.concatenate([written, jnp.zeros_like(turns[..., self.turn_length:], bool)], -1).reshape(
            episodes.shape)
        return written & jnp.take(self.imitated_turns(played), jnp.asarray(turn_of), axis=-1)

    # A task played on a single-turn task's problems sets `base` (that Task): its problems, difficulty and prompt
    # are the base's unless the subclass defines them.
    base: Task | None = None

    def _propose(self, key, n, level=None):
        return self.base._propose(key, n, level)

    def difficulty(self, problems: Problems) -> jax.Array:
        if self.base is None:
            return jnp.zeros(problems.target.shape, jnp.float32)
        return self.base.difficulty(problems)

    def _prompt_pieces(self, problem, vocab):
        return self.base._prompt_pieces(problem, vocab)

    def _answer_pieces(self, problem, vocab):
        raise TypeError(f"{self.name}: a multi-turn task's reference is an episode (`reference_answers`)")

    # --- shared machinery -----------------------------------------------------------------------------
    def _turn(self, piece: Piece, vocab: Vocab) -> jax.Array:
        """A turn's text as the model writes it: int32 [T], EOS after the text, pad after that."""
        return render.concat([piece, render.char(EOS, vocab)], self.turn_length, vocab.pad_id)[0]

    def _observe(self, pieces: list[Piece], vocab: Vocab) -> tuple[jax.Array, jax.Array]:
        return render.concat(pieces, self.observation_length, vocab.pad_id)

    @functools.partial(jax.jit, static_argnums=0)
    def reference_answers(self, problems: Problems, vocab: Vocab, prefix: jax.Array | None = None,
                          prefix_turns: jax.Array | None = None) -> jax.Array:
        """int32 [B, N]: the demonstrator's episode in the slot layout (pad in unreal slots). With `prefix` (int32
        [B, N], slot layout: a learner's episodes) and `prefix_turns` (int32 [B]), episode b's first prefix_turns[b]
        turns are the prefix's and the demonstrator continues from the state they reached (DAgger's roll-in)."""
        T, span = self.turn_length, self.turn_span
        if prefix is None:
            prefix = jnp.zeros((problems.target.shape[0], self.answer_length), jnp.int32)
            prefix_turns = jnp.zeros(problems.target.shape[0], jnp.int32)

        def one(problem, prefix, prefix_turns):
            state, _ = like_problem(problem, self.start(problem))

            def turn(carry, k):
                state, done = carry
                demonstrated = self._turn(self.demonstrate(problem, state, jnp.maximum(k - prefix_turns, 0), vocab),
                                          vocab)
                tokens = jnp.where(k < prefix_turns, jax.lax.dynamic_slice_in_dim(prefix, k * span, T), demonstrated)
                reply = self.respond(problem, state, tokens, k, vocab)
                observation = jnp.where(jnp.arange(self.observation_length) < reply.observation_length,
                                        reply.observation, vocab.pad_id)
                block = jnp.where(done, vocab.pad_id, jnp.concatenate([tokens, observation]))
                return (jax.tree.map(lambda a, b: jnp.where(done, a, b), state, reply.state),
                        done | reply.done), block

            _, blocks = jax.lax.scan(turn, (state, like_problem(problem, jnp.bool_(False))), jnp.arange(self.max_turns))
            return blocks.reshape(-1)
        return jax.vmap(one)(problems, prefix, prefix_turns)

    @functools.partial(jax.jit, static_argnums=(0, 3))
    def replay(self, problems: Problems, episodes: jax.Array, vocab: Vocab) -> dict:
        """Re-play episodes [B, N] (slot layout) against fresh environments: per turn [B, K] `reward`, `taken`,
        `well_formed`, `tool_call`, `tool_error`, `solved`, and the anchor before each turn (0 for turns not taken)."""
        T, span = self.turn_length, self.turn_span

        def one(problem, episode):
            state, anchor = like_problem(problem, self.start(problem))

            def turn(carry, k):
                state, anchor, done = carry
                tokens = jax.lax.dynamic_slice_in_dim(episode, k * span, T)
                reply = self.respond(problem, state, tokens, k, vocab)
                taken = ~done
                out = {"reward": reply.reward * taken, "taken": taken, "well_formed": reply.well_formed & taken,
                       "tool_call": reply.tool_call & taken, "tool_error": reply.tool_error & taken,
                       "solved": reply.solved & taken, "anchor": jnp.where(taken, anchor, 0)}
                state = jax.tree.map(lambda a, b: jnp.where(done, a, b), state, reply.state)
                return (state, jnp.where(done, anchor, reply.anchor), done | reply.done), out

            _, out = jax.lax.scan(turn, (state, anchor, like_problem(problem, jnp.bool_(False))),
                                  jnp.arange(self.max_turns))
            return out
        return self.credit(jax.vmap(one)(problems, episodes))

    def rewards(self, problems, completions, vocab):
        """float32 [B, 2] (correct, well_formed) of whole episodes [B, N], re-played (`replay`)."""
        return episode_rewards(self.replay(problems, completions, vocab))

    def texts(self, problems: Problems) -> list[tuple[str, str]]:
        """(prompt, demonstration episode) strings: the episode's real tokens, EOS shown as `|`."""
        vocab = Vocab.from_alphabet(self.alphabet)
        prompts = np.asarray(self.prompts(problems, vocab))
        episodes = np.asarray(self.reference_answers(problems, vocab))
        show = lambda ids: "".join("|" if i == vocab.eos_id else vocab.tokens[i] for i in ids  # noqa: E731
                                   if i not in (vocab.pad_id, vocab.bos_id))
        return [(show(p), show(e)) for p, e in zip(prompts, episodes)]


def like_problem(problem: Problems, tree):
    """`tree` plus zeros derived from the problem: inside `shard_map` its leaves then vary over devices as the
    problem does (what a loop's carry needs, whose outputs depend on the problem)."""
    return jax.tree.map(lambda x: x + jnp.zeros_like(problem.target, x.dtype).reshape(
        problem.target.shape + (1,) * (jnp.ndim(x) - problem.target.ndim)), tree)


def episode_rewards(turns: dict) -> jax.Array:
    """float32 [..., 2] (correct, well_formed) from per-turn outcomes [..., K]: the summed task reward, and the
    share of the turns taken that parsed."""
    taken = jnp.maximum(turns["taken"].sum(-1), 1)
    return jnp.stack([turns["reward"].sum(-1), turns["well_formed"].sum(-1) / taken], axis=-1).astype(jnp.float32)


def _select(done, a, b):
    return jax.tree.map(lambda x, y: jnp.where(done, x, y), a, b)


def _parse_number(turn: jax.Array, start, vocab: Vocab, max_digits: int):
    """(value, well_formed) of `<digits><EOS>` from column `start` of the turn (no leading zero but "0")."""
    shifted = jnp.roll(turn, -start)
    shifted = jnp.where(jnp.arange(turn.shape[0]) < turn.shape[0] - start, shifted, vocab.pad_id)
    value, length, ok = render.parse_decimal(shifted, vocab, max_digits)
    first = jnp.take(jnp.asarray(vocab.digit_values), shifted[0], mode="fill", fill_value=-1)
    return value, ok & (length <= max_digits) & ((first != 0) | (length == 1))


def _starts_with(turn: jax.Array, mark: str, vocab: Vocab) -> jax.Array:
    return turn[0] == vocab.id_of(mark)


def _discounted(turn_index, cost: float) -> jax.Array:
    """A success's reward at turn `turn_index` (0-based): 1 less `cost` per turn before it."""
    return jnp.maximum(1.0 - cost * turn_index, 0.0).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------------------
# The number-guessing game


class GuessNumber(MultiTurnTask):
    """Guess a secret number in [low, high] (1..1024 by default, as PipelineRL's game): each turn is a decimal
    guess; the answer is `>` (the secret is higher), `<` (lower), `=` (found: the episode ends) or `!` (not a
    number in range). A find at turn k (1-based) earns 1 - turn_cost (k - 1); `max_turns` (13) caps the episode.
    Binary search needs at most ceil(log2(1024)) + 1 = 11 turns and averages about 9. The prompt is `low-high=`.

    State: the interval the answers so far leave, (lo, hi), which is also the anchor (GiGPO's step groups:
    different guesses that leave the same interval meet in the same state). The demonstrator bisects it."""

    name = "guess"
    alphabet = ALPHABET + "<>!"
    instructions = ("Guess my secret number in the range below. Reply with one number per turn and nothing else. I "
                    "answer > if my number is higher, < if it is lower, = when you have found it, ! if your reply is "
                    "not a number in the range.")

    def __init__(self, low: int = 1, high: int = 1024, max_turns: int = 13, turn_cost: float = 0.05,
                 split_seed: int = 0):
        super().__init__(split_seed)
        if not 0 <= low < high < 10 ** 6:
            raise ValueError(f"need 0 <= low < high < 10**6, got low={low}, high={high}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.low, self.high, self.max_turns, self.turn_cost = low, high, max_turns, float(turn_cost)
        self.digits = render.max_digits(high)
        self.prompt_length = 1 + 2 * self.digits + 2
        self.turn_length, self.observation_length = self.digits + 1, 1

    def _propose(self, key, n, level=None):
        secret = jax.random.randint(key, (n,), self.low, self.high + 1)
        return Problems(secret[:, None], secret, jnp.zeros((n, 0, 3), jnp.int32)), jnp.ones(n, bool)

    def sample(self, key, batch: int, split: str, level=None) -> Problems:
        """`batch` secrets drawn uniformly from [low, high] for either split. The secret is what an episode
        discovers, never shown to the model, so no secret is an unseen problem: holding some out (as the other
        tasks hold out their shown problems) would only keep the model from ever writing those numbers as a final
        guess. A held-out evaluation is episodes on a fixed draw (`heldout`), from keys training never uses."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self._propose(jax.random.fold_in(key, SPLITS.index(split)), batch, level)[0]

    def _prompt_pieces(self, problem, vocab):
        return [render.number(self.low, self.digits, vocab), render.char("-", vocab),
                render.number(self.high, self.digits, vocab), render.char("=", vocab)]

    def _anchor(self, lo, hi):
        return (lo * (self.high + 1) + hi).astype(jnp.int32)

    def start(self, problem):
        lo, hi = jnp.int32(self.low), jnp.int32(self.high)
        return (lo, hi), self._anchor(lo, hi)

    def respond(self, problem, state, turn, turn_index, vocab):
        lo, hi = state
        guess, ok = _parse_number(turn, 0, vocab, self.digits)
        ok = ok & (guess >= self.low) & (guess <= self.high)
        secret = problem.target
        found = ok & (guess == secret)
        higher = ok & (secret > guess)
        lo = jnp.where(higher, jnp.maximum(lo, guess + 1), lo)
        hi = jnp.where(ok & (secret < guess), jnp.minimum(hi, guess - 1), hi)
        mark = jnp.select([~ok, found, higher], [vocab.id_of(ERROR), vocab.id_of("="), vocab.id_of(">")],
                          vocab.id_of("<"))
        observation, length = self._observe([render.token(mark)], vocab)
        no = jnp.bool_(False)
        return Reply((lo, hi), observation, length, jnp.where(found, _discounted(turn_index, self.turn_cost), 0.0),
                     found, ok, no, no, found, self._anchor(lo, hi))

    def demonstrate(self, problem, state, turn_index, vocab):
        lo, hi = state
        return render.number((lo + hi) // 2, self.digits, vocab)


# ---------------------------------------------------------------------------------------------------------------
# Tools: calculator calls and table lookups, then an answer


class ToolTask(MultiTurnTask):
    """A task answered by a final turn, after any number of tool calls: `#<expression>` asks the calculator (the
    answer is the exact value, `-7/2` or `15`), `@<key>` looks a letter up in the problem's table (its value);
    anything else is the final answer, which ends the episode. A malformed or failing call is answered `!`.
    Subclasses give `_check` (is the final answer right) and `_lookup_table`, and choose the tools."""

    calculator = True
    lookup = False

    def _tool_reply(self, problem, turn, vocab):
        """((observation, its length), tool_call, tool_error, the call's body after its mark (ids [T], length), the
        body's Calculation) of a turn that calls a tool."""
        length, _ = render.before_eos(turn, vocab.eos_id)
        body = jnp.where(jnp.arange(turn.shape[0]) < length - 1, jnp.roll(turn, -1), vocab.pad_id)
        error_piece = render.char(ERROR, vocab)
        no = jnp.bool_(False)
        calc_call = _starts_with(turn, CALCULATOR, vocab) if self.calculator else no
        calc = tools.calculator(body, length - 1, vocab)
        calc_piece = tools.render_value(calc, self.observation_length, vocab)
        lookup_call = _starts_with(turn, LOOKUP, vocab) if self.lookup else no
        table = self._lookup_table(problem)
        keys = jnp.asarray(vocab.ids_of(_KEYS[:table.shape[0]])) if self.lookup else jnp.full(table.shape, -1)
        letter = jnp.sum(jnp.where(body[0] == keys, jnp.arange(table.shape[0]) + 1, 0)) - 1
        lookup_ok = (letter >= 0) & (length == 2)
        lookup_piece = render.number(table[jnp.maximum(letter, 0)], self.observation_length, vocab)
        fits = calc_piece[1] <= self.observation_length  # (a longer value would be cut: an error instead)
        ok = jnp.where(calc_call, ~calc.error & fits, lookup_ok)
        piece = jax.tree.map(lambda a, b, e: jnp.where(ok, jnp.where(calc_call, a, b), e),
                             calc_piece, lookup_piece, (jnp.pad(error_piece[0], (0, self.observation_length - 1),
                                                                constant_values=vocab.pad_id), error_piece[1]))
        return piece, calc_call | lookup_call, (calc_call | lookup_call) & ~ok, (body, jnp.maximum(length - 1, 0)), calc

    def _lookup_table(self, problem) -> jax.Array:
        return jnp.zeros((1,), jnp.int32)

    def _check(self, problem, turn, vocab) -> tuple[jax.Array, jax.Array]:
        """(correct, well_formed) of a final answer turn."""
        raise NotImplementedError

    def start(self, problem):
        return jnp.int32(0), jnp.int32(0)

    def _next_state(self, problem, state, call, error, body, calc):
        """The state after a turn (`call`, `error`: it called a tool, and failed; `body`: the call's (ids, length),
        `calc`: their Calculation). Default: the tool calls so far."""
        return state + call

    def _calls(self, state) -> jax.Array:
        """The tool calls so far in `state`: the anchor (the state an answer is given in)."""
        return state

    def respond(self, problem, state, turn, turn_index, vocab):
        (observation, obs_length), call, error, body, calc = self._tool_reply(problem, turn, vocab)
        correct, well_formed = self._check(problem, turn, vocab)
        answered = ~call
        observation = jnp.where(answered, jnp.full_like(observation, vocab.pad_id).at[0].set(
            vocab.id_of("=") * correct + vocab.id_of(ERROR) * ~correct), observation)
        obs_length = jnp.where(answered, 1, obs_length)
        state = self._next_state(problem, state, call, error, body, calc)
        return Reply(state, observation, obs_length, (answered & correct).astype(jnp.float32), answered,
                     jnp.where(call, ~error, well_formed), call, error, answered & correct, self._calls(state))


_KEYS = "abcdefghij"


class CountdownTools(ToolTask):
    """Countdown (`envs.text.tasks.Countdown`: its problems, prompt and rule) with a calculator: `#3*5+1` is
    answered `16`; a turn without `#` is the final expression. `calculator=False` leaves only the answer (a call
    is then an ill-formed answer). The demonstrator searches: it checks candidates until one hits the target,
    then answers it; the checks that missed are shown, not imitated (`imitated_turns`), unless `imitate_misses`."""

    name = "countdown_tools"
    alphabet = ALPHABET + CALCULATOR + ERROR
    instructions = ("Reach the target (after >) with the given numbers, each at most once, and + - * / with "
                    "parentheses. To check an expression, reply # and the expression: I answer its value. Your "
                    "final reply is the expression alone.")

    def __init__(self, num_numbers: int = 4, min_number: int = 1, max_number: int = 25, min_target: int = 1,
                 max_target: int = 100, use_all: bool = False, max_turns: int = 4, calculator: bool = True,
                 imitate_misses: bool = False, miss_share: float = 0.5, split_seed: int = 0):
        super().__init__(split_seed)
        if not 0.0 <= miss_share <= 1.0:
            raise ValueError(f"miss_share must be in [0, 1], got {miss_share}")
        self.base = Countdown(num_numbers, min_number, max_number, min_target, max_target, use_all, split_seed)
        self.max_turns, self.calculator, self.imitate_misses = max_turns, bool(calculator), bool(imitate_misses)
        self.miss_share = float(miss_share) if max_turns > 2 else 0.0  # (one check: the reference)
        self.prompt_length = self.base.prompt_length
        self.turn_length = 1 + self.base.expression_length + 1
        self.observation_length = tools.value_width(max_number ** num_numbers + 1)

    def _check(self, problem, turn, vocab):
        return countdown_answer(problem, turn, vocab, self.base.use_all)

    def start(self, problem):
        """State: (tool calls so far, whether the last check's expression is a right answer, that expression as a
        piece (ids [T], length)); anchor: the calls."""
        return (jnp.int32(0), jnp.bool_(False), jnp.zeros((self.turn_length,), jnp.int32), jnp.int32(0)), jnp.int32(0)

    def _next_state(self, problem, state, call, error, body, calc):
        hit = call & ~error & countdown_right(problem, calc, self.base.use_all)  # (the check, answered, is right)
        return (state[0] + call, hit, *body)

    def _calls(self, state):
        return state[0]

    def demonstrate(self, problem, state, turn_index, vocab):
        """Without the calculator, the reference expression. With it, a search: the demonstration checks candidate
        expressions until one's value is the target, then answers that one. Candidates are the reference with its
        operators redrawn (by the problem's hash), and the reference itself: first, except on `miss_share` of the
        problems, where it is drawn uniformly among the later max_turns - 2 checks; the rule shown is the one a
        learner can follow: answer exactly when the check hit. (`miss_share` = (K - 2) / (K - 1) draws the
        reference's place uniformly among all K - 1 checks.) After a learner's checks (a roll-in: more calls than
        the demonstrator's own turns), the same rule: a check that hit is answered, a miss is followed by a check
        of the reference; with no check left, the answer."""
        reference = self.base._answer_pieces(problem, vocab)[0]
        if not self.calculator or self.max_turns == 1:
            return reference
        calls, hit, last_ids, last_length = state
        candidates = self._candidates(problem, vocab)  # (ids [K, L], lengths [K])
        calcs = jax.vmap(lambda ids, length: tools.calculator(ids, length, vocab))(*candidates)
        # (the reference in place of a candidate that fails: 3/(2-2))
        candidates = jax.tree.map(lambda c, r: jnp.where(calcs.error.reshape(-1, *[1] * r.ndim), r, c),
                                  candidates, reference)
        hits = calcs.error | _reaches(calcs, problem.target)
        first_hit = jnp.argmax(hits)  # the reference always hits, so some candidate does
        own = jax.tree.map(lambda a: a[jnp.minimum(turn_index, first_hit)], candidates)
        rolled_in = calls > turn_index
        check = render.concat([render.char(CALCULATOR, vocab),
                               jax.tree.map(lambda r, o: jnp.where(rolled_in, r, o), reference, own)],
                              self.turn_length, vocab.pad_id)
        answer = jax.tree.map(lambda last, r: jnp.where(hit, last, r), (last_ids, last_length),
                              render.widen(reference, self.turn_length, vocab.pad_id))
        return jax.tree.map(lambda c, a: jnp.where(hit | (calls >= self.max_turns - 1), a, c), check, answer)

    def imitated_turns(self, played):
        """The checks before the hit are not imitated unless `imitate_misses`: a learner checks its best guess first
        (as the answer alone would be), and learns from the shown misses only what to do after one. Imitated, the
        misses (operators redrawn at random) would teach a wrong first guess. A search ends with the check that hit
        and the answer, so the misses are the turns before its last two (an answer alone has none)."""
        if self.imitate_misses:
            return played
        return played & (jnp.arange(self.max_turns) >= played.sum(-1, keepdims=True) - 2)

    def _candidates(self, problem, vocab) -> Piece:
        """The demonstration's max_turns - 1 candidate expressions (ids [K, expression_length], lengths [K]): the
        reference at a drawn position (`demonstrate`), and distinct redrawings of its operators elsewhere (each adds
        a different nonzero base-4 offset to the operator codes)."""
        checks, steps = self.max_turns - 1, problem.recipe.shape[0]
        codes = 4 ** steps - 1  # the nonzero offsets
        missed_first = split_hash(problem, self.split_seed + 3) % 1000 < 1000 * self.miss_share
        reference_at = jnp.where(missed_first, 1 + split_hash(problem, self.split_seed + 1) % max(checks - 1, 1), 0)
        first_offset = split_hash(problem, self.split_seed + 2) % codes
        pieces = []
        for k in range(checks):
            offset = 1 + (first_offset + k - (k > reference_at)) % codes
            digits = (offset >> (2 * jnp.arange(steps, dtype=jnp.uint32))) % 4
            ops = (problem.recipe[:, 2] + digits.astype(problem.recipe.dtype)) % 4
            recipe = jnp.where(reference_at == k, problem.recipe, problem.recipe.at[:, 2].set(ops))
            pieces.append(self.base._answer_pieces(problem.replace(recipe=recipe), vocab)[0])
        return jax.tree.map(lambda *xs: jnp.stack(xs), *pieces)


def _reaches(calc: tools.Calculation, target: jax.Array) -> jax.Array:
    """The expression is well formed and its value is the integer target."""
    return ~calc.error & (calc.denominator == 1) & (calc.numerator == target)


def countdown_answer(problem: Problems, turn: jax.Array, vocab: Vocab, use_all: bool = False):
    """(right, well_formed) of a turn [T] answering a Countdown problem with an expression (its text before EOS):
    it reaches the target by the rule (`tools.uses_given_numbers`), and it parses."""
    length, _ = render.before_eos(turn, vocab.eos_id)
    calc = tools.calculator(turn, length, vocab)
    return countdown_right(problem, calc, use_all), ~calc.error


def countdown_right(problem: Problems, calc: tools.Calculation, use_all: bool = False) -> jax.Array:
    """An expression's Calculation answers the Countdown problem: it reaches the target by the rule."""
    return _reaches(calc, problem.target) & tools.uses_given_numbers(calc, problem.numbers, use_all)


class Lookup(ToolTask):
    """A question about a table of `num_keys` letters whose values only the lookup tool reveals: the prompt
    `a*c=` asks for value(a) * value(c). Tools: `@a` (answered with a's value) and the calculator; the final
    answer is a number. The demonstrator looks both keys up, computes with the calculator and answers."""

    name = "lookup"
    lookup = True
    alphabet = ALPHABET + CALCULATOR + LOOKUP + ERROR + _KEYS
    instructions = ("Answer the question about a table of letters. Reply @ and a letter to read its value, # and an "
                    "expression to compute it; your final reply is the number alone.")

    def __init__(self, num_keys: int = 6, max_value: int = 20, ops: str = "+*", max_turns: int = 6,
                 split_seed: int = 0):
        super().__init__(split_seed)
        if not 2 <= num_keys <= len(_KEYS):
            raise ValueError(f"num_keys must be in 2..{len(_KEYS)}, got {num_keys}")
        if not ops or any(op not in "+-*" for op in ops):
            raise ValueError(f"ops must be some of '+-*', got {ops!r}")
        self.num_keys, self.max_value, self.ops, self.max_turns = num_keys, max_value, ops, max_turns
        self.value_digits = render.max_digits(max_value)
        self.answer_digits = render.max_digits(max_value * max_value)
        self.prompt_length = 1 + 4
        self.turn_length = 1 + 2 * self.value_digits + 1 + 1
        self.turn_length = max(self.turn_length, self.answer_digits + 2)
        self.observation_length = tools.value_width(max_value * max_value + 1)

    def _propose(self, key, n, level=None):
        k_values, k_keys, k_op = jax.random.split(key, 3)
        values = jax.random.randint(k_values, (n, self.num_keys), 0, self.max_value + 1)
        keys = jax.vmap(lambda k: jax.random.choice(k, self.num_keys, (2,), replace=False))(
            jax.random.split(k_keys, n))
        op = jnp.asarray(np.array(["+-*".index(o) for o in self.ops]))[
            jax.random.randint(k_op, (n,), 0, len(self.ops))]
        a, b = (jnp.take_along_axis(values, keys[:, i:i + 1], 1)[:, 0] for i in range(2))
        target = jnp.select([op == 0, op == 1], [a + b, a - b], a * b)
        recipe = jnp.stack([keys[:, 0], keys[:, 1], op], axis=-1)[:, None]
        return Problems(values, target, recipe), target >= 0

    def _lookup_table(self, problem):
        return problem.numbers

    def _prompt_pieces(self, problem, vocab):
        i, j, op = problem.recipe[0]
        keys = jnp.asarray(vocab.ids_of(_KEYS))
        return [render.token(keys[i]), render.token(jnp.asarray(vocab.ids_of("+-*/"))[op]), render.token(keys[j]),
                render.char("=", vocab)]

    def _check(self, problem, turn, vocab):
        value, ok = _parse_number(turn, 0, vocab, self.answer_digits)
        return ok & (value == problem.target), ok

    def demonstrate(self, problem, state, turn_index, vocab):
        i, j, op = problem.recipe[0]
        keys = jnp.asarray(vocab.ids_of(_KEYS))
        width = self.turn_length
        look = lambda key: render.concat([render.char(LOOKUP, vocab), render.token(key)], width, vocab.pad_id)  # noqa
        a, b = problem.numbers[i], problem.numbers[j]
        compute = render.concat([render.char(CALCULATOR, vocab), render.number(a, self.value_digits, vocab),
                                 render.token(jnp.asarray(vocab.ids_of("+-*/"))[op]),
                                 render.number(b, self.value_digits, vocab)], width, vocab.pad_id)
        answer = render.widen(render.number(problem.target, self.answer_digits, vocab), width, vocab.pad_id)
        choices = [look(keys[i]), look(keys[j]), compute, answer]
        step = jnp.minimum(state, 3)
        return jax.tree.map(lambda *xs: jnp.stack(xs)[step], *choices)


# ---------------------------------------------------------------------------------------------------------------
# Self-correction: arithmetic with "wrong, try again"


class Retry(MultiTurnTask):
    """An arithmetic problem (`addition` or `multiplication`) answered over up to `max_turns` tries: a wrong or
    ill-formed answer is told `!` and may be corrected; a right one is told `=` and ends the episode, earning
    1 - turn_cost (k - 1) at try k. The demonstrator answers right at once."""

    name = "retry"
    alphabet = ALPHABET + ERROR
    instructions = "Reply with the result, a number alone. I answer = if it is right, ! if it is wrong: try again."

    def __init__(self, op: str = "+", min_digits: int = 1, max_digits: int = 3, max_turns: int = 3,
                 turn_cost: float = 0.3, split_seed: int = 0):
        super().__init__(split_seed)
        make = {"+": addition, "*": multiplication}
        if op not in make:
            raise ValueError(f"op must be '+' or '*', got {op!r}")
        self.base = make[op](min_digits, max_digits, split_seed)
        self.op, self.max_turns, self.turn_cost = op, max_turns, float(turn_cost)
        self.prompt_length = self.base.prompt_length
        self.turn_length, self.observation_length = self.base.answer_length, 1

    def start(self, problem):
        return jnp.int32(0), jnp.int32(0)

    def respond(self, problem, state, turn, turn_index, vocab):
        correct, well_formed = self.base.rewards(problem, turn, vocab) > 0
        mark = jnp.where(correct, vocab.id_of("="), vocab.id_of(ERROR))
        observation, length = self._observe([render.token(mark)], vocab)
        no = jnp.bool_(False)
        return Reply(state + 1, observation, length,
                     jnp.where(correct, _discounted(turn_index, self.turn_cost), 0.0), correct, well_formed, no, no,
                     correct, state + 1)

    def demonstrate(self, problem, state, turn_index, vocab):
        return self.base._answer_pieces(problem, vocab)[0]


# ---------------------------------------------------------------------------------------------------------------
# A grid world through tokens


_MOVES = "udlr"
_STEPS = np.array([[0, 1], [0, -1], [-1, 0], [1, 0]], np.int32)  # (dx, dy) of u d l r


class GridWorld(MultiTurnTask):
    """A `size` x `size` grid: the prompt `xy>XY=` gives the agent's cell and the goal's (digits); each turn is one
    move `u`, `d`, `l` or `r` (up is +y); the answer is the agent's new cell `xy` (a move into the border leaves it
    where it is), or `!` for anything but a move. Reaching the goal at move k earns 1 - turn_cost (k - 1) and
    ends the episode. State and anchor: the agent's cell. The demonstrator walks along x, then along y."""

    name = "grid"
    alphabet = ALPHABET + _MOVES + ERROR
    instructions = ("Walk on a grid from your cell to the goal (x then y digits: yours > the goal's). Reply one move "
                    "per turn: u (y+1), d (y-1), l (x-1) or r (x+1); I answer your new cell.")

    def __init__(self, size: int = 5, max_turns: int = 12, turn_cost: float = 0.05, split_seed: int = 0):
        super().__init__(split_seed)
        if not 2 <= size <= 10:
            raise ValueError(f"size must be in 2..10, got {size}")
        self.size, self.max_turns, self.turn_cost = size, max_turns, float(turn_cost)
        self.prompt_length = 1 + 6
        self.turn_length, self.observation_length = 2, 2

    def _propose(self, key, n, level=None):
        cells = jax.random.randint(key, (n, 4), 0, self.size)
        valid = jnp.any(cells[:, :2] != cells[:, 2:], axis=1)
        return Problems(cells, cells[:, 2] * self.size + cells[:, 3], jnp.zeros((n, 0, 3), jnp.int32)), valid

    def difficulty(self, problems):
        distance = jnp.abs(problems.numbers[:, :2] - problems.numbers[:, 2:]).sum(-1)
        return jnp.clip((distance - 1) / max(2 * (self.size - 1) - 1, 1), 0.0, 1.0).astype(jnp.float32)

    def _cell(self, xy, vocab):
        return [render.token(vocab.digit_ids[xy[0]]), render.token(vocab.digit_ids[xy[1]])]

    def _prompt_pieces(self, problem, vocab):
        x = problem.numbers
        return [*self._cell(x[:2], vocab), render.char(">", vocab), *self._cell(x[2:], vocab), render.char("=", vocab)]

    def start(self, problem):
        xy = problem.numbers[:2]
        return xy, xy[0] * self.size + xy[1]

    def respond(self, problem, state, turn, turn_index, vocab):
        move = jnp.argmax(turn[0] == jnp.asarray(vocab.ids_of(_MOVES)))
        ok = jnp.any(turn[0] == jnp.asarray(vocab.ids_of(_MOVES))) & (turn[1] == vocab.eos_id)
        xy = jnp.where(ok, jnp.clip(state + jnp.asarray(_STEPS)[move], 0, self.size - 1), state)
        reached = jnp.all(xy == problem.numbers[2:])
        cell = render.concat(self._cell(xy, vocab), 2, vocab.pad_id)
        error = render.concat([render.char(ERROR, vocab)], 2, vocab.pad_id)
        observation, length = jax.tree.map(lambda a, b: jnp.where(ok, a, b), cell, error)
        no = jnp.bool_(False)
        return Reply(xy, observation, length, jnp.where(reached, _discounted(turn_index, self.turn_cost), 0.0),
                     reached, ok, no, no, reached, xy[0] * self.size + xy[1])

    def demonstrate(self, problem, state, turn_index, vocab):
        dx, dy = problem.numbers[2] - state[0], problem.numbers[3] - state[1]
        move = jnp.select([dx > 0, dx < 0, dy > 0], [3, 2, 0], 1)
        return render.token(jnp.asarray(vocab.ids_of(_MOVES))[move])


MULTI_TURN_TASKS = {"guess": GuessNumber, "countdown_tools": CountdownTools, "lookup": Lookup, "retry": Retry,
                    "grid": GridWorld}
TASKS.update(MULTI_TURN_TASKS)
