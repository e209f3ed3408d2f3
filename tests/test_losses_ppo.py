import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import distributions, losses


def test_ppo_clip_loss_matches_formula():
    rng = np.random.default_rng(1)
    log_ratio = rng.normal(scale=0.5, size=200)
    adv = rng.normal(size=200)
    eps = 0.2
    ratio = np.exp(log_ratio)
    expected = -np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv)
    np.testing.assert_allclose(losses.ppo_clip_loss(jnp.asarray(log_ratio), jnp.asarray(adv), eps), expected,
                               rtol=1e-5, atol=1e-6)


def test_ppo_clip_loss_has_no_gradient_outside_the_trust_region():
    # Positive advantage and a ratio above 1 + eps: the clipped term is active and constant.
    grad = jax.grad(lambda lr: losses.ppo_clip_loss(lr, jnp.array(1.0), 0.2))(jnp.log(1.5))
    assert grad == 0.0
    grad_inside = jax.grad(lambda lr: losses.ppo_clip_loss(lr, jnp.array(1.0), 0.2))(jnp.log(1.1))
    np.testing.assert_allclose(grad_inside, -1.1, rtol=1e-6)


def test_asymmetric_clip_bounds():
    log_ratio = jnp.log(jnp.array([0.5, 1.25, 1.35]))
    adv = jnp.array([-1.0, 1.0, 1.0])
    out = losses.ppo_clip_loss(log_ratio, adv, clip_low=0.2, clip_high=0.28)
    np.testing.assert_allclose(out, [0.8, -1.25, -1.28], rtol=1e-6)
    np.testing.assert_allclose(losses.clip_fraction(log_ratio, 0.2, 0.28), [1.0, 0.0, 1.0])


def test_value_loss_clipped_is_pessimistic():
    values, old, targets = jnp.array([2.0, 0.0]), jnp.array([0.0, 0.0]), jnp.array([3.0, 0.05])
    unclipped = losses.value_loss(values, old, targets, None)
    np.testing.assert_allclose(unclipped, [0.5, 0.5 * 0.05**2], rtol=1e-6)
    clipped = losses.value_loss(values, old, targets, 0.2)
    # First: the clipped prediction 0.2 is further from 3: 0.5 * 2.8^2. Second: unchanged.
    np.testing.assert_allclose(clipped, [0.5 * 2.8**2, 0.5 * 0.05**2], rtol=1e-6)


def test_masked_distribution_never_picks_illegal_actions():
    logits = jnp.array([[5.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = jnp.array([[False, True, True], [True, False, False]])
    masked = distributions.masked_logits(logits, mask)
    samples = jax.vmap(lambda k: distributions.sample(k, masked))(jax.random.split(jax.random.PRNGKey(0), 500))
    assert not np.any(np.asarray(samples[:, 0]) == 0)
    assert np.all(np.asarray(samples[:, 1]) == 0)
    np.testing.assert_allclose(distributions.entropy(masked)[1], 0.0, atol=1e-6)
    probs = np.exp(np.asarray(jax.nn.log_softmax(masked[0])))
    np.testing.assert_allclose(probs, [0.0, 1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-5)
