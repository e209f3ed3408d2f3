"""GRPO-family policy-loss parts in jaxrl.losses, each checked against a hand-written NumPy formula."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import losses

S, T = 5, 7
MODES = ("token", "sequence", "constant")
# Most checks run eagerly to keep the file fast; each function also runs under jit in at least one test.
jit_policy_loss = jax.jit(losses.policy_loss, static_argnames=("ratio", "aggregate", "kl", "axis_name"))
jit_aggregate = jax.jit(losses.aggregate, static_argnames=("how", "axis_name"))


def ragged_mask(lengths, t=T):
    """Prefix masks with the given lengths (0 = an empty, fully padded sequence). [S, T] float32"""
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


MASK = ragged_mask([7, 3, 0, 1, 5])
TURNS = np.array([0, 0, 1, 1, 1, 2, 2])  # each position's turn, for ratio="turn"


def turn_segments(ratio):
    """policy_loss's keyword for `ratio`: the turns its "turn" level reads."""
    return {"segments": (TURNS, 3)} if ratio == "turn" else {}


def inputs(seed, scale=0.3, s=S, t=T):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, size=(s, t)).astype(np.float32)
    new = (old + rng.normal(scale=scale, size=(s, t))).astype(np.float32)
    ref = (old + rng.normal(scale=scale, size=(s, t))).astype(np.float32)
    adv = rng.normal(size=(s, t)).astype(np.float32)
    ent = rng.uniform(0.1, 2.0, size=(s, t)).astype(np.float32)
    return new, old, ref, adv, ent


# ---- NumPy reference formulas ----------------------------------------------------------------------------

def np_clip_loss(log_ratio, adv, lo, hi, dual):
    r = np.exp(log_ratio.astype(np.float64))
    loss = -np.minimum(r * adv, np.clip(r, 1 - lo, 1 + hi) * adv)
    if dual is not None:
        loss = np.where(adv < 0, np.minimum(loss, -dual * adv), loss)
    return loss


def np_aggregate(v, m, how, length=None):
    v, m = np.asarray(v, np.float64), np.asarray(m, np.float64)
    n_seq = sum(1 for row in m if row.sum() > 0)
    if how == "token":
        return (v * m).sum() / max(m.sum(), 1)
    if how == "sequence":
        rows = [(v[i] * m[i]).sum() / m[i].sum() for i in range(len(m)) if m[i].sum() > 0]
        return float(np.mean(rows)) if rows else 0.0
    return (v * m).sum() / max(n_seq * (v.shape[1] if length is None else length), 1)


# ---- element-wise terms ----------------------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi,dual", [(0.2, None, None), (0.2, 0.28, None), (0.2, 0.28, 3.0)],
                         ids=["symmetric", "clip_higher", "dual_clip"])
def test_clip_loss_matches_formula(lo, hi, dual):
    rng = np.random.default_rng(0)
    log_ratio = rng.normal(scale=1.0, size=400).astype(np.float32)  # wide, so every regime occurs
    adv = rng.normal(size=400).astype(np.float32)
    # Hyperparameters go in as traced arrays.
    fn = jax.jit(lambda lr, a, lo, hi, dual: losses.ppo_clip_loss(lr, a, lo, hi, dual))
    out = fn(log_ratio, adv, jnp.float32(lo), None if hi is None else jnp.float32(hi),
             None if dual is None else jnp.float32(dual))
    np.testing.assert_allclose(out, np_clip_loss(log_ratio, adv, lo, lo if hi is None else hi, dual),
                               rtol=1e-5, atol=1e-6)


def test_dual_clip_only_changes_negative_advantages_with_large_ratio():
    rng = np.random.default_rng(1)
    log_ratio = rng.normal(scale=1.0, size=1000).astype(np.float32)
    adv = rng.normal(size=1000).astype(np.float32)
    c = 3.0
    plain = np.asarray(losses.ppo_clip_loss(log_ratio, adv, 0.2, 0.28))
    dual = np.asarray(losses.ppo_clip_loss(log_ratio, adv, 0.2, 0.28, dual_clip=c))
    changed = ~np.isclose(plain, dual, rtol=0, atol=1e-6)
    expected = (adv < 0) & (np.exp(log_ratio) > c) & (np.abs(adv) > 1e-5)
    assert expected.sum() > 10
    np.testing.assert_array_equal(changed, expected)
    np.testing.assert_allclose(dual[expected], -c * adv[expected], rtol=1e-6)
    # The cap has no gradient in the ratio: a stale sample cannot keep pushing.
    grad = jax.grad(lambda lr: losses.ppo_clip_loss(lr, jnp.float32(-1.0), 0.2, dual_clip=c))(jnp.log(5.0))
    assert grad == 0.0


@pytest.mark.parametrize("bad", [1.0, 0.5, -2.0])
def test_dual_clip_rejects_values_at_most_one(bad):
    with pytest.raises(ValueError, match="dual_clip"):
        losses.ppo_clip_loss(jnp.zeros(3), jnp.ones(3), 0.2, dual_clip=bad)


def test_sequence_log_ratio_matches_formula():
    new, old, *_ = inputs(2)
    lr = new - old
    expected = [(lr[i] * MASK[i]).sum() / max(MASK[i].sum(), 1) for i in range(S)]
    out = jax.jit(losses.sequence_log_ratio)(lr, MASK)
    assert out.shape == (S,)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    assert out[2] == 0.0  # the empty sequence


def test_kl_estimators_match_formulas():
    new, _, ref, *_ = inputs(3, scale=1.0)
    x = ref.astype(np.float64) - new
    expected = {"k1": -x, "k2": x**2 / 2, "k3": np.exp(x) - 1 - x}
    assert set(losses.KL_ESTIMATORS) == set(expected)
    for name, want in expected.items():
        got = jax.jit(losses.kl_estimate, static_argnames="estimator")(new, ref, estimator=name)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        losses.kl_estimate(new, ref, "k4")


def test_k1_and_k3_are_unbiased_for_kl_and_k2_is_not():
    p = np.array([0.5, 0.2, 0.2, 0.1])   # current policy: actions are sampled from it
    q = np.array([0.1, 0.3, 0.4, 0.2])   # reference policy
    exact = float(np.sum(p * np.log(p / q)))
    lp, lq = jnp.log(jnp.asarray(p, jnp.float32)), jnp.log(jnp.asarray(q, jnp.float32))
    expectation = {name: float(np.sum(p * np.asarray(losses.kl_estimate(lp, lq, name))))
                   for name in losses.KL_ESTIMATORS}
    np.testing.assert_allclose(expectation["k1"], exact, rtol=1e-5)
    np.testing.assert_allclose(expectation["k3"], exact, rtol=1e-5)
    assert abs(expectation["k2"] - exact) > 0.05


# ---- aggregation -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", MODES)
@pytest.mark.parametrize("length", [None, 10.0])
def test_aggregations_match_formula(how, length):
    v = np.random.default_rng(4).normal(size=(S, T)).astype(np.float32)
    rng_mask = (np.random.default_rng(5).uniform(size=(S, T)) < 0.5).astype(np.float32)  # not prefix-shaped
    rng_mask[1] = 0.0
    for mask in (MASK, rng_mask):
        got = jit_aggregate(v, mask, how, None if length is None else jnp.float32(length))
        np.testing.assert_allclose(got, np_aggregate(v, mask, how, length), rtol=1e-5, atol=1e-7)
    assert float(losses.aggregate(v, np.zeros_like(MASK), how)) == 0.0  # all-masked: 0, not NaN


def test_aggregations_differ_on_ragged_masks():
    # Guards the formula tests above against modes silently collapsing into one another.
    v = np.random.default_rng(6).normal(size=(S, T)).astype(np.float32)
    values = [float(losses.aggregate(v, MASK, how)) for how in MODES]
    assert len({round(x, 5) for x in values}) == 3


def test_unknown_names_raise():
    new, old, _, adv, _ = inputs(7)
    with pytest.raises(ValueError, match="aggregate 'mean'"):
        losses.aggregate(new, MASK, "mean")
    with pytest.raises(ValueError, match="aggregate 'mean'"):
        losses.policy_loss(new, old, adv, MASK, clip_low=0.2, aggregate="mean")
    with pytest.raises(ValueError, match="ratio 'tok'"):
        losses.policy_loss(new, old, adv, MASK, clip_low=0.2, ratio="tok")
    assert losses.RATIO_LEVELS == ("token", "sequence", "turn")


@pytest.mark.parametrize("how", MODES)
@pytest.mark.parametrize("ratio", losses.RATIO_LEVELS)
def test_padding_never_leaks(how, ratio):
    new, old, ref, adv, ent = inputs(8)
    pad = MASK == 0
    garbage = np.random.default_rng(9).normal(scale=50.0, size=(S, T)).astype(np.float32)
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, ratio=ratio, aggregate=how, kl_coef=0.1, ent_coef=0.01,
              **turn_segments(ratio))

    def loss_and_grad(new, old, ref, adv, ent):
        fn = lambda lp: losses.policy_loss(lp, old, adv, MASK, ref_log_prob=ref, entropy=ent, **kw)[0]
        return jax.value_and_grad(fn)(jnp.asarray(new))

    clean_loss, clean_grad = loss_and_grad(new, old, ref, adv, ent)
    # Large garbage everywhere in the padding, and -inf log-probs (a common padding value) in part of it.
    log_prob_fill = np.where(np.arange(T) % 2 == 0, garbage, -np.inf).astype(np.float32)
    dirty = [np.where(pad, fill, x) for fill, x in zip([log_prob_fill] * 3 + [garbage] * 2, (new, old, ref, adv, ent))]
    loss, grad = loss_and_grad(*dirty)
    np.testing.assert_allclose(loss, clean_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, clean_grad, rtol=1e-6, atol=1e-9)
    assert np.all(np.asarray(clean_grad)[pad] == 0.0)
    assert np.all(np.asarray(clean_grad)[~pad] != 0.0)
    # Plain aggregate too: garbage (inf included) under the mask changes neither value nor gradient.
    agg = jax.value_and_grad(lambda v: losses.aggregate(v, MASK, how))
    for a, b in zip(agg(jnp.asarray(new)), agg(jnp.asarray(np.where(pad, -log_prob_fill, new)))):
        np.testing.assert_allclose(a, b, rtol=1e-6)


# ---- the composer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", MODES)
def test_sequence_ratio_with_one_step_equals_token_ratio(how):
    new, old, _, adv, _ = inputs(10, scale=0.5, t=1)
    mask = ragged_mask([1, 1, 0, 1, 1], t=1)
    kw = dict(clip_low=0.2, clip_high=0.28, aggregate=how)
    seq = losses.policy_loss(new, old, adv, mask, ratio="sequence", **kw)
    tok = losses.policy_loss(new, old, adv, mask, ratio="token", **kw)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), seq, tok)


@pytest.mark.parametrize("how", MODES)
@pytest.mark.parametrize("ratio", losses.RATIO_LEVELS)
def test_unit_ratios_give_negative_aggregated_advantage(how, ratio):
    _, old, _, adv, _ = inputs(11)
    loss, metrics = losses.policy_loss(old, old, adv, MASK, clip_low=0.2, ratio=ratio, aggregate=how,
                                       **turn_segments(ratio))
    np.testing.assert_allclose(loss, -np_aggregate(adv, MASK, how), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["policy_loss"], loss)
    assert float(metrics["clip_fraction"]) == 0.0
    assert float(metrics["approx_kl"]) == 0.0
    assert set(metrics) == {"policy_loss", "clip_fraction", "approx_kl"}


@pytest.mark.parametrize("kl,how", list(zip(("k1", "k2", "k3"), MODES)))  # each estimator and each mode once
def test_kl_and_entropy_terms_sign_and_coefficient(how, kl):
    new, old, ref, adv, ent = inputs(12)
    base = dict(clip_low=0.2, aggregate=how, kl=kl)
    plain, _ = losses.policy_loss(new, old, adv, MASK, **base)
    kl_coef, ent_coef = jnp.float32(0.3), jnp.float32(0.05)  # traced coefficients
    loss, metrics = jit_policy_loss(new, old, adv, MASK, ref_log_prob=ref, entropy=ent, kl_coef=kl_coef,
                                    ent_coef=ent_coef, **base)
    x = ref.astype(np.float64) - new
    kl_values = {"k1": -x, "k2": x**2 / 2, "k3": np.exp(x) - 1 - x}[kl]
    want_kl, want_ent = np_aggregate(kl_values, MASK, how), np_aggregate(ent, MASK, how)
    np.testing.assert_allclose(metrics["kl"], want_kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy"], want_ent, rtol=1e-5)
    np.testing.assert_allclose(loss, plain + 0.3 * want_kl - 0.05 * want_ent, rtol=1e-5)
    # Coefficients default to 0: the terms are reported but do not enter the loss.
    loss0, metrics0 = losses.policy_loss(new, old, adv, MASK, ref_log_prob=ref, entropy=ent, **base)
    np.testing.assert_allclose(loss0, plain, rtol=1e-6)
    assert {"kl", "entropy"} <= set(metrics0)


@pytest.mark.parametrize("ratio", losses.RATIO_LEVELS)
def test_loss_and_metrics_match_formulas(ratio):
    new, old, _, adv, _ = inputs(13)
    new = new + np.float32([0.0, 0.5, 0.0, -0.5, 0.05])[:, None]  # some sequences inside the clip range, some out
    token_lr = new.astype(np.float64) - old
    lr = token_lr
    if ratio == "sequence":  # GSPO: each token carries its sequence's length-normalised log-ratio
        lr = np.repeat((token_lr * MASK).sum(1, keepdims=True) / np.maximum(MASK.sum(1, keepdims=True), 1), T, 1)
    if ratio == "turn":  # Rank-GRPO's units: each token carries its turn's length-normalised log-ratio
        lr = np.stack([[(token_lr[s] * MASK[s])[TURNS == TURNS[t]].sum()
                        / max(MASK[s][TURNS == TURNS[t]].sum(), 1) for t in range(T)] for s in range(S)])
    loss, metrics = losses.policy_loss(new, old, adv, MASK, clip_low=0.2, clip_high=0.28, dual_clip=2.0,
                                       ratio=ratio, aggregate="sequence", **turn_segments(ratio))
    clipped = ((np.exp(lr) < 0.8) | (np.exp(lr) > 1.28)).astype(np.float64)
    want_loss = np_aggregate(np_clip_loss(lr, adv, 0.2, 0.28, 2.0), MASK, "sequence")
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["policy_loss"], want_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_fraction"], np_aggregate(clipped, MASK, "sequence"), rtol=1e-5)
    assert 0.0 < float(metrics["clip_fraction"]) < 1.0
    # approx_kl: old vs new policy, k3 on the per-token log ratio whatever level is clipped.
    want_approx_kl = np_aggregate(np.exp(token_lr) - 1 - token_lr, MASK, "sequence")
    np.testing.assert_allclose(metrics["approx_kl"], want_approx_kl, rtol=1e-4)


@pytest.mark.parametrize("how", MODES)
def test_sequence_ratio_gradient_is_shared_within_a_sequence(how):
    new, old, _, _, _ = inputs(14, scale=0.02)  # every sequence ratio well inside the clip range
    seq_adv = np.random.default_rng(15).normal(size=(S, 1)).astype(np.float32)
    adv = np.broadcast_to(seq_adv, (S, T))
    assert np.all(np.abs(np.asarray(losses.sequence_log_ratio(new - old, MASK))) < 0.1)

    def grad(ratio):
        fn = lambda lp: losses.policy_loss(lp, old, adv, MASK, clip_low=0.2, ratio=ratio, aggregate=how)[0]
        return np.asarray(jax.grad(fn)(jnp.asarray(new)))

    g = grad("sequence")
    for i in range(S):
        valid = MASK[i] > 0
        if valid.any():
            np.testing.assert_allclose(g[i, valid], np.full(valid.sum(), g[i, valid][0]), rtol=1e-5)
            assert g[i, valid][0] != 0.0
        assert np.all(g[i, ~valid] == 0.0)
    # The token-level ratio gives each token its own gradient (so the check above can fail).
    g_tok = grad("token")
    assert not np.allclose(g_tok[0], g_tok[0, 0], rtol=1e-3)


# ---- data-parallel aggregation ---------------------------------------------------------------------------

D, S_SHARD, T_SHARD = 3, 4, 6
# Uneven shards: one nearly empty (with an empty sequence), one full, one ragged.
SPLIT_MASK = ragged_mask([1, 0, 0, 2, 6, 6, 6, 6, 3, 5, 1, 4], t=T_SHARD)


def assert_split_matches_whole(fn, theta, data, has_aux=False):
    """Mean over the vmapped "d" axis of per-shard values and gradients (w.r.t. shared `theta`) == whole batch."""
    whole_val, whole_grad = jax.value_and_grad(fn, has_aux=has_aux)(theta, *data)
    per_device = jax.vmap(jax.value_and_grad(lambda th, *x: fn(th, *x, axis_name="d"), has_aux=has_aux),
                          in_axes=(None,) + (0,) * len(data), axis_name="d")
    shards = [x.reshape(D, S_SHARD, T_SHARD) for x in data]
    vals, grads = jax.jit(per_device)(theta, *shards)
    jax.tree.map(lambda w, v: np.testing.assert_allclose(np.mean(v, 0), w, rtol=1e-5, atol=1e-7), whole_val, vals)
    np.testing.assert_allclose(np.mean(grads, 0), whole_grad, rtol=1e-5, atol=1e-7)
    # Without the axis the per-shard values would not average to the whole-batch value (the check can fail).
    unsynced = jax.jit(jax.vmap(lambda *x: jax.tree.leaves(fn(theta, *x))[0]))(*shards)
    assert not np.isclose(np.mean(unsynced), jax.tree.leaves(whole_val)[0], rtol=1e-3)


def split_data(seed):
    rng = np.random.default_rng(seed)
    size = (D * S_SHARD, T_SHARD)
    feats = rng.normal(size=size).astype(np.float32)
    old = rng.normal(-1.0, 0.3, size=size).astype(np.float32)
    ref = (old + rng.normal(scale=0.2, size=size)).astype(np.float32)
    adv = rng.normal(size=size).astype(np.float32)
    theta = jnp.asarray(rng.normal(scale=0.1, size=T_SHARD).astype(np.float32))  # shared parameters
    return theta, feats, old, ref, adv


@pytest.mark.parametrize("how", MODES)
def test_aggregate_axis_name_mean_over_shards_equals_whole_batch(how):
    theta, feats, *_ = split_data(16)

    def fn(theta, feats, mask, axis_name=None):
        return losses.aggregate(jnp.sin(theta * feats + 1.0), mask, how, axis_name=axis_name)

    assert_split_matches_whole(fn, theta, (feats, SPLIT_MASK))


def test_policy_loss_axis_name_mean_over_shards_equals_whole_batch():
    theta, feats, old, ref, adv = split_data(17)

    def fn(theta, feats, old, ref, adv, mask, axis_name=None):
        lp = old + theta * feats
        return losses.policy_loss(lp, old, adv, mask, clip_low=0.2, ratio="sequence", aggregate="sequence",
                                  ref_log_prob=ref, kl_coef=0.1, entropy=jnp.exp(-lp), ent_coef=0.01,
                                  axis_name=axis_name)

    assert_split_matches_whole(fn, theta, (feats, old, ref, adv, SPLIT_MASK), has_aux=True)


# ---- the objectives of the method catalogue (loss.objective, loss.confidence_penalty) ---------------------------
# Each against the paper's mechanism written out in NumPy (value) or against the gradient it names (on-policy).

G4_MASK = ragged_mask([7, 3, 5, 1], t=T)  # one group of four completions, ragged lengths
G4_CORRECT = np.float32([1.0, 0.0, 0.0, 1.0])


def grad_wrt_log_prob(new, old, mask, **kwargs):
    """d loss / d log pi [S, T] under the token aggregation, with zero advantages (the objectives here read labels)."""
    zeros = jnp.zeros_like(jnp.asarray(new))
    return np.asarray(jax.grad(lambda lp: losses.policy_loss(lp, old, zeros, mask, aggregate="token", **kwargs)[0])(
        jnp.asarray(new)))


def outcome_of(correct):
    return losses.Outcome(jnp.asarray(correct), jnp.full(len(correct), float(np.mean(correct))), len(correct))


def test_cispo_weights_every_token_by_its_clipped_ratio_held_constant():
    """CISPO: gradient -clip(r, 1 - lo, 1 + hi) A d log pi for every token, also where PPO's clip would drop it."""
    new, old, _, adv, _ = inputs(21, scale=0.5)
    r = np.exp(new.astype(np.float64) - old)
    assert ((r > 1.28) | (r < 0.8))[MASK > 0].any()  # some tokens outside the clip range
    loss, _ = losses.policy_loss(new, old, adv, MASK, clip_low=0.2, clip_high=0.28, objective="cispo")
    weight = np.clip(r, 0.8, 1.28)
    np.testing.assert_allclose(loss, np_aggregate(-weight * adv * (new - old.astype(np.float64)), MASK, "token"),
                               rtol=1e-5)
    g = np.asarray(jax.grad(lambda lp: losses.policy_loss(lp, old, adv, MASK, clip_low=0.2, clip_high=0.28,
                                                          objective="cispo")[0])(jnp.asarray(new)))
    np.testing.assert_allclose(g, -weight * adv * MASK / MASK.sum(), rtol=1e-4, atol=1e-7)
    assert (np.abs(g)[MASK > 0] > 0).all()  # no token loses its gradient


def test_nft_value_is_the_likelihood_of_the_positive_and_of_the_implicit_negative_policy():
    """NFT: -log R on correct completions, -log((1 - r R) / (1 - r)) on incorrect ones, r the group's pass rate
    (here 1/2), R = pi / pi_old; inside the clip and floor, as these ratios are."""
    new, old, _, _, _ = inputs(22, scale=0.1, s=4)
    lr = new.astype(np.float64) - old
    loss, _ = losses.policy_loss(new, old, np.zeros_like(new), G4_MASK, clip_low=0.2, clip_high=0.28,
                                 objective="nft", outcome=outcome_of(G4_CORRECT))
    rate = 0.5
    per_token = np.where(G4_CORRECT[:, None] > 0, -lr, -np.log((1 - rate * np.exp(lr)) / (1 - rate)))
    np.testing.assert_allclose(loss, np_aggregate(per_token, G4_MASK, "token"), rtol=1e-5)


@pytest.mark.parametrize("correct", [[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
def test_nft_on_policy_gradient_is_grpo_with_a_group_mean_baseline(correct):
    """NFT equals GRPO in strict on-policy training: at R = 1 its gradient is the policy gradient with advantage
    (label - r) / (1 - r), r the group's pass rate."""
    correct = np.float32(correct)
    _, old, _, _, _ = inputs(23, s=4)
    rate = correct.mean()
    g = grad_wrt_log_prob(old, old, G4_MASK, clip_low=0.2, clip_high=0.28, objective="nft", outcome=outcome_of(correct))
    advantage = (correct - rate) / (1 - rate)
    np.testing.assert_allclose(g, -advantage[:, None] * G4_MASK / G4_MASK.sum(), rtol=1e-5, atol=1e-7)


def test_pacs_predicts_the_label_from_the_implicit_reward_and_is_rloo_at_a_zero_score():
    """PACS: BCE(sigmoid(psi), label), psi = beta (s_i - mean_{j != i} s_j), s = sum_t log pi / pi_ref; with every
    completion as likely as under the reference (psi = 0) the gradient is beta x RLOO's policy gradient."""
    new, old, ref, _, _ = inputs(24, scale=0.2, s=4)
    beta = 0.7
    s = ((new.astype(np.float64) - ref) * G4_MASK).sum(1)
    psi = beta * (s - (s.sum() - s) / 3)
    bce = -(G4_CORRECT * np.log(1 / (1 + np.exp(-psi))) + (1 - G4_CORRECT) * np.log(1 / (1 + np.exp(psi))))
    loss, metrics = losses.policy_loss(new, old, np.zeros_like(new), G4_MASK, clip_low=0.2, aggregate="sequence",
                                       ref_log_prob=ref, objective="pacs", outcome=outcome_of(G4_CORRECT),
                                       score_scale=beta)
    np.testing.assert_allclose(metrics["policy_loss"], bce.mean(), rtol=1e-5)
    g = grad_wrt_log_prob(ref, old, G4_MASK, clip_low=0.2, ref_log_prob=ref, objective="pacs",
                          outcome=outcome_of(G4_CORRECT), score_scale=beta)
    rloo = G4_CORRECT - (G4_CORRECT.sum() - G4_CORRECT) / 3
    # every token carries its completion's loss: token aggregation weighs completion i by its length / all tokens
    lengths = G4_MASK.sum(1)
    d_loss_d_s = np.array([sum(lengths[i] / lengths.sum() * (0.5 - G4_CORRECT[i]) * beta * ((i == k) - (i != k) / 3)
                               for i in range(4)) for k in range(4)])
    np.testing.assert_allclose(g, d_loss_d_s[:, None] * G4_MASK, rtol=1e-5, atol=1e-7)
    equal_lengths = np.array([sum(0.25 * (0.5 - G4_CORRECT[i]) * beta * ((i == k) - (i != k) / 3) for i in range(4))
                              for k in range(4)])
    np.testing.assert_allclose(equal_lengths, -beta / 4 * rloo, rtol=1e-6)  # the RLOO advantage, by the algebra


def test_ace_scales_only_negative_advantages_by_the_completions_confidence_shift():
    """ACE: A < 0 becomes A (1 + alpha max(c, 0)), c = sum_t log pi / pi_ref over the completion (overconfident
    errors, c > 0, pay more; the others as before); A >= 0 stays."""
    new, _, ref, adv, _ = inputs(25, scale=0.4)
    c = ((new.astype(np.float64) - ref) * MASK).sum(1, keepdims=True)
    assert (c > 0).any() and (c < 0).any()
    want = np.where(adv < 0, adv * (1 + 2.0 * np.maximum(c, 0)), adv)
    got = losses.confidence_shaped(jnp.asarray(adv), new, ref, MASK, 2.0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (np.asarray(got)[adv >= 0] == adv[adv >= 0]).all()
    # through policy_loss: the clipped surrogate of the shaped advantages (c held constant)
    old = new - 0.01
    loss, _ = losses.policy_loss(new, old, adv, MASK, clip_low=0.2, ref_log_prob=ref, confidence_penalty=2.0)
    np.testing.assert_allclose(loss, np_aggregate(np_clip_loss(new.astype(np.float64) - old, want, 0.2, 0.2, None),
                                                  MASK, "token"), rtol=1e-5)


def test_d3s_keeps_the_tokens_of_largest_advantage_times_entropy():
    """D3S's token level: of the valid tokens, the share `keep` of largest |A| x H carries the loss (ties kept);
    padding never does."""
    adv = jnp.asarray([[2.0, -1.0, 0.5, 9.0], [-3.0, 0.1, 1.0, 1.0]])
    ent = jnp.asarray([[1.0, 1.0, 4.0, 9.0], [1.0, 5.0, 0.5, 2.0]])
    mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # scores 2, 1, 2, (81 padded) | 3, 0.5, 0.5, 2
    np.testing.assert_array_equal(losses.informative_tokens(adv, ent, mask, 0.5), [[1, 0, 1, 0], [1, 0, 0, 1]])
    np.testing.assert_array_equal(losses.informative_tokens(adv, ent, mask, 1.0), mask)
    np.testing.assert_array_equal(losses.informative_tokens(adv, ent, mask, 1 / 7), [[0, 0, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("group_size,keep", [(2, 0.3), (5, 0.5), (6, 0.5), (8, 0.25), (8, 0.9), (7, 1.0)])
def test_d3s_keeps_the_members_whose_advantages_vary_most(group_size, keep):
    """D3S's sample level: of each group, the k = round(keep G) (at least 2) members whose advantages have the largest
    variance, against an exhaustive search over every k-subset."""
    import itertools

    rng = np.random.default_rng(group_size)
    adv = rng.normal(size=(4, group_size)).astype(np.float32)
    adv[0] = np.round(adv[0])  # ties
    kept = np.asarray(losses.varied_samples(jnp.asarray(adv), keep))
    k = int(np.clip(round(keep * group_size), 2, group_size))
    for row, chosen in zip(adv, kept):
        assert chosen.sum() == k
        best = max(np.var(row[list(subset)]) for subset in itertools.combinations(range(group_size), k))
        np.testing.assert_allclose(np.var(row[chosen > 0]), best, rtol=1e-5, atol=1e-6)


def test_d3s_schedule_relaxes_the_kept_share_linearly_to_all():
    np.testing.assert_allclose([losses.relaxed_keep(0.25, t, 10) for t in (0, 4, 10, 30)], [0.25, 0.55, 1.0, 1.0])
    assert losses.relaxed_keep(0.25, 7, 0) == 0.25


def test_dagrpo_masks_both_members_of_a_near_identical_pair_with_opposite_advantages():
    """Distinctiveness = differing positions / the longer completion's length. Group 0: members 0 and 1 differ at 1
    of 4 positions (0.25) with opposite advantages: both masked at a threshold of 0.3, neither at 0.2; member 2
    differs from member 1 at 3 of 4 positions, and member 3 shares member 0's sign. Group 1: 1 of 2 positions differ
    (0.5) with opposite signs, and identical completions of the same sign stay."""
    tokens = jnp.asarray([[[5, 6, 7, 8], [5, 6, 7, 9], [1, 2, 3, 9], [5, 6, 7, 8]],
                          [[4, 4, 0, 0], [4, 3, 0, 0], [4, 4, 0, 0], [4, 4, 0, 0]]])
    mask = jnp.asarray([[[1, 1, 1, 1]] * 4, [[1, 1, 0, 0]] * 4], jnp.float32)
    adv = jnp.asarray([[1.0, -1.0, 0.5, 2.0], [1.0, -1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(losses.distinct_samples(tokens, mask, adv, 0.3), [[0, 0, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(losses.distinct_samples(tokens, mask, adv, 0.2), [[1, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(losses.distinct_samples(tokens, mask, adv, 0.6), [[0, 0, 1, 0], [0, 0, 0, 0]])


def test_entropy_shaping_adds_a_bounded_entropy_bonus():
    """A + min(coef H, |A| / bound), the entropy held constant."""
    adv = jnp.asarray([[2.0, -1.0, 0.0, 0.4]])
    ent = jnp.asarray([[0.5, 3.0, 2.0, 1.0]])
    np.testing.assert_allclose(losses.entropy_shaped(adv, ent, 0.4, 2.0), [[2.2, -0.5, 0.0, 0.6]], rtol=1e-6)
    grad = jax.grad(lambda h: losses.entropy_shaped(adv, h, 0.4, 2.0).sum())(ent)
    np.testing.assert_array_equal(grad, 0.0)


def test_turn_ratio_is_each_turns_geometric_mean_and_one_turn_is_gspos():
    """Rank-GRPO's segment units: every token of a turn carries the mean of that turn's valid token log-ratios."""
    rng = np.random.default_rng(3)
    log_ratio = rng.normal(scale=0.2, size=(S, T)).astype(np.float32)
    turns = np.array([0, 0, 1, 1, 1, 2, 2])
    got = np.asarray(losses.segment_log_ratio(jnp.asarray(log_ratio), MASK, turns, 3))
    for s in range(S):
        for t in range(T):
            same = (turns == turns[t]) & (MASK[s] > 0)
            want = log_ratio[s][same].mean() if same.any() else 0.0
            np.testing.assert_allclose(got[s, t], want, rtol=1e-5, atol=1e-6)
    whole = losses.segment_log_ratio(jnp.asarray(log_ratio), MASK, np.zeros(T, int), 1)
    np.testing.assert_allclose(whole, np.broadcast_to(np.asarray(losses.sequence_log_ratio(jnp.asarray(log_ratio),
                                                                                           MASK))[:, None], (S, T)),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="pass `segments`"):
        losses.policy_loss(jnp.asarray(log_ratio), jnp.zeros((S, T)), jnp.ones((S, T)), MASK, clip_low=0.2,
                           ratio="turn")


def test_objectives_refuse_missing_inputs():
    new, old, _, adv, _ = inputs(26)
    with pytest.raises(ValueError, match="unknown objective 'ppo'; known: clip, cispo, nft, pacs"):
        losses.policy_loss(new, old, adv, MASK, clip_low=0.2, objective="ppo")
    with pytest.raises(ValueError, match="'nft' objective learns from the verifier's label: pass `outcome`"):
        losses.policy_loss(new, old, adv, MASK, clip_low=0.2, objective="nft")
    with pytest.raises(ValueError, match="reads the reference policy"):
        losses.policy_loss(new, old, adv, MASK, clip_low=0.2, confidence_penalty=1.0)


def test_one_token_rollouts_follow_the_gradient_of_the_reference_tokens_probability():
    """OTR: K draws per position rewarded for matching the reference token, with their mean as baseline; the
    expected gradient of the loss is -(1 - 1/K) d pi(target) / d logits = -(1 - 1/K) pi_t (e_t - pi)."""
    logits = jnp.asarray([[[1.0, 0.2, -0.5, 2.0, 0.0]]])  # [B=1, N=1, V=5]
    target = jnp.asarray([[0]])
    K = 4096
    # Jitted once over the seeds: eager, each seed's gradient would run op by op.
    grad = jax.jit(jax.grad(lambda z, key: losses.one_token_rollouts(z, target, key, K).sum()))
    grads = [grad(logits, jax.random.key(seed)) for seed in range(16)]
    pi = np.asarray(jax.nn.softmax(logits[0, 0]))
    want = -(1 - 1 / K) * pi[0] * (np.eye(5)[0] - pi)
    np.testing.assert_allclose(np.mean(grads, axis=0)[0, 0], want, atol=4e-3)
    assert np.abs(want).max() > 0.05  # (the check is not about zeros)


def test_xrpo_amplifies_correct_completions_the_policy_found_unlikely():
    """Group mean log-likelihood (-1 - 2 - 0.5 - 2.5) / 4 = -1.5: member 1 (-2, A > 0) is scaled by 1 + 2 x 0.5 = 2,
    member 0 (-1, more likely than the mean) and the negatives (member 3 though novel) stay."""
    log_probs = jnp.asarray([[[-1.0, -1.0], [-2.0, -2.0], [-0.5, -0.5], [-2.5, -2.5]]])
    mask = jnp.ones((1, 4, 2)).at[0, 2, 1].set(0.0)  # (member 2's mean over its one token is still -0.5)
    advantages = jnp.asarray([[1.0, 0.5, -1.0, -0.5]])
    np.testing.assert_allclose(losses.novelty_sharpened(advantages, log_probs, mask, 2.0), [[1.0, 1.0, -1.0, -0.5]])
    np.testing.assert_allclose(losses.novelty_sharpened(advantages, log_probs, mask, 0.0), advantages)
    per_token = jnp.broadcast_to(advantages[..., None], (1, 4, 2))
    np.testing.assert_allclose(losses.novelty_sharpened(per_token, log_probs, mask, 2.0)[..., 0], [[1.0, 1.0, -1.0, -0.5]])


def test_ear_also_damps_correct_completions_more_likely_than_their_group():
    """ETTRL's EAR as novelty_sharpened's floor < 1: factor max(1 + 2 (l_bar - l_i), floor), l_bar = -1.5 as above.
    Member 0 (l = -1): 1 + 2 (-0.5) = 0 -> the floor 0.25, A 1 -> 0.25; member 1 (l = -2): 1 + 2 x 0.5 = 2, A 0.5 -> 1;
    member 2 (l = -0.5, the likeliest) is negative: unchanged. A floor of 0.5 with strength 0.5: member 0's
    1 + 0.5 (-0.5) = 0.75 is above it."""
    log_probs = jnp.asarray([[[-1.0, -1.0], [-2.0, -2.0], [-0.5, -0.5], [-2.5, -2.5]]])
    mask = jnp.ones((1, 4, 2))
    advantages = jnp.asarray([[1.0, 0.5, -1.0, -0.5]])
    np.testing.assert_allclose(losses.novelty_sharpened(advantages, log_probs, mask, 2.0, 0.25),
                               [[0.25, 1.0, -1.0, -0.5]])
    np.testing.assert_allclose(losses.novelty_sharpened(advantages, log_probs, mask, 0.5, 0.5),
                               [[0.75, 0.625, -1.0, -0.5]])
    np.testing.assert_allclose(losses.novelty_sharpened(advantages, log_probs, mask, 2.0, 1.0),  # XRPO's default
                               losses.novelty_sharpened(advantages, log_probs, mask, 2.0))


def test_echo_clips_each_group_by_its_vote_confidence():
    """ECHO's confidence-adaptive clipping: eps x max(c, floor). Sequences of confidence 1, 0.5, 0.25 with floor 0.4:
    clip_low 0.2 -> 0.2, 0.1, 0.08; clip_high 0.28 -> 0.28, 0.14, 0.112. Ratio e^0.15 = 1.162 (advantage 1) is inside
    [0.8, 1.28], so sequence 0's loss is -1.162 with a gradient; in sequences 1 and 2 it is clipped at 1.14 and 1.112
    (no gradient)."""
    low, high = losses.confidence_clip_range(0.2, 0.28, jnp.asarray([1.0, 0.5, 0.25]), 0.4)
    np.testing.assert_allclose(low[:, 0], [0.2, 0.1, 0.08], rtol=1e-6)
    np.testing.assert_allclose(high[:, 0], [0.28, 0.14, 0.112], rtol=1e-6)
    log_ratio = jnp.full((3, 1), 0.15)
    loss = losses.ppo_clip_loss(log_ratio, jnp.ones((3, 1)), low, high)
    np.testing.assert_allclose(loss[:, 0], [-np.exp(0.15), -1.14, -1.112], rtol=1e-6)
    grad = jax.grad(lambda r: losses.ppo_clip_loss(r, jnp.ones((3, 1)), low, high).sum())(log_ratio)
    np.testing.assert_allclose(grad[:, 0], [-np.exp(0.15), 0.0, 0.0], rtol=1e-6)


def test_echo_and_vspo_clip_scales_multiply():
    """Each completion's trust region under ECHO (confidence 1, 0.5, 0.25, floor 0.4: x 1, 0.5, 0.4) and VSPO (task-value
    scales 2, 1, 0.5) together: clip_low 0.2 x (2, 0.5, 0.2) = 0.4, 0.1, 0.04; clip_high 0.28 x the same. Either alone
    gives its own scale (a merge once let the second overwrite the first)."""
    from types import SimpleNamespace

    from jaxrl.algos.text.grpo import group_clip_range

    hp = SimpleNamespace(clip_low=0.2, clip_high=0.28, confidence_clip=0.4)
    batch = {"confidence": jnp.asarray([1.0, 0.5, 0.25]), "clip_scale": jnp.asarray([2.0, 1.0, 0.5])}
    for echo, vspo, scale in [(True, True, [2.0, 0.5, 0.2]), (True, False, [1.0, 0.5, 0.4]),
                              (False, True, [2.0, 1.0, 0.5])]:
        low, high = group_clip_range(SimpleNamespace(clips_by_confidence=echo, smooths_clip=vspo), hp, batch)
        np.testing.assert_allclose(np.asarray(low)[:, 0], 0.2 * np.asarray(scale), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(high)[:, 0], 0.28 * np.asarray(scale), rtol=1e-6)
    plain = group_clip_range(SimpleNamespace(clips_by_confidence=False, smooths_clip=False), hp, batch)
    assert plain == (0.2, 0.28)


def test_echo_hybrid_shaping_mixes_confidence_and_certainty():
    """ECHO's A (w c + (1 - w)(1 - H / log V)), V = 4 (log V = 1.386), w = 0.25. Sequence 0: c = 1, tokens of entropy
    log 4 and 0 (mean log 4 / 2: certainty 0.5) -> 0.25 + 0.75 x 0.5 = 0.625, A 2 -> 1.25. Sequence 1: c = 0.5, its
    one valid token of entropy 0 (the padded one, log 4, ignored): 0.125 + 0.75 = 0.875, A -1 -> -0.875. No gradient
    flows into the entropy."""
    log4 = np.log(4.0)
    advantages = jnp.asarray([[2.0, 2.0], [-1.0, -1.0]])
    entropy = jnp.asarray([[log4, 0.0], [0.0, log4]])
    mask = jnp.asarray([[1.0, 1.0], [1.0, 0.0]])
    confidence = jnp.asarray([1.0, 0.5])
    shaped = losses.confidence_entropy_shaped(advantages, confidence, entropy, mask, 0.25, 4)
    np.testing.assert_allclose(shaped, [[1.25, 1.25], [-0.875, -0.875]], rtol=1e-6)
    grad = jax.grad(lambda h: losses.confidence_entropy_shaped(advantages, confidence, h, mask, 0.25, 4).sum())(entropy)
    np.testing.assert_array_equal(grad, 0.0)


def test_hint_modulated_trains_hint_tokens_by_consistency_where_the_member_succeeded():
    """ADHint's consistency-based modulation and selective masking by hand: two members whose first two tokens are a
    hint (weight 0 before), sampled with pi_old 1/2 and 1/4 there. Member 0 (A = 1) trains its hint tokens with
    weights 1/2 and 1/4; member 1 (A = -1) is masked on its hint; the tokens after the hint keep their weights."""
    weight = jnp.asarray([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.5]])
    hint = jnp.asarray([[1.0, 1.0, 0.0, 0.0]] * 2)
    log_probs = jnp.log(jnp.asarray([[0.5, 0.25, 0.9, 0.9]] * 2))
    advantages = jnp.asarray([[1.0] * 4, [-1.0] * 4])
    np.testing.assert_allclose(losses.hint_modulated(weight, advantages, log_probs, hint),
                               [[0.5, 0.25, 1.0, 1.0], [0.0, 0.0, 1.0, 0.5]], rtol=1e-6)


def test_soft_advantages_compress_positive_advantages_logarithmically_and_leave_negative_ones():
    """TempSamp-R1's soft advantage by hand, tau = 0.5: A = 1.5 -> 0.5 log(1 + 3) = log 2; A = 0.5 -> 0.5 log 2;
    0 and negatives unchanged."""
    a = jnp.asarray([1.5, 0.5, 0.0, -0.3, -2.0])
    np.testing.assert_allclose(losses.soft_advantages(a, 0.5),
                               [math.log(2.0), 0.5 * math.log(2.0), 0.0, -0.3, -2.0], rtol=1e-6)


def test_soft_advantages_tame_a_ground_truth_member_and_keep_the_on_policy_members_differences():
    """A group of 4 with one off-policy ground-truth member (correct and well-formed: 1.1 under the (1, 0.1)
    weights) and three on-policy answers, one well-formed (0.1), two not (0): mean 0.3, deviations [0.8, -0.2, -0.3,
    -0.3], variance (0.64 + 0.04 + 0.09 + 0.09) / 4 = 0.215. GRPO gives the GT member 0.8 / sqrt(0.215) = 1.7253;
    tau = 0.5 makes it 0.5 log(1 + 1.7253 / 0.5) = 0.7465, while the on-policy members keep -0.2 / sqrt(0.215) and
    -0.3 / sqrt(0.215): their differences are exact, and the GT member's lead over them shrinks."""
    from jaxrl.advantages import group_advantages

    grpo = group_advantages("grpo", np.array([[1.1, 0.1, 0.0, 0.0]], np.float32), eps=0.0).advantages
    soft = np.asarray(losses.soft_advantages(grpo, 0.5))[0]
    std = math.sqrt(0.215)
    np.testing.assert_allclose(soft, [0.5 * math.log(1 + 0.8 / std / 0.5), -0.2 / std, -0.3 / std, -0.3 / std],
                               rtol=1e-5)
    np.testing.assert_allclose(soft[0], 0.7465, atol=1e-4)
    np.testing.assert_allclose(soft[1] - soft[2], 0.1 / std, rtol=1e-5)  # the on-policy members' gap unchanged
    assert soft[0] - soft[1] < np.asarray(grpo)[0, 0] - np.asarray(grpo)[0, 1]
