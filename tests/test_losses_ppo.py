import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def _trained_params(config, updates=2):
    from helpers import build

    algo, hp, state = build(config)
    state, metrics = algo.run_chunk(state, hp, updates)
    return jax.tree.leaves(state.params), metrics


@pytest.mark.parametrize("experiment", ["pendulum", "smax_mappo"])
def test_advantages_from_the_current_critic_are_the_rollout_s_until_the_critic_moves(experiment):
    """returns.gae_values="current" recomputes GAE in every minibatch from the critic as it is then. With one
    epoch of one minibatch, that critic is the rollout's, so the updates equal those of advantages computed
    once from the rollout (up to float rounding: the loss is summed in another order); with more minibatches
    the later ones see a moved critic, and the updates differ."""
    from helpers import load_experiment, set_keys, small_smax_config

    if experiment == "pendulum":  # feed-forward, observation statistics, time limits bootstrapped
        config = load_experiment("gymnax_ppo", "Pendulum-v1")
        config.unlock()
        set_keys(config, {"num_envs": 8, "num_steps": 64, "total_steps": 8 * 64 * 2, "normalize.obs": True})
    else:  # recurrent actor and critic, the critic on the global state (its own inputs after the rollout)
        config = small_smax_config("3m", num_envs=8, num_steps=16)
    single = {"optim.num_epochs": 1, "optim.num_minibatches": 1}
    rollout, m_rollout = _trained_params(set_keys(config.copy_and_resolve_references(), single))
    current, m_current = _trained_params(set_keys(config.copy_and_resolve_references(),
                                                  {**single, "returns.gae_values": "current"}))
    for a, b in zip(rollout, current):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(m_rollout["value_loss"], m_current["value_loss"], rtol=1e-4)
    if experiment != "pendulum":  # (the recurrent case adds nothing to what follows but compile time)
        return
    several = {"optim.num_epochs": 2, "optim.num_minibatches": 2}
    moved, _ = _trained_params(set_keys(config.copy_and_resolve_references(), several))
    recomputed, _ = _trained_params(set_keys(config.copy_and_resolve_references(),
                                             {**several, "returns.gae_values": "current"}))
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(moved, recomputed)) > 1e-4


def test_impala_corrects_for_the_policy_moved_within_an_update():
    """advantage.estimator=impala with returns.gae_values=current weighs each minibatch's V-trace by how far the
    policy has moved from the rollout's: none in the first minibatch (the update equals vtrace's), some once
    earlier minibatches have changed it (the update differs from vtrace's)."""
    from helpers import load_experiment, set_keys

    config = load_experiment("gymnax_ppo", "Pendulum-v1")
    config.unlock()
    set_keys(config, {"num_envs": 8, "num_steps": 64, "total_steps": 8 * 64, "returns.gae_values": "current"})
    runs = {}
    for estimator in ("vtrace", "impala"):
        for name, optim in (("single", {"optim.num_epochs": 1, "optim.num_minibatches": 1}),
                            ("several", {"optim.num_epochs": 2, "optim.num_minibatches": 2})):
            overrides = {**optim, "advantage.estimator": estimator}
            runs[estimator, name] = _trained_params(set_keys(config.copy_and_resolve_references(), overrides), 1)[0]
    for a, b in zip(runs["vtrace", "single"], runs["impala", "single"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(leaf).all() for leaf in runs["impala", "several"])
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(runs["vtrace", "several"], runs["impala", "several"])) > 1e-6


def test_behaviour_cloning_is_the_negative_log_likelihood_of_the_teacher_s_action():
    """RPD's term against the formulas by hand, value and gradient, on two states. Categorical: -log softmax(z)[a],
    gradient softmax(z) - onehot(a). Gaussian (D = 2, the teacher's mean m_t): sum_d 0.5 u^2 + log s + log sqrt(2 pi)
    with u = (m_t - m) / s, gradients -u / s for the mean and 1 - u^2 for the log-std."""
    logits = np.array([[1.0, -0.5, 0.3], [0.2, 0.2, 2.0]], np.float32)
    teacher = np.array([2, 0])
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = -np.log(softmax[np.arange(2), teacher])
    expected_grad = softmax - np.eye(3)[teacher]
    categorical = distributions.Categorical(3)
    bc = lambda out: losses.behaviour_cloning(categorical, out, jnp.asarray(teacher))  # noqa: E731
    np.testing.assert_allclose(bc(jnp.asarray(logits)), expected, rtol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda out: bc(out).sum())(jnp.asarray(logits)), expected_grad, atol=1e-6)

    mean, log_std = np.array([[0.1, -0.4], [1.0, 0.0]], np.float32), np.array([[0.0, -1.0], [0.5, 0.2]], np.float32)
    teacher_mean = np.array([[0.3, -0.2], [-1.0, 0.4]], np.float32)
    std = np.exp(log_std)
    u = (teacher_mean - mean) / std
    expected = np.sum(0.5 * u**2 + log_std + 0.5 * np.log(2 * np.pi), axis=-1)
    expected_grad = np.concatenate([-u / std, 1 - u**2], axis=-1)
    gaussian = distributions.DiagGaussian(2, (-2.0, -2.0), (2.0, 2.0))
    bc = lambda out: losses.behaviour_cloning(gaussian, out, jnp.asarray(teacher_mean))  # noqa: E731
    out = jnp.asarray(np.concatenate([mean, log_std], axis=-1))
    np.testing.assert_allclose(bc(out), expected, rtol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda out: bc(out).sum())(out), expected_grad, rtol=1e-5, atol=1e-6)


def test_value_smoothed_clip_scales_each_groups_range_by_its_task_value():
    """loss.clip_smoothing = beta (VSPO): a group's clip range x max(0, 1 + beta (v - mean v)); values (0.3, 0.1, 0.2,
    0) have mean 0.15, so beta = 2 gives (1.3, 0.9, 1.1, 0.7) and beta = 10 gives (2.5, 0.5, 1.5, 0: floored)."""
    value = jnp.asarray([0.3, 0.1, 0.2, 0.0])
    np.testing.assert_allclose(losses.value_smoothed_clip(value, 2.0), [1.3, 0.9, 1.1, 0.7], rtol=1e-6)
    np.testing.assert_allclose(losses.value_smoothed_clip(value, 10.0), [2.5, 0.5, 1.5, 0.0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(losses.value_smoothed_clip(value, 0.0), [1.0] * 4)  # off: one range for all
    # Per-row ranges in the clipped surrogate: ratio 1.5, A = 1, clip 0.2 x (1.3, 0.9, 1.1, 0.7) -> -(1 + 0.2 x scale)
    scale = losses.value_smoothed_clip(value, 2.0)[:, None]
    out = losses.ppo_clip_loss(jnp.full((4, 2), jnp.log(1.5)), jnp.ones((4, 2)), 0.2 * scale, 0.2 * scale)
    np.testing.assert_allclose(out, -np.repeat([[1.26], [1.18], [1.22], [1.14]], 2, axis=1), rtol=1e-6)
