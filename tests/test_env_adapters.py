"""The dict-keyed view of our multi-agent envs and the jaxmarl adapter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.adapters import DictAgents, FromJaxMARL

# The jaxmarl tests import jaxmarl through the adapter: the `dev` extra installs it, so a missing jaxmarl is a
# failure, not a skip (imported there, not here: it takes seconds, which every test worker would pay).


def test_dict_view_of_smax():
    env = DictAgents(envs.make("smax", scenario="3m"), world_state=True)
    assert env.agents == ["ally_0", "ally_1", "ally_2"] and env.num_agents == 3
    obs, state = jax.jit(env.reset)(jax.random.PRNGKey(0))  # jitted: eager calls compile each primitive separately
    assert set(obs) == {"ally_0", "ally_1", "ally_2", "world_state"}
    assert obs["ally_1"].shape == (75,) and obs["world_state"].shape == (72,)
    avail = jax.jit(env.get_avail_actions)(state)
    assert avail["ally_0"].shape == (8,) and bool(avail["ally_0"][4])
    actions = {agent: jnp.int32(4) for agent in env.agents}
    obs, state, reward, done, info = jax.jit(env.step)(jax.random.PRNGKey(1), state, actions)
    assert set(reward) == set(env.agents) and set(done) == set(env.agents) | {"__all__"}
    assert done["__all__"].shape == () and "won" in info
    assert env.action_space("ally_0").n == 8 and env.observation_space("ally_0").shape == (75,)


def test_dict_view_needs_one_name_per_agent():
    with pytest.raises(ValueError, match="2 agent names for 3 agents"):
        DictAgents(envs.make("smax", scenario="3m"), agents=["a", "b"])


def test_jaxmarl_mpe_in_the_array_first_api():
    base = envs.make("jaxmarl", env_id="MPE_simple_spread_v3")
    assert isinstance(base, FromJaxMARL)
    assert (base.num_agents, base.obs_dim, base.num_actions) == (3, 18, 5)
    assert not base.has_action_masks and base.state_dim == 3 * 18
    env = envs.EpisodeStatistics(envs.AutoReset(base))
    num_envs, num_steps = 4, 60
    _, state = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), num_envs))

    def body(state, key):
        act_key, step_key = jax.random.split(key)
        mask = jax.vmap(env.avail_actions)(state)
        actions = jax.random.randint(act_key, (num_envs, 3), 0, 5)
        obs, state, reward, done, info = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state, actions)
        return state, (obs, reward, done, info["returned_episode"], info["episode_length"], info["truncated"],
                       mask, jax.vmap(env.global_state)(state))

    _, (obs, reward, done, ended, length, truncated, mask, gstate) = jax.jit(
        lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.PRNGKey(1), num_steps)))(state)
    assert obs.shape == (num_steps, num_envs, 3, 18) and reward.shape == (num_steps, num_envs, 3)
    assert done.dtype == jnp.bool_ and mask.shape == (num_steps, num_envs, 3, 5) and bool(mask.all())
    assert gstate.shape == (num_steps, num_envs, 54)
    ended = np.asarray(ended)
    # jaxmarl's MPE ends an episode after max_steps + 1 = 26 steps: a time limit, so truncated.
    assert ended.sum(0).tolist() == [2] * num_envs
    assert np.all(np.asarray(length)[ended] == 26) and np.all(np.asarray(truncated)[ended])


def test_jaxmarl_smax_through_the_adapter_has_masks_and_wins():
    from envs.smax.parity import reference_env
    env = reference_env("3m")
    ours = envs.make("smax", scenario="3m")
    assert (env.num_agents, env.obs_dim, env.num_actions, env.state_dim) == (3, ours.obs_dim, 8, ours.state_dim)
    assert env.has_action_masks
    obs, state = env.reset(jax.random.PRNGKey(0))
    assert env.avail_actions(state).shape == (3, 8)
    _, _, reward, done, info = jax.jit(env.step)(jax.random.PRNGKey(1), state, jnp.array([4, 4, 4]))
    assert reward.shape == (3,) and set(info) == {"won", "terminated", "truncated", "episode_over"}


@pytest.mark.optimized  # trains for a while: runs faster optimised
def test_mappo_trains_on_a_jaxmarl_mpe_task_through_the_adapter(tmp_path):
    """Any env of the array-first multi-agent API trains: here jaxmarl's MPE simple spread (no action
    masks, a time limit, global state through the adapter), with a centralised critic."""
    from jaxrl import algos, train

    config = algos.default_config("ppo")
    config.experiment = "mpe_spread_mappo"
    config.env.name = "jaxmarl"
    config.env.kwargs = {"env_id": "MPE_simple_spread_v3"}
    config.total_steps, config.num_envs, config.num_steps = 100 * 16 * 128, 16, 128
    config.network.critic_input = "global_state"
    config.optim.learning_rate = 1e-3
    config.network.hidden_sizes = (64, 64)
    config.log.every_steps, config.log.progress_bar = 20 * 16 * 128, False
    config.checkpoint.every_steps = config.total_steps
    config.eval.episodes = 8
    config.lock()
    rows = train.run(config, str(tmp_path / "run")).metrics
    first, last = rows[0], rows[-1]
    assert last["env_steps"] == 100 * 16 * 128 and "win_rate" not in last
    assert last["episode_length"] == 26  # jaxmarl's MPE time limit (25 steps after the reset step)
    # Spreading out over the landmarks: the (negative) return improves.
    assert last["episode_return"] > first["episode_return"] + 2.5, (first["episode_return"], last["episode_return"])
