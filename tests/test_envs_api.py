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


def test_truncation_at_the_time_limit_is_not_termination():
    env = envs.make("CartPole-v1")
    params = env.default_params.replace(max_steps_in_episode=5)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    for t in range(5):
        obs, state, reward, done, info = env.step(jax.random.PRNGKey(t), state, jnp.int32(t % 2), params)
    assert bool(done) and bool(info["truncated"]) and not bool(info["terminated"])
