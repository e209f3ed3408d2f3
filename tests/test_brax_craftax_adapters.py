"""Brax and Craftax through `envs.make`: the same episodes as the libraries' own auto-resetting envs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from helpers import auto_reset_parity

from brax import envs as brax_envs  # the `dev` extra installs both: a missing reference is a failure
from craftax.craftax_env import make_craftax_env_from_name


def test_brax_episodes_match_brax_create(env_name="inverted_pendulum", backend="generalized"):
    """Brax's own `envs.create` (EpisodeWrapper + AutoResetWrapper) and `envs.AutoReset(FromBrax)`: the same
    observations, rewards, done and truncation flags, through time limits (25 physics steps, action repeat 2:
    13 env steps) and restarts, with the same random actions. Both run their own states (Brax steps take no
    key), so a last-bit difference may grow over an episode: compared to 1e-4."""
    length, repeat, num_envs, num_steps = 25, 2, 4, 40
    ours = envs.AutoReset(envs.make("brax", env_name=env_name, backend=backend, episode_length=length,
                                    action_repeat=repeat))
    ref = brax_envs.create(env_name, episode_length=length, action_repeat=repeat, auto_reset=True, backend=backend)
    assert ours.max_episode_steps == 13 and ours.action_space().shape == (ref.action_size,)
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    actions = jax.random.uniform(jax.random.PRNGKey(1), (num_steps, num_envs, ref.action_size), minval=-1, maxval=1)

    @jax.jit
    def run():
        obs, state = jax.vmap(ours.reset)(keys)
        ref_state = jax.vmap(ref.reset)(keys)

        def step(c, action):
            state, ref_state = c
            obs, state, reward, done, info = jax.vmap(ours.step)(keys, state, action)
            ref_state = jax.vmap(ref.step)(ref_state, action)
            theirs = (ref_state.obs, ref_state.reward, ref_state.done > 0, ref_state.info["truncation"] > 0)
            return (state, ref_state), ((obs, reward, done, info["truncated"]), theirs)
        return obs, ref_state.obs, jax.lax.scan(step, (state, ref_state), actions)[1]

    obs, ref_obs, (mine, theirs) = jax.device_get(run())
    np.testing.assert_array_equal(obs, ref_obs)
    for name, a, b in zip(("obs", "reward", "done", "truncated"), mine, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
    assert mine[2].sum(0).min() >= 3  # every env's episodes ended (the pole fell, or the limit) and restarted


def test_craftax_classic_episodes_match_craftax():
    ours = envs.make("craftax", env_id="Craftax-Classic-Symbolic-v1", params={"max_timesteps": 20})
    assert (ours.obs_dim, ours.num_actions, ours.max_episode_steps) == (1345, 17, 20)
    assert "Achievements/collect_wood" in ours.episode_info_keys and "score" in ours.episode_info_keys
    ref = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=True)
    params = ours.default_params

    def ref_step(key, state, action):
        obs, state, reward, done, info = ref.step(key, state, action, params)
        return {"obs": obs, "reward": reward, "done": done}, state

    counts = auto_reset_parity(ours, lambda key: ref.reset(key, params), ref_step, num_envs=2, num_steps=45)
    assert counts["truncated"] >= 4  # the 20-step limit cut episodes (and they restarted)


def test_craftax_death_is_terminal_and_the_time_limit_is_not():
    env = envs.make("craftax", env_id="Craftax-Classic-Symbolic-v1", params={"max_timesteps": 5})
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    _, state = reset(jax.random.PRNGKey(0))
    for t in range(5):
        _, state, _, done, info = step(jax.random.PRNGKey(t), state, jnp.int32(0))
    assert bool(done) and bool(info["truncated"]) and not bool(info["terminated"])
    assert float(info["Achievements/collect_wood"]) in (0.0, 100.0)
    _, state = reset(jax.random.PRNGKey(0))
    dead = state.replace(player_health=jnp.zeros_like(state.player_health))
    _, _, _, done, info = step(jax.random.PRNGKey(1), dead, jnp.int32(0))
    assert bool(done) and bool(info["terminated"]) and not bool(info["truncated"])


# Craftax-Classic through PPO's rollout and through `engine.acting`'s (PQN here; DQN, QMIX and SAC act through it
# too): both sum the episode statistics with `EnvPolicy.episode_sums`, the env's achievements included.
CRAFTAX_LEARNERS = {
    "ppo": ("craftax_ppo", "classic", {"env.kwargs.params": {"max_timesteps": 8}}),
    "pqn": ("cartpole_pqn", None, {"env.name": "craftax", "env.kwargs": {"env_id": "Craftax-Classic-Symbolic-v1",
                                                                         "params": {"max_timesteps": 8}}}),
}


@pytest.mark.parametrize("learner", sorted(CRAFTAX_LEARNERS))
def test_learners_log_the_achievements_of_craftax_episodes(learner):
    from helpers import build, load_experiment, set_keys
    from jaxrl import metrics

    experiment, arg, env_keys = CRAFTAX_LEARNERS[learner]
    config = load_experiment(experiment, arg)
    config.unlock()
    set_keys(config, {**env_keys, "num_envs": 4, "num_steps": 16, "total_steps": 4 * 16 * 2,
                      "optim.num_minibatches": 2, "network.hidden_sizes": (32,)})
    algo, hp, state = build(config)
    _, chunk_metrics = algo.run_chunk(state, hp, 2)
    row = metrics.summarize(jax.device_get(chunk_metrics))
    assert row["episodes"] == 4 * 16 * 2 / 8  # every episode cut at 8 steps
    achievements = [k for k in row if k.startswith("Achievements/")]
    assert len(achievements) == 22 and "score" in row
    # Each achievement: the percentage of the 8 episodes that unlocked it (a multiple of 12.5 in [0, 100])
    shares = np.array([row[k] for k in achievements]) * row["episodes"] / 100
    np.testing.assert_allclose(shares, np.clip(np.round(shares), 0, row["episodes"]), atol=1e-4)


def test_ppo_trains_on_a_brax_env_with_normalised_observations():
    """experiments/brax_ppo.py at a tiny size: Brax's pipeline under the training program (vmapped, in
    shard_map), a tanh-squashed Gaussian, observation statistics; the greedy policy stays up for a while."""
    from helpers import build, load_experiment, set_keys

    config = load_experiment("brax_ppo", "inverted_pendulum")
    config.unlock()
    set_keys(config, {"num_envs": 8, "num_steps": 20, "total_steps": 8 * 20 * 2, "optim.num_minibatches": 4,
                      "network.hidden_sizes": (32, 32)})
    algo, hp, state = build(config)
    state, chunk_metrics = algo.run_chunk(state, hp, 2)
    assert int(chunk_metrics["episodes"][0]) > 8 and np.isfinite(np.asarray(chunk_metrics["entropy"])).all()
    np.testing.assert_array_equal(state.params["obs_norm"]["obs"].count, [2 * 20 * 8])
    assert float(algo.evaluate(state.params, jax.random.PRNGKey(0), 4)["eval_length"][0]) >= 5
