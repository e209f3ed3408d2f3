"""DQN and PQN: double-Q bootstrap values, config errors, learning on CartPole, exact resume with a partly filled
buffer, 1 vs 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_one_and_eight_devices_agree, assert_same_state, resumed_runs_fixture
from helpers import evaluation_curve, load_experiment, set_keys
from jaxrl.algos.q_learning import bootstrap_values


def test_bootstrap_values_take_the_max_or_the_target_value_of_the_online_argmax():
    target_q = jnp.array([[1.0, 5.0, 3.0], [2.0, 0.0, 4.0]])
    online_q = jnp.array([[9.0, 0.0, 1.0], [0.0, 0.0, 1.0]])  # argmax 0 and 2
    np.testing.assert_array_equal(bootstrap_values(target_q), [5.0, 4.0])
    np.testing.assert_array_equal(bootstrap_values(target_q, online_q), [1.0, 4.0])


# 40 updates of 8 envs x 2 steps, 2 seeds (8 envs, as 8 devices need), checkpoints after 20 and 40; prioritised
# replay, 3-step returns, dueling heads; the buffer (200 steps per env) partly filled throughout
RESUMED = {"total_steps": 8 * 2 * 40, "num_envs": 8, "num_steps": 2, "num_seeds": 2, "replay.batch_size": 64,
           "replay.buffer_size": 8 * 200, "replay.learning_starts": 64, "target.every": 20,
           "replay.prioritised": True, "returns.n_step": 3, "network.dueling": True, "log.every_steps": 160,
           "log.progress_bar": False, "checkpoint.every_steps": 320, "eval.episodes": 4, "eval.max_steps": 50}


# trained straight, and resumed from its first checkpoint (its second lost, as a kill just before it would)
dqn_runs = resumed_runs_fixture("cartpole_dqn", RESUMED, last_checkpoint=40)


def test_resume_with_a_partly_filled_buffer_is_the_run_that_never_stopped(dqn_runs):
    straight, resumed = dqn_runs
    assert resumed.metrics[-1]["env_steps"] == 640 and resumed.metrics[-1]["learning"] == 1.0
    assert 0 < int(resumed.state.buffer.size[0]) == 80 < 200  # 40 updates x 2 steps per env: partly filled
    assert_same_state(straight.state, resumed.state)


def test_one_and_eight_devices_train_the_same_parameters(dqn_runs, tmp_path):
    # the straight run is the 1-device run
    assert_one_and_eight_devices_agree("cartpole_dqn", RESUMED, updates=40,
                                       state_fields=("params", "buffer.priorities"), one_device=dqn_runs[0].state,
                                       tmp_path=tmp_path)


def test_pqn_minibatches_must_divide_the_rollout_and_lambda_lies_in_the_unit_interval():
    from jaxrl import algos
    with pytest.raises(ValueError, match="is not divisible by optim.num_minibatches = 7"):
        algos.validate(set_keys(load_experiment("cartpole_pqn"), {"optim.num_minibatches": 7}))
    with pytest.raises(ValueError, match="returns.q_lambda"):
        algos.validate(set_keys(load_experiment("cartpole_pqn"), {"returns.q_lambda": 1.5}))
    with pytest.raises(ValueError, match="replay.batch_size = 30 must be a multiple of num_envs = 8"):
        algos.validate(set_keys(load_experiment("cartpole_dqn"), {"replay.batch_size": 30}))


@pytest.mark.slow
@pytest.mark.optimized
@pytest.mark.parametrize("experiment,total_steps", [("cartpole_dqn", 250_000), ("cartpole_pqn", 500_000)])
def test_solves_cartpole(experiment, total_steps):
    """Issue 19's bar, a greedy return >= 475 within 500k env steps, on the figure a run ends with: its last
    evaluation (greedy, every 25k). Both learners' returns swing after they first reach 500, so a first crossing
    says little about the end. Seeds 0, 1, 2 (2026-11-28, 2-core AMD EPYC, --config.num_seeds=3):
    PQN (experiments/cartpole_pqn.py as it is) 500/500/500 at the end, and 206 (seed 0, 467k) or 125 (seed 1,
    270k) on the way; DQN ends 500/500/500 when its run is 250k steps (its schedules, epsilon over half the run
    and the learning rate's decay to 0, shortened with it), after 289 (seed 0, 175k) and 333 (seed 1, 225k). At
    500k, as experiments/cartpole_dqn.py runs, DQN's end depends on the CPU's float rounding: 447 over three
    seeds, one at 340, on an Intel Xeon (its docstring), so that run is not the test's."""
    config = set_keys(load_experiment(experiment), {"total_steps": total_steps})
    curve = evaluation_curve(config, "eval_return", every_steps=25_000)
    assert curve[0][1] < 50, curve  # untrained: learning happened in this run
    assert curve[-1][1] >= 475, curve


def test_qmix_mixer_is_monotonic_in_every_agents_value():
    # dQ_tot / dq_a >= 0 for any state and values (the hypernetworks' weights are absolute values), and Q_tot
    # follows the state: the same agent values mix differently in different states.
    from jaxrl.networks import QMixer

    mixer = QMixer(embed_size=8, hypernet_size=16)

    @jax.jit  # (one compile rather than an op-by-op dispatch of every layer)
    def mixed(key):
        q_key, s_key, p_key = jax.random.split(key, 3)
        agent_q = 3.0 * jax.random.normal(q_key, (64, 5))
        state = jax.random.normal(s_key, (64, 12))
        params = mixer.init(p_key, agent_q, state)
        grads = jax.vmap(jax.grad(lambda q, s: mixer.apply(params, q, s)))(agent_q, state)
        other_state = mixer.apply(params, agent_q[:1], state[1:2])  # the first values in the second state
        return mixer.apply(params, agent_q, state), grads, other_state

    q_tot, grads, other_state = mixed(jax.random.PRNGKey(0))
    assert q_tot.shape == (64,)
    assert grads.shape == (64, 5) and bool((grads >= 0).all()) and bool((grads > 0).any())
    assert not np.allclose(q_tot[:1], other_state)
