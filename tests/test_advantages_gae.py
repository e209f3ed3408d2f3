import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.advantages import gae, lambda_targets


def test_gae_matches_hand_computed_example():
    # Two steps, the episode ends after the first: step 0 must not see step 1's values.
    rewards = jnp.array([1.0, 2.0])
    values = jnp.array([0.5, 1.0])
    dones = jnp.array([True, False])
    last_value = jnp.array(3.0)
    gamma, lam = 0.9, 0.8
    adv, targets = gae(rewards, values, dones, last_value, gamma, lam)
    delta1 = 2.0 + 0.9 * 3.0 - 1.0  # 3.7
    delta0 = 1.0 + 0.0 - 0.5  # episode ended: no bootstrap
    np.testing.assert_allclose(adv, [delta0, delta1], rtol=1e-6)
    np.testing.assert_allclose(targets, [delta0 + 0.5, delta1 + 1.0], rtol=1e-6)


def test_gae_without_dones_is_discounted_sum_of_deltas():
    rng = np.random.default_rng(0)
    T, N = 6, 3
    rewards, values = rng.normal(size=(T, N)), rng.normal(size=(T, N))
    last_value = rng.normal(size=N)
    gamma, lam = 0.97, 0.9
    adv, _ = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.zeros((T, N), bool), jnp.asarray(last_value),
                 gamma, lam)
    next_values = np.concatenate([values[1:], last_value[None]])
    deltas = rewards + gamma * next_values - values
    expected = np.array([sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, T)) for t in range(T)])
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


def test_gae_lambda_one_gives_monte_carlo_returns():
    rewards = jnp.array([1.0, 1.0, 1.0])
    values = jnp.array([0.3, -0.2, 0.7])
    adv, targets = gae(rewards, values, jnp.array([False, False, True]), jnp.array(10.0), 0.5, 1.0)
    # Episode ends at the last step, so the return is 1 + 0.5 + 0.25 from the start.
    np.testing.assert_allclose(targets, [1.75, 1.5, 1.0], rtol=1e-6)


@pytest.mark.parametrize("lam, dones, terminated, want", [
    (0.0, [0, 0, 0], [0, 0, 0], [6.0, 12.0, 18.0]),  # one-step TD: r + gamma v'
    (1.0, [0, 0, 0], [0, 0, 0], [6.5, 11.0, 18.0]),  # n-step returns of the window (3, 2, 1 steps)
    (0.5, [0, 0, 0], [0, 0, 0], [6.375, 11.5, 18.0]),
    (1.0, [0, 1, 0], [0, 0, 0], [7.0, 12.0, 18.0]),  # a time limit at step 1: bootstrap from its final obs
    (1.0, [0, 1, 0], [0, 1, 0], [2.0, 2.0, 18.0]),  # a terminal state at step 1: nothing after it
])
def test_lambda_targets_against_hand_computed_returns(lam, dones, terminated, want):
    # rewards 1, 2, 3; bootstrap values 10, 20, 30; gamma 0.5. E.g. lam 0.5, step 1:
    # 2 + 0.5 * (0.5 * 20 + 0.5 * G_2) with G_2 = 3 + 0.5 * 30 = 18 -> 11.5
    got = lambda_targets(jnp.array([1.0, 2.0, 3.0]), jnp.array([10.0, 20.0, 30.0]), jnp.array(terminated, bool),
                         jnp.array(dones, bool), 0.5, lam)
    np.testing.assert_allclose(got, want, rtol=1e-6)
