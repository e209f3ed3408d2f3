"""Environments stepped on the host (gymnasium) inside the compiled programs: exactly gymnasium's own episodes,
one callback per batch, a state stepped once, and PPO learning on them, with and without a lag of one update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.adapters.gymnasium import HostEnvs

import gymnasium  # (the dev extra installs it: a missing gymnasium is a failure, not a skip)


def _reference_run(env_id: str, seeds: list[int], actions: np.ndarray, **kwargs) -> dict:
    """gymnasium's own env from the same seeds and actions [T, n], reset in the step that ends an episode."""
    refs = [gymnasium.make(env_id, **kwargs) for _ in seeds]
    first = np.stack([np.ravel(ref.reset(seed=seed)[0]) for ref, seed in zip(refs, seeds)])
    out = {k: [] for k in ("obs", "reward", "done", "truncated", "final_obs")}
    for step_actions in actions:
        row = {k: [] for k in out}
        for ref, action in zip(refs, step_actions):
            obs, reward, terminated, truncated, _ = ref.step(int(action))
            row["final_obs"].append(np.ravel(obs))
            if terminated or truncated:
                obs, _ = ref.reset()
            row["obs"].append(np.ravel(obs))
            row["reward"].append(reward)
            row["done"].append(terminated or truncated)
            row["truncated"].append(truncated and not terminated)
        for k in out:
            out[k].append(np.stack(row[k]))
    return first, {k: np.stack(v) for k, v in out.items()}


def _ours(env_id: str, num_envs: int, actions: np.ndarray, **kwargs):
    """The adapter's auto-resetting envs from keys 0.., stepped with `actions` [T, n] in one compiled scan: (first
    observations, per-step outputs, the seeds gymnasium's envs get, the batch shapes the host was called with)."""
    base = envs.make("gymnasium", env_id=env_id, **kwargs)
    env = envs.AutoReset(base)
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    obs, state = jax.jit(jax.vmap(env.reset))(keys)
    seeds = [HostEnvs._seed(tuple(slot)) for slot in np.asarray(state.slot).tolist()]
    calls = []
    step = base.host.step
    base.host.step = lambda *a: (calls.append(a[0].shape), step(*a))[1]

    def body(state, action):
        obs, state, reward, done, info = jax.vmap(env.step)(jax.random.split(jax.random.PRNGKey(1), num_envs), state,
                                                            action)
        return state, {"obs": obs, "reward": reward, "done": done, "truncated": info["truncated"],
                       "final_obs": info["final_obs"]}

    _, out = jax.device_get(jax.jit(lambda s, a: jax.lax.scan(body, s, a))(state, jnp.asarray(actions)))
    return obs, out, seeds, calls


def test_host_cartpole_gives_gymnasiums_own_episodes_through_auto_reset():
    """The same seeds and actions give gymnasium's observations, rewards, flags and final observations, step for
    step over many episodes (a 30-step time limit truncates some), with one host callback per batched step."""
    num_envs, num_steps = 4, 200
    actions = np.random.default_rng(0).integers(0, 2, (num_steps, num_envs))
    obs, ours, seeds, calls = _ours("CartPole-v1", num_envs, actions, max_episode_steps=30)
    first, theirs = _reference_run("CartPole-v1", seeds, actions, max_episode_steps=30)
    np.testing.assert_allclose(obs, first, rtol=1e-6)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert theirs["truncated"].sum() > 0 and (theirs["done"] & ~theirs["truncated"]).sum() > 0
    assert [shape[:-1] for shape in calls] == [(num_envs,)] * num_steps  # one callback per step of the whole batch


def test_atari_through_ale_py_gives_ales_own_frames():
    """Breakout's RAM observations, rewards and ends, as ale-py's gymnasium env gives them for the same seeds and
    actions (sticky actions included: they draw from the env's own seeded generator); a 60-step limit truncates."""
    num_envs, num_steps = 2, 150
    actions = np.random.default_rng(1).integers(0, 4, (num_steps, num_envs))
    obs, ours, seeds, _ = _ours("ALE/Breakout-v5", num_envs, actions, obs_type="ram", max_episode_steps=60)
    first, theirs = _reference_run("ALE/Breakout-v5", seeds, actions, obs_type="ram", max_episode_steps=60)
    np.testing.assert_array_equal(obs, first)
    for key in theirs:
        np.testing.assert_array_equal(ours[key], np.asarray(theirs[key], ours[key].dtype), err_msg=key)
    assert theirs["truncated"].sum() >= num_envs and theirs["reward"].sum() >= 0


def test_a_state_whose_envs_live_on_the_host_is_stepped_once():
    env = envs.make("gymnasium", env_id="CartPole-v1")
    step = jax.jit(jax.vmap(env.step))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    _, state = jax.jit(jax.vmap(env.reset))(keys)
    actions = jnp.zeros(2, jnp.int32)
    jax.block_until_ready(step(keys, state, actions))
    with pytest.raises(Exception, match="a state whose envs live on the host can be stepped once"):
        jax.block_until_ready(step(keys, state, actions))


def test_ppo_learns_host_cartpole_with_a_lag_of_one_update(tmp_path):
    """PPO on gymnasium's CartPole stepped on the host, each update learning from the rollout of the update before
    (Cleanba's lag-one; on one device here, the same numbers as an actor and a learner device): two seeds in one
    program (one after another on the device) learn, run to run the same, and each update's staleness is 1."""
    from helpers import load_experiment, set_keys
    from jaxrl import train

    config = set_keys(load_experiment("gymnasium_ppo", "CartPole-v1"), {
        "actor.max_staleness": 1, "total_steps": 40_960, "num_seeds": 2, "log.every_steps": 8_192,
        "eval.every_steps": 40_960, "log.progress_bar": False})
    first = train.run(config, str(tmp_path / "first")).metrics
    again = train.run(config, str(tmp_path / "again")).metrics
    assert [r["episode_return"] for r in first] == [r["episode_return"] for r in again]
    assert first[0]["episode_return"] < 40 and first[-1]["eval_return"] > 150, first
    assert first[-1]["staleness"] == 1.0


def test_evaluations_do_not_evict_the_envs_training_steps():
    """Each evaluation resets fresh slots; past the host's capacity the least recently used instances close, never
    the ones a training batch steps every update."""
    host = HostEnvs(lambda: gymnasium.make("CartPole-v1"), 4, keep=4)
    training = np.array([[1, 1], [1, 2]], np.uint32)
    host.reset(training)
    first = host.envs[(1, 1)][0]
    for update in range(20):
        host.reset(np.array([[9, update], [9, 100 + update]], np.uint32))  # an evaluation's envs
        ids = np.concatenate([training, np.full((2, 1), update, np.uint32)], axis=1)
        host.step(ids, np.zeros(2, np.int64))
    assert len(host.envs) <= 8 and host.envs[(1, 1)][0] is first and host.envs[(1, 1)][1] == 20


def test_one_host_env_vmapped_as_several_is_refused():
    env = envs.make("gymnasium", env_id="CartPole-v1")
    _, state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    step = jax.vmap(env.step, in_axes=(0, None, 0))  # one env's state, two actions at once
    with pytest.raises(ValueError, match="a host env's state is vmapped over as one env several times"):
        step(jax.random.split(jax.random.PRNGKey(1), 2), state, jnp.zeros(2, jnp.int32))
