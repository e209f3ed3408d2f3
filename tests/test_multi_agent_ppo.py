"""Multi-agent PPO on SMAX: masking, recurrent resets, the centralised critic, agent ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import build, load_experiment, small_smax_config
from jaxrl import algos, mesh as mesh_lib
from jaxrl.algos import env_policy, env_setup
from jaxrl.loops import CHUNK
from jaxrl.networks import ResetGRU


def recurrent_config():
    """SMAX 2s3z, MAPPO with recurrent networks (the critic on the global state), 64 steps per update."""
    return small_smax_config("2s3z", kind="gru", num_steps=64)


# Built (and compiled) once for the tests that read them: (algorithm, hyperparameters, initial state)
@pytest.fixture(scope="module")
def recurrent():
    return build(recurrent_config())


@pytest.fixture(scope="module")
def feed_forward():  # the same with feed-forward networks, two seeds
    return build(small_smax_config("2s3z", kind="mlp", num_steps=64), num_seeds=2)


def built(config):
    """The algorithm of a validated config, nothing compiled (for what its policy sees)."""
    algos.validate(config)
    return algos.build(config, mesh_lib.make_mesh())[0]


@pytest.mark.parametrize("kind", ["recurrent", "feed_forward"])
def test_sampled_actions_are_always_legal(kind, request):
    algo, hp, state = request.getfixturevalue(kind)
    for _ in range(2):  # untrained, then after an update (logits no longer near uniform)
        traj = jax.device_get(algo.parts.sample_trajectory(state))
        legal = np.take_along_axis(traj.mask, traj.action[..., None], axis=-1)[..., 0]
        assert traj.mask.shape[-2:] == (5, algo.parts.policy.agent_env.num_actions)
        assert legal.all(), f"{(~legal).sum()} illegal actions sampled"
        # Some actions really are forbidden, and stepping resets the episode often enough to matter.
        assert not traj.mask.all() and traj.first[:, 1:].any()
        state, _ = algo.run_chunk(state, hp, 1)


def test_masked_actions_have_zero_probability_and_finite_gradients():
    from jaxrl import distributions
    logits = jax.random.normal(jax.random.PRNGKey(0), (1000, 8)) * 5
    mask = jax.random.bernoulli(jax.random.PRNGKey(1), 0.4, (1000, 8)).at[:, 4].set(True)
    masked = distributions.masked_logits(logits, mask)
    noise = jax.random.gumbel(jax.random.PRNGKey(2), (50, 1000, 8))
    actions = jax.vmap(distributions.sample_with_noise, (None, 0))(masked, noise)
    assert jnp.take_along_axis(jnp.broadcast_to(mask, (50, 1000, 8)), actions[..., None], -1).all()
    probs = jax.nn.softmax(masked)
    assert float(jnp.max(jnp.where(mask, 0.0, probs))) == 0.0
    grad = jax.grad(lambda l: distributions.entropy(distributions.masked_logits(l, mask)).sum())(logits)
    assert jnp.isfinite(grad).all() and float(jnp.abs(jnp.where(mask, 0.0, grad)).max()) == 0.0


def test_gru_state_restarts_where_first_is_set():
    T, B, d, k = 12, 3, 5, 7
    x = jax.random.normal(jax.random.PRNGKey(0), (T, B, d))
    first = jnp.zeros((T, B), bool).at[k, 1].set(True)
    gru = ResetGRU(16)
    h0 = jax.random.normal(jax.random.PRNGKey(2), (B, 16))
    params = gru.init(jax.random.PRNGKey(1), h0, x, first)
    _, out = gru.apply(params, h0, x, first)
    _, fresh = gru.apply(params, jnp.zeros((B, 16)), x[k:], jnp.zeros((T - k, B), bool))
    np.testing.assert_allclose(out[k:, 1], fresh[:, 1], atol=1e-6)  # restarted from zero at step k
    assert not np.allclose(out[k:, 0], fresh[:, 0], atol=1e-3)  # the other sequences carry on


def test_gru_gradients_match_autodiff_of_the_textbook_cell():
    """scan_grus' hand-written backward pass against jax.grad of a plain GRU loop (flax GRUCell's gates)."""
    from jaxrl.networks import scan_grus

    def textbook_step(h, x_proj, restart, w_h, b_hn):
        H = h.shape[-1]
        h = jnp.where(restart[..., None], 0.0, h)
        hp = h @ w_h
        r = jax.nn.sigmoid(x_proj[..., :H] + hp[..., :H])
        z = jax.nn.sigmoid(x_proj[..., H:2 * H] + hp[..., H:2 * H])
        n = jnp.tanh(x_proj[..., 2 * H:] + r * (hp[..., 2 * H:] + b_hn))
        return (1 - z) * n + z * h

    def textbook(hs, x_projs, first, weights):
        def step(hs, inputs):
            x_projs, restart = inputs
            hs = tuple(textbook_step(h, x, restart, *w) for h, x, w in zip(hs, x_projs, weights))
            return hs, hs
        return jax.lax.scan(step, hs, (x_projs, first))

    T, B, H = 9, (4, 3), 8
    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    hs = tuple(jax.random.normal(k, (*B, H)) for k in keys[:2])
    x_projs = tuple(jax.random.normal(k, (T, *B, 3 * H)) for k in keys[2:4])
    first = jax.random.bernoulli(keys[4], 0.2, (T, *B))
    weights = tuple((jax.random.normal(k, (H, 3 * H)) / 3, jax.random.normal(jax.random.fold_in(k, 1), (H,)))
                    for k in keys[5:7])

    def loss(fn):
        def value(hs, x_projs, weights):
            h_last, outs = fn(hs, x_projs, first, weights)
            return sum(jnp.sum(jnp.sin(o) * (i + 1)) for i, o in enumerate(outs)) + sum(jnp.sum(h ** 2) for h in h_last)
        return value

    np.testing.assert_allclose(loss(scan_grus)(hs, x_projs, weights), loss(textbook)(hs, x_projs, weights), rtol=1e-5)
    ours = jax.grad(loss(scan_grus), argnums=(0, 1, 2))(hs, x_projs, weights)
    expected = jax.grad(loss(textbook), argnums=(0, 1, 2))(hs, x_projs, weights)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), ours, expected)


def test_recurrent_rollout_is_replayed_exactly_by_the_loss(recurrent):
    """The update replays each (env, agent) sequence from the hidden state the rollout started with,
    restarting it at episode starts: the rollout's log-probabilities and values are reproduced."""
    algo, hp, state = recurrent
    state, _ = algo.run_chunk(state, hp, 2)  # start mid-episode, with non-zero hidden states
    traj = algo.parts.sample_trajectory(state)
    assert bool(traj.first[0, 1:].any())  # episodes end inside the window
    seed0 = jax.tree.map(lambda x: x[0], (state.params, state.carry, traj))
    params, carry, traj = seed0
    first = jnp.broadcast_to(traj.first[..., None], traj.action.shape)
    network = algo.parts.policy.network
    _, logits, values = network.apply(params, carry, traj.actor_in, traj.critic_in, first)
    from jaxrl import distributions
    log_prob = distributions.log_prob(distributions.masked_logits(logits, traj.mask), traj.action)
    np.testing.assert_allclose(log_prob, traj.log_prob, atol=2e-4)
    np.testing.assert_allclose(values, traj.value, atol=2e-4)
    # Without the restarts the replay would differ: the resets matter.
    _, logits_no_reset, _ = network.apply(params, carry, traj.actor_in, traj.critic_in, jnp.zeros_like(first))
    assert not np.allclose(logits_no_reset, logits, atol=1e-3)


def test_centralised_critic_sees_the_global_state_and_agent_id(recurrent):
    mappo, _, state = recurrent
    env = mappo.parts.policy.agent_env
    obs, env_state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    g = env.global_state(env_state)
    actor_in, critic_in = mappo.parts.policy.inputs(obs[None], g[None])
    A = env.num_agents
    assert critic_in.shape == (1, A, env.state_dim + A)
    for a in range(A):
        np.testing.assert_array_equal(critic_in[0, a, :env.state_dim], g)
        np.testing.assert_array_equal(critic_in[0, a, env.state_dim:], np.eye(A)[a])
        np.testing.assert_array_equal(actor_in[0, a], obs[a])  # the experiment gives agent ids to the critic only
    # The value moves with the global state, the policy does not.
    params = jax.tree.map(lambda x: x[0], state.params)
    carry = mappo.parts.policy.network.initial_carry((1, A))
    first = jnp.ones((1, 1, A), bool)
    changed = critic_in.at[..., 0].add(1.0)
    apply = jax.jit(mappo.parts.policy.network.apply)
    _, l1, v1 = apply(params, carry, actor_in[None], critic_in[None], first)
    _, l2, v2 = apply(params, carry, actor_in[None], changed[None], first)
    np.testing.assert_array_equal(l1, l2)
    assert not np.allclose(v1, v2)

    ippo = built(small_smax_config("2s3z", critic_input="obs"))
    actor_in, critic_in = ippo.parts.policy.inputs(obs[None], None)  # IPPO's critic: the agent's own obs and its id
    np.testing.assert_array_equal(critic_in[..., :env.obs_dim], actor_in)
    np.testing.assert_array_equal(critic_in[0, :, env.obs_dim:], np.eye(A))


def test_agent_id_can_be_turned_off():
    config = small_smax_config()
    config.network.agent_id = "none"
    algo = built(config)
    env = algo.parts.policy.agent_env
    obs, env_state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    actor_in, critic_in = algo.parts.policy.inputs(obs[None], env.global_state(env_state)[None])
    assert actor_in.shape[-1] == env.obs_dim and critic_in.shape[-1] == env.state_dim


@pytest.mark.parametrize("critic_input", ["obs", "global_state"])
def test_one_update_runs_on_every_critic_choice_with_a_feed_forward_network(critic_input, feed_forward):
    # (the recurrent network with either critic input runs in tests/test_golden_runs.py: smax_mappo, smax_ippo)
    if critic_input == "global_state":
        algo, hp, state = feed_forward
    else:
        algo, hp, state = build(small_smax_config("2s3z", critic_input="obs", kind="mlp", num_steps=64), num_seeds=2)
    state, metrics = algo.run_chunk(state, hp, 2)
    metrics = jax.device_get(metrics)
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert np.isfinite(metrics[name]).all(), (critic_input, name)
    assert (metrics["episodes"] > 0).all() and "win_rate_sum" in metrics
    result = jax.device_get(algo.evaluate(state.params, jax.random.PRNGKey(0), 8))
    assert set(result) == {"eval_return", "eval_length", "eval_win_rate"}
    assert result["eval_win_rate"].shape == (2,)
    won = result["eval_win_rate"] * 8  # battles won of the 8 played: a whole number from 0 to 8 per seed
    np.testing.assert_allclose(won, np.clip(np.round(won), 0, 8), atol=1e-5)


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown SMAX scenario"):
        build(load_experiment("smax_mappo", "4m_vs_nothing"))
    config = load_experiment("cartpole_ppo")
    config.network.critic_input = "global_state"
    with pytest.raises(ValueError, match="global state"):
        build(config)
    config.network.critic_input = "everything"
    with pytest.raises(ValueError, match="critic_input"):
        build(config)
    config = small_smax_config()
    config.network.kind = "lstm"
    with pytest.raises(ValueError, match="network.kind"):
        build(config)
    config = small_smax_config("3m", num_envs=6)  # 18 sequences do not split into 4 minibatches
    with pytest.raises(ValueError, match="minibatches"):
        build(config)


def test_episode_states_end_with_the_episode(recurrent):
    algo, _, state = recurrent
    params = jax.tree.map(lambda x: x[0], state.params)
    states = algo.parts.policy.episode_states(params, jax.random.PRNGKey(3))
    assert 2 <= len(states) <= algo.parts.policy.eval_max_steps + 1
    assert int(states[-1].time) == len(states) - 1
    from envs import rendering
    frames = rendering.render_frames(algo.parts.policy.agent_env, states[:3])
    assert len(frames) == 3 and frames[0].size[0] > 100


def test_evaluation_stops_with_the_last_episode_and_reports_what_the_full_one_does(recurrent, monkeypatch):
    """Greedy evaluation computes no steps once every episode has ended (`scan_until`: the trace's steps not
    taken are zeros); its figures are those of evaluating all `eval_max_steps` steps."""
    key = jax.random.PRNGKey(5)
    algo, _, state = recurrent

    def evaluation(policy):  # (the env time of each step of one episode's trace [T], figures of 16 episodes)
        one_seed = jax.tree.map(lambda x: x[0], state.params)
        _, states, running = jax.device_get(policy._episode_trace(one_seed, key, False))
        return np.asarray(states.time[:, 0]), int(running.sum()), jax.device_get(policy.evaluate(state.params, key, 16))

    time, length, early = evaluation(algo.parts.policy)
    monkeypatch.setattr(env_policy, "scan_until", lambda step, carry, xs, finished: jax.lax.scan(step, carry, xs))
    full_time, full_length, full = evaluation(env_setup.make_policy(recurrent_config()))  # a new policy traces anew
    assert length == full_length and length + 2 * CHUNK < len(time)
    np.testing.assert_array_equal(time[:length], full_time[:length])
    assert not time[length + CHUNK:].any() and full_time[length + CHUNK:].all()
    assert early.keys() == full.keys()
    for name in full:
        np.testing.assert_array_equal(early[name], full[name])
