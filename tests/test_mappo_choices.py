"""The MAPPO choices that decide how fast SMAX is learnt: whose returns end when an agent dies, which
networks see agent ids, and whether actor and critic clip their gradients apart."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl import algos, config as config_lib, mesh as mesh_lib
from jaxrl.advantages import gae
from jaxrl.algos.ppo import PPOHyperparams
from jaxrl.engine import make_optimizer
from helpers import build, small_smax_config


def _sample(returns_until: str):
    config = small_smax_config("3m", num_envs=16, num_steps=64)
    config.returns.until = returns_until
    algo, _, state = build(config)
    return jax.device_get(jax.tree.map(lambda x: x[0], algo.parts.sample_trajectory(state)))  # [T, N, ...]


def _dead_before_the_end(traj) -> np.ndarray:
    """bool [T, N, A]: the agent is dead (only 'stop' is legal) while its episode goes on past the step (known
    from the next step's `first`, so never true on the last step)."""
    only_stop = traj.mask.sum(-1) == 1
    episode_goes_on = np.concatenate([~traj.first[1:], np.zeros_like(traj.first[:1])], 0)
    return only_stop & episode_goes_on[..., None]


def test_dead_agents_keep_the_team_returns_until_the_episode_ends():
    traj = _sample("episode")
    dead = _dead_before_the_end(traj)
    assert dead.any(), "no agent died before its battle ended: the test needs a longer rollout"
    # done is the episode's end, the same for every agent of an env, also for the dead ones.
    np.testing.assert_array_equal(traj.done, np.broadcast_to(traj.done[..., :1], traj.done.shape))
    assert not traj.done[dead].any()
    # With zero values, gamma = lambda = 1, the target is the sum of the rewards to the episode's end: SMAX
    # pays every agent the team reward, so a dead agent's target equals its living team-mates'.
    zeros = np.zeros_like(traj.reward)
    _, targets = gae(traj.reward, zeros, traj.done, zeros[0], 1.0, 1.0)
    t, n, _ = np.nonzero(dead)
    np.testing.assert_allclose(targets[t, n], np.broadcast_to(targets[t, n, :1], targets[t, n].shape), rtol=1e-5)


def test_agent_done_returns_stop_at_death():
    traj = _sample("agent_done")
    dead = _dead_before_the_end(traj)
    assert dead.any() and traj.done[dead].all()
    zeros = np.zeros_like(traj.reward)
    _, targets = gae(traj.reward, zeros, traj.done, zeros[0], 1.0, 1.0)
    # A dead agent's target is only the reward of its own step: the rest of the battle is cut off.
    np.testing.assert_allclose(targets[dead], traj.reward[dead], rtol=1e-6)


@pytest.mark.parametrize("agent_id, in_actor, in_critic", [
    ("both", True, True), ("critic", False, True), ("actor", True, False), ("none", False, False)])
@pytest.mark.parametrize("critic_input", ["global_state", "obs"])
def test_agent_id_goes_to_the_chosen_networks(agent_id, in_actor, in_critic, critic_input):
    config = small_smax_config(critic_input=critic_input)
    config.network.agent_id = agent_id
    algos.validate(config)
    algo, _ = algos.build(config, mesh_lib.make_mesh())  # nothing compiled: _inputs is all this test reads
    env = algo.parts.policy.agent_env
    obs, env_state = env.reset(jax.random.PRNGKey(0))
    actor_in, critic_in = algo.parts.policy.inputs(obs[None], env.global_state(env_state)[None])
    A = env.num_agents
    critic_base = env.state_dim if critic_input == "global_state" else env.obs_dim
    assert actor_in.shape == (1, A, env.obs_dim + A * in_actor)
    assert critic_in.shape == (1, A, critic_base + A * in_critic)
    if in_critic:
        np.testing.assert_array_equal(critic_in[0, :, critic_base:], np.eye(A))
    np.testing.assert_array_equal(actor_in[0, :, :env.obs_dim], obs)


def test_per_network_clipping_is_two_optimisers():
    """grad_clip="per_network" gives the updates of an Adam per network, each clipping its own norm."""
    params = {"params": {"actor": {"w": jnp.ones((4, 3))}, "critic": {"w": jnp.ones((5,)), "b": jnp.zeros(2)}}}
    scales = {"actor": 3.0, "critic": 50.0}  # the critic's gradient is much larger, as a value loss's often is

    def grads(step):
        keys = jax.random.split(jax.random.PRNGKey(step), 3)
        # The norms change from step to step (Adam is scale-free only for a constant scale).
        return {"params": {
            "actor": {"w": scales["actor"] * (1 + step) * jax.random.normal(keys[0], (4, 3))},
            "critic": {"w": scales["critic"] / (1 + step) * jax.random.normal(keys[1], (5,)),
                       "b": jax.random.normal(keys[2], (2,))}}}

    def run(optimizer, params, part=lambda tree: tree):
        state = optimizer.init(params)
        for step in range(4):
            updates, state = optimizer.update(part(grads(step)), state, params)
            params = optax.apply_updates(params, updates)
        return params

    hp, lr, eps = PPOHyperparams(max_grad_norm=0.25), 1e-2, 1e-5
    per_network = run(make_optimizer(lr, hp.max_grad_norm, eps, "per_network"), params)
    joint = run(make_optimizer(lr, hp.max_grad_norm, eps, "joint"), params)
    for name in ("actor", "critic"):
        alone = run(optax.chain(optax.clip_by_global_norm(0.25), optax.adam(lr, eps=eps)), params["params"][name],
                    lambda tree, name=name: tree["params"][name])
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), per_network["params"][name], alone)
    # Clipping both together lets the critic's norm set the actor's step size: a different result.
    assert not np.allclose(joint["params"]["actor"]["w"], per_network["params"]["actor"]["w"], rtol=1e-3)


@pytest.mark.parametrize("key, value", [("returns.until", "death"), ("optim.grad_clip", "actor"),
                                        ("network.agent_id", "True")])
def test_an_unknown_choice_is_named_before_compiling(key, value):
    config = small_smax_config()
    config_lib.set_value(config, key, value)
    with pytest.raises(ValueError, match=f"config.{key} {value!r}; known"):
        algos.validate(config)
