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
