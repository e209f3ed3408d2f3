"""`scan_until`: a `lax.scan` that stops early once its carry says the work is done.

Rollouts have static lengths (N new tokens, an env's step cap) while most of their rows finish far sooner
(completions end at EOS, battles end in a few dozen steps); the steps after every row has ended compute
nothing that is kept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl import mesh as mesh_lib

# Steps per iteration of the early-exit loop: its condition is read once per chunk (on an accelerator, a
# device-to-host round trip), and a chunk costs at most this many wasted steps once every row has ended.
CHUNK = 8


def scan_until(step, carry, xs, finished, chunk: int = CHUNK, unroll: int = 1):
    """`jax.lax.scan(step, carry, xs, unroll=unroll)` (xs leaves [T, ...]) that stops once `finished(carry)`
    (a bool []): the first T mod chunk steps as one scan, then chunks of `chunk` steps in a
    `lax.while_loop` that ends when the carry is finished. The outputs of steps not taken are zeros (False
    for booleans): the caller must read them as it reads a finished row's, so that its result equals the
    full scan's. Inside `shard_map` each device stops when its own rows are done."""
    T = jax.tree.leaves(xs)[0].shape[0]
    head = T % chunk
    carry, head_outs = jax.lax.scan(step, carry, jax.tree.map(lambda x: x[:head], xs), unroll=unroll)
    num_chunks = T // chunk
    if num_chunks == 0:
        return carry, head_outs
    chunked = jax.tree.map(lambda x: x[head:].reshape(num_chunks, chunk, *x.shape[1:]), xs)
    _, shapes = jax.eval_shape(lambda c, x: jax.lax.scan(step, c, x), carry, jax.tree.map(lambda x: x[0], chunked))
    outs = jax.tree.map(lambda s: mesh_lib.zeros_like_abstract(jax.ShapeDtypeStruct(
        (num_chunks, *s.shape), s.dtype, manual_axis_type=s.manual_axis_type)), shapes)

    def keep_going(loop):
        i, carry, _ = loop
        return (i < num_chunks) & ~finished(carry)

    def body(loop):
        i, carry, outs = loop
        carry, out = jax.lax.scan(step, carry, jax.tree.map(lambda x: x[i], chunked), unroll=unroll)
        return i + 1, carry, jax.tree.map(lambda buffer, o: buffer.at[i].set(o), outs, out)

    _, carry, outs = jax.lax.while_loop(keep_going, body, (jnp.int32(0), carry, outs))
    outs = jax.tree.map(lambda h, o: jnp.concatenate([h, o.reshape(-1, *o.shape[2:])]), head_outs, outs)
    return carry, outs
