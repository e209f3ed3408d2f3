"""The built-in token strategies, one per entry of `jaxrl.rollout`'s registries (docs/grpo.md tabulates them):

    generate  independent (the default), tree, dars
    filter    rank_ties, success_predictor, attention_predictor
    control   dynamic_sampling (the default), variance_budget, rollout_gdro, partial, prune, entropy_target,
              diversity_target
    replay    correct, selective, recent, reference, hints, curriculum, thompson, gdro, pairing, hardest

`algo` is token GRPO's learner
(`jaxrl.algos.text.TextGRPO`). Shapes as in `jaxrl.rollout`: C candidates, n groups, G members, N tokens, K
reward components, pool the number of training problems (`rollout.pool_size`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import optax

from jaxrl import advantages, mesh as mesh_lib, multi_turn, sampling
from jaxrl.engine import global_mean
from jaxrl.mesh import DATA_AXIS
from jaxrl.rollout.pieces import (allocate_groups, difficulty_tier, distinct_share, first_per_slot, hint_lengths,
                                  hint_update, importance_weights, last_occurrence, member_hint_lengths, tie_ranks,
                                  tree_advantages)
from jaxrl.rollout.stages import Groups, Plan, get, register, take


def _correct(algo, groups: Groups) -> jax.Array:
    """bool [n, G]: the verifier's `correct` component is positive."""
    return groups.rewards[..., algo.task.reward_names.index("correct")] > 0


def _answer_lengths(algo, answers: jax.Array) -> jax.Array:
    """int32 [n]: tokens of reference answers [n, N] before EOS."""
    vocab = algo.vocab
    return jnp.sum((answers != vocab.pad_id) & (answers != vocab.eos_id), axis=-1).astype(jnp.int32)


def plan_candidates(algo, key: jax.Array, level: jax.Array | None = None) -> Plan:
    """This device's share of the B x oversample candidate problems (the plan the stages start from), from the
    pool when there is one: uniformly, or with a curriculum `level` uniformly among the pool's problems of
    difficulty <= level (the easiest ones if none is that easy); without a pool, fresh problems (at `level`).
    Drawn for every device at once and shared out, so every device count plans the same problems."""
    s = algo.settings
    num = s.text.num_prompts * s.oversample
    if s.pool_size and level is None:
        ids = mesh_lib.local_share(jax.random.randint(key, (num,), 0, s.pool_size))
    elif s.pool_size:
        difficulty = algo.task.difficulty(algo.pool)
        allowed = difficulty <= jnp.maximum(level, difficulty.min()) + 1e-6
        ids = mesh_lib.local_share(jax.random.categorical(key, jnp.where(allowed, 0.0, -jnp.inf), shape=(num,)))
    if s.pool_size:
        ids = ids.astype(jnp.int32)
        problems = algo.pool[ids]
    else:
        problems = jax.tree.map(mesh_lib.local_share, algo.task.sample(key, num, "train", level))
        ids = jnp.full(problems.target.shape, -1, jnp.int32)
    zeros = jnp.zeros(ids.shape, jnp.int32)
    return Plan(ids, problems, zeros, jnp.full(ids.shape, -1.0), zeros)


def leading_candidates(plan: Plan, count: int) -> Plan:
    """This device's share of the first `count` of all devices' candidates (in their global order): the part of a
    plan a generator that samples fewer than all of them keeps, the same on any device count."""
    return take(mesh_lib.gather_shares(plan), mesh_lib.local_share(jnp.arange(count)))


def pool_plan(algo, ids: jax.Array) -> Plan:
    """A fresh plan of the pool's problems `ids` [C] (no hints, predictions or resumed columns)."""
    zeros = jnp.zeros(ids.shape, jnp.int32)
    return Plan(ids, algo.pool[ids], zeros, jnp.full(ids.shape, -1.0), zeros)


# --- Generate ---------------------------------------------------------------------------------------

def independent(algo, params, hp, plan: Plan, key: jax.Array, **tree) -> Groups:
    """G independent completions per prompt (KV-cache sampling; a hint's tokens are forced first). Groups the
    plan resumes continue from their columns so far, whose tokens the loss weighs by min(pi / mu, cap) against
    the policies that drew them; with a Control strategy that stops early, decoding ends once every slot holds
    a finished group. A plan's `length_cap` ends its members at that column (cut off as by the length limit)."""
    s, task, vocab = algo.settings, algo.task, algo.vocab
    prompts = task.prompts(plan.problems, vocab)
    keys = mesh_lib.per_item_keys(key, prompts.shape[0])
    if getattr(task, "multi_turn", False):
        return _episodes(algo, params, hp, plan, prompts, keys)
    member_hint = member_hint_lengths(plan.hint_len, plan.hint_members, s.group_size)  # [n, G]
    hints = dict(forced=task.reference_answers(plan.problems, vocab),
                 forced_len=plan.hint_len if plan.hint_members is None else member_hint) \
        if algo.pipeline.forces_hints else {}
    resume = None
    if plan.resume is not None:
        # A slot's first O - 1 candidates may resume its carried groups; its last is always fresh.
        B = plan.ids.shape[0] // s.oversample
        rows = _rows_except(plan.ids.shape[0], s.oversample, jnp.full(B, s.oversample - 1))
        resume = sampling.Resume(plan.resume["tokens"][rows], plan.resume["mask"][rows], plan.start, rows,
                                 plan.resume["stopped"][rows])
    prune = {} if plan.prune_below is None else dict(prune_at=plan.prune_at, prune_below=plan.prune_below,
                                                     prune_keep=algo.strategy_options("prune")["balance"])
    cap = {} if plan.length_cap is None else dict(length_cap=plan.length_cap)
    samples = sampling.sample_groups_per_prompt(
        algo.model, params, prompts, keys, group_size=s.group_size, max_new_tokens=task.answer_length,
        eos_id=vocab.eos_id, pad_id=vocab.pad_id, temperature=hp.temperature, top_k=s.top_k, top_p=hp.top_p,
        **hints, **tree, **prune, **cap, resume=resume, stop_slots=algo.stop_slots,
        stop_axis=DATA_AXIS if algo.stop_slots or prune else None)
    rewards = jax.vmap(lambda c: task.jax_rewards(plan.problems, c, vocab), in_axes=1, out_axes=1)(samples.tokens)
    n, G, N = samples.tokens.shape
    columns = jnp.arange(N)
    weight = samples.mask * (columns >= member_hint[..., None])
    behaviour = samples.log_probs
    if resume is not None:
        earlier = columns < plan.start[:, None, None]
        behaviour = jnp.where(earlier, plan.resume["behaviour"], samples.log_probs)
        importance = importance_weights(samples.log_probs, behaviour, samples.mask,
                                        plan.resume["cap"][:, None, None])
        weight = jnp.where(earlier, weight * importance, weight)
    decided = jnp.full((n,), N, jnp.int32) if samples.decided is None else samples.decided
    limit = N if plan.length_cap is None else jnp.minimum(plan.length_cap, N)  # a capped member ends at its cap
    ended = ((samples.tokens == vocab.eos_id) & (samples.mask > 0)).any(axis=-1) | (decided >= limit)[:, None]
    if samples.pruned is not None:
        ended = ended | samples.pruned
    return Groups(plan.ids, plan.problems, prompts, plan.hint_len, samples.tokens, samples.log_probs, samples.mask,
                  samples.lengths, samples.values, rewards, weight=weight, bonus=jnp.zeros((n, G), jnp.float32),
                  replayed=jnp.zeros((n, G), bool), start=plan.start, decided=decided, behaviour=behaviour,
                  finished=ended.all(axis=1), pruned=samples.pruned, branched_at=samples.branched_at,
                  baseline=plan.baseline, predicted=plan.predicted, hint_members=plan.hint_members)


def _episodes(algo, params, hp, plan: Plan, prompts: jax.Array, keys: jax.Array) -> Groups:
    """G multi-turn episodes per prompt (`jaxrl.multi_turn.play`): the loss weighs the model's tokens only."""
    s = algo.settings
    episodes = multi_turn.play(algo.model, params, algo.task, algo.vocab,
                               plan.problems, prompts, keys, group_size=s.group_size, temperature=hp.temperature,
                               top_k=s.top_k, top_p=hp.top_p)
    n, G, _ = episodes.tokens.shape
    return Groups(plan.ids, plan.problems, prompts, plan.hint_len, episodes.tokens, episodes.log_probs, episodes.mask,
                  episodes.mask.sum(-1).astype(jnp.int32), episodes.values, episodes.rewards, weight=episodes.mask,
                  bonus=jnp.zeros((n, G), jnp.float32), replayed=jnp.zeros((n, G), bool), start=plan.start,
                  attend=episodes.attend, turns=episodes.turns, baseline=plan.baseline, predicted=plan.predicted)


register("generate", "independent", generate=independent)


def tree(algo, params, hp, plan: Plan, key: jax.Array) -> Groups:
    """Tree rollouts: each group's G members form `branches` branches of G / branches members sharing their
    first `depth` tokens (lookahead-tree / BranchGRPO style), or with `min_entropy` > 0 their tokens up to the
    branch's first column whose next-token entropy reaches it (at most `depth`). Advantages respect the tree
    (`tree_advantages`): a shared prefix is scored by its branch's mean against the group's, what
    follows by each member against its branch."""
    o = algo.strategy_options("tree")
    by_entropy = dict(branch_entropy=o["min_entropy"]) if o["min_entropy"] > 0 else {}
    return independent(algo, params, hp, plan, key, branches=o["branches"], depth=o["depth"], **by_entropy)


def tree_token_advantages(algo, groups: Groups, rewards: jax.Array):
    """The tree's per-token advantages from the members' weighted rewards [n, G] (scaled by the group's std
    unless the estimator's scale is "none")."""
    o, s = algo.strategy_options("tree"), algo.settings
    options = dict(s.advantage_options)
    scale = options["scale"] or advantages.ESTIMATORS[s.advantage].default_scale
    depth = o["depth"] if groups.branched_at is None else groups.branched_at
    return tree_advantages(rewards, ~groups.replayed, o["branches"], depth, groups.tokens.shape[-1],
                           scale=scale == "group", eps=options["eps"])


def check_tree(config, chosen: dict) -> None:
    """Branches of two or more members each; a resumed group (control/partial) keeps no branch points; the
    per-branch baselines scale as grpo or dr_grpo do."""
    branches = config.rollout.options.tree.branches
    if branches < 1 or config.group.size % branches or config.group.size == branches:
        raise ValueError(f"config.rollout.options.tree.branches = {branches} must divide config.group.size = "
                         f"{config.group.size} into branches of two or more members")
    if "partial" in chosen["control"]:
        raise ValueError("rollout.generate=tree with rollout.control=partial: a resumed group does not keep its "
                         "branch points; use generate=independent with partial")
    if config.advantage.estimator not in ("grpo", "dr_grpo"):
        raise ValueError(f"rollout.generate=tree scores tokens with per-branch baselines (grpo or dr_grpo "
                         f"scaling); config.advantage.estimator={config.advantage.estimator!r} is not one of them")
    if config.advantage.scale == "batch":
        raise ValueError("rollout.generate=tree scales each group's advantages by its own std or not at all: "
                         "config.advantage.scale=batch is not available with it")


register("generate", "tree", generate=tree, advantages=tree_token_advantages, check=check_tree, single_turn=True,
         options={"branches": (2, "branches per group, of G / branches members each", {"minimum": 1}),
                  "depth": (4, "tokens a branch's members share (at most)", {"minimum": 0}),
                  "min_entropy": (0.0, "> 0: a branch splits at its first token whose next-token entropy reaches "
                                  "this (at most depth)", {"minimum": 0.0})})


# --- Filter -----------------------------------------------------------------------------------------

def rank_ties(algo, memory, groups: Groups, params, key):
    """Ranks the members of a group whose verifier rewards are all equal, so that it still carries a signal:
    among failures the least confident ranks first (a confidently wrong answer is pushed down hardest),
    among successes the most confident. Confidence: the mean surprisal -log p of the drawn tokens (an
    unbiased estimate of the policy's entropy along the completion). The bonus, `scale` times the centred
    rank in [-1/2, 1/2], is added to the weighted reward only where the final group is still tied."""
    generated = groups.generated
    surprisal = -jnp.sum(groups.log_probs * generated, -1) / jnp.maximum(generated.sum(-1), 1.0)  # [n, G]
    solved = _correct(algo, groups).all(axis=1, keepdims=True)
    score = jnp.where(solved, -surprisal, surprisal)
    return groups.replace(bonus=algo.strategy_options("rank_ties")["scale"] * tie_ranks(score)), {}


register("filter", "rank_ties", after=rank_ties,
         options={"scale": (0.1, "the tie-breaking bonus: scale x the centred confidence rank", {"minimum": 0.0})})


def _prompt_features(algo, prompts: jax.Array) -> jax.Array:
    """float32 [n, P * V]: which token sits at each prompt position (what the predictor sees)."""
    return jax.nn.one_hot(prompts, algo.vocab.size).reshape(prompts.shape[0], -1)


def _candidate_features(algo, plan: Plan) -> jax.Array:
    """float32 [C, P * V]: `_prompt_features` of this device's candidates (what a predictor's `before` reads)."""
    return _prompt_features(algo, algo.task.prompts(plan.problems, algo.vocab))


def _observed_features(algo, groups: Groups) -> tuple[jax.Array, jax.Array, jax.Array]:
    """What a predictor learns from after an update, all devices (so the same on any device count): (features
    [C, P * V], observed pass rates [C], use float32 [C]: the finished unhinted groups, whose pass rate is the
    policy's own on the prompt as posed)."""
    pass_rate = _correct(algo, groups).mean(axis=1)
    prompts, pass_rate, use = mesh_lib.gather_shares((groups.prompts, pass_rate,
                                                      groups.finished_only(groups.hint_len == 0)))
    return _prompt_features(algo, prompts), pass_rate, use.astype(jnp.float32)


def _masked_mean(x: jax.Array, use: jax.Array) -> jax.Array:
    return jnp.sum(x * use) / jnp.maximum(use.sum(), 1.0)


def _predictor_logits(params, features: jax.Array) -> jax.Array:
    """A one-hidden-layer perceptron: features [n, D] -> logit of the pass rate [n]."""
    return jax.nn.relu(features @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def _predictor_optimizer(algo):
    return optax.adam(algo.strategy_options("success_predictor")["learning_rate"])


def predictor_memory(algo, key):
    """The predictor's parameters and Adam state (one hidden layer of `hidden` units)."""
    hidden = algo.strategy_options("success_predictor")["hidden"]
    inputs = algo.task.prompt_length * algo.vocab.size
    k1, k2 = jax.random.split(key)
    params = {"w1": jax.random.normal(k1, (inputs, hidden)) * jnp.sqrt(2.0 / inputs), "b1": jnp.zeros(hidden),
              "w2": jax.random.normal(k2, (hidden,)) * jnp.sqrt(1.0 / hidden), "b2": jnp.zeros(())}
    return {"params": params, "opt_state": _predictor_optimizer(algo).init(params)}


def predict_pass_rate(algo, memory, plan: Plan, key):
    """Predicts every candidate's pass rate from its prompt alone (for Control strategies to read)."""
    predicted = jax.nn.sigmoid(_predictor_logits(memory["params"], _candidate_features(algo, plan)))
    return plan.replace(predicted=predicted), {"predicted_pass_rate": global_mean(predicted)}


def train_predictor(algo, memory, groups: Groups, params):
    """One Adam step on the cross-entropy between the predicted and the observed pass rates of this update's
    unhinted groups (every candidate, all devices). Logs the error measured before the step (`predictor_error`,
    mean absolute, on prompts mostly unseen: an honest online estimate)."""
    features, pass_rate, use = _observed_features(algo, groups)

    def loss(params):
        logits = _predictor_logits(params, features)
        return _masked_mean(optax.sigmoid_binary_cross_entropy(logits, pass_rate), use), logits

    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(memory["params"])
    updates, opt_state = _predictor_optimizer(algo).update(grads, memory["opt_state"], memory["params"])
    error = _masked_mean(jnp.abs(jax.nn.sigmoid(logits) - pass_rate), use)
    return ({"params": optax.apply_updates(memory["params"], updates), "opt_state": opt_state},
            {"predictor_loss": value, "predictor_error": error})


register("filter", "success_predictor", init=predictor_memory, before=predict_pass_rate, observe=train_predictor,
         predicts=True,
         options={"hidden": (64, "the predictor's hidden units", {"minimum": 1}),
                  "learning_rate": (3e-3, "the predictor's Adam learning rate", {"above": 0.0})})


# A non-parametric, in-context predictor (V_0, "Generalist Value Model at State Zero": a policy's pass rate read from a
# history of (prompt, pass rate) pairs before any rollout; and the adaptive difficulty of "Improving Data Efficiency for
# LLM RL Fine-tuning Through Difficulty-targeted Online Data Selection and Rollout Replay", attention over similarity
# to a reference set): nothing to train, so it tracks the policy as fast as the memory turns over.

def attention_memory(algo, key):
    """The last `capacity` K observations: unit prompt features `keys` [K, P * V], pass rates `rates` [K], `valid`
    bool [K] (filled slots) and the FIFO's write position `next` (int32: the oldest entry once full)."""
    capacity = algo.strategy_options("attention_predictor")["capacity"]
    return {"keys": jnp.zeros((capacity, algo.task.prompt_length * algo.vocab.size)), "rates": jnp.zeros(capacity),
            "valid": jnp.zeros(capacity, bool), "next": jnp.zeros((), jnp.int32)}


def _unit(features: jax.Array) -> jax.Array:
    """Rows [n, D] scaled to unit length, so that a dot product is their cosine similarity."""
    return features / jnp.maximum(jnp.linalg.norm(features, axis=-1, keepdims=True), 1e-12)


def attention_pass_rates(memory, queries: jax.Array, temperature: float) -> jax.Array:
    """float32 [C]: each query's (unit features [C, D]) softmax-attention average of the stored pass rates, weights
    softmax_j(cos(q, k_j) / temperature) over the valid entries j; 1/2 while the memory is empty (no evidence either
    way: the same as `predicted_or_half`)."""
    logits = jnp.where(memory["valid"], queries @ memory["keys"].T / temperature, -jnp.inf)  # [C, K]
    # (a finite stand-in keeps an empty memory's softmax free of NaN; its result is replaced by 1/2 below)
    weights = jax.nn.softmax(jnp.where(memory["valid"].any(), logits, 0.0), axis=-1)
    return jnp.where(memory["valid"].any(), weights @ memory["rates"], 0.5)


def fifo_slots(head: jax.Array, keep: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Where a FIFO of `capacity` rows, next written at `head`, puts the kept (`keep` bool [M]) of M new rows in order,
    each overwriting the oldest: (slot int32 [M], `capacity` for a row not written: not kept, or of more than
    `capacity` kept rows one before the last `capacity`; the next head)."""
    order = jnp.cumsum(keep) - 1  # each kept row's place among this batch's kept rows
    count = keep.sum()
    slot = jnp.where(keep & (order >= count - capacity), (head + order) % capacity, capacity)
    return slot, ((head + count) % capacity).astype(jnp.int32)


def fifo_push(memory, keys: jax.Array, rates: jax.Array, use: jax.Array):
    """`memory` after writing the used (`use` [M]) rows of keys [M, D] and rates [M] in order at its write position,
    overwriting the oldest; of more than K used rows only the last K are written (`fifo_slots`)."""
    slot, head = fifo_slots(memory["next"], use > 0, memory["rates"].shape[0])
    return {"keys": memory["keys"].at[slot].set(keys, mode="drop"),
            "rates": memory["rates"].at[slot].set(rates, mode="drop"),
            "valid": memory["valid"].at[slot].set(True, mode="drop"), "next": head}


def attend_pass_rate(algo, memory, plan: Plan, key):
    """Predicts every candidate's pass rate by attention over the stored observations (`attention_pass_rates`)."""
    temperature = algo.strategy_options("attention_predictor")["temperature"]
    predicted = attention_pass_rates(memory, _unit(_candidate_features(algo, plan)), temperature)
    return plan.replace(predicted=predicted), {"predicted_pass_rate": global_mean(predicted)}


def store_pass_rates(algo, memory, groups: Groups, params):
    """Stores this update's finished unhinted groups (all devices) in the FIFO. Logs the error of the predictions
    made from the memory before they are stored (`predictor_error`, mean absolute: the same honest online estimate
    as success_predictor's) and the share of the memory filled (`attention_memory_filled`)."""
    features, pass_rate, use = _observed_features(algo, groups)
    keys = _unit(features)
    before = attention_pass_rates(memory, keys, algo.strategy_options("attention_predictor")["temperature"])
    memory = fifo_push(memory, keys, pass_rate, use)
    return memory, {"predictor_error": _masked_mean(jnp.abs(before - pass_rate), use),
                    "attention_memory_filled": memory["valid"].mean()}


register("filter", "attention_predictor", init=attention_memory, before=attend_pass_rate, observe=store_pass_rates,
         predicts=True,
         options={"capacity": (256, "the (prompt, observed pass rate) pairs kept, the oldest overwritten first",
                               {"minimum": 1}),
                  "temperature": (0.1, "the attention's softmax temperature over cosine similarities of prompt "
                                  "features: lower trusts the most similar stored prompts more", {"above": 0.0})})


# --- Control ----------------------------------------------------------------------------------------

def dynamic_sampling(algo, memory, groups: Groups, params, key):
    """DAPO's dynamic sampling: per slot, the first of its `group.oversample` candidates whose G rewards are
    not all equal (else the last). With option `rank` a `BUDGET_TARGETS` worth, the varied candidate of highest
    worth of its observed pass rate p (the share of its G completions correct) instead; `value` is VSPO's (Enhancing
    Agentic RL with Progressive Reward Shaping and Value-based Sampling Policy Optimization) replacement of low-value
    samples by task value. Logs `fill_rate`, the fraction of slots that found one, and with a rank the mean worth of
    the chosen (`chosen_worth`)."""
    rank = algo.strategy_options("dynamic_sampling")["rank"]
    worth = None if rank == "first" else BUDGET_TARGETS[rank](_correct(algo, groups).mean(axis=1))  # [b*O]
    choice, filled = select_varied(groups.rewards, algo.settings.oversample, worth)
    metrics = {"fill_rate": global_mean(filled.astype(jnp.float32))}
    if worth is not None:
        metrics["chosen_worth"] = global_mean(worth[choice])
    return take(groups, choice), metrics


def select_varied(rewards: jax.Array, oversample: int, worth: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """rewards [b*O, G, K], O candidates per slot (slot-major) -> (index [b] of the chosen candidate per
    slot, filled [b]: its rewards vary). The first varied candidate, or with `worth` [b*O] the varied one of highest
    worth (the first among equals)."""
    return first_per_slot(jnp.any(rewards != rewards[:, :1], axis=(1, 2)), oversample, worth)


# What one more group of a prompt of predicted pass rate p is worth to control/variance_budget (`allocate_groups`)
BUDGET_TARGETS = {
    "uncertain": lambda p: jnp.sqrt(jnp.clip(p * (1 - p), 0.0)),  # its reward's std: the most informative
    "hard": lambda p: 1.0 - p,  # DARS's depth: the least likely to be solved
    # VSPO's task value, uncertainty x difficulty (our reading of its abstract): informative and still unsolved
    "value": lambda p: jnp.sqrt(jnp.clip(p * (1 - p), 0.0)) * (1.0 - p),
}


def variance_budget(algo, memory, plan: Plan, key):
    """Sampling under a fixed budget: the B groups of an update (B x G samples) go to the B x oversample candidates
    by the worth of their predicted pass rate p (`BUDGET_TARGETS[target]`; `spend_budget`), up to `max_groups`
    each. `uncertain` (variance-aware): by sqrt(p (1 - p)), prompts predicted always right or always wrong get none;
    `hard` (DARS, Difficulty Adaptive Rollout Sampling): by 1 - p, the extra rollouts go to the prompts predicted
    least often solved, to raise their number of positive rollouts, and prompts predicted always right get none."""
    o = algo.strategy_options("variance_budget")
    return spend_budget(algo, plan, BUDGET_TARGETS[o["target"]], o["max_groups"])


def spend_budget(algo, plan: Plan, worth, max_groups: int, pass_rates: jax.Array | None = None,
                 num_groups: int | None = None) -> tuple[Plan, dict]:
    """`num_groups` groups (default the update's B) spent on all devices' candidates [C] by `worth(p)` [C] of their pass
    rates p: `pass_rates` [C] where measured, else predicted (1/2 where none; `allocate_groups`), at most `max_groups`
    each: this device's share of those chosen (a candidate given k groups appears k times). Chosen over every
    device's candidates at once, so the same on any device count. Logs the share of candidates given none and the
    most groups one got."""
    every = mesh_lib.gather_shares(plan)
    p = predicted_or_half(every.predicted) if pass_rates is None else mesh_lib.gather_shares(pass_rates)
    chosen = allocate_groups(worth(p), num_groups or algo.settings.text.num_prompts, max_groups)
    counts = jnp.zeros(p.shape[0], jnp.int32).at[chosen].add(1)
    return take(every, mesh_lib.local_share(chosen)), {
        "budget_skipped": jnp.mean((counts == 0).astype(jnp.float32)),
        "budget_most_groups": jnp.max(counts).astype(jnp.float32)}


def predicted_or_half(predicted: jax.Array) -> jax.Array:
    """A Filter's predicted pass rates [C], 1/2 where there is none (-1)."""
    return jnp.where(predicted >= 0, predicted, 0.5)


register("control", "dynamic_sampling", after=dynamic_sampling, selects=True,
         options={"rank": ("first", "which varied candidate of a slot is kept: first (DAPO), or the one of highest "
                           "worth of its observed pass rate p: uncertain, sqrt(p (1 - p)); hard, 1 - p; value (VSPO's "
                           "task value), sqrt(p (1 - p)) (1 - p)", {"choices": ("first", *BUDGET_TARGETS)})})


register("control", "variance_budget", before=variance_budget, selects=True, reads_predictions=True,
         options={"max_groups": (2, "the most groups one prompt gets", {"minimum": 1}),
                  "target": ("uncertain", "whom the groups go to by predicted pass rate p: uncertain, by sqrt(p (1 - p)); "
                             "hard (DARS), by 1 - p; value (VSPO), by sqrt(p (1 - p)) (1 - p)",
                             {"choices": tuple(BUDGET_TARGETS)})})


def dars(algo, params, hp, plan: Plan, key: jax.Array, sample=independent) -> Groups:
    """DARS (Difficulty Adaptive Rollout Sampling, "Depth-Breadth Synergy in RLVR"): a first round of G members for
    each of the first B - E of all devices' B candidates measures its pass rate p; the update's E = `extra` remaining
    groups then go to them by 1 - p (`BUDGET_TARGETS["hard"]`, `spend_budget`), at most `max_groups` each: the least
    solved get the most, so that hard prompts get more positive rollouts, and the all-correct none while others
    remain. With `target` rejected the extras go instead where the first round rejects the value head's prior
    (`rejected_worth`: V_0.5's extra rollouts where the prior is unreliable, for the fused estimator).
    With advantage.merge_problem_groups a prompt's first-round and extra members form one enlarged group of
    (1 + k) G. Trained: B groups of G, (B - E) G first-round completions and E G extra ones (all the update samples).

    `sample`: the generator of each round (plan -> Groups). Returns [b, G, ...]: the B groups in the same order on any
    device count (the first round's, then the extras'), this device's share."""
    o, B = algo.strategy_options("dars"), algo.settings.text.num_prompts
    extra, devices = o["extra"], jax.lax.axis_size(DATA_AXIS)
    if extra % devices:
        raise ValueError(f"config.rollout.options.dars.extra = {extra} extra groups cannot be shared evenly by "
                         f"{devices} devices: make it a multiple of {devices}")
    first_plan = leading_candidates(plan, B - extra)
    first = sample(algo, params, hp, first_plan, key)
    pass_rate = _correct(algo, first).mean(axis=1)
    worth = BUDGET_TARGETS["hard"] if o["target"] == "hard" else rejected_worth(algo, first)
    extra_plan, _ = spend_budget(algo, first_plan, worth, o["max_groups"], pass_rate, extra)
    extras = sample(algo, params, hp, extra_plan, jax.random.fold_in(key, 1))
    every = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), mesh_lib.gather_shares(first),
                         mesh_lib.gather_shares(extras))
    return jax.tree.map(mesh_lib.local_share, every)


def rejected_worth(algo, first: Groups):
    """V_0.5's extra rollouts where the value prior is unreliable: the worth (p [C] -> [C], all devices) of one more
    group of each first-round group is 1 where its mean weighted reward rejects the value head's state-zero prior
    (`advantages.prior_accepted`, the fused estimator's test) and 0 where it accepts it, plus 1e-3 sqrt(p (1 - p)):
    extras left over once every rejected prompt has its groups go to the most uncertain of the others."""
    s = algo.settings
    mean = first.rewards @ jnp.asarray(s.reward_weights)  # [b, G]: the weighted reward the estimator reads
    options = dict(s.advantage_options)
    prior = jnp.clip(first.values[:, 0, 0], 0.0, options["max_reward"])
    rejected = ~advantages.prior_accepted(mean.mean(axis=1), prior, mean.shape[1], options["prior_z"])
    every = mesh_lib.gather_shares(rejected).astype(jnp.float32)
    return lambda p: every + 1e-3 * BUDGET_TARGETS["uncertain"](p)


def check_dars(config, chosen: dict) -> None:
    """DARS trains B groups it samples itself, pooled by problem; its first round measures accuracy by the label."""
    extra, B, most = config.rollout.options.dars.extra, config.num_prompts, config.rollout.options.dars.max_groups
    if config.group.oversample != 1:
        raise ValueError(f"rollout.generate=dars samples the B groups it trains itself: set config.group.oversample=1, "
                         f"got {config.group.oversample}")
    if extra >= B or extra > (B - extra) * most:
        raise ValueError(f"config.rollout.options.dars.extra = {extra} must leave a first round (below num_prompts = "
                         f"{B}) and fit on it, at most rollout.options.dars.max_groups = {most} per prompt")
    if not config.advantage.merge_problem_groups:
        raise ValueError("rollout.generate=dars enlarges a prompt's group with its extra rollouts: set "
                         "config.advantage.merge_problem_groups=True")
    if config.reward.label_free:
        raise ValueError(f"rollout.generate=dars measures each prompt's accuracy by its label; "
                         f"config.reward.label_free={config.reward.label_free} reads none")
    if config.rollout.options.dars.target == "rejected" and not config.loss.critic_weight > 0:
        raise ValueError("config.rollout.options.dars.target=rejected tests the value head's prior: set "
                         "config.loss.critic_weight > 0")


register("generate", "dars", generate=dars, check=check_dars,
         options={"extra": (4, "E: the update's groups (of its B) that go to the hardest first-round prompts, by "
                            "1 - p; the first round samples the other B - E", {"minimum": 1}),
                  "max_groups": (2, "the most extra groups one prompt gets", {"minimum": 1}),
                  "target": ("hard", "whom the extra groups go to: hard (DARS), by 1 - p; rejected (V_0.5), the prompts "
                             "whose first round rejects the value head's prior (advantage.prior_z)",
                             {"choices": ("hard", "rejected")})})


def carried_memory(algo, key):
    """Per slot, its `group.oversample` - 1 candidates that were not trained: the problem, the tokens drawn so
    far with their behaviour log-probabilities, the column to resume at, and how many updates it has waited."""
    s, task = algo.settings, algo.task
    E, G, N = s.text.num_prompts * (s.oversample - 1), s.group_size, task.answer_length
    return {"ids": jnp.full(E, -1, jnp.int32), "problems": task.sample(key, E, "train"),
            "hint_len": jnp.zeros(E, jnp.int32), "tokens": jnp.full((E, G, N), algo.vocab.pad_id, jnp.int32),
            "behaviour": jnp.zeros((E, G, N)), "mask": jnp.zeros((E, G, N)), "stopped": jnp.zeros((E, G), bool),
            "start": jnp.zeros(E, jnp.int32), "age": jnp.zeros(E, jnp.int32), "valid": jnp.zeros(E, bool)}


def _rows_except(num_candidates: int, oversample: int, skipped: jax.Array) -> jax.Array:
    """Candidates slot-major, O per slot; skipped [B] a position in each slot -> the other candidates of every
    slot [B (O - 1)], slot by slot in order: the layout of the carried entries."""
    O = oversample
    others = jnp.arange(O - 1)[None, :]
    return (jnp.arange(num_candidates // O)[:, None] * O + others + (others >= skipped[:, None])).reshape(-1)


def _carried_entries(num_candidates: int, oversample: int, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Candidates [c] slot-major, O per slot, the first O - 1 of each slot its carried entries [b (O - 1)] when
    valid -> (the entry of each candidate [c], whether it resumes one [c])."""
    O = oversample
    slot, position = jnp.arange(num_candidates) // O, jnp.arange(num_candidates) % O
    entry = jnp.minimum(slot * (O - 1) + position, valid.shape[0] - 1)
    return entry, (position < O - 1) & valid[entry]


def resume_carried(algo, memory, plan: Plan, key):
    """The first `oversample` - 1 candidates of every slot continue the groups that slot carried over (its
    last candidate is always fresh)."""
    local = jax.tree.map(mesh_lib.local_share, memory)  # this device's slots
    entry, use = _carried_entries(plan.ids.shape[0], algo.settings.oversample, local["valid"])

    def pick(carried, fresh):
        return jnp.where(use.reshape(-1, *([1] * (fresh.ndim - 1))), carried[entry], fresh)

    G, N = local["tokens"].shape[1:]
    blank = {"tokens": jnp.full((use.shape[0], G, N), algo.vocab.pad_id, jnp.int32),
             "behaviour": jnp.zeros((use.shape[0], G, N)), "mask": jnp.zeros((use.shape[0], G, N)),
             "stopped": jnp.zeros((use.shape[0], G), bool)}
    cap = jnp.full(use.shape, algo.strategy_options("partial")["cap"], jnp.float32)
    plan = plan.replace(ids=pick(local["ids"], plan.ids), problems=jax.tree.map(pick, local["problems"], plan.problems),
                        hint_len=pick(local["hint_len"], plan.hint_len), start=pick(local["start"], plan.start),
                        resume={**{k: pick(local[k], v) for k, v in blank.items()}, "cap": cap})
    return plan, {"resumed_candidates": global_mean(use.astype(jnp.float32))}


def carry_unfinished(algo, memory, groups: Groups, params):
    """Keeps, per slot, the candidates that are not trained this update (unfinished, or finished after the
    first): next update resumes them. One carried for more than `max_age` updates is dropped."""
    O = algo.settings.oversample
    stopped = jnp.zeros(groups.tokens.shape[:2], bool) if groups.pruned is None else groups.pruned
    # Only what the memory keeps (and the choice) crosses devices, not the whole groups.
    every = mesh_lib.gather_shares(dict(ids=groups.ids, problems=groups.problems, hint_len=groups.hint_len,
                                        tokens=groups.tokens, behaviour=groups.behaviour, mask=groups.mask,
                                        stopped=stopped, decided=groups.decided, finished=groups.finished))
    C = every["ids"].shape[0]
    chosen, _ = first_per_slot(every["finished"], O)  # as `train_finished` chooses, on every device
    entry, was_carried = _carried_entries(C, O, memory["valid"])
    age = jnp.where(was_carried, memory["age"][entry] + 1, 1)
    rest = _rows_except(C, O, chosen % O)  # [B (O - 1)]
    kept = jax.tree.map(lambda x: x[rest], every)
    memory = {**{k: kept[k] for k in ("ids", "problems", "hint_len", "tokens", "behaviour", "mask", "stopped")},
              "start": kept["decided"], "age": age[rest],
              "valid": age[rest] <= algo.strategy_options("partial")["max_age"]}
    return memory, {"carried": jnp.mean(memory["valid"].astype(jnp.float32)),
                    "carried_finished": jnp.mean((kept["finished"] & memory["valid"]).astype(jnp.float32))}


def train_finished(algo, memory, groups: Groups, params, key):
    """Trains, per slot, its first finished candidate (a resumed one before a fresh one). Logs the decoding
    steps this update ran (`decode_steps`; N without a stop) and the share of trained groups that were resumed."""
    choice, _ = first_per_slot(groups.finished, algo.settings.oversample)
    kept = take(groups, choice)
    return kept, {"resumed": global_mean((kept.start > 0).astype(jnp.float32)),
                  "decode_steps": global_mean(jnp.max(groups.decided - groups.start).astype(jnp.float32))}


register("control", "partial", init=carried_memory, before=resume_carried, observe=carry_unfinished, single_turn=True,
         after=train_finished, selects=True, stops_early=True,
         options={"cap": (1.0, "a resumed group's tokens are weighted by min(pi / mu, cap)", {"above": 0.0}),
                  "max_age": (4, "updates a carried group may wait before it is dropped", {"minimum": 0})})


def prune_memory(algo, key):
    """How many updates have run (pruning waits `warmup` of them for the value head to learn)."""
    return {"updates": jnp.int32(0)}


def prune_threshold(algo, memory, plan: Plan, key):
    """Every candidate's members are pruned below `below` once `warmup` updates have trained the value head; with
    `balance` = k > 0, ARRoL's balance-aware pruning (`sampling.balanced_cut`): each group keeps its k
    highest-predicted going members on each side of predicted success 1/2."""
    o = algo.strategy_options("prune")
    below = jnp.where(memory["updates"] >= o["warmup"], o["below"], -jnp.inf)
    return plan.replace(prune_at=jnp.full(plan.ids.shape, o["at"], jnp.int32),
                        prune_below=jnp.full(plan.ids.shape, below, jnp.float32)), {}


def count_pruned(algo, memory, groups: Groups, params):
    """Counts the update; logs the share of members pruned (every candidate's)."""
    pruned = jnp.zeros(groups.tokens.shape[:2], bool) if groups.pruned is None else groups.pruned
    return {"updates": memory["updates"] + 1}, {"pruned": global_mean(pruned.astype(jnp.float32))}


def check_prune(config, chosen: dict) -> None:
    if not config.loss.critic_weight > 0:
        raise ValueError("rollout strategy control/prune stops members by the value head's prediction: set "
                         f"config.loss.critic_weight > 0 (a value head), got {config.loss.critic_weight}")
    balance = config.rollout.options.prune.balance
    if balance >= config.group.size:  # every member kept on either side: nothing would ever be pruned
        raise ValueError(f"config.rollout.options.prune.balance = {balance} keeps every member of a group of "
                         f"config.group.size = {config.group.size}: set it below the group size (0: no balance)")


register("control", "prune", init=prune_memory, before=prune_threshold, observe=count_pruned, check=check_prune,
         single_turn=True,
         options={"at": (4, "the column where members may be pruned", {"minimum": 0}),
                  "below": (0.05, "members whose predicted value there is below this stop", {}),
                  "warmup": (20, "updates the value head learns before pruning starts", {"minimum": 0}),
                  "balance": (0, "ARRoL's balance: members each group keeps on each side of predicted success 1/2 "
                              "(its highest-predicted going ones); 0: the plain threshold", {"minimum": 0})})


# --- Control: a temperature tuned to a target (AceReason-Nemotron 1.1's entropy, MicroCoder-GRPO's diversity) -----

def retuned_temperature(temperature, measured, target, step, lowest, highest):
    """The next temperature: log T moves `step` x (target - measured), clipped to [lowest, highest]. What is measured
    (the tempered entropy, the groups' diversity) rises with T, so the loop settles where it is `target`."""
    return jnp.clip(temperature * jnp.exp(step * (target - measured)), lowest, highest)


def temperature_memory(algo, key, *, name: str):
    return {"temperature": jnp.float32(algo.strategy_options(name)["start"])}


def tuned_temperature(algo, memory, hp):
    """This update samples at the controller's temperature (it takes over sampling.temperature)."""
    return hp.replace(temperature=memory["temperature"])


def retune_temperature(algo, memory, groups: Groups, params, *, name: str, measure, metric: str):
    """The temperature retuned towards option `target` of what `measure(algo, memory, groups, params)` (a scalar over
    all devices) read from this update's groups (`retuned_temperature`); logs it as `metric`."""
    o = algo.strategy_options(name)
    value = measure(algo, memory, groups, params)
    temperature = retuned_temperature(memory["temperature"], value, o["target"], o["step"], o["lowest"], o["highest"])
    return {"temperature": temperature}, {metric: value, "sampling_temperature": memory["temperature"]}


def check_temperature(config, chosen, *, name: str) -> None:
    o = config.rollout.options[name]
    if not o.lowest <= o.start <= o.highest:
        raise ValueError(f"config.rollout.options.{name}.start={o.start} must lie in [lowest, highest] = "
                         f"[{o.lowest}, {o.highest}]")
    tuners = [n for n in chosen["control"] if n in TEMPERATURE_CONTROLLERS]
    if len(tuners) > 1:
        raise ValueError(f"config.rollout.control names {', '.join(tuners)}: at most one strategy may set the "
                         f"sampling temperature")


TEMPERATURE_CONTROLLERS: set[str] = set()  # their names (`check_temperature` lets a run choose one at most)


def register_temperature_controller(name: str, measure, metric: str, target: tuple) -> None:
    """A Control strategy that samples at its own temperature and retunes it after each update towards `target`
    (the option's (default, help, bounds)) of `measure` (`retune_temperature`): the controllers differ only there."""
    TEMPERATURE_CONTROLLERS.add(name)
    register("control", name, init=functools.partial(temperature_memory, name=name), tune=tuned_temperature,
             observe=functools.partial(retune_temperature, name=name, measure=measure, metric=metric),
             check=functools.partial(check_temperature, name=name),
             options={"target": target,
                      "step": (1.0, f"log T moves this x (target - {metric}) after each update", {"above": 0.0}),
                      "start": (1.0, "the temperature of the first update (it takes over sampling.temperature)",
                                {"above": 0.0}),
                      "lowest": (0.1, "the lowest temperature it may choose", {"above": 0.0}),
                      "highest": (2.0, "the highest temperature it may choose", {"above": 0.0})})


def mean_tempered_entropy(algo, memory, groups: Groups, params) -> jax.Array:
    """AceReason-Nemotron 1.1: the mean temperature-adjusted entropy of the tokens this update's policy drew (every
    candidate, all devices)."""
    entropy = sampling.tempered_entropy(algo.model, params, groups.prompts, groups.tokens, groups.mask,
                                        algo.vocab.pad_id, memory["temperature"], groups.attend)
    drawn = groups.generated
    total = jax.lax.psum(jnp.sum(entropy * drawn), DATA_AXIS)
    return total / jnp.maximum(jax.lax.psum(jnp.sum(drawn), DATA_AXIS), 1.0)


def mean_diversity(algo, memory, groups: Groups, params) -> jax.Array:
    """MicroCoder-GRPO's diversity-determined temperature: the mean share of distinct completions per group
    (`distinct_share`) over every candidate of the update, all devices (1/G: every member the same; 1: all differ)."""
    return global_mean(distinct_share(groups.tokens, groups.mask))


register_temperature_controller(
    "entropy_target", mean_tempered_entropy, "tempered_entropy",
    (0.3, "the temperature-adjusted entropy (nats per token) the sampling temperature is tuned to keep",
     {"above": 0.0}))
register_temperature_controller(
    "diversity_target", mean_diversity, "diversity",
    (0.75, "the share of distinct completions per group (distinct / G) the sampling temperature is tuned to keep",
     {"above": 0.0, "maximum": 1.0}))


# --- Replay: past completions by outcome (a correct one; Skywork R1V2's Selective Sample Buffer) -----------------

def completion_memory(algo, key):
    """Per training problem: one completion, its behaviour log-probabilities and rewards, and whether one is stored."""
    pool, N, K = algo.settings.pool_size, algo.task.answer_length, len(algo.task.reward_names)
    return {"tokens": jnp.full((pool, N), algo.vocab.pad_id, jnp.int32), "log_probs": jnp.zeros((pool, N)),
            "mask": jnp.zeros((pool, N)), "rewards": jnp.zeros((pool, K)), "stored": jnp.zeros(pool, bool)}


def store_newest(algo, memory, groups: Groups, outcome: bool) -> dict:
    """`memory` (`completion_memory`) keeping, per problem, its newest completion whose verifier outcome (correct or
    not) is `outcome`, drawn by this update's policy (every candidate of the update, all devices)."""
    matches = (_correct(algo, groups) == outcome) & ~groups.replayed
    member = jnp.argmax(matches, axis=1)
    pick = lambda x: jnp.take_along_axis(x, member.reshape(-1, 1, *([1] * (x.ndim - 2))), axis=1)[:, 0]
    drawn = groups.generated > 0
    # A hint's forced tokens had probability 1 under the behaviour: log mu = 0 there.
    entry = {"tokens": pick(groups.tokens), "log_probs": pick(jnp.where(drawn, groups.log_probs, 0.0)),
             "mask": pick(groups.mask), "rewards": pick(groups.rewards)}
    ids, has, entry = mesh_lib.gather_shares((groups.ids, groups.finished_only(matches.any(axis=1)), entry))
    rows = jnp.where(last_occurrence(ids, has), ids, algo.settings.pool_size)  # out of range: dropped
    return {**{k: memory[k].at[rows].set(v, mode="drop") for k, v in entry.items()},
            "stored": memory["stored"].at[rows].set(True, mode="drop")}


def store_correct(algo, memory, groups: Groups, params):
    """Keeps, per problem, its newest correct completion."""
    memory = store_newest(algo, memory, groups, True)
    return memory, {"replay_stored": jnp.mean(memory["stored"].astype(jnp.float32))}


def _as_member(algo, groups: Groups, params, need: jax.Array, entry: dict, weight_of,
               slot: jax.Array | None = None) -> tuple[Groups, jax.Array]:
    """`groups` whose member `slot` [n] (None: the last) is `entry`'s completion (tokens, mask [n, N], rewards [n, K],
    and the behaviour log-probabilities `log_probs` [n, N], None: the current policy's) where `need` [n]: scored by the
    current policy (the ratio starts at 1), its tokens weighted by `weight_of(current log-probs [n, N])` [n, N]; and
    that weight."""
    log_probs, _, values = sampling.score_groups(algo.model, params, groups.prompts, entry["tokens"][:, None],
                                                 entry["mask"][:, None], algo.vocab.pad_id)  # [n, 1, N]
    weight = weight_of(log_probs[:, 0])
    behaviour = log_probs[:, 0] if entry.get("log_probs") is None else entry["log_probs"]
    G = groups.tokens.shape[1]
    slot = jnp.full(need.shape, G - 1) if slot is None else slot
    put_here = (jnp.arange(G)[None, :] == slot[:, None]) & need[:, None]  # [n, G]

    def put(x, row):  # x [n, G, ...], row [n, ...] -> row as member `slot` where needed
        return jnp.where(put_here.reshape(*put_here.shape, *([1] * (x.ndim - 2))), row[:, None], x)

    groups = groups.replace(
        tokens=put(groups.tokens, entry["tokens"]), log_probs=put(groups.log_probs, log_probs[:, 0]),
        mask=put(groups.mask, entry["mask"]), lengths=put(groups.lengths, entry["mask"].sum(-1).astype(jnp.int32)),
        values=None if groups.values is None else put(groups.values, values[:, 0]),
        rewards=put(groups.rewards, entry["rewards"]), weight=put(groups.weight, weight),
        replayed=groups.replayed | put_here,
        behaviour=None if groups.behaviour is None else put(groups.behaviour, behaviour))
    return groups, weight


def replay_stored(algo, groups: Groups, params, need: jax.Array, entry: dict,
                  cap: float) -> tuple[Groups, tuple[jax.Array, jax.Array]]:
    """`groups` whose last member is the stored completion `entry` (`completion_memory`'s fields [n, ...]) where `need`
    [n], scored by the current policy (the ratio starts at 1) and weighted per token by the truncated importance
    weight min(pi / mu, cap) against the policy that drew it (self-normalised in the loss); and (the share of groups
    given one, the mean weight of its tokens)."""
    groups, weight = _as_member(algo, groups, params, need, entry, lambda current: importance_weights(
        current, entry["log_probs"], entry["mask"], cap))
    replayed_tokens = jax.lax.psum(jnp.sum(entry["mask"] * need[:, None]), DATA_AXIS)
    return groups, (global_mean(need.astype(jnp.float32)),
                    jax.lax.psum(jnp.sum(weight * need[:, None]), DATA_AXIS) / jnp.maximum(replayed_tokens, 1.0))


def replay_correct(algo, memory, groups: Groups, params, key):
    """A group that sampled no correct answer gets its problem's stored correct completion as its last member
    (`replay_stored`)."""
    need = ~_correct(algo, groups).any(axis=1) & memory["stored"][groups.ids]  # [n]
    entry = {k: v[groups.ids] for k, v in memory.items()}
    groups, (share, weight) = replay_stored(algo, groups, params, need, entry, algo.strategy_options("correct")["cap"])
    return groups, {"replayed": share, "replay_weight": weight}


register("replay", "correct", init=completion_memory, observe=store_correct, after=replay_correct, needs_pool=True,
         single_turn=True,
         options={"cap": (1.0, "a replayed completion's tokens are weighted by min(pi / mu, cap)", {"above": 0.0})})


OUTCOMES = {"correct": True, "wrong": False}  # selective's memories: the verifier outcome each keeps


def selective_memory(algo, key):
    """Per training problem: its newest correct and its newest wrong completion (`completion_memory` each)."""
    return {name: completion_memory(algo, key) for name in OUTCOMES}


def store_both(algo, memory, groups: Groups, params):
    """Keeps, per problem, its newest correct and its newest wrong completion."""
    memory = {name: store_newest(algo, memory[name], groups, outcome) for name, outcome in OUTCOMES.items()}
    return memory, {f"selective_stored_{name}": jnp.mean(memory[name]["stored"].astype(jnp.float32))
                    for name in OUTCOMES}


def replay_selective(algo, memory, groups: Groups, params, key):
    """Skywork R1V2's Selective Sample Buffer against vanishing advantages: a group whose members are all wrong gets its
    problem's newest stored correct completion as its last member, one whose members are all correct its newest
    stored wrong one (`replay_stored`: importance weighted as replay/correct), so the tied group regains a
    high-|advantage| sample (the lone different member of G has advantage +-sqrt(G - 1) under GRPO's scaling)."""
    correct = _correct(algo, groups)
    all_wrong, all_right = ~correct.any(axis=1), correct.all(axis=1)
    stored = {name: {k: v[groups.ids] for k, v in memory[name].items()} for name in OUTCOMES}
    need = (all_wrong & stored["correct"]["stored"]) | (all_right & stored["wrong"]["stored"])
    entry = jax.tree.map(lambda right, wrong: jnp.where(all_wrong.reshape(-1, *([1] * (right.ndim - 1))), right, wrong),
                         stored["correct"], stored["wrong"])
    groups, (share, weight) = replay_stored(algo, groups, params, need, entry,
                                            algo.strategy_options("selective")["cap"])
    return groups, {"selective_replayed": share, "selective_weight": weight,
                    "selective_replayed_wrong": global_mean((need & all_right).astype(jnp.float32))}


def check_selective(config, chosen) -> None:
    if "correct" in chosen["replay"]:
        raise ValueError("config.rollout.replay names correct and selective: selective already gives a group that solved "
                         "nothing its problem's newest correct completion; choose one")


register("replay", "selective", init=selective_memory, observe=store_both, after=replay_selective, needs_pool=True,
         single_turn=True, check=check_selective,
         options={"cap": (1.0, "a replayed completion's tokens are weighted by min(pi / mu, cap)", {"above": 0.0})})


# --- Replay: recent whole groups (Rollout Replay) ---------------------------------------------------------------

RECENT_FIELDS = ("ids", "problems", "hint_len", "tokens", "behaviour", "mask", "rewards")  # what a buffered group keeps


def replaced_groups(num_groups: int, fraction: float) -> int:
    """How many of the B = `num_groups` groups trained each update replay/recent takes from its buffer: fraction x B
    rounded down to a whole number of groups (0.3 of 8: 2)."""
    return int(math.floor(fraction * num_groups + 1e-9))  # (the epsilon: 0.29 x 100 is 28.999... in floats)


def recent_memory(algo, key):
    """A FIFO buffer of the last `capacity` (E) groups drawn, whole: per row the group's pool id, problem, hint length,
    tokens, behaviour log-probabilities and mask [E, G, N], rewards [E, G, K], the update that drew it (`born`) and
    whether it holds one (`valid`); `head`, the row the next group goes to; `updates`, the updates observed so far."""
    s, task = algo.settings, algo.task
    E, G, N, K = algo.strategy_options("recent")["capacity"], s.group_size, task.answer_length, len(task.reward_names)
    return {"ids": jnp.full(E, -1, jnp.int32), "problems": task.sample(key, E, "train"),
            "hint_len": jnp.zeros(E, jnp.int32), "tokens": jnp.full((E, G, N), algo.vocab.pad_id, jnp.int32),
            "behaviour": jnp.zeros((E, G, N)), "mask": jnp.zeros((E, G, N)), "rewards": jnp.zeros((E, G, K)),
            "born": jnp.zeros(E, jnp.int32), "valid": jnp.zeros(E, bool), "head": jnp.int32(0),
            "updates": jnp.int32(0)}


def pushed(buffer: dict, rows: dict, keep: jax.Array) -> dict:
    """The FIFO `buffer` (`recent_memory`) after the rows of `rows` (its RECENT_FIELDS, leaves [n, ...]) where `keep`
    bool [n], in order, were written from row `head` on, wrapping around at the capacity E (each new group replaces
    the oldest), born at update buffer["updates"]. Of more than E kept rows the last E stay."""
    at, head = fifo_slots(buffer["head"], keep, buffer["valid"].shape[0])
    write = lambda old, new: old.at[at].set(new, mode="drop")  # noqa: E731
    written = jax.tree.map(write, {k: buffer[k] for k in RECENT_FIELDS}, rows)
    return {**buffer, **written, "born": write(buffer["born"], jnp.full(keep.shape, buffer["updates"])),
            "valid": write(buffer["valid"], jnp.ones(keep.shape, bool)), "head": head}


def picked_recent(born: jax.Array, valid: jax.Array, update: jax.Array, count: int, max_age: int,
                  key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`count` rows of the buffer (born, valid [E]) drawn uniformly without replacement among those holding a group of
    age update - born <= `max_age` (0: any age; a group drawn in the update before has age 1): (rows int32 [count],
    ready: that many are eligible; when not, the rows are meaningless and nothing is replayed)."""
    eligible = valid & ((max_age == 0) | (update - born <= max_age))
    _, rows = jax.lax.top_k(jnp.where(eligible, jax.random.uniform(key, born.shape), -1.0), count)
    return rows.astype(jnp.int32), eligible.sum() >= count


def stored_groups(algo, params, like: Groups, stored: dict, cap: float) -> Groups:
    """Buffered groups (RECENT_FIELDS [m, ...]) as `Groups` rows with the optional fields of `like`: every member
    replayed, scored by the current policy (the loss's ratio starts at 1, as `replay_stored`'s) and each drawn token
    weighted by min(pi / mu, cap) against the behaviour log-probabilities stored with it (hints 0); not `finished`,
    so that the memories (which learn from finished groups) take no evidence from an older policy's samples."""
    prompts = algo.task.prompts(stored["problems"], algo.vocab)
    log_probs, _, values = sampling.score_groups(algo.model, params, prompts, stored["tokens"], stored["mask"],
                                                 algo.vocab.pad_id)
    m, G, N = stored["tokens"].shape
    drawn = stored["mask"] * (jnp.arange(N) >= stored["hint_len"][:, None, None])
    zeros = lambda x: None if x is None else jnp.zeros_like(x)
    row = take(like, jnp.zeros(m, jnp.int32))  # (`like`'s structure; every field it has is set below)
    return row.replace(
        ids=stored["ids"], problems=stored["problems"], prompts=prompts, hint_len=stored["hint_len"],
        tokens=stored["tokens"], log_probs=log_probs, mask=stored["mask"],
        lengths=stored["mask"].sum(-1).astype(jnp.int32), values=None if like.values is None else values,
        rewards=stored["rewards"], weight=importance_weights(log_probs, stored["behaviour"], drawn, cap),
        bonus=zeros(row.bonus), replayed=jnp.ones((m, G), bool), start=zeros(row.start),
        decided=None if row.decided is None else jnp.full((m,), N, jnp.int32),
        behaviour=None if row.behaviour is None else stored["behaviour"],
        finished=None if row.finished is None else jnp.zeros((m,), bool), pruned=zeros(row.pruned),
        branched_at=zeros(row.branched_at), predicted=None if row.predicted is None else jnp.full((m,), -1.0))


def replay_recent(algo, memory, params, plan: Plan, generate, key):
    """Rollout Replay ("Improving Data Efficiency for LLM Reinforcement Fine-tuning Through Difficulty-targeted Online
    Data Selection and Rollout Replay"): of the B groups an update trains, R = `fraction` x B (`replaced_groups`,
    rounded down) are groups drawn by recent policies, taken from a FIFO buffer of the last `capacity` groups generated
    (`store_recent`), and only B - R are generated: the plan's first B - R candidates (over all devices), then the R
    buffered groups, drawn uniformly without replacement among those at most `max_age` updates old (0: any in the
    buffer). Until R groups are eligible (the first updates, while the buffer fills) nothing is replaced and all B are
    generated. A replayed group keeps its rewards and tokens; its tokens are weighted by min(pi / mu, cap) against the
    behaviour log-probabilities stored with them (`stored_groups`), its advantages recomputed within the group.

    Fresh samples: B x G completions per update while the buffer fills, (B - R) x G after (`sampled_tokens` shows it).
    The two sizes are two branches of a `lax.cond`, both compiled, one run: the one every run on the device can take
    (`mesh.agreed_max`; runs fill their buffers alike). R must split over the devices (checked when traced). Logs the
    share of groups replayed, their mean age in updates and their tokens' mean weight."""
    o = algo.strategy_options("recent")
    B, D = algo.settings.text.num_prompts, jax.lax.axis_size(DATA_AXIS)
    R = replaced_groups(B, o["fraction"])
    if R % D:
        raise ValueError(f"config.rollout.options.recent.fraction={o['fraction']} replays {R} of the {B} groups per "
                         f"update, which do not split over the {D} devices: make it a multiple of {D} groups")
    if R == 0:
        return generate(plan, key), {"recent_replayed": jnp.float32(0.0), "recent_age": jnp.float32(0.0),
                                     "recent_weight": jnp.float32(0.0)}
    rows, ready = picked_recent(memory["born"], memory["valid"], memory["updates"], R, o["max_age"],
                                jax.random.split(key, 1)[0])  # (the same rows on every device)

    def fresh_and_replayed():
        kept = leading_candidates(plan, B - R)
        groups = generate(kept, key)
        stored = jax.tree.map(lambda x: mesh_lib.local_share(x[rows]), {k: memory[k] for k in RECENT_FIELDS})
        replayed = stored_groups(algo, params, groups, stored, o["cap"])
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), groups, replayed)

    # Every run on the device and every device agrees (a cond the vmapped runs would otherwise turn into a select
    # that runs both branches); the buffer fills the same way in every run, so none waits for another.
    ready = mesh_lib.agreed_max(1 - ready.astype(jnp.int32)) == 0
    groups = jax.lax.cond(ready, lambda: mesh_lib.varying(fresh_and_replayed()),
                          lambda: mesh_lib.varying(generate(plan, key)))
    replayed_mask = groups.mask * groups.replayed[..., None]
    weight = jax.lax.psum(jnp.sum(groups.weight * replayed_mask), DATA_AXIS)
    age = jnp.mean((memory["updates"] - memory["born"][rows]).astype(jnp.float32))
    return groups, {"recent_replayed": jnp.where(ready, R / B, 0.0), "recent_age": jnp.where(ready, age, 0.0),
                    "recent_weight": weight / jnp.maximum(jax.lax.psum(jnp.sum(replayed_mask), DATA_AXIS), 1.0)}


def store_recent(algo, memory, groups: Groups, params):
    """Pushes the groups this update's policy drew (every device's, in order; not the replayed ones) into the FIFO
    buffer (`pushed`), and counts the update. Logs the share of the buffer filled."""
    drawn = groups.finished_only(~groups.replayed.any(axis=1))
    behaviour = groups.log_probs if groups.behaviour is None else groups.behaviour
    rows, drawn = mesh_lib.gather_shares(({"ids": groups.ids, "problems": groups.problems, "hint_len": groups.hint_len,
                                           "tokens": groups.tokens, "behaviour": behaviour, "mask": groups.mask,
                                           "rewards": groups.rewards}, drawn))
    memory = pushed(memory, rows, drawn)
    return {**memory, "updates": memory["updates"] + 1}, {
        "recent_stored": jnp.mean(memory["valid"].astype(jnp.float32))}


def check_recent(config, chosen) -> None:
    """One candidate per slot (every generated group is trained, so the buffer holds trained groups); room for the R
    groups replayed; no tracked baseline (a buffered group keeps none)."""
    if config.group.get("oversample", 1) != 1:
        raise ValueError(f"rollout.replay=recent replays whole trained groups and generates only the others: set "
                         f"config.group.oversample = 1, got {config.group.oversample}")
    o = config.rollout.options.recent
    R = replaced_groups(config.num_prompts, o.fraction)
    if o.capacity < R:
        raise ValueError(f"config.rollout.options.recent.capacity={o.capacity} cannot hold the {R} groups replayed per "
                         f"update (fraction x num_prompts, rounded down): it would never replay")
    tracking = [n for stage, names in chosen.items() for n in names if get(stage, n).baseline]
    if tracking:
        raise ValueError(f"rollout.replay=recent with {', '.join(tracking)}: a replayed group keeps no tracked "
                         f"baseline; choose one")


register("replay", "recent", init=recent_memory, replaces=replay_recent, observe=store_recent, single_turn=True,
         check=check_recent,
         options={"fraction": (0.5, "the share of each update's groups taken from the buffer of recent groups instead "
                               "of generated (rounded down to whole groups)", {"minimum": 0.0, "below": 1.0}),
                  "capacity": (16, "groups the FIFO buffer keeps (the last ones generated)", {"minimum": 1}),
                  "max_age": (0, "replay only groups drawn at most this many updates before (0: any in the buffer)",
                              {"minimum": 0}),
                  "cap": (1.0, "a replayed group's tokens are weighted by min(pi / mu, cap)", {"above": 0.0})})


# --- Replay: the ground truth as an off-policy member (TempSamp-R1; AHPO's expert data where rewards are sparse) ------

def replay_reference(algo, memory, groups: Groups, params, key):
    """A group whose pass rate is at most `below` (0, the default: one that sampled no correct answer) gets the task's
    reference answer in place of its last wrong member: TempSamp-R1's off-policy supervision of all-wrong groups, and
    with `below` > 0 MM-HELIX's AHPO, which learns from expert data while rewards are sparse (few correct members)
    and explores on its own once proficient. The answer is rewarded by the verifier, scored by the current policy
    (the ratio starts at 1) and its tokens weighted by `weight` (with `below` = 1 a group that solved everything
    loses its last member to it). AHPO's expert term as supervised learning, apart from the group: loss.expert_coef
    (with its own threshold, loss.expert_below)."""
    o = algo.strategy_options("reference")
    correct = _correct(algo, groups)
    need = correct.mean(axis=1) <= o["below"]  # [n]
    G = correct.shape[1]
    last_wrong = G - 1 - jnp.argmax(~correct[:, ::-1], axis=1)  # (G - 1 in an all-wrong group)
    answers = algo.task.reference_answers(groups.problems, algo.vocab)
    mask = (answers != algo.vocab.pad_id).astype(jnp.float32)  # the answer and its EOS
    entry = {"tokens": answers, "mask": mask, "log_probs": None,
             "rewards": algo.task.jax_rewards(groups.problems, answers, algo.vocab)}
    groups, _ = _as_member(algo, groups, params, need, entry, lambda current: o["weight"] * mask, last_wrong)
    return groups, {"reference_injected": global_mean(need.astype(jnp.float32))}


register("replay", "reference", after=replay_reference, single_turn=True,
         options={"weight": (1.0, "the reference answer's tokens are weighted by this in the loss", {"above": 0.0}),
                  "below": (0.0, "groups of pass rate at most this get the reference answer (0: only those that "
                            "solved nothing; AHPO: > 0)", {"minimum": 0.0, "maximum": 1.0})})


# --- Replay: scaffolded hints -------------------------------------------------------------------------

def hint_memory(algo, key):
    """Per training problem: its hint tier and how many observations in a row no member solved it."""
    pool = algo.settings.pool_size
    return {"tier": jnp.zeros(pool, jnp.int32), "streak": jnp.zeros(pool, jnp.int32)}


def add_hints(algo, memory, plan: Plan, key):
    """Every candidate whose problem has a hint tier k > 0 gets the first k / (tiers + 1) of its reference
    answer forced at the start of each member (the policy continues from there; the loss skips them)."""
    o = algo.strategy_options("hints")
    answers = algo.task.reference_answers(plan.problems, algo.vocab)
    tier = memory["tier"][plan.ids]
    hint_len = jnp.maximum(plan.hint_len, hint_lengths(tier, _answer_lengths(algo, answers), o["tiers"]))
    hint_len = jnp.where(plan.start > 0, plan.hint_len, hint_len)  # a resumed group keeps the hint it began with
    if o["adaptive"]:  # ADHint: the first share x G members take the hint, the rest measure the difficulty without
        plan = plan.replace(hint_members=jnp.full(hint_len.shape, int(o["share"] * algo.settings.group_size)))
    return plan.replace(hint_len=hint_len), {"hinted": global_mean((hint_len > 0).astype(jnp.float32)),
                                             "hint_tokens": global_mean(hint_len.astype(jnp.float32))}


def track_hints(algo, memory, groups: Groups, params):
    """Moves each observed problem's tier by `hint_update` from its group's pass rate; with `adaptive` (ADHint) sets
    it to `difficulty_tier` of the pass rate of its group's unhinted members (kept where it had none)."""
    o = algo.strategy_options("hints")
    correct = _correct(algo, groups)
    shared = (groups.ids, correct.mean(axis=1), groups.finished_only(jnp.ones_like(groups.ids, bool)))
    if o["adaptive"]:  # (the unhinted members' pass rate, and whether the group had any)
        unhinted = groups.member_hint_len == 0  # [n, G]
        shared += ((correct & unhinted).sum(1) / jnp.maximum(unhinted.sum(1), 1), unhinted.any(1))
    ids, pass_rate, finished, *unhinted_rate = mesh_lib.gather_shares(shared)
    tier, streak = hint_update(memory["tier"][ids], memory["streak"][ids], pass_rate,
                               patience=o["patience"], tiers=o["tiers"], recover=o["recover"])
    if o["adaptive"]:
        free_rate, measured = unhinted_rate
        tier = jnp.where(measured, difficulty_tier(free_rate, o["tiers"]), memory["tier"][ids])
    rows = jnp.where(last_occurrence(ids, finished), ids, algo.settings.pool_size)
    memory = {"tier": memory["tier"].at[rows].set(tier, mode="drop"),
              "streak": memory["streak"].at[rows].set(streak, mode="drop")}
    return memory, {"hint_tier": jnp.mean(memory["tier"].astype(jnp.float32))}


def check_hints(config, chosen):
    """ADHint's members hinted apart from the rest are not kept by the replays that store whole groups."""
    stored = [name for name in ("recent", "selective") if name in chosen["replay"]]
    if config.rollout.options.get("hints", {}).get("adaptive", False) and stored:
        raise ValueError(f"config.rollout.options.hints.adaptive hints only some members, which rollout.replay="
                         f"{stored[0]} does not store: choose one")


register("replay", "hints", init=hint_memory, before=add_hints, observe=track_hints, needs_pool=True, single_turn=True,
         check=check_hints,
         options={"patience": (2, "observations in a row without a solve before a problem's hint grows",
                               {"minimum": 1}),
                  "tiers": (3, "hint tiers: tier k forces k / (tiers + 1) of the reference answer", {"minimum": 1}),
                  "recover": (0.5, "a pass rate at which a problem's hint shrinks a tier",
                              {"minimum": 0.0, "maximum": 1.0}),
                  "adaptive": (False, "ADHint: a problem's tier is its difficulty prior, round((1 - p) x tiers) of "
                               "its unhinted members' pass rate p (patience and recover unused); only the first "
                               "`share` of each group is hinted; hint tokens are trained, weighted by pi(token) "
                               "where the member's advantage is > 0 (losses.hint_modulated)", {}),
                  "share": (0.5, "adaptive: the share of each group's members that get the hint (the rest measure "
                            "the difficulty)", {"minimum": 0.0, "below": 1.0})})


# --- Replay: a curriculum -----------------------------------------------------------------------------

def curriculum_memory(algo, key):
    """The current difficulty level in [0, 1] and the last probe's held-out accuracy at it."""
    return {"level": jnp.float32(algo.strategy_options("curriculum")["start"]), "probe_accuracy": jnp.float32(0.0),
            "updates": jnp.int32(0)}


def curriculum_problems(algo, memory, plan: Plan, key):
    """Redraws the candidates at the current level (`plan_candidates`); it runs before every other strategy's
    `before`, so the plan it replaces is the fresh one."""
    return plan_candidates(algo, key, memory["level"]), {"curriculum_level": memory["level"]}


def probe_curriculum(algo, memory, groups: Groups, params):
    """Every `every` updates, greedy answers to `probe` held-out problems at the current level; at an accuracy
    of `raise_at` or more the level rises by `step` (at most 1). Logs `probe_accuracy`, the last probe's."""
    o = algo.strategy_options("curriculum")
    key = jax.random.fold_in(jax.random.key(o["probe_seed"]), memory["updates"])  # the same on every device

    def probe(memory):
        problems = algo.task.sample(key, o["probe"], "test", memory["level"])
        answers = sampling.sample(algo.model, params, algo.task.prompts(problems, algo.vocab), key,
                                  max_new_tokens=algo.task.answer_length, eos_id=algo.vocab.eos_id,
                                  pad_id=algo.vocab.pad_id, temperature=0.0).tokens
        rewards = algo.task.jax_rewards(problems, answers, algo.vocab)
        accuracy = jnp.mean(rewards[..., algo.task.reward_names.index("correct")] > 0)
        level = jnp.where(accuracy >= o["raise_at"], jnp.minimum(memory["level"] + o["step"], 1.0), memory["level"])
        return {**memory, "level": level, "probe_accuracy": accuracy}

    due = memory["updates"] % o["every"] == o["every"] - 1
    memory = jax.lax.cond(due, probe, lambda m: m, memory)
    return {**memory, "updates": memory["updates"] + 1}, {"probe_accuracy": memory["probe_accuracy"]}


register("replay", "curriculum", init=curriculum_memory, before=curriculum_problems, observe=probe_curriculum,
         single_turn=True,
         draws=True,
         options={"start": (0.0, "the difficulty level at the start, in [0, 1]", {"minimum": 0.0, "maximum": 1.0}),
                  "step": (0.25, "how far the level rises after a passed probe", {"above": 0.0}),
                  "raise_at": (0.5, "the probe's held-out accuracy at which the level rises",
                               {"minimum": 0.0, "maximum": 1.0}),
                  "probe": (64, "held-out problems per probe", {"minimum": 1}),
                  "every": (5, "updates between probes", {"minimum": 1}),
                  "probe_seed": (7, "the probes' problems are drawn from this seed", {})})


# --- Replay: a Thompson sampler of the pool's problems (VADE) -------------------------------------------------

def beta_memory(algo, key):
    """Per training problem: its Beta posterior of the pass rate (alpha, beta), from the uniform prior."""
    pool = algo.settings.pool_size
    return {"alpha": jnp.ones(pool), "beta": jnp.ones(pool)}


def thompson_problems(algo, memory, plan: Plan, key):
    """Draws a pass rate p ~ Beta(alpha, beta) for every problem of the pool and plans the B x oversample problems
    whose draws promise the most information, p (1 - p) (a group's reward variance: a sure problem teaches nothing),
    the same draws on every device. Logs the posterior mean pass rate of the problems planned."""
    s = algo.settings
    draws = jax.random.beta(key, memory["alpha"], memory["beta"])
    _, ids = jax.lax.top_k(draws * (1.0 - draws), s.text.num_prompts * s.oversample)
    ids = mesh_lib.local_share(ids.astype(jnp.int32))
    mean = memory["alpha"][ids] / (memory["alpha"][ids] + memory["beta"][ids])
    return pool_plan(algo, ids), {"posterior_pass_rate": global_mean(mean)}


def count_outcomes(algo, memory, groups: Groups, params):
    """Every posterior decays towards the prior, alpha <- 1 + decay (alpha - 1) (and beta), so that old evidence of a
    moving policy fades; then each observed problem adds its group's solved members to alpha and the others to beta
    (members this update's policy drew, of finished groups; `with_decayed_evidence`)."""
    drawn = ~groups.replayed
    solved = jnp.sum(_correct(algo, groups) & drawn, axis=1).astype(jnp.float32)
    failed = jnp.sum(~_correct(algo, groups) & drawn, axis=1).astype(jnp.float32)
    memory = with_decayed_evidence(algo, memory, groups, {"alpha": solved, "beta": failed},
                                   algo.strategy_options("thompson")["decay"], prior=1.0)
    return memory, {"posterior_evidence": jnp.mean(memory["alpha"] + memory["beta"] - 2.0)}


def with_decayed_evidence(algo, memory: dict, groups: Groups, added: dict, decay, prior: float = 0.0) -> dict:
    """Per-problem evidence that fades: `memory` ({name: [pool, ...]}) after every entry decayed towards `prior` by
    `decay` (old evidence of a moving policy counts less), then each finished candidate's `added` ({name: [n, ...]},
    this device's candidates) added to its problem's row (every device's candidates)."""
    finished = groups.finished_only(jnp.ones_like(groups.ids, bool))
    ids, added, finished = mesh_lib.gather_shares((groups.ids, added, finished))
    rows = jnp.where(finished, ids, algo.settings.pool_size)  # out of range: dropped
    return {k: (prior + decay * (v - prior)).at[rows].add(added[k], mode="drop") for k, v in memory.items()}


def plans_distinct(name: str, repeat: int = 1):
    """The config check of replay strategy `name`, which plans num_prompts x group.oversample / `repeat` distinct
    problems of the pool each update."""
    def check(config, chosen) -> None:
        planned = config.num_prompts * config.group.get("oversample", 1) // repeat
        if config.rollout.pool_size < planned:
            what = "(num_prompts x group.oversample" + (f" / repeat {repeat})" if repeat > 1 else ")")
            raise ValueError(f"rollout strategy replay/{name} plans {planned} distinct problems per update "
                             f"{what} from the pool: config.rollout.pool_size must be at least that, got "
                             f"{config.rollout.pool_size}")
    return check


register("replay", "thompson", init=beta_memory, before=thompson_problems, observe=count_outcomes, needs_pool=True,
         single_turn=True, draws=True, check=plans_distinct("thompson"),
         options={"decay": (0.99, "each update every posterior's evidence is multiplied by this (1: never forgets)",
                            {"minimum": 0.0, "maximum": 1.0})})


# --- Replay: a persistent value tracker per problem (SPO) ----------------------------------------------------

def tracker_memory(algo, key):
    """Per training problem: the discounted sums of its observed reward components and of the samples observed."""
    pool, K = algo.settings.pool_size, len(algo.task.reward_names)
    return {"sums": jnp.zeros((pool, K)), "count": jnp.zeros(pool)}


def tracked_values(memory, prior: float) -> jax.Array:
    """float32 [pool, K]: each problem's tracked value, (sums + prior) / (count + 1): the prior counts as one sample,
    so an unseen problem starts at it and evidence takes over as it accrues."""
    return (memory["sums"] + prior) / (memory["count"][:, None] + 1.0)


def prioritised_problems(algo, memory, plan: Plan, key):
    """SPO's prioritised sampling: the B x oversample candidates drawn from the pool with probability proportional to
    sqrt(p (1 - p)) + floor, p the tracked pass rate (the correct reward's value), without replacement (the same
    draws on every device); each candidate carries its problem's tracked value as the baseline."""
    s, o = algo.settings, algo.strategy_options("tracker")
    values = tracked_values(memory, o["prior"])
    p = jnp.clip(values[:, algo.task.reward_names.index("correct")], 0.0, 1.0)
    priority = jnp.sqrt(p * (1.0 - p)) + o["floor"]
    draws = jax.random.gumbel(key, priority.shape) + jnp.log(priority)  # Gumbel top-k: weighted, no replacement
    _, ids = jax.lax.top_k(draws, s.text.num_prompts * s.oversample)
    ids = mesh_lib.local_share(ids.astype(jnp.int32))
    return pool_plan(algo, ids).replace(baseline=values[ids]), {"tracked_pass_rate": global_mean(p[ids])}


def track_values(algo, memory, groups: Groups, params):
    """Every problem's evidence is discounted by `decay` each update (a policy that moves makes old rewards stale: the
    time-based form of SPO's KL-adaptive discount), then each observed problem adds its members' rewards (members this
    update's policy drew, of finished groups; `with_decayed_evidence`)."""
    drawn = (~groups.replayed).astype(jnp.float32)
    added = {"sums": jnp.einsum("ngk,ng->nk", groups.rewards, drawn), "count": drawn.sum(1)}
    memory = with_decayed_evidence(algo, memory, groups, added, algo.strategy_options("tracker")["decay"])
    return memory, {"tracker_evidence": jnp.mean(memory["count"])}


def check_tracker(config, chosen) -> None:
    plans_distinct("tracker")(config, chosen)
    if config.advantage.estimator != "tracked":
        raise ValueError("rollout strategy replay/tracker keeps each problem's value as the baseline of "
                         f"config.advantage.estimator=tracked; got {config.advantage.estimator!r}")


register("replay", "tracker", init=tracker_memory, before=prioritised_problems, observe=track_values, needs_pool=True,
         single_turn=True, draws=True, baseline=True, check=check_tracker,
         options={"decay": (0.99, "each update every problem's evidence is multiplied by this (1: never forgets)",
                            {"minimum": 0.0, "maximum": 1.0}),
                  "prior": (0.5, "an unseen problem's value of each reward component (it counts as one sample)", {}),
                  "floor": (0.01, "added to every problem's sampling priority sqrt(p (1 - p))", {"above": 0.0})})


# --- Replay: the reference policy's anchors (PVPO) ------------------------------------------------------------

def anchor_memory(algo, key):
    """Per training problem: the reference policy's mean reward per component (set by `pre_rollouts`)."""
    return {"value": jnp.zeros((algo.settings.pool_size, len(algo.task.reward_names)))}


def pre_rollouts(algo, memory, params, key):
    """PVPO's pre-rollouts: `samples` completions of every pool problem by the starting policy (the reference, before
    any update; the whole-parameter model), at the strategy's `temperature`; each problem's anchor is their mean
    reward per component."""
    o, task, vocab = algo.strategy_options("anchor"), algo.task, algo.vocab
    problems = algo.pool
    prompts = task.prompts(problems, vocab)
    samples = sampling.sample_groups_per_prompt(
        algo.policy.model, params, prompts, jax.random.split(key, prompts.shape[0]), group_size=o["samples"],
        max_new_tokens=task.answer_length, eos_id=vocab.eos_id, pad_id=vocab.pad_id, temperature=o["temperature"],
        top_k=algo.settings.top_k)
    rewards = jax.vmap(lambda c: task.jax_rewards(problems, c, vocab), in_axes=1, out_axes=1)(samples.tokens)
    return {"value": rewards.mean(axis=1)}


def anchored_problems(algo, memory, plan: Plan, key):
    """PVPO's data selection: the candidates are drawn uniformly from the pool's problems the reference does not
    always solve (anchor pass rate < 1: the others teach nothing), without replacement (the same draws on every
    device; solved ones only when too few are left); each carries its anchor as the baseline."""
    s = algo.settings
    p = memory["value"][:, algo.task.reward_names.index("correct")]
    draws = jax.random.uniform(key, p.shape) - 2.0 * (p >= 1.0)  # the always-solved come last
    _, ids = jax.lax.top_k(draws, s.text.num_prompts * s.oversample)
    ids = mesh_lib.local_share(ids.astype(jnp.int32))
    return pool_plan(algo, ids).replace(baseline=memory["value"][ids]), {
        "anchor_pass_rate": global_mean(p[ids]), "anchor_solved_share": jnp.mean((p >= 1.0).astype(jnp.float32))}


def check_anchor(config, chosen) -> None:
    plans_distinct("anchor")(config, chosen)
    o = config.rollout.options.anchor
    if o.temperature != config.sampling.temperature:
        raise ValueError(f"config.rollout.options.anchor.temperature={o.temperature} must equal config.sampling."
                         f"temperature={config.sampling.temperature}: the anchors are the reference's rewards as the run "
                         "samples")


register("replay", "anchor", init=anchor_memory, prime=pre_rollouts, before=anchored_problems, needs_pool=True,
         single_turn=True, draws=True, baseline=True, check=check_anchor,
         options={"samples": (8, "completions per pool problem the reference draws before training", {"minimum": 1}),
                  "temperature": (1.0, "their sampling temperature (the run's sampling.temperature)",
                                  {"minimum": 0.0})})


# --- Replay: per-problem pass rates (gdro, pairing, hardest) ---------------------------------------------------

def observed_pass_rates(algo, groups: Groups) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(ids, pass rates, finished) [C] of every candidate of the update, all devices: each group's share of correct
    members among those this update's policy drew."""
    drawn = ~groups.replayed
    passed = jnp.sum(_correct(algo, groups) & drawn, axis=1) / jnp.maximum(jnp.sum(drawn, axis=1), 1)
    finished = groups.finished_only(jnp.ones_like(groups.ids, bool))
    return mesh_lib.gather_shares((groups.ids, passed, finished))


def moved_rates(rate: jax.Array, ids: jax.Array, passed: jax.Array, finished: jax.Array, step: float,
                seen: jax.Array | None = None) -> jax.Array:
    """The pool's pass rates `rate` [pool] after each finished observation (ids, passed, finished [C]) moved its
    problem's rate `step` of the way to the group's pass rate; where `seen` [pool] is given, a problem's first
    observation sets it. One write per problem (its last observation's)."""
    old = rate[ids] if seen is None else jnp.where(seen[ids], rate[ids], passed)
    rows = jnp.where(last_occurrence(ids, finished), ids, rate.shape[0])  # out of range: dropped
    return rate.at[rows].set((1.0 - step) * old + step * passed, mode="drop")


def pass_rate_memory(algo, key):
    """Per training problem: its tracked pass rate (1/2 until observed) and whether it has been observed."""
    pool = algo.settings.pool_size
    return {"rate": jnp.full(pool, 0.5), "seen": jnp.zeros(pool, bool)}


def track_pass_rates(algo, memory, groups: Groups, name: str) -> tuple[dict, dict]:
    """`memory` (`pass_rate_memory`, and whatever else it holds) after this update's observations: each observed
    problem's rate set to its first group's pass rate, then moved strategy `name`'s `rate_step` of the way to each
    new one's (rate_step 1: the newest group's pass rate)."""
    ids, passed, finished = observed_pass_rates(algo, groups)
    rate = moved_rates(memory["rate"], ids, passed, finished, algo.strategy_options(name)["rate_step"], memory["seen"])
    seen = memory["seen"].at[jnp.where(finished, ids, rate.shape[0])].set(True, mode="drop")
    observed = jnp.maximum(seen.sum(), 1)
    return {**memory, "rate": rate, "seen": seen}, {
        "pool_observed": jnp.mean(seen.astype(jnp.float32)),
        "pool_pass_rate": jnp.sum(jnp.where(seen, rate, 0.0)) / observed}


def first_by(keys: tuple, count: int) -> jax.Array:
    """int32 [count]: the indices that come first when sorted by `keys` (arrays [pool], the first the most
    significant; each ascending)."""
    return jnp.lexsort(tuple(k.astype(jnp.float32) for k in reversed(keys)))[:count].astype(jnp.int32)


# --- Replay: multiplicative weights over difficulty classes (Prompt-GDRO) ------------------------------------

def difficulty_memory(algo, key):
    """Per training problem its pass rate (an exponential average of its groups', 1/2 before any), and the
    log-weight of each difficulty class."""
    pool, o = algo.settings.pool_size, algo.strategy_options("gdro")
    return {"rate": jnp.full(pool, 0.5), **class_weight_memory(o)}


def class_weight_memory(o: dict) -> dict:
    """The adversary's state over `o["classes"]` difficulty classes: log-weights (0: equal), and with `o["ema"]` > 0
    each class's exponentially averaged failure rate and its number of observations (`debiased_class_losses`)."""
    zeros = jnp.zeros(o["classes"])
    return {"log_weight": zeros, **({"loss_mean": zeros, "loss_count": zeros} if o["ema"] > 0 else {})}


def difficulty_classes(rate: jax.Array, classes: int) -> jax.Array:
    """int32 [...]: the class of each pass rate in [0, 1], `classes` of equal width from the hardest (0) up."""
    return jnp.minimum(jnp.floor(rate * classes), classes - 1).astype(jnp.int32)


def gdro_problems(algo, memory, plan: Plan, key):
    """Prompt-GDRO: the candidates are drawn by class, class c with probability proportional to exp(log_weight c)
    among the classes holding problems, then uniformly within it (the same draws on every device)."""
    s = algo.settings
    classes = algo.strategy_options("gdro")["classes"]
    member = difficulty_classes(memory["rate"], classes)  # [pool]
    count = jnp.zeros(classes).at[member].add(1.0)
    logits = memory["log_weight"][member] - jnp.log(count[member])  # p(class) / its size, for each problem
    ids = jax.random.categorical(key, logits, shape=(s.text.num_prompts * s.oversample,))
    ids = mesh_lib.local_share(ids.astype(jnp.int32))
    share = jax.nn.softmax(jnp.where(count > 0, memory["log_weight"], -jnp.inf))
    return pool_plan(algo, ids), {"hardest_class_share": share[0]}


def reweight_classes(algo, memory, groups: Groups, params):
    """Each observed problem's pass rate moves towards its group's by `rate_step`; the classes' log-weights take one
    multiplicative-weights step on this update's failure rates (`reweighted_classes`: the classes the policy fails
    most are drawn more), all devices."""
    o = algo.strategy_options("gdro")
    ids, passed, finished = observed_pass_rates(algo, groups)
    member = difficulty_classes(memory["rate"][ids], o["classes"])
    weights = reweighted_classes(memory, member, passed, finished, o["step"], o["ema"])
    rate = moved_rates(memory["rate"], ids, passed, finished, o["rate_step"])
    return {"rate": rate, **weights}, {"mean_pass_rate": jnp.mean(rate)}


def class_failure_rates(member: jax.Array, passed: jax.Array, finished: jax.Array, classes: int):
    """(mean failure rate 1 - pass rate [classes], observed [classes] bool) of the `finished` [C] groups of classes
    `member` [C] with pass rates `passed` [C]."""
    seen = jnp.zeros(classes).at[member].add(finished.astype(jnp.float32))
    failures = jnp.zeros(classes).at[member].add(jnp.where(finished, 1.0 - passed, 0.0))
    return failures / jnp.maximum(seen, 1.0), seen > 0


def debiased_class_losses(mean: jax.Array, count: jax.Array, loss: jax.Array, observed: jax.Array, decay: float):
    """GDRO's EMA debiasing: each observed class's failure rate joins its exponential average (decay `decay`),
    mean <- decay mean + (1 - decay) loss, count <- count + 1; the estimate is mean / (1 - decay^count) (Adam's bias
    correction: the first observation's estimate is that observation, not (1 - decay) x it), for every class observed
    at least once. All [classes] -> (mean, count, estimate, ever observed)."""
    mean = jnp.where(observed, decay * mean + (1.0 - decay) * loss, mean)
    count = count + observed.astype(count.dtype)
    estimate = mean / jnp.where(count > 0, 1.0 - decay ** count, 1.0)
    return mean, count, estimate, count > 0


def reweighted_classes(memory: dict, member: jax.Array, passed: jax.Array, finished: jax.Array, step: float,
                       ema: float) -> dict:
    """GDRO's adversary, multiplicative weights over difficulty classes: the adversary's state (`class_weight_memory`:
    log_weight [classes], and with ema > 0 the classes' averaged failure rates) after the groups of classes `member`
    [C] with pass rates `passed` [C] (the `finished` [C] ones) were observed. Each class gains `step` x its failure
    rate, the loss it is paid: with ema = 0 the classes observed this update, by their groups' mean; with ema > 0
    (GDRO's EMA-debiased sampler) every class observed so far, by its debiased average (`debiased_class_losses`), each
    update: a class's weight grows with how often it fails, not with how often it is drawn (no frequency bias). Then
    shifted to a largest log-weight of 0 (the weights exp(log_weight) are used up to scale)."""
    log_weight = memory["log_weight"]
    loss, observed = class_failure_rates(member, passed, finished, log_weight.shape[0])
    state = {}
    if ema > 0:
        mean, count, loss, observed = debiased_class_losses(memory["loss_mean"], memory["loss_count"], loss, observed,
                                                            ema)
        state = {"loss_mean": mean, "loss_count": count}
    log_weight = log_weight + step * jnp.where(observed, loss, 0.0)
    return {"log_weight": log_weight - log_weight.max(), **state}


# GDRO's EMA debiasing of the adversaries' class losses (both games), an option of each
CLASS_EMA = (0.0, "> 0: the classes' failure rates as bias-corrected exponential averages with this decay, every class "
             "seen so far stepped each update (GDRO's EMA debiasing: weight follows failure, not how often a class is "
             "drawn); 0: this update's batch means, observed classes only", {"minimum": 0.0, "below": 1.0})


register("replay", "gdro", init=difficulty_memory, before=gdro_problems, observe=reweight_classes, needs_pool=True,
         single_turn=True, draws=True,
         options={"classes": (4, "difficulty classes of equal width in pass rate", {"minimum": 1}),
                  "step": (0.1, "multiplicative weights' step: a class's log-weight gains this x its failure rate",
                           {"minimum": 0.0}),
                  "rate_step": (0.5, "a problem's pass rate moves this far towards each new group's",
                                {"minimum": 0.0, "maximum": 1.0}),
                  "ema": CLASS_EMA})


# --- Control: Rollout-GDRO, groups spent by shadow prices over difficulty classes ------------------------------

def rollout_gdro_memory(algo, key):
    """The log shadow price of each difficulty class (all 0: equal prices), `class_weight_memory`."""
    return class_weight_memory(algo.strategy_options("rollout_gdro"))


def priced_worth(p: jax.Array, log_weight: jax.Array) -> jax.Array:
    """float32 [C]: what one more group of each candidate of predicted pass rate p [C] is worth under the square-root
    rule, sqrt(lambda_c) x sigma with sigma = sqrt(p (1 - p)) its reward's std and lambda_c = exp(log_weight [classes])
    the shadow price of its class c (`difficulty_classes`)."""
    price = jnp.exp(log_weight)[difficulty_classes(p, log_weight.shape[0])]
    return jnp.sqrt(price) * BUDGET_TARGETS["uncertain"](p)


def rollout_gdro(algo, memory, plan: Plan, key):
    """Rollout-GDRO ("Group Distributionally Robust Optimization-Driven Reinforcement Learning for LLM Reasoning":
    Multi-Adversary GDRO): the B groups of an update are spent on the B x oversample
    candidates under a fixed total (compute-neutral: always exactly B groups, B x G samples), more of them to the
    difficulty classes whose shadow prices lambda_c the adversary (`reweight_rollout_classes`) has raised.

    The square-root rule. A candidate i of class c and reward std sigma_i = sqrt(p_i (1 - p_i)) (p_i its predicted
    pass rate) given n_i groups contributes a gradient-variance proxy of sigma_i^2 / n_i, priced lambda_c. Minimise
    sum_i lambda_c sigma_i^2 / n_i subject to sum_i n_i = B: with a multiplier mu (the budget's own shadow price),
    d/dn_i [lambda_c sigma_i^2 / n_i + mu n_i] = -lambda_c sigma_i^2 / n_i^2 + mu = 0, so n_i = sqrt(lambda_c)
    sigma_i / sqrt(mu) -- n_i is proportional to sqrt(lambda_c) sigma_i, and mu is whatever makes them sum to B.
    Per class, n_c = sum_{i in c} n_i is proportional to sqrt(lambda_c) x the class's summed std.

    In whole groups: `allocate_groups` with worth w_i = sqrt(lambda_c) sigma_i (`priced_worth`) takes the B largest
    w_i / k (k = 1 .. max_groups), so n_i = floor(w_i / t) for the threshold t that spends exactly B (mu = t^2):
    the square-root rule rounded down, exact where it is in whole numbers; at most `max_groups` each. Prompts
    predicted always right or always wrong (sigma 0) get none."""
    o = algo.strategy_options("rollout_gdro")
    return spend_budget(algo, plan, lambda p: priced_worth(p, memory["log_weight"]), o["max_groups"])


def reweight_rollout_classes(algo, memory, groups: Groups, params):
    """The shadow prices' adversary: each class of the groups observed this update (by the pass rate predicted when
    they were planned, the class they were priced in) gains `step` x its mean failure rate in log price
    (`reweighted_classes`, as Prompt-GDRO's weights: exponentiated gradient, no-regret), all devices. Logs the
    hardest class's share of the prices."""
    o = algo.strategy_options("rollout_gdro")
    _, passed, finished = observed_pass_rates(algo, groups)
    predicted = mesh_lib.gather_shares(groups.predicted)
    member = difficulty_classes(predicted_or_half(predicted), o["classes"])
    weights = reweighted_classes(memory, member, passed, finished, o["step"], o["ema"])
    return weights, {"hardest_class_price": jax.nn.softmax(weights["log_weight"])[0]}


# A strategy of its own rather than a `variance_budget` target: it keeps prices (memory) and learns them (observe),
# which variance_budget's stateless targets never need; the two share `spend_budget`, the worth its parameter.
register("control", "rollout_gdro", init=rollout_gdro_memory, before=rollout_gdro, observe=reweight_rollout_classes,
         selects=True, reads_predictions=True,
         options={"classes": (4, "difficulty classes of equal width in predicted pass rate", {"minimum": 1}),
                  "step": (0.1, "the shadow prices' multiplicative-weights step: a class's log price gains this x its "
                           "failure rate", {"minimum": 0.0}),
                  "max_groups": (2, "the most groups one prompt gets", {"minimum": 1}),
                  "ema": CLASS_EMA})


RATE_STEP = (1.0, "a problem's tracked pass rate moves this far from its last value towards each new group's (1: the "
             "newest group's)", {"minimum": 0.0, "maximum": 1.0})


# --- Replay: positive-negative pairing ------------------------------------------------------------------------

def pairing_problems(algo, memory, plan: Plan, key):
    """Positive-negative pairing ("Beyond Variance: ... Bidirectional Pairing"): half the B x oversample candidates
    (the first half, rounded up) are hard-but-solvable problems q+, the lowest tracked pass rates that are still
    > 0 (a reliable positive anchor: a rare success to learn from), the other half easy-but-brittle ones q-, the
    highest that are still < 1 (a rare failure to learn from), no problem in both. A problem never observed comes
    before either (the paper estimates every prompt's success rate from several rollouts before it pairs: here the
    pool is swept once, in random order, before pairing starts); when too few problems qualify the halves are
    filled with the nearest (q+: the never-solved, q-: the always-solved). Ties in random order, the same draws on
    every device; the halves one after the other, so that with an even number of slots each slot's `group.oversample`
    candidates come from one half. Rates as `track_pass_rates` keeps them (with rate_step < 1 a problem solved once
    keeps a decaying rate > 0, so stays "solvable"; 1, the default, reads the newest group's).

    Not here: Weighted GRPO, the paper's pair-level reweighting of the outcomes, whose weights the abstract does not
    give (GRPO's std scaling already gives a lone success in a group of pass rate p the advantage sqrt((1 - p) / p),
    a lone failure -sqrt(p / (1 - p)))."""
    s = algo.settings
    num = s.text.num_prompts * s.oversample
    rate, unseen = memory["rate"], ~memory["seen"]
    noise = jax.random.uniform(key, rate.shape)
    hard = first_by((~unseen, rate <= 0.0, rate, noise), (num + 1) // 2)
    taken = jnp.zeros(rate.shape, bool).at[hard].set(True)
    easy = first_by((taken, ~unseen, rate >= 1.0, -rate, noise), num // 2)
    ids = jnp.concatenate([hard, easy])
    known = lambda x: jnp.sum(jnp.where(unseen[x], 0.0, rate[x])) / jnp.maximum(jnp.sum(~unseen[x]), 1)
    return pool_plan(algo, mesh_lib.local_share(ids)), {
        "pairing_explored": jnp.mean(unseen[ids].astype(jnp.float32)), "pairing_hard_rate": known(hard),
        "pairing_easy_rate": known(easy)}


def track_pairing(algo, memory, groups: Groups, params):
    return track_pass_rates(algo, memory, groups, "pairing")


register("replay", "pairing", init=pass_rate_memory, before=pairing_problems, observe=track_pairing, needs_pool=True,
         single_turn=True, draws=True, check=plans_distinct("pairing"), options={"rate_step": RATE_STEP})


# --- Replay: a hard-focus stage (DRIVE) -----------------------------------------------------------------------

def hardest_memory(algo, key):
    """Per training problem its tracked pass rate (`pass_rate_memory`), and the updates run so far."""
    return {**pass_rate_memory(algo, key), "updates": jnp.int32(0)}


def hardest_problems(algo, memory, plan: Plan, key):
    """DRIVE's two RL stages: for the first `after` updates the broad stage (the plan's uniform draws from the pool,
    left as they are), then the hard-focus stage: every update plans the B x oversample problems of lowest tracked
    pass rate (the pool's hardest, retained while they stay the hardest: their rates keep being tracked), ties in
    random order. With `unsolved_last` a problem whose tracked rate is 0 (all wrong: no group of it carries a
    gradient) comes after every other; a problem never observed counts at 1/2. DRIVE's larger groups in the hard
    stage (64 rollouts against 8): with `repeat` k the hard stage plans the B x oversample / k hardest problems k
    times each (`repeated_hardest`), and `advantage.merge_problem_groups` (required) makes each one's k groups a single
    group of k x G members: the group size of a compiled program stays G. DRIVE's shorter response window in the
    broad stage: with `window` > 0 the broad stage's completions stop at `window` tokens (`stage_window`: a traced
    cap, the compiled answer length N stays one), the hard focus's run to N."""
    o, s = algo.strategy_options("hardest"), algo.settings
    rate = memory["rate"]
    unsolved = (rate <= 0.0) if o["unsolved_last"] else jnp.zeros(rate.shape, bool)
    hardest = repeated_hardest((unsolved, rate, jax.random.uniform(key, rate.shape)),
                               s.text.num_prompts * s.oversample, o["repeat"])
    focus = memory["updates"] >= o["after"]
    ids = jnp.where(focus, mesh_lib.local_share(hardest), plan.ids)
    planned = pool_plan(algo, ids)
    if o["window"]:
        cap = stage_window(focus, o["window"], algo.task.answer_length)
        planned = planned.replace(length_cap=jnp.full(ids.shape, cap, jnp.int32))
    return planned, {"hard_focus": focus.astype(jnp.float32), "planned_pass_rate": global_mean(rate[ids])}


def stage_window(focus: jax.Array, window: int, length: int) -> jax.Array:
    """int32 []: the completion columns a member may use this update (DRIVE: a short response window in the broad
    stage, the full answer length in the hard focus): `window` before the hard focus (bool [] `focus`), `length`
    after it, never more than `length`."""
    return jnp.where(focus, length, min(window, length)).astype(jnp.int32)


def repeated_hardest(keys: tuple, count: int, repeat: int) -> jax.Array:
    """int32 [count]: the count / repeat problems that come first by `keys` (`first_by`), each `repeat` times in a
    row."""
    return jnp.repeat(first_by(keys, count // repeat), repeat)


def check_hardest(config, chosen) -> None:
    o = config.rollout.options.hardest
    planned = config.num_prompts * config.group.get("oversample", 1)
    if planned % o.repeat:
        raise ValueError(f"config.rollout.options.hardest.repeat={o.repeat} must divide the {planned} problems planned "
                         "per update (num_prompts x group.oversample)")
    if o.window and not o.after:
        raise ValueError(f"config.rollout.options.hardest.window={o.window} shortens the broad stage's completions, "
                         "but config.rollout.options.hardest.after=0 leaves no broad stage")
    if o.repeat > 1 and not config.advantage.merge_problem_groups:
        raise ValueError(f"config.rollout.options.hardest.repeat={o.repeat} plans each hard problem {o.repeat} times "
                         "to train it as one larger group: set config.advantage.merge_problem_groups=True")
    plans_distinct("hardest", repeat=o.repeat)(config, chosen)


def track_hardest(algo, memory, groups: Groups, params):
    memory, metrics = track_pass_rates(algo, memory, groups, "hardest")
    return {**memory, "updates": memory["updates"] + 1}, metrics


register("replay", "hardest", init=hardest_memory, before=hardest_problems, observe=track_hardest, needs_pool=True,
         single_turn=True, draws=True, check=check_hardest,
         options={"after": (20, "updates of uniform draws from the pool (the broad stage) before the hard focus",
                            {"minimum": 0}),
                  "repeat": (1, "the hard focus plans each of its problems this many times, merged into one group of "
                             "repeat x group.size members (DRIVE's larger groups; needs advantage.merge_problem_groups)",
                             {"minimum": 1}),
                  "window": (0, "> 0: the broad stage's completions stop at this many tokens (DRIVE's shorter response "
                             "window; cut off as by the length limit); 0: off", {"minimum": 0}),
                  "rate_step": RATE_STEP,
                  "unsolved_last": (True, "problems of tracked pass rate 0 come after every other in the hard focus",
                                    {})})
