"""GRPO on environments: group rollouts from identical starts, masks after episode ends, advantages per
episode or per step, estimator and loss parts switched from the config."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import advantages, algos, mesh as mesh_lib
from jaxrl.algos import grpo
from jaxrl.loops import CHUNK, trim_lengths
from helpers import build, small_grpo_config


# Built (and compiled) once for the tests that read them: (algorithm, hyperparameters, initial state, the
# trajectory of the first update [S, T, N, A, ...])
def built_with_trajectory(config):
    algo, hp, state = build(config)
    return algo, hp, state, jax.device_get(algo.parts.sample_trajectory(state))


@pytest.fixture(scope="module")
def cartpole():  # a 200-step cap: untrained CartPole episodes all end far sooner
    return built_with_trajectory(small_grpo_config(num_steps=200))


@pytest.fixture(scope="module")
def smax():
    return built_with_trajectory(small_grpo_config("smax_grpo", "3m", num_steps=100))


@pytest.mark.parametrize("env", ["cartpole", "smax"])
def test_group_members_start_identically_and_then_diverge(env, request):
    algo, _, _, traj = request.getfixturevalue(env)  # leaves [S, T, N, A, ...]
    G, N = algo.settings.group_size, algo.settings.num_envs
    obs = traj.actor_in[0]  # [T, N, A, d]
    groups = obs.reshape(obs.shape[0], N // G, G, *obs.shape[2:])
    # Same start state within a group, different start states across groups.
    np.testing.assert_array_equal(groups[0], np.broadcast_to(groups[0][:, :1], groups[0].shape))
    assert not np.allclose(groups[0][0], groups[0][1])
    # Different action noise: the members' actions and later observations differ.
    actions = traj.action[0].reshape(-1, N // G, G, algo.parts.num_agents)
    assert (actions != actions[:, :, :1]).any()
    t = int(traj.running[0, :, :, 0].sum(0).min()) - 1  # the last step every episode takes
    assert t > 0 and not np.allclose(groups[t][:, :1], groups[t])


def test_steps_after_an_episode_ends_are_masked(cartpole):
    traj = cartpole[3]
    running, reward, acting = traj.running[0, :, :, 0], traj.reward[0, :, :, 0], traj.acting[0, :, :, 0]
    lengths = running.sum(0)
    assert (lengths < 200).all(), "an untrained CartPole policy ends its episodes within 200 steps"
    for env in range(running.shape[1]):  # running is 1 for a prefix of steps, then 0 for good
        L = int(lengths[env])
        assert running[:L, env].all() and not running[L:, env].any()
    np.testing.assert_array_equal(reward, running)  # CartPole pays 1 per step while the episode runs
    np.testing.assert_array_equal(acting, running)


def test_the_rollout_stops_once_every_episode_ended_and_trains_as_the_full_one(cartpole, monkeypatch):
    """With a 200-step cap, untrained CartPole episodes all end far sooner: the steps after the chunk in which
    the last one ended are not computed (zeros), and the updates equal those of a rollout that computes all
    200 steps."""
    algo, hp, state, traj = cartpole
    last = int(traj.running[0, :, :, 0].sum(0).max())  # steps of the longest episode
    assert last < 200 - 2 * CHUNK
    assert not np.asarray(traj.actor_in[0, last + CHUNK:]).any()  # no step taken past its chunk
    assert np.asarray(traj.actor_in[0, last - 1]).any()
    before = jax.tree.leaves(state.params)[0].copy()
    early, metrics = algo.run_chunk(state, hp, 2)
    # (the default estimator and loss train: finite metrics, moved parameters, no value loss without a critic)
    assert all(np.isfinite(value).all() for value in jax.device_get(metrics).values()) and "value_loss" not in metrics
    assert not np.allclose(before, jax.tree.leaves(early.params)[0])

    full_scan = lambda step, carry, xs, finished, unroll=1: jax.lax.scan(step, carry, xs, unroll=unroll)  # noqa: E731
    monkeypatch.setattr(grpo, "scan_until", full_scan)
    algo, hp, state = build(small_grpo_config(num_steps=200))
    full_traj = jax.device_get(algo.parts.sample_trajectory(state))
    assert np.asarray(full_traj.actor_in[0, -1]).any()  # (every step computed)
    full, _ = algo.run_chunk(state, hp, 2)
    # Two programs: XLA may sum the same gradients in another order (the bias gradients are products, ones @ dy,
    # whose kernels it fuses differently): equal to float rounding, where a lost or extra step would move them
    # by orders of magnitude more.
    for a, b in zip(jax.tree.leaves(early.params), jax.tree.leaves(full.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_learning_covers_the_longest_episode_only_and_equals_learning_over_every_step(cartpole, monkeypatch):
    """With a 200-step cap and untrained CartPole episodes far shorter, the update learns from the first 56 or
    104 steps (`trim_lengths(200)`): the parameters equal those of an update over all 200 (the steps past the
    longest episode are masked out of every loss term), and the metrics say which length ran."""
    config = small_grpo_config(num_steps=200, **{"loss.aggregate": "constant"})  # divides by 200 either way
    algo, hp, state = build(config)
    traj = cartpole[3]  # (the same first rollout: the loss's aggregation changes neither the start nor the rollout)
    longest = int(traj.running[0, :, :, 0].sum(0).max())
    trimmed, metrics = algo.run_chunk(state, hp, 1)
    learned = int(metrics["learned_steps"][0])
    assert learned < 200 and learned == min(L for L in trim_lengths(200) if L >= longest)

    monkeypatch.setattr(grpo, "trim_lengths", lambda T: (T,))
    algo, hp, state = build(config)
    full, metrics = algo.run_chunk(state, hp, 1)
    assert int(metrics["learned_steps"][0]) == 200
    for a, b in zip(jax.tree.leaves(trimmed.params), jax.tree.leaves(full.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_smax_agents_stop_acting_when_they_die(smax):
    traj = smax[3]
    running, acting = traj.running[0], traj.acting[0]  # [T, N, A]
    assert (acting <= running).all()
    assert ((running - acting).sum(0) > 0).any(), "some agent should die before its battle ends"
    # A dead agent never acts again.
    became_idle = (running > 0) & (acting == 0)
    first_idle = np.argmax(became_idle, axis=0)
    for n, a in zip(*np.nonzero(became_idle.any(0))):
        assert not acting[first_idle[n, a]:, n, a].any()


@pytest.mark.parametrize("returns", ["episode", "to_go"])
def test_advantages_follow_the_estimator(returns, cartpole):
    algo, hp, _, traj = cartpole  # (group.returns changes what is made of the rollout, not the rollout)
    parts = dataclasses.replace(algo.parts, settings=dataclasses.replace(algo.parts.settings, returns=returns))
    one_seed = jax.tree.map(lambda x: x[0], traj)
    fn = jax.jit(jax.shard_map(lambda t: parts.advantages(t, hp),
                               mesh=algo.mesh, in_specs=jax.sharding.PartitionSpec(None, "data"),
                               out_specs=jax.sharding.PartitionSpec(), check_vma=False))
    adv, weight, returns_to_go, _ = jax.device_get(fn(one_seed))
    running = np.asarray(one_seed.running)[..., 0]  # [T, N]
    G = algo.settings.group_size
    if returns == "episode":
        episode_return = running.sum(0).reshape(-1, G)
        expected = (episode_return - episode_return.mean(1, keepdims=True)) / (
            episode_return.std(1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(adv[0, :, 0], expected.reshape(-1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(adv[:, :, 0] * running, np.broadcast_to(adv[0, :, 0], running.shape) * running)
    else:
        expected = advantages.stepwise_group_advantages(
            "grpo", np.asarray(returns_to_go)[..., 0].T.reshape(-1, G, running.shape[0]),
            running.T.reshape(-1, G, running.shape[0]) > 0).advantages
        np.testing.assert_allclose(adv[:, :, 0], np.asarray(expected).reshape(-1, running.shape[0]).T,
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(weight[..., 0], running)  # steps after the end carry no gradient


# (experiment and its argument, config keys). The estimators and losses see rewards and masks, not the env, so
# the choices train on CartPole (a SMAX chunk compiles about four times as long); per-agent advantages on SMAX
# 3m's three agents. Each line is one compiled program: an estimator and loss parts that take separate code paths
# share one (the default, grpo with the token ratio and aggregation, trains in the rollout tests above).
CARTPOLE, SMAX_3M = ("cartpole_grpo", None), ("smax_grpo", "3m")
ESTIMATOR_AND_LOSS_CHOICES = [
    (CARTPOLE, {"advantage.estimator": "dr_grpo", "loss.aggregate": "constant"}),
    (CARTPOLE, {"advantage.estimator": "rloo", "loss.aggregate": "sequence", "loss.clip_high": 0.28,
                "loss.dual_clip": 3.0, "advantage.scale": "batch"}),
    (CARTPOLE, {"advantage.estimator": "median", "group.size": 5, "num_envs": 10}),
    (CARTPOLE, {"advantage.estimator": "calibrated", "advantage.max_reward": 2.0, "loss.ratio": "sequence",
                "loss.clip_low": 3e-4, "loss.clip_high": 4e-4}),
    (SMAX_3M, {"advantage.estimator": "per_agent"}),
    (CARTPOLE, {"advantage.estimator": "grpo", "group.returns": "to_go", "loss.critic_weight": 0.5}),
]


@pytest.mark.parametrize("experiment,choice", ESTIMATOR_AND_LOSS_CHOICES,
                         ids=["-".join(f"{v}" for v in choice.values()) for _, choice in ESTIMATOR_AND_LOSS_CHOICES])
def test_every_estimator_and_loss_part_trains_from_one_config_line(experiment, choice):
    config = small_grpo_config(*experiment, num_steps=32, **choice)
    if config.num_envs == 10:
        config.total_steps = 10 * 32 * 4
    algo, hp, state = build(config)
    before = jax.tree.leaves(state.params)[0].copy()
    state, metrics = algo.run_chunk(state, hp, 2)
    metrics = jax.device_get(metrics)
    for key, value in metrics.items():
        assert np.isfinite(value).all(), (key, value)
    assert "value_loss" in metrics if config.loss.critic_weight else "value_loss" not in metrics
    assert not np.allclose(before, jax.tree.leaves(state.params)[0])


def test_critic_free_network_has_no_value_parameters():
    def params(config):  # (their shapes: nothing compiled)
        return jax.eval_shape(algos.build(config, mesh_lib.make_mesh())[0].init, jax.random.PRNGKey(0)).params
    assert "critic" not in params(small_grpo_config())["params"]
    assert "critic" in params(small_grpo_config(**{"loss.critic_weight": 0.3}))["params"]


@pytest.mark.parametrize("overrides,message", [
    ({"advantage.estimator": "mean_of_means"}, "config.advantage.estimator"),
    ({"group.size": 3}, "group.size"),
    ({"group.returns": "discounted"}, "group.returns"),
    ({"loss.aggregate": "per_batch"}, "loss.aggregate"),
    ({"loss.ratio": "per_word"}, "loss.ratio"),
    ({"loss.dual_clip": 0.5}, "loss.dual_clip"),
    ({"loss.critic_weight": 1.5}, "critic_weight"),
    ({"advantage.scale": "global"}, "advantage.scale"),
])
def test_config_errors_name_the_key(overrides, message):
    config = small_grpo_config(**overrides)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        algos.validate(config)


def test_ppo_only_keys_are_rejected_for_grpo():
    config = small_grpo_config()
    with pytest.raises(AttributeError, match="value_clip"):
        config.loss.value_clip = 0.1
    with pytest.raises(AttributeError, match="gae_lambda"):
        config.returns.gae_lambda = 0.9


def test_the_docs_estimator_example_registers_and_trains():
    import re
    from helpers import ROOT

    readme = open(f"{ROOT}/docs/grpo.md").read()
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "register(" in block)
    try:
        exec(snippet, {})
        result = advantages.get("max_baseline")(jnp.array([[1.0, 3.0, 2.0, 5.0]]),
                                                jnp.array([[True, True, True, False]]))
        np.testing.assert_allclose(result.advantages, [[-2.0, 0.0, -1.0, 0.0]])
        algo, hp, state = build(small_grpo_config(**{"advantage.estimator": "max_baseline"}))
        state, metrics = algo.run_chunk(state, hp, 1)
        assert np.isfinite(jax.device_get(metrics["policy_loss"])).all()
    finally:
        advantages.ESTIMATORS.pop("max_baseline", None)
