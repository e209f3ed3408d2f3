"""GRPO on tokens: warm start from an SFT run, dynamic sampling, estimator and loss parts by name."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import algos, checkpoint, mesh as mesh_lib, sampling, train
from jaxrl.algos.text import config_keeps_reference
from jaxrl.run import cli
from jaxrl.run.saved import start_params
from jaxrl.rollout.tokens import select_varied
from helpers import countdown_2, tiny_grpo_config


# Equal configs share one built algorithm and its compiled programs (conftest's `builds_shared`): `default_grpo` and
# the runs `train.run` makes of its config, the stale run's three runs of one config.
pytestmark = pytest.mark.usefixtures("builds_shared")


@pytest.fixture(scope="module")
def sft_run(tiny_sft_run):
    """The warm start: conftest.py's tiny SFT run (shared with tests/test_text_sft.py)."""
    return tiny_sft_run[0]


@pytest.fixture(scope="module")
def default_grpo(sft_run):
    """(config, algorithm) of tiny_grpo_config warm-started from `sft_run`, built once for the tests that read it;
    evaluated on the SFT run's 64 held-out problems (the same evaluation program: compiled once, then cached)."""
    config = tiny_grpo_config(sft_run, **{"eval.episodes": 64})
    return config, algos.build(config, mesh_lib.make_mesh())[0]


def test_grpo_starts_from_the_sft_weights_and_trains(sft_run, default_grpo, tmp_path):
    config, algo = default_grpo
    sft_params = start_params(sft_run)
    state = algo.init_seeds(0, 1, start_params=sft_params)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(sft_params)):
        np.testing.assert_array_equal(a, b)
    # The warm start answers the held-out problems exactly as the SFT run's last evaluation did.
    sft_last = [r for r in train.metrics_lib.read(os.path.join(sft_run, "metrics.jsonl")) if "eval_accuracy" in r][-1]
    assert float(algo.evaluate(state.params, jax.random.PRNGKey(0), 64)["eval_accuracy"][0]) == sft_last["eval_accuracy"]
    rows = train.run(config, str(tmp_path / "grpo")).metrics
    for key in ("reward_correct", "reward_well_formed", "fill_rate", "completion_length", "entropy", "clip_fraction",
                "approx_kl", "eval_accuracy", "eval_pass@8", "eval_pass^8", "sampled_tokens", "tokens"):
        assert np.isfinite(rows[-1][key]), (key, rows[-1])
    assert rows[-1]["eval_pass^8"] <= rows[-1]["eval_pass@8"]  # all 8 samples solve a problem, at least one does
    assert os.path.exists(tmp_path / "grpo" / "tokenizer.json")


def test_grpo_raises_held_out_accuracy_past_the_warm_start(countdown_sft_run):
    """60 updates of 16 prompts x 8 completions (dynamic sampling from 2 candidates per slot) at a constant
    learning rate of 3e-4, sampled at temperature 0.3 and rewarded for correct answers alone, from a warm start
    that answers a third of the held-out problems greedily. Greedy accuracy on 256 held-out problems, GRPO
    seeds 0, 1, 2 (2026-11-28, 2-core AMD EPYC): 0.324 at the start; 0.418, 0.402, 0.426 after 30 updates,
    0.473, 0.465, 0.434 after 60 (+0.11 to +0.15). With a learning rate of 1e-12 (0 is refused) the accuracy
    stays 0.324 and this test fails (tried by hand)."""
    config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{
        "num_prompts": 16, "group.size": 8, "total_steps": 16 * 8 * 60, "optim.learning_rate": 3e-4,
        "optim.schedule": "constant", "sampling.temperature": 0.3, "reward_weights": (1.0, 0.0)})
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    state = algo.init_seeds(0, 1, start_params=start_params(countdown_sft_run))
    key = jax.random.PRNGKey(0)
    before = float(algo.evaluate(state.params, key, 256)["eval_accuracy"][0])
    state, _ = algo.run_chunk(state, hp, 60)
    after = float(algo.evaluate(state.params, key, 256)["eval_accuracy"][0])
    assert 0.2 < before < 0.5, before  # a warm start right often enough for a group's answers to differ
    assert after >= before + 0.08, (before, after)


# Every estimator and loss part by name, several to a program (its compile is most of a case's time): the
# choices of one case are separate branches of the update, and each case checks that all of them ran.
@pytest.mark.parametrize("overrides", [
    {"advantage.estimator": "dr_grpo", "loss.aggregate": "constant", "rollout.generate": "tree", "rollout.options.tree.depth": 2,
     "loss.kl_coef": 0.05, "loss.kl": "k2", "loss.clip_high": 0.28, "group.oversample": 3, "rollout.replay": "gdro",
     "rollout.options.gdro.ema": 0.9, "rollout.pool_size": 16, "reward.length_penalty": 0.5, "loss.sample_keep": 0.5, "loss.keep_schedule": 2,
     "advantage.entropy_shaping": 0.1, "reward.progressive": 2, "rollout.options.dynamic_sampling.rank": "value",
     "loss.clip_smoothing": 2.0},
    {"advantage.estimator": "gdpo", "advantage.renormalize": True, "loss.ratio": "sequence", "loss.clip_low": 3e-4,
     "loss.clip_high": 4e-4, "loss.critic_weight": 0.5, "optim.num_minibatches": 2, "rollout.filter": "rank_ties",
     "rollout.replay": "pairing,correct,reference,hints", "rollout.pool_size": 16, "rollout.options.hints.patience": 1,
     "rollout.options.reference.below": 0.5,
     "loss.objective": "cispo", "loss.confidence_penalty": 1.0, "loss.reference_reset": 1, "loss.truncated": "mask_negative",
     "advantage.soft": 0.5},
    {"advantage.estimator": "median", "group.size": 5, "rollout.filter": "success_predictor,rank_ties",
     "rollout.control": "variance_budget,entropy_target", "rollout.options.entropy_target.start": 0.5,
     "group.oversample": 1, "loss.token_keep": 0.5, "rollout.generate": "dars", "advantage.merge_problem_groups": True,
     "rollout.options.variance_budget.target": "hard", "rollout.replay": "hardest", "rollout.pool_size": 16,
     "rollout.options.hardest.after": 1, "rollout.options.hardest.window": 1,
     "loss.truncated": "mask"},
    {"advantage.estimator": "bnpo", "loss.objective": "pacs", "loss.score_scale": 0.5, "loss.reference_reset": 2,
     "reward.label_free": "majority",
     "rollout.replay": "thompson,selective,recent", "rollout.pool_size": 16, "loss.min_distinctiveness": 0.3,
     "advantage.novelty_sharpening": 1.0, "advantage.novelty_floor": 0.5, "group.oversample": 1,
     "rollout.options.recent.capacity": 8, "loss.confidence_clip": 0.5, "advantage.confidence_entropy_shaping": True},
    {"advantage.estimator": "tracked", "group.size": 1, "rollout.replay": "tracker", "rollout.pool_size": 16,
     "rollout.options.tracker.decay": 0.5},
    {"advantage.estimator": "tracked", "rollout.replay": "anchor", "rollout.pool_size": 16,
     "rollout.options.anchor.samples": 4, "rollout.filter": "attention_predictor", "rollout.control": "variance_budget",
     "group.oversample": 2, "rollout.options.attention_predictor.capacity": 12},
    {"advantage.estimator": "return_conditioned"},
    {"group.size": 2, "loss.critic_weight": 0.5, "advantage.cross_rollout": True, "loss.value_entropy": True,
     "advantage.estimator": "hint_posterior", "rollout.replay": "hints", "rollout.pool_size": 16,
     "rollout.options.hints.adaptive": True},
], ids=["dr_grpo-tree-kl-gdro-length-d3s_members-entropy_shaping-prs-vspo",
        "gdpo-sequence-critic-pairing-replay-reference_below-cispo-ace-reset-truncated-soft",
        "median-predictor-ranks-budget_hard-entropy_target-dars-merged-d3s-hardest-window-overlong",
        "bnpo-pacs-reset-majority-thompson-selective-recent-dagrpo-xrpo_ear-echo", "spo-tracked-g1",
        "pvpo-anchor-attention_predictor-budget", "rcrl", "poise-cross_rollout-value_entropy-adhint"])
def test_estimators_and_loss_parts_from_the_config(sft_run, overrides):
    config = tiny_grpo_config(sft_run, **overrides)
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    state = algo.init_seeds(0, 1, start_params=start_params(sft_run))
    before = jax.tree.leaves(state.params)[0].copy()
    state, metrics = algo.run_chunk(state, hp, 2)
    metrics = jax.device_get(metrics)
    for key, value in metrics.items():
        assert np.isfinite(value).all(), (key, value)
    assert ("kl" in metrics) == config_keeps_reference(config)
    assert ("value_loss" in metrics) == (config.loss.critic_weight > 0)
    assert ("cross_rollout_error" in metrics) == config.advantage.cross_rollout  # POISE: (reward - other's value)^2
    if config.loss.value_entropy:  # the value head reads the hidden state and 2 entropy statistics
        assert state.params["params"]["value"]["kernel"].shape == (1, config.model.d_model + 2, 1)  # [seeds, D + 2, 1]
    assert ("truncated" in metrics) == (config.loss.truncated != "train")
    assert ("reward_verified" in metrics) == bool(config.reward.label_free)  # the pseudo-label against the verifier
    assert ("members_kept" in metrics) == (config.loss.sample_keep < 1)  # D3S's sample level
    assert ("clip_scale_spread" in metrics) == (config.loss.clip_smoothing > 0)  # VSPO's per-group clip ranges
    assert ("chosen_worth" in metrics) == (config.rollout.options.get("dynamic_sampling", {}).get("rank", "first")
                                           != "first")  # VSPO's selection by task value
    assert ("members_distinct" in metrics) == (config.loss.min_distinctiveness > 0)  # DaGRPO's pair masking
    # RCRL learns by likelihood alone, under return-marked prompts: no policy ratio
    assert ("return_conditioned_nll" in metrics) != ("policy_loss" in metrics)
    assert ("return_conditioned_nll" in metrics) == (config.advantage.estimator == "return_conditioned")
    echo = config.loss.confidence_clip > 0 or config.advantage.confidence_entropy_shaping
    assert ("vote_confidence" in metrics) == echo  # ECHO's share of each group voting for its pseudo-label
    if echo:
        assert ((metrics["vote_confidence"] >= 0) & (metrics["vote_confidence"] <= 1)).all(), metrics["vote_confidence"]
    if config.loss.sample_keep < 1:  # G = 4: 2 members, then 3 as the schedule relaxes the share (the chunk's mean)
        np.testing.assert_allclose(metrics["members_kept"], [(2 / 4 + 3 / 4) / 2])
    if config.loss.reference_reset:  # ProRL: after the second update the reference is the policy again
        for ref, now in zip(jax.tree.leaves(state.ref_params), jax.tree.leaves(state.params)):
            np.testing.assert_array_equal(ref, now)
    parts = {"rank_ties": "ranked", "correct": "replayed", "hints": "hinted", "success_predictor": "predictor_loss",
             "attention_predictor": "attention_memory_filled",
             "variance_budget": "budget_skipped", "dynamic_sampling": "fill_rate", "thompson": "posterior_pass_rate",
             "gdro": "hardest_class_share", "reference": "reference_injected", "pairing": "pairing_explored",
             "hardest": "hard_focus", "selective": "selective_replayed", "tracker": "tracked_pass_rate",
             "entropy_target": "sampling_temperature", "anchor": "anchor_pass_rate", "recent": "recent_replayed"}
    for name in (n for stage in ("filter", "control", "replay") for n in config.rollout[stage].split(",") if n):
        assert parts[name] in metrics, (name, sorted(metrics))  # each strategy of the case ran
    if "recent" in config.rollout.replay:  # update 1 fills the buffer (8 groups), update 2 replays 0.5 x 8 of them
        np.testing.assert_allclose(metrics["recent_replayed"], [(0 + 4 / 8) / 2])
        np.testing.assert_allclose(metrics["recent_age"], [(0 + 1) / 2])
        assert metrics["sampled_tokens"][0] < metrics["tokens"][0], metrics  # update 2 drew half the groups it trained
    if "entropy_target" in config.rollout.control:  # the first update samples at the start, the second retuned
        tuned = 2 * metrics["sampling_temperature"][0] - 0.5
        assert tuned != 0.5 and 0.1 <= tuned <= 2.0, metrics["sampling_temperature"]
        assert state.memory["entropy_target"]["temperature"][0] != tuned  # and retuned again after it
    if "anchor" in config.rollout.replay:  # PVPO: the reference's mean rewards over 4 pre-rollouts, kept as they were
        anchors = np.asarray(state.memory["anchor"]["value"])
        assert anchors.shape == (1, 16, 2) and np.all(np.isin(anchors * 4, np.arange(5)))
    if "attention_predictor" in config.rollout.filter:  # V_0 / DOTS: each update stores its B = 8 groups in 12 slots
        memory = state.memory["attention_predictor"]  # 8 after update 1, 12 (4 overwritten) after update 2
        assert bool(memory["valid"].all()) and int(memory["next"][0]) == 16 % 12, memory
        np.testing.assert_allclose(metrics["attention_memory_filled"], [(8 / 12 + 1) / 2], rtol=1e-6)
        assert 0 <= metrics["predictor_error"][0] <= 1, metrics
    if "hardest" in config.rollout.replay:  # the broad stage's one update, then the hard focus's
        np.testing.assert_allclose(metrics["hard_focus"], 0.5)
        # DRIVE's window of 1 token cuts every broad-stage answer (a digit, then EOS) as the length limit would: the
        # first update's completions are all truncated, the hard focus's (the full answer length) hardly any
        assert 0.45 <= metrics["truncated"][0] <= 0.75, metrics["truncated"]
    assert not np.allclose(before, jax.tree.leaves(state.params)[0])
    if "tracker" in config.rollout.replay:  # SPO: every candidate's single sample counts, the first update's halved
        candidates = config.num_prompts * config.group.oversample
        np.testing.assert_allclose(state.memory["tracker"]["count"].sum(), candidates * 0.5 + candidates)


def test_the_decoupled_correction_of_fresh_samples_is_the_plain_update(sft_run, default_grpo):
    """A synchronous run's samples were drawn by the policy the update starts from: the sampler's log-
    probabilities equal the learner's rescoring (float32), every weight is about 1, and the decoupled objective's
    first update, its step scaled by the weights' ESS (about 1), is the uncorrected one's."""
    plain_config, plain = default_grpo
    config = tiny_grpo_config(sft_run, **{"eval.episodes": 64, "loss.correction": "decoupled", "loss.ess_step": True})
    algos.validate(config)
    corrected, hp = algos.build(config, mesh_lib.make_mesh())
    runs = [algo.run_chunk(algo.init_seeds(0, 1, start_params=start_params(sft_run)), h, 1)[1]
            for algo, h in ((plain, algos.build(plain_config, mesh_lib.make_mesh())[1]), (corrected, hp))]
    plain_metrics, metrics = jax.device_get(runs)
    assert float(metrics["logp_mismatch"][0]) < 1e-4, metrics["logp_mismatch"]
    np.testing.assert_allclose(metrics["correction_weight"], 1.0, atol=1e-4)
    np.testing.assert_allclose(metrics["correction_ess"], 1.0, atol=1e-6)
    assert float(metrics["correction_zeroed"][0]) == 0.0
    for key in ("policy_loss", "grad_norm", "reward_correct"):
        np.testing.assert_allclose(metrics[key], plain_metrics[key], rtol=1e-4, err_msg=key)
    assert "correction_ess" not in plain_metrics  # (no correction, no extra metrics: golden runs unchanged)


def test_a_stale_run_learns_each_batch_two_updates_late_and_resumes_with_its_queue(sft_run, tmp_path, monkeypatch):
    """actor.max_staleness=2: updates 1 and 2 only sample; update 3 learns batch 1, drawn by the parameters it
    starts from (nothing was learned before it): the sampler's log-probabilities are the learner's; update 4
    learns batch 2, drawn before update 3 moved them. Stopped by SIGTERM after update 1, the run saves its queue
    (one batch sampled, none learned) and, resumed, ends as the run that never stopped, bit for bit: no batch
    lost, none learned twice."""
    import signal
    from conftest import assert_same_state
    from jaxrl.run import program

    config = tiny_grpo_config(sft_run, **{"actor.max_staleness": 2, "loss.correction": "decoupled",
                                          "checkpoint.every_steps": 128, "log.every_steps": 32, "eval.every_steps": 0})
    straight = train.run(config, str(tmp_path / "straight"))
    rows = straight.metrics  # one per update
    assert [r["staleness"] for r in rows] == [0.0, 0.0, 2.0, 2.0]
    assert rows[1]["grad_norm"] == 0.0 and rows[2]["grad_norm"] > 0.0
    assert rows[2]["logp_mismatch"] < 1e-5 < rows[3]["logp_mismatch"], rows
    assert int(straight.state.pending["filled"][0]) == 2 and int(straight.state.update_step[0]) == 2

    log = program._log

    def log_then_stop(plan, t, num, shared, metrics):
        log(plan, t, num, shared, metrics)
        if t.update == 1:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(program, "_log", log_then_stop)
    workdir = str(tmp_path / "stopped")
    stopped = train.run(config, workdir)
    assert stopped.interrupted and checkpoint.saved_steps(os.path.join(workdir, "checkpoints")) == [1]
    assert int(stopped.state.pending["filled"][0]) == 1 and int(stopped.state.update_step[0]) == 0
    monkeypatch.setattr(program, "_log", log)
    resumed = train.run(config, workdir)
    assert [r["update"] for r in resumed.metrics] == [1, 2, 3, 4]
    assert_same_state(straight.state, resumed.state)


def test_correction_settings_that_cannot_work_are_refused(sft_run):
    with pytest.raises(ValueError, match="unknown config.loss.correction 'truncated'; known: decoupled"):
        algos.validate(tiny_grpo_config(sft_run, **{"loss.correction": "truncated"}))
    with pytest.raises(ValueError, match="loss.correction=tis_token and config.rollout.control=partial both"):
        algos.validate(tiny_grpo_config(sft_run, **{"loss.correction": "tis_token", "rollout.control": "partial"}))
    with pytest.raises(ValueError, match="loss.ess_step scales the step by the correction weights' effective"):
        algos.validate(tiny_grpo_config(sft_run, **{"loss.ess_step": True}))
    with pytest.raises(ValueError, match="mesh.split_actor samples the next batch while learning from an earlier"):
        algos.validate(tiny_grpo_config(sft_run, **{"mesh.split_actor": True}))
    with pytest.raises(ValueError, match="half of its 1 data devices: that needs an even number"):
        mesh_lib.make_mesh(1, split_actor=True)
    with pytest.raises(ValueError, match="correction_low=3.0 is above config.loss.correction_high=2.0"):
        algos.validate(tiny_grpo_config(sft_run, **{"loss.correction": "mis_token", "loss.correction_low": 3.0}))


def test_critic_weight_adds_a_fresh_value_head_to_the_warm_start_and_trains_it(sft_run):
    # (with V_0.5's fused baseline: the head's state-zero value is also the group baseline's prior)
    algo, hp = algos.build(tiny_grpo_config(sft_run, **{"loss.critic_weight": 0.5, "advantage.estimator": "fused"}),
                           mesh_lib.make_mesh())
    sft_params = start_params(sft_run)
    state = algo.init_seeds(0, 1, start_params=sft_params)
    value_head = state.params["params"].pop("value")
    sft_leaves = jax.tree_util.tree_leaves_with_path(sft_params)
    assert jax.tree.structure(state.params) == jax.tree.structure(sft_params)  # all else is the SFT model's
    for (path, a), b in zip(sft_leaves, jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b, err_msg=str(path))
    state = algo.init_seeds(0, 1, start_params=sft_params)
    losses = []
    for _ in range(3):
        state, metrics = algo.run_chunk(state, hp, 4)
        losses.append(float(jax.device_get(metrics["value_loss"])[0]))
    assert not np.allclose(value_head["kernel"], state.params["params"]["value"]["kernel"])
    assert losses[-1] < losses[0], losses  # the fresh head regresses onto the rewards


def test_warm_start_from_a_named_sft_checkpoint(sft_run, default_grpo):
    _, algo = default_grpo
    steps = checkpoint.Checkpointer(os.path.join(sft_run, "checkpoints")).steps()
    earlier, latest = start_params(sft_run, steps[0]), start_params(sft_run)
    assert not np.allclose(jax.tree.leaves(earlier)[0], jax.tree.leaves(latest)[0])
    with pytest.raises(checkpoint.CheckpointError, match=r"no checkpoint 7 .*saved steps"):
        start_params(sft_run, 7)


def test_task_options_are_config_keys(sft_run):
    config = tiny_grpo_config(sft_run, **{"task.kwargs.max_digits": 4})
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    assert algo.parts.task.max_digits == 4 and algo.parts.task.prompt_length == 1 + 2 * 4 + 2
    with pytest.raises(AttributeError, match="max_number"):  # addition has no such option
        config.task.kwargs.max_number = 50


def test_dynamic_sampling_never_keeps_a_zero_variance_group_when_another_candidate_exists():
    # 4 slots x 3 candidates (slot-major), groups of 4, 2 reward components.
    varied = {2, 3, 5, 7, 8}  # slot 0 -> 2, slot 1 -> 3, slot 2 -> 7, slot 3: none varies -> 11, unfilled
    rewards = np.zeros((12, 4, 2), np.float32)
    for c in range(12):
        rewards[c] = [[1, 1], [0, 1], [1, 1], [0, 0]] if c in varied else [[c % 2, 1]] * 4
    chosen, filled = select_varied(jnp.asarray(rewards), 3)
    np.testing.assert_array_equal(chosen, [2, 3, 7, 11])
    np.testing.assert_array_equal(filled, [True, True, True, False])
    chosen_rewards = rewards[np.asarray(chosen)]
    varies = (chosen_rewards != chosen_rewards[:, :1]).any(axis=(1, 2))
    assert varies[np.asarray(filled)].all(), "a filled slot never holds a zero-variance group"


def test_dynamic_sampling_by_task_value_keeps_the_varied_candidate_of_highest_value():
    """rank=value (VSPO): per slot the varied candidate of largest v = sqrt(p (1 - p)) (1 - p), p its pass rate; tied
    candidates (v = 0 at p = 0 or 1) never win over a varied one, and equal values go to the first."""
    from jaxrl.rollout.tokens import BUDGET_TARGETS

    value = BUDGET_TARGETS["value"]
    # by hand: p = 1/4 -> sqrt(3/16) * 3/4 = 0.3248; 1/2 -> 1/4; 3/4 -> sqrt(3/16) / 4 = 0.1083; 0 and 1 -> 0
    np.testing.assert_allclose(value(jnp.asarray([0.0, 0.25, 0.5, 0.75, 1.0])),
                               [0.0, 0.75 * np.sqrt(3) / 4, 0.25, np.sqrt(3) / 16, 0.0], rtol=1e-6)
    correct = np.asarray([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0],   # slot 0: p = 1/2, 1/4, 3/4 -> 1 (first: 0)
                          [1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0],   # slot 1: tied, 3/4, tied -> 4
                          [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1],   # slot 2: none varies -> 8, unfilled
                          [1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0]], np.float32)  # slot 3: 1/2, 1/2, 1/4 -> 11
    rewards = jnp.asarray(np.stack([correct, np.ones_like(correct)], -1))
    chosen, filled = select_varied(rewards, 3, value(rewards[..., 0].mean(1)))
    np.testing.assert_array_equal(chosen, [1, 4, 8, 11])
    np.testing.assert_array_equal(filled, [True, True, False, True])
    np.testing.assert_array_equal(select_varied(rewards, 3)[0], [0, 4, 8, 9])  # DAPO's first varied one
    np.testing.assert_array_equal(select_varied(rewards, 3, jnp.zeros(12))[0], [0, 4, 8, 9])  # equal worth: the first


def test_progressive_reward_shaping_moves_the_weight_from_format_to_correctness():
    """reward.progressive = k (PRS): the correct component becomes a c + (1 - a) f, a = min(t / k, 1), so under weights
    (1, 0.1) the weighted reward is a c + (1.1 - a) f: all on the format at t = 0, the configured weights from t = k."""
    from jaxrl.rewards import progressive_rewards

    rewards = jnp.asarray([[[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]])  # (correct, well_formed)
    weights = jnp.asarray([1.0, 0.1])
    for step, expected in [(0, [1.1, 1.1, 0.0, 0.0]), (1, [1.1, 0.85, 0.25, 0.0]), (2, [1.1, 0.6, 0.5, 0.0]),
                           (4, [1.1, 0.1, 1.0, 0.0]), (9, [1.1, 0.1, 1.0, 0.0])]:
        shaped = jax.jit(progressive_rewards, static_argnums=(2, 3, 4))(rewards, jnp.asarray(step), 4, 0, 1)
        np.testing.assert_allclose(shaped @ weights, [expected], rtol=1e-6, err_msg=f"update {step}")
        np.testing.assert_array_equal(shaped[..., 1], rewards[..., 1])  # the format component stays


def test_init_from_a_differently_shaped_run_is_an_error_and_moves_nothing(sft_run, tmp_path):
    before = sorted(os.listdir(os.path.join(sft_run, "checkpoints")))
    for key, value, message in [("model.d_model", 96, r"the saved run's params/.* is \[.*64.*\], this config's model has \[.*96"),
                                ("model.num_layers", 3, "the saved run has no parameters params/block_1")]:
        config = tiny_grpo_config(sft_run, **{key: value})
        with pytest.raises(ValueError, match="config.init_from: " + message) as raised:
            train.run(config, str(tmp_path / key))
        assert not os.path.exists(tmp_path / key / "checkpoints"), "refused before anything was written"
        # on the command line: one line naming the key, not a traceback (nor jax's note on its frames)
        assert cli.is_input_error(raised.value) and cli.message(raised.value).startswith("config.init_from: ")
        assert "\n" not in cli.message(raised.value) and "JAX" not in cli.message(raised.value)
    assert sorted(os.listdir(os.path.join(sft_run, "checkpoints"))) == before
    with pytest.raises(ValueError, match="start from the parameters of"):  # never a silent fresh start
        algos.build(tiny_grpo_config(sft_run), mesh_lib.make_mesh())[0].init_seeds(0, 1)


def test_text_grpo_config_errors_name_the_key(sft_run, tmp_path):
    for overrides, key in [({"advantage.estimator": "best_of"}, "config.advantage.estimator"), ({"loss.kl": "k4"}, "config.loss.kl"),
                           ({"group.size": 1}, "config.group.size"),
                           ({}, "config.init_from")]:
        config = tiny_grpo_config(sft_run if overrides else str(tmp_path), **overrides)
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            algos.validate(config)


def test_objective_settings_that_cannot_work_are_refused(sft_run):
    from helpers import load_experiment

    for overrides, message in [
            ({"loss.reference_reset": 5}, "reference_reset=5 resets a reference policy the run does not keep"),
            ({"loss.objective": "cispo", "loss.dual_clip": 3.0}, "dual_clip caps PPO's clipped surrogate"),
            ({"loss.objective": "pacs", "loss.ratio": "sequence"}, "pacs scores whole completions itself"),
            ({"loss.objective": "nfT"}, "unknown config.loss.objective 'nfT'; known: clip, cispo, nft, pacs"),
            ({"reward.label_free": "majority", "rollout.replay": "reference"}, "label_free=majority reads no label"),
            ({"loss.confidence_clip": 0.5}, r"^config\.loss\.confidence_clip: ECHO reads each group's vote confidence "
                                            r".* needs config\.reward\.label_free=majority$"),
            ({"advantage.confidence_entropy_shaping": True}, "^config.advantage.confidence_entropy_shaping: ECHO reads"),
            ({"advantage.novelty_floor": 0.5}, r"novelty_floor=0\.5 bounds the factor of advantage\.novelty_sharp"),
            ({"loss.confidence_clip": 1.5}, r"config\.loss\.confidence_clip must lie in \[0, 1\]"),
            ({"loss.keep_schedule": 10}, "keep_schedule=10 relaxes D3S's down-sampling: set config.loss.sample_keep"),
            ({"loss.sample_keep": 0.0}, "config.loss.sample_keep"),
            ({"group.size": 1}, "group.size=1 leaves no group to compare a sample with"),
            ({"advantage.estimator": "tracked"}, r"tracked value: it needs a replay strategy that keeps one \(anchor, "
                                                 "tracker: e.g. config.rollout.replay=tracker"),
            ({"rollout.replay": "anchor", "rollout.pool_size": 16, "sampling.temperature": 0.5},
             "anchor.temperature=1.0 must equal config.sampling.temperature=0.5"),
            ({"advantage.estimator": "fused", "loss.critic_weight": 0.1, "advantage.scale": "group"},
             "centres samples on a value, not on their group's mean"),
            ({"loss.layer_policy": 1, "loss.kl_coef": 0.1}, "layer_policy=1 optimises an internal layer policy"),
            ({"loss.ratio": "turn"}, "ratio=turn takes the geometric mean of each turn's token ratios"),
            ({"advantage.cross_rollout": True, "loss.value_entropy": True},
             r"^config\.advantage\.cross_rollout and config\.loss\.value_entropy: POISE's value head needs"),
            ({"advantage.cross_rollout": True, "loss.critic_weight": 1.0, "group.size": 1},
             r"another member's completion: config\.group\.size=1 must be >= 2$"),
            ({"advantage.estimator": "fused"}, "fuses a value head's prior with the group mean: it needs config.loss"),
            ({"rollout.replay": "tracker", "rollout.pool_size": 16}, "replay/tracker keeps each problem's value"),
            ({"loss.objective": "nft", "group.size": 1, "advantage.estimator": "tracked", "rollout.replay": "tracker",
              "rollout.pool_size": 16}, "objective=nft reads each group's pass rate")]:
        with pytest.raises(ValueError, match=message):
            algos.validate(tiny_grpo_config(sft_run, **overrides))
    env_grpo = load_experiment("cartpole_grpo")
    env_grpo.loss.objective = "nft"
    with pytest.raises(ValueError, match="objective=nft learns from the verifier's correct label of each completion: "
                                         "it needs text GRPO"):
        algos.validate(env_grpo)
    env_grpo = load_experiment("cartpole_grpo")
    env_grpo.advantage.estimator = "tracked"
    with pytest.raises(ValueError, match="environment GRPO has none"):
        algos.validate(env_grpo)


def test_a_teacher_pulls_the_policy_by_its_kl_and_an_earlier_checkpoint_can_be_it(sft_run):
    """loss.teacher (KDRL): with the warm start itself as teacher, the KL to the teacher is the KL to the reference
    policy (both are the starting policy): 0 at the first update, then equal to it as the policy moves. The frozen
    teacher is checkpointed beside the state (a resumed run reads it from there)."""
    config = tiny_grpo_config(sft_run, **{"loss.teacher": sft_run, "loss.teacher_coef": 0.5, "loss.kl_coef": 0.05})
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    assert algo.frozen_from == (("teacher", sft_run),)
    start = start_params(sft_run)
    state = algo.init_seeds(0, 1, start_params=start, frozen={"teacher": start})
    state, first = algo.run_chunk(state, hp, 1)
    state, second = algo.run_chunk(state, hp, 1)
    first, second = jax.device_get(first), jax.device_get(second)
    assert float(first["teacher_kl"][0]) == 0.0 and float(first["kl"][0]) == 0.0
    assert float(second["teacher_kl"][0]) > 0.0
    np.testing.assert_allclose(second["teacher_kl"], second["kl"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state.teacher), jax.tree.leaves(start)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="loss.teacher='/nowhere' is neither a text run directory"):
        algos.validate(tiny_grpo_config(sft_run, **{"loss.teacher": "/nowhere"}))


def test_truncated_completions_lose_their_loss_or_only_their_push_down():
    """loss.truncated: a completion without EOS within the limit is cut off; mask drops all its tokens, mask_negative
    those of negative advantage (DAPO's overlong filtering, MicroCoder-GRPO's conditional masking); a pruned member
    was stopped, not cut off."""
    from jaxrl.rewards import kept_tokens, truncated

    eos = 2
    tokens = jnp.asarray([[[5, 6, 2, 0], [5, 6, 7, 8], [5, 6, 7, 8]]])  # [1, 3, 4]: ended, cut off, cut off
    mask = jnp.asarray([[[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]], jnp.float32)
    cut = truncated(tokens, mask, eos)
    np.testing.assert_array_equal(cut, [[False, True, True]])
    np.testing.assert_array_equal(truncated(tokens, mask, eos, pruned=jnp.asarray([[False, False, True]])),
                                  [[False, True, False]])
    advantages = jnp.broadcast_to(jnp.asarray([0.5, -1.0, 1.0])[None, :, None], (1, 3, 4))
    np.testing.assert_array_equal(kept_tokens(cut, advantages, "mask")[0, :, 0], [1, 0, 0])
    np.testing.assert_array_equal(kept_tokens(cut, advantages, "mask_negative")[0, :, 0], [1, 0, 1])


def test_best_of_k_by_the_value_head_takes_each_samples_last_prediction():
    """eval_head@k (ARRoL's test-time reuse of its quality head), by hand: a sample's score is the head's value before
    its last token (column 0 for an empty one), and the problem counts the reward of the highest-scored sample (the
    first on a tie)."""
    from jaxrl.rewards import best_by_head, head_scores

    values = jnp.asarray([[[0.1, 0.2, 0.3, 0.0], [0.5, 0.9, 0.0, 0.0], [0.4, 0.6, 0.7, 0.8]],
                          [[0.2, 0.0, 0.0, 0.0], [0.6, 0.7, 0.0, 0.0], [0.1, 0.7, 0.0, 0.0]]])  # [2 problems, k=3, N=4]
    lengths = jnp.asarray([[3, 1, 4], [0, 2, 2]])
    mask = (jnp.arange(4) < lengths[..., None]).astype(jnp.float32)
    scores = head_scores(values, mask)
    np.testing.assert_allclose(scores, [[0.3, 0.5, 0.8], [0.2, 0.7, 0.7]])  # 0.5, not 0.9: the last live column
    correct = jnp.asarray([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    np.testing.assert_array_equal(best_by_head(correct, scores), [1.0, 0.0])  # problem 1: the tie goes to sample 1
    # between pass^3 (0) and pass@3 (1) of these problems: 1/2


def test_majority_votes_reward_agreement_with_the_groups_most_common_well_formed_answer():
    """reward.label_free=majority (MM-UPT, TTRL): the pseudo-label is agreement with the most common well-formed
    answer of the group (tokens up to the end of each completion), ties to the earliest; no well-formed answer, no
    majority."""
    from jaxrl.rewards import majority_votes

    a, b, c = [4, 2, 0], [5, 2, 0], [6, 7, 2]
    tokens = jnp.asarray([[a, a, b, a, c], [a, b, b, a, c], [a, b, c, a, b], [a, a, b, b, c]])
    mask = (tokens != 0).astype(jnp.float32)
    formed = jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(majority_votes(tokens, mask, formed), [
        [1, 1, 0, 1, 0],  # a three times
        [1, 0, 0, 1, 0],  # a and b twice each: the earliest, a
        [1, 0, 0, 1, 0],  # the malformed b's do not vote: a twice, c once
        [0, 0, 0, 0, 0]])  # nothing well formed
    # the same answer written with different padding after its end is the same answer
    padded = tokens.at[0, 1, 2].set(9)
    np.testing.assert_array_equal(majority_votes(padded, mask, formed)[0], [1, 1, 0, 1, 0])


def test_vote_confidence_is_the_majority_share_of_the_well_formed():
    """ECHO's confidence: agreeing / well-formed. 3 of 5 -> 0.6; 2 of 3 well-formed (the malformed do not count)
    -> 2/3; none well-formed -> 0."""
    from jaxrl.rewards import vote_confidence

    agrees = jnp.asarray([[1, 1, 0, 1, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 0]], bool)
    formed = jnp.asarray([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], bool)
    np.testing.assert_allclose(vote_confidence(agrees, formed), [0.6, 2 / 3, 0.0], rtol=1e-6)


def test_the_length_penalty_charges_long_correct_answers_of_easy_problems_most():
    """reward.length_penalty (ARLCP): a correct answer's correct reward loses penalty x (1 - difficulty) x length /
    limit; wrong answers pay nothing."""
    from jaxrl.rewards import length_penalised

    rewards = jnp.asarray([[[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]])
    lengths = jnp.asarray([[2, 8, 8], [2, 8, 8]])
    out = length_penalised(rewards, lengths, jnp.asarray([0.0, 0.75]), 0, 0.5, 8)
    np.testing.assert_allclose(out[..., 0], [[1 - 0.5 * 2 / 8, 1 - 0.5, 0.0], [1 - 0.125 * 2 / 8, 1 - 0.125, 0.0]])
    np.testing.assert_array_equal(out[..., 1], rewards[..., 1])  # the other components stay


def test_pvpo_anchors_are_the_reference_policys_rewards_on_every_pool_problem(countdown_sft_run):
    """PVPO's pre-rollouts at temperature 0: every sample is the warm start's greedy answer, so each problem's anchor
    is that answer's reward (0 or 1), computed here apart through `sampling.sample`."""
    config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{
        "advantage.estimator": "tracked", "rollout.replay": "anchor", "rollout.pool_size": 32,
        "sampling.temperature": 0.0, "rollout.options.anchor.temperature": 0.0})
    algos.validate(config)
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    params = start_params(countdown_sft_run)
    state = algo.init_seeds(0, 1, start_params=params)
    parts = algo.parts
    prompts = parts.task.prompts(parts.pool, parts.vocab)
    greedy = sampling.sample(parts.policy.model, jax.tree.map(lambda x: x[0], params), prompts, jax.random.key(0),
                             max_new_tokens=parts.task.answer_length, eos_id=parts.vocab.eos_id,
                             pad_id=parts.vocab.pad_id, temperature=0.0).tokens
    want = parts.task.rewards(parts.pool, greedy, parts.vocab)
    np.testing.assert_array_equal(state.memory["anchor"]["value"][0], want)
    assert 0 < want[:, 0].mean() < 1  # the warm start solves some problems, not all


def test_bupo_optimises_the_internal_layer_policy_first_then_the_whole_model():
    """loss.layer_policy=1 on a two-layer model for the first update: the loss reads the hidden state after layer 1,
    so the second layer gets no gradient in that update (no weight decay: its parameters stay exactly as they were)
    while the first layer learns; from the second update on the whole model's policy is optimised."""
    config = tiny_grpo_config("", **{"model.num_layers": 2, "loss.layer_policy": 1, "loss.layer_policy_updates": 1,
                                     "optim.weight_decay": 0.0, "total_steps": 8 * 4 * 2})
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    state = algo.init_seeds(0, 1)
    before = jax.device_get(state.params["params"])
    state, metrics = algo.run_chunk(state, hp, 1)
    first = jax.device_get(state.params["params"])
    assert float(metrics["layer_policy"][0]) == 1.0
    for a, b in zip(jax.tree.leaves(before["block_1"]), jax.tree.leaves(first["block_1"])):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(before["block_0"]["fc"]["kernel"], first["block_0"]["fc"]["kernel"])
    state, metrics = algo.run_chunk(state, hp, 1)
    assert float(metrics["layer_policy"][0]) == 0.0
    assert not np.allclose(first["block_1"]["fc"]["kernel"], jax.device_get(state.params["params"])["block_1"]
                           ["fc"]["kernel"])
    with pytest.raises(ValueError, match="layer_policy=2 must name a layer below the model's last"):
        algos.build(tiny_grpo_config("", **{"model.num_layers": 2, "loss.layer_policy": 2}), mesh_lib.make_mesh())


def test_a_broad_group_of_128_completions_per_prompt_shares_its_prompts_cache_and_trains(monkeypatch):
    """BroRL's hundreds of rollouts per prompt: one update of 2 prompts x 128 completions (group.size = 128) on the
    small model from scratch, dynamic sampling decoding 2 candidates per slot (the preset's group.oversample). Decoding
    prefills each candidate's prompt once and gives each member a cache of its own N - 1 tokens only ([4, 128, N - 1]
    per layer, the one allocation of per-member caches: the prompt's keys and values are shared, never copied 128
    times); the loss is finite and the update learned from 2 x 128 = 256 completions (tokens / mean length)."""
    from jaxrl import transformer

    own_caches = []
    init_own_cache = transformer.init_own_cache
    monkeypatch.setattr(transformer, "init_own_cache",
                        lambda config, *shape: own_caches.append(shape) or init_own_cache(config, *shape))
    config = tiny_grpo_config("", **{"num_prompts": 2, "group.size": 128, "total_steps": 2 * 128})
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh(1))
    N, candidates = algo.parts.task.answer_length, 2 * config.group.oversample
    assert candidates == 4
    _, metrics = algo.run_chunk(algo.init_seeds(0, 1), hp, 1)
    metrics = jax.device_get(metrics)
    assert own_caches == [(candidates, 128, N - 1)], own_caches
    assert np.isfinite(metrics["policy_loss"][0]) and np.isfinite(metrics["grad_norm"][0])
    assert float(metrics["tokens"][0]) / float(metrics["completion_length"][0]) == pytest.approx(256, rel=1e-5)
