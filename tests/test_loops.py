"""`scan_until`: a scan that stops after the chunk in which its carry is finished, equal to the full scan
until then, and to it entirely when it never is. `call_trimmed`: a function of step-major arrays run on the
shortest compiled length that holds the steps taken, and only that one."""

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import PartitionSpec as P

from jaxrl import mesh as mesh_lib
from jaxrl.loops import call_trimmed, scan_until, trim_lengths


def test_scan_until_stops_after_the_chunk_that_finishes():
    def count(total, x):  # carry: steps taken; output: the count after this step, and x
        return total + 1, (total + 1, x)

    xs = jnp.arange(18.0)
    carry, (counts, seen) = scan_until(count, jnp.int32(0), xs, lambda total: total >= 5, chunk=4)
    # 18 = 2 + 4 x 4: the two head steps, then chunks until the count reaches 5 (after 6 steps)
    assert int(carry) == 6
    np.testing.assert_array_equal(counts, [1, 2, 3, 4, 5, 6] + [0] * 12)
    np.testing.assert_array_equal(seen, np.where(np.arange(18) < 6, np.arange(18.0), 0.0))
    never = scan_until(count, jnp.int32(0), xs, lambda total: total < 0, chunk=4)
    full = jax.lax.scan(count, jnp.int32(0), xs)
    for a, b in zip(jax.tree.leaves(never), jax.tree.leaves(full)):
        np.testing.assert_array_equal(a, b)


def test_trim_lengths_halve_down_to_whole_chunks_and_end_with_all_steps():
    assert trim_lengths(100) == (32, 56, 100)  # 25 and 50 rounded up to multiples of 8
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
    np.testing.assert_array_equal(lengths, [56, 56])  # 40 steps: the 56-step branch, for both runs
    assert branches_run == [56]
    branches_run.clear()
    (sums, lengths) = program(jnp.array([3, 20], jnp.int32))
    np.testing.assert_array_equal(lengths, [32, 32])
    assert branches_run == [32]
