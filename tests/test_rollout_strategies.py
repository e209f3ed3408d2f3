"""Rollout strategies (jaxrl.rollout): the pure pieces against formulas, the hooks on hand-made groups."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl import algos, config as config_lib, mesh as mesh_lib, rollout, sampling
from jaxrl.rollout import tokens as strategies
from jaxrl.algos.text import TextGRPO, TextGRPOHyperparams
from jaxrl.rewards import sparse_rewards
from helpers import tiny_grpo_config


def test_tie_ranks_spread_each_group_over_minus_half_to_half():
    ranks = rollout.tie_ranks(jnp.asarray([[0.3, -1.0, 2.0, 0.5], [1.0, 1.0, 0.0, 1.0]]))
    np.testing.assert_allclose(ranks, [[-1 / 6, -1 / 2, 1 / 2, 1 / 6], [-1 / 6, 1 / 6, -1 / 2, 1 / 2]], rtol=1e-6)


def test_importance_weights_are_truncated_ratios_and_zero_off_the_mask():
    log_pi = jnp.log(jnp.asarray([0.5, 0.2, 0.9, 0.4]))
    log_mu = jnp.log(jnp.asarray([0.25, 0.4, 0.3, 0.4]))
    mask = jnp.asarray([1.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(rollout.importance_weights(log_pi, log_mu, mask, cap=2.0), [2.0, 0.5, 2.0, 0.0],
                               rtol=1e-6)
    np.testing.assert_allclose(rollout.importance_weights(log_pi, log_mu, mask, cap=1.0), [1.0, 0.5, 1.0, 0.0],
                               rtol=1e-6)


def test_hints_rise_after_patience_failures_and_are_removed_as_the_pass_rate_recovers():
    tier, streak = jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32)
    seen = []
    for pass_rate in [0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 0.0, 0.75, 0.5, 0.5]:
        tier, streak = rollout.hint_update(tier, streak, jnp.asarray([pass_rate]), patience=2, tiers=2, recover=0.5)
        seen.append(int(tier[0]))
    # up after 2 failures in a row, again after 2 more; a partial success resets the count; at the top
    # tier failures change nothing; each observation at >= 0.5 takes one tier away, down to none.
    assert seen == [0, 1, 1, 2, 2, 2, 2, 1, 0, 0]
    np.testing.assert_array_equal(rollout.hint_lengths(jnp.arange(4), jnp.full(4, 9), tiers=3), [0, 2, 4, 6])


def test_budget_allocation_never_exceeds_the_budget_and_skips_the_sure_prompts():
    p = jnp.asarray([0.5, 0.0, 1.0, 0.9, 0.45, 0.02, 0.6, 1.0])
    uncertainty = jnp.sqrt(p * (1 - p))
    for num_groups, max_groups in [(4, 2), (6, 3), (8, 1), (3, 4)]:
        chosen = np.asarray(rollout.allocate_groups(uncertainty, num_groups, max_groups))
        counts = np.bincount(chosen, minlength=8)
        assert len(chosen) == num_groups and counts.max() <= max_groups, (num_groups, max_groups, counts)
        assert (np.diff(chosen) >= 0).all()
        # A candidate gets its next group only if no other candidate's next group is worth more.
        worth_next = np.where(counts < max_groups, np.asarray(uncertainty) / (counts + 1), -1.0)
        worth_last = np.where(counts > 0, np.asarray(uncertainty) / np.maximum(counts, 1), np.inf)
        assert worth_next.max() <= worth_last.min() + 1e-7, (counts, worth_next, worth_last)
    # sqrt(p (1 - p)) = 0.5, 0, 0, 0.3, 0.497, 0.14, 0.49, 0: the sure prompts get none, the most uncertain
    # a second group once it is worth more (0.25, 0.249) than a first one elsewhere (0.14).
    counts = np.bincount(np.asarray(rollout.allocate_groups(uncertainty, 4, 2)), minlength=8)
    np.testing.assert_array_equal(counts, [1, 0, 0, 1, 1, 0, 1, 0])
    counts = np.bincount(np.asarray(rollout.allocate_groups(uncertainty, 6, 3)), minlength=8)
    np.testing.assert_array_equal(counts, [2, 0, 0, 1, 2, 0, 1, 0])
    with pytest.raises(ValueError, match="9 groups cannot be spread over 8 candidates at most 1 each"):
        rollout.allocate_groups(uncertainty, 9, 1)


def test_last_occurrence_keeps_one_write_per_id():
    ids = jnp.asarray([3, 1, 3, 2, 1, 3])
    write = jnp.asarray([True, True, True, False, False, False])
    np.testing.assert_array_equal(rollout.last_occurrence(ids, write), [False, True, True, False, False, False])


def test_unknown_or_misplaced_strategies_are_config_errors():
    for overrides, message in [
        ({"rollout.filter": "nope"}, "config.rollout.filter: unknown filter strategy 'nope'"),
        ({"rollout.replay": "correct"}, "rollout strategy replay/correct keeps memory per training problem"),
        ({"rollout.control": "", "group.oversample": 2}, "needs exactly one selecting Control strategy"),
        ({"rollout.generate": ""}, "config.rollout.generate must name exactly one strategy"),
        ({"rollout.control": "variance_budget"}, "control/variance_budget reads predicted pass rates: name a predictor "
                                                 "(success_predictor, attention_predictor) in config.rollout.filter"),
        ({"rollout.filter": "success_predictor,attention_predictor"},
         "config.rollout.filter names 2 pass-rate predictors (success_predictor, attention_predictor); at most one"),
        ({"rollout.filter": "attention_predictor", "rollout.options.attention_predictor.capacity": 0},
         "rollout.options.attention_predictor.capacity"),
        ({"rollout.generate": "tree", "rollout.options.tree.branches": 4},
         "config.rollout.options.tree.branches = 4 must divide config.group.size = 4 into branches of two or more"),
        ({"rollout.generate": "tree", "advantage.estimator": "rloo"}, "config.advantage.estimator='rloo' is not one of them"),
        ({"rollout.options.hints.wait": 3, "rollout.replay": "hints", "rollout.pool_size": 4},
         "config.rollout.options.hints has unknown keys ['wait']"),
        ({"rollout.options.hints.adaptive": True, "rollout.replay": "hints,recent", "rollout.pool_size": 4},
         "config.rollout.options.hints.adaptive hints only some members, which rollout.replay=recent"),
        ({"advantage.estimator": "hint_posterior", "rollout.replay": "hints", "rollout.pool_size": 4},
         "config.advantage.estimator='hint_posterior' (ADHint) compares hinted and unhinted members"),
        ({"rollout.control": "partial", "group.oversample": 1},
         "rollout strategy partial starts more groups than it trains: set config.group.oversample >= 2"),
        ({"rollout.control": "partial,dynamic_sampling", "group.oversample": 2}, "needs exactly one selecting"),
        ({"rollout.generate": "tree", "rollout.control": "partial", "group.oversample": 2},
         "rollout.generate=tree with rollout.control=partial"),
        ({"rollout.control": "dynamic_sampling,prune"}, "control/prune stops members by the value head's prediction: "
                                                         "set config.loss.critic_weight > 0"),
        ({"rollout.control": "dynamic_sampling,prune", "loss.critic_weight": 0.5, "rollout.options.prune.balance": 64},
         "config.rollout.options.prune.balance = 64 keeps every member of a group of config.group.size = "),
        ({"rollout.control": "entropy_target,diversity_target"},
         "config.rollout.control names entropy_target, diversity_target: at most one strategy may set the sampling"),
        ({"rollout.control": "diversity_target", "rollout.options.diversity_target.target": 1.5},
         "config.rollout.options.diversity_target.target must lie in (0, 1], got 1.5"),
        ({"rollout.control": "rollout_gdro", "group.oversample": 2},
         "control/rollout_gdro reads predicted pass rates: name a predictor"),
        ({"rollout.replay": "recent", "group.oversample": 2}, "set config.group.oversample = 1, got 2"),
        ({"rollout.replay": "recent", "group.oversample": 1, "rollout.options.recent.capacity": 3},
         "config.rollout.options.recent.capacity=3 cannot hold the 4 groups replayed per update"),
        ({"rollout.replay": "recent", "rollout.options.recent.fraction": 1.0},
         "rollout.options.recent.fraction"),
    ]:
        config = tiny_grpo_config("")
        config.unlock()  # (an unknown option key needs an unlocked config, as in a notebook)
        config_lib.set_values(config, overrides)
        with pytest.raises(ValueError, match=re.escape(message)):
            algos.validate(config)


@pytest.fixture(scope="module")
def replay_algo():
    config = tiny_grpo_config("", **{"rollout.replay": "correct,hints", "rollout.pool_size": 6,
                                     "rollout.options.correct.cap": 1.5, "group.size": 3})
    algo, _ = algos.build(config, mesh_lib.make_mesh(1))
    return algo.parts  # the TextGRPO the strategies' hooks read


@functools.lru_cache(maxsize=None)
def _on_mesh_program(algo, hook):
    return jax.jit(jax.shard_map(functools.partial(hook, algo), mesh=algo.mesh, in_specs=P(), out_specs=P(),
                                 check_vma=False))


def on_mesh(algo, hook, *args):
    """`hook(algo, *args)` under shard_map on the algorithm's mesh (the hooks' collectives need its data axis),
    compiled once per algorithm and hook: the tests call a hook again on arguments of the same shapes."""
    return _on_mesh_program(algo, hook)(*args)


@functools.partial(jax.jit, static_argnums=0)  # one program: eager calls compile each primitive separately
def hand_made_groups(algo, params, key):
    """Two groups of 3 for problems 4 and 1 of the pool: group 0 all wrong, group 1 with member 1 correct
    (its completion the reference answer)."""
    ids = jnp.asarray([4, 1])
    plan = rollout.Plan(ids, algo.pool[ids], jnp.zeros(2, jnp.int32), jnp.full(2, -1.0), jnp.zeros(2, jnp.int32))
    groups = on_mesh(algo, strategies.independent, params, TextGRPOHyperparams(), plan, key)
    answers = algo.task.reference_answers(plan.problems, algo.vocab)
    mask = (answers != algo.vocab.pad_id).astype(jnp.float32)  # the answer and its EOS
    tokens = groups.tokens.at[1, 1].set(answers[1])
    rewards = jnp.zeros_like(groups.rewards).at[1, 1].set(1.0)
    return groups.replace(tokens=tokens, mask=groups.mask.at[1, 1].set(mask[1]), rewards=rewards), answers, mask


def test_replay_stores_correct_completions_and_injects_them_with_importance_weights(replay_algo):
    algo = replay_algo
    state = jax.jit(algo.init)(jax.random.key(0))  # jitted: eager calls compile each primitive separately
    params, memory = state.params, state.memory["correct"]
    # Arrays read back as NumPy: indexing them eagerly would compile each slice separately.
    groups, answers, mask = jax.device_get(hand_made_groups(algo, params, jax.random.key(1)))
    # Problem 4 has a correct completion in memory from an older policy: its reference answer, with
    # behaviour log-probabilities log 0.5 per token.
    behaviour = jnp.full(answers.shape[1:], jnp.log(0.5)) * mask[0]
    memory = {**memory, "tokens": memory["tokens"].at[4].set(answers[0]), "log_probs": memory["log_probs"].at[4].set(behaviour),
              "mask": memory["mask"].at[4].set(mask[0]), "rewards": memory["rewards"].at[4].set(jnp.asarray([1.0, 1.0])),
              "stored": memory["stored"].at[4].set(True)}

    memory, _ = jax.device_get(on_mesh(algo, strategies.store_correct, memory, groups, None))
    assert bool(memory["stored"][1]) and int(memory["stored"].sum()) == 2
    np.testing.assert_array_equal(memory["tokens"][1], answers[1])  # group 1's correct member
    np.testing.assert_allclose(memory["log_probs"][1], groups.log_probs[1, 1] * groups.mask[1, 1])

    out, metrics = jax.device_get(on_mesh(algo, strategies.replay_correct, memory, groups, params, None))
    np.testing.assert_array_equal(out.replayed, [[False, False, True], [False, False, False]])
    np.testing.assert_array_equal(out.tokens[0, 2], answers[0])
    np.testing.assert_array_equal(out.rewards[0, 2], [1.0, 1.0])
    current, _, _ = jax.jit(functools.partial(sampling.score, algo.model), static_argnums=4)(
        params, groups.prompts[:1], answers[:1], mask[:1], algo.vocab.pad_id)
    np.testing.assert_allclose(out.log_probs[0, 2], current[0], rtol=1e-5, atol=1e-6)  # the ratio starts at 1
    expected = np.minimum(np.exp(np.asarray(current[0]) - np.asarray(behaviour)), 1.5) * np.asarray(mask[0])
    np.testing.assert_allclose(out.weight[0, 2], expected, rtol=1e-5)
    # Everything else is untouched: the other members of group 0, and group 1 (it has a correct member).
    for name in ("tokens", "log_probs", "mask", "rewards", "weight"):
        np.testing.assert_array_equal(getattr(out, name)[0, :2], getattr(groups, name)[0, :2])
        np.testing.assert_array_equal(getattr(out, name)[1], getattr(groups, name)[1])
    assert float(metrics["replayed"]) == 0.5


def test_the_reference_answer_joins_a_group_that_solved_nothing():
    """replay/reference (TempSamp-R1): group 0 (all wrong) gets the task's reference answer as its last member,
    rewarded by the verifier, scored by the current policy and weighted by `weight`; group 1 (solved) is untouched."""
    config = tiny_grpo_config("", **{"rollout.replay": "reference", "rollout.pool_size": 6, "group.size": 3,
                                     "rollout.options.reference.weight": 0.5})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    params = algo.init(jax.random.key(0)).params
    # Read back as NumPy: indexing them eagerly would compile each slice separately.
    groups, answers, mask = jax.device_get(hand_made_groups(algo, params, jax.random.key(1)))
    out, metrics = jax.device_get(on_mesh(algo, strategies.replay_reference, {}, groups, params, None))
    np.testing.assert_array_equal(out.replayed, [[False, False, True], [False, False, False]])
    np.testing.assert_array_equal(out.tokens[0, 2], answers[0])
    np.testing.assert_array_equal(out.rewards[0, 2], [1.0, 1.0])  # the verifier accepts the reference
    current, _, _ = sampling.score(algo.model, params, groups.prompts[:1], answers[:1], mask[:1], algo.vocab.pad_id)
    np.testing.assert_allclose(out.log_probs[0, 2], current[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out.weight[0, 2], 0.5 * mask[0])
    for name in ("tokens", "log_probs", "mask", "rewards", "weight"):
        np.testing.assert_array_equal(getattr(out, name)[0, :2], getattr(groups, name)[0, :2])
        np.testing.assert_array_equal(getattr(out, name)[1], getattr(groups, name)[1])
    assert float(metrics["reference_injected"]) == 0.5


def hinted_plan(algo):
    """(a fresh state, the hints' memory with problem 2 at tier 2, `add_hints`' plan of pool problems 2 and 0 from it,
    its metrics)."""
    state = algo.init(jax.random.key(0))
    memory = {**state.memory["hints"], "tier": state.memory["hints"]["tier"].at[2].set(2)}
    ids = jnp.asarray([2, 0])
    plan = rollout.Plan(ids, algo.pool[ids], jnp.zeros(2, jnp.int32), jnp.full(2, -1.0), jnp.zeros(2, jnp.int32))
    return (state, memory, *on_mesh(algo, strategies.add_hints, memory, plan, None))


def test_hints_force_a_prefix_of_the_reference_answer_that_the_loss_skips(replay_algo):
    algo = replay_algo
    state, _, plan, metrics = hinted_plan(algo)
    answers = algo.task.reference_answers(plan.problems, algo.vocab)
    length = int(strategies._answer_lengths(algo, answers)[0])
    hint = 2 * length // 4  # tier 2 of 3
    np.testing.assert_array_equal(plan.hint_len, [hint, 0])
    groups = on_mesh(algo, strategies.independent, state.params, TextGRPOHyperparams(), plan, jax.random.key(3))
    np.testing.assert_array_equal(groups.tokens[0, :, :hint], np.broadcast_to(answers[0, :hint], (3, hint)))
    assert float(groups.weight[0, :, :hint].sum()) == 0 and float(groups.generated[0, :, :hint].sum()) == 0
    np.testing.assert_array_equal(groups.weight[0, :, hint:], groups.mask[0, :, hint:])
    np.testing.assert_array_equal(groups.weight[1], groups.mask[1])
    assert float(metrics["hinted"]) == 0.5


def test_adhint_difficulty_prior_sets_the_tier_and_only_the_first_members_are_hinted():
    """ADHint's hint ratio from the difficulty prior by hand (tiers 3): tier = floor((1 - p) 3 + 1/2) of the unhinted
    pass rate p: p = 0 -> 3, 1/2 -> 2, 3/4 -> 1, 0.9 -> 0, 1 -> 0; members: the first hint_members of a group get
    its hint."""
    np.testing.assert_array_equal(rollout.difficulty_tier(jnp.asarray([0.0, 0.5, 0.75, 0.9, 1.0]), 3), [3, 2, 1, 0, 0])
    np.testing.assert_array_equal(rollout.member_hint_lengths(jnp.asarray([4, 6]), jnp.asarray([2, 0]), 3),
                                  [[4, 4, 0], [0, 0, 0]])
    np.testing.assert_array_equal(rollout.member_hint_lengths(jnp.asarray([4, 6]), None, 3), [[4, 4, 4], [6, 6, 6]])


def test_adhint_hints_half_of_each_group_and_sets_the_tier_from_the_unhinted_members():
    """rollout.options.hints.adaptive with G = 4, share 1/2: problem 2 at tier 2 of 3 forces 2/4 of its answer on
    members 0 and 1 only (their hint weighs 0 in the rollout's weights; members 2, 3 draw freely). Observed with
    correct (1, 1 | 0, 0), problem 2's unhinted pass rate 0 sets tier 3; problem 0 (unhinted: all its members are
    free) with (1, 0, 1, 1) has p = 3/4: tier floor(1/4 x 3 + 1/2) = 1."""
    config = tiny_grpo_config("", **{"rollout.replay": "hints", "rollout.pool_size": 6, "group.size": 4,
                                     "rollout.options.hints.adaptive": True})
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    state, memory, plan, _ = hinted_plan(algo)
    answers = algo.task.reference_answers(plan.problems, algo.vocab)
    hint = 2 * int(strategies._answer_lengths(algo, answers)[0]) // 4
    np.testing.assert_array_equal(plan.hint_members, [2, 2])
    groups = on_mesh(algo, strategies.independent, state.params, TextGRPOHyperparams(), plan, jax.random.key(3))
    np.testing.assert_array_equal(groups.member_hint_len, [[hint, hint, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(groups.tokens[0, :2, :hint], np.broadcast_to(answers[0, :hint], (2, hint)))
    assert float(groups.weight[0, :2, :hint].sum()) == 0
    np.testing.assert_array_equal(groups.weight[0, 2:], groups.mask[0, 2:])
    correct = jnp.asarray([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
    groups = groups.replace(rewards=jnp.stack([correct, correct], -1), finished=None)
    memory, _ = on_mesh(algo, strategies.track_hints, memory, groups, None)
    np.testing.assert_array_equal(memory["tier"][jnp.asarray([2, 0])], [3, 1])


@pytest.fixture(scope="module")
def trained_strategies():
    """One program for the tests that train strategies (its compile is most of their time): the docs' example
    filter (registered from docs/grpo.md until the module ends), a curriculum that every probe raises by 0.5 on
    a pool of 64 problems of up to 3 digits, and pruning by a value head of every member at column 0 (below is
    above any reward) from the third update. Three updates, one chunk each: (algorithm, metric rows, state)."""
    from helpers import ROOT

    readme = open(f"{ROOT}/docs/grpo.md").read()
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "rollout.register(" in block)
    try:
        exec(snippet, {})
        config = tiny_grpo_config("", **{
            "rollout.filter": "shortest_first", "rollout.replay": "curriculum", "rollout.pool_size": 64,
            "rollout.options.curriculum.every": 1, "rollout.options.curriculum.raise_at": 0.0,
            "rollout.options.curriculum.step": 0.5, "task.kwargs.max_digits": 3,
            "rollout.control": "dynamic_sampling,prune", "loss.critic_weight": 0.5, "rollout.options.prune.at": 0,
            "rollout.options.prune.below": 1e9, "rollout.options.prune.warmup": 2})
        algos.validate(config)
        algo, hp = algos.build(config, mesh_lib.make_mesh(1))
        state, rows = algo.init_seeds(0, 1), []
        for _ in range(3):
            state, metrics = algo.run_chunk(state, hp, 1)
            rows.append({k: float(np.asarray(v)[0]) for k, v in metrics.items()})
        yield algo, rows, state
    finally:
        rollout.STRATEGIES["tokens"]["filter"].pop("shortest_first", None)


def test_the_docs_strategy_example_registers_and_trains(trained_strategies):
    algo, rows, _ = trained_strategies
    strategy = rollout.get("filter", "shortest_first")
    groups = rollout.Groups(*([None] * 7), lengths=jnp.asarray([[3, 1, 2]]), values=None, rewards=None,
                            weight=None, bonus=None, replayed=None)
    out, _ = strategy.after(None, None, groups, None, None)
    np.testing.assert_allclose(out.bonus, [[-0.025, 0.025, 0.0]], atol=1e-7)
    assert algo.parts.pipeline.uses_bonus  # a filter's bonus reaches the advantages of tied groups
    for row in rows:
        assert np.isfinite(row["policy_loss"]) and "ranked" in row


# --- Generate strategies for environments ------------------------------------------------------------

def env_rollout(config, seed: int = 0):
    """One group rollout of `config`'s GRPO for seed 0 on one device: (traj, metrics, trained [T, N, A])."""
    algo, _ = algos.build(config, mesh_lib.make_mesh(1))
    params = jax.tree.map(lambda x: x[0], algo.init_seeds(seed, 1).params)
    fn = jax.shard_map(lambda p, k: algo.parts.rollout(p, k), mesh=algo.mesh, in_specs=P(), out_specs=P(),
                       check_vma=False)
    traj, metrics, trained = jax.jit(fn)(params, jax.random.key(seed + 5))
    return algo, traj, metrics, np.asarray(trained)


def test_vine_groups_share_a_prefix_then_branch_and_train_from_the_branch_on():
    from helpers import small_grpo_config

    config = small_grpo_config("cartpole_grpo", num_envs=32, num_steps=40, group_size=4,
                               **{"rollout.generate": "vine", "rollout.options.vine.max_branch_step": 12})
    algos.validate(config)
    algo, traj, metrics, trained = env_rollout(config)
    branch = trained.argmax(axis=0)[:, 0]  # [N]: the first trained step of each member
    assert trained[:, :, 0].any(axis=0).all() and branch.max() <= 12 and len(set(branch.tolist())) > 1
    np.testing.assert_array_equal(trained[:, :, 0], np.arange(40)[:, None] >= branch[None, :])
    actions, obs = np.asarray(traj.action[..., 0]), np.asarray(traj.actor_in[:, :, 0])
    diverged = 0
    for g in range(8):
        members = slice(4 * g, 4 * g + 4)
        b = branch[4 * g]
        assert (branch[members] == b).all()
        np.testing.assert_array_equal(actions[:b, members], np.broadcast_to(actions[:b, 4 * g, None], (b, 4)))
        np.testing.assert_array_equal(obs[:b + 1, members], np.broadcast_to(obs[:b + 1, 4 * g, None], (b + 1, 4, obs.shape[-1])))
        diverged += bool((actions[b:, members] != actions[b:, 4 * g, None]).any())
    assert diverged >= 6, "after the branch, members act on their own noise"
    assert float(metrics["branch_step_sum"]) == branch.sum()


def test_counterfactual_groups_vary_one_agent_and_train_only_it():
    from helpers import small_grpo_config

    config = small_grpo_config("smax_grpo", "3m", num_envs=32, num_steps=20, group_size=4,
                               **{"rollout.generate": "counterfactual"})
    algos.validate(config)
    algo, traj, metrics, trained = env_rollout(config)
    focus = trained[0].argmax(axis=1)  # [N]
    np.testing.assert_array_equal(trained, np.broadcast_to(np.arange(3)[None, None] == focus[None, :, None], trained.shape))
    actions = np.asarray(traj.action)  # [T, N, A]
    assert len(set(focus.tolist())) > 1
    for g in range(8):
        members = slice(4 * g, 4 * g + 4)
        assert (focus[members] == focus[4 * g]).all()
        others = [a for a in range(3) if a != focus[4 * g]]
        # The first step: every member sees the same start; the other agents draw the leader's noise.
        np.testing.assert_array_equal(actions[0, members][:, others], np.broadcast_to(actions[0, 4 * g, others], (4, 2)))


def test_an_unknown_env_generate_strategy_is_a_config_error():
    from helpers import small_grpo_config

    with pytest.raises(ValueError, match="config.rollout.generate: unknown generate strategy 'tree'; known: counterfactual, independent, vine"):
        algos.validate(small_grpo_config("cartpole_grpo", **{"rollout.generate": "tree"}))


def test_tree_advantages_against_a_hand_computed_tree():
    # One group of 4: branches {0, 1} and {2, 3} share 2 prefix tokens; rewards 1, 0 | 1, 1. Group mean 0.75,
    # branch means 0.5 and 1.0. Member 3 is replayed (not in the tree): flat r - 0.75 at every token.
    rewards = jnp.asarray([[1.0, 0.0, 1.0, 1.0]])
    in_tree = jnp.asarray([[True, True, True, False]])
    adv, weight = rollout.tree_advantages(rewards, in_tree, branches=2, depth=2, length=4, scale=False)
    # Branch 2's mean is over its members in the tree: member 2 alone (1.0).
    expected = np.asarray([[[-0.25, -0.25, 0.5, 0.5], [-0.25, -0.25, -0.5, -0.5],
                            [0.25, 0.25, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]])
    np.testing.assert_allclose(adv, expected, atol=1e-7)
    np.testing.assert_allclose(weight, [[[0.5, 0.5, 1, 1], [0.5, 0.5, 1, 1], [0.5, 0.5, 1, 1], [1, 1, 1, 1]]])
    # Prefix plus suffix is the flat advantage r - mean; `scale` divides by the group std (sqrt(3)/4).
    scaled, _ = rollout.tree_advantages(rewards, in_tree, branches=2, depth=2, length=4, scale=True, eps=0.0)
    np.testing.assert_allclose(scaled, expected / (np.sqrt(3) / 4), rtol=1e-6)


def test_tree_rollouts_share_each_branch_prefix_and_differ_after(replay_algo):
    algo = replay_algo
    params = algo.init(jax.random.key(0)).params
    model, vocab = algo.model, algo.vocab
    prompts = algo.task.prompts(algo.pool[:3], vocab)
    out = sampling.sample_groups_per_prompt(model, params, prompts, jax.random.split(jax.random.key(1), 3),
                                            group_size=6, max_new_tokens=5, eos_id=vocab.eos_id,
                                            pad_id=vocab.pad_id, branches=2, depth=3)
    plain = sampling.sample_groups_per_prompt(model, params, prompts, jax.random.split(jax.random.key(1), 3),
                                              group_size=6, max_new_tokens=5, eos_id=vocab.eos_id, pad_id=vocab.pad_id)
    tokens = np.asarray(out.tokens)
    for leader in (0, 3):
        np.testing.assert_array_equal(tokens[:, leader:leader + 3, :3],
                                      np.broadcast_to(tokens[:, leader:leader + 1, :3], (3, 3, 3)))
        np.testing.assert_array_equal(tokens[:, leader], np.asarray(plain.tokens)[:, leader])  # leaders as plain
    # Past the prefix each member draws with its own numbers: its tokens are the plain sample's wherever the
    # plain sample had the same prefix.
    same_prefix = (np.asarray(plain.tokens)[..., :3] == tokens[..., :3]).all(-1)
    np.testing.assert_array_equal(tokens[same_prefix], np.asarray(plain.tokens)[same_prefix])


@pytest.mark.parametrize("task, options", [("countdown", {"num_numbers": 3, "max_number": 50}),
                                           ("addition", {"min_digits": 1, "max_digits": 4})])
def test_the_difficulty_knob_bounds_every_problem_drawn(task, options):
    from envs import text

    t = text.make_task(task, **options)
    full = t.sample(jax.random.key(0), 256, "train")
    assert float(t.difficulty(full).max()) == 1.0 and float(t.difficulty(full).min()) < 0.5
    for level in (0.0, 0.3, 0.5, 1.0):
        problems = t.sample(jax.random.key(1), 256, "train", jnp.float32(level))
        difficulty = np.asarray(t.difficulty(problems))
        assert difficulty.max() <= level + 1e-6, (level, difficulty.max())
        assert difficulty.max() >= level - 0.35, "the level is reached, not only bounded"
        assert not np.asarray(t.is_heldout(problems)).any()


def test_the_curriculum_redraws_at_its_level_and_rises_when_the_probe_passes(trained_strategies):
    record, _, state = trained_strategies
    algo = record.parts
    difficulty = np.asarray(algo.task.difficulty(algo.pool))
    memory = {"level": jnp.float32(0.0), "probe_accuracy": jnp.float32(0.0), "updates": jnp.int32(0)}
    plan = rollout.Plan(jnp.zeros(8, jnp.int32), algo.pool[:8], jnp.zeros(8, jnp.int32),
                        jnp.full(8, -1.0), jnp.zeros(8, jnp.int32))
    for level in (0.0, 0.5):
        drawn, _ = on_mesh(algo, strategies.curriculum_problems, {**memory, "level": jnp.float32(level)}, plan,
                           jax.random.key(2))
        assert (difficulty[np.asarray(drawn.ids)] <= level + 1e-6).all()
        np.testing.assert_array_equal(drawn.problems.target, algo.pool.target[np.asarray(drawn.ids)])
    # raise_at 0: every probe passes, so each update raises the level by 0.5 up to 1.
    assert float(state.memory["curriculum"]["level"][0]) == 1.0
    assert int(state.memory["curriculum"]["updates"][0]) == 3


def test_thompson_plans_the_uncertain_problems_and_counts_each_groups_outcomes():
    """replay/thompson (VADE): with problems 0-3 known solved (Beta(500, 1)), 4-7 known failed (Beta(1, 500)) and
    the rest uncertain (Beta(3, 3)), the 16 planned (8 slots x 2 candidates) are always uncertain ones; observing a group adds its solved
    members to alpha and the others to beta after every posterior decayed towards the prior."""
    config = tiny_grpo_config("", **{"rollout.replay": "thompson", "rollout.pool_size": 32,
                                     "rollout.options.thompson.decay": 0.5, "group.size": 3})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    alpha = jnp.asarray([500.0] * 4 + [1.0] * 4 + [3.0] * 24)
    beta = jnp.asarray([1.0] * 4 + [500.0] * 4 + [3.0] * 24)
    assert config.num_prompts * config.group.oversample == 16
    plan = rollout.Plan(jnp.zeros(16, jnp.int32), algo.pool[:16], jnp.zeros(16, jnp.int32), jnp.full(16, -1.0),
                        jnp.zeros(16, jnp.int32))
    for seed in range(5):
        drawn, logged = on_mesh(algo, strategies.thompson_problems, {"alpha": alpha, "beta": beta}, plan,
                                jax.random.key(seed))
        ids = np.asarray(drawn.ids)
        assert len(set(ids.tolist())) == 16 and (ids >= 8).all(), ids
        np.testing.assert_array_equal(drawn.problems.target, algo.pool.target[ids])
        np.testing.assert_allclose(logged["posterior_pass_rate"], 0.5, rtol=1e-6)
    rewards = jnp.zeros((2, 3, 2)).at[0, :, 0].set(1.0).at[1, 2, 0].set(1.0)  # problem 9: 3 of 3; problem 4: 1 of 3
    groups = rollout.Groups(jnp.asarray([9, 4]), *([None] * 3), tokens=jnp.zeros((2, 3, 5), jnp.int32),
                            log_probs=None, mask=None, lengths=None, values=None, rewards=rewards, weight=None,
                            bonus=None, replayed=jnp.zeros((2, 3), bool))
    memory, _ = on_mesh(algo, strategies.count_outcomes, {"alpha": alpha, "beta": beta}, groups, None)
    want_alpha = 1.0 + 0.5 * (np.asarray(alpha) - 1.0)
    want_beta = 1.0 + 0.5 * (np.asarray(beta) - 1.0)
    want_alpha[9] += 3.0
    want_alpha[4] += 1.0
    want_beta[4] += 2.0
    np.testing.assert_allclose(memory["alpha"], want_alpha, rtol=1e-6)
    np.testing.assert_allclose(memory["beta"], want_beta, rtol=1e-6)
    with pytest.raises(ValueError, match="replay/thompson plans 16 distinct problems per update"):
        algos.validate(tiny_grpo_config("", **{"rollout.replay": "thompson", "rollout.pool_size": 12,
                                               "group.oversample": 2}))


def test_gdro_draws_by_class_weight_and_raises_the_weight_of_the_classes_it_fails():
    """replay/gdro (Prompt-GDRO): problems 0-7 are hard (pass rate 0.1: class 0 of 4), the rest easy (0.9: class 3).
    With all the weight on class 0 every candidate is a hard problem; with equal weights the two classes holding
    problems share the draws. Observing a failed hard group and a solved easy one raises class 0's log-weight by
    `step` x 1 and moves each pass rate half way to its group's."""
    config = tiny_grpo_config("", **{"rollout.replay": "gdro", "rollout.pool_size": 32, "group.size": 3,
                                     "rollout.options.gdro.step": 1.0})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    rate = jnp.asarray([0.1] * 8 + [0.9] * 24)
    plan = rollout.Plan(jnp.zeros(16, jnp.int32), algo.pool[:16], jnp.zeros(16, jnp.int32), jnp.full(16, -1.0),
                        jnp.zeros(16, jnp.int32))
    drawn, logged = on_mesh(algo, strategies.gdro_problems, {"rate": rate, "log_weight": jnp.asarray([0.0, -50, -50, -50])},
                            plan, jax.random.key(0))
    assert (np.asarray(drawn.ids) < 8).all() and float(logged["hardest_class_share"]) == pytest.approx(1.0)
    hard = []
    for seed in range(20):
        drawn, logged = on_mesh(algo, strategies.gdro_problems, {"rate": rate, "log_weight": jnp.zeros(4)}, plan,
                                jax.random.key(seed))
        hard.append(np.mean(np.asarray(drawn.ids) < 8))
    assert float(logged["hardest_class_share"]) == pytest.approx(0.5) and 0.35 < np.mean(hard) < 0.65, hard
    rewards = jnp.zeros((2, 3, 2)).at[1, :, 0].set(1.0)  # problem 2: 0 of 3 solved; problem 20: 3 of 3
    groups = rollout.Groups(jnp.asarray([2, 20]), *([None] * 3), tokens=jnp.zeros((2, 3, 5), jnp.int32),
                            log_probs=None, mask=None, lengths=None, values=None, rewards=rewards, weight=None,
                            bonus=None, replayed=jnp.zeros((2, 3), bool))
    memory, _ = on_mesh(algo, strategies.reweight_classes, {"rate": rate, "log_weight": jnp.zeros(4)}, groups, None)
    np.testing.assert_allclose(memory["log_weight"], [0.0, -1.0, -1.0, -1.0], atol=1e-6)
    np.testing.assert_allclose(memory["rate"][jnp.asarray([2, 20, 5])], [0.05, 0.95, 0.1], rtol=1e-6)


def test_gdro_s_debiased_averages_keep_stepping_a_class_that_was_not_drawn():
    """GDRO's EMA debiasing (`rollout.options.gdro.ema` = rollout_gdro's `ema`), 2 classes, decay 1/2, step 1, worked
    by hand. Update 1: class 0's groups pass 0 and 1/2 (failure 3/4), class 1's passes 1 (failure 0): averages
    (3/8, 0), counts (1, 1), corrected (3/4, 0): log-weights (3/4, 0) -> (0, -3/4). Update 2 draws class 1 only,
    which fails entirely: its average 1/2, count 2, corrected (1/2) / (1 - 1/4) = 2/3; class 0 keeps 3/4, and
    both step: (3/4, -3/4 + 2/3) -> (0, -5/6). Without the averages (ema 0) only class 1 steps: (-1/4, 0)."""
    zeros = jnp.zeros(2)
    memory = {"log_weight": zeros, "loss_mean": zeros, "loss_count": zeros}
    first = strategies.reweighted_classes(memory, jnp.asarray([0, 0, 1]), jnp.asarray([0.0, 0.5, 1.0]),
                                          jnp.ones(3, bool), 1.0, 0.5)
    np.testing.assert_allclose(first["loss_mean"], [0.375, 0.0], atol=1e-7)
    np.testing.assert_allclose(first["loss_count"], [1.0, 1.0])
    np.testing.assert_allclose(first["log_weight"], [0.0, -0.75], atol=1e-6)
    second = strategies.reweighted_classes(first, jnp.asarray([1]), jnp.asarray([0.0]), jnp.ones(1, bool), 1.0, 0.5)
    np.testing.assert_allclose(second["log_weight"], [0.0, -5 / 6], atol=1e-6)
    plain = strategies.reweighted_classes({"log_weight": first["log_weight"]}, jnp.asarray([1]), jnp.asarray([0.0]),
                                          jnp.ones(1, bool), 1.0, 0.0)
    assert set(plain) == {"log_weight"}
    np.testing.assert_allclose(plain["log_weight"], [-0.25, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match=r"config.rollout.options.gdro.ema must lie in \[0, 1\), got 1.0"):
        algos.validate(tiny_grpo_config("", **{"rollout.replay": "gdro", "rollout.pool_size": 32,
                                               "rollout.options.gdro.ema": 1.0}))


def test_a_filter_bonus_gives_tied_groups_advantages_and_leaves_the_others_alone(replay_algo):
    config = tiny_grpo_config("", **{"rollout.filter": "rank_ties", "group.size": 3})
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    rewards = jnp.asarray([[[0.0, 1.0]] * 3, [[1.0, 1.0], [0.0, 1.0], [0.0, 1.0]]])  # group 0 tied, group 1 not
    bonus = jnp.asarray([[-0.05, 0.05, 0.0], [0.05, -0.05, 0.0]])
    groups = rollout.Groups(*([None] * 4), tokens=jnp.zeros((2, 3, 5), jnp.int32), log_probs=None, mask=None,
                            lengths=None, values=None, rewards=rewards, weight=None, bonus=bonus, replayed=None)
    advantages, weight, tied = algo._group_advantages(groups)
    np.testing.assert_array_equal(tied, [True, False])
    # Group 0: GRPO on the bonus alone (-0.05, 0.05, 0) -> (-1.22, 1.22, 0); group 1 as without a filter.
    np.testing.assert_allclose(advantages[0, :, 0], [-np.sqrt(1.5), np.sqrt(1.5), 0.0], rtol=1e-4, atol=1e-5)
    plain_algo = algos.build(tiny_grpo_config("", **{"group.size": 3}), mesh_lib.make_mesh(1))[0].parts
    plain, _, _ = plain_algo._group_advantages(groups)
    np.testing.assert_allclose(advantages[1], plain[1], rtol=1e-6)
    np.testing.assert_allclose(plain[0], 0.0)


def test_partial_rollouts_train_finished_groups_and_resume_the_rest_with_importance_weights():
    """control/partial: per slot the first finished candidate trains; the others are carried with their tokens,
    behaviour log-probabilities and the column they stopped at, and resume there next update, their earlier
    tokens weighted by min(pi / mu, cap); a group carried longer than max_age is dropped."""
    config = tiny_grpo_config("", **{"rollout.control": "partial", "group.oversample": 2, "group.size": 3,
                                     "rollout.pool_size": 6, "rollout.options.partial.cap": 1.5,
                                     "rollout.options.partial.max_age": 2})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    assert algo.stop_slots == 2
    state = algo.init(jax.random.key(0))
    params, memory = state.params, state.memory["partial"]
    plan = on_mesh(algo, rollout.plan_candidates, jax.random.key(1))  # 8 slots x 2 candidates
    same, _ = on_mesh(algo, strategies.resume_carried, memory, plan, None)
    np.testing.assert_array_equal(same.ids, plan.ids)  # nothing carried yet
    assert int(same.start.sum()) == 0 and float(same.resume["mask"].sum()) == 0
    groups = on_mesh(algo, strategies.independent, params, TextGRPOHyperparams(), same, jax.random.key(2))
    N = groups.tokens.shape[-1]
    # As if decoding had stopped at column 2: slot 0 finished only its second candidate, the others their first.
    finished = jnp.ones(16, bool).at[0].set(False).at[3].set(False)
    decided = jnp.full(16, 2, jnp.int32)
    columns = jnp.arange(N)
    cut = lambda x, fill: jnp.where(columns < 2, x, fill)
    groups = groups.replace(finished=finished, decided=decided, tokens=cut(groups.tokens, algo.vocab.pad_id),
                            mask=cut(groups.mask, 0.0), log_probs=cut(groups.log_probs, 0.0),
                            behaviour=cut(groups.behaviour, 0.0) - 0.5 * cut(groups.mask, 0.0))  # mu = pi e^-0.5

    kept, _ = on_mesh(algo, strategies.train_finished, memory, groups, None, None)
    np.testing.assert_array_equal(kept.ids, groups.ids[np.asarray([1, 2, 4, 6, 8, 10, 12, 14])])
    carried, metrics = on_mesh(algo, strategies.carry_unfinished, memory, groups, None)
    rest = np.asarray([0, 3, 5, 7, 9, 11, 13, 15])
    np.testing.assert_array_equal(carried["ids"], groups.ids[rest])
    np.testing.assert_array_equal(carried["tokens"], groups.tokens[rest])
    np.testing.assert_array_equal(carried["behaviour"], groups.behaviour[rest])
    np.testing.assert_array_equal(carried["start"], [2] * 8)
    np.testing.assert_array_equal(carried["age"], [1] * 8)
    assert carried["valid"].all() and float(metrics["carried_finished"]) == 6 / 8

    # Next update: each slot's first candidate resumes its carried group at column 2, the second is fresh.
    fresh = on_mesh(algo, rollout.plan_candidates, jax.random.key(3))
    plan, metrics = on_mesh(algo, strategies.resume_carried, carried, fresh, None)
    np.testing.assert_array_equal(plan.ids[0::2], carried["ids"])
    np.testing.assert_array_equal(plan.ids[1::2], fresh.ids[1::2])
    np.testing.assert_array_equal(plan.start, [2, 0] * 8)
    assert float(metrics["resumed_candidates"]) == 0.5
    resumed = on_mesh(algo, strategies.independent, params, TextGRPOHyperparams(), plan, jax.random.key(4))
    np.testing.assert_array_equal(resumed.tokens[0::2, :, :2], carried["tokens"][:, :, :2])
    # The earlier columns are scored by the current policy (the loss's ratio starts at 1) and weighted by the
    # truncated ratio to the behaviour policy: min(e^0.5, 1.5) = 1.5 wherever a token is real.
    current, _, _ = sampling.score_groups(algo.model, params, resumed.prompts, resumed.tokens, resumed.mask,
                                          algo.vocab.pad_id)
    np.testing.assert_allclose(resumed.log_probs, current, atol=2e-5)
    np.testing.assert_allclose(resumed.weight[0::2, :, :2], 1.5 * carried["mask"][:, :, :2], rtol=1e-5)
    np.testing.assert_array_equal(resumed.weight[1::2], resumed.mask[1::2])
    np.testing.assert_array_equal(resumed.behaviour[0::2, :, :2], carried["behaviour"][:, :, :2])
    assert float(resumed.generated[0::2, :, :2].sum()) == 0  # drawn in the earlier update, not this one

    # Carried again and again: older than max_age = 2, a group is dropped and its slot draws afresh.
    unfinished = resumed.replace(finished=jnp.asarray([False, True] * 8))
    again, _ = on_mesh(algo, strategies.carry_unfinished, carried, unfinished, None)
    np.testing.assert_array_equal(again["age"], [2] * 8)
    assert again["valid"].all()
    last, _ = on_mesh(algo, strategies.carry_unfinished, again, unfinished, None)
    assert not last["valid"].any()


def test_pruning_stops_members_once_the_value_head_has_warmed_up(trained_strategies):
    """control/prune: no member is pruned during `warmup` updates; after it, members predicted below `below` at
    column `at` stop there (here every one, at column 0: below is above any reward), and the value head trains on
    none of them."""
    _, rows, state = trained_strategies
    assert [r["pruned"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[2]["completion_length"] == 0.0 < min(r["completion_length"] for r in rows[:2])
    assert rows[2]["value_loss"] == 0.0 < rows[1]["value_loss"]  # no pruned member is a value target
    assert int(state.memory["prune"]["updates"][0]) == 3
    # The value head at test time (ARRoL): best-of-k by its prediction, between pass^k and pass@k
    algo, _, _ = trained_strategies
    out = algo.evaluate(state.params, jax.random.PRNGKey(0), 8)
    k = next(key for key in out if key.startswith("eval_pass@"))[len("eval_pass@"):]
    assert out[f"eval_pass^{k}"][0] <= out[f"eval_head@{k}"][0] <= out[f"eval_pass@{k}"][0], out


def test_tree_branches_split_at_their_first_uncertain_token(replay_algo):
    """Entropy branching: members follow their leader until the branch's first column whose next-token entropy
    reaches min_entropy (at most depth). Never reached: the fixed-depth tree; always: independent samples; in
    between: each branch splits where its leader's entropy first reaches it, and shares exactly the tokens before."""
    algo = replay_algo
    params = algo.init(jax.random.key(0)).params
    model, vocab = algo.model, algo.vocab
    prompts = algo.task.prompts(algo.pool[:3], vocab)
    keys = jax.random.split(jax.random.key(1), 3)
    kw = dict(group_size=6, max_new_tokens=5, eos_id=vocab.eos_id, pad_id=vocab.pad_id, branches=2, depth=4)
    fixed = sampling.sample_groups_per_prompt(model, params, prompts, keys, **kw)
    never = sampling.sample_groups_per_prompt(model, params, prompts, keys, branch_entropy=1e9, **kw)
    np.testing.assert_array_equal(never.tokens, fixed.tokens)
    np.testing.assert_array_equal(never.branched_at, np.full((3, 6), 4))
    always = sampling.sample_groups_per_prompt(model, params, prompts, keys, branch_entropy=0.0, **kw)
    plain = sampling.sample_groups_per_prompt(model, params, prompts, keys, **{**kw, "branches": 0, "depth": 0})
    np.testing.assert_array_equal(always.tokens, plain.tokens)
    np.testing.assert_array_equal(always.branched_at, np.zeros((3, 6)))

    # The leaders' own entropies along their completions say where each branch must split.
    _, entropy, _ = sampling.score_groups(model, params, prompts, plain.tokens, plain.mask, vocab.pad_id)
    threshold = float(np.median(np.asarray(entropy)[:, [0, 3], :4]))
    out = sampling.sample_groups_per_prompt(model, params, prompts, keys, branch_entropy=threshold, **kw)
    for b in range(3):
        for leader in (0, 3):
            high = np.nonzero(np.asarray(entropy[b, leader, :4]) >= threshold)[0]
            split = int(high[0]) if len(high) else 4
            np.testing.assert_array_equal(out.branched_at[b, leader:leader + 3], split)
            np.testing.assert_array_equal(out.tokens[b, leader:leader + 3, :split],
                                          np.broadcast_to(out.tokens[b, leader, :split], (3, split)))
    split = np.asarray(out.branched_at)
    assert ((split > 0) & (split < 4)).any()  # some branch split before depth, past its first token


def test_tree_advantages_take_each_members_branch_point():
    rewards = jnp.asarray([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    in_tree = jnp.ones((2, 4), bool)
    common, w_common = rollout.tree_advantages(rewards, in_tree, 2, 3, 5, scale=False)
    per_member, w_member = rollout.tree_advantages(rewards, in_tree, 2, jnp.full((2, 4), 3), 5, scale=False)
    np.testing.assert_allclose(per_member, common)
    np.testing.assert_allclose(w_member, w_common)
    # Branch 0 of group 0 splits at column 1, the rest at 3: only its first column is a shared prefix.
    depth = jnp.asarray([[1, 1, 3, 3], [3, 3, 3, 3]])
    adv, weight = rollout.tree_advantages(rewards, in_tree, 2, depth, 5, scale=False)
    mean, branch0 = 0.75, 0.5
    np.testing.assert_allclose(adv[0, 0], [branch0 - mean] + [1.0 - branch0] * 4)
    np.testing.assert_allclose(weight[0, 0], [0.5, 1, 1, 1, 1])
    np.testing.assert_allclose(adv[0, 2], [1.0 - mean] * 3 + [0.0] * 2)


# --- Strategies of the pool's pass rates and of stored outcomes, on hand-made memories and groups -------------------

@pytest.fixture(scope="module")
def paired_algo():
    """One build for the tests of pairing, selective, reference's `below` and variance_budget's `hard` target: 8 slots x
    2 candidates from a pool of 32, groups of 3."""
    config = tiny_grpo_config("", **{"rollout.replay": "pairing,selective,reference", "rollout.pool_size": 32,
                                     "group.size": 3, "rollout.filter": "success_predictor",
                                     "rollout.control": "variance_budget", "rollout.options.variance_budget.target": "hard",
                                     "rollout.options.pairing.rate_step": 0.5, "rollout.options.selective.cap": 1.5,
                                     "rollout.options.reference.below": 0.34})
    algos.validate(config)
    return algos.build(config, mesh_lib.make_mesh(1))[0].parts


def groups_of(algo, ids, correct):
    """Hand-made groups of the pool's problems `ids` [n]: member j of group i is its reference answer where
    correct[i][j] (rewards (1, 1)), else the next problem's answer (rewards (0, 1)); behaviour log-probabilities log 1/2
    per real token."""
    ids, correct = jnp.asarray(ids), jnp.asarray(correct, bool)
    vocab, task = algo.vocab, algo.task
    problems = algo.pool[ids]
    answers = task.reference_answers(problems, vocab)
    others = task.reference_answers(algo.pool[(ids + 1) % algo.settings.pool_size], vocab)
    tokens = jnp.where(correct[..., None], answers[:, None], others[:, None])
    mask = (tokens != vocab.pad_id).astype(jnp.float32)
    n, G = correct.shape
    return rollout.Groups(ids, problems, task.prompts(problems, vocab), jnp.zeros(n, jnp.int32), tokens,
                          jnp.log(0.5) * mask, mask, mask.sum(-1).astype(jnp.int32), None,
                          jnp.stack([correct, jnp.ones_like(correct)], -1).astype(jnp.float32), weight=mask,
                          bonus=jnp.zeros((n, G)), replayed=jnp.zeros((n, G), bool))


def pass_rates(seen_rates: dict, pool: int = 32):
    """pass_rate_memory with the rates {problem: rate} observed, the rest never observed."""
    rate, seen = np.full(pool, 0.5, np.float32), np.zeros(pool, bool)
    for problem, value in seen_rates.items():
        rate[problem], seen[problem] = value, True
    return {"rate": jnp.asarray(rate), "seen": jnp.asarray(seen)}


def test_pairing_plans_hard_but_solvable_and_easy_but_brittle_halves(paired_algo):
    """replay/pairing (positive-negative pairing): of 16 candidates, 8 are the lowest pass rates still > 0 (q+), 8 the
    highest still < 1 (q-). Problems 0-3 never solved, 4-7 always, 8-31 at 1/25 ... 24/25: q+ = 8..15 (lowest
    first), q- = 31..24 (highest first). Never observed problems come first; too few solvable ones are filled
    with never-solved ones. Observing sets a first-seen problem's rate to its group's and moves a known one half way."""
    algo = paired_algo
    plan = rollout.Plan(jnp.zeros(16, jnp.int32), algo.pool[:16], jnp.zeros(16, jnp.int32), jnp.full(16, -1.0),
                        jnp.zeros(16, jnp.int32))
    known = {**{i: 0.0 for i in range(4)}, **{i: 1.0 for i in range(4, 8)}, **{i: (i - 7) / 25 for i in range(8, 32)}}
    drawn, logged = on_mesh(algo, strategies.pairing_problems, pass_rates(known), plan, jax.random.key(0))
    np.testing.assert_array_equal(drawn.ids, [*range(8, 16), *range(31, 23, -1)])
    np.testing.assert_array_equal(drawn.problems.target, algo.pool.target[np.asarray(drawn.ids)])
    assert float(logged["pairing_hard_rate"]) == pytest.approx(np.mean(np.arange(1, 9)) / 25)
    assert float(logged["pairing_easy_rate"]) == pytest.approx(np.mean(np.arange(17, 25)) / 25)
    # Problems 20-22 never observed: explored first (in random order), then the lowest solvable ones.
    unseen = {k: v for k, v in known.items() if k not in (20, 21, 22)}
    drawn, logged = on_mesh(algo, strategies.pairing_problems, pass_rates(unseen), plan, jax.random.key(1))
    assert sorted(np.asarray(drawn.ids[:3]).tolist()) == [20, 21, 22]
    np.testing.assert_array_equal(drawn.ids[3:], [*range(8, 13), *range(31, 23, -1)])
    assert float(logged["pairing_explored"]) == pytest.approx(3 / 16)
    # Two problems solvable (rate 1/2), the rest never solved: q+ takes both, then 6 never-solved; q- 8 others.
    scarce = {**{i: 0.0 for i in range(32)}, 5: 0.5, 9: 0.5}
    drawn, _ = on_mesh(algo, strategies.pairing_problems, pass_rates(scarce), plan, jax.random.key(2))
    ids = np.asarray(drawn.ids)
    assert sorted(ids[:2].tolist()) == [5, 9] and len(set(ids.tolist())) == 16
    # Observing: problem 9 (rate 2/25) solves 3 of 3 -> 1/25 + 1/2; problem 20 (never seen) 1 of 3 -> 1/3.
    groups = groups_of(algo, [9, 20], [[True] * 3, [False, True, False]])
    memory, _ = on_mesh(algo, strategies.track_pairing, pass_rates(unseen), groups, None)
    np.testing.assert_allclose(memory["rate"][jnp.asarray([9, 20, 8])], [1 / 25 + 0.5, 1 / 3, 1 / 25], rtol=1e-6)
    assert bool(memory["seen"][20]) and not bool(memory["seen"][21])


def test_hardest_draws_uniformly_for_after_updates_then_plans_the_lowest_pass_rates():
    """replay/hardest (DRIVE): during the first `after` updates the plan's uniform draws stand; then the 16 problems of
    lowest tracked pass rate, those never solved (rate 0) last. Problems 0-17 never solved, 18-31 at rates 14/14 ...
    1/14 (problem 31 the hardest solvable): the 14 solvable ones from the hardest, then 2 never solved."""
    config = tiny_grpo_config("", **{"rollout.replay": "hardest", "rollout.pool_size": 32, "group.size": 3,
                                     "rollout.options.hardest.after": 2})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    plan = on_mesh(algo, rollout.plan_candidates, jax.random.key(1))
    rates = pass_rates({**{i: 0.0 for i in range(18)}, **{i: (32 - i) / 14 for i in range(18, 32)}})
    broad, logged = on_mesh(algo, strategies.hardest_problems, {**rates, "updates": jnp.int32(1)}, plan,
                            jax.random.key(0))
    np.testing.assert_array_equal(broad.ids, plan.ids)
    assert float(logged["hard_focus"]) == 0.0
    focus, logged = on_mesh(algo, strategies.hardest_problems, {**rates, "updates": jnp.int32(2)}, plan,
                            jax.random.key(0))
    ids = np.asarray(focus.ids)
    np.testing.assert_array_equal(ids[:14], np.arange(31, 17, -1))
    assert set(ids[14:].tolist()) <= set(range(18)) and len(set(ids[14:].tolist())) == 2
    np.testing.assert_array_equal(focus.problems.target, algo.pool.target[ids])
    assert float(logged["hard_focus"]) == 1.0
    # Observing counts the update and (rate_step 1) keeps each observed problem's newest pass rate.
    groups = groups_of(algo, [31, 0], [[True] * 3, [True, False, False]])
    memory, _ = on_mesh(algo, strategies.track_hardest, {**rates, "updates": jnp.int32(2)}, groups, None)
    np.testing.assert_allclose(memory["rate"][jnp.asarray([31, 0, 30])], [1.0, 1 / 3, 2 / 14], rtol=1e-6)
    assert int(memory["updates"]) == 3
    with pytest.raises(ValueError, match="replay/hardest plans 16 distinct problems per update"):
        algos.validate(tiny_grpo_config("", **{"rollout.replay": "hardest", "rollout.pool_size": 12}))


def test_hardest_repeats_its_problems_for_drive_s_larger_groups():
    """DRIVE's larger hard-stage groups: with repeat 4 the hard focus plans the 16 / 4 = 4 problems of lowest pass rate
    (31, 30, 29, 28 of the rates above) 4 times each, in a row; merged by problem (required) each trains as one group
    of 4 x 3 members. A repeat that does not divide the plan, or one without merged groups, is refused."""
    keys = {"rollout.replay": "hardest", "rollout.pool_size": 32, "group.size": 3, "rollout.options.hardest.after": 0,
            "rollout.options.hardest.repeat": 4, "advantage.merge_problem_groups": True}
    config = tiny_grpo_config("", **keys)
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    plan = on_mesh(algo, rollout.plan_candidates, jax.random.key(1))
    rates = pass_rates({**{i: 0.0 for i in range(18)}, **{i: (32 - i) / 14 for i in range(18, 32)}})
    focus, _ = on_mesh(algo, strategies.hardest_problems, {**rates, "updates": jnp.int32(0)}, plan, jax.random.key(0))
    np.testing.assert_array_equal(focus.ids, np.repeat([31, 30, 29, 28], 4))
    with pytest.raises(ValueError, match=r"hardest.repeat=3 must divide the 16 problems planned"):
        algos.validate(tiny_grpo_config("", **{**keys, "rollout.options.hardest.repeat": 3}))
    with pytest.raises(ValueError, match="set config.advantage.merge_problem_groups=True"):
        algos.validate(tiny_grpo_config("", **{**keys, "advantage.merge_problem_groups": False}))
    with pytest.raises(ValueError, match=r"plans 4 distinct problems per update \(num_prompts x group.oversample / "
                                         r"repeat 4\) from the pool: config.rollout.pool_size must be at least that, got 3"):
        algos.validate(tiny_grpo_config("", **{**keys, "rollout.pool_size": 3}))


def test_hardest_s_broad_stage_stops_completions_at_drive_s_short_window():
    """DRIVE's broad stage rolls out with a short response window, the hard focus with the full one: with after 2 and
    window 3, updates 0 and 1 cap every planned candidate's completions at 3 tokens, update 2 on at the answer length
    N (no cap in effect); a window past N caps at N. A window with no broad stage (after 0) is refused."""
    keys = {"rollout.replay": "hardest", "rollout.pool_size": 32, "rollout.options.hardest.after": 2,
            "rollout.options.hardest.window": 3}
    config = tiny_grpo_config("", **keys)
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    N = algo.task.answer_length
    assert N > 3
    plan = on_mesh(algo, rollout.plan_candidates, jax.random.key(1))
    rates = pass_rates({})
    for updates, cap in ((0, 3), (1, 3), (2, N)):
        planned, _ = on_mesh(algo, strategies.hardest_problems, {**rates, "updates": jnp.int32(updates)}, plan,
                             jax.random.key(0))
        np.testing.assert_array_equal(planned.length_cap, np.full(16, cap))
    assert int(strategies.stage_window(jnp.bool_(False), N + 5, N)) == N
    with pytest.raises(ValueError, match=r"hardest.window=3 shortens the broad stage's completions, but "
                                         r"config.rollout.options.hardest.after=0 leaves no broad stage"):
        algos.validate(tiny_grpo_config("", **{**keys, "rollout.options.hardest.after": 0}))


def test_selective_buffer_gives_a_tied_group_the_stored_completion_of_the_other_outcome(paired_algo):
    """replay/selective (Skywork R1V2's Selective Sample Buffer): per problem the newest correct and the newest wrong
    completion are stored; an all-wrong group gets the correct one as its last member, an all-correct group the
    wrong one, each weighted per token by min(pi / mu, cap = 1.5) (mu: log 1/2 per token); a mixed group is left."""
    algo = paired_algo
    state = algo.init(jax.random.key(0))
    params, memory = state.params, state.memory["selective"]
    # Problem 1: a mixed group (member 1 correct); problem 4: all wrong.
    mixed = groups_of(algo, [1, 4], [[False, True, False], [False, False, False]])
    memory, logged = on_mesh(algo, strategies.store_both, memory, mixed, None)
    np.testing.assert_array_equal(np.nonzero(np.asarray(memory["correct"]["stored"]))[0], [1])
    np.testing.assert_array_equal(np.nonzero(np.asarray(memory["wrong"]["stored"]))[0], [1, 4])
    np.testing.assert_array_equal(memory["correct"]["tokens"][1], mixed.tokens[0, 1])
    np.testing.assert_array_equal(memory["wrong"]["tokens"][4], mixed.tokens[1, 0])
    np.testing.assert_array_equal(memory["wrong"]["rewards"][1], [0.0, 1.0])
    assert float(logged["selective_stored_wrong"]) == 2 / 32

    # Next update: problem 1 all correct, problem 4 all wrong (nothing correct stored for it), problem 1 again all wrong.
    tied = groups_of(algo, [1, 4, 1], [[True] * 3, [False] * 3, [False] * 3])
    out, logged = on_mesh(algo, strategies.replay_selective, memory, tied, params, None)
    np.testing.assert_array_equal(out.replayed, [[False, False, True], [False] * 3, [False, False, True]])
    np.testing.assert_array_equal(out.tokens[0, 2], mixed.tokens[0, 0])  # problem 1's wrong completion
    np.testing.assert_array_equal(out.rewards[0, 2], [0.0, 1.0])
    np.testing.assert_array_equal(out.tokens[2, 2], mixed.tokens[0, 1])  # problem 1's correct completion
    np.testing.assert_array_equal(out.rewards[2, 2], [1.0, 1.0])
    score = jax.jit(lambda *a: sampling.score_groups(algo.model, *a, algo.vocab.pad_id)[0])
    current = score(params, tied.prompts, out.tokens, out.mask)
    for row in (0, 2):
        np.testing.assert_allclose(out.log_probs[row, 2], current[row, 2], rtol=1e-5, atol=1e-6)  # ratio 1 at first
        expected = np.minimum(np.exp(np.asarray(current[row, 2]) - np.log(0.5)), 1.5) * np.asarray(out.mask[row, 2])
        np.testing.assert_allclose(out.weight[row, 2], expected, rtol=1e-5)
    for name in ("tokens", "log_probs", "mask", "rewards", "weight"):
        np.testing.assert_array_equal(getattr(out, name)[:, :2], getattr(tied, name)[:, :2])
        np.testing.assert_array_equal(getattr(out, name)[1], getattr(tied, name)[1])
    assert float(logged["selective_replayed"]) == pytest.approx(2 / 3)
    assert float(logged["selective_replayed_wrong"]) == pytest.approx(1 / 3)
    # Mixed groups, and an all-wrong one with no correct completion stored (problem 4), are left alone.
    left = groups_of(algo, [1, 4, 2], [[False, True, False], [False] * 3, [True, True, False]])
    same, _ = on_mesh(algo, strategies.replay_selective, memory, left, params, None)
    assert not same.replayed.any()
    with pytest.raises(ValueError, match="config.rollout.replay names correct and selective"):
        algos.validate(tiny_grpo_config("", **{"rollout.replay": "correct,selective", "rollout.pool_size": 8}))


def test_the_reference_answer_replaces_the_last_wrong_member_of_groups_at_or_below_the_pass_rate(paired_algo):
    """replay/reference with `below` = 0.34 (AHPO: expert data where rewards are sparse): groups of pass rate 0 and 1/3
    get the reference answer in place of their last wrong member (group 1's is member 1: its member 2 is right and
    stays); a group at 2/3 is left alone."""
    algo = paired_algo
    params = algo.init(jax.random.key(0)).params
    groups = groups_of(algo, [4, 1, 2], [[False] * 3, [False, False, True], [True, False, True]])
    out, logged = on_mesh(algo, strategies.replay_reference, {}, groups, params, None)
    np.testing.assert_array_equal(out.replayed, [[False, False, True], [False, True, False], [False] * 3])
    answers = algo.task.reference_answers(groups.problems, algo.vocab)
    np.testing.assert_array_equal(out.tokens[0, 2], answers[0])
    np.testing.assert_array_equal(out.tokens[1, 1], answers[1])
    np.testing.assert_array_equal(out.rewards[1], [[0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(out.weight[1, 1], (answers[1] != algo.vocab.pad_id).astype(np.float32))
    for name in ("tokens", "log_probs", "mask", "rewards", "weight"):
        np.testing.assert_array_equal(getattr(out, name)[1, ::2], getattr(groups, name)[1, ::2])
        np.testing.assert_array_equal(getattr(out, name)[2], getattr(groups, name)[2])
    assert float(logged["reference_injected"]) == pytest.approx(2 / 3)


# --- AHPO's expert term (loss.expert_coef): SFT on the reference answers of the groups whose rewards are sparse ------

@pytest.fixture(scope="module")
def expert_algo():
    """Groups of 3 from a pool of 32 (for `groups_of`), the expert term at weight 0.5 for pass rates <= 0.34."""
    config = tiny_grpo_config("", **{"rollout.pool_size": 32, "group.size": 3, "loss.expert_coef": 0.5,
                                     "loss.expert_below": 0.34})
    algos.validate(config)
    return algos.build(config, mesh_lib.make_mesh(1))[0].parts


def _loss_and_grads(algo, params, batch, hp):
    """(`_loss`'s aux, its gradient, the gradient of the expert term alone) on this device's batch."""
    (_, aux), grads = jax.value_and_grad(algo._loss, has_aux=True)(params, batch, hp)
    expert = jax.grad(algo._expert_nll)(params, batch["prompts"], batch["expert"])
    return aux, grads, expert


def _expert_batch(algo, params, correct):
    """`_loss`'s batch of `groups_of(ids 4, 1, 2, correct)` with advantages (1, -1/2, -1/2) per group and its expert
    units; the units' share of gated prompts; the groups' prompts and reference answers."""
    groups = groups_of(algo, [4, 1, 2], correct)
    expert, share = on_mesh(algo, TextGRPO._expert_units, groups)
    advantages = jnp.broadcast_to(jnp.asarray([1.0, -0.5, -0.5])[:, None], groups.tokens.shape)
    batch = {"prompts": groups.prompts, "tokens": groups.tokens, "mask": groups.mask, "log_probs": groups.log_probs,
             "weight": groups.weight, "advantages": advantages, "expert": expert}
    return batch, share, groups.prompts, algo.task.reference_answers(groups.problems, algo.vocab)


def test_the_expert_term_is_the_mean_nll_of_the_reference_answers_of_the_sparse_groups_over_all_prompts(expert_algo):
    """AHPO (MM-HELIX): groups of pass rate 0, 1/3, 2/3 at loss.expert_below = 0.34 gate prompts 0 and 1. The term is
    (1 / 3) (nll_0 + nll_1), nll_b = -(1 / |y_b|) sum_t log p(y_b,t | x_b, y_b,<t) of reference answer y_b (its
    tokens and EOS), written here from the model's teacher-forced log-probabilities (`sampling.score`): its value, its
    gradient, and 0.5 x its gradient as the part of `_loss`'s gradient that loss.expert_coef = 0.5 adds."""
    algo = expert_algo
    params = algo.init(jax.random.key(0)).params
    batch, share, prompts, answers = _expert_batch(algo, params, [[False] * 3, [False, False, True],
                                                                  [True, False, True]])
    mask = (answers != algo.vocab.pad_id).astype(jnp.float32)
    np.testing.assert_array_equal(batch["expert"]["gate"], [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(batch["expert"]["answers"], answers)
    assert float(share) == pytest.approx(2 / 3)

    def hand_written(params):
        log_p, _, _ = sampling.score(algo.model, params, prompts, answers, mask, algo.vocab.pad_id)
        nll = -jnp.sum(log_p * mask, axis=-1) / jnp.sum(mask, axis=-1)
        return (nll[0] + nll[1]) / 3  # prompt 2 (pass rate 2/3) has no term, but counts among the 3

    aux, grads, expert = on_mesh(algo, _loss_and_grads, params, batch, TextGRPOHyperparams(expert_coef=0.5))
    _, grads_without, _ = on_mesh(algo, _loss_and_grads, params, batch, TextGRPOHyperparams(expert_coef=0.0))
    expected = jax.grad(hand_written)(params)
    assert float(aux["expert_nll"]) == pytest.approx(float(hand_written(params)), rel=1e-5)
    for got, want in zip(jax.tree.leaves(expert), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    for with_term, without, want in zip(*map(jax.tree.leaves, (grads, grads_without, expected))):
        np.testing.assert_allclose(with_term - without, 0.5 * want, rtol=1e-3, atol=1e-6)


def test_no_sparse_group_no_expert_term_and_the_pass_rate_counts_sampled_members_only(expert_algo):
    """Every group at pass rate >= 2/3 (above 0.34): nothing gated, the term and its gradient are 0. `sparse_rewards`
    by hand: rates over the members the policy sampled, a replay (the reference answer of replay=reference) left out."""
    algo = expert_algo
    params = algo.init(jax.random.key(0)).params
    batch, share, _, _ = _expert_batch(algo, params, [[True, False, True], [True, True, False], [True] * 3])
    aux, _, expert = on_mesh(algo, _loss_and_grads, params, batch, TextGRPOHyperparams(expert_coef=0.5))
    assert float(share) == 0.0 and float(aux["expert_nll"]) == 0.0
    assert all(not np.any(leaf) for leaf in jax.tree.leaves(expert))
    correct = jnp.asarray([[False, False, False, False], [True, False, False, False], [True, True, False, False],
                           [True, False, False, True]])
    sampled = jnp.asarray([[True] * 4, [True] * 4, [True] * 4, [True, True, True, False]])  # last: 1 of 3 sampled
    np.testing.assert_array_equal(sparse_rewards(correct, sampled, 0.0), [True, False, False, False])
    np.testing.assert_array_equal(sparse_rewards(correct, sampled, 0.25), [True, True, False, False])
    np.testing.assert_array_equal(sparse_rewards(correct, sampled, 1 / 3 + 1e-6), [True, True, False, True])


def test_expert_term_settings_that_cannot_work_are_refused():
    for overrides, message in [
            ({"loss.expert_coef": -0.1}, r"^config\.loss\.expert_coef must be >= 0, got -0\.1$"),
            ({"loss.expert_below": 1.5}, r"^config\.loss\.expert_below must lie in \[0, 1\], got 1\.5$"),
            ({"loss.expert_coef": 0.1, "reward.label_free": "majority"}, "label_free=majority reads no label"),
            ({"loss.expert_coef": 0.1, "task.name": "lookup"}, "task.name=lookup is played over turns")]:
        with pytest.raises(ValueError, match=message):
            algos.validate(tiny_grpo_config("", **overrides))


def test_variance_budget_gives_the_extra_groups_to_the_uncertain_or_to_the_hard(paired_algo):
    """control/variance_budget spends 8 groups on 16 candidates, at most 2 each, by predicted pass rate p. Candidates
    0-5 at p = 0, 0.1, 0.3, 0.5, 0.7, 0.9, the rest 1. `hard` (DARS): worth 1 - p = 1, .9, .7, .5, .3, .1; a second
    group halves it: the 8 best are 1, .9, .7, .5 (0's second), .5, .45, .35 (2's second), .3 -> 2, 2, 2, 1, 1, 0.
    `uncertain`: sqrt(p (1 - p)) = 0, .3, .46, .5, .46, .3 -> .5, .46, .46, .3, .3, .25, .23, .23 -> 0, 1, 2, 2, 2, 1."""
    algo = paired_algo
    p = jnp.asarray([0.0, 0.1, 0.3, 0.5, 0.7, 0.9] + [1.0] * 10)
    plan = rollout.Plan(jnp.arange(16, dtype=jnp.int32), algo.pool[:16], jnp.zeros(16, jnp.int32), p,
                        jnp.zeros(16, jnp.int32))
    out, logged = on_mesh(algo, strategies.variance_budget, None, plan, None)
    np.testing.assert_array_equal(np.bincount(np.asarray(out.ids), minlength=16), [2, 2, 2, 1, 1] + [0] * 11)
    assert float(logged["budget_skipped"]) == 11 / 16
    uncertain = rollout.allocate_groups(strategies.BUDGET_TARGETS["uncertain"](p), 8, 2)
    np.testing.assert_array_equal(np.bincount(np.asarray(uncertain), minlength=16), [0, 1, 2, 2, 2, 1] + [0] * 10)


# --- filter/attention_predictor: pure functions on hand-made memories ------------------------------------------------

def empty_attention_memory(capacity, width):
    return {"keys": jnp.zeros((capacity, width)), "rates": jnp.zeros(capacity), "valid": jnp.zeros(capacity, bool),
            "next": jnp.zeros((), jnp.int32)}


def one_hot_prompts(prompts):
    """Unit prompt features of prompts [n, 2] over a vocabulary of 3: cos(a, b) = the share of positions that agree."""
    algo = type("Algo", (), {"vocab": type("Vocab", (), {"size": 3})})
    return strategies._unit(strategies._prompt_features(algo, jnp.asarray(prompts)))


def test_attention_predictor_is_the_softmax_average_of_the_stored_pass_rates():
    """Stored prompts A = (0, 1), B = (1, 0), C = (2, 2) at pass rates 1, 0, 0.2 (a 4th slot empty), temperature 1/4.
    The query A itself: cosines (1, 0, 0), logits (4, 0, 0): (e^4 + 0.2) / (e^4 + 2) = 0.96820. The query (0, 0),
    halfway between A and B (one position of each agrees): cosines (1/2, 1/2, 0), logits (2, 2, 0):
    (e^2 + 0.2) / (2 e^2 + 1) = 0.48099."""
    memory = strategies.fifo_push(empty_attention_memory(4, 6), one_hot_prompts([[0, 1], [1, 0], [2, 2]]),
                                  jnp.asarray([1.0, 0.0, 0.2]), jnp.ones(3))
    predicted = strategies.attention_pass_rates(memory, one_hot_prompts([[0, 1], [0, 0]]), 0.25)
    e = np.e
    np.testing.assert_allclose(predicted, [(e ** 4 + 0.2) / (e ** 4 + 2), (e ** 2 + 0.2) / (2 * e ** 2 + 1)], rtol=1e-5)
    np.testing.assert_allclose(predicted, [0.96820, 0.48099], atol=1e-5)


def test_attention_predictor_with_an_empty_memory_predicts_one_half():
    predicted = strategies.attention_pass_rates(empty_attention_memory(4, 6), one_hot_prompts([[0, 1], [2, 0]]), 0.1)
    np.testing.assert_array_equal(predicted, [0.5, 0.5])


def test_attention_memory_is_a_fifo_of_the_used_observations():
    """Capacity 3, rates standing for the rows. Push a, b: slots (a, b, -), next 2. Push c, d (unused), e: c to slot 2,
    e over the oldest (a): (e, b, c), next 1. Push f, g, h, i (more than fit): only the last 3, in order from slot 1:
    g -> 2, h -> 0, i -> 1: (h, i, g), next 2 (g, the oldest)."""
    memory = empty_attention_memory(3, 1)

    def push(rates, use):
        return strategies.fifo_push(memory, jnp.asarray(rates)[:, None], jnp.asarray(rates), jnp.asarray(use, float))

    memory = push([1.0, 2.0], [1, 1])
    np.testing.assert_array_equal(memory["rates"], [1, 2, 0])
    np.testing.assert_array_equal(memory["valid"], [True, True, False])
    assert int(memory["next"]) == 2
    memory = push([3.0, 4.0, 5.0], [1, 0, 1])
    np.testing.assert_array_equal(memory["rates"], [5, 2, 3])
    np.testing.assert_array_equal(memory["keys"][:, 0], [5, 2, 3])
    assert int(memory["next"]) == 1 and bool(memory["valid"].all())
    memory = push([6.0, 7.0, 8.0, 9.0], [1, 1, 1, 1])
    np.testing.assert_array_equal(memory["rates"], [8, 9, 7])
    assert int(memory["next"]) == 2


def test_attention_predictor_hooks_store_finished_unhinted_groups_and_log_the_error_before_storing():
    """Capacity 3. Update 1 observes problem 0 solved by all 3 members: the empty memory predicted 1/2, error 1/2.
    Update 2 observes problem 0 at 1/3 and problem 5 hinted (not stored): the memory's one entry predicted 1, error
    2/3. Then two entries of the same prompt at 1 and 1/3 get equal weights: problem 0 is predicted 2/3."""
    config = tiny_grpo_config("", **{"rollout.filter": "attention_predictor", "rollout.pool_size": 32,
                                     "group.size": 3, "rollout.options.attention_predictor.capacity": 3})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    memory = strategies.attention_memory(algo, jax.random.key(0))
    memory, logged = on_mesh(algo, strategies.store_pass_rates, memory, groups_of(algo, [0], [[True] * 3]), None)
    np.testing.assert_allclose([logged["predictor_error"], logged["attention_memory_filled"]], [0.5, 1 / 3], rtol=1e-6)
    groups = groups_of(algo, [0, 5], [[True, False, False], [True] * 3])
    memory, logged = on_mesh(algo, strategies.store_pass_rates, memory,
                             groups.replace(hint_len=jnp.asarray([0, 1], jnp.int32)), None)
    np.testing.assert_allclose([logged["predictor_error"], logged["attention_memory_filled"]], [2 / 3, 2 / 3],
                               rtol=1e-6)
    np.testing.assert_allclose(memory["rates"], [1.0, 1 / 3, 0.0], rtol=1e-6)
    plan = rollout.Plan(jnp.asarray([0]), algo.pool[:1], jnp.zeros(1, jnp.int32), jnp.full(1, -1.0),
                        jnp.zeros(1, jnp.int32))
    plan, logged = on_mesh(algo, strategies.attend_pass_rate, memory, plan, None)
    np.testing.assert_allclose(plan.predicted, [2 / 3], rtol=1e-6)


def test_variance_budget_reads_the_attention_predictor():
    """control/variance_budget and rollout_gdro need some pass-rate predictor, not success_predictor by name."""
    for control, oversample in [("variance_budget", 1), ("rollout_gdro", 2)]:
        algos.validate(tiny_grpo_config("", **{"rollout.filter": "attention_predictor", "rollout.control": control,
                                               "group.oversample": oversample}))


def test_the_entropy_target_settles_at_the_temperature_whose_tempered_entropy_is_the_target():
    """AceReason-Nemotron 1.1: on a fixed next-token distribution the controller's loop T <- T exp(step (target -
    H(T))) reaches the temperature that bisection finds for H(T) = target, H(T) = the entropy of softmax(z / T)."""
    logits = np.array([2.0, 0.5, 0.0, -1.0, -3.0])

    def entropy(temperature):
        p = np.exp(logits / temperature - np.max(logits / temperature))
        p /= p.sum()
        return float(-(p * np.log(p)).sum())

    low, high = 0.05, 5.0
    for _ in range(60):  # H rises with T
        low, high = (low, (low + high) / 2) if entropy((low + high) / 2) > 0.3 else ((low + high) / 2, high)
    temperature = 1.0
    for _ in range(200):
        temperature = float(strategies.retuned_temperature(temperature, entropy(temperature), 0.3, 1.0, 0.1, 2.0))
    np.testing.assert_allclose(temperature, low, rtol=1e-4)
    assert float(strategies.retuned_temperature(1.9, 0.0, 0.3, 5.0, 0.1, 2.0)) == 2.0  # clipped


def test_tempered_entropy_is_the_entropy_of_the_tempered_softmax(replay_algo):
    algo = replay_algo
    params = jax.jit(algo.policy.init_params)(jax.random.key(0))
    prompts = algo.task.prompts(algo.pool[jnp.asarray([0, 1])], algo.vocab)
    tokens = jax.random.randint(jax.random.key(1), (2, 3, algo.task.answer_length), 0, len(algo.vocab.tokens))
    mask = jnp.ones(tokens.shape).at[:, :, -2:].set(0.0)
    # Jitted once each: eager calls compile each primitive separately.
    score_groups, group_logits, tempered_entropy = (
        jax.jit(functools.partial(f, algo.model), static_argnums=4)
        for f in (sampling.score_groups, sampling.group_logits, sampling.tempered_entropy))
    _, at_one, _ = score_groups(params, prompts, tokens, mask, algo.vocab.pad_id)
    np.testing.assert_allclose(tempered_entropy(params, prompts, tokens, mask, algo.vocab.pad_id, 1.0), at_one,
                               rtol=1e-5, atol=1e-6)
    logits, _ = group_logits(params, prompts, tokens, mask, algo.vocab.pad_id)
    p = jax.nn.softmax(np.asarray(logits, np.float64) / 0.4, axis=-1)
    want = -np.sum(p * np.log(p), axis=-1) * np.asarray(mask)
    np.testing.assert_allclose(tempered_entropy(params, prompts, tokens, mask, algo.vocab.pad_id, 0.4), want,
                               rtol=1e-4, atol=1e-5)


# --- Rollout-GDRO and the diversity-targeted temperature: one build, one short run ------------------------------

def test_distinct_share_counts_each_groups_distinct_completions_under_their_masks():
    """Groups of 4 completions of 3 tokens: all the same (1/4), all different (4/4), two pairs (2/4), and 3/4 in a
    group of two that differ only in padding (past their masks: the same) and two more whose tokens are the same but
    whose lengths differ (3 and 1: distinct)."""
    tokens = jnp.asarray([[[5, 6, 0]] * 4,
                          [[5, 6, 0], [5, 7, 0], [6, 6, 0], [5, 6, 1]],
                          [[1, 2, 3], [4, 4, 4], [1, 2, 3], [4, 4, 4]],
                          [[1, 2, 0], [1, 2, 9], [1, 2, 2], [1, 2, 2]]])
    mask = jnp.ones((4, 4, 3)).at[3, :2, 2].set(0.0).at[3, 3, 1:].set(0.0)  # group 3's lengths: 2, 2, 3, 1
    np.testing.assert_allclose(rollout.distinct_share(tokens, mask), [1 / 4, 1.0, 2 / 4, 3 / 4])


@pytest.fixture(scope="module")
def budget_and_temperature():
    """control/rollout_gdro with 2 difficulty classes (step 0.5) beside control/diversity_target (start 0.5, step 1,
    target 0.75) on 8 slots x 2 candidates, groups of 4, sampling the single most likely token (top_k 1: every
    member of a group the same completion). One update: (TextGRPO, its metrics, the state after it)."""
    config = tiny_grpo_config("", **{"rollout.filter": "success_predictor", "group.oversample": 2,
                                     "rollout.control": "rollout_gdro,diversity_target",
                                     "rollout.options.rollout_gdro.classes": 2, "rollout.options.rollout_gdro.step": 0.5,
                                     "rollout.options.diversity_target.start": 0.5, "sampling.top_k": 1})
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh(1))
    state, metrics = algo.run_chunk(algo.init_seeds(0, 1), hp, 1)
    return algo.parts, {k: float(np.asarray(v)[0]) for k, v in metrics.items()}, state


def test_rollout_gdro_spends_the_budget_by_the_square_root_rule(budget_and_temperature):
    """Rollout-GDRO, 8 groups on 16 candidates, at most 2 each. Shadow prices lambda = (1, 1/4) (log (0, -log 4)) of the
    classes p < 1/2 and p >= 1/2. Candidates 0 and 2 at p = 0.2 (class 0), 1, 3, 4, 5 at p = 0.8 (class 1), the rest
    sure (p = 0 or 1, sigma 0). sigma = sqrt(0.2 x 0.8) = 0.4 for all six, so sqrt(lambda) sigma = 0.4 and 0.2, and
    the square-root rule n_i = 8 x w_i / sum w (sum w = 2 x 0.4 + 4 x 0.2 = 1.6) gives 2 to each of class 0's and 1 to
    each of class 1's: per class n_c = 4 = 8 x sqrt(lambda_c) x (its summed sigma) / 1.6, where equal prices would
    give class 1 twice class 0's."""
    algo, _, _ = budget_and_temperature
    p = jnp.asarray([0.2, 0.8, 0.2, 0.8, 0.8, 0.8] + [0.0, 1.0] * 5)
    plan = rollout.Plan(jnp.arange(16, dtype=jnp.int32), algo.task.sample(jax.random.key(0), 16, "train"),
                        jnp.zeros(16, jnp.int32), p, jnp.zeros(16, jnp.int32))
    memory = {"log_weight": jnp.asarray([0.0, -np.log(4.0)])}
    out, logged = on_mesh(algo, strategies.rollout_gdro, memory, plan, None)
    np.testing.assert_array_equal(np.bincount(np.asarray(out.ids), minlength=16), [2, 1, 2, 1, 1, 1] + [0] * 10)
    assert float(logged["budget_skipped"]) == 10 / 16 and float(logged["budget_most_groups"]) == 2.0
    # Compute-neutral on any predictions and prices: exactly B = 8 groups, at most 2 each, and each candidate's count
    # the square-root rule rounded down, floor(w_i / t) for one threshold t (no next group worth more than a last one).
    for seed in range(4):
        k1, k2 = jax.random.split(jax.random.key(seed))
        p = jax.random.uniform(k1, (16,))
        log_weight = jax.random.normal(k2, (2,))
        out, _ = on_mesh(algo, strategies.rollout_gdro, {"log_weight": log_weight}, plan.replace(predicted=p), None)
        counts = np.bincount(np.asarray(out.ids), minlength=16)
        assert counts.sum() == 8 and counts.max() <= 2, counts
        price = np.exp(np.asarray(log_weight))[np.minimum(np.floor(np.asarray(p) * 2), 1).astype(int)]
        worth = np.sqrt(price) * np.sqrt(np.asarray(p) * (1 - np.asarray(p)))
        next_worth = np.where(counts < 2, worth / (counts + 1), -1.0)
        last_worth = np.where(counts > 0, worth / np.maximum(counts, 1), np.inf)
        assert next_worth.max() <= last_worth.min() + 1e-6, (counts, worth)


def test_rollout_gdro_raises_the_shadow_price_of_the_class_it_fails(budget_and_temperature):
    """Two updates of groups of 4, step 0.5, classes p < 1/2 (0) and p >= 1/2 (1) by the predicted pass rate:
    1. predicted (0.2, 0.2, 0.8, 0.8), solved 0, 2, 4, 4 of 4: class 0 fails 3/4 on average, class 1 never;
    2. predicted (0.8, 0.8, 0.2, none), solved 0, 0, 4, 2 of 4, the last group unfinished (not counted): class 1 fails
       always, class 0 never.
    log lambda = 0.5 x (3/4 + 0, 0 + 1) = (0.375, 0.5), shifted to a largest 0: (-0.125, 0)."""
    algo, _, _ = budget_and_temperature
    correct = algo.task.reward_names.index("correct")

    def groups(predicted, solved, finished):
        rewards = jnp.zeros((4, 4, len(algo.task.reward_names)))
        rewards = rewards.at[..., correct].set(jnp.arange(4)[None, :] < jnp.asarray(solved)[:, None])
        return rollout.Groups(jnp.full(4, -1, jnp.int32), *([None] * 3), tokens=jnp.zeros((4, 4, 5), jnp.int32),
                              log_probs=None, mask=None, lengths=None, values=None, rewards=rewards, weight=None,
                              bonus=None, replayed=jnp.zeros((4, 4), bool), finished=jnp.asarray(finished),
                              predicted=jnp.asarray(predicted))

    memory = {"log_weight": jnp.zeros(2)}
    memory, _ = on_mesh(algo, strategies.reweight_rollout_classes, memory,
                        groups([0.2, 0.2, 0.8, 0.8], [0, 2, 4, 4], [True] * 4), None)
    np.testing.assert_allclose(memory["log_weight"], [0.0, -0.375], atol=1e-6)
    memory, logged = on_mesh(algo, strategies.reweight_rollout_classes, memory,
                             groups([0.8, 0.8, 0.2, -1.0], [0, 0, 4, 2], [True, True, True, False]), None)
    np.testing.assert_allclose(memory["log_weight"], [-0.125, 0.0], atol=1e-6)
    assert float(logged["hardest_class_price"]) == pytest.approx(np.exp(-0.125) / (np.exp(-0.125) + 1), rel=1e-5)


def test_the_diversity_target_retunes_the_temperature_by_the_groups_distinct_share(budget_and_temperature):
    """Groups of 4: one of a single completion (1/4), one of two pairs (2/4): diversity 3/8. From T = 0.5, target 0.75,
    step 1: T' = 0.5 exp(0.75 - 3/8). In the run every member of a group drew the same tokens (top_k 1): diversity 1/4,
    T' = 0.5 exp(0.75 - 1/4), and every token sampled was trained (rollout_gdro spent exactly B = 8 groups of 4)."""
    algo, metrics, state = budget_and_temperature
    tokens = jnp.asarray([[[3, 4, 5]] * 4, [[3, 4, 5], [3, 4, 6], [3, 4, 5], [3, 4, 6]]])
    groups = rollout.Groups(*([None] * 4), tokens=tokens, log_probs=None, mask=jnp.ones((2, 4, 3)), lengths=None,
                            values=None, rewards=None, weight=None, bonus=None, replayed=None)
    observe = rollout.get("control", "diversity_target").observe
    memory, logged = on_mesh(algo, observe, {"temperature": jnp.float32(0.5)}, groups, None)
    assert float(logged["diversity"]) == pytest.approx(3 / 8)
    np.testing.assert_allclose(memory["temperature"], 0.5 * np.exp(0.75 - 3 / 8), rtol=1e-6)
    assert metrics["sampling_temperature"] == 0.5 and metrics["diversity"] == pytest.approx(1 / 4)
    tuned = state.memory["diversity_target"]["temperature"][0]
    np.testing.assert_allclose(tuned, 0.5 * np.exp(0.75 - 1 / 4), rtol=1e-6)
    assert metrics["sampled_tokens"] == metrics["tokens"] > 0 and metrics["budget_most_groups"] <= 2
    assert np.isfinite(metrics["hardest_class_price"]) and np.isfinite(metrics["policy_loss"])


# --- DARS: a first round measures each prompt's accuracy, the extra groups go to the hard ones, pooled -------------

SOLVED = jnp.zeros(32, jnp.int32).at[10].set(4).at[12].set(1).at[13].set(3)  # members of 4 each pool problem solves


def solved_by_table(priors=None):
    """A stand-in sampler: groups of 4 members of which, in its first round (call), the first SOLVED[id] are correct
    (rewards (1, 1)), the rest well formed only (0, 1); in later rounds none is correct. Every member one real token;
    with `priors` (id -> value) the value head reads priors[id] at every position."""
    rounds = []

    def sample(algo, params, hp, plan, key):
        n, G, N = plan.ids.shape[0], 4, 2
        solved = SOLVED[plan.ids] if not rounds else jnp.zeros(n, jnp.int32)
        rounds.append(n)
        correct = (jnp.arange(G)[None, :] < solved[:, None]).astype(jnp.float32)
        rewards = jnp.stack([correct, jnp.ones_like(correct)], axis=-1)
        ones, zeros = jnp.ones((n, G, N)).at[..., 1].set(0.0), jnp.zeros((n, G))
        table = None if priors is None else jnp.zeros(32).at[jnp.asarray(list(priors))].set(list(priors.values()))
        values = None if priors is None else jnp.broadcast_to(table[plan.ids][:, None, None], (n, G, N))
        return rollout.Groups(plan.ids, plan.problems, jnp.zeros((n, 3), jnp.int32), plan.hint_len,
                              jnp.zeros((n, G, N), jnp.int32), jnp.zeros((n, G, N)), ones, jnp.ones((n, G), jnp.int32),
                              values, rewards, weight=ones, bonus=zeros, replayed=zeros.astype(bool))

    return sample


def test_dars_spends_the_extra_groups_on_the_least_solved_first_round_prompts_and_pools_them():
    """8 slots, extra = 4, at most 2 each: the first round samples the first 4 candidates, problems 10-13, solved
    4, 0, 1, 3 of 4 times: p = 1, 0, 1/4, 3/4, worth 1 - p = 0, 1, 3/4, 1/4, a second group worth half: the 4 best are
    1 (11), 3/4 (12), 1/2 (11), 3/8 (12) -> the batch is 10, 11, 12, 13, 11, 11, 12, 12. The extra round solves
    nothing. Pooled, problem 11's 12 members all fail (advantage 0) and problem 12's 12 hold its first round's one
    success: p = 1/12 over the enlarged group (alone, its first group would have p = 1/4), grpo
    (r - p) / sqrt(p (1 - p)) = sqrt(11) for it, -1/sqrt(11) for the 11 others (well_formed, 1 for all, shifts
    nothing). Problem 13 alone: 3 of 4, 1/sqrt(3) and -sqrt(3); problem 10's all-correct group: 0."""
    config = tiny_grpo_config("", **{"rollout.generate": "dars", "rollout.pool_size": 32, "group.size": 4,
                                     "advantage.merge_problem_groups": True, "group.oversample": 1})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    ids = jnp.arange(10, 18, dtype=jnp.int32)
    plan = rollout.Plan(ids, algo.pool[ids], jnp.zeros(8, jnp.int32), jnp.full(8, -1.0), jnp.zeros(8, jnp.int32))
    sampler = functools.partial(strategies.dars, sample=solved_by_table())
    groups = on_mesh(algo, sampler, None, TextGRPOHyperparams(), plan, jax.random.key(0))
    np.testing.assert_array_equal(groups.ids, [10, 11, 12, 13, 11, 11, 12, 12])
    advantages, weight, _ = on_mesh(algo, TextGRPO._group_advantages, groups)
    member = np.asarray(advantages[..., 0])  # [8, 4]: every token of a member carries its advantage
    s11, s3 = np.sqrt(11.0), np.sqrt(3.0)
    np.testing.assert_allclose(member[[0, 1, 4, 5]], 0.0, atol=1e-5)
    np.testing.assert_allclose(member[2], [s11, -1 / s11, -1 / s11, -1 / s11], rtol=1e-4)
    np.testing.assert_allclose(member[[6, 7]], -1 / s11, rtol=1e-4)
    np.testing.assert_allclose(member[3], [1 / s3, 1 / s3, 1 / s3, -s3], rtol=1e-4)
    np.testing.assert_array_equal(weight[..., 0], np.ones((8, 4)))


def test_v0_5_s_extra_rollouts_go_where_the_first_round_rejects_the_value_prior():
    """rollout.options.dars.target=rejected (V_0.5): the first round as above (problems 10-13, p = 1, 0, 1/4, 3/4,
    weighted means m = p + 0.1 = 1.1, 0.1, 0.35, 0.85 with reward weights (1, 0.1)) against value priors 0.5, 0.1, 0.9,
    0.85, n = 4, z = 1.96: bounds 1.96 sqrt(V (1 - V) / 4) = 0.49, 0.294, 0.294, 0.350 against |m - V| = 0.6, 0, 0.55,
    0: problems 10 and 12 reject their prior and take the 4 extra groups, 2 each (DARS's 1 - p would have given 11 and
    12); the accepted ones none."""
    config = tiny_grpo_config("", **{"rollout.generate": "dars", "rollout.pool_size": 32, "group.size": 4,
                                     "advantage.merge_problem_groups": True, "group.oversample": 1,
                                     "rollout.options.dars.target": "rejected", "loss.critic_weight": 0.5})
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    assert algo.settings.reward_weights == (1.0, 0.1)
    ids = jnp.arange(10, 18, dtype=jnp.int32)
    plan = rollout.Plan(ids, algo.pool[ids], jnp.zeros(8, jnp.int32), jnp.full(8, -1.0), jnp.zeros(8, jnp.int32))
    priors = {10: 0.5, 11: 0.1, 12: 0.9, 13: 0.85}
    sampler = functools.partial(strategies.dars, sample=solved_by_table(priors))
    groups = on_mesh(algo, sampler, None, TextGRPOHyperparams(), plan, jax.random.key(0))
    np.testing.assert_array_equal(groups.ids, [10, 11, 12, 13, 10, 10, 12, 12])
    with pytest.raises(ValueError, match="dars.target=rejected tests the value head's prior: set "
                                         "config.loss.critic_weight > 0"):
        algos.validate(tiny_grpo_config("", **{"rollout.generate": "dars", "rollout.pool_size": 32,
                                               "advantage.merge_problem_groups": True, "group.oversample": 1,
                                               "rollout.options.dars.target": "rejected"}))


def test_merged_groups_and_dars_config_errors():
    dars = {"rollout.generate": "dars", "rollout.pool_size": 16, "advantage.merge_problem_groups": True,
            "group.oversample": 1}
    for overrides, message in [
        ({"advantage.merge_problem_groups": True}, "by their pool id: set config.rollout.pool_size > 0"),
        ({"advantage.merge_problem_groups": True, "rollout.pool_size": 16, "advantage.estimator": "bnpo"},
         "config.advantage.estimator='bnpo' reads more than its group's rewards"),
        ({"advantage.merge_problem_groups": True, "rollout.pool_size": 16, "advantage.scale": "batch"},
         "config.advantage.scale=batch and config.advantage.renormalize take batch statistics"),
        ({"advantage.merge_problem_groups": True, "rollout.pool_size": 16, "rollout.generate": "tree"},
         "config.rollout.generate=tree scores its tokens itself"),
        ({**dars, "advantage.merge_problem_groups": False}, "set config.advantage.merge_problem_groups=True"),
        ({**dars, "group.oversample": 2}, "set config.group.oversample=1, got 2"),
        ({**dars, "rollout.options.dars.extra": 8}, "config.rollout.options.dars.extra = 8 must leave a first round"),
        ({**dars, "rollout.options.dars.extra": 6}, "config.rollout.options.dars.extra = 6 must leave a first round"),
        ({**dars, "reward.label_free": "majority"}, "config.reward.label_free=majority reads none"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            algos.validate(tiny_grpo_config("", **overrides))


# --- replay/recent: a FIFO buffer of whole groups (Rollout Replay) ---------------------------------------------

def fifo(capacity: int) -> dict:
    """An empty `recent_memory` of `capacity` rows of 1-member, 2-token groups (problems: an array of ids)."""
    zeros = lambda *shape: jnp.zeros((capacity, *shape))
    return {"ids": jnp.full(capacity, -1, jnp.int32), "problems": jnp.full(capacity, -1, jnp.int32),
            "hint_len": jnp.zeros(capacity, jnp.int32), "tokens": jnp.zeros((capacity, 1, 2), jnp.int32),
            "behaviour": zeros(1, 2), "mask": zeros(1, 2), "rewards": zeros(1, 1), "born": jnp.zeros(capacity, jnp.int32),
            "valid": jnp.zeros(capacity, bool), "head": jnp.int32(0), "updates": jnp.int32(0)}


def fifo_rows(ids) -> dict:
    """Rows of `fifo`'s fields whose every value is the group's id (to read back where each went)."""
    ids = jnp.asarray(ids, jnp.int32)
    return {"ids": ids, "problems": ids, "hint_len": ids, "tokens": jnp.broadcast_to(ids[:, None, None], (len(ids), 1, 2)),
            "behaviour": jnp.broadcast_to(-ids[:, None, None] / 10.0, (len(ids), 1, 2)),
            "mask": jnp.ones((len(ids), 1, 2)), "rewards": jnp.broadcast_to(ids[:, None, None] * 1.0, (len(ids), 1, 1))}


def test_the_recent_buffer_keeps_the_last_capacity_groups_in_order_and_wraps_around():
    buffer = strategies.pushed(fifo(4), fifo_rows([10, 11, 12]), jnp.ones(3, bool))  # update 0
    np.testing.assert_array_equal(buffer["ids"], [10, 11, 12, -1])
    np.testing.assert_array_equal(buffer["valid"], [True, True, True, False])
    assert int(buffer["head"]) == 3
    # Update 1: 13 and 15 kept (14 was not drawn by the policy): 13 fills the last row, 15 wraps to the first,
    # replacing the oldest (10).
    buffer = strategies.pushed({**buffer, "updates": jnp.int32(1)}, fifo_rows([13, 14, 15]), jnp.asarray([True, False, True]))
    np.testing.assert_array_equal(buffer["ids"], [15, 11, 12, 13])
    np.testing.assert_array_equal(buffer["born"], [1, 0, 0, 1])
    assert int(buffer["head"]) == 1
    # Update 2: six groups into four rows from row 1 on: rows 1, 2, 3, 0, 1, 2 -- the last four stay.
    buffer = strategies.pushed({**buffer, "updates": jnp.int32(2)}, fifo_rows(range(20, 26)), jnp.ones(6, bool))
    np.testing.assert_array_equal(buffer["ids"], [23, 24, 25, 22])
    np.testing.assert_array_equal(buffer["born"], [2, 2, 2, 2])
    assert int(buffer["head"]) == (1 + 6) % 4
    for name in ("problems", "hint_len"):  # every field of a group moves with it
        np.testing.assert_array_equal(buffer[name], buffer["ids"])
    np.testing.assert_array_equal(buffer["tokens"][:, 0, 1], buffer["ids"])
    np.testing.assert_allclose(buffer["behaviour"][:, 0, 0], -np.asarray(buffer["ids"]) / 10.0)
    np.testing.assert_allclose(buffer["rewards"][:, 0, 0], buffer["ids"])


def test_recent_groups_are_drawn_uniformly_among_those_young_enough():
    born, valid = jnp.asarray([1, 3, 2, 3, 0]), jnp.asarray([True, True, True, True, False])
    # At update 4 the ages are 3, 1, 2, 1 (row 4 empty): max_age 2 leaves rows 1, 2, 3, max_age 1 rows 1 and 3.
    rows, ready = strategies.picked_recent(born, valid, jnp.int32(4), 3, 2, jax.random.key(0))
    assert bool(ready) and sorted(np.asarray(rows).tolist()) == [1, 2, 3]
    _, ready = strategies.picked_recent(born, valid, jnp.int32(4), 3, 1, jax.random.key(0))
    assert not bool(ready)  # two eligible, three wanted
    rows, ready = strategies.picked_recent(born, valid, jnp.int32(4), 4, 0, jax.random.key(0))  # 0: any age
    assert bool(ready) and sorted(np.asarray(rows).tolist()) == [0, 1, 2, 3]
    # One of the three eligible, 3000 times: each about a third of the time (binomial std 0.009).
    draw = jax.vmap(lambda k: strategies.picked_recent(born, valid, jnp.int32(4), 1, 2, k)[0][0])
    counts = np.bincount(np.asarray(draw(jax.random.split(jax.random.key(1), 3000))), minlength=5) / 3000
    np.testing.assert_allclose(counts, [0, 1 / 3, 1 / 3, 1 / 3, 0], atol=0.04)
    assert strategies.replaced_groups(8, 0.3) == 2 and strategies.replaced_groups(100, 0.29) == 29  # rounded down


@pytest.fixture(scope="module")
def recent_algo():
    """8 prompts, 2 of them (fraction 0.25) replayed from a buffer of 4 groups no older than 2 updates."""
    config = tiny_grpo_config("", **{"rollout.replay": "recent", "group.oversample": 1, "group.size": 3,
                                     "rollout.options.recent.fraction": 0.25, "rollout.options.recent.capacity": 4,
                                     "rollout.options.recent.max_age": 2, "rollout.options.recent.cap": 1.5})
    algo, _ = algos.build(config, mesh_lib.make_mesh(1))
    return algo.parts


def recent_then_fresh(algo, memory, params, plan, key):
    """replay/recent's `replaces` hook with the independent generator at the default hyperparameters."""
    generate = functools.partial(strategies.independent, algo, params, TextGRPOHyperparams())
    return strategies.replay_recent(algo, memory, params, plan, generate, key)


def stocked_buffer(algo, born, valid) -> dict:
    """4 buffered groups at update 4 (ids 100..103): each member the problem's reference answer, group r rewarded r and
    drawn with behaviour log-probability log(0.2 (r + 1)) per token."""
    problems = algo.task.sample(jax.random.key(5), 4, "train")
    answers = algo.task.reference_answers(problems, algo.vocab)
    mask = jnp.broadcast_to((answers != algo.vocab.pad_id)[:, None].astype(jnp.float32), (4, 3, answers.shape[1]))
    behaviour = jnp.log(0.2 * jnp.arange(1, 5))[:, None, None] * mask
    K = len(algo.task.reward_names)
    return {**strategies.recent_memory(algo, jax.random.key(0)), "ids": jnp.arange(100, 104, dtype=jnp.int32),
            "problems": problems, "tokens": jnp.broadcast_to(answers[:, None], mask.shape), "behaviour": behaviour,
            "mask": mask, "rewards": jnp.broadcast_to(jnp.arange(4.0)[:, None, None], (4, 3, K)),
            "born": jnp.asarray(born, jnp.int32), "valid": jnp.asarray(valid), "updates": jnp.int32(4)}


def test_recent_replay_trains_buffered_groups_in_place_of_fresh_ones_with_their_behaviour_log_probs(recent_algo):
    algo = recent_algo
    params = algo.init(jax.random.key(0)).params
    plan = on_mesh(algo, rollout.plan_candidates, jax.random.key(1))
    # Ages 3, 1, 3, 2 at update 4: rows 1 and 3 are the only ones at most max_age = 2 old, and R = 0.25 x 8 = 2.
    memory = stocked_buffer(algo, [1, 3, 1, 2], [True] * 4)
    groups, metrics = on_mesh(algo, recent_then_fresh, memory, params, plan, jax.random.key(2))
    assert groups.tokens.shape[0] == 8
    np.testing.assert_array_equal(groups.replayed.all(axis=1), [False] * 6 + [True] * 2)
    assert not groups.replayed[:6].any()
    np.testing.assert_array_equal(groups.ids[:6], plan.ids[:6])  # the plan's first B - R candidates were generated
    np.testing.assert_array_equal(groups.problems.target[:6], plan.problems.target[:6])
    rows = np.asarray(groups.ids[6:]) - 100
    assert sorted(rows.tolist()) == [1, 3]
    current, _, _ = sampling.score_groups(algo.model, params, groups.prompts[6:], groups.tokens[6:], groups.mask[6:],
                                          algo.vocab.pad_id)
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(groups.tokens[6 + i], memory["tokens"][r])
        np.testing.assert_array_equal(groups.rewards[6 + i], memory["rewards"][r])
        np.testing.assert_array_equal(groups.behaviour[6 + i], memory["behaviour"][r])  # the stored behaviour
        np.testing.assert_allclose(groups.log_probs[6 + i], current[i], rtol=1e-5, atol=1e-6)  # the ratio starts at 1
        expected = np.minimum(np.exp(np.asarray(current[i]) - np.log(0.2 * (r + 1))), 1.5) * np.asarray(memory["mask"][r])
        np.testing.assert_allclose(groups.weight[6 + i], expected, rtol=1e-5, atol=1e-6)
    assert float(groups.generated[6:].sum()) == 0 and not groups.finished[6:].any()  # no new evidence for memories
    assert float(metrics["recent_replayed"]) == 2 / 8
    assert float(metrics["recent_age"]) == (1 + 2) / 2
    # The buffer takes the six groups drawn, not the replayed ones: after rows 0 .. 3, rows 0 and 1 again.
    stored, _ = on_mesh(algo, strategies.store_recent, memory, groups, None)
    np.testing.assert_array_equal(stored["ids"], [plan.ids[4], plan.ids[5], plan.ids[2], plan.ids[3]])
    np.testing.assert_array_equal(stored["born"], [4, 4, 4, 4])
    assert int(stored["updates"]) == 5 and int(stored["head"]) == 2


def test_recent_replay_replaces_nothing_until_the_buffer_holds_enough(recent_algo):
    algo = recent_algo
    params = algo.init(jax.random.key(0)).params
    plan = on_mesh(algo, rollout.plan_candidates, jax.random.key(1))
    memory = stocked_buffer(algo, [3, 3, 3, 3], [False, True, False, False])  # one group, two wanted
    groups, metrics = on_mesh(algo, recent_then_fresh, memory, params, plan, jax.random.key(2))
    fresh = on_mesh(algo, strategies.independent, params, TextGRPOHyperparams(), plan, jax.random.key(2))
    assert not groups.replayed.any()
    np.testing.assert_array_equal(groups.tokens, fresh.tokens)  # all B groups generated, as without the strategy
    np.testing.assert_array_equal(groups.ids, plan.ids)
    assert float(metrics["recent_replayed"]) == 0.0 and float(metrics["recent_age"]) == 0.0


def test_prs_and_vspo_settings_that_cannot_work_are_refused():
    for overrides, message in [
            ({"reward.progressive": -1}, r"^config\.reward\.progressive must be >= 0, got -1$"),
            ({"reward.progressive": 4, "task.name": "lookup"}, "progressive .*task.name=lookup is played over turns"),
            ({"loss.clip_smoothing": -0.5}, r"^config\.loss\.clip_smoothing must be >= 0, got -0\.5$"),
            ({"rollout.options.dynamic_sampling.rank": "best"}, "rollout.options.dynamic_sampling.rank")]:
        with pytest.raises(ValueError, match=message):
            algos.validate(tiny_grpo_config("", **overrides))
