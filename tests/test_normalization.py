"""Running statistics (observation normalisation, reward scaling) against numpy, and in PPO's state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import build, load_experiment, set_keys
from jaxrl import checkpoint, normalization

X = np.random.default_rng(0).normal(3.0, 2.0, size=(7, 5, 4)).astype(np.float32)  # [..., d = 4]


def test_batch_moments_are_numpy_mean_and_variance():
    m = normalization.of_batch(jnp.asarray(X))
    flat = X.reshape(-1, 4)
    assert float(m.count) == 35
    np.testing.assert_allclose(m.mean, flat.mean(0), rtol=1e-6)
    np.testing.assert_allclose(normalization.variance(m), flat.var(0), rtol=1e-5)


def test_combining_parts_gives_the_whole():
    parts = [normalization.of_batch(jnp.asarray(X[:2])), normalization.of_batch(jnp.asarray(X[2:3])),
             normalization.of_batch(jnp.asarray(X[3:]))]
    m = normalization.init((4,))
    for part in parts:
        m = normalization.combine(m, part)
    whole = normalization.of_batch(jnp.asarray(X))
    for a, b in zip(jax.tree.leaves(m), jax.tree.leaves(whole)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_normalize_and_scale():
    fresh = normalization.init((4,))
    np.testing.assert_allclose(normalization.normalize(fresh, jnp.asarray(X), clip=100.0), X, rtol=1e-6)  # nothing seen
    m = normalization.of_batch(jnp.asarray(X))
    z = np.asarray(normalization.normalize(m, jnp.asarray(X), clip=100.0)).reshape(-1, 4)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-4)
    assert float(jnp.max(normalization.normalize(m, jnp.asarray(X) * 100, clip=5.0))) == 5.0
    returns = normalization.of_batch(jnp.asarray(X[..., :1]))
    np.testing.assert_allclose(normalization.scale(returns, jnp.float32(4.0)), 4.0 / X[..., 0].std(), rtol=1e-4)


def pendulum(**overrides):
    config = load_experiment("gymnax_ppo", "Pendulum-v1")
    config.unlock()
    set_keys(config, {"num_envs": 4, "num_steps": 32, "total_steps": 4 * 32 * 4, "optim.num_minibatches": 4,
                      "normalize.obs": True, "normalize.reward": True, **overrides})
    return config


@pytest.fixture(scope="module")
def trained():
    """PPO on Pendulum with both normalisations, 2 seeds after 3 updates: (algorithm, hyperparameters, state)."""
    algo, hp, state = build(pendulum(), num_seeds=2)
    return algo, hp, algo.run_chunk(state, hp, 3)[0]


def test_ppo_state_counts_every_observation_and_return_and_checkpoints_them(trained, tmp_path):
    algo, hp, state = trained
    stats = state.params["obs_norm"]["obs"]
    np.testing.assert_array_equal(stats.count, [3 * 32 * 4] * 2)  # [seeds]: T x N x agents per update
    np.testing.assert_array_equal(state.reward_norm.moments.count, [3 * 32 * 4] * 2)
    assert state.reward_norm.returns.shape == (2, 4, 1)
    # Pendulum's observation: cos, sin in [-1, 1], angular velocity in [-8, 8]: the means and variances fit
    assert np.all(np.abs(stats.mean[:, :2]) <= 1) and np.all(normalization.variance(stats)[:, :2] <= 1)
    # the statistics are not trained: the optimiser state holds only the network's parameters
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)]
    assert paths and not any("obs_norm" in path for path in paths)
    saver = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
    saver.save(3, state)
    saver.close()
    _, restored = checkpoint.restore_from(str(tmp_path / "ckpt"), checkpoint.abstract_state(state))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(a, b)
    # and training goes on the same from the restored state
    after, _ = algo.run_chunk(state, hp, 1)
    after_restored, _ = algo.run_chunk(restored, hp, 1)
    for a, b in zip(jax.tree.leaves(after.params), jax.tree.leaves(after_restored.params)):
        np.testing.assert_array_equal(a, b)


def test_greedy_evaluation_sees_the_normalised_observations(trained):
    """The statistics travel with the parameters: a policy evaluated with them zeroed acts differently."""
    algo, _, state = trained
    key = jax.random.PRNGKey(0)
    with_stats = algo.evaluate(state.params, key, 4)["eval_return"]
    params = dict(state.params, obs_norm=jax.tree.map(jnp.zeros_like, state.params["obs_norm"]))
    assert not np.allclose(with_stats, algo.evaluate(params, key, 4)["eval_return"])


@pytest.mark.parametrize("gae_values", ["rollout", "current"])
def test_updated_obs_stats_train_on_the_inputs_the_next_rollout_sees(gae_values):
    """normalize.obs_stats: with "rollout", the first minibatch of an update sees the inputs the rollout acted on,
    so its policy ratio is 1 (approx_kl 0); with "updated", the observations are normalised again by statistics
    that now hold the rollout's own (the first update's move from no statistics to Pendulum's), so the ratio
    moves before any gradient step. The statistics themselves are the same either way (to float rounding: the
    two programs may sum in another order)."""
    single = {"optim.num_epochs": 1, "optim.num_minibatches": 1, "normalize.reward": False,
              "returns.gae_values": gae_values}
    runs = {}
    for obs_stats in ("rollout", "updated"):
        algo, hp, state = build(pendulum(**single, **{"normalize.obs_stats": obs_stats}), num_seeds=1)
        runs[obs_stats] = algo.run_chunk(state, hp, 1)
    (rollout, m_rollout), (updated, m_updated) = runs["rollout"], runs["updated"]
    # (exactly 0 here; a freshly initialised policy's ratio moves little: ~1e-5)
    assert float(np.max(m_rollout["approx_kl"])) < 1e-9
    assert float(np.min(m_updated["approx_kl"])) > 1e-6
    for a, b in zip(jax.tree.leaves(rollout.params["obs_norm"]), jax.tree.leaves(updated.params["obs_norm"])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
