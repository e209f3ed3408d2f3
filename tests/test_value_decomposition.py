"""IQL, VDN and QMIX: the recurrent agents' next values, the team targets against a step-by-step computation,
exact resume with a partly filled buffer and hidden states carried across updates, 1 vs 8 devices, config
errors, learning SMAX 3m (QMIX, and PQN-VDN). One small QMIX run (`qmix_run`) serves the tests that read a
trained state: compiling is most of a test's time."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_one_and_eight_devices_agree, assert_same_state, straight_and_resumed
from helpers import build, evaluation_curve, load_experiment, set_keys
from jax.sharding import PartitionSpec as P

from jaxrl import algos, mesh as mesh_lib
from jaxrl.algos.off_policy import PRIORITY_ALPHA, PRIORITY_BETA
from jaxrl.engine.acting import cast_observations, sample_batch
from jaxrl.networks import RecurrentQNetwork

# 8 envs (as 8 devices need) of 16 steps per update, 2 seeds; learning from the second update
SMALL = {"total_steps": 8 * 16 * 12, "num_envs": 8, "num_steps": 16, "num_seeds": 2, "replay.batch_size": 16,
         "replay.buffer_size": 8 * 100, "replay.learning_starts": 256, "replay.sequence_length": 8,
         "replay.gradient_steps": 2, "target.every": 4, "network.fc_size": 16, "network.rnn_size": 16,
         "mixer.embed_size": 8, "mixer.hypernet_size": 16, "log.every_steps": 128, "log.progress_bar": False,
         "eval.episodes": 4, "eval.max_steps": 60, "eval.every_steps": 0}
# The resume test's run, and `qmix_run`'s (the same program)
RESUMED = {"checkpoint.every_steps": 768, "replay.burn_in": 2}


def _small(experiment: str, **overrides):
    return set_keys(load_experiment(experiment, "3m"), {**SMALL, **overrides})


@pytest.fixture(scope="module")
def qmix_run(builds_shared):
    """experiments/smax_qmix.py:3m at SMALL sizes (its float16 buffer), 2 seeds on one device: (algorithm, hp, the
    buffer after 2 updates, whose acting came before any learning, the state after 6 and the metrics of updates
    3-6, which learn). Its chunks donate their input state, as the experiment's checkpoint.on_nonfinite=stop makes
    the training loop do, so that the resume test's runs compile the same program (the session's compilation
    cache)."""
    algo, hp, state = build(_small("smax_qmix", **RESUMED), num_seeds=2)
    state, _ = algo.run_chunk(state, hp, 2, donate=True)
    early = jax.device_get(state.buffer)
    state, metrics = algo.run_chunk(state, hp, 4, donate=True)
    return algo, hp, early, state, metrics


def test_next_values_continue_each_steps_hidden_state():
    net = RecurrentQNetwork(num_actions=5, fc_size=8, rnn_size=16)
    T, B, d = 6, 4, 7
    # (inputs built as NumPy arrays, the network's calls jitted: eager jax ops compile once per op and shape)
    x, next_x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (2, T, B, d)))
    first = np.zeros((T, B), bool)
    first[3, 1] = True  # env 1 starts an episode at step 3
    carry = net.initial_carry((B,))
    params = jax.jit(net.init)(jax.random.PRNGKey(1), carry, x, None, first)
    q, next_q = jax.device_get(jax.jit(functools.partial(net.apply, method="sequence_values"))(
        params, carry, x, next_x, first))
    # The network run over steps 0..t, then one step on step t's next inputs: T + 1 steps for every t (the
    # steps after t + 1 are left as they were; the network is causal), so that one compiled program serves all t.
    run = jax.jit(lambda inputs, starts: net.apply(params, carry, inputs, None, starts)[1])
    for t in range(T):
        inputs, starts = np.concatenate([x, x[-1:]]), np.concatenate([first, first[-1:]])
        inputs[t + 1], starts[t + 1] = next_x[t], False
        stepped = np.asarray(run(inputs, starts))
        np.testing.assert_allclose(stepped[:t + 1], q[:t + 1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stepped[t + 1], next_q[t], rtol=1e-5, atol=1e-6)


def test_targets_match_a_step_by_step_computation(qmix_run):
    # VDN's and IQL's TD targets on the QMIX run's buffer (episode ends in it) and agents' parameters (its mixer's
    # collection unread), against one step-by-step computation of the agents' values
    # (sliced as NumPy arrays: eager slices of jax arrays compile once per leaf shape)
    one = lambda tree: jax.tree.map(lambda x: np.asarray(x)[0], tree)  # noqa: E731  the first run
    state = qmix_run[3]
    params = one(state.params)
    target_params = jax.tree.map(lambda x: x + np.float32(0.01), params)  # a target network that differs
    seq = jax.tree.map(lambda x: x[:, 40:48], one(state.buffer.items))  # [B=8, L=8, ...]
    assert seq["done"].any(), "the window should hold an episode end"

    policy = qmix_run[0].parts.policy  # (the agents see what VDN's and IQL's see)
    dist, network = policy.dist, policy.network

    @jax.jit  # one scan over the window's steps (op by op, every small op would compile apart)
    def step_by_step(params, target_params, seq):
        no_restart = jnp.zeros((1, 8, 3), bool)

        def step(carries, seq_t):  # (Q of obs_t, online and target Q of next_obs_t) [B, A, K]
            carry, target_carry = carries
            first = jnp.broadcast_to(seq_t["first"][:, None], (1, 8, 3))
            obs_in, next_in = policy.actor_inputs(seq_t["obs"])[None], policy.actor_inputs(seq_t["next_obs"])[None]
            carry, q_t, _ = network.apply(params, carry, obs_in, None, first)
            target_carry = network.apply(target_params, target_carry, obs_in, None, first)[0]
            online_next = network.apply(params, carry, next_in, None, no_restart)[1]
            target_next = network.apply(target_params, target_carry, next_in, None, no_restart)[1]
            return (carry, target_carry), (dist.with_mask(q_t[0], seq_t["mask"]),
                                           dist.with_mask(online_next[0], seq_t["next_mask"]),
                                           dist.with_mask(target_next[0], seq_t["next_mask"]))

        start = network.initial_carry((8, 3))
        per_step = jax.lax.scan(step, (start, start), jax.tree.map(lambda x: jnp.moveaxis(x, 1, 0), seq))[1]
        return jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), per_step)  # [B, T, A, K]

    q_t, online_next, target_next = jax.device_get(step_by_step(params, target_params, seq))
    chosen = np.take_along_axis(q_t, seq["action"][..., None], -1)[..., 0]  # [B, T, A]
    next_value = np.take_along_axis(target_next, online_next.argmax(-1)[..., None], -1)[..., 0]
    reward, keep = seq["reward"], 1 - seq["terminated"].astype(np.float32)  # [B, T, A], [B, T]

    for experiment in ("smax_vdn", "smax_iql"):
        algo, hp = algos.build(_small(experiment, **{"replay.burn_in": 2, "returns.q_lambda": 0.0}),
                               mesh_lib.make_mesh())
        # (inside shard_map, as in training: a one-device mesh here)
        td = jax.jit(jax.shard_map(lambda *args: algo.parts.td(*args, hp), mesh=algo.mesh, in_specs=P(), out_specs=P(),
                                   check_vma=False))
        q, targets = td(params, target_params, seq)
        gamma = np.float32(hp.gamma)
        if experiment == "smax_vdn":  # the team: summed values, the agents' mean reward
            expected_q, expected_targets = chosen.sum(-1), reward.mean(-1) + gamma * keep * next_value.sum(-1)
        else:
            expected_q, expected_targets = chosen, reward + gamma * keep[..., None] * next_value
        np.testing.assert_allclose(q, expected_q[:, 2:], rtol=1e-4, atol=1e-5)  # past the burn-in
        np.testing.assert_allclose(targets, expected_targets[:, 2:], rtol=1e-4, atol=1e-5)


def test_resume_with_hidden_states_and_a_partly_filled_buffer_is_the_run_that_never_stopped(tmp_path, qmix_run):
    # 12 updates of 128 steps, checkpoints after 6 and 12; the buffer (100 steps per env) is partly filled at
    # the first. Losing the second and resuming must give the same run, hidden states and buffer included.
    # (After `qmix_run`, which compiled its program.)
    config = _small("smax_qmix", **RESUMED)
    straight, resumed = straight_and_resumed(config, tmp_path, last_checkpoint=12)
    assert resumed.metrics[-1]["learning"] == 1.0
    assert float(jnp.abs(resumed.state.acting.carry).max()) > 0  # recurrent agents mid-episode
    assert_same_state(straight.state, resumed.state)


def test_buffer_holds_the_global_state_for_qmix_only(qmix_run):
    qmix = qmix_run[2].items
    vdn_algo, _ = algos.build(_small("smax_vdn"), mesh_lib.make_mesh())
    vdn = jax.eval_shape(jax.vmap(vdn_algo.init), jax.random.split(jax.random.PRNGKey(0), 1)).buffer.items
    assert qmix["state"].shape[-1] == qmix["next_state"].shape[-1] == 72  # SMAX 3m's global state
    assert "state" not in vdn and {"first", "mask", "next_mask"} <= set(vdn)
    assert vdn["obs"].shape[:3] == (1, 8, 100)  # [runs, envs, steps per env]


def test_a_float16_buffer_holds_the_same_observations_and_trains_on_float32_samples(qmix_run):
    # The first two updates (16 steps per env each) come before learning starts: a float32 run of `qmix_run`'s
    # config acts alike, so their stored steps differ only by float16's rounding (the SMAX experiments' own dtype;
    # jaxrl's default is float32).
    algo, hp, state = build(_small("smax_qmix", **RESUMED, **{"replay.store_dtype": "float32"}), num_seeds=2)
    exact = algo.run_chunk(state, hp, 2)[0].buffer.items
    algo, _, early, _, metrics = qmix_run
    acted_alike = lambda x: x[:, :, :32]  # noqa: E731  [runs, envs, steps per env, ...]
    for key in ("obs", "next_obs", "state", "next_state"):
        stored = early.items[key]
        assert exact[key].dtype == jnp.float32 and stored.dtype == jnp.float16
        np.testing.assert_allclose(acted_alike(stored).astype(jnp.float32), acted_alike(exact[key]),
                                   rtol=1e-3, atol=3e-4)
    assert early.items["reward"].dtype == jnp.float32
    batch, _ = sample_batch(algo.settings, jax.tree.map(lambda x: x[0], early), jax.random.key(0),
                            PRIORITY_ALPHA.default, PRIORITY_BETA.default)
    assert batch["items"]["obs"].dtype == batch["items"]["next_state"].dtype == jnp.float32
    # updates 3-6 learned from float32 samples of the float16 buffer
    assert float(metrics["learning"][0]) == 1.0 and np.isfinite(metrics["td_loss"]).all()
    with pytest.raises(ValueError, match="replay.store_dtype"):
        algos.validate(_small("smax_qmix", **{"replay.store_dtype": "int8"}))
    pixels = cast_observations({"obs": jnp.zeros((2,), jnp.uint8), "reward": jnp.zeros((2,))}, "float16")
    assert pixels["obs"].dtype == jnp.uint8 and pixels["reward"].dtype == jnp.float32  # only float observations


def test_one_and_eight_devices_train_the_same_parameters(qmix_run, tmp_path):
    # `qmix_run` trained the 1-device run: 6 updates, 4 of them learning
    assert_one_and_eight_devices_agree("smax_qmix", {**SMALL, **RESUMED}, updates=6, rtol=1e-4, atol=1e-5,
                                       one_device=qmix_run[3], tmp_path=tmp_path)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="replay.burn_in = 8 must lie in"):
        algos.validate(_small("smax_qmix", **{"replay.burn_in": 8}))
    with pytest.raises(ValueError, match="network.kind"):
        algos.validate(_small("smax_vdn", **{"network.kind": "lstm"}))
    with pytest.raises(ValueError, match="replay.sequence_length"):
        algos.validate(_small("smax_iql", **{"replay.sequence_length": 200}))


@pytest.mark.slow
@pytest.mark.optimized
@pytest.mark.parametrize("experiment,steps,every", [("smax_qmix", 81_920, 40_960), ("smax_pqn_vdn", 131_072, 32_768)])
def test_learns_smax_3m(experiment, steps, every):
    """A run of `steps` env steps on 3m ends with a greedy win rate of 0.25 or more: the mean of its last two
    evaluations (64 battles each, every `every` steps); random agents almost never win. Seeds 0, 1, 2
    (2026-11-28, 2-core AMD EPYC, --config.num_seeds=3), evaluations from the first: QMIX 0.30/0.41/0.47,
    0.14/0.41/0.58 and 0/0/0 (seed 2 won no battle: its parameters finite, its Q-values collapsed near 0, q_mean
    0.17 against 5.6 and 4.8 at the end; not investigated further); PQN-VDN 0.34/0.47/0.56/0.52,
    0.48/0.50/0.50/0.52, 0.38/0.53/0.56/0.59. This test's seed 0 alone (optimised, as the test compiles):
    QMIX 0.30/0.39/0.47, PQN-VDN 0.41/0.48/0.59/0.52. On a 2-core Intel Xeon (2026-12-01), seed 0: QMIX 0.31/0.36 at
    40,960 and 81,920 steps (so QMIX stops there), PQN-VDN 0.20/0.27 at 32,768 and 65,536 (short of the bar: it keeps
    its 131,072)."""
    config = set_keys(load_experiment(experiment, "3m"), {"total_steps": steps})
    curve = evaluation_curve(config, "eval_win_rate", every_steps=every)
    assert curve[0][1] < 0.05, curve  # untrained
    assert np.mean([value for _, value in curve[-2:]]) >= 0.25, curve
