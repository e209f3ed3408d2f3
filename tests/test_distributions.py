"""Action distributions against closed forms: the Gaussian's log-density and entropy, and tanh squashing's
change of variables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import envs
from jaxrl import distributions, networks

MEAN = np.array([[0.3, -1.2], [2.0, 0.0]], np.float32)  # [batch 2, D 2]
LOG_STD = np.array([[-0.5, 0.4], [0.0, -1.5]], np.float32)
OUT = np.concatenate([MEAN, LOG_STD], -1)


def gaussian(squash=False):
    return distributions.DiagGaussian(2, (-2.0, -1.0), (2.0, 3.0), squash)


def test_gaussian_log_prob_and_entropy_are_the_closed_forms():
    dist = gaussian()
    action = np.array([[0.0, 1.0], [1.5, -0.3]], np.float32)
    expected = stats.norm.logpdf(action, MEAN, np.exp(LOG_STD)).sum(-1)
    np.testing.assert_allclose(dist.log_prob(OUT, action), expected, rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(OUT), stats.norm.entropy(MEAN, np.exp(LOG_STD)).sum(-1), rtol=1e-5)
    np.testing.assert_array_equal(dist.mode(OUT), MEAN)


def test_softplus_stds_are_brax_s_parametrisation_and_start_where_asked():
    """std = softplus(x) + 0.001 (Brax's and gymnax-blines' policies): log-density and entropy are the
    Gaussian's with that std, and `std_output` inverts the transform (a network's initial std)."""
    dist = distributions.DiagGaussian(2, (-2.0, -1.0), (2.0, 3.0), std_transform="softplus")
    raw = np.array([[-3.0, 0.0], [2.0, 25.0]], np.float32)
    std = np.log1p(np.exp(raw.astype(np.float64))) + distributions.SOFTPLUS_MIN_STD
    out = np.concatenate([MEAN, raw], -1)
    action = np.array([[0.0, 1.0], [1.5, -0.3]], np.float32)
    np.testing.assert_allclose(dist.log_prob(out, action), stats.norm.logpdf(action, MEAN, std).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(out), stats.norm.entropy(MEAN, std).sum(-1), rtol=1e-5)
    for log_std in (-3.0, -0.5, 0.0, 2.0):
        x = dist.std_output(log_std)
        np.testing.assert_allclose(dist.split(jnp.array([0.0, 0.0, x, x]))[1], log_std, rtol=1e-5, atol=1e-6)
    assert gaussian().std_output(-0.5) == -0.5  # log-stds are their own outputs
    with pytest.raises(ValueError, match="cannot start at"):
        dist.std_output(np.log(0.0005))
    with pytest.raises(ValueError, match="unknown std_transform 'sigmoid'"):
        distributions.DiagGaussian(1, (-1.0,), (1.0,), std_transform="sigmoid")


def test_squashed_log_prob_is_the_density_of_tanh_u():
    """p(a) = N(atanh a) / (1 - a^2) per dimension, for a = tanh(u) in (-1, 1)."""
    dist = gaussian(squash=True)
    u = np.array([[0.1, -2.0], [3.0, 0.5]], np.float32)
    a = np.tanh(u.astype(np.float64))
    expected = (stats.norm.logpdf(np.arctanh(a), MEAN, np.exp(LOG_STD)) - np.log1p(-a * a)).sum(-1)
    np.testing.assert_allclose(dist.log_prob(OUT, u), expected, rtol=1e-4)


def test_squashed_entropy_matches_a_monte_carlo_estimate():
    """H(tanh u) = -E[log p(tanh u)]: the quadrature against 400k samples (within 4 standard errors)."""
    dist = gaussian(squash=True)
    u = jax.vmap(lambda k: dist.sample(k, jnp.asarray(OUT)))(jax.random.split(jax.random.PRNGKey(0), 400_000))
    neg_log_p = -jax.vmap(lambda x: dist.log_prob(jnp.asarray(OUT), x))(u)  # [400k, 2]
    estimate, error = neg_log_p.mean(0), neg_log_p.std(0) / np.sqrt(neg_log_p.shape[0])
    assert np.all(np.abs(dist.entropy(OUT) - estimate) < 4 * error + 1e-4), (dist.entropy(OUT), estimate, error)
    # squashing only loses entropy: log(1 - tanh^2) <= 0
    assert np.all(dist.entropy(OUT) < gaussian().entropy(OUT))


def test_tanh_log_jacobian_is_finite_with_finite_gradients_far_out():
    u = jnp.array([-50.0, -5.0, 0.0, 5.0, 50.0])
    np.testing.assert_allclose(distributions.tanh_log_jacobian(u)[1:4],
                               np.log1p(-np.tanh(np.array([-5.0, 0.0, 5.0])) ** 2), rtol=1e-4)
    grads = jax.vmap(jax.grad(distributions.tanh_log_jacobian))(u)
    assert np.all(np.isfinite(grads)) and np.allclose(np.asarray(grads)[[0, 4]], [2.0, -2.0])


def test_samples_have_the_policy_mean_and_std():
    dist = gaussian()
    samples = jax.vmap(lambda k: dist.sample(k, jnp.asarray(OUT)))(jax.random.split(jax.random.PRNGKey(1), 100_000))
    np.testing.assert_allclose(samples.mean(0), MEAN, atol=0.02)
    np.testing.assert_allclose(samples.std(0), np.exp(LOG_STD), rtol=0.02)


def test_env_actions_are_clipped_or_squashed_into_the_bounds():
    u = jnp.array([[-9.0, 9.0], [0.0, 0.0]])
    np.testing.assert_allclose(gaussian().to_env(u), [[-2.0, 3.0], [0.0, 0.0]])
    squashed = gaussian(squash=True).to_env(u)
    np.testing.assert_allclose(squashed, [[-2.0, 3.0], [0.0, 1.0]], atol=1e-5)  # tanh(0) -> the middle


def test_the_distribution_follows_the_action_space():
    assert distributions.for_action_space(envs.Discrete(4)) == distributions.Categorical(4)
    box = envs.Box(low=-2.0, high=2.0, shape=(3,))
    dist = distributions.for_action_space(box, squash=True)
    assert dist.num_outputs == 6 and dist.low == (-2.0,) * 3 and dist.squash
    with pytest.raises(ValueError, match="finite action bounds"):
        distributions.for_action_space(envs.Box(low=-np.inf, high=np.inf, shape=(2,)), squash=True)
    with pytest.raises(ValueError, match="must be a vector"):
        distributions.for_action_space(envs.Box(low=0.0, high=1.0, shape=(2, 2)))
    with pytest.raises(ValueError, match="no action masks"):
        gaussian().with_mask(OUT, jnp.ones((2, 2), bool))


@pytest.mark.parametrize("kind", ["mlp", "gru"])
def test_network_log_stds_are_a_free_parameter_or_computed_from_the_state(kind):
    def build(log_std):
        if kind == "mlp":
            return networks.ActorCritic(4, (8,), log_std=log_std, init_std_output=-0.5)
        return networks.RecurrentActorCritic(4, 8, 8, log_std=log_std, init_std_output=-0.5)

    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 6))  # [T, B, d]
    first = jnp.zeros((3, 5), bool)
    for log_std in ("param", "state"):
        net = build(log_std)
        params = net.init(jax.random.PRNGKey(1), net.initial_carry((5,)), x, x, first)
        _, out, value = net.apply(params, net.initial_carry((5,)), x, x, first)
        assert out.shape == (3, 5, 4) and value.shape == (3, 5)
        log_stds = out[..., 2:]
        if log_std == "param":
            assert params["params"]["log_std"].shape == (2,)
            np.testing.assert_array_equal(log_stds, -0.5)  # the same for every state, at its initial value
        else:
            assert "log_std" not in params["params"]
            assert np.ptp(np.asarray(log_stds)) > 0 and abs(float(log_stds.mean()) + 0.5) < 0.1


def test_ppo_with_a_squashed_state_dependent_gaussian_acts_within_the_bounds():
    from helpers import build, load_experiment, set_keys

    config = load_experiment("gymnax_ppo", "Pendulum-v1")
    config.unlock()
    set_keys(config, {"num_envs": 4, "num_steps": 16, "total_steps": 4 * 16 * 2, "optim.num_minibatches": 2,
                      "network.squash": True, "network.log_std": "state", "network.init_log_std": 1.0})
    algo, hp, state = build(config)
    traj = algo.parts.sample_trajectory(state)
    assert traj.action.shape == (1, 16, 4, 1, 1)  # [seeds, T, envs, agents, D]
    env_actions = algo.parts.policy.dist.to_env(traj.action)
    assert float(jnp.max(jnp.abs(env_actions))) <= 2.0 and float(jnp.max(jnp.abs(traj.action))) > 2.0
    state, metrics = algo.run_chunk(state, hp, 2)
    assert np.isfinite(np.asarray(metrics["entropy"])).all() and np.isfinite(np.asarray(metrics["approx_kl"])).all()


def test_lecun_uniform_starts_every_layer_at_variance_one_over_fan_in():
    """network.kernel_init="lecun_uniform" (Brax's networks): every kernel, the heads included, uniform with
    variance 1 / fan_in; the default starts orthogonal, with the policy head's small gain."""
    x = np.zeros((1, 5, 6), np.float32)
    first = np.zeros((1, 5), bool)

    def initial_params(net):  # jitted and read back: eager calls compile each primitive of every shape separately
        return jax.device_get(jax.jit(net.init)(jax.random.PRNGKey(0), (), x, x, first)["params"])

    params = initial_params(networks.ActorCritic(4, (256, 256), "swish", log_std="state", kernel_init="lecun_uniform"))
    for path, kernel in jax.tree_util.tree_flatten_with_path(params)[0]:
        if "kernel" in jax.tree_util.keystr(path):
            fan_in = kernel.shape[0]
            assert float(np.max(np.abs(kernel))) <= np.sqrt(3 / fan_in) + 1e-6
            np.testing.assert_allclose(float(np.var(kernel)), 1 / fan_in, rtol=0.25 if kernel.size < 100 else 0.1)
    head = initial_params(networks.ActorCritic(4, (256, 256), "swish", log_std="state"))["actor"]["Dense_2"]["kernel"]
    np.testing.assert_allclose(np.linalg.norm(np.asarray(head), axis=0), 0.01, rtol=1e-4)  # orthonormal x gain
