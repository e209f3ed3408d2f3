"""CartPole-v1 must match gymnax's (1.x) step for step (gymnax is in the `dev` extra)."""

import jax
import jax.numpy as jnp
import numpy as np

import envs

import gymnax  # the `dev` extra installs it: a missing reference is a failure, not a skip


def test_same_observations_rewards_and_dones_as_gymnax():
    ours = envs.make("CartPole-v1")
    ref, ref_params = gymnax.make("CartPole-v1")
    num_envs, num_steps = 64, 300
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    obs, state = jax.vmap(ours.reset)(keys)
    ref_obs, ref_state = jax.vmap(ref.reset_env, (0, None))(keys, ref_params)
    np.testing.assert_array_equal(obs, ref_obs)

    @jax.jit
    def both(state, ref_state, action):
        k = jax.random.split(jax.random.PRNGKey(1), num_envs)
        a = jax.vmap(ours.step)(k, state, action)
        b = jax.vmap(ref.step_env, (0, 0, 0, None))(k, ref_state, action, ref_params)  # done: terminated
        return a, b

    actions = jax.random.bernoulli(jax.random.PRNGKey(2), 0.5, (num_steps, num_envs)).astype(jnp.int32)
    ended = np.zeros(num_envs, bool)
    for t in range(num_steps):
        (obs, state, reward, done, _), (r_obs, ref_state, r_reward, r_done, _) = both(state, ref_state, actions[t])
        live = ~ended  # after an episode ends both keep integrating the same way; compare until then
        np.testing.assert_array_equal(np.asarray(obs)[live], np.asarray(r_obs)[live])
        np.testing.assert_array_equal(np.asarray(reward)[live], np.asarray(r_reward)[live])
        np.testing.assert_array_equal(np.asarray(done)[live], np.asarray(r_done)[live])
        ended |= np.asarray(done)
    assert ended.all(), "random actions end every episode within 300 steps"


def test_time_limit_matches_gymnax():
    ours = envs.make("CartPole-v1")
    ref, ref_params = gymnax.make("CartPole-v1")
    state = envs.classic.CartPoleState(*(jnp.float32(0.0),) * 4, time=jnp.int32(499))
    zero = jnp.float32(0.0)
    ref_state = gymnax.environments.classic_control.cartpole.EnvState(
        time=jnp.int32(499), x=zero, x_dot=zero, theta=zero, theta_dot=zero)
    _, _, _, done, info = ours.step(jax.random.PRNGKey(0), state, jnp.int32(1))
    _, _, _, terminated, truncated, _ = ref.step(jax.random.PRNGKey(0), ref_state, 1, ref_params)  # gymnax 1.x
    assert bool(done) and bool(info["truncated"]) == bool(truncated) is True
    assert bool(info["terminated"]) == bool(terminated) is False
