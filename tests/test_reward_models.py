"""Reward models: the losses and ranking metrics against hand-worked values, a reward model trained on an SFT
policy's completions, and GRPO with its reward (`reward.model`)."""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import algos, mesh as mesh_lib, reward_models, rollout, sampling, train
from jaxrl.algos.reward_model import RewardModelScorer, map_in_pieces, scoring
from jaxrl.run.saved import start_params
from helpers import countdown_2, load_experiment, set_keys, tiny_grpo_config


def test_bradley_terry_loss_by_hand():
    # completion 0 is right, 1 and 2 wrong: pairs (0, 1) and (0, 2), margins 2 and 1
    scores, labels = jnp.array([[2.0, 0.0, 1.0]]), jnp.array([[1.0, 0.0, 0.0]])
    expected = (math.log(1 + math.exp(-2.0)) + math.log(1 + math.exp(-1.0))) / 2
    assert float(reward_models.bradley_terry_loss(scores, labels)) == pytest.approx(expected, rel=1e-6)
    # a second prompt whose completions all tie brings no pair, so the mean is unchanged
    both = reward_models.bradley_terry_loss(jnp.array([[2.0, 0.0, 1.0], [5.0, -3.0, 0.0]]),
                                            jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    assert float(both) == pytest.approx(expected, rel=1e-6)
    assert float(reward_models.bradley_terry_loss(scores, jnp.zeros((1, 3)))) == 0.0


def test_pointwise_loss_by_hand():
    # -log sigmoid(0) for a right completion scored 0, -log(1 - sigmoid(2)) for a wrong one scored 2
    loss = reward_models.pointwise_loss(jnp.array([0.0, 2.0]), jnp.array([1.0, 0.0]))
    assert float(loss) == pytest.approx((math.log(2.0) + math.log(1 + math.exp(2.0))) / 2, rel=1e-6)


def test_ranking_accuracy_counts_a_tie_as_half_and_best_of_n_takes_the_top_score():
    scores, labels = jnp.array([[1.0, 1.0, 0.0]]), jnp.array([[1.0, 0.0, 0.0]])
    accuracy, pairs = reward_models.ranking_accuracy(scores, labels)
    assert (float(accuracy), float(pairs)) == (0.75, 2.0)  # (0, 1) tied: 1/2; (0, 2) right: 1
    assert reward_models.best_of_n(jnp.array([[0.1, 0.9, 0.5], [3.0, 1.0, 2.0]]),
                                   jnp.array([[0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])).tolist() == [1.0, 0.0]


def test_implicit_process_rewards_by_hand():
    # PRIME: beta * (log pi - log pi_ref) per token, nothing off the mask; the outcome score is their sum
    rewards = reward_models.implicit_rewards(jnp.array([[-1.0, -2.0, -0.5]]), jnp.array([[-1.5, -1.0, -3.0]]),
                                             jnp.array([[1.0, 1.0, 0.0]]), 0.1)
    np.testing.assert_allclose(rewards, [[0.05, -0.1, 0.0]], atol=1e-7)


def test_an_implicit_reward_model_starts_at_score_zero_and_learns(countdown_sft_run, reward_model_run, tmp_path):
    config = set_keys(reward_model_config(countdown_sft_run, 4_096), {"reward_model.objective": "implicit",
                                                                      "reward_model.beta": 0.5})
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    model = algo.parts
    state = algo.init_seeds(0, 1, start_params=start_params(countdown_sft_run))
    problems = model.task.sample(jax.random.key(0), 8, "train")
    params = jax.tree.map(lambda x: x[0], state.params)
    prompts, samples, labels, _ = model.draw(params, problems, jax.random.split(jax.random.key(1), 8), 0.5, 4)
    scores = model.whole_scorer(scoring(params, "implicit"), prompts, samples.tokens, samples.mask)
    np.testing.assert_array_equal(scores, 0.0)  # the model is its reference: log-ratio 0, sigmoid 1/2
    rows = train.run(config, str(tmp_path / "implicit")).metrics
    assert rows[-1]["loss"] < math.log(2.0) and rows[-1]["eval_ranking_accuracy"] > 0.5  # measured 0.60
    # As GRPO's reward, the implicit model keeps its reference beside it and scores as it did in training
    grpo_config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{"reward.model": str(tmp_path / "implicit"),
                                                                          "advantage.process_weight": 1.0})
    grpo_algo, hp = algos.build(grpo_config, mesh_lib.make_mesh())
    saved = start_params(str(tmp_path / "implicit"))
    grpo_state = jax.tree.map(lambda x: x[0], grpo_algo.init_seeds(
        0, 1, start_params=start_params(countdown_sft_run), frozen={"reward_model": saved}))
    assert sorted(grpo_state.reward_model) == ["params", "sampler"]
    trained = jax.tree.map(lambda x: x[0], saved)
    expected = model.whole_scorer(scoring(trained, "implicit"), prompts, samples.tokens, samples.mask)
    np.testing.assert_allclose(grpo_algo.parts.learned_reward.scorer(grpo_state.reward_model, prompts, samples.tokens,
                                                                     samples.mask), expected, atol=1e-5)
    # With advantage.process_weight, its per-token rewards come along: they sum to the score the reward is made of
    _, groups = right_and_wrong_groups(grpo_algo.parts)
    rewarded = grpo_algo.parts._learned_rewards(grpo_state.reward_model, hp, groups)
    assert rewarded.process.shape == groups.tokens.shape and not np.asarray(rewarded.process)[groups.mask == 0].any()
    np.testing.assert_allclose(rewarded.rewards[..., 0], jax.nn.sigmoid(rewarded.process.sum(-1)), atol=1e-6)
    with pytest.raises(ValueError, match="takes per-token rewards from an implicit reward model"):
        algos.build(set_keys(grpo_config, {"reward.model": reward_model_run[0]}), mesh_lib.make_mesh())  # (pairwise)


def test_process_returns_by_hand():
    from jaxrl import advantages

    # two completions: per-token means 1 (tokens 2, 0) and 3 (token 3, then padding); leave-one-out baselines 3 and 1
    rewards = jnp.array([[[2.0, 0.0], [3.0, 9.0]]])
    mask = jnp.array([[[1.0, 1.0], [1.0, 0.0]]])
    # completion 0: centred (2 - 3, 0 - 3) = (-1, -3), to go (-4, -3); completion 1: (3 - 1) = 2, padding 0
    np.testing.assert_allclose(advantages.process_returns(rewards, mask), [[[-4.0, -3.0], [2.0, 0.0]]])


def test_step_slots_step_scores_and_monte_carlo_shares_by_hand():
    ends = jnp.array([[False, True, False, False, True, False]])  # steps end at tokens 1 and 4
    slots = reward_models.step_slots(ends)
    assert np.flatnonzero(slots[0]).tolist() == [2, 5]  # the slots that have read each whole step
    values = jnp.array([[9.0, 9.0, 0.5, 9.0, 9.0, -1.0], [9.0, 9.0, -1.0, 9.0, 9.0, 0.5]])
    slots = jnp.concatenate([slots, slots])
    assert reward_models.step_score(values, slots, "min").tolist() == [-1.0, -1.0]  # the weakest step
    assert reward_models.step_score(values, slots, "last").tolist() == [-1.0, 0.5]
    p = 1 / (1 + math.exp(-0.5)) / (1 + math.exp(1.0))  # sigmoid(0.5) * sigmoid(-1)
    np.testing.assert_allclose(reward_models.step_score(values, slots, "product"), [math.log(p / (1 - p))] * 2,
                               rtol=1e-5)
    for how in reward_models.STEP_SCORES:
        assert reward_models.step_score(values, jnp.zeros_like(slots), how).tolist() == [0.0, 0.0]
    verdicts = jnp.array([[1, 0, 1, 1], [0, 0, 0, 0], [0, 0, 1, 0]])
    assert reward_models.monte_carlo_labels(verdicts).tolist() == [0.75, 0.0, 0.25]  # soft: the share
    assert reward_models.monte_carlo_labels(verdicts, "hard").tolist() == [1.0, 0.0, 1.0]  # hard: any
    with pytest.raises(ValueError, match="unknown Monte Carlo step label 'median'"):
        reward_models.monte_carlo_labels(verdicts, "median")
    checked = jnp.array([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert reward_models.prefix_labels(checked).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]  # to a slip


def test_the_pairwise_step_loss_ranks_every_two_steps_of_a_prompt_by_hand():
    """One prompt, two completions of two steps (slots 1 and 3): labels 0.5, 1 and 0.25, 0. Its ordered pairs are the
    6 with different labels (1 > 0.5, 1 > 0.25, 1 > 0, 0.5 > 0.25, 0.5 > 0, 0.25 > 0); the value at a slot no step
    ends never counts; the pointwise loss is each step's cross-entropy."""
    values = jnp.array([[[9.0, 0.2, 9.0, 1.0], [9.0, -0.3, 9.0, -1.0]]])
    labels = jnp.array([[[0.0, 0.5, 0.0, 1.0], [0.0, 0.25, 0.0, 0.0]]])
    slots = jnp.array([[[False, True, False, True]] * 2])
    step = {(0, 1): 0.2, (0, 3): 1.0, (1, 1): -0.3, (1, 3): -1.0}
    label = {(0, 1): 0.5, (0, 3): 1.0, (1, 1): 0.25, (1, 3): 0.0}
    pairs = [(a, b) for a in step for b in step if label[a] > label[b]]
    assert len(pairs) == 6
    expected = np.mean([math.log1p(math.exp(-(step[a] - step[b]))) for a, b in pairs])
    np.testing.assert_allclose(reward_models.step_loss(values, labels, slots, "pairwise"), expected, rtol=1e-6)
    pointwise = np.mean([math.log1p(math.exp(step[k])) - label[k] * step[k] for k in step])
    np.testing.assert_allclose(reward_models.step_loss(values, labels, slots, "pointwise"), pointwise, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown step loss 'listwise'; known: pointwise, pairwise"):
        reward_models.step_loss(values, labels, slots, "listwise")


def test_the_likelihood_a_judge_reads_by_hand():
    # each slot adds weight * the log-probabilities of the real tokens before it: slot 0 has read none
    values = jnp.array([[0.5, 0.5, 0.5, 0.5]])
    log_probs, mask = jnp.array([[-1.0, -2.0, -0.5, -9.0]]), jnp.array([[1.0, 1.0, 1.0, 0.0]])
    read = reward_models.with_likelihood(values, log_probs, mask, 2.0)
    np.testing.assert_allclose(read, [[0.5, 0.5 - 2.0, 0.5 - 6.0, 0.5 - 7.0]], atol=1e-6)
    # a completion's score (its last real slot) then reads every token but the last: the EOS adds nothing
    assert float(reward_models.completion_scores(read, mask)[0]) == pytest.approx(0.5 - 6.0)


def test_a_reward_model_that_reads_its_likelihood_starts_from_the_sampler_s(countdown_sft_run, tmp_path):
    config = set_keys(reward_model_config(countdown_sft_run, 2_048), {"reward_model.likelihood_weight": 1.0})
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    model = algo.parts
    params = jax.tree.map(lambda x: x[0], algo.init_seeds(0, 1, start_params=start_params(countdown_sft_run)).params)
    problems = model.task.sample(jax.random.key(0), 8, "train")
    prompts, samples, _, _ = model.draw(params, problems, jax.random.split(jax.random.key(1), 8), 0.5, 4)
    scores = model.whole_scorer(scoring(params, "pairwise"), prompts, samples.tokens, samples.mask)
    head_alone = dataclasses.replace(model.whole_scorer, likelihood_weight=0.0)(
        scoring(params, "pairwise"), prompts, samples.tokens, samples.mask)
    # what the weight adds is the sampler's own log-likelihood of each completion's tokens before its EOS
    log_probs, _, _ = sampling.score_groups(model.sampler_policy.model, {"params": params["sampler"]}, prompts,
                                            samples.tokens, samples.mask, model.vocab.pad_id)
    before_eos = samples.mask * (jnp.arange(samples.mask.shape[-1]) < samples.mask.sum(-1, keepdims=True) - 1)
    np.testing.assert_allclose(scores - head_alone, jnp.sum(log_probs * before_eos, -1), atol=1e-4)
    rows = train.run(config, str(tmp_path / "run")).metrics
    assert max(row["loss"] for row in rows[-2:]) < math.log(2.0) and rows[-1]["eval_ranking_accuracy"] > 0.5
    # as GRPO's reward it reads the likelihood as it did in training
    grpo_config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{"reward.model": str(tmp_path / "run")})
    grpo_algo, _ = algos.build(grpo_config, mesh_lib.make_mesh())
    trained = jax.tree.map(lambda x: x[0], start_params(str(tmp_path / "run")))
    np.testing.assert_allclose(
        grpo_algo.parts.learned_reward.scorer(scoring(trained, "pairwise"), prompts, samples.tokens, samples.mask),
        model.whole_scorer(scoring(trained, "pairwise"), prompts, samples.tokens, samples.mask), atol=1e-4)
    for objective in ("implicit", "generative"):
        with pytest.raises(ValueError, match="likelihood_weight=1.0 adds the model's likelihood"):
            algos.validate(set_keys(config, {"reward_model.objective": objective}))


def test_a_judge_with_its_own_layers_starts_from_the_sft_run_and_learns(countdown_sft_run, tmp_path):
    """reward_model.judge_layers=1: the SFT body under fresh judge layers and value head; the sampler draws with the
    body alone (decoding has no judge); training ranks held-out completions above chance; the saved judge scores
    strings; models it does not fit are refused before compiling."""
    config = set_keys(reward_model_config(countdown_sft_run, 4_096), {"reward_model.judge_layers": 1})
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    model = algo.parts
    params = jax.tree.map(lambda x: x[0], algo.init_seeds(0, 1, start_params=start_params(countdown_sft_run)).params)
    sft = jax.tree.map(lambda x: x[0], start_params(countdown_sft_run))["params"]
    assert {"judge_in", "judge_0", "judge_ln", "value"} <= set(params["params"]) and "judge_0" not in sft
    for name, part in sft.items():
        for a, b in zip(jax.tree.leaves(params["params"][name]), jax.tree.leaves(part), strict=True):
            np.testing.assert_array_equal(a, b)
    assert model.sampler_model.config.judge_layers == 0 and not model.sampler_model.config.value_head
    rows = train.run(config, str(tmp_path / "run")).metrics
    # (measured: ranking accuracy 0.76 on the 64 held-out problems' pairs, loss 0.57; a tie everywhere gives 1/2, log 2)
    assert max(row["loss"] for row in rows[-2:]) < math.log(2.0) and rows[-1]["eval_ranking_accuracy"] > 0.6
    saved = algos.saved_config(os.path.join(tmp_path, "run", "config.json"))
    rebuilt, _ = algos.build(saved, mesh_lib.make_mesh(), run_dir=str(tmp_path / "run"))
    scorer = rebuilt.actor(jax.tree.map(lambda x: x[0], start_params(str(tmp_path / "run"))))
    probabilities = scorer.score(["12 30>42=", "12 30>42="], ["12+30", "30-12"])
    assert probabilities.shape == (2,) and ((probabilities > 0) & (probabilities < 1)).all()
    # as GRPO's reward it scores through its judge layers as in training
    grpo_config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{"reward.model": str(tmp_path / "run")})
    grpo_algo, _ = algos.build(grpo_config, mesh_lib.make_mesh())
    trained = jax.tree.map(lambda x: x[0], start_params(str(tmp_path / "run")))
    problems = model.task.sample(jax.random.key(0), 8, "train")
    prompts, samples, _, _ = model.draw(trained, problems, jax.random.split(jax.random.key(1), 8), 0.5, 4)
    np.testing.assert_allclose(
        grpo_algo.parts.learned_reward.scorer(scoring(trained, "pairwise"), prompts, samples.tokens, samples.mask),
        model.whole_scorer(scoring(trained, "pairwise"), prompts, samples.tokens, samples.mask), atol=1e-4)
    for wrong in ({"reward_model.objective": "implicit"}, {"reward_model.objective": "generative"},
                  {"model.name": "HuggingFaceTB/SmolLM2-135M-Instruct"}):
        with pytest.raises(ValueError, match="judge_layers=1: judge layers feed the value head"):
            algos.validate(set_keys(config.copy_and_resolve_references(), wrong))


def test_a_completion_is_scored_at_its_last_real_slot():
    values = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], jnp.float32)
    assert reward_models.completion_scores(values, mask).tolist() == [3.0, 5.0, 0.0]


def _ids(vocab, text, width):
    """int32 [width]: `text`'s characters ("$" for EOS), padded."""
    ids = [vocab.eos_id if c == "$" else vocab.id_of(c) for c in text]
    return jnp.asarray(ids + [vocab.pad_id] * (width - len(ids)), jnp.int32)


def _text(vocab, ids, length):
    return "".join("$" if int(i) == vocab.eos_id else vocab.tokens[int(i)] for i in np.asarray(ids)[:int(length)])


@pytest.mark.parametrize("completion, critique", [
    ("7+1*18$", "7+1*18=25$"),    # precedence: 7 + 18
    ("(7+1)*18$", "(7+1)*18=144$"),
    ("9/6$", "9/6=3/2$"),         # a fraction, reduced
    ("7-25$", "7-25=-18$"),
    ("7+$", "7+=$"),              # not an expression: no value
    ("25*25*25*25*25", "25*25*25*25*25=$"),  # no EOS within N; its value is past what a critique writes
])
def test_a_value_critique_opens_the_completion_and_writes_its_value(completion, critique):
    from envs import text
    from envs.text import judge

    vocab = text.Vocab.from_alphabet(text.ALPHABET)
    N = 14
    # jitted: eager calls compile each primitive separately
    ids, start, total = jax.jit(judge.value_critique, static_argnums=1)(_ids(vocab, completion, N), vocab)
    assert ids.shape == (N + judge.critique_width(),)
    assert _text(vocab, ids, total) == critique
    assert int(start) == critique.index("=") + 1 and int(total) == len(critique)
    forced, forced_len = jax.jit(judge.opening, static_argnums=1)(_ids(vocab, completion, N), vocab)
    assert _text(vocab, forced, forced_len) == critique[:critique.index("=") + 1]


def test_the_goal_is_hidden_from_the_critique_and_shown_after_it():
    from envs import text
    from envs.text import judge

    vocab = text.Vocab.from_alphabet(text.ALPHABET)
    prompt = jnp.asarray([vocab.pad_id, vocab.pad_id] + [vocab.id_of(c) for c in "1 7 18>25="], jnp.int32)
    # jitted: eager calls compile each primitive separately
    hide_goal = jax.jit(judge.hide_goal, static_argnums=1, static_argnames="width")
    seen, goal = hide_goal(prompt, vocab, width=4)
    assert _text(vocab, [i for i in np.asarray(seen) if i != vocab.pad_id], 99) == "1 7 18="
    assert _text(vocab, goal[0], goal[1]) == ">25"
    critique, _, total = jax.jit(judge.value_critique, static_argnums=1)(_ids(vocab, "7+1*18$", 10), vocab)
    closed, length = jax.jit(judge.closing, static_argnums=2)(critique, goal, vocab)
    assert _text(vocab, closed, length) == "7+1*18=25>25$"
    no_goal = jnp.asarray([vocab.id_of(c) for c in "12+30="], jnp.int32)  # (an arithmetic prompt: nothing hidden)
    seen, goal = hide_goal(no_goal, vocab, width=4)
    np.testing.assert_array_equal(seen, no_goal)
    assert int(goal[1]) == 0


def test_critique_loss_by_hand():
    log_probs = jnp.log(jnp.array([[0.5, 0.25, 0.9], [0.125, 1.0, 1.0]]))
    where = jnp.array([[0, 1, 1], [1, 0, 0]])  # the critique's slots
    expected = -(math.log(0.25) + math.log(0.9) + math.log(0.125)) / 3
    np.testing.assert_allclose(reward_models.critique_loss(log_probs, where), expected, rtol=1e-6)


def reward_model_config(init_from: str, total_steps: int):
    config = set_keys(load_experiment("text_reward_model", "countdown"), countdown_2())
    config.init_from = init_from
    config.sampling.temperature = 0.5  # (the tiny policy's samples at temperature 1 are nearly all wrong)
    config.num_prompts, config.group.size = 16, 8
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2  # tiny_sft_config's
    config.optim.learning_rate, config.optim.warmup_updates = 1e-3, 5
    config.total_steps = total_steps
    config.log.every_steps, config.eval.every_steps, config.eval.episodes = 1_024, total_steps, 64
    config.checkpoint.every_steps = total_steps
    config.log.progress_bar = False
    return config


@pytest.fixture(scope="module")
def reward_model_run(countdown_sft_run, tmp_path_factory):
    """A reward model of 8,192 labelled completions of conftest.py's two-number Countdown SFT policy."""
    workdir = str(tmp_path_factory.mktemp("reward_model") / "run")
    rows = train.run(reward_model_config(countdown_sft_run, 8_192), workdir).metrics
    return workdir, rows


def test_a_reward_model_learns_to_rank_its_sampler_s_completions(reward_model_run):
    workdir, rows = reward_model_run
    first, last = rows[0], rows[-1]
    assert 0.05 < first["labelled_correct"] < 0.95  # the sampler gives both kinds: there are pairs to learn from
    # Bradley-Terry with every score equal gives log 2 and ranks every pair as a tie (accuracy 1/2); this model
    # checks `a op b` against the target, which the tiny policy gets right a fifth of the time at this temperature
    assert max(row["loss"] for row in rows[-3:]) < math.log(2.0)
    assert last["eval_ranking_accuracy"] > 0.55  # measured 0.63-0.69 on the 64 held-out problems' pairs
    assert last["eval_best_of_n"] <= last["eval_pass@8"]
    assert os.path.exists(os.path.join(workdir, "scored_completions.txt"))


def test_the_sampler_stays_the_warm_start_and_the_scorer_reads_strings(countdown_sft_run, reward_model_run):
    params = start_params(reward_model_run[0])
    sft = start_params(countdown_sft_run)
    sampler = {k: v for k, v in params["sampler"].items() if k != "value"}  # (a fresh value head, never used)
    for a, b in zip(jax.tree.leaves(sampler), jax.tree.leaves(sft["params"]), strict=True):
        np.testing.assert_array_equal(a, b)
    config = algos.saved_config(os.path.join(reward_model_run[0], "config.json"))
    algo, _ = algos.build(config, mesh_lib.make_mesh(), run_dir=reward_model_run[0])
    scorer = algo.actor(jax.tree.map(lambda x: x[0], params))
    assert isinstance(scorer, RewardModelScorer)
    probabilities = scorer.score(["12 30>42=", "12 30>42="], ["12+30", "30-12"])
    assert probabilities.shape == (2,) and ((probabilities > 0) & (probabilities < 1)).all()


def test_map_in_pieces_gives_the_whole_call_s_rows():
    """Pieces of 4 over 10 rows (the last filled out with copies of the final row): each row's result is its own."""
    rows = (jnp.arange(10.0), jax.random.split(jax.random.key(0), 10))
    whole = lambda r: (r[0] * 2.0, jax.vmap(jax.random.normal)(r[1]))  # noqa: E731
    for piece in (4, 10, 16):
        doubled, drawn = map_in_pieces(whole, rows, piece)
        np.testing.assert_array_equal(doubled, 2.0 * np.arange(10.0))
        np.testing.assert_array_equal(drawn, whole(rows)[1])


def test_held_out_scores_are_the_same_in_pieces_of_one_training_batch(reward_model_run):
    """Evaluation draws and scores one training batch of problems at a time (`num_prompts`): 40 problems in pieces of
    16 (the last filled out) give the same completions, labels and scores as all 40 at once."""
    config = algos.saved_config(os.path.join(reward_model_run[0], "config.json"))
    params = jax.tree.map(lambda x: x[:1], start_params(reward_model_run[0]))  # one seed [1, ...]
    held_out = {}
    for num_prompts in (16, 64):
        algo, _ = algos.build(set_keys(config, {"num_prompts": num_prompts}), mesh_lib.make_mesh())
        held_out[num_prompts] = jax.device_get(algo.evaluate.__self__._heldout(params, jax.random.key(3), 40))
    scores, labels, read = held_out[16]
    assert scores.shape == labels.shape == (1, 40, 8) and read.shape[:3] == (1, 40, 8)
    for piecewise, whole in zip(held_out[16], held_out[64], strict=True):
        np.testing.assert_allclose(piecewise, whole, rtol=1e-5, atol=1e-6)


def right_and_wrong_groups(grpo):
    """(problems [4], `rollout.Groups` [4, 2, N]): each problem's reference answer, and another problem's (wrong)."""
    problems = grpo.task.sample(jax.random.key(0), 4, "train")
    answers = grpo.task.reference_answers(problems, grpo.vocab)
    tokens = jnp.stack([answers, jnp.roll(answers, 1, axis=0)], axis=1)
    mask = (tokens != grpo.vocab.pad_id).astype(jnp.float32)
    verified = jax.vmap(lambda c: grpo.task.jax_rewards(problems, c, grpo.vocab), in_axes=1, out_axes=1)(tokens)
    zeros = jnp.zeros(tokens.shape[:2])
    return problems, rollout.Groups(jnp.arange(4), problems, grpo.task.prompts(problems, grpo.vocab),
                                    jnp.zeros(4, jnp.int32), tokens, jnp.zeros(tokens.shape), mask,
                                    mask.sum(-1).astype(jnp.int32), None, verified, mask, zeros, zeros > 0)


def test_grpo_takes_its_correct_reward_from_the_reward_model(countdown_sft_run, reward_model_run):
    rm_dir = reward_model_run[0]
    # the model's reward mixed half and half with the verifier's: rewards = w sigmoid(score) + (1 - w) verified
    config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{"reward.model": rm_dir, "reward.model_weight": 0.5})
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    frozen = {"reward_model": start_params(rm_dir)}
    state = jax.tree.map(lambda x: x[0], algo.init_seeds(0, 1, start_params=start_params(countdown_sft_run),
                                                         frozen=frozen))
    for a, b in zip(jax.tree.leaves(state.reward_model), jax.tree.leaves(scoring(frozen["reward_model"], "pairwise")),
                    strict=True):
        np.testing.assert_array_equal(a, b[0])
    grpo = algo.parts
    problems, groups = right_and_wrong_groups(grpo)
    tokens, verified = groups.tokens, groups.rewards
    mixed = grpo._learned_rewards(state.reward_model, hp, groups)
    texts = [grpo.policy.decode(tokens[:, g]) for g in range(2)]
    prompt_texts = [p for p, _ in grpo.task.texts(problems)]
    rm_algo = algos.build(algos.saved_config(os.path.join(rm_dir, "config.json")), mesh_lib.make_mesh(),
                          run_dir=rm_dir)[0]
    rm_scorer = rm_algo.actor(jax.tree.map(lambda x: x[0], frozen["reward_model"]))
    learned = np.stack([rm_scorer.score(prompt_texts, texts[g]) for g in range(2)], axis=1)
    np.testing.assert_allclose(mixed.rewards[..., 0], 0.5 * learned + 0.5 * verified[..., 0], atol=1e-5)
    np.testing.assert_array_equal(mixed.verified, verified)
    np.testing.assert_array_equal(mixed.rewards[..., 1], verified[..., 1])  # well_formed stays the verifier's


def test_a_grpo_run_with_a_reward_model_logs_the_learned_reward_against_the_verifier(countdown_sft_run,
                                                                                     reward_model_run, tmp_path):
    # weight 0: the verifier's reward alone, through the reward model's path (the gap is then exactly 0)
    config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{
        "reward.model": reward_model_run[0], "reward.model_weight": 0.0, "total_steps": 64, "eval.every_steps": 64})
    rows = train.run(config, str(tmp_path / "grpo")).metrics
    assert rows[0]["reward_correct"] == rows[0]["reward_verified"] and rows[0]["reward_gap"] == 0.0
    assert 0.0 <= rows[0]["reward_model_agreement"] <= 1.0


def test_a_reward_model_that_is_not_one_is_refused_in_one_line(countdown_sft_run):
    config = tiny_grpo_config(countdown_sft_run, **countdown_2(), **{"reward.model": countdown_sft_run})
    with pytest.raises(ValueError, match="is a text_sft run, not a text_reward_model run"):
        algos.build(config, mesh_lib.make_mesh())
    with pytest.raises(ValueError, match="set config.init_from"):
        algos.validate(set_keys(load_experiment("text_reward_model", "addition"), {}))


def test_process_labels_route_monte_carlo_shares_to_each_step(monkeypatch):
    """Constructed continuations: the 'sampler' continues any prefix with the reference answer's own tokens. A prefix
    whose first step is the reference's then ends right (label 1), one whose first step differs does not (label 0);
    a completion's last step is labelled by its outcome; labels sit at the slot after each step's last token."""
    config = set_keys(load_experiment("text_reward_model", "countdown_steps"), {
        "num_prompts": 2, "group.size": 2, "reward_model.objective": "process", "reward_model.continuations": 3,
        "model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2})
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    model = algo.parts
    task, vocab = model.task, model.vocab
    problems = task.sample(jax.random.key(0), 2, "train")
    reference = task.reference_answers(problems, vocab)  # [2, N]: two steps each
    first_step = np.asarray(task.step_ends(reference, vocab)).argmax(-1)  # its last token
    wrong = np.asarray(reference).copy()
    wrong[:, 0] = np.where(wrong[:, 0] == vocab.id_of("9"), vocab.id_of("8"), vocab.id_of("9"))  # a wrong first step
    tokens = jnp.stack([reference, jnp.asarray(wrong)], axis=1)  # [2 problems, 2 members, N]
    labels = jnp.array([[1.0, 0.0], [1.0, 0.0]])

    def continue_with_the_reference(model_, params, prompts, keys, *, group_size, forced, forced_len, **_):
        rows = jnp.repeat(reference, 2, axis=0)  # (prompts arrive repeated per member: problem b's rows are 2b, 2b+1)
        kept = jnp.arange(forced.shape[-1]) < forced_len[:, None]
        return sampling.Samples(jnp.repeat(jnp.where(kept, forced, rows)[:, None], group_size, 1), None, None, None)

    monkeypatch.setattr(sampling, "sample_groups_per_prompt", continue_with_the_reference)
    state = jax.tree.map(lambda x: x[0], algo.init_seeds(0, 1))
    prompts = task.prompts(problems, vocab)
    # jitted: the stand-in sampler is cheap, so eagerly each of step_labels' primitives would compile apart
    out, where = jax.jit(model.step_labels)(state.params, problems, prompts, tokens, labels, None,
                                            jax.random.split(jax.random.key(1), 2))
    out, where = np.asarray(out), np.asarray(where)
    for b in range(2):
        after_first = first_step[b] + 1
        assert where[b, 0].sum() == 2 and where[b, 1].sum() == 2  # two steps each
        assert out[b, 0, after_first] == 1.0 and out[b, 1, after_first] == 0.0  # the Monte Carlo shares
        last = np.flatnonzero(where[b, 0])[-1]
        assert out[b, 0, last] == 1.0 and out[b, 1, np.flatnonzero(where[b, 1])[-1]] == 0.0  # the outcomes
    # A process model scores a completion by its weakest step: the value head's lowest output at those slots
    mask = (tokens != vocab.pad_id).astype(jnp.float32)
    _, _, values = sampling.score_groups(model.policy.model, scoring(state.params, "process"), prompts, tokens, mask,
                                         vocab.pad_id)
    expected = np.where(where, np.asarray(values), np.inf).min(-1)
    np.testing.assert_allclose(model.whole_scorer(scoring(state.params, "process"), prompts, tokens, mask), expected,
                               rtol=1e-6)
    # One pass gives every step score: each what the scorer gives when configured with it
    every = model.whole_scorer.step_scores(scoring(state.params, "process"), prompts, tokens, mask)
    assert sorted(every) == sorted(reward_models.STEP_SCORES)
    for how, scores in every.items():
        configured = dataclasses.replace(model.whole_scorer, step_score=how)
        np.testing.assert_allclose(scores, configured(scoring(state.params, "process"), prompts, tokens, mask),
                                   rtol=1e-6)
    # and the scorer of strings likewise, as probabilities
    scorer = algo.actor(state.params)
    prompt_texts = [prompt for prompt, _ in task.texts(problems)]
    for member in range(2):
        texts = model.policy.decode(tokens[:, member])
        np.testing.assert_allclose(scorer.step_scores(prompt_texts, texts)["min"], scorer.score(prompt_texts, texts),
                                   rtol=1e-6)
        np.testing.assert_allclose(scorer.score(prompt_texts, texts), jax.nn.sigmoid(expected[:, member]), rtol=1e-5)


def test_checked_process_labels_are_the_verifier_s_steps_up_to_the_first_slip(monkeypatch):
    """step_label=checked: each inner step labelled by the task's verifier, 1 while it and every step before it are
    right (a right step after a slip is labelled 0); the last by the outcome; no continuation drawn."""
    config = set_keys(load_experiment("text_reward_model", "countdown_steps"), {
        "num_prompts": 2, "group.size": 2, "reward_model.objective": "process", "reward_model.step_label": "checked",
        "task.kwargs.num_numbers": 4, "model.max_len": 96, "model.num_layers": 1, "model.d_model": 32,
        "model.num_heads": 2})
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    model = algo.parts
    task, vocab = model.task, model.vocab
    problems = task.sample(jax.random.key(0), 2, "train")
    reference = task.reference_answers(problems, vocab)  # [2, N]: three steps each
    wrong = np.asarray(reference).copy()
    wrong[:, 0] = np.where(wrong[:, 0] == vocab.id_of("9"), vocab.id_of("8"), vocab.id_of("9"))  # an operand not given
    tokens = jnp.stack([reference, jnp.asarray(wrong)], axis=1)  # [2 problems, 2 members, N]
    right, slipped = (task.step_verdicts(problems, tokens[:, g], vocab) for g in range(2))  # [2 problems, 3 steps]
    assert right.all() and not slipped[:, 0].any() and slipped[:, 1].all()  # the step after the slip is right
    monkeypatch.setattr(sampling, "sample_groups_per_prompt", None)  # (none drawn: a call would fail)
    state = jax.tree.map(lambda x: x[0], algo.init_seeds(0, 1))
    labels, step_verdicts = jax.jit(model.labels)(problems, tokens)  # one parse: the outcomes and the steps
    assert np.asarray(labels).tolist() == [[1.0, 0.0], [1.0, 0.0]]
    out, where = jax.jit(model.step_labels)(state.params, problems, task.prompts(problems, vocab), tokens, labels,
                                            step_verdicts, jax.random.split(jax.random.key(1), 2))
    labelled = [[np.asarray(out)[b, g][np.asarray(where)[b, g]].tolist() for g in range(2)] for b in range(2)]
    assert labelled == [[[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]] * 2
    with pytest.raises(ValueError, match="step_label=checked has the verifier check each step and samples none"):
        algos.validate(set_keys(config, {"reward_model.continuations": 8, "init_from": "runs/sft"}))


def test_a_reward_model_of_its_own_size_judges_another_run_s_samples(countdown_sft_run):
    """reward_model.sampler: the sampler is that run's policy (frozen, as saved), the reward model a fresh one of
    config.model's sizes, reading the sampler's tokenizer; the two are drawn from and scored apart."""
    config = set_keys(reward_model_config("", 1_024), {"reward_model.sampler": countdown_sft_run,
                                                      "model.num_layers": 2, "model.d_model": 32})
    algos.validate(config)
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    assert algo.frozen_from == (("sampler", countdown_sft_run),) and not algo.starts_from
    sft = start_params(countdown_sft_run)
    state = algo.init_seeds(0, 1, frozen={"sampler": sft})
    for a, b in zip(jax.tree.leaves(state.params["sampler"]), jax.tree.leaves(sft["params"]), strict=True):
        np.testing.assert_array_equal(a, b)
    reward_model = state.params["params"]
    assert {"block_0", "block_1", "value"} <= set(reward_model) and "block_2" not in reward_model
    assert reward_model["embed"]["embedding"].shape[-1] == 32  # config.model's sizes, not the sampler's
    with pytest.raises(ValueError, match="must be the model it starts from"):
        algos.validate(set_keys(config, {"reward_model.objective": "implicit"}))


def generative_config(init_from: str, critique_by: str):
    """A generative reward model's short run (12 updates) from `init_from`, its critique written by `critique_by`."""
    config = reward_model_config(init_from, 1_536)
    config.reward_model.objective, config.reward_model.critique_by = "generative", critique_by
    config.optim.learning_rate = 3e-3
    config.log.every_steps, config.eval.episodes = 512, 16
    return config


def test_a_generative_reward_model_learns_its_critique_and_judges_after_it(countdown_sft_run, tmp_path):
    config = generative_config(countdown_sft_run, "model")
    rows = train.run(config, str(tmp_path / "run")).metrics
    first, last = rows[0], rows[-1]
    # the critique (`a op b=value`) is taught by cross-entropy, the verdict read after the model's own critique:
    # both fall (measured 2.14 -> 1.53 and 0.65 -> 0.54 over these 12 updates; this one-layer model computes few
    # values exactly)
    assert last["critique_loss"] < 0.85 * first["critique_loss"]
    assert last["verdict_loss"] < first["verdict_loss"] - 0.05
    assert 0.0 <= last["eval_ranking_accuracy"] <= 1.0 and last["eval_best_of_n"] <= last["eval_pass@8"]
    # the scorer writes the critique itself, then reads the verdict after it
    params = jax.tree.map(lambda x: x[0], start_params(str(tmp_path / "run")))
    saved = algos.saved_config(str(tmp_path / "run" / "config.json"))
    algo, _ = algos.build(saved, mesh_lib.make_mesh(), run_dir=str(tmp_path / "run"))
    model = algo.parts
    prompts = model.task.prompts(model.task.heldout(2, seed=model.eval_seed), model.vocab)
    completions = jnp.stack([_ids(model.vocab, "12+30$", 8), _ids(model.vocab, "30-12$", 8)])[:, None]
    seen, tokens, _ = jax.jit(model.whole_scorer.critiqued)(scoring(params, "generative"), prompts, completions)
    target = str(int(model.task.heldout(2, seed=model.eval_seed).target[0]))
    critique = model.vocab.text(tokens[0, 0])
    # the critique is written with the target hidden, then the target is shown: `12+30=<value>><target>`
    assert critique.startswith("12+30=") and critique.endswith(">" + target), critique
    assert model.vocab.id_of(">") not in np.asarray(seen).tolist()[0]


def test_a_verifier_that_calls_the_calculator_learns_only_its_verdict(countdown_sft_run, tmp_path):
    """reward_model.critique_by=calculator: the critique is the calculator's value of the completion (the tool call
    of CRITIC), the verdict is read after it and learned from the outcome labels alone."""
    config = generative_config(countdown_sft_run, "calculator")
    rows = train.run(config, str(tmp_path / "run")).metrics
    first, last = rows[0], rows[-1]
    assert "critique_loss" not in last and last["loss"] == last["verdict_loss"]
    assert last["verdict_loss"] < first["verdict_loss"] - 0.05
    # the critique is the calculator's exact value, whatever the model's parameters; a completion that is not an
    # expression gets none; the goal is shown after it
    algo, _ = algos.build(algos.saved_config(str(tmp_path / "run" / "config.json")), mesh_lib.make_mesh(),
                          run_dir=str(tmp_path / "run"))
    model = algo.parts
    problems = model.task.heldout(3, seed=model.eval_seed)
    prompts = model.task.prompts(problems, model.vocab)
    completions = jnp.stack([_ids(model.vocab, text, 8) for text in ("12+30$", "(7-3)/8$", "1+$")])[:, None]
    params = jax.tree.map(lambda x: x[0], start_params(str(tmp_path / "run")))
    _, tokens, _ = jax.jit(model.whole_scorer.critiqued)(scoring(params, "generative"), prompts, completions)
    targets = [str(int(t)) for t in problems.target]
    assert [model.vocab.text(t) for t in np.asarray(tokens)[:, 0]] == [
        f"12+30=42>{targets[0]}", f"(7-3)/8=1/2>{targets[1]}", f"1+=>{targets[2]}"]
    # refused on any other objective
    with pytest.raises(ValueError, match="reward_model.critique_by=calculator: only a generative reward model writes "
                                         "a critique; reward_model.objective is pairwise"):
        algos.validate(set_keys(config, {"reward_model.objective": "pairwise"}))


def test_a_generative_model_on_answers_that_are_not_expressions_is_refused_before_compiling():
    config = load_experiment("text_reward_model", "countdown_steps")
    config.init_from, config.reward_model.objective = "runs/sft", "generative"
    with pytest.raises(ValueError, match="generative critiques an answer by its value: task.name=countdown_steps"):
        algos.validate(config)
    config = load_experiment("text_reward_model", "countdown")
    config.init_from, config.reward_model.objective = "runs/sft", "generative"
    algos.validate(config)  # (countdown's answers are expressions)


def test_a_step_score_without_steps_is_refused_before_compiling():
    config = load_experiment("text_reward_model", "countdown_steps")
    config.init_from, config.reward_model.step_score = "runs/sft", "last"
    with pytest.raises(ValueError, match="reward_model.step_score=last: only a process reward model has step values; "
                                         "reward_model.objective is pairwise"):
        algos.validate(config)
    config.reward_model.step_score, config.reward_model.step_loss = "min", "pairwise"
    with pytest.raises(ValueError, match="reward_model.step_loss=pairwise: only a process reward model"):
        algos.validate(config)
    config.reward_model.step_loss, config.reward_model.step_label = "pointwise", "hard"
    with pytest.raises(ValueError, match="reward_model.step_label=hard: only a process reward model"):
        algos.validate(config)
    config.reward_model.objective = "process"
    algos.validate(config)
