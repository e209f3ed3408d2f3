import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs


def test_unknown_environment_lists_known_names():
    with pytest.raises(ValueError, match="unknown environment 'CartPole-v2'.*CartPole-v1"):
        envs.make("CartPole-v2")


def test_register_refuses_silent_overwrite():
    with pytest.raises(ValueError, match="already registered"):
        envs.register("CartPole-v1", lambda: None)


def test_cartpole_spaces_and_shapes():
    env = envs.make("CartPole-v1")
    obs, state = env.reset(jax.random.PRNGKey(0))
    assert obs.shape == (4,) and obs.dtype == jnp.float32
    assert env.num_actions == 2 and env.obs_dim == 4
    assert env.avail_actions(state).tolist() == [True, True]
    obs, state, reward, done, info = env.step(jax.random.PRNGKey(1), state, jnp.int32(1))
    assert reward.shape == () and done.shape == ()
    assert set(info) >= {"terminated", "truncated"}


def _run(env, num_steps, action=0, key=0):
    step = jax.jit(env.step)
    obs, state = env.reset(jax.random.PRNGKey(key))
    out = []
    for t in range(num_steps):
        obs, state, reward, done, info = step(jax.random.PRNGKey(100 + t), state, jnp.int32(action))
        out.append((obs, reward, done, info))
    return state, out


def test_auto_reset_starts_a_new_episode_and_keeps_the_final_obs():
    env = envs.AutoReset(envs.make("CartPole-v1"))
    state, out = _run(env, 40)  # always pushing left falls within ~10 steps
    ends = [t for t, (_, _, done, _) in enumerate(out) if done]
    assert ends, "the pole should fall"
    t = ends[0]
    obs, _, _, info = out[t]
    assert np.all(np.abs(obs) <= 0.05), "the obs after an episode end is a fresh reset"
    assert np.abs(info["final_obs"][2]) > envs.make("CartPole-v1").default_params.theta_threshold_radians \
        or np.abs(info["final_obs"][0]) > 2.4


def test_episode_statistics_report_return_and_length_at_episode_end():
    env = envs.EpisodeStatistics(envs.AutoReset(envs.make("CartPole-v1")))
    _, out = _run(env, 60)
    ends = [t for t, (_, _, done, _) in enumerate(out) if done]
    assert len(ends) >= 2
    first, second = ends[0], ends[1]
    assert out[first][3]["returned_episode"]
    assert int(out[first][3]["episode_length"]) == first + 1
    assert float(out[first][3]["episode_return"]) == first + 1.0
    assert int(out[second][3]["episode_length"]) == second - first


def _same_start_batch(env, num_envs: int):
    """num_envs copies of one reset state: with equal actions every episode ends on the same step."""
    return jax.vmap(env.reset)(jnp.stack([jax.random.PRNGKey(0)] * num_envs))[1]


def _batch_steps(env, states, num_steps: int, seed: int = 1):
    """`batch_step` with every env pushing left: [(obs, reward, done, info)] per step, and the last states."""
    out = []
    for t in range(num_steps):
        keys = jax.random.split(jax.random.PRNGKey(seed + t), jax.tree.leaves(states)[0].shape[0])
        obs, states, reward, done, info = env.batch_step(keys, states, jnp.zeros(keys.shape[0], jnp.int32))
        out.append((obs, reward, done, info))
    return out, states


@pytest.mark.parametrize("wrap_statistics", [False, True])
def test_reset_ratio_gives_each_ended_env_its_own_restart_up_to_the_budget_then_shares_them(wrap_statistics):
    # 8 envs end together; with reset_ratio 4 only 2 restarts are computed: envs 0 and 1 get exactly what
    # AutoReset gives each env alone, envs 2..7 copies of restart (j mod 2); everything else is unchanged
    def wrapped(ratio):
        env = envs.AutoReset(envs.make("CartPole-v1"), reset_ratio=ratio)
        return envs.EpisodeStatistics(env) if wrap_statistics else env

    exact, budgeted = wrapped(1), wrapped(4)
    start = _same_start_batch(exact, 8)
    want, _ = _batch_steps(exact, start, 30)
    got, _ = _batch_steps(budgeted, start, 30)
    ends = [t for t, (_, _, done, _) in enumerate(want) if done.all()]
    assert ends and all(not want[t][2].any() for t in range(ends[0])), "all 8 episodes should end together"
    t = ends[0]
    for (w_obs, w_reward, w_done, w_info), (g_obs, g_reward, g_done, g_info) in zip(want[:t + 1], got[:t + 1]):
        np.testing.assert_array_equal(g_reward, w_reward)
        np.testing.assert_array_equal(g_done, w_done)
        np.testing.assert_array_equal(g_info["final_obs"], w_info["final_obs"])
    w_obs, g_obs = want[t][0], got[t][0]
    np.testing.assert_array_equal(g_obs[:2], w_obs[:2])
    np.testing.assert_array_equal(g_obs[2:], w_obs[np.arange(2, 8) % 2])
    assert not np.array_equal(w_obs[0], w_obs[1]), "the restarts come from different keys"
    if wrap_statistics:
        np.testing.assert_array_equal(got[t][3]["episode_length"], np.full(8, t + 1))


def test_reset_ratio_is_checked():
    with pytest.raises(ValueError, match="reset_ratio must be an integer >= 1"):
        envs.AutoReset(envs.make("CartPole-v1"), reset_ratio=0)


def test_truncation_at_the_time_limit_is_not_termination():
    env = envs.make("CartPole-v1")
    params = env.default_params.replace(max_steps_in_episode=5)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    for t in range(5):
        obs, state, reward, done, info = env.step(jax.random.PRNGKey(t), state, jnp.int32(t % 2), params)
    assert bool(done) and bool(info["truncated"]) and not bool(info["terminated"])


def test_ppo_rollouts_follow_env_reset_ratio():
    # 64 CartPole envs with reset_ratio 64: one restart per step. The rollout equals the exact one up to the
    # first step on which two episodes ended together, and differs from there (two envs share a restart).
    from helpers import build, load_experiment, set_keys

    def trajectory(ratio):
        config = set_keys(load_experiment("cartpole_ppo"), {
            "num_envs": 64, "num_steps": 64, "total_steps": 64 * 64, "env.reset_ratio": ratio})
        algo, _, state = build(config)
        assert algo.parts.env.env.reset_ratio == ratio
        return jax.device_get(algo.parts.sample_trajectory(state))

    exact, shared = trajectory(1), trajectory(64)
    ended_per_step = exact.first[0, 1:].sum(-1)  # [T - 1]: envs whose episode ended on step t
    t = int(np.argmax(ended_per_step >= 2))
    assert ended_per_step[t] >= 2, "some step should end two episodes"
    np.testing.assert_array_equal(shared.actor_in[0, :t + 1], exact.actor_in[0, :t + 1])
    assert not np.array_equal(shared.actor_in[0, t + 1], exact.actor_in[0, t + 1])
