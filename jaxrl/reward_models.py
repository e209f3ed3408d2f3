"""Reward models on completions: scores from a value head, their losses, and how well they rank.

A reward model reads a prompt and a completion and gives one score (a logit): the value head's output at the
completion's last real slot, which has seen every token before it (the EOS that ends a completion adds nothing).
It learns from outcome labels, 1 for a completion the verifier accepts and 0 otherwise:

    pointwise      binary cross-entropy of sigmoid(score) against the label (an outcome reward model)
    pairwise       Bradley-Terry: -log sigmoid(s_i - s_j) for every pair (i, j) of one prompt's completions with
                   label_i > label_j (Bradley and Terry 1952; the reward models of RLHF)
    implicit       an implicit process reward model (PRIME, Cui et al. 2025): no value head; the score is
                   beta * sum_t log(pi(y_t) / pi_ref(y_t)) of the model against a frozen reference, learned by
                   pointwise cross-entropy on outcome labels; its per-token terms are process rewards for free
    process        a process reward model on a task answered in steps: the value head after each step, learned
                   from the step's Monte Carlo label (Math-Shepherd, Wang et al. 2024: the share of K
                   continuations from the prefix through that step that end right, or whether any does,
                   `monte_carlo_labels`; or PRM800K's, each step checked, `prefix_labels`; the last step's label
                   is the outcome) by cross-entropy, or pairwise (`step_loss`: Bradley-Terry over every two steps of a
                   prompt's completions, the one more likely to end right above the other); a completion's score
                   is its weakest step's, or another `step_score`
    generative     a generative verifier: the model first writes a critique after the completion, its working
                   (for an arithmetic answer, the value it computes: `7+1*18=25`) with the prompt's goal hidden
                   (Countdown's target, which it could copy instead), then, shown the goal, its value head gives
                   the verdict. The critique learns by cross-entropy against the working
                   the task's own tools give (`critique_loss`); the verdict by cross-entropy on outcome labels,
                   read after the critique the model itself writes (greedy, as when it scores). (GenRM, Zhang et
                   al. 2024: verification as next-token prediction after a rationale; J1 and Critique-RL judge
                   after a critique likewise.)

A value-head model (pairwise, pointwise, process) may also read its own likelihood (`with_likelihood`): each value
plus a weight times the model's log-probability of the tokens before it, so that it starts as the sampler's
likelihood, a judge that already ranks well, and a token the model would not have written lowers every later value.
Or its value head may read through judge layers of its own (`reward_model.judge_layers`, `transformer.read_surprise`):
blocks over the policy body in which each slot also reads how likely the body found the token just read, so that a
later layer can compare a written token with the one predicted and say where in a step a slip lies.

Used as a reward, sigmoid(score) is the model's probability that the completion is right. Shapes: B prompts,
G completions per prompt, N completion slots. With `axis_name` (the data axis, inside shard_map) a mean is this
device's share, scaled so that the mean over devices (what the update averages) is the mean over every item.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from envs.text import judge
from jaxrl import sampling

OBJECTIVES = ("pairwise", "pointwise", "implicit", "process", "generative")


def completion_scores(values: jax.Array, mask: jax.Array) -> jax.Array:
    """values, mask [..., N] (the value head's output predicting each slot, `sampling.score`; 1 = a real slot) ->
    the score [...] of each completion: the value at its last real slot (0 for an empty completion)."""
    last = jnp.maximum(jnp.sum(mask > 0, axis=-1) - 1, 0)
    return jnp.where(jnp.any(mask > 0, axis=-1), jnp.take_along_axis(values, last[..., None], axis=-1)[..., 0], 0.0)


def _mean(total: jax.Array, count: jax.Array, axis_name: str | None) -> jax.Array:
    """total / count; with `axis_name`, this device's share of the mean over every device's items, scaled so that
    the mean over devices is that mean (as `losses.aggregate`: gradients averaged over devices stay exact)."""
    if axis_name is not None:
        count = jax.lax.psum(count, axis_name)
        total = total * jax.lax.psum(1, axis_name)
    return total / jnp.maximum(count, 1.0)


def critique_loss(log_probs: jax.Array, where: jax.Array, axis_name: str | None = None) -> jax.Array:
    """A generative verifier's critique loss: the mean negative log-probability [...] of the slots `where` holds
    (the critique's, teacher-forced), over every such slot."""
    where = where.astype(log_probs.dtype)
    return _mean(-jnp.sum(log_probs * where), jnp.sum(where), axis_name)


def ordered_pairs(labels: jax.Array) -> jax.Array:
    """labels [B, G] -> float32 [B, G, G]: 1 where completion i is labelled above completion j of the same prompt."""
    return (labels[..., :, None] > labels[..., None, :]).astype(jnp.float32)


def pointwise_loss(scores: jax.Array, labels: jax.Array, axis_name: str | None = None,
                   where: jax.Array | None = None) -> jax.Array:
    """Binary cross-entropy of sigmoid(scores) against labels in [0, 1] (any shape), averaged over every item (those
    `where` holds)."""
    losses = jnp.logaddexp(0.0, scores) - labels * scores  # -[y log s(x) + (1 - y) log(1 - s(x))]
    where = jnp.ones_like(losses) if where is None else where.astype(losses.dtype)
    return _mean(jnp.sum(losses * where), jnp.sum(where), axis_name)


def bradley_terry_loss(scores: jax.Array, labels: jax.Array, axis_name: str | None = None,
                       where: jax.Array | None = None) -> jax.Array:
    """scores, labels [B, G] -> -mean log sigmoid(s_i - s_j) over the ordered pairs of each prompt's items
    (`ordered_pairs`), among those `where` [B, G] holds (all by default); 0 when there is no such pair."""
    pairs = ordered_pairs(labels)
    if where is not None:
        pairs = pairs * (where[..., :, None] & where[..., None, :])
    margins = scores[..., :, None] - scores[..., None, :]
    return _mean(jnp.sum(pairs * jnp.logaddexp(0.0, -margins)), jnp.sum(pairs), axis_name)


def objective_loss(objective: str, scores: jax.Array, labels: jax.Array, axis_name: str | None = None) -> jax.Array:
    """The loss of `objective` (one of `OBJECTIVES`) on scores, labels [B, G]."""
    if objective == "pairwise":
        return bradley_terry_loss(scores, labels, axis_name)
    if objective in ("pointwise", "implicit"):
        return pointwise_loss(scores, labels, axis_name)
    raise ValueError(f"unknown reward model objective {objective!r}; known: {', '.join(OBJECTIVES)}")


def ranking_accuracy(scores: jax.Array, labels: jax.Array, axis_name: str | None = None) -> tuple[jax.Array, jax.Array]:
    """scores, labels [B, G] -> (the share of ordered pairs the scores put in the labels' order, a tie counting
    one half; this device's number of such pairs). The accuracy is 0 when there is no pair."""
    pairs = ordered_pairs(labels)
    margins = scores[..., :, None] - scores[..., None, :]
    right = jnp.where(margins > 0, 1.0, jnp.where(margins == 0, 0.5, 0.0))
    count = jnp.sum(pairs)
    return _mean(jnp.sum(pairs * right), count, axis_name), count


def best_of_n(scores: jax.Array, labels: jax.Array) -> jax.Array:
    """scores, labels [B, G] -> [B]: the label of each prompt's highest-scored completion (the first on a tie)."""
    return jnp.take_along_axis(labels, jnp.argmax(scores, axis=-1)[..., None], axis=-1)[..., 0]


def learned_reward(scores: jax.Array) -> jax.Array:
    """The reward a model's scores give: sigmoid(score), its probability that the completion is right."""
    return jax.nn.sigmoid(scores)


def step_slots(step_ends: jax.Array) -> jax.Array:
    """bool [..., N]: the slot after each step's last token (`step_ends`), whose value has read the whole step: a
    step's score is the value there (the last step's is the completion's EOS slot)."""
    after = jnp.concatenate([jnp.zeros_like(step_ends[..., :1]), step_ends[..., :-1]], axis=-1)
    return after


# how a process model's step values (logits) make a completion's score
STEP_SCORES = ("min", "product", "last")


def step_score(values: jax.Array, slots: jax.Array, how: str = "min") -> jax.Array:
    """values, slots [..., N] -> [...] logits: a completion's score from its steps' (0 for one without a step).
    min: the weakest step's (Math-Shepherd, Wang et al. 2024); product: the logit of the product of the steps'
    probabilities sigmoid(v) (PRM800K, Lightman et al. 2023); last: the last step's, which has read the whole
    completion."""
    stepped = jnp.any(slots, axis=-1)
    if how == "min":
        score = jnp.min(jnp.where(slots, values, jnp.inf), axis=-1)
    elif how == "product":
        log_p = jnp.minimum(jnp.sum(jnp.where(slots, jax.nn.log_sigmoid(values), 0.0), axis=-1), -1e-7)
        score = log_p - jnp.log(-jnp.expm1(log_p))  # logit(p) = log p - log(1 - p)
    elif how == "last":
        last = jnp.argmax(jnp.where(slots, jnp.arange(slots.shape[-1]), -1), axis=-1)  # the last step's slot
        score = jnp.take_along_axis(values, last[..., None], axis=-1)[..., 0]
    else:
        raise ValueError(f"unknown step score {how!r}; known: {', '.join(STEP_SCORES)}")
    return jnp.where(stepped, score, 0.0)


# how a process model learns its step values from their Monte Carlo labels
STEP_LOSSES = ("pointwise", "pairwise")


def step_loss(values: jax.Array, labels: jax.Array, slots: jax.Array, how: str = "pointwise",
              axis_name: str | None = None) -> jax.Array:
    """A process model's loss on its step values, their Monte Carlo labels and slots [B, G, N]. pointwise: each
    step's cross-entropy against its label (Math-Shepherd); pairwise: Bradley-Terry over every two steps of one
    prompt's completions whose labels differ (the pairs of an outcome model's, its completions' last steps, and
    those of the steps before them)."""
    if how == "pointwise":
        return pointwise_loss(values, labels, axis_name, where=slots)
    if how == "pairwise":
        per_prompt = lambda x: x.reshape(x.shape[0], -1)  # noqa: E731  [B, G * N]: every step of the prompt
        return bradley_terry_loss(per_prompt(values), per_prompt(labels), axis_name, where=per_prompt(slots))
    raise ValueError(f"unknown step loss {how!r}; known: {', '.join(STEP_LOSSES)}")


# how a step is labelled: by K continuations' verdicts (Math-Shepherd's two estimates), or checked by the task's
# verifier (PRM800K's human step labels, here exact: `prefix_labels`)
STEP_LABELS = ("soft", "hard", "checked")
MONTE_CARLO_LABELS = ("soft", "hard")


def monte_carlo_labels(continuation_correct: jax.Array, how: str = "soft") -> jax.Array:
    """[..., K] verdicts on K continuations from one prefix -> [...]: soft, the share that end right (the prefix's
    chance of success under the sampler); hard, 1 where any does (the step can still lead to a right answer)."""
    correct = continuation_correct.astype(jnp.float32)
    if how == "soft":
        return jnp.mean(correct, axis=-1)
    if how == "hard":
        return jnp.max(correct, axis=-1)
    raise ValueError(f"unknown Monte Carlo step label {how!r}; known: {', '.join(MONTE_CARLO_LABELS)}")


def prefix_labels(step_right: jax.Array) -> jax.Array:
    """bool [..., S] the verifier's verdict on each step -> float32 [..., S]: 1 where the step and every one before
    it are right (PRM800K labels a solution's steps up to its first mistake; after it no step can lead to a right
    answer, as in Math-Shepherd's hard estimate under a sampler that never slips)."""
    return jnp.cumprod(step_right.astype(jnp.float32), axis=-1)


def with_likelihood(values: jax.Array, log_probs: jax.Array, mask: jax.Array, weight) -> jax.Array:
    """values, log_probs, mask [..., N] -> values + weight * the log-probability of the completion's tokens before
    each slot (the tokens that slot's value has read): a judge that reads the model's own likelihood, so that a
    token the model would not have written lowers every later value. With the value head near 0 at the start, the
    completion's score is then weight * the log-likelihood of its tokens before EOS."""
    read = log_probs * (mask > 0)
    return values + weight * (jnp.cumsum(read, axis=-1) - read)


def scoring(params: dict, objective: str) -> dict:
    """What a `Scorer` reads of a reward model run's parameters {"params", "sampler"}: the reward model's (and the
    sampler, the reference of an implicit model)."""
    return {k: v for k, v in params.items() if k == "params" or (k == "sampler" and objective == "implicit")}


def implicit_rewards(log_probs: jax.Array, ref_log_probs: jax.Array, mask: jax.Array, beta) -> jax.Array:
    """PRIME's token-level process rewards [..., N]: beta * (log pi(y_t) - log pi_ref(y_t)), 0 off the mask. Their sum
    over a completion is its implicit outcome score."""
    return beta * (log_probs - ref_log_probs) * (mask > 0)


@dataclasses.dataclass(frozen=True)
class Scorer:
    """How a trained reward model scores completions: its model (a value head's, or a language model's for
    `implicit`), its objective and, for `implicit`, beta. Its variables are {"params"} (and {"sampler"}: the
    reference of an implicit model)."""

    model: object
    objective: str
    beta: float = 0.05
    pad_id: int = 0
    step_ends: object = None  # process models: completions [..., N] -> bool [..., N] (the task's `step_ends`)
    vocab: object = None  # generative models: the `envs.text.Vocab` their critiques are written in
    goal_width: int = 0  # generative models: slots of the goal hidden from the critique, shown after it (0: none)
    critique_by: str = "model"  # generative models: who writes the critique (`judge.CRITICS`)
    step_score: str = "min"  # process models: how step values make the score (`STEP_SCORES`)
    likelihood_weight: float = 0.0  # value-head models: the weight of the model's own likelihood (`with_likelihood`)

    @classmethod
    def of(cls, model, task, vocab, how) -> "Scorer":
        """The scorer of a reward model on `task`'s completions (written in `vocab`); `how`: what holds its
        objective, beta, critique_by, step_score and likelihood_weight (its settings, or its run's config section
        `reward_model`, whose keys they are)."""
        step_ends = functools.partial(task.step_ends, vocab=vocab) if hasattr(task, "step_ends") else None
        return cls(model, how.objective, how.beta, vocab.pad_id, step_ends, vocab, judge.goal_width(task),
                   how.critique_by, how.step_score, how.likelihood_weight)

    def __call__(self, variables: dict, prompts: jax.Array, completions: jax.Array, mask: jax.Array) -> jax.Array:
        """Scores [B, G] (logits) of completions [B, G, N] (mask [B, G, N]) to prompts [B, P]."""
        return self.scored(variables, prompts, completions, mask)[0]

    def scored(self, variables: dict, prompts: jax.Array, completions: jax.Array,
               mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(scores [B, G], what the model read after each prompt [B, G, N']: the completions, or for a generative
        model each completion with the critique it wrote, N' = N + C + the goal's width)."""
        if self.objective == "implicit":
            return jnp.sum(self.token_rewards(variables, prompts, completions, mask), axis=-1), completions
        if self.objective == "generative":
            seen, tokens, critique_mask = self.critiqued(variables, prompts, completions)
            return self.verdicts(variables, seen, tokens, critique_mask), tokens
        return self.verdicts(variables, prompts, completions, mask), completions

    def verdicts(self, variables: dict, prompts: jax.Array, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        """The value head's scores [B, G] of sequences [B, G, N] (mask [B, G, N]) after prompts [B, P]: at the last
        real slot (process models: `step_score` of the steps')."""
        if self.objective == "process":
            return self.step_scores(variables, prompts, tokens, mask)[self.step_score]  # (jit drops the others)
        return completion_scores(self.values(variables, prompts, tokens, mask), mask)

    def step_scores(self, variables: dict, prompts: jax.Array, completions: jax.Array,
                    mask: jax.Array) -> dict[str, jax.Array]:
        """A process model's scores [B, G] of completions [B, G, N] (mask [B, G, N]) to prompts [B, P] under every
        step score, from one pass of the model: {how: scores} for how in `STEP_SCORES`."""
        if self.objective != "process":
            raise ValueError(f"step scores are a process reward model's; this model's objective is {self.objective}")
        values = self.values(variables, prompts, completions, mask)
        slots = step_slots(self.step_ends(completions))
        return {how: step_score(values, slots, how) for how in STEP_SCORES}

    def values(self, variables: dict, prompts: jax.Array, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        """The values [B, G, N] predicting each slot of sequences [B, G, N] (mask [B, G, N]) after prompts [B, P]:
        the value head's, with `likelihood_weight` times the model's own log-likelihood of the tokens before."""
        log_probs, _, values = sampling.score_groups(self.model, {"params": variables["params"]}, prompts, tokens,
                                                     mask, self.pad_id)
        return with_likelihood(values, log_probs, mask, self.likelihood_weight) if self.likelihood_weight else values

    def judged_prompts(self, prompts: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """A generative model's view of prompts [B, P]: their goal hidden (`judge.hide_goal`), and the goals."""
        if not self.goal_width:
            return prompts, (jnp.zeros((prompts.shape[0], 0), prompts.dtype), jnp.zeros(prompts.shape[0], jnp.int32))
        return jax.vmap(functools.partial(judge.hide_goal, vocab=self.vocab, width=self.goal_width))(prompts)

    def critiqued(self, variables: dict, prompts: jax.Array, completions: jax.Array):
        """A generative model's critiques of completions [B, G, N] to prompts [B, P] (`critique`, the goal hidden
        by `judged_prompts`) -> (the prompts as the model sees them [B, P], tokens, mask [B, G, W])."""
        seen, goals = self.judged_prompts(prompts)
        return (seen, *self.critique(variables, seen, goals, completions))

    def critique(self, variables: dict, seen: jax.Array, goals: tuple[jax.Array, jax.Array],
                 completions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Each completion [B, G, N] with its critique, then its prompt's goal shown (`judge.closing`; goals: ids
        [B, w], lengths [B]) -> (tokens int32 [B, G, W], mask float32 [B, G, W]), W = N + C + w: what `verdicts`
        reads. The model's critique: the completion opened (`judge.opening`) and continued greedily after the prompts
        as it sees them, seen [B, P] (no gradient flows through the decoding); the calculator's: the completion's
        value as it computes it (`judge.value_critique`)."""
        B, G, _ = completions.shape
        if self.critique_by == "calculator":
            critiques, _, _ = self.calculator_critiques(completions)
        else:
            forced, forced_len = jax.vmap(jax.vmap(functools.partial(judge.opening, vocab=self.vocab)))(completions)
            flat = lambda x: x.reshape(B * G, *x.shape[2:])  # noqa: E731
            samples = sampling.sample_groups_per_prompt(
                self.model, {"params": jax.lax.stop_gradient(variables["params"])}, jnp.repeat(seen, G, axis=0),
                jax.random.split(jax.random.key(0), B * G), group_size=1, max_new_tokens=forced.shape[-1],
                eos_id=self.vocab.eos_id, pad_id=self.pad_id, temperature=0.0, forced=flat(forced),
                forced_len=flat(forced_len))
            critiques = samples.tokens.reshape(B, G, -1)
        return self.closed(critiques, goals)

    def calculator_critiques(self, completions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The calculator's critiques of completions [B, G, N] (`judge.value_critique`): (ids [B, G, N + C], where each
        critique starts [B, G], the total lengths [B, G])."""
        return jax.vmap(jax.vmap(functools.partial(judge.value_critique, vocab=self.vocab)))(completions)

    def closed(self, critiques: jax.Array, goals: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Critiques [B, G, N + C] (a completion, "=", the value, EOS) with their prompt's goal shown after them
        (`judge.closing`; goals: ids [B, w], lengths [B]) -> (tokens int32 [B, G, W], mask float32 [B, G, W])."""
        close = lambda critique, goal: judge.closing(critique, goal, self.vocab)  # noqa: E731
        tokens, length = jax.vmap(jax.vmap(close, (0, None)))(critiques, goals)
        return tokens, (jnp.arange(tokens.shape[-1]) < length[..., None]).astype(jnp.float32)

    def token_rewards(self, variables: dict, prompts: jax.Array, completions: jax.Array, mask: jax.Array) -> jax.Array:
        """An implicit model's process rewards [B, G, N] (`implicit_rewards`): they sum to its scores."""
        if self.objective != "implicit":
            raise ValueError(f"a {self.objective} reward model gives no per-token rewards (an implicit one does)")
        log_probs, _, _ = sampling.score_groups(self.model, {"params": variables["params"]}, prompts, completions,
                                                mask, self.pad_id)
        ref_log_probs, _, _ = sampling.score_groups(self.model, {"params": variables["sampler"]}, prompts,
                                                    completions, mask, self.pad_id)
        return implicit_rewards(log_probs, jax.lax.stop_gradient(ref_log_probs), mask, self.beta)
