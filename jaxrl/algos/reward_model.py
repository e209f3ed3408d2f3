"""Reward models trained from outcome labels (`text_reward_model`), on the small transformer or a pretrained model.

A run starts from a policy's run (`init_from`: an SFT or GRPO run, or a pretrained model) and keeps two copies of
it: the *sampler*, frozen, which draws G completions per training problem, and the *reward model*, the same
weights with a fresh value head, which learns to score them (`jaxrl.reward_models`). With `reward_model.sampler`,
the sampler is that run's policy instead, and the reward model starts from `init_from` or, without one, from
scratch at config.model's sizes (reading the sampler's tokenizer). One update, per seed:

    B training problems -> G completions each from the sampler (at sampling.temperature, in evaluation too)
    -> labels: 1 where the task's verifier accepts the completion (process models: Monte Carlo labels per step)
    -> scores (`reward_models.Scorer`; a generative model first writes its critique after each completion, greedy)
    -> the objective (`reward_model.objective`) -> Adam on the reward model

Both copies live in the parameters, {"params": reward model, "sampler": sampler}; the optimiser leaves the sampler
alone. Evaluation draws G completions for each of a fixed set of held-out problems and reports how the scores
order them: eval_ranking_accuracy (correct above incorrect, pairs of one problem's completions), eval_label_accuracy
(sigmoid(score) > 1/2 where the verifier accepts), eval_best_of_n (the verifier's verdict on the top-scored
completion), eval_sampled_accuracy (on a random one) and eval_pass@n (on the best one: the ceiling of reranking).
A GRPO run uses the trained model as its reward with `reward.model=<this run's directory>`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections import ConfigDict

from envs import text
from envs.text.judge import CRITICS
from jaxrl import engine, files, knobs, mesh as mesh_lib, reward_models, sampling
from jaxrl.algos import registry
from jaxrl.algos.group import GROUP_SIZE
from jaxrl.algos.registry import Recipe, register
from jaxrl.algos.text.policy import (INIT_FROM, TextHyperparams, TextPolicy, TextSettings, TextState,
                                     check_text_config, scorer_settings, text_algorithm, text_config,
                                     text_settings)
from jaxrl.engine import gradient_step
from jaxrl.jitting import jit_method
from jaxrl.knobs import Knob
from jaxrl.reward_models import scoring
from jaxrl.mesh import DATA_AXIS

OBJECTIVE = Knob("reward_model.objective", "pairwise", "how the reward model learns from outcome labels: pairwise "
                 "(Bradley-Terry on each prompt's correct and incorrect completions), pointwise (cross-entropy), "
                 "implicit (PRIME: the score is beta * the log-ratio of the model to the sampler; cross-entropy), "
                 "process (step values against Monte Carlo labels) or generative (a critique, then the verdict)",
                 choices=reward_models.OBJECTIVES)
BETA = Knob("reward_model.beta", 0.05, "implicit reward models: the log-ratio's scale", above=0.0)
SAMPLER = Knob("reward_model.sampler", "", "the text run (SFT or GRPO) whose completions the reward model learns to "
               "judge; '': init_from, whose weights the reward model then also starts from")
CRITIQUE_WEIGHT = Knob("reward_model.critique_weight", 1.0, "generative reward models: the critique's cross-entropy "
                       "beside the verdict's", minimum=0.0)
CRITIQUE_BY = Knob("reward_model.critique_by", "model", "generative reward models: who writes the critique (the "
                   "completion's value): model (the reward model, taught by the task's calculator) or calculator (the "
                   "calculator as a tool the verifier calls, as in CRITIC; only the verdict is learned)",
                   choices=CRITICS)
STEP_SCORE = Knob("reward_model.step_score", "min", "process reward models: how a completion's score is made from "
                  "its steps' values: min (Math-Shepherd: the weakest step), product (PRM800K: the product of the "
                  "steps' probabilities) or last (the last step's)", choices=reward_models.STEP_SCORES)
STEP_LOSS = Knob("reward_model.step_loss", "pointwise", "process reward models: how step values learn their Monte "
                 "Carlo labels: pointwise (Math-Shepherd: each step's cross-entropy) or pairwise (Bradley-Terry over "
                 "every two steps of a prompt's completions)", choices=reward_models.STEP_LOSSES)
STEP_LABEL = Knob("reward_model.step_label", "soft", "process reward models: a step's label: from its Monte Carlo "
                  "continuations, soft (Math-Shepherd's soft estimate: the share that end right) or hard (its hard "
                  "estimate: 1 where any does); or checked (PRM800K's: the task's verifier checks each step, 1 up to "
                  "the first wrong one; no continuations drawn)", choices=reward_models.STEP_LABELS)
LIKELIHOOD_WEIGHT = Knob("reward_model.likelihood_weight", 0.0, "pairwise, pointwise and process models: the weight "
                         "of the model's own log-likelihood of the tokens read so far, added to the value head's "
                         "output at every slot (`reward_models.with_likelihood`): a judge that starts as the "
                         "sampler's likelihood and learns from there; 0: the value head alone", minimum=0.0)
JUDGE_LAYERS = Knob("reward_model.judge_layers", 0, "pairwise, pointwise and process models on the small transformer: "
                    "blocks stacked over the policy body that the value head reads through, each slot also given how "
                    "likely the body found the token it reads (its log-probability, its gap below the most likely "
                    "token's, the entropy: `transformer.read_surprise`), so that a later layer can compare a written "
                    "token with the one predicted; 0: the value head on the body's last layer", minimum=0)
CONTINUATIONS = Knob("reward_model.continuations", 4, "process reward models: continuations sampled from each step's "
                     "prefix for its Monte Carlo label", minimum=1)


@dataclasses.dataclass(frozen=True)
class RewardModelSettings:
    """Static choices: the model and optimiser (`text`), completions per problem and the objective."""

    text: TextSettings
    group_size: int = GROUP_SIZE.field()
    objective: str = OBJECTIVE.field()
    sampler: str = SAMPLER.field()
    beta: float = BETA.field()
    continuations: int = CONTINUATIONS.field()
    critique_weight: float = CRITIQUE_WEIGHT.field()
    critique_by: str = CRITIQUE_BY.field()
    step_score: str = STEP_SCORE.field()
    step_loss: str = STEP_LOSS.field()
    step_label: str = STEP_LABEL.field()
    likelihood_weight: float = LIKELIHOOD_WEIGHT.field()
    judge_layers: int = JUDGE_LAYERS.field()
    temperature: float = knobs.declared("sampling.temperature").field()  # the sampler's, in training and evaluation

    @property
    def batch_size(self) -> int:
        """Completions labelled per update, over all devices (B problems x G)."""
        return self.text.num_prompts * self.group_size

    num_updates = property(lambda self: self.text.num_updates)
    xla_options = property(lambda self: self.text.xla_options)


def sampler(params) -> dict:
    """The frozen sampler's variables in a run's parameters."""
    return {"params": params["sampler"]}


class Labelled(NamedTuple):
    """One update's labelled completions: prompts [B, P] (generative models: their goal hidden); tokens, mask
    [B, G, N'] (generative models: each completion with the critique the model wrote after it); labels [B, G];
    process models: step labels and their slots [B, G, N]; generative models whose critique the model writes: the
    taught critiques (tokens, real slots, the critique's slots) [B, G, N + C] and whether the model's own matches.
    What an objective does not use is None."""

    prompts: jax.Array
    tokens: jax.Array
    mask: jax.Array
    labels: jax.Array
    step_labels: jax.Array | None = None
    step_slots: jax.Array | None = None
    taught: jax.Array | None = None
    taught_real: jax.Array | None = None
    taught_critique: jax.Array | None = None
    critique_exact: jax.Array | None = None  # bool [B, G]: the model's own critique is the taught one


def map_in_pieces(fn, rows, piece: int):
    """`fn` over pytree `rows` [n, ...] in pieces of at most `piece` rows, one piece after another (`lax.map`):
    fn(rows [piece, ...]) -> pytree [piece, ...], concatenated back to [n, ...]. The last piece is filled out with
    copies of the final row, whose results are dropped: the same values as `fn(rows)` wherever each row's result
    depends on that row alone (as a held-out problem's does on the problem and its own key)."""
    n = jax.tree.leaves(rows)[0].shape[0]
    if n <= piece:  # one piece: a plain call, not a map of one (as `mesh.over_local_runs` does, for speed)
        return fn(rows)
    pieces = -(-n // piece)
    filled = jnp.minimum(jnp.arange(pieces * piece), n - 1).reshape(pieces, piece)  # row index of each slot
    results = jax.lax.map(fn, jax.tree.map(lambda x: x[filled], rows))
    return jax.tree.map(lambda y: y.reshape(pieces * piece, *y.shape[2:])[:n], results)


def without_judge(model):
    """The sampler's side of a reward model's architecture: `model` with neither judge layers nor value head (a
    judge's values need the whole sequence, which decoding never has; the sampler only writes tokens), reading the
    same parameters (those it does not use ignored)."""
    if not getattr(model.config, "judge_layers", 0):
        return model
    return type(model)(dataclasses.replace(model.config, judge_layers=0, value_head=False))


class RewardModel:
    """The update and evaluation of one seed; `build_text_reward_model` makes its `engine.Algorithm`."""

    def __init__(self, settings: RewardModelSettings, mesh, policy: TextPolicy, sampler_policy: TextPolicy | None = None,
                 eval_seed: int = 1234):
        self.settings, self.mesh, self.policy, self.eval_seed = settings, mesh, policy, eval_seed
        self.task, self.vocab, self.model = policy.task, policy.vocab, policy.update_model
        # the sampler's architecture: the reward model's own, or that of reward_model.sampler's run
        self.sampler_policy = sampler_policy or policy
        self.sampler_model = without_judge(self.sampler_policy.update_model)
        self.decoding = dict(max_new_tokens=self.task.answer_length, eos_id=self.vocab.eos_id,
                             pad_id=self.vocab.pad_id)
        # (the update scores with each device's share of sharded parameters; evaluation with whole ones)
        self.scorer = reward_models.Scorer.of(self.model, self.task, self.vocab, settings)
        self.whole_scorer = dataclasses.replace(self.scorer, model=policy.model)

    def optimizer(self, hp, update_step):
        """The policy's optimiser on the reward model; the sampler never moves."""
        return optax.multi_transform({"train": self.policy.optimizer(hp, update_step), "frozen": optax.set_to_zero()},
                                     lambda params: {"params": "train", "sampler": "frozen"})

    def init(self, key: jax.Array, params=None, sampler=None) -> TextState:
        """A fresh state for one seed: the reward model from `params` (those of `init_from`, under a fresh value head;
        None: a fresh model), and the sampler's parameters `sampler` (reward_model.sampler's run), else the same as
        the reward model's start (a fresh model's of the sampler's shapes when there are none: what a checkpoint
        restores into)."""
        start = self.policy.init(key, params)
        if sampler is None:
            sampler = start.params if self.sampler_policy is self.policy else self.sampler_policy.init_params(
                jax.random.fold_in(key, 1))
        both = {"params": start.params["params"], "sampler": sampler["params"]}
        return TextState(both, self.optimizer(TextHyperparams(), jnp.int32(0)).init(both), start.key,
                         start.update_step)

    def labels(self, problems, completions: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """The task's verifier on completions [B, G, N]: (labels float32 [B, G], 1 where it accepts one; for a process
        model's `checked` step labels, each step's verdict bool [B, G, max_steps] from the same parse, else None)."""
        correct = self.task.reward_names.index("correct")
        per_member = lambda check: jax.vmap(lambda c: check(problems, c, self.vocab), in_axes=1, out_axes=1)  # noqa: E731
        if self.settings.objective == "process" and self.settings.step_label == "checked":
            rewards, steps = per_member(self.task.jax_checks)(completions)
        else:
            rewards, steps = per_member(self.task.jax_rewards)(completions), None
        return (rewards[..., correct] > 0).astype(jnp.float32), steps

    def draw(self, params, problems, keys: jax.Array, temperature, group_size: int):
        """The sampler's completions to `problems` [B], problem b's drawn from keys[b] (what it is, not where it is
        drawn): (prompts [B, P], `Samples` [B, G, ...], labels [B, G], step verdicts [B, G, S] or None: `labels`)."""
        prompts = self.task.prompts(problems, self.vocab)
        samples = sampling.sample_groups_per_prompt(self.sampler_model, sampler(params), prompts, keys,
                                                    group_size=group_size, temperature=temperature, **self.decoding)
        return prompts, samples, *self.labels(problems, samples.tokens)

    def loss(self, params, batch: Labelled, hp: TextHyperparams):
        prompts, tokens, mask, labels = batch.prompts, batch.tokens, batch.mask, batch.labels
        extra = {}
        if self.settings.objective == "process":  # each step's value against its Monte Carlo label
            values = self.scorer.values(scoring(params, "process"), prompts, tokens, mask)
            loss = reward_models.step_loss(values, batch.step_labels, batch.step_slots, self.settings.step_loss,
                                           axis_name=DATA_AXIS)
            scores = reward_models.step_score(values, batch.step_slots, self.settings.step_score)
        elif self.settings.objective == "generative":  # the verdict after the critique; the model's critique taught
            scores = self.scorer.verdicts(scoring(params, "generative"), prompts, tokens, mask)
            loss = verdict_loss = reward_models.pointwise_loss(scores, labels, axis_name=DATA_AXIS)
            extra = {"verdict_loss": verdict_loss}
            if self.settings.critique_by == "model":
                log_probs, _, _ = sampling.score_groups(self.model, scoring(params, "generative"), prompts,
                                                        batch.taught, batch.taught_real, self.vocab.pad_id)
                critique_loss = reward_models.critique_loss(log_probs, batch.taught_critique, axis_name=DATA_AXIS)
                loss = verdict_loss + self.settings.critique_weight * critique_loss
                extra.update(critique_loss=critique_loss, critique_exact=engine.global_mean(batch.critique_exact))
        else:
            scores = self.scorer(scoring(params, self.settings.objective), prompts, tokens, mask)
            loss = reward_models.objective_loss(self.settings.objective, scores, labels, axis_name=DATA_AXIS)
        accuracy, _ = reward_models.ranking_accuracy(scores, labels, axis_name=DATA_AXIS)
        return loss, {"loss": loss, "ranking_accuracy": accuracy,
                      "labelled_correct": engine.global_mean(labels), **extra}

    def taught_critiques(self, completions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The critiques a generative model learns to write after completions [B, G, N] (`judge.value_critique`):
        (tokens int32, real float32, critique float32: the critique's own slots), each [B, G, N + C]."""
        ids, start, total = self.scorer.calculator_critiques(completions)
        slot = jnp.arange(ids.shape[-1])
        real = slot < total[..., None]
        return ids, real.astype(jnp.float32), (real & (slot >= start[..., None])).astype(jnp.float32)

    def step_labels(self, params, problems, prompts: jax.Array, tokens: jax.Array, labels: jax.Array,
                    step_verdicts: jax.Array | None, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Labels of the steps of completions [b, G, N] (labels [b, G]: their outcomes; step_verdicts [b, G, S]:
        the verifier's on each step under `checked`, else None; both from `labels`): (labels
        float32 [b, G, N], where they are bool [b, G, N]), at each step's slot (`reward_models.step_slots`). A step
        that ends the completion is labelled by its outcome; each earlier one (the first S - 1, S the task's
        `max_steps`) by the `continuations` samples from the prefix through its separator (`step_label`: the share that
        end right, or whether any does), or by the task's verifier (`checked`: whether it and every step before it
        are right; nothing drawn).
        Continuation k of step s of completion g of problem b is drawn from keys[b] folded with (g, s, k)."""
        N = tokens.shape[-1]
        ends = self.task.step_ends(tokens, self.vocab)
        following = jnp.concatenate([tokens[..., 1:], jnp.full_like(tokens[..., :1], self.vocab.pad_id)], -1)
        final_slot = reward_models.step_slots(ends & (following == self.vocab.eos_id))
        inner = jnp.sort(jnp.where(ends & ~(following == self.vocab.eos_id), jnp.arange(N), N),
                         axis=-1)[..., :self.task.max_steps - 1]  # [b, G, S - 1]: each inner step's end; N: none
        if step_verdicts is not None:  # (`checked`; the last step's label is the outcome's)
            shares = reward_models.prefix_labels(step_verdicts)[..., :-1]
        else:
            shares = self.monte_carlo_shares(params, problems, prompts, tokens, keys, inner)
        at = (jnp.arange(N) == inner[..., None] + 1) & (inner < N)[..., None]  # [b, G, S - 1, N]: its label's slot
        inner_slot = at.any(-2)  # (no two steps share a slot)
        out = jnp.where(inner_slot, jnp.sum(jnp.where(at, shares[..., None], 0.0), axis=-2),
                        jnp.where(final_slot, labels[..., None], 0.0))
        return out, final_slot | inner_slot

    def monte_carlo_shares(self, params, problems, prompts: jax.Array, tokens: jax.Array, keys: jax.Array,
                           inner: jax.Array) -> jax.Array:
        """float32 [b, G, S - 1]: the Monte Carlo label (`step_label`) of each inner step of completions [b, G, N],
        which end at inner [b, G, S - 1] (N: no such step), from `continuations` samples after its separator."""
        b, G, N = tokens.shape
        flat = lambda x: x.reshape(b * G, *x.shape[2:])  # noqa: E731
        member_keys = flat(jax.vmap(lambda key: jax.vmap(functools.partial(jax.random.fold_in, key))(jnp.arange(G)))(
            keys))
        repeated = jax.tree.map(lambda x: jnp.repeat(x, G, axis=0), problems)
        shares = []
        for step in range(self.task.max_steps - 1):
            end = inner[..., step]
            forced_len = jnp.where(end < N, jnp.minimum(end + 2, N), 0)  # through the separator
            continued = sampling.sample_groups_per_prompt(
                self.sampler_model, sampler(params), jnp.repeat(prompts, G, axis=0),
                jax.vmap(jax.random.fold_in, (0, None))(member_keys, step), group_size=self.settings.continuations,
                temperature=self.settings.temperature, forced=flat(tokens), forced_len=flat(forced_len),
                **self.decoding)
            shares.append(reward_models.monte_carlo_labels(self.labels(repeated, continued.tokens)[0],
                                                           self.settings.step_label).reshape(b, G))
        return jnp.stack(shares, axis=-1) if shares else jnp.zeros((b, G, 0))  # (one-step answers: none inner)

    def update(self, state: TextState, hp: TextHyperparams):
        """One update for one seed on this device: label the sampler's completions to fresh problems, one step."""
        key, problem_key, sample_key = jax.random.split(state.key, 3)
        problems = jax.tree.map(mesh_lib.local_share, self.task.sample(problem_key, self.settings.text.num_prompts,
                                                                       "train"))
        keys = mesh_lib.per_item_keys(sample_key, problems.target.shape[0])
        prompts, samples, labels, step_verdicts = self.draw(state.params, problems, keys, self.settings.temperature,
                                                            self.settings.group_size)
        batch = Labelled(prompts, samples.tokens, samples.mask, labels)
        if self.settings.objective == "process":
            step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, 1)
            step_labels, step_slots = self.step_labels(state.params, problems, prompts, samples.tokens, labels,
                                                       step_verdicts, step_keys)
            batch = batch._replace(step_labels=step_labels, step_slots=step_slots)
        if self.settings.objective == "generative":
            seen, goals = self.scorer.judged_prompts(prompts)  # (the goal hidden while the critique is written)
            own, own_mask = self.scorer.critique(scoring(state.params, "generative"), seen, goals, samples.tokens)
            batch = batch._replace(prompts=seen, tokens=own, mask=own_mask)
            if self.settings.critique_by == "model":
                taught, real, critique = self.taught_critiques(samples.tokens)
                closed, _ = self.scorer.closed(taught, goals)
                batch = batch._replace(taught=taught, taught_real=real, taught_critique=critique,
                                       critique_exact=jnp.all(own == closed, axis=-1))
        optimizer = self.optimizer(hp, state.update_step)
        params, opt_state, metrics = gradient_step(self.loss, optimizer, state.params, state.opt_state, batch, hp)
        return TextState(params, opt_state, key, state.update_step + 1), metrics

    @jit_method(static_argnums=(3,))
    def _heldout(self, params, key: jax.Array, num: int):
        """Every seed's scores and labels [S, num, G] of the sampler's G completions to `num` fixed held-out problems
        (at the sampler's temperature), and what the model read [S, num, G, N']: those completions (a generative
        model's: with its critiques)."""
        problems = self.task.heldout(num, seed=self.eval_seed)

        def one_seed(params):
            def one_piece(piece):
                some_problems, their_keys = piece
                prompts, samples, labels, _ = self.draw(params, some_problems, their_keys, self.settings.temperature,
                                                        self.settings.group_size)
                scores, read = self.whole_scorer.scored(scoring(params, self.settings.objective), prompts,
                                                        samples.tokens, samples.mask)
                return scores, labels, read
            return map_in_pieces(one_piece, (problems, jax.random.split(key, num)), self.settings.text.num_prompts)

        # one seed at a time, and one training batch's worth of problems at a time: decoding and scoring num x G
        # completions at once holds num x G caches and attention maps (every seed's at once ran a 3-seed run on
        # 60-token answers out of 24 GB of memory; one seed's 512 x 8 sums of 8 numbers did too), and in pieces the
        # evaluation needs no more than the update, whose fit is checked before training
        return jax.lax.map(one_seed, params)

    def evaluate(self, params, key: jax.Array, num: int, sample: bool = False) -> dict[str, np.ndarray]:
        """How the reward model orders the sampler's completions to `num` held-out problems, per seed [S] (see the
        module docstring); `sample` is accepted for the loop's signature: the completions are always sampled, at the
        sampler's temperature."""
        scores, labels, _ = self._heldout(params, key, num)
        ranking = jax.vmap(lambda s, y: reward_models.ranking_accuracy(s, y)[0])(scores, labels)
        best = jax.vmap(reward_models.best_of_n)(scores, labels)
        agrees = (scores > 0) == (labels > 0)
        out = {"eval_ranking_accuracy": ranking, "eval_label_accuracy": agrees.mean((-2, -1)),
               "eval_best_of_n": best.mean(-1), "eval_sampled_accuracy": labels.mean((-2, -1)),
               f"eval_pass@{self.settings.group_size}": labels.max(-1).mean(-1)}
        return {k: np.asarray(v) for k, v in out.items()}

    def write_artifacts(self, workdir: str, params, seed: int, sample: bool = False, num: int = 8) -> list[str]:
        """`scored_completions.txt`: held-out problems, the sampler's completions, their scores and labels."""
        scores, labels, tokens = jax.device_get(self._heldout(params, jax.random.key(seed), num))
        problems = self.task.heldout(num, seed=self.eval_seed)
        what = (f"completion=the {self.settings.critique_by}'s critique (the goal shown after it)"
                if self.settings.objective == "generative" else "completion")
        lines = [f"# {num} held-out problems, {self.settings.group_size} sampled completions each: score "
                 f"(sigmoid: the model's probability the completion is right), verifier label, {what}"]
        for i, (prompt, reference) in enumerate(self.task.texts(problems)):
            lines.append(f"{prompt!r} (reference {reference!r})")
            texts = self.policy.decode(tokens[0, i])
            order = np.argsort(-scores[0, i])
            lines += [f"  {float(jax.nn.sigmoid(scores[0, i, g])):.3f} {int(labels[0, i, g])} {texts[g]!r}"
                      for g in order]
        path = f"{workdir}/scored_completions.txt"
        files.write_atomic(path, "\n".join(lines) + "\n")
        return [path]

    def actor(self, params) -> "RewardModelScorer":
        return RewardModelScorer(self, params)


class RewardModelScorer:
    """One trained reward model, ready to score: `scorer.score(prompts, completions) -> float32 [B]` (sigmoid of the
    score: the model's probability that each completion is right), for strings laid out as the task's prompts."""

    def __init__(self, reward_model: RewardModel, params):
        self.params, self.policy = params, reward_model.policy
        scorer, variables = reward_model.whole_scorer, scoring(params, reward_model.settings.objective)
        self._score = jax.jit(functools.partial(scorer, variables))
        self._step_scores = jax.jit(functools.partial(scorer.step_scores, variables))

    def score(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        return self._probabilities(self._score, prompts, completions)

    def step_scores(self, prompts: list[str], completions: list[str]) -> dict[str, np.ndarray]:
        """A process model's `score` under every step score, from one pass: {how: float32 [B]} for how in
        `reward_models.STEP_SCORES` (what `score` gives with `reward_model.step_score=how`)."""
        return self._probabilities(self._step_scores, prompts, completions)

    def _probabilities(self, score, prompts: list[str], completions: list[str]):
        prompt_ids, tokens, mask = self.policy.encode_pairs(prompts, completions)
        scores = score(jnp.asarray(prompt_ids), jnp.asarray(tokens[:, None]), jnp.asarray(mask[:, None]))  # G=1
        return jax.tree.map(lambda s: np.asarray(reward_models.learned_reward(s))[:, 0], scores)


# -------------------------------------------------------------------------------------------------
# From a config


def text_reward_model_config() -> ConfigDict:
    """`text_config()` for a reward model trained on a policy's completions (`init_from`)."""
    config = text_config()
    config.algorithm = "text_reward_model"
    config.total_steps = 64_000  # labelled completions per seed
    config.eval.episodes = 256
    return knobs.fill(config, TextHyperparams, RewardModelSettings, INIT_FROM)


def build_text_reward_model(config: ConfigDict, mesh, run_dir: str | None = None) -> engine.Algorithm:
    """The reward model algorithm (`parts`: its `RewardModel`), starting from `config.init_from`'s parameters; with
    `run_dir`, that saved run's (its tokenizer, and no warm start)."""
    sampler_run = config.reward_model.sampler
    # (a reward model from scratch reads the sampler's tokens: it takes the sampler run's tokenizer)
    base = scorer_settings(config, start=run_dir or config.init_from or sampler_run or None)
    settings = knobs.read(RewardModelSettings, config, text=base)
    policy = TextPolicy(base, mesh)
    sampler_policy = None
    if sampler_run:
        saved = registry.saved_config(os.path.join(sampler_run, "config.json"))
        sampler_policy = TextPolicy(text_settings(saved, start=sampler_run), mesh)
        if sampler_policy.tokenizer.to_str() != policy.tokenizer.to_str():
            raise ValueError(f"config.reward_model.sampler={sampler_run!r} writes other tokens than this reward model "
                             "reads: start the reward model from that run, from scratch, or from a run of its tokenizer")
    model = RewardModel(settings, mesh, policy, sampler_policy)
    algorithm = text_algorithm(settings, mesh, policy, model.init, model.update, model, init_from_params=model.init,
                               starts_from="" if run_dir else config.init_from or base.pretrained)
    frozen = (("sampler", sampler_run),) if sampler_run and not run_dir else ()
    return dataclasses.replace(algorithm, evaluate=model.evaluate, actor=model.actor,
                               write_artifacts=model.write_artifacts, frozen_from=frozen)


def check_text_reward_model_config(config: ConfigDict) -> None:
    check_text_config(config)
    if not (config.init_from or config.model.name or config.reward_model.sampler):
        raise ValueError("a reward model labels the completions of a policy: set config.init_from to a text run "
                         "(e.g. an SFT run) or config.model.name to a pretrained model, or config.reward_model.sampler "
                         "to the policy's run (the reward model then trains from scratch)")
    sampler_run = config.reward_model.sampler
    if sampler_run and not os.path.exists(os.path.join(sampler_run, "config.json")):
        raise ValueError(f"config.reward_model.sampler={sampler_run!r} is not a run directory (no config.json)")
    if sampler_run and config.reward_model.objective == "implicit":
        raise ValueError("reward_model.objective=implicit scores against the sampler as its reference, which must be "
                         "the model it starts from: leave reward_model.sampler empty and set init_from")
    if config.task.name in text.MULTI_TURN_TASKS:
        raise ValueError(f"task.name={config.task.name} is played over turns; reward models score single "
                         "completions")
    if config.reward_model.objective == "process" and not hasattr(text.TASKS.get(config.task.name), "step_ends"):
        steps = sorted(name for name, task in text.TASKS.items() if hasattr(task, "step_ends"))
        raise ValueError(f"reward_model.objective=process labels the steps of answers: task.name="
                         f"{config.task.name} is answered in one piece; tasks answered in steps: {', '.join(steps)}")
    if config.reward_model.judge_layers and (config.reward_model.objective in ("implicit", "generative")
                                             or config.model.name):
        raise ValueError(f"reward_model.judge_layers={config.reward_model.judge_layers}: judge layers feed the value "
                         "head of a pairwise, pointwise or process model on the small transformer; this run's is "
                         + (f"the pretrained {config.model.name}" if config.model.name else
                            f"reward_model.objective={config.reward_model.objective}") + ": set judge_layers to 0")
    if config.reward_model.objective == "generative" and (config.model.name or not text.make_task(
            config.task.name, **config.task.kwargs).expression_answers):
        raise ValueError(f"reward_model.objective=generative critiques an answer by its value: task.name="
                         f"{config.task.name}{' with a pretrained model' if config.model.name else ''} is not answered "
                         "by one arithmetic expression (addition, multiplication and countdown are)")
    if config.reward_model.critique_by != CRITIQUE_BY.default and config.reward_model.objective != "generative":
        raise ValueError(f"reward_model.critique_by={config.reward_model.critique_by}: only a generative reward model "
                         f"writes a critique; reward_model.objective is {config.reward_model.objective}")
    if config.reward_model.step_label == "checked" and config.reward_model.continuations != CONTINUATIONS.default:
        raise ValueError(f"reward_model.continuations={config.reward_model.continuations} samples continuations for "
                         "Monte Carlo step labels; reward_model.step_label=checked has the verifier check each step "
                         "and samples none: leave continuations unset, or set step_label to soft or hard")
    for knob in (STEP_SCORE, STEP_LOSS, STEP_LABEL):
        value = config.reward_model[knob.key.split(".")[-1]]
        if value != knob.default and config.reward_model.objective != "process":
            raise ValueError(f"{knob.key}={value}: only a process reward model has step values; "
                             f"reward_model.objective is {config.reward_model.objective}")
    if config.reward_model.likelihood_weight and config.reward_model.objective in ("implicit", "generative"):
        raise ValueError(f"reward_model.likelihood_weight={config.reward_model.likelihood_weight} adds the model's "
                         "likelihood to its value head's output; an implicit model's score is already a log-ratio "
                         "of likelihoods and a generative model's verdict reads its own critique: set it to 0, or "
                         "reward_model.objective to pairwise, pointwise or process")
    if config.reward_model.objective == "process" and config.model.name:
        raise ValueError("reward_model.objective=process: pretrained models' chat replies are not split into steps "
                         "yet; train it on the small transformer")


register("text_reward_model", Recipe(build_text_reward_model, TextHyperparams,
                                     check=check_text_reward_model_config, defaults=text_reward_model_config,
                                     rebuild=build_text_reward_model))
