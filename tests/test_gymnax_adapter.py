"""gymnax 1.x environments through `envs.make("gymnax", env_id=...)`: the same episodes as gymnax's own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from helpers import gymnax_parity

import gymnax  # the `dev` extra installs it: a missing reference is a failure, not a skip

# Left out of the parity run, each for a reason outside the adapter:
NOT_COMPARED = {
    "MNISTBandit-bsuite": "downloads MNIST on construction (no network in CI)",
    "BernoulliBandit-misc": "gymnax's own vmapped `step` fails on it (lax.select of an int32 and a float32)",
}
# bsuite's DeepSea keeps two counters across episodes in its state; under envs.AutoReset they restart with
# each episode (documented in FromGymnax). Observations, rewards and flags are still compared.
IGNORED_STATE = {"DeepSea-bsuite": ("total_bad_episodes", "denoised_return")}


# Every id goes through the same adapter code (`GymnaxStyle`): the whole-episode parity runs on one env of each
# kind the adapter tells apart (vector, image or index observations; discrete, 1-D or 2-D continuous actions;
# gymnax's own info entries; termination, time limits, state kept across episodes), the others are checked for
# what the adapter makes of them (spaces, flattened observations, step outputs) without compiling their games.
PARITY = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0", "SpaceInvaders-MinAtar",
          "Catch-bsuite", "DeepSea-bsuite", "SimpleBandit-bsuite", "Reacher-misc", "FrozenLake-misc"]
SHAPES_ONLY = [e for e in gymnax.registered_envs if e not in NOT_COMPARED and e not in PARITY]


@pytest.mark.parametrize("env_id", PARITY)
def test_same_episodes_as_gymnax(env_id):
    """Whole episodes with auto-reset, a time limit of 30 steps so that truncation happens everywhere."""
    ref, ref_params = gymnax.make(env_id)
    ours = envs.make("gymnax", env_id=env_id, params={"max_steps_in_episode": 30})
    assert ours.max_episode_steps == 30 and ours.name == f"gymnax-{env_id}"
    counts = gymnax_parity(ours, ref, ours.default_params, num_envs=8, num_steps=75,
                           ignore_state_fields=IGNORED_STATE.get(env_id, ()))
    # Episodes ended and restarted: each of the 8 envs ends one at least every 30 steps, so twice in 75.
    assert counts["terminated"] + counts["truncated"] >= 8 * 2, counts


def test_every_other_environment_goes_through_the_adapter():
    """The other ids: gymnax's spaces converted, and a step's outputs (traced, nothing compiled) those of gymnax's
    step, flattened to float32."""
    assert len(SHAPES_ONLY) + len(PARITY) + len(NOT_COMPARED) == len(gymnax.registered_envs)
    for env_id in SHAPES_ONLY:
        ref, _ = gymnax.make(env_id)
        ours = envs.make("gymnax", env_id=env_id, params={"max_steps_in_episode": 30})
        params = ours.default_params
        assert ours.max_episode_steps == 30 and ours.name == f"gymnax-{env_id}"
        ref_space, space = ref.action_space(params), ours.action_space()
        assert (space.n == ref_space.n) if hasattr(ref_space, "n") else (space.shape == ref_space.shape), env_id

        def both(key):
            _, state = ours.reset(key)
            action = space.sample(key)
            return ours.step(key, state, action), ref.step_env(key, state, action, params)

        (obs, _, reward, done, info), (ref_obs, _, ref_reward, _, _) = jax.eval_shape(both, jax.random.PRNGKey(0))
        assert obs.shape == (ours.obs_dim,) == (np.prod(ref_obs.shape, dtype=int),) and obs.dtype == jnp.float32
        assert reward.shape == ref_reward.shape == done.shape == () and {"terminated", "truncated"} <= set(info)


def test_spaces_are_converted():
    breakout = envs.make("gymnax", env_id="Breakout-MinAtar")
    assert breakout.obs_dim == 10 * 10 * 4 and breakout.num_actions == 3
    pendulum = envs.make("gymnax", env_id="Pendulum-v1")
    space = pendulum.action_space()
    assert isinstance(space, envs.Box) and space.shape == (1,)
    np.testing.assert_array_equal(space.low, [-2.0])
    np.testing.assert_array_equal(space.high, [2.0])
    assert pendulum.max_episode_steps == 200 and pendulum.obs_dim == 3


def test_terminal_steps_are_never_truncated():
    """CartPole falling on the time limit's step: terminated, not truncated (no bootstrap from it)."""
    env = envs.make("gymnax", env_id="CartPole-v1", params={"max_steps_in_episode": 1})
    _, state = env.reset(jax.random.PRNGKey(0))
    state = state.replace(theta=jnp.float32(0.3))  # beyond the 12 degree threshold after one step
    _, _, _, done, info = env.step(jax.random.PRNGKey(1), state, jnp.int32(0))
    assert bool(done) and bool(info["terminated"]) and not bool(info["truncated"])
    _, state = env.reset(jax.random.PRNGKey(0))
    _, _, _, done, info = env.step(jax.random.PRNGKey(1), state, jnp.int32(0))
    assert bool(done) and bool(info["truncated"]) and not bool(info["terminated"])


def test_bad_names_are_clear():
    with pytest.raises(ValueError, match="unknown gymnax environment 'Acrobot-v2'. Did you mean 'Acrobot-v1'"):
        envs.make("gymnax", env_id="Acrobot-v2")
    with pytest.raises(ValueError, match="no env params \\['max_step'\\]"):
        envs.make("gymnax", env_id="Acrobot-v1", params={"max_step": 10})


def test_an_environment_object_with_gymnax_api_goes_through_unchanged():
    """A third-party env written against gymnax's API (here a subclass defined outside gymnax's registry)
    goes through `FromGymnax(env)` as registered ids do."""
    from gymnax.environments.classic_control.cartpole import CartPole

    class LongerCartPole(CartPole):  # another library's env: gymnax's API, not in gymnax's registry
        @property
        def default_params(self):
            return super().default_params.replace(max_steps_in_episode=40)

    ours = envs.adapters.FromGymnax(LongerCartPole())
    assert ours.max_episode_steps == 40 and ours.name == "gymnax-LongerCartPole"
    ref = LongerCartPole()
    counts = gymnax_parity(ours, ref, ref.default_params, num_envs=4, num_steps=60)
    assert counts["terminated"] + counts["truncated"] >= 4
