"""`scan_until`: a scan that stops after the chunk in which its carry is finished, equal to the full scan
until then, and to it entirely when it never is."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.loops import scan_until


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
