import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.advantages import gae, impala, lambda_targets, vtrace


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


def test_vtrace_is_one_reward_on_the_next_lambda_return():
    """Two steps, no episode end: v_1 = r_1 + gamma V_last (its own lambda-return), v_0 = r_0 + gamma ((1 - lam) V_1
    + lam v_1); the advantages are r_t + gamma v_{t+1} - V_t, the targets GAE's."""
    rewards, values, last_value = jnp.array([1.0, 2.0]), jnp.array([0.5, 1.0]), jnp.array(3.0)
    gamma, lam = 0.9, 0.8
    adv, targets = vtrace(rewards, values, jnp.array([False, False]), last_value, gamma, lam)
    v1 = 2.0 + 0.9 * 3.0
    v0 = 1.0 + 0.9 * (0.2 * 1.0 + 0.8 * v1)
    np.testing.assert_allclose(targets, [v0, v1], rtol=1e-6)
    np.testing.assert_allclose(adv, [1.0 + 0.9 * v1 - 0.5, 2.0 + 0.9 * 3.0 - 1.0], rtol=1e-6)
    np.testing.assert_allclose(targets, gae(rewards, values, jnp.array([False, False]), last_value, gamma, lam)[1])


def test_vtrace_equals_brax_s_ppo_advantages():
    """Brax's own estimator (`brax.training.agents.ppo.losses.compute_gae`, no time limits) on random episodes."""
    from brax.training.agents.ppo import losses  # the dev extra installs brax
    rng = np.random.default_rng(3)
    T, N = 20, 5
    rewards, values = rng.normal(size=(T, N)).astype(np.float32), rng.normal(size=(T, N)).astype(np.float32)
    last_value = rng.normal(size=N).astype(np.float32)
    dones = rng.random((T, N)) < 0.1
    adv, targets = vtrace(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(dones), jnp.asarray(last_value),
                          0.95, 0.9)
    brax_targets, brax_adv = losses.compute_gae(jnp.zeros((T, N)), jnp.asarray(dones, jnp.float32),
                                                jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(last_value),
                                                lambda_=0.9, discount=0.95)
    np.testing.assert_allclose(targets, brax_targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, brax_adv, rtol=1e-5, atol=1e-5)


def test_impala_s_off_policy_targets_on_a_hand_worked_example():
    """Two steps, no episode end, gamma 0.9, lambda 1, pi/mu = 2 then 0.5 (rho_bar = c_bar = 1): rho = (1, 0.5),
    c = (1, 0.5). delta_1 = 0.5 (2 + 0.9 * 3 - 1) = 1.85, v_1 = 1 + 1.85 = 2.85; delta_0 = 1 + 0.9 * 1 - 0.5 = 1.4,
    v_0 = 0.5 + 1.4 + 0.9 * c_0 * 1.85 = 3.565; advantages rho_t (r_t + gamma v_{t+1} - V_t): 1 + 0.9 * 2.85 - 0.5 =
    3.065 and 0.5 (2 + 0.9 * 3 - 1) = 1.85."""
    rewards, values, last_value = jnp.array([1.0, 2.0]), jnp.array([0.5, 1.0]), jnp.array(3.0)
    adv, targets = impala(rewards, values, jnp.array([False, False]), last_value, 0.9, 1.0,
                          log_rhos=jnp.log(jnp.array([2.0, 0.5])))
    np.testing.assert_allclose(targets, [3.565, 2.85], rtol=1e-6)
    np.testing.assert_allclose(adv, [3.065, 1.85], rtol=1e-6)


def test_impala_matches_the_papers_sum_and_is_vtrace_on_policy():
    """v_s = V(x_s) + sum_{t>=s} gamma^(t-s) (prod_{s<=i<t} c_i) rho_t delta_t over each episode (Espeholt et al.
    2018, eq. 1), written as that sum, on random episodes with truncated ratios on both sides of 1."""
    rng = np.random.default_rng(5)
    T, N, gamma, lam, rho_bar, c_bar = 12, 4, 0.95, 0.9, 1.0, 0.8
    rewards, values = rng.normal(size=(T, N)), rng.normal(size=(T, N))
    last_value, dones = rng.normal(size=N), rng.random((T, N)) < 0.15
    log_rhos = rng.normal(scale=0.7, size=(T, N))
    rho, c = np.minimum(rho_bar, np.exp(log_rhos)), lam * np.minimum(c_bar, np.exp(log_rhos))
    next_v = np.concatenate([values[1:], last_value[None]])
    delta = rho * (rewards + gamma * next_v * ~dones - values)
    want = np.array(values, np.float64)
    for s in range(T):
        for n in range(N):
            trace = 1.0
            for t in range(s, T):
                want[s, n] += gamma ** (t - s) * trace * delta[t, n]
                if dones[t, n]:
                    break
                trace *= c[t, n]
    next_target = np.concatenate([want[1:], last_value[None]])
    want_adv = rho * (rewards + gamma * ~dones * next_target - values)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    adv, targets = impala(f32(rewards), f32(values), jnp.asarray(dones), f32(last_value), gamma, lam,
                          log_rhos=f32(log_rhos), rho_bar=rho_bar, c_bar=c_bar)
    np.testing.assert_allclose(targets, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    on_policy = [impala(f32(rewards), f32(values), jnp.asarray(dones), f32(last_value), gamma, lam, log_rhos=lr)
                 for lr in (None, jnp.zeros((T, N)))]
    expected = vtrace(f32(rewards), f32(values), jnp.asarray(dones), f32(last_value), gamma, lam)
    for got in on_policy:
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, atol=1e-6)


def test_the_ppo_docs_estimator_example_registers_and_trains():
    """docs/ppo.md's TD(0) estimator: registered by its own decorator, one-step TD errors, and PPO trains with it."""
    import re

    import jax

    from helpers import ROOT, small_cartpole
    from jaxrl import advantages, algos, mesh as mesh_lib

    page = open(f"{ROOT}/docs/ppo.md").read()
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "needs_critic=True" in block)
    try:
        exec(snippet, {})
        rewards, values = jnp.array([1.0, 0.0, 2.0]), jnp.array([0.5, 1.0, 0.25])
        dones, last_value = jnp.array([False, True, False]), jnp.array(3.0)
        adv, targets = advantages.ESTIMATORS["td0"].core(rewards, values, dones, last_value, 0.9, 0.8)
        np.testing.assert_allclose(adv, [1.0 + 0.9 * 1.0 - 0.5, 0.0 - 1.0, 2.0 + 0.9 * 3.0 - 0.25], rtol=1e-6)
        np.testing.assert_allclose(targets, gae(rewards, values, dones, last_value, 0.9, 0.8)[1], rtol=1e-6)
        config = small_cartpole(**{"advantage.estimator": "td0"})
        algos.validate(config)
        algo, hp = algos.build(config, mesh_lib.make_mesh())
        _, metrics = algo.run_chunk(algo.init_seeds(0, 1), hp, 1)
        assert np.isfinite(jax.device_get(metrics["policy_loss"])).all()
    finally:
        advantages.ESTIMATORS.pop("td0", None)
