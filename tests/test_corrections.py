"""Off-policy corrections (jaxrl.corrections) on a hand-worked example, their diagnostics against the formulas,
and the policy loss's correction weight against a NumPy formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import corrections, losses

# Two sequences of 4 tokens. rho_t = pi_prox / mu per valid token: 0.5, 1, 3 (the 4th padding) and 2, 2 (the
# last two padding). Per sequence rho = 0.5 * 1 * 3 = 1.5 and 2 * 2 = 4. Band [low, high] = [0.6, 2].
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
BEHAVIOUR = np.array([[-1.0, -2.0, -3.0, -np.inf], [-0.5, -1.5, np.nan, -np.inf]], np.float32)
RHO = np.array([[0.5, 1.0, 3.0, 1.0], [2.0, 2.0, 1.0, 1.0]], np.float32)
PROXIMAL = np.where(MASK > 0, BEHAVIOUR + np.log(RHO), np.inf).astype(np.float32)  # padding: garbage
LOW, HIGH = 0.6, 2.0

EXPECTED_WEIGHTS = {
    "none": [[1, 1, 1, 0], [1, 1, 0, 0]],
    "tis_token": [[0.5, 1, 2, 0], [2, 2, 0, 0]],  # min(rho_t, 2)
    "tis_sequence": [[1.5, 1.5, 1.5, 0], [2, 2, 0, 0]],  # min(1.5, 2), min(4, 2)
    "mis_token": [[0, 1, 0, 0], [2, 2, 0, 0]],  # 0.5 < 0.6 and 3 > 2 dropped; 2 <= 2 kept
    "mis_sequence": [[1.5, 1.5, 1.5, 0], [0, 0, 0, 0]],  # 4 > 2: the whole second sequence dropped
    "decoupled": [[0.5, 1, 3, 0], [2, 2, 0, 0]],  # rho_t, untruncated
}


@pytest.mark.parametrize("name", sorted(EXPECTED_WEIGHTS))
def test_each_correction_weighs_the_hand_worked_example(name):
    fixed = corrections.correct(name, jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), MASK, LOW, HIGH)
    np.testing.assert_allclose(fixed.weight, EXPECTED_WEIGHTS[name], rtol=1e-6)
    anchor = BEHAVIOUR if name == "none" else PROXIMAL  # the log-probabilities the clipped ratio starts from
    np.testing.assert_allclose(np.where(MASK > 0, fixed.anchor, 0.0), np.where(MASK > 0, anchor, 0.0), rtol=1e-6)


def test_the_registry_holds_exactly_the_documented_corrections_and_refuses_others():
    assert sorted(corrections.CORRECTIONS) == sorted(EXPECTED_WEIGHTS)
    with pytest.raises(ValueError, match="unknown loss.correction 'tis'; known: decoupled, mis_sequence"):
        corrections.correct("tis", jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), MASK)


def test_weights_and_anchors_carry_no_gradient_and_survive_any_staleness():
    def total(proximal):
        fixed = corrections.correct("decoupled", jnp.asarray(BEHAVIOUR), proximal, MASK, LOW, HIGH)
        return jnp.sum(fixed.weight) + jnp.sum(jnp.where(MASK > 0, fixed.anchor, 0.0))

    np.testing.assert_array_equal(jax.grad(total)(jnp.asarray(PROXIMAL)), 0.0)
    stale = PROXIMAL + np.float32(500.0)  # rho = e^500: beyond float32
    for name in EXPECTED_WEIGHTS:
        weight = corrections.correct(name, jnp.asarray(BEHAVIOUR), jnp.asarray(stale), MASK, LOW, HIGH).weight
        assert np.isfinite(weight).all(), name
    assert np.asarray(corrections.correct("mis_token", jnp.asarray(BEHAVIOUR), jnp.asarray(stale), MASK, LOW,
                                          HIGH).weight).max() == 0.0


def test_diagnostics_match_their_formulas_whole_and_split_over_devices():
    fixed = corrections.correct("tis_token", jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), MASK, LOW, HIGH)
    found = corrections.diagnostics(fixed, jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), MASK)
    w = np.array([0.5, 1, 2, 2, 2])  # the valid tokens' weights
    expected = {"correction_ess": w.sum() ** 2 / (5 * (w ** 2).sum()),  # 56.25 / 66.25
                "correction_weight": 1.5, "correction_zeroed": 0.0,
                "logp_mismatch": (np.log(2) + 0 + np.log(3) + 2 * np.log(2)) / 5}
    for key, value in expected.items():
        np.testing.assert_allclose(found[key], value, rtol=1e-5, err_msg=key)
    # each sequence on its own device: the sums combine over the axis
    split = jax.vmap(lambda b, p, m: corrections.diagnostics(corrections.correct("tis_token", b[None], p[None],
                                                                                 m[None], LOW, HIGH),
                                                             b[None], p[None], m[None], axis_name="data"),
                     axis_name="data")(jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), jnp.asarray(MASK))
    for key, value in expected.items():
        np.testing.assert_allclose(split[key], [value, value], rtol=1e-5, err_msg=key)
    masked = corrections.correct("mis_token", jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), MASK, LOW, HIGH)
    found = corrections.diagnostics(masked, jnp.asarray(BEHAVIOUR), jnp.asarray(PROXIMAL), MASK)
    np.testing.assert_allclose(found["correction_zeroed"], 2 / 5)
    np.testing.assert_allclose(found["correction_ess"], 25 / (5 * 9))  # weights 0, 1, 0, 2, 2


def test_effective_sample_size_bounds():
    mask = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(corrections.effective_sample_size(jnp.full((1, 4), 0.3), mask), 1.0, rtol=1e-6)
    np.testing.assert_allclose(corrections.effective_sample_size(jnp.asarray([[5.0, 0, 0, 0]]), mask), 0.25)
    assert float(corrections.effective_sample_size(jnp.zeros((1, 4)), mask)) == 0.0


@pytest.mark.parametrize("aggregate", ["token", "sequence"])
def test_the_policy_loss_multiplies_each_step_by_its_weight_outside_the_denominator(aggregate):
    rng = np.random.default_rng(0)
    mask = (np.arange(6)[None, :] < np.array([6, 2, 4])[:, None]).astype(np.float32)
    old = rng.normal(-1.5, 0.5, (3, 6)).astype(np.float32)
    new = (old + rng.normal(scale=0.3, size=(3, 6))).astype(np.float32)
    adv = rng.normal(size=(3, 6)).astype(np.float32)
    weight = np.where(mask > 0, rng.uniform(0.0, 3.0, (3, 6)), np.nan).astype(np.float32)  # NaN on padding
    loss, metrics = losses.policy_loss(new, old, adv, mask, clip_low=0.2, weight=weight, aggregate=aggregate)
    r = np.exp(new.astype(np.float64) - old)
    per_step = np.where(mask > 0, weight, 0.0) * -np.minimum(r * adv, np.clip(r, 0.8, 1.2) * adv)
    if aggregate == "token":
        expected = (per_step * mask).sum() / mask.sum()
    else:
        expected = np.mean([(per_step[i] * mask[i]).sum() / mask[i].sum() for i in range(3)])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    unweighted, _ = losses.policy_loss(new, old, adv, mask, clip_low=0.2, aggregate=aggregate)
    ones, _ = losses.policy_loss(new, old, adv, mask, clip_low=0.2, weight=np.ones_like(mask), aggregate=aggregate)
    np.testing.assert_allclose(ones, unweighted, rtol=1e-6)


def test_a_scaled_step_moves_the_parameters_that_fraction_of_the_way():
    """`gradient_step`'s step_scale multiplies Adam's update (which a scaled loss would not change): the ESS
    step of `loss.ess_step`."""
    import optax
    from jax.sharding import PartitionSpec as P

    from jaxrl import engine, mesh as mesh_lib

    mesh = mesh_lib.make_mesh(1)
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    optimizer = optax.adam(0.1)
    batch = {"x": jnp.asarray([[0.3, 0.1, -0.2], [1.0, 0.5, 0.25]])}

    def loss(p, b, hp):
        return jnp.mean(jnp.square(b["x"] @ p["w"] - 1.0)), {}

    def step(scale):
        def body(p, s):
            return engine.gradient_step(loss, optimizer, p, s, batch, None, scale)[0]
        # jitted: eager calls compile each primitive separately
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(), check_vma=False))(
            params, optimizer.init(params))

    full, half = step(None), step(jnp.float32(0.5))
    np.testing.assert_allclose(half["w"] - params["w"], 0.5 * (full["w"] - params["w"]), rtol=1e-5, atol=1e-7)
    assert not np.allclose(full["w"], params["w"])
