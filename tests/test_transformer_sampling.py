"""Transformer policy and KV-cache sampling: cache == full recompute, score == sampled log-probs, no
padding leaks, EOS handling, greedy / top-k / top-p, value head, causality, group sampling.

Compiles dominate the time here, so the tests share one model, one prompt width W and one completion
length N wherever they can (each distinct shape or static argument is another XLA compile).
"""

import dataclasses
import math
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import models
from jaxrl.loops import CHUNK
from jaxrl.models.decoder import Decoder
from jaxrl.sampling import (balanced_cut, filter_logits, prompt_layout, sample, sample_groups, sample_groups_per_prompt, sample_token,
                            score, score_groups)
from jaxrl.transformer import TransformerConfig, TransformerLM, entropy_features, init_cache, read_surprise

PAD, EOS, V = 0, 1, 20
W, N = 8, 8
PROMPTS = [[5, 6, 7, 8, 9, 10], [3, 4], [12, 2, 0, 13], [17]]  # different lengths; a PAD id inside row 2


def left_padded(rows, width):
    """Lists of real tokens -> int32 [B, width] prompts, left-padded with PAD."""
    return jnp.array([[PAD] * (width - len(r)) + list(r) for r in rows], jnp.int32)


def layout(mask):
    """Positions counting real tokens only, as `sample` and `score` assign them. [B, T] -> [B, T]"""
    return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)


@functools.partial(jax.jit, static_argnums=0)
def forward(model, params, tokens, positions, mask):
    return model.apply(params, tokens, positions, mask)


# Every call names every sampling setting: jit bakes a keyword left at its default into the program as a constant, so
# calls that name different settings would compile different programs.
def draw(model, params, prompts, key, **kw):
    settings = dict(max_new_tokens=N, eos_id=EOS, pad_id=PAD, temperature=1.0, top_k=0, top_p=1.0)
    return sample(model, params, prompts, key, **(settings | kw))


def per_prompt_settings(group_size, **kw):
    """`sample_groups_per_prompt`'s keywords, every sampling setting named (as `draw`'s)."""
    return dict(group_size=group_size, max_new_tokens=N, eos_id=EOS, pad_id=PAD, temperature=1.0) | kw


@pytest.fixture(scope="module")
def tiny():
    """2 layers, d_model 32, value head. The (tied) embedding is scaled up so the policy is peaked
    rather than near-uniform: greedy choices are far from ties, and keys visibly change samples."""
    config = TransformerConfig(vocab_size=V, max_len=48, num_layers=2, d_model=32, num_heads=4, value_head=True)
    model = TransformerLM(config)
    ones = jnp.ones((1, 4), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), ones, ones, ones > 0)
    params["params"]["embed"]["embedding"] = params["params"]["embed"]["embedding"] * 12.0
    return model, params


@pytest.fixture(scope="module")
def tiny_decoder():
    """The pretrained families' model (`jaxrl.models.Decoder`, caches stacked over layers) at the same size."""
    config = models.ModelConfig(family="llama", vocab_size=V, hidden_size=32, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=8, intermediate_size=48, value_head=True)
    model = Decoder(config)
    ones = jnp.ones((1, 4), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), ones, ones, ones > 0)
    # Token 5's (tied) embedding scaled up: its logit swings widely, so that as EOS it ends some groups early.
    params["params"]["embed"] = params["params"]["embed"].at[5].multiply(40.0)
    return model, params


@functools.partial(jax.jit, static_argnums=(0, 5))
def reference_step(model, params, seq, seen, done, top_k, col, key, temperature, top_p):
    """Full forward over the whole sequence so far (no cache), then pick token `col` as `sample` does."""
    logits, _ = model.apply(params, seq, layout(seen), seen)
    token, log_p = sample_token(logits[:, col - 1], key, temperature, top_k, top_p)
    return jnp.where(done, PAD, token), jnp.where(done, 0.0, log_p)


def reference_sample(model, params, prompts, key, temperature=1.0, top_k=0, top_p=1.0):
    """Slow sampler: the growing sequence lives in a fixed-width buffer whose unused columns are
    masked; same key schedule as `sample` (step t uses split(key, N)[t])."""
    B, P = prompts.shape
    seq = jnp.concatenate([prompts, jnp.full((B, N), PAD, jnp.int32)], 1)
    seen = jnp.concatenate([prompt_layout(prompts, PAD)[0], jnp.zeros((B, N), bool)], 1)
    done = jnp.zeros(B, bool)
    tokens, log_probs = [], []
    for t, k in enumerate(jax.random.split(key, N)):
        token, log_p = reference_step(model, params, seq, seen, done, top_k, P + t, k, temperature, top_p)
        tokens.append(token)
        log_probs.append(log_p)
        seq, seen = seq.at[:, P + t].set(token), seen.at[:, P + t].set(~done)
        done = done | (token == EOS)
    return jnp.stack(tokens, 1), jnp.stack(log_probs, 1)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)])
def test_kv_cache_sampling_equals_full_recompute(tiny, temperature, top_k, top_p):
    model, params = tiny
    prompts = left_padded(PROMPTS, W)
    key = jax.random.key(3)
    out = draw(model, params, prompts, key, temperature=temperature, top_k=top_k, top_p=top_p)
    ref_tokens, ref_log_probs = reference_sample(model, params, prompts, key, temperature, top_k, top_p)
    np.testing.assert_array_equal(out.tokens, ref_tokens)
    np.testing.assert_allclose(out.log_probs, ref_log_probs, atol=1e-5)
    # Whatever the sampling settings, log_probs are the temperature-1 model's (what score computes).
    np.testing.assert_allclose(out.log_probs, score(model, params, prompts, out.tokens, out.mask, PAD)[0], atol=1e-5)
    assert out.tokens.shape == out.log_probs.shape == out.mask.shape == out.values.shape == (4, N)
    assert out.tokens.dtype == jnp.int32 and out.log_probs.dtype == jnp.float32
    assert len(np.unique(np.asarray(out.tokens))) > 3  # a real sample, not one repeated token


def test_score_reproduces_sampled_log_probs(tiny):
    model, params = tiny
    prompts = left_padded(PROMPTS, W)
    out = draw(model, params, prompts, jax.random.key(5))
    log_probs, entropy, values = score(model, params, prompts, out.tokens, out.mask, PAD)
    np.testing.assert_allclose(log_probs, out.log_probs, atol=1e-5)
    np.testing.assert_allclose(values, out.values, atol=1e-5)
    log_probs, entropy, mask = np.asarray(out.log_probs), np.asarray(entropy), np.asarray(out.mask)
    assert np.all(log_probs[mask > 0] < 0)
    assert np.all(entropy >= 0) and np.all(entropy[mask == 0] == 0)
    # The loss differentiates score: its gradient must be finite despite padding and masked tails.
    grads = jax.jit(jax.grad(lambda p: score(model, p, prompts, out.tokens, out.mask, PAD)[0].sum()))(params)
    assert all(np.isfinite(g).all() for g in jax.device_get(jax.tree.leaves(grads)))


def test_padding_never_leaks(tiny):
    model, params = tiny
    # Prompts of width W followed by N masked junk columns, vs the same prompts left-padded to W + N.
    narrow = left_padded(PROMPTS, W)
    tokens = jnp.concatenate([narrow, jax.random.randint(jax.random.key(2), (4, N), 0, V)], 1)
    real = jnp.concatenate([prompt_layout(narrow, PAD)[0], jnp.zeros((4, N), bool)], 1)
    logits, _ = forward(model, params, tokens, layout(real), real)
    assert bool(jnp.all(jnp.isfinite(logits)))  # padded query rows too
    keep = lambda x: jnp.where(real[:, :x.shape[1], None], x, 0)  # zero the padding rows
    # Other ids and positions at every padding column: real positions' logits unchanged.
    noise = jax.random.randint(jax.random.key(0), tokens.shape, 2, V)
    garbage_positions = jax.random.randint(jax.random.key(1), tokens.shape, 0, 40)
    logits2, _ = forward(model, params, jnp.where(real, tokens, noise),
                         jnp.where(real, layout(real), garbage_positions), real)
    np.testing.assert_allclose(keep(logits2), keep(logits), atol=1e-5)
    assert not np.allclose(logits2, logits)  # the padding rows themselves did change
    # N more columns of left padding: same logits at the same real tokens.
    wide = left_padded(PROMPTS, W + N)
    wide_real = prompt_layout(wide, PAD)[0]
    logits3, _ = forward(model, params, wide, layout(wide_real), wide_real)
    np.testing.assert_allclose(keep(logits3[:, N:]), keep(logits[:, :W]), atol=1e-5)
    # Sampling with the same key is unchanged by extra left padding.
    key = jax.random.key(7)
    a = draw(model, params, narrow, key)
    b = draw(model, params, left_padded(PROMPTS, W + 3), key)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.log_probs, b.log_probs, atol=1e-5)


def test_eos_then_pad_and_mask(tiny):
    model, params = tiny
    prompts = left_padded(PROMPTS, W)
    key = jax.random.key(11)
    free = draw(model, params, prompts, key, eos_id=-1)  # never stops
    assert bool(jnp.all(free.mask == 1)) and bool(jnp.all(free.lengths == N))
    eos = int(free.tokens[0, 2])  # a token row 0 emits by step 2, so at least one row stops early
    out = draw(model, params, prompts, key, eos_id=eos)
    tokens, free_tokens = np.asarray(out.tokens), np.asarray(free.tokens)
    stopped = 0
    for b in range(len(PROMPTS)):
        hits = np.flatnonzero(free_tokens[b] == eos)
        length = hits[0] + 1 if hits.size else N
        stopped += length < N
        assert out.lengths[b] == length
        np.testing.assert_array_equal(tokens[b, :length], free_tokens[b, :length])  # same path up to EOS
        assert np.all(tokens[b, length:] == PAD)
        np.testing.assert_array_equal(out.mask[b], (np.arange(N) < length).astype(np.float32))
        assert np.all(np.asarray(out.log_probs[b, length:]) == 0)
        assert np.all(np.asarray(out.values[b, length:]) == 0)
    assert stopped >= 1
    np.testing.assert_array_equal(out.lengths, out.mask.sum(1))


def test_long_decoding_that_ends_early_equals_the_free_run_up_to_eos(tiny):
    """N = 3 * CHUNK: decoding runs in chunks and stops once every row has emitted EOS; the tokens,
    log-probabilities and values up to each row's EOS are the never-stopping run's, pad and zeros after."""
    model, params = tiny
    prompts = left_padded(PROMPTS, W)
    long = 3 * CHUNK
    for seed in range(10):  # a key and a token that every row draws before the last chunk
        key = jax.random.key(seed)
        free = draw(model, params, prompts, key, eos_id=-1, max_new_tokens=long)
        free_tokens = np.asarray(free.tokens)[:, :long - CHUNK]
        common = set.intersection(*(set(row.tolist()) for row in free_tokens)) - {PAD}
        if common:
            break
    eos = min(common)
    out = draw(model, params, prompts, key, eos_id=eos, max_new_tokens=long)
    for b in range(len(PROMPTS)):
        length = np.flatnonzero(free_tokens[b] == eos)[0] + 1
        assert int(out.lengths[b]) == length
        np.testing.assert_array_equal(out.tokens[b, :length], free_tokens[b, :length])
        np.testing.assert_allclose(out.log_probs[b, :length], free.log_probs[b, :length], atol=1e-6)
        np.testing.assert_allclose(out.values[b, :length], free.values[b, :length], atol=1e-6)
        assert np.all(np.asarray(out.tokens[b, length:]) == PAD)
        assert np.all(np.asarray(out.log_probs[b, length:]) == 0) and np.all(np.asarray(out.values[b, length:]) == 0)


def test_greedy_top_k_1_and_temperature_0(tiny):
    model, params = tiny
    prompts = left_padded(PROMPTS, W)
    cold = draw(model, params, prompts, jax.random.key(0), temperature=0.0)
    cold2 = draw(model, params, prompts, jax.random.key(1), temperature=0.0)
    top1 = draw(model, params, prompts, jax.random.key(2), top_k=1)
    nucleus0 = draw(model, params, prompts, jax.random.key(3), top_p=1e-6)
    warm = draw(model, params, prompts, jax.random.key(2))
    for other in (cold2, top1, nucleus0):
        np.testing.assert_array_equal(other.tokens, cold.tokens)
    assert not np.array_equal(warm.tokens, cold.tokens)  # real sampling differs from greedy here
    # Greedy means argmax of the model at every generated position (checked with a full forward).
    seq = jnp.concatenate([prompts, cold.tokens], 1)
    seen = jnp.concatenate([prompt_layout(prompts, PAD)[0], cold.mask > 0], 1)
    logits, _ = forward(model, params, seq, layout(seen), seen)
    argmax = jnp.argmax(logits[:, W - 1:-1], -1)
    np.testing.assert_array_equal(jnp.where(cold.mask > 0, argmax, PAD), cold.tokens)
    # log_probs stay the temperature-1 model log-probs even when decoding greedily.
    np.testing.assert_allclose(cold.log_probs, score(model, params, prompts, cold.tokens, cold.mask, PAD)[0],
                               atol=1e-5)


def test_top_p_and_top_k_filters():
    probs = jnp.array([0.05, 0.5, 0.15, 0.3])  # unsorted on purpose
    logits = jnp.log(probs)[None]
    kept = lambda f: set(np.flatnonzero(np.isfinite(np.asarray(f[0]))))
    assert kept(filter_logits(logits, top_p=0.7)) == {1, 3}  # 0.5 < 0.7, then 0.8 >= 0.7
    assert kept(filter_logits(logits, top_p=0.5)) == {1}  # the top token alone reaches 0.5
    assert kept(filter_logits(logits, top_p=0.0)) == {1}  # the top token is always kept
    assert kept(filter_logits(logits, top_p=0.81)) == {1, 3, 2}
    assert kept(filter_logits(logits, top_p=1.0)) == {0, 1, 2, 3}
    assert kept(filter_logits(logits, top_k=2)) == {1, 3}
    assert kept(filter_logits(logits, top_k=3, top_p=0.6)) == {1, 3}
    # Many draws never leave the nucleus, but do cover it (top_p traced under jit).
    draws = jax.jit(jax.vmap(lambda k, p: sample_token(jnp.repeat(logits, 64, 0), k, 1.0, 0, p)[0],
                             in_axes=(0, None)))(jax.random.split(jax.random.key(0), 32), 0.7)
    assert set(np.unique(np.asarray(draws))) == {1, 3}


def test_the_two_level_draw_and_argmax_equal_the_one_pass_forms():
    """inverse_cdf: the first index whose running sum reaches the fraction of the total, as one running sum over the
    whole vocabulary finds it, never an index of weight 0 (zeros straddling blocks, fractions at 1 and at a block's
    exact edge, where float32 rounding picks the side); distributions.greedy is jnp.argmax, ties included, below
    and above its block; the token's log-probability is log_softmax's."""
    from jaxrl.distributions import greedy
    from jaxrl.sampling import _token_log_prob, inverse_cdf

    for vocab in (5, 128, 300, 1000):
        logits = 3.0 * jax.random.normal(jax.random.key(vocab), (64, vocab))
        weights = jnp.where(jax.random.uniform(jax.random.key(1), logits.shape) < 0.5, 0.0, jnp.exp(logits))
        # (every row with a nonzero weight; row 0 with one alone)
        weights = weights.at[:, 0].set(0.0).at[:, -1].set(0.0).at[:, vocab // 2].set(1.0).at[0, :].set(0.0)
        weights = weights.at[0, vocab // 2].set(1.0)
        running = np.cumsum(np.asarray(weights, np.float64), axis=-1)
        edges = np.maximum(running[:, min(127, vocab - 1)] / running[:, -1], 1e-6)  # the first block's share
        uniform = jax.random.uniform(jax.random.key(2), (64, 1), minval=1e-6, maxval=1.0)
        for fraction, at_an_edge in ((uniform, False), (jnp.ones((64, 1)), False),
                                     (jnp.asarray(edges, jnp.float32)[:, None], True)):
            drawn = np.asarray(inverse_cdf(weights, fraction))
            expected = np.argmax(running >= np.asarray(fraction, np.float64) * running[:, -1:], axis=-1)
            assert (np.take_along_axis(np.asarray(weights), drawn[:, None], 1) > 0).all()
            if not at_an_edge:
                np.testing.assert_array_equal(drawn, expected)
            else:  # rounding decides the side: the last nonzero index of the block or the next one, nothing between
                low, high = np.minimum(drawn, expected), np.maximum(drawn, expected)
                rows = np.arange(64)
                assert (running[rows, np.maximum(high - 1, low)] == running[rows, low]).all()
        ties = jnp.round(logits)
        np.testing.assert_array_equal(greedy(ties), jnp.argmax(ties, axis=-1))
        token = greedy(logits)
        np.testing.assert_allclose(_token_log_prob(logits, token),
                                   jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], 1)[:, 0], rtol=1e-6)


def test_value_head_shapes(tiny):
    model, params = tiny
    tokens = jax.random.randint(jax.random.key(0), (4, W + N), 0, V)
    mask = jnp.ones(tokens.shape, bool)
    logits, values = forward(model, params, tokens, layout(mask), mask)
    assert logits.shape == (4, W + N, V) and values.shape == (4, W + N) and values.dtype == jnp.float32
    # The same network without the head: identical logits, values None.
    bare = TransformerLM(dataclasses.replace(model.config, value_head=False))
    bare_params = {"params": {k: v for k, v in params["params"].items() if k != "value"}}
    bare_logits, bare_values = forward(bare, bare_params, tokens, layout(mask), mask)
    assert bare_values is None
    np.testing.assert_allclose(bare_logits, logits, atol=1e-6)
    assert "value" not in jax.eval_shape(bare.init, jax.random.key(0), tokens, tokens, mask)["params"]


def test_causal(tiny):
    model, params = tiny
    tokens = jax.random.randint(jax.random.key(0), (4, W + N), 0, V)
    mask = jnp.ones(tokens.shape, bool)
    logits, values = forward(model, params, tokens, layout(mask), mask)
    changed, changed_values = forward(model, params, tokens.at[:, 5].set((tokens[:, 5] + 1) % V), layout(mask), mask)
    np.testing.assert_allclose(changed[:, :5], logits[:, :5], atol=1e-6)
    np.testing.assert_allclose(changed_values[:, :5], values[:, :5], atol=1e-6)
    assert not np.allclose(changed[:, 5:], logits[:, 5:], atol=1e-3)


def test_sample_groups(tiny):
    model, params = tiny
    prompts = left_padded(PROMPTS, W + 3)  # the width test_padding_never_leaks also samples at
    key, G = jax.random.key(4), 3
    out = sample_groups(model, params, prompts, key, group_size=G, max_new_tokens=N, eos_id=EOS, pad_id=PAD)
    for leaf in (out.tokens, out.log_probs, out.mask, out.values):
        assert leaf.shape == (4, G, N)
    assert out.lengths.shape == (4, G)
    # Member g is exactly `sample` of the shared prompt with the g-th key ...
    for g, k in enumerate(jax.random.split(key, G)):
        one = draw(model, params, prompts, k)
        np.testing.assert_array_equal(out.tokens[:, g], one.tokens)
        np.testing.assert_allclose(out.log_probs[:, g], one.log_probs, atol=1e-5)
    # ... and members of a group differ.
    for b in range(4):
        assert len({tuple(np.asarray(out.tokens[b, g])) for g in range(G)}) > 1


def test_score_groups_equals_score_on_repeated_prompts(tiny):
    """The group scorer computes each prompt once; it must agree with scoring every member's full sequence,
    values and gradients included."""
    model, params = tiny
    prompts = left_padded(PROMPTS, W + 3)
    G = 3
    out = sample_groups(model, params, prompts, jax.random.key(4), group_size=G, max_new_tokens=N, eos_id=EOS,
                        pad_id=PAD)
    # Members of different lengths, as if they had emitted EOS early: masked tails are PAD.
    lengths = jax.random.randint(jax.random.key(5), (4, G, 1), 1, N + 1)
    mask = (jnp.arange(N) < lengths).astype(jnp.float32)
    tokens = jnp.where(mask > 0, out.tokens, PAD)
    out = out._replace(tokens=tokens, mask=mask, log_probs=out.log_probs * mask)
    flat = lambda x: x.reshape(4 * G, N)
    grouped = score_groups(model, params, prompts, out.tokens, out.mask, PAD)
    full = score(model, params, jnp.repeat(prompts, G, axis=0), flat(out.tokens), flat(out.mask), PAD)
    for a, b in zip(grouped, full):
        np.testing.assert_allclose(flat(a), b, atol=1e-5)
    np.testing.assert_allclose(grouped[0], out.log_probs, atol=1e-5)

    @jax.jit  # both gradients in one program: eager differentiation compiles each primitive separately
    def gradients(params):
        grouped = jax.grad(lambda p: score_groups(model, p, prompts, out.tokens, out.mask, PAD)[0].sum())(params)
        full = jax.grad(lambda p: score(model, p, jnp.repeat(prompts, G, axis=0), flat(out.tokens),
                                        flat(out.mask), PAD)[0].sum())(params)
        return grouped, full

    grad_grouped, grad_full = gradients(params)
    for a, b in zip(jax.tree.leaves(grad_grouped), jax.tree.leaves(grad_full)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_sample_groups_per_prompt_equals_each_prompt_alone(tiny):
    """A prompt's group depends on its own key only, not on the batch it is sampled in."""
    model, params = tiny
    prompts = left_padded(PROMPTS, W + 3)
    keys, G = jax.random.split(jax.random.key(7), 4), 3
    together = sample_groups_per_prompt(model, params, prompts, keys, **per_prompt_settings(G))
    assert together.tokens.shape == (4, G, N)
    for b in range(4):
        alone = sample_groups(model, params, prompts[b:b + 1], keys[b], group_size=G, max_new_tokens=N, eos_id=EOS,
                              pad_id=PAD)
        np.testing.assert_array_equal(together.tokens[b], alone.tokens[0])
        np.testing.assert_allclose(together.log_probs[b], alone.log_probs[0], atol=1e-5)
        np.testing.assert_allclose(together.values[b], alone.values[0], atol=1e-5)


def test_prefill_equals_decode_at_the_last_column(tiny):
    """`prefill` skips the last layer's outputs for all but the last column; what it returns is unchanged."""
    model, params = tiny
    prompts = left_padded(PROMPTS, W + 3)
    real, positions, _ = prompt_layout(prompts, PAD)
    B, P = prompts.shape
    apply = jax.jit(model.apply, static_argnames="method")  # eager calls compile each primitive separately
    logits, values, cache = apply(params, prompts, positions, real, method=TransformerLM.prefill)
    full_logits, full_values, full_cache = apply(params, prompts, positions, real, init_cache(model.config, B, P), 0,
                                                 method=TransformerLM.decode)
    assert logits.shape == (B, V) and values.shape == (B,)
    np.testing.assert_allclose(logits, full_logits[:, -1], atol=1e-5)
    np.testing.assert_allclose(values, full_values[:, -1], atol=1e-5)
    for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(full_cache)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("model_fixture", ["tiny", "tiny_decoder"])
def test_resumed_and_stopped_groups_continue_the_same_samples(model_fixture, request):
    """Partial rollouts: decoding that stops once every slot holds a finished group, then resumes the rest from
    the column where each stopped, yields exactly the samples of one uninterrupted run (the same random numbers
    per column; resumed tokens scored by one teacher-forced pass), with either model's cache layout."""
    from jaxrl.sampling import Resume

    model, params = request.getfixturevalue(model_fixture)
    prompts = left_padded(PROMPTS, W + 3)
    # Token 5 as EOS at temperature 2: with these keys some groups end early, others run to column N.
    keys, G, eos = jax.random.split(jax.random.key(4), 4), 2, 5
    kw = per_prompt_settings(G, eos_id=eos, temperature=2.0)
    whole = sample_groups_per_prompt(model, params, prompts, keys, **kw)

    # A fresh start on the while-loop path (resume from column 0) is the same run.
    fresh = Resume(jnp.zeros((4, G, N), jnp.int32), jnp.zeros((4, G, N)), jnp.zeros(4, jnp.int32))
    again = sample_groups_per_prompt(model, params, prompts, keys, resume=fresh, **kw)
    np.testing.assert_array_equal(again.tokens, whole.tokens)
    np.testing.assert_allclose(again.log_probs, whole.log_probs, atol=1e-5)
    np.testing.assert_allclose(again.values, whole.values, atol=1e-5)
    assert again.decided.tolist() == [N] * 4

    # Two slots of two groups: decoding stops when each slot has a finished group.
    first = sample_groups_per_prompt(model, params, prompts, keys, stop_slots=2, **kw)
    ends = np.where((whole.tokens == eos).any(-1), np.argmax(np.asarray(whole.tokens) == eos, -1) + 1, N)  # [B, G]
    group_end = ends.max(axis=1)  # columns each group needs
    expected_steps = max(group_end[0:2].min(), group_end[2:4].min())
    assert first.decided.tolist() == [expected_steps] * 4
    columns = np.arange(N)
    before = columns < expected_steps
    np.testing.assert_array_equal(np.where(before, whole.tokens, PAD), first.tokens)
    np.testing.assert_allclose(np.where(before, whole.log_probs, 0.0), first.log_probs, atol=1e-5)

    # Resuming every group from where it stopped finishes the uninterrupted run's samples.
    resume = Resume(first.tokens, first.mask, first.decided)
    rest = sample_groups_per_prompt(model, params, prompts, keys, resume=resume, **kw)
    np.testing.assert_array_equal(rest.tokens, whole.tokens)
    np.testing.assert_allclose(rest.log_probs, whole.log_probs, atol=1e-5)
    np.testing.assert_allclose(rest.mask, whole.mask)
    np.testing.assert_allclose(rest.values, whole.values, atol=1e-5)
    assert rest.decided.tolist() == [group_end.max()] * 4  # the loop ends when every member has
    assert 0 < expected_steps < group_end.max() <= N  # (the case this test is about: a stop before the last end)


def test_balanced_pruning_keeps_members_on_both_sides_of_one_half():
    """ARRoL's balance-aware pruning, by hand on groups of 8: below the threshold members go lowest first, but each
    side of predicted success 1/2 keeps its `keep` highest-predicted going members; keep=0 is the plain threshold."""
    value = jnp.asarray([
        [0.01, 0.02, 0.03, 0.04, 0.6, 0.7, 0.8, 0.9],  # 4 predicted wrong, 4 right; threshold 0.05
        [0.04, 0.01, 0.03, 0.02, 0.01, 0.04, 0.03, 0.02],  # all predicted wrong; 0.04 at 0 and 5 (a tie)
        [0.01, 0.02, 0.03, 0.04, 0.6, 0.7, 0.8, 0.9],  # as group 0, but member 3 has already ended
        [0.1, 0.2, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9],  # threshold 0.75: both sides hold candidates
    ])
    going = jnp.ones((4, 8), bool).at[2, 3].set(False)
    below = jnp.asarray([0.05, 0.05, 0.05, 0.75])
    cut = lambda keep: np.asarray(balanced_cut(value, going, below, keep)).astype(int).tolist()
    assert cut(0) == [[1, 1, 1, 1, 0, 0, 0, 0], [1] * 8, [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0]]
    assert cut(1) == [[1, 1, 1, 0, 0, 0, 0, 0],  # 0.04 kept: the highest predicted-wrong member
                      [0, 1, 1, 1, 1, 1, 1, 1],  # the tie goes to the lower index
                      [1, 1, 0, 0, 0, 0, 0, 0],  # the ended member is not counted: 0.03 is kept instead
                      [1, 0, 1, 1, 1, 1, 0, 0]]  # 0.2 kept on the wrong side; 0.9, the right side's, is above anyway
    assert cut(2) == [[1, 1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0, 1, 1], [1, 0, 0, 0, 0, 0, 0, 0],
                      [0, 0, 1, 1, 1, 1, 0, 0]]
    assert cut(4) == [[0] * 8, [0, 1, 0, 1, 1, 0, 0, 1], [0] * 8, [0, 0, 1, 1, 0, 0, 0, 0]]


def test_pruned_members_stop_at_their_column_and_the_rest_are_unchanged(tiny):
    """Online pruning: where the value head's prediction at column c is below the group's threshold, the member
    stops before drawing column c; every other member draws exactly what it would have."""
    model, params = tiny
    prompts = left_padded(PROMPTS, W + 3)
    keys, G, at = jax.random.split(jax.random.key(4), 4), 2, 3
    kw = per_prompt_settings(G)
    whole = sample_groups_per_prompt(model, params, prompts, keys, **kw)
    below = jnp.asarray([jnp.inf, -jnp.inf, -jnp.inf, -jnp.inf])  # group 0: every member pruned; the rest never
    out = sample_groups_per_prompt(model, params, prompts, keys, prune_at=at, prune_below=below, **kw)
    np.testing.assert_array_equal(out.pruned, [[True] * G] + [[False] * G] * 3)
    np.testing.assert_array_equal(out.tokens[0, :, :at], whole.tokens[0, :, :at])
    assert (out.tokens[0, :, at:] == PAD).all() and float(out.mask[0, :, at:].sum()) == 0
    np.testing.assert_array_equal(out.tokens[1:], whole.tokens[1:])
    np.testing.assert_allclose(out.log_probs[1:], whole.log_probs[1:], atol=1e-5)
    # A threshold between the members' predicted values prunes exactly those below it.
    value_at = np.asarray(whole.values[:, :, at])
    middle = jnp.asarray(value_at.mean(axis=1))
    split = sample_groups_per_prompt(model, params, prompts, keys, prune_at=at, prune_below=middle, **kw)
    np.testing.assert_array_equal(split.pruned, value_at < np.asarray(middle)[:, None])
    with pytest.raises(ValueError, match="needs a model with a value head"):
        plain = TransformerLM(dataclasses.replace(model.config, value_head=False))
        sample_groups_per_prompt(plain, params, prompts, keys, prune_at=at, prune_below=below, **kw)


def test_entropy_features_by_hand():
    """POISE's token-entropy statistics: (H, H^2) of softmax(logits): uniform over 2 -> (ln 2, ln^2 2), uniform over 4
    -> (ln 4, ln^2 4), one certain token -> (0, 0)."""
    logits = jnp.asarray([[0.0, 0.0, -1e9, -1e9], [1.0, 1.0, 1.0, 1.0], [0.0, -1e9, -1e9, -1e9]])
    np.testing.assert_allclose(entropy_features(logits), [[0.693147, 0.480453], [1.386294, 1.921812], [0.0, 0.0]],
                               atol=1e-5)


def test_a_value_head_with_entropy_features_reads_each_columns_entropy(tiny):
    """model.value_entropy (loss.value_entropy): the value head's kernel grows by 2 rows, for H and H^2 of the column's
    own token distribution; with only H's weight set (1) and no bias the values are the logits' entropies."""
    model, params = tiny
    entropic = TransformerLM(dataclasses.replace(model.config, value_entropy=True))
    tokens = jax.random.randint(jax.random.key(0), (2, W + N), 0, V)
    mask = jnp.ones(tokens.shape, bool)
    d = model.config.d_model
    kernel = jnp.zeros((d + 2, 1)).at[d, 0].set(1.0)
    assert jax.eval_shape(entropic.init, jax.random.key(0), tokens, tokens, mask)["params"]["value"]["kernel"].shape \
        == kernel.shape
    head = {"params": dict(params["params"], value={"kernel": kernel, "bias": jnp.zeros((1,))})}
    logits, values = forward(entropic, head, tokens, layout(mask), mask)
    log_p = jax.nn.log_softmax(logits, -1)
    np.testing.assert_allclose(values, -jnp.sum(jnp.exp(log_p) * log_p, -1), rtol=1e-5, atol=1e-6)


def test_read_surprise_by_hand():
    """Column t reads token t: its log-probability under column t - 1's logits, the gap below that column's most
    likely token and that column's entropy; zero at the first column and wherever either column is padding. By hand
    over 2 tokens: column 0's logits (0, 0) give each ln 1/2, gap 0, entropy ln 2; column 1's (ln 3, 0) give token 1
    ln 1/4, gap ln 3, entropy -(3/4 ln 3/4 + 1/4 ln 1/4)."""
    logits = jnp.log(jnp.asarray([[[1.0, 1.0], [3.0, 1.0], [1.0, 1.0]]]))  # [B=1, T=3, V=2]
    tokens, real = jnp.asarray([[0, 1, 1]]), jnp.asarray([[True, True, True]])
    h1 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    np.testing.assert_allclose(read_surprise(logits, tokens, real)[0],
                               [[0, 0, 0], [math.log(0.5), 0, math.log(2)], [math.log(0.25), math.log(3), h1]],
                               atol=1e-6)
    left_padded_first = read_surprise(logits, tokens, jnp.asarray([[False, True, True]]))[0]
    np.testing.assert_allclose(left_padded_first[:2], 0.0)  # a padded column predicts nothing read
    np.testing.assert_allclose(left_padded_first[2], [math.log(0.25), math.log(3), h1], atol=1e-6)


def test_a_judge_s_values_read_the_tokens_before_them_and_only_the_full_forward_gives_them(tiny):
    """judge_layers: the value head reads through more blocks over the body and each read token's surprise. The body's
    logits stay the model's; a value reads only the tokens up to its column; `score_groups` equals `score` on the
    repeated prompts; a cached path (decoding) refuses, naming the full forward."""
    model, params = tiny
    judge = TransformerLM(dataclasses.replace(model.config, judge_layers=1))
    tokens = jax.random.randint(jax.random.key(0), (2, W + N), 0, V)
    mask = jnp.ones(tokens.shape, bool)
    fresh = judge.init(jax.random.key(1), tokens, layout(mask), mask)["params"]
    assert {"judge_in", "judge_0", "judge_ln"} <= set(fresh)
    judged = {"params": dict(fresh, **params["params"])}  # the tiny body, fresh judge layers
    logits, values = forward(judge, judged, tokens, layout(mask), mask)
    np.testing.assert_allclose(logits, forward(model, params, tokens, layout(mask), mask)[0], atol=1e-6)
    changed = tokens.at[:, 5].set((tokens[:, 5] + 1) % V)
    _, changed_values = forward(judge, judged, changed, layout(mask), mask)
    np.testing.assert_allclose(changed_values[:, :5], values[:, :5], atol=1e-6)
    assert not np.allclose(changed_values[:, 5:], values[:, 5:], atol=1e-4)
    # a value also reads how likely each token read was: with that input's projection zeroed, the values move
    blind = {"params": dict(judged["params"], judge_in=jax.tree.map(jnp.zeros_like, fresh["judge_in"]))}
    assert not np.allclose(forward(judge, blind, tokens, layout(mask), mask)[1], values, atol=1e-4)
    prompts, G = left_padded(PROMPTS, W + 3), 2
    completions = jax.random.randint(jax.random.key(2), (4, G, N), 2, V)
    completion_mask = (jnp.arange(N) < jnp.asarray([[3], [8]])[None]).astype(jnp.float32) * jnp.ones((4, 1, 1))
    grouped = score_groups(judge, judged, prompts, completions, completion_mask, PAD)
    full = score(judge, judged, jnp.repeat(prompts, G, axis=0), completions.reshape(4 * G, N),
                 completion_mask.reshape(4 * G, N), PAD)
    for a, b in zip(grouped, full):
        np.testing.assert_allclose(a.reshape(4 * G, N), b, atol=1e-5)
    with pytest.raises(ValueError, match="read the whole sequence"):
        draw(judge, judged, prompts, jax.random.key(3))
    with pytest.raises(ValueError, match="judge layers feed a value head"):
        TransformerConfig(vocab_size=V, max_len=48, judge_layers=1)


def test_a_length_cap_cuts_each_prompt_s_members_at_its_window(tiny):
    """DRIVE's short response window as a traced cap: prompt b's members keep the first min(cap[b], L) tokens of
    their uncapped completions (L: up to and including EOS), the rest pad with mask 0; nothing else changes. By
    hand, caps [2, 3, 5, 3] of N = 8: a member of length 8 keeps 2, 3, 5 or 3 tokens; one that ended at column 1
    (L = 2) keeps its 2 under any of these caps. Decoding stops once every member is done or capped: the while loop (`stop_slots`) runs
    max min(cap, L) <= 5 steps, not 8."""
    model, params = tiny
    prompts = left_padded(PROMPTS, W + 3)
    keys, G = jax.random.split(jax.random.key(5), 4), 3
    kw = per_prompt_settings(G)
    whole = sample_groups_per_prompt(model, params, prompts, keys, **kw)
    cap = np.array([2, 3, 5, 3])
    kept = np.minimum(cap[:, None], np.asarray(whole.lengths))  # [B, G]
    inside = np.arange(N)[None, None, :] < kept[..., None]
    capped = dict(kw, length_cap=jnp.asarray(cap))
    for out in (sample_groups_per_prompt(model, params, prompts, keys, **capped),
                sample_groups_per_prompt(model, params, prompts, keys, stop_slots=1, **capped)):
        np.testing.assert_array_equal(out.lengths, kept)
        np.testing.assert_array_equal(out.mask, inside.astype(np.float32))
        np.testing.assert_array_equal(out.tokens, np.where(inside, whole.tokens, PAD))
        np.testing.assert_allclose(out.log_probs, np.where(inside, whole.log_probs, 0.0), atol=1e-5)
    np.testing.assert_array_equal(out.decided, np.full(4, kept.max()))

