"""Critique-guided refinement: one model in two roles within one episode (CTRL, Xie et al. 2025; Critique-GRPO,
Zhang et al. 2025). The actor answers, the critic judges the answer, the actor revises:

    7 1 18>25=  7-1+18|?  18N|!  7+1*18|=
    prompt      answer    critique (value, verdict)   revision (and the environment's last word: = right, ! wrong)

`countdown_refine` turns, each ended by EOS (`|` above) and answered by one environment token:
- turn 0, the actor: an expression, answered `?` (the critic's turn);
- turn 1, the critic: the answer's value and a verdict, Y (it reaches the target by the rules) or N, answered `!`
  (revise); with `critic=False` there is no such turn (revision without a critique, the baseline). With
  `critique_by="calculator"` the critic calls the calculator (CRITIC, Gou et al. 2024: tool-interactive critiquing):
  the environment writes the answer's value after `?` (`?=6`; nothing where it is no expression), and the critic's
  turn is its verdict alone;
- the last turn, the actor again: the revised (or repeated) expression, which ends the episode.

Each turn's reward is its role's (`credit`), so turn-level advantages with no discount between turns
(`advantage.estimator=turn_grpo`, `advantage.turn_gamma=0`) train each role on its own reward, against the
group's same turn:
- the actor's turns: whether that answer is right (the revision's is the episode's success);
- the critic's turn (`critic_reward`): `revision` (CTRL: whether the revision after its critique is right), or
  `verdict` (critique RL, J1: whether its verdict is right, the task's verifier knowing).

The demonstrator (for a supervised warm start) answers with a candidate that is wrong on about `wrong_share` of
problems (the reference with its operators redrawn: `countdown_judge`'s candidates), critiques it truthfully and
revises to the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.text import render, tools
from envs.text.judge import CRITICS, CRITIQUE_MAGNITUDE, OPENING, VERDICTS, CountdownJudge, critique_value
from envs.text.tasks import TASKS
from envs.text.tokenizer import ALPHABET, Vocab
from envs.text.turns import ERROR, MULTI_TURN_TASKS, MultiTurnTask, Reply, countdown_answer

CRITIQUE, REVISE = "?", ERROR  # the environment's cues for the critic's turn and the revision
CRITIC_REWARDS = ("revision", "verdict")


class CountdownRefine(MultiTurnTask):
    """Countdown answered, critiqued and revised in one episode (see the module docstring)."""

    name = "countdown_refine"
    alphabet = ALPHABET + CRITIQUE + REVISE + VERDICTS
    roles = ("actor", "critic", "actor")
    instructions = ("Reach the target (after >) with the given numbers, each at most once, and + - * / with "
                    "parentheses. After ?, judge the last answer: its value, then Y if it is right or N. After !, "
                    "give your final expression.")

    def __init__(self, num_numbers: int = 3, min_number: int = 1, max_number: int = 25, min_target: int = 1,
                 max_target: int = 100, critic: bool = True, critic_reward: str = "revision",
                 critique_by: str = "model", wrong_share: float = 0.5, split_seed: int = 0):
        super().__init__(split_seed)
        if critic_reward not in CRITIC_REWARDS:
            raise ValueError(f"critic_reward must be one of {', '.join(CRITIC_REWARDS)}, got {critic_reward!r}")
        if critique_by not in CRITICS:
            raise ValueError(f"critique_by must be one of {', '.join(CRITICS)}, got {critique_by!r}")
        if critique_by != "model" and not critic:
            raise ValueError(f"critique_by={critique_by!r} writes the critic's value: there is no critic's turn "
                             "with critic=False")
        self.judge = CountdownJudge(num_numbers, min_number, max_number, min_target, max_target,
                                    wrong_share=wrong_share, split_seed=split_seed)
        self.base = self.judge.base
        self.critic, self.critic_reward, self.critique_by = bool(critic), critic_reward, critique_by
        self.roles = type(self).roles if self.critic else ("actor", "actor")
        self.max_turns = len(self.roles)
        self.value_width = tools.value_width(CRITIQUE_MAGNITUDE)
        self.prompt_length = self.base.prompt_length
        self.turn_length = max(self.base.expression_length, self.value_width + 1) + 1
        # the cue, and with the calculator's critique "=" and the first answer's value after it
        self.observation_length = 1 + (1 + self.value_width) * self.tool_critique

    @property
    def tool_critique(self) -> bool:
        """Whether the calculator writes the critique's value (the critic only its verdict)."""
        return self.critique_by == "calculator"

    @property
    def critic_turn(self) -> int:
        """The critic's turn (-1: none)."""
        return self.roles.index("critic") if self.critic else -1

    def start(self, problem):
        return jnp.bool_(False), jnp.int32(0)  # (whether the first answer was right), anchor

    def _verdict(self, turn, first_right, vocab: Vocab):
        """(right, well_formed) of a critique turn: its last token before EOS is Y or N, and Y exactly when the
        first answer was right."""
        length, ended = render.before_eos(turn, vocab.eos_id)
        said = turn[jnp.maximum(length - 1, 0)]
        said_right, said_wrong = said == vocab.id_of(VERDICTS[0]), said == vocab.id_of(VERDICTS[1])
        formed = ended & (length > 0) & (said_right | said_wrong)
        return formed & (said_right == first_right), formed

    def respond(self, problem, state, turn, turn_index, vocab):
        right, formed = countdown_answer(problem, turn, vocab, self.base.use_all)
        verdict_right, verdict_formed = self._verdict(turn, state, vocab)
        critiquing = turn_index == self.critic_turn
        last = turn_index == self.max_turns - 1
        reward = jnp.where(critiquing, verdict_right & (self.critic_reward == "verdict"), right)
        cue = jnp.where(last, jnp.where(right, vocab.id_of("="), vocab.id_of(ERROR)),
                        jnp.where((turn_index == 0) & self.critic, vocab.id_of(CRITIQUE), vocab.id_of(REVISE)))
        observation, length = self._observe([render.token(cue), *self._tool_value(turn, turn_index, vocab)], vocab)
        no = jnp.bool_(False)
        return Reply(jnp.where(turn_index == 0, right, state), observation, length, reward.astype(jnp.float32),
                     last, jnp.where(critiquing, verdict_formed, formed), no, no, last & right,
                     jnp.asarray(turn_index + 1, jnp.int32))

    def _tool_value(self, turn, turn_index, vocab: Vocab) -> list:
        """With the calculator's critique, after the first answer: "=" and its value (`judge.critique_value`;
        nothing where the answer is no expression or its value is out of range); else nothing."""
        if not self.tool_critique:
            return []
        ids, length = critique_value(turn, vocab)
        written = (turn_index == 0) & (length > 0)
        return [render.char(OPENING, vocab, written), (ids, jnp.where(written, length, 0))]

    def credit(self, turns: dict) -> dict:
        """CTRL's critic reward: the critic's turn earns the revision's success (known one turn later)."""
        if not (self.critic and self.critic_reward == "revision"):
            return turns
        revised = (turns["solved"][..., -1] & turns["taken"][..., 1]).astype(turns["reward"].dtype)
        return {**turns, "reward": turns["reward"].at[..., 1].set(revised)}

    def demonstrate(self, problem, state, turn_index, vocab):
        width = self.turn_length
        candidate = render.widen(self.judge.candidate(problem, vocab), width, vocab.pad_id)
        value, verdict = self.judge._answer_pieces(problem, vocab)  # the candidate's value and its verdict
        critique = render.concat([verdict] if self.tool_critique else [value, verdict], width, vocab.pad_id)
        reference = render.widen(self.base._answer_pieces(problem, vocab)[0], width, vocab.pad_id)
        pick = [candidate, critique, reference] if self.critic else [candidate, reference]
        return jax.tree.map(lambda *xs: jnp.stack(xs)[jnp.asarray(turn_index)], *pick)


MULTI_TURN_TASKS[CountdownRefine.name] = CountdownRefine
TASKS[CountdownRefine.name] = CountdownRefine
