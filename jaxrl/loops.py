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
    (a bool []): chunks of `chunk_for(T, chunk)` steps in a `lax.while_loop` that ends when the carry is
    finished, after a head scan of the T mod chunk steps that do not fill a chunk (where there are any). The
    outputs of steps not taken are zeros (False for booleans): the caller must read them as it reads a finished
    row's, so that its result equals the full scan's. Inside `shard_map` each device stops when its own rows
    are done."""
    T = jax.tree.leaves(xs)[0].shape[0]
    chunk = chunk_for(T, chunk)
    head, num_chunks = T % chunk, T // chunk
    if num_chunks == 0:
        return jax.lax.scan(step, carry, xs, unroll=unroll)
    if head:
        carry, head_outs = jax.lax.scan(step, carry, jax.tree.map(lambda x: x[:head], xs), unroll=unroll)
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
    outs = jax.tree.map(lambda o: o.reshape(-1, *o.shape[2:]), outs)
    if head:
        outs = jax.tree.map(lambda h, o: jnp.concatenate([h, o]), head_outs, outs)
    return carry, outs


def chunk_for(T: int, chunk: int = CHUNK) -> int:
    """`chunk`, or where it does not divide T the divisor of T closest to it in [chunk / 2, 2 chunk] (the
    larger on a tie): the loop then needs no head scan, which is a second compiled copy of the step (an
    evaluation's policy and env step, 100 steps in chunks of 8, compiled twice). Without such a divisor, `chunk`."""
    if T % chunk == 0:
        return chunk
    divisors = [c for c in range(max(1, chunk // 2), 2 * chunk + 1) if T % c == 0]
    return min(divisors, key=lambda c: (abs(c - chunk), -c)) if divisors else chunk


def trim_lengths(num_steps: int, count: int = 3, multiple: int | None = None) -> tuple[int, ...]:
    """The static lengths `call_trimmed` chooses from: num_steps / 2^(count-1), ..., num_steps / 2, num_steps,
    each rounded up to a multiple of `multiple` (default: the early-exit chunk of `scan_until` over num_steps,
    where its rollouts stop), distinct and at most num_steps. Each length is one more compiled copy of what is
    trimmed, so they are few."""
    multiple = multiple or chunk_for(num_steps)
    lengths = {min(num_steps, -(-num_steps // 2 ** k // multiple) * multiple) for k in range(count)}
    return tuple(sorted(length for length in lengths if length > 0))


def call_trimmed(fn, xs, steps: jax.Array, lengths: tuple[int, ...]):
    """`fn(xs)` on the first L entries of every leaf of `xs` (leaves [T, ...]), L the shortest of `lengths`
    (static, ending with T) that holds `steps` (int32 []): one `lax.switch` branch per length, so the work after
    the steps taken is skipped with static shapes. `fn` must give the same result for any L >= steps (the
    entries past `steps` count for nothing, e.g. masked out), and `steps` must be the same wherever the branches
    must agree (`jaxrl.mesh.agreed_max`). Returns (fn's result, L)."""
    T = jax.tree.leaves(xs)[0].shape[0]
    if lengths[-1] != T:
        raise ValueError(f"the longest length must be the full {T} steps, got {lengths}")
    branches = [lambda xs, L=L: fn(jax.tree.map(lambda x: x[:L], xs)) for L in lengths]
    choices = jnp.asarray(lengths)
    index = jnp.searchsorted(choices, steps)  # the first length >= steps
    return jax.lax.switch(index, branches, xs), choices[index]
