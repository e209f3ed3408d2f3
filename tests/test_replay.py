"""The replay buffer: ring order, sequences, prioritised frequencies and weights, the same batch on any mesh."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_python
from jaxrl import replay


# Jitted once each: eager calls compile each primitive separately.
add = jax.jit(replay.add)
sample = jax.jit(replay.sample, static_argnames=("per_env", "length"))


def _filled(steps_per_add, num_envs=2, capacity=5, prioritised=False):
    """A buffer after adds of the given step counts; env e's t-th step overall holds 100 * e + t."""
    buffer = replay.init({"x": jnp.zeros(())}, num_envs, capacity, prioritised)
    t = 0
    for steps in steps_per_add:
        x = 100 * np.arange(num_envs)[:, None] + t + np.arange(steps)[None]
        buffer = add(buffer, {"x": x.astype(np.float32)})
        t += steps
    return buffer


def test_add_wraps_around_and_keeps_the_newest_steps():
    buffer = _filled([3, 4])  # 7 steps into 5 columns: steps 2..6 remain
    np.testing.assert_array_equal(buffer.items["x"][0], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buffer.items["x"][1], [105, 106, 102, 103, 104])
    assert int(buffer.position) == 2 and int(buffer.size) == 5
    assert float(replay.fill(_filled([3]))) == pytest.approx(0.6)


def test_sequences_are_consecutive_and_never_cross_the_write_position():
    buffer = _filled([3, 4])
    for seed in range(20):
        got = sample(buffer, jax.random.PRNGKey(seed), per_env=8, length=3)
        x = np.asarray(got.items["x"])  # [n, k, L]
        np.testing.assert_array_equal(np.diff(x, axis=-1), 1)  # steps t, t+1, t+2 of one env
        assert x[0].min() >= 2 and x[0].max() <= 6  # inside what the buffer holds
        assert x[1].min() >= 102 and x[1].max() <= 106  # row 1 holds env 1's steps
        np.testing.assert_array_equal(got.weights, 1.0)
    starts = np.asarray(sample(buffer, jax.random.PRNGKey(0), per_env=2000, length=3).items["x"][0, :, 0])
    np.testing.assert_array_equal(np.unique(starts), [2, 3, 4])  # every valid start, uniformly
    np.testing.assert_allclose(np.bincount(starts.astype(int))[2:] / starts.size, 1 / 3, atol=0.04)
    assert int(replay.num_starts(_filled([2]), 3)) == 0


def test_prioritised_sampling_frequencies_follow_priority_to_the_alpha():
    buffer = _filled([4], num_envs=1, capacity=4, prioritised=True)
    priorities = jnp.array([[1.0, 2.0, 3.0, 6.0]])
    buffer = buffer.replace(priorities=priorities)
    alpha, beta = 0.7, 0.5
    got = sample(buffer, jax.random.PRNGKey(3), per_env=40_000, alpha=alpha, beta=beta)
    want = np.asarray(priorities[0]) ** alpha / np.sum(np.asarray(priorities[0]) ** alpha)
    counts = np.bincount(np.asarray(got.columns[0]), minlength=4) / 40_000
    np.testing.assert_allclose(counts, want, atol=2e-3)  # stratified draws: close to exact
    # weights: (V P)^-beta over the largest the row can give, (V P_min)^-beta
    expected = (want / want.min()) ** -beta
    np.testing.assert_allclose(np.asarray(got.weights[0]), expected[np.asarray(got.columns[0])], rtol=1e-5)


def test_prioritised_rows_give_new_steps_their_highest_priority_and_skip_unwritten_columns():
    buffer = _filled([2], num_envs=2, capacity=6, prioritised=True)
    np.testing.assert_array_equal(buffer.priorities[:, :2], 1.0)  # empty rows start at 1
    buffer = jax.jit(replay.update_priorities)(buffer, jnp.array([[0], [1]]), jnp.array([[-4.0], [0.5]]))
    np.testing.assert_allclose(buffer.priorities[:, :2], [[4.0, 1.0], [1.0, 0.5]], atol=1e-5)
    buffer = add(buffer, {"x": jnp.zeros((2, 1))})
    np.testing.assert_allclose(buffer.priorities[:, 2], [4.0, 1.0], atol=1e-5)  # each row's own maximum
    columns = sample(buffer, jax.random.PRNGKey(0), per_env=500).columns
    assert int(columns.max()) <= 2  # columns 3..5 hold nothing yet
    # rows without a sequence of 4 steps yet (before a learner's first update with one): finite weights, 0
    np.testing.assert_array_equal(sample(buffer, jax.random.PRNGKey(0), per_env=3, length=4).weights, 0.0)


def test_a_batch_is_the_same_on_one_device_and_on_eight():
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import PartitionSpec as P
        from jaxrl import mesh as mesh_lib, replay
        for prioritised in (False, True):
            buffer = replay.init({"x": jnp.zeros(2)}, 16, 32, prioritised)
            buffer = replay.add(buffer, {"x": jax.random.normal(jax.random.PRNGKey(0), (16, 20, 2))})
            if prioritised:
                buffer = buffer.replace(priorities=jax.random.uniform(jax.random.PRNGKey(1), (16, 32)) + 0.1)
            key = jax.random.PRNGKey(7)
            specs = replay.Buffer(P("data"), P("data") if prioritised else None, P(), P())
            sample = lambda b, k: replay.sample(b, k, per_env=4, length=2)
            results = []
            for devices in (1, 8):
                mesh = mesh_lib.make_mesh(devices)
                sharded = jax.shard_map(sample, mesh=mesh, in_specs=(specs, P()),
                                        out_specs=replay.Sample(P("data"), P("data"), P("data")))
                results.append(jax.device_get(jax.jit(sharded)(buffer, key)))
            for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
                np.testing.assert_array_equal(a, b)
            print("equal", prioritised)
    """)
    result = run_python(code, devices=8)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["equal", "False", "equal", "True"]
