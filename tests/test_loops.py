"""`scan_until`: a scan that stops after the chunk in which its carry is finished, equal to the full scan
until then, and to it entirely when it never is. `call_trimmed`: a function of step-major arrays run on the
shortest compiled length that holds the steps taken, and only that one."""

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import PartitionSpec as P

from jaxrl import mesh as mesh_lib
from jaxrl.loops import call_trimmed, chunk_for, scan_until, trim_lengths


def test_scan_until_stops_after_the_chunk_that_finishes():
    def count(total, x):  # carry: steps taken; output: the count after this step, and x
        return total + 1, (total + 1, x)

    # 17 steps, no divisor of 17 near 4: a head of one step, then chunks of 4 until the count reaches 6 (after
    # 1 + 4 + 4 = 9 steps); 18 steps in chunks of 3 (the divisor closest to 4): 3 + 3 = 6 steps
    for length, steps in [(17, 9), (18, 6)]:
        xs = jnp.arange(float(length))
        carry, (counts, seen) = scan_until(count, jnp.int32(0), xs, lambda total: total >= 6, chunk=4)
        assert int(carry) == steps
        np.testing.assert_array_equal(counts, np.where(np.arange(length) < steps, np.arange(1, length + 1), 0))
        np.testing.assert_array_equal(seen, np.where(np.arange(length) < steps, np.arange(float(length)), 0.0))
        never = scan_until(count, jnp.int32(0), xs, lambda total: total < 0, chunk=4)
        full = jax.lax.scan(count, jnp.int32(0), xs)
        for a, b in zip(jax.tree.leaves(never), jax.tree.leaves(full)):
            np.testing.assert_array_equal(a, b)


def test_chunks_divide_the_length_where_a_divisor_lies_near_the_chunk():
    assert [chunk_for(T, 8) for T in (16, 100, 40, 150, 4, 97, 1)] == [8, 10, 8, 10, 4, 8, 8]
    assert chunk_for(18, 4) == 3 and chunk_for(20, 8) == 10  # ties go to the larger


def test_trim_lengths_halve_down_to_whole_chunks_and_end_with_all_steps():
    assert trim_lengths(100) == (30, 50, 100)  # 25 and 50 rounded up to multiples of 10 (the chunk of 100 steps)
    assert trim_lengths(100, multiple=8) == (32, 56, 100)
    assert trim_lengths(200, count=2) == (104, 200)
    assert trim_lengths(5) == (5,)


def test_call_trimmed_runs_only_the_shortest_length_that_holds_the_steps_on_every_run_and_device():
    """Two runs vmapped on one device (under shard_map, as in a chunk program): the steps taken differ per run;
    both take the one branch that holds the longer, and no other branch runs (a vmapped switch on a per-run
    index would run all three and select). Devices of the data axis agree through a pmax (tests/test_grpo.py
    trains on 1 and 8 devices)."""
    mesh = mesh_lib.make_mesh(1)
    branches_run = []

    def total(xs):  # counts which length ran; the sum is the same for any length >= the steps taken
        jax.debug.callback(lambda n: branches_run.append(int(n)), xs.shape[0])
        return jnp.sum(xs)

    def one_run(steps):
        xs = jnp.where(jnp.arange(100) < steps, 1.0, 0.0)  # [T]: ones for the steps taken
        return call_trimmed(total, xs, mesh_lib.agreed_max(steps), trim_lengths(100))

    program = jax.jit(jax.shard_map(mesh_lib.over_local_runs(one_run, (0,)), mesh=mesh, in_specs=P(),
                                    out_specs=P()))
    (sums, lengths) = program(jnp.array([20, 40], jnp.int32))
    np.testing.assert_array_equal(sums, [20.0, 40.0])
    np.testing.assert_array_equal(lengths, [50, 50])  # 40 steps: the 50-step branch, for both runs
    assert branches_run == [50]
    branches_run.clear()
    (sums, lengths) = program(jnp.array([3, 20], jnp.int32))
    np.testing.assert_array_equal(lengths, [30, 30])
    assert branches_run == [30]
