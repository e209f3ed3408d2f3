"""The supervised warm start on text tasks runs through jaxrl.train: tokenizer saved, accuracy evaluated."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text
from jaxrl import algos, mesh as mesh_lib, sampling
from helpers import tiny_sft_config


def test_sft_run_saves_its_tokenizer_learns_and_resumes(tiny_sft_run):
    workdir, rows, resumed = tiny_sft_run  # (conftest.py: shared with the text GRPO tests)
    assert rows[-1]["loss"] < rows[0]["loss"], rows
    # Well-formed answers (digits, then EOS) to the held-out problems; at this size hardly any is right (0 of 64
    # measured): tests/test_text_grpo.py checks accuracy rising, test_pass_at_k_... how it is counted.
    assert rows[-1]["eval_well_formed"] > 0.5, rows[-1]
    tok = text.load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    assert text.decode(tok, text.encode(tok, ["12+345="], 10))[0] == "12+345="
    # Resume: extending total_steps to 4,800 continues from the checkpoint, not from scratch.
    assert [r["update"] for r in resumed] == [50, 100, 150]


def test_text_config_errors_name_the_key():
    config = tiny_sft_config()
    config.task.name = "subtraction"
    with pytest.raises(ValueError, match=r"config\.task\.name"):
        algos.validate(config)
    config = tiny_sft_config()
    config.model.num_heads = 3
    with pytest.raises(ValueError, match=r"num_heads"):
        algos.validate(config)
    config = tiny_sft_config()
    config.eval.pass_k = -1
    with pytest.raises(ValueError, match=r"eval\.pass_k"):
        algos.validate(config)


def test_pass_at_k_counts_problems_solved_by_any_of_k_samples_and_pass_hat_k_by_all():
    config = tiny_sft_config()
    config.eval.pass_k = 4
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    state, policy = algo.init_seeds(0, 2), algo.parts

    def parity_rewards(problems, completions, vocab):  # "correct" iff the first token id is even: about half
        correct = (completions[..., 0] % 2 == 0).astype(jnp.float32)
        return jnp.stack([correct, jnp.ones_like(correct)], axis=-1)

    policy.task.jax_rewards = parity_rewards  # read when evaluation is traced
    key = jax.random.PRNGKey(3)
    out = algo.evaluate(state.params, key, 16)
    assert "eval_head@4" not in out  # (no value head: no best-of-k by it)
    problems = policy.task.heldout(16, seed=policy.eval_seed)
    prompts = policy.task.prompts(problems, policy.vocab)
    decoding = dict(max_new_tokens=policy.task.answer_length, eos_id=policy.vocab.eos_id, pad_id=policy.vocab.pad_id)
    for seed in range(2):
        params = jax.tree.map(lambda x: x[seed], state.params)
        samples = sampling.sample_groups(policy.model, params, prompts, key, group_size=4, temperature=1.0, **decoding)
        correct = np.asarray(samples.tokens[..., 0] % 2 == 0)  # [16, 4]
        assert 0 < correct.mean() < 1
        np.testing.assert_allclose(out["eval_pass@4"][seed], correct.any(1).mean())
        np.testing.assert_allclose(out["eval_pass^4"][seed], correct.all(1).mean())
        greedy = sampling.sample(policy.model, params, prompts, key, temperature=0.0, **decoding)
        np.testing.assert_allclose(out["eval_accuracy"][seed], np.mean(np.asarray(greedy.tokens[:, 0]) % 2 == 0))


def test_one_token_rollouts_train_the_reference_answers():
    """sft.objective=one_token_rollout (OTR): 25 updates on addition from scratch lower the reference tokens' negative
    log-likelihood, which the run still logs as `loss`, beside `otr_loss`. Measured (2026-11-30, AMD EPYC): 3.133 at
    the first update, 2.725 after 25 more (likelihood: 2.660); from scratch pi(target) is about 1/V, and OTR's
    gradient, that of pi(target), is small there: it is meant for warm starts."""
    config = tiny_sft_config()
    config.sft.objective, config.sft.samples = "one_token_rollout", 8
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    state = algo.init_seeds(0, 1)
    state, first = algo.run_chunk(state, hp, 1)
    state, later = algo.run_chunk(state, hp, 25)
    first, later = jax.device_get(first), jax.device_get(later)
    assert np.isfinite(later["otr_loss"]).all()
    assert float(later["loss"][0]) < float(first["loss"][0]) - 0.2, (first["loss"], later["loss"])


def test_a_roll_in_starts_demonstrations_from_the_learner_s_own_first_turn():
    """sft.roll_in (DAgger): on about that share of a batch the learner's own first turn starts the episode and is not
    imitated, the demonstrator continuing from there (tests/test_multi_turn.py checks how); the rest are the
    demonstrator's own episodes, imitated as without a roll-in. A tiny model from scratch on countdown_tools, greedy,
    one batch of 32; then the config errors."""
    from jax.sharding import PartitionSpec as P

    from jaxrl import knobs
    from jaxrl.algos.text.sft import SFTSettings, sft_batch
    from jaxrl.mesh import DATA_AXIS

    config = tiny_sft_config("countdown_tools")
    config.sft.roll_in, config.sft.roll_in_temperature = 0.5, 0.0
    algos.validate(config)
    mesh = mesh_lib.make_mesh(1)
    algo, _ = algos.build(config, mesh)
    policy, sft = algo.parts, knobs.read(SFTSettings, config)
    params = jax.tree.map(lambda x: x[0], algo.init_seeds(0, 1).params)
    key = jax.random.key(5)
    batch = jax.jit(jax.shard_map(lambda params, key: sft_batch(policy, sft, params, key), mesh=mesh,
                                  in_specs=(P(), P()), out_specs=P(DATA_AXIS)))(params, key)
    _, answers, imitated = jax.device_get(batch)
    task, vocab = policy.task, policy.vocab
    own = task.reference_answers(task.sample(key, config.num_prompts, "train"), vocab)
    own_imitated, own = np.asarray(task.imitated_slots(own, vocab)), np.asarray(own)
    turn_of, _ = task.turn_slots()
    rolled_in = (answers != own)[:, turn_of == 0].any(-1)
    assert 0.2 < rolled_in.mean() < 0.8, rolled_in.mean()
    np.testing.assert_array_equal(answers[~rolled_in], own[~rolled_in])
    np.testing.assert_array_equal(imitated[~rolled_in], own_imitated[~rolled_in])
    assert not imitated[rolled_in][:, turn_of == 0].any()
    expected = np.asarray(task.imitated_slots(jnp.asarray(answers), vocab)) & (turn_of > 0)
    np.testing.assert_array_equal(imitated[rolled_in], expected[rolled_in])
    # Actors of one policy (one per seed, in an evaluation) share its compiled episode program; greedy play is
    # deterministic
    problems = jax.tree.map(lambda x: x[:4], task.sample(key, config.num_prompts, "train"))
    first, second = policy.actor(params).play(problems), policy.actor(params).play(problems)
    np.testing.assert_array_equal(first, second)
    assert policy.played._cache_size() == 1

    config.task.name = "addition"
    with pytest.raises(ValueError, match=r"sft.roll_in = 0.5: a roll-in is for the multi-turn tasks.*'addition' is "
                                         r"answered in one turn"):
        algos.validate(config)
    config.task.name, config.sft.roll_in_turns = "countdown_tools", 4
    with pytest.raises(ValueError, match="sft.roll_in_turns = 4 leaves the demonstrator no turn: countdown_tools "
                                         "plays at most 4"):
        algos.validate(config)


def test_sft_learns_each_answer_through_its_first_eos_even_when_padding_is_the_eos():
    """Right-padded references: their tokens and first EOS are learned, the padding after it is not, also for a model
    whose padding token is its EOS (SmolLM2's <|im_end|>: a mask of `!= pad` would hide the EOS, and the model would
    never learn to stop)."""
    from envs.text.render import through_first_eos

    pad_is_eos = jnp.array([[5, 6, 2, 2, 2], [7, 2, 2, 2, 2], [5, 6, 7, 8, 9]])
    assert through_first_eos(pad_is_eos, eos_id=2).tolist() == [
        [True, True, True, False, False], [True, True, False, False, False], [True] * 5]
    apart = jnp.array([[5, 6, 1, 0, 0]])  # EOS 1, pad 0
    assert through_first_eos(apart, eos_id=1).tolist() == [[True, True, True, False, False]]
