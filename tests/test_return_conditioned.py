"""Return-conditioned RL (advantage.estimator=return_conditioned; Havrilla et al. 2024): prompts marked with each
completion's return, the mean token NLL under them, the high mark at sampling and evaluation, config refusals."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text
from jaxrl import algos
from jaxrl.algos.text import TextGRPO, text_grpo_config
from jaxrl.rewards import return_prompts, return_tokens
from jaxrl.mesh import DATA_AXIS
from helpers import set_keys
from jaxrl.transformer import TransformerConfig, TransformerLM

VOCAB = text.Vocab.from_alphabet()
PAD, BOS, EOS = VOCAB.pad_id, VOCAB.bos_id, VOCAB.eos_id


def test_each_member_prompt_carries_the_mark_of_its_return_in_place_of_bos():
    seven, plus = VOCAB.id_of("7"), VOCAB.id_of("+")
    prompts = jnp.array([[PAD, BOS, seven, plus], [BOS, plus, seven, seven]], jnp.int32)  # [2, 4], left-padded
    success = jnp.array([[True, False, False], [False, True, True]])  # [2, G=3]
    out = np.asarray(return_prompts(prompts, success, VOCAB))
    assert out.shape == (2, 3, 4)
    high, low = return_tokens(VOCAB)
    assert (high, low) == (BOS, EOS)
    np.testing.assert_array_equal(out[0], [[PAD, high, seven, plus], [PAD, low, seven, plus], [PAD, low, seven, plus]])
    np.testing.assert_array_equal(out[1], [[low, plus, seven, seven], [high, plus, seven, seven],
                                           [high, plus, seven, seven]])


def test_the_loss_gradient_is_that_of_the_nll_of_both_outcomes_under_their_marked_prompts():
    model = TransformerLM(TransformerConfig(vocab_size=VOCAB.size, num_layers=1, d_model=16, num_heads=2, max_len=8))
    params = jax.jit(model.init)(jax.random.PRNGKey(0), *(lambda t: (t, t, t > -1))(jnp.zeros((1, 8), jnp.int32)))
    digits = [VOCAB.id_of(c) for c in "0123456789"]
    prompts = jnp.array([[BOS, digits[1], digits[2]]], jnp.int32)  # [m=1, P=3]: no padding, positions 0..P-1
    success = jnp.array([[True, False]])  # [1, G=2]
    tokens = jnp.array([[[digits[3], EOS, PAD], [digits[4], digits[5], EOS]]], jnp.int32)  # [1, 2, N=3]
    mask = (jnp.arange(3) < jnp.array([[2, 3]])[..., None]).astype(jnp.float32)  # [1, 2, 3]
    batch = {"return_prompts": return_prompts(prompts, success, VOCAB), "tokens": tokens, "mask": mask,
             "weight": jnp.ones((1, 2, 1))}
    grpo = types.SimpleNamespace(model=model, vocab=VOCAB)
    loss = lambda p: jax.vmap(lambda b: TextGRPO._conditioned_nll(grpo, p, b)[0], axis_name=DATA_AXIS)(  # noqa: E731
        jax.tree.map(lambda x: x[None], batch))[0]

    def by_hand(p):  # -log p(completion token) under BOS (correct) and EOS (wrong) prompts, over the 5 tokens
        total = 0.0
        for mark, completion, n in ((BOS, [digits[3], EOS], 2), (EOS, [digits[4], digits[5], EOS], 3)):
            seq = jnp.array([[mark, digits[1], digits[2], *completion]], jnp.int32)
            logits, _ = model.apply(p, seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq, bool))
            log_p = jax.nn.log_softmax(logits[0, 2:2 + n], axis=-1)
            total -= jnp.take_along_axis(log_p, jnp.array(completion)[:, None], axis=-1).sum()
        return total / 5

    loss, by_hand = jax.jit(loss), jax.jit(by_hand)  # (one compile each, not one per eager op)
    np.testing.assert_allclose(loss(params), by_hand(params), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(jax.jit(jax.grad(loss))(params)),
                    jax.tree.leaves(jax.jit(jax.grad(by_hand))(params))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_sampling_and_evaluation_prompts_carry_the_high_return_mark():
    """Rollouts and greedy evaluation both pose `task.prompts(problems, vocab)`: each opens with BOS, the high
    mark, so they ask for a success unchanged (the conditioned prompt of a success is the task's prompt)."""
    task = text.make_task("addition")
    for problems in (task.sample(jax.random.PRNGKey(0), 4, "train"), task.heldout(4, seed=1234)):
        prompts = task.prompts(problems, VOCAB)
        conditioned = return_prompts(prompts, jnp.ones((4, 1), bool), VOCAB)[:, 0]
        np.testing.assert_array_equal(conditioned, prompts)
        assert np.all(np.sum(np.asarray(prompts) == return_tokens(VOCAB)[0], axis=1) == 1)


@pytest.mark.parametrize("overrides, message", [
    ({"loss.kl_coef": 0.05}, "turn off loss.kl_coef"),
    ({"loss.objective": "cispo", "loss.critic_weight": 0.5}, "turn off loss.objective, loss.critic_weight"),
    ({"model.name": "smollm2-135m-instruct"}, "config.model.name='smollm2-135m-instruct'"),
])
def test_return_conditioned_refuses_what_it_cannot_do(overrides, message):
    config = set_keys(text_grpo_config(), {"advantage.estimator": "return_conditioned", **overrides})
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        algos.validate(config)
