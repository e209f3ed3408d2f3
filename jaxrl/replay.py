"""Device-resident replay: ring buffers of env steps that live in a run's training state.

Layout: every leaf is [n, C, ...], a row per env of this device (its share of the envs along the mesh's data
axis) and C steps per row. All envs add their steps together, so one write position and one fill count
serve every row. As part of the training state a buffer is sharded with the envs, saved in checkpoints and
restored exactly: a resumed run samples what the run that never stopped would have sampled.

Sampling is per env row: each env gives `per_env` samples, drawn with a key made from the env's global index
(`mesh.per_item_keys`), so a device samples only its own rows and a batch holds the same items on one device
or on eight. A sample is a sequence of `length` consecutive steps of one env (1 for plain transitions, n for
n-step returns, a whole chunk for recurrent agents) that never crosses the write position.

- uniform: a start uniform over the row's valid starts.
- prioritised (Schaul et al., 2016): P(start) proportional to priority^alpha within the row, drawn by
  stratified inverse-CDF sampling (one draw in each of `per_env` equal slices of the probability mass); the
  importance weight (V * P)^-beta (V valid starts) is divided by the largest weight the row could give, so
  it lies in (0, 1] and does not depend on which rows share a device. New steps get their row's highest
  priority so far (1 in an empty row), so that each is likely to be replayed once.

Flashbax (InstaDeep's replay library) was considered: its buffers are pytrees too, but it samples over a
buffer as a whole and its prioritised buffer keeps one sum-tree per buffer, so under data sharding a batch
would depend on the number of devices; here a row is the unit, which keeps 1 and 8 devices equal.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl import mesh as mesh_lib

PRIORITY_EPS = 1e-6  # added to |TD error| so that no step's priority reaches zero


@struct.dataclass
class Buffer:
    items: Any  # leaves [n, C, ...]
    priorities: jax.Array | None  # [n, C] float32 (prioritised), else None
    position: jax.Array  # int32 []: the column the next step is written to
    size: jax.Array  # int32 []: columns written so far, at most C


class Sample(NamedTuple):
    items: Any  # leaves [n, per_env, length, ...]
    columns: jax.Array  # int32 [n, per_env]: each sequence's first column (for `update_priorities`)
    weights: jax.Array  # float32 [n, per_env]: importance weights (ones when uniform)


def init(example: Any, num_envs: int, capacity: int, prioritised: bool = False) -> Buffer:
    """An empty buffer of `capacity` steps per env for items shaped like `example` (one env's step)."""
    items = jax.tree.map(lambda x: jnp.zeros((num_envs, capacity, *jnp.shape(x)), jnp.result_type(x)), example)
    priorities = jnp.zeros((num_envs, capacity), jnp.float32) if prioritised else None
    return Buffer(items, priorities, jnp.int32(0), jnp.int32(0))


def capacity(buffer: Buffer) -> int:
    return jax.tree.leaves(buffer.items)[0].shape[1]


def add(buffer: Buffer, items: Any) -> Buffer:
    """Append `items` (leaves [n, T, ...]: T steps of every env, oldest first; T <= capacity)."""
    size, steps = capacity(buffer), jax.tree.leaves(items)[0].shape[1]
    if steps > size:
        raise ValueError(f"adding {steps} steps per env to a buffer of {size}")
    columns = (buffer.position + jnp.arange(steps)) % size
    stored = jax.tree.map(lambda old, new: old.at[:, columns].set(new.astype(old.dtype)), buffer.items, items)
    priorities = buffer.priorities
    if priorities is not None:
        highest = jnp.max(priorities, axis=1, keepdims=True)  # [n, 1]: each row's own, whatever the mesh
        priorities = priorities.at[:, columns].set(jnp.where(highest > 0, highest, 1.0))
    return Buffer(stored, priorities, (buffer.position + steps) % size, jnp.minimum(buffer.size + steps, size))


def num_starts(buffer: Buffer, length: int) -> jax.Array:
    """int32 []: how many sequences of `length` steps a row holds (0 until it holds `length` steps)."""
    return jnp.maximum(buffer.size - length + 1, 0)


def sample(buffer: Buffer, key: jax.Array, per_env: int, length: int = 1, alpha: float = 0.6,
           beta: float = 0.4) -> Sample:
    """`per_env` sequences of `length` steps from every row (inside `shard_map`: this device's rows, with keys
    from the envs' global indices; outside it, rows 0..n-1). `alpha`, `beta`: prioritised buffers only.
    The row must hold at least `length` steps (see `num_starts`)."""
    n, size = jax.tree.leaves(buffer.items)[0].shape[:2]
    keys = env_keys(key, n)
    oldest = (buffer.position - buffer.size) % size
    valid = num_starts(buffer, length)
    if buffer.priorities is None:
        offsets = jax.vmap(lambda k: jax.random.randint(k, (per_env,), 0, valid))(keys)  # [n, k]
        weights = jnp.ones(offsets.shape, jnp.float32)
    else:
        offsets, weights = jax.vmap(_prioritised_offsets, (0, 0, None, None, None, None, None))(
            keys, buffer.priorities, oldest, valid, per_env, alpha, beta)
    starts = (oldest + offsets) % size  # [n, k]
    columns = (starts[..., None] + jnp.arange(length)) % size  # [n, k, L]
    rows = jnp.arange(n)[:, None, None]
    return Sample(jax.tree.map(lambda x: x[rows, columns], buffer.items), starts, weights)


def _prioritised_offsets(key, priorities, oldest, valid, per_env: int, alpha, beta):
    """One row: (offsets from the oldest step [k], importance weights [k])."""
    size = priorities.shape[0]
    in_order = jnp.roll(priorities, -oldest)  # [C]: offset 0 is the oldest step
    mass = jnp.where(jnp.arange(size) < valid, in_order ** alpha, 0.0)
    cumulative = jnp.cumsum(mass)
    total = cumulative[-1]
    targets = (jnp.arange(per_env) + jax.random.uniform(key, (per_env,))) / per_env * total
    offsets = jnp.minimum(jnp.searchsorted(cumulative, targets, side="right"), valid - 1)
    smallest = jnp.min(jnp.where(mass > 0, mass, jnp.inf))
    weights = (mass[offsets] / smallest) ** -beta  # = (V P)^-beta / (V P_min)^-beta
    # A row without a valid start (before it holds `length` steps) weighs its samples 0, not infinitely: a learner
    # discards that update's gradient steps, but their metrics must stay finite.
    return offsets.astype(jnp.int32), jnp.where(valid > 0, weights, 0.0)


def update_priorities(buffer: Buffer, columns: jax.Array, td_errors: jax.Array) -> Buffer:
    """Set the priority of the sampled starts `columns` [n, k] to |td_errors| [n, k] (+ a small epsilon).
    A start sampled twice gets the same value from both (same step, same parameters)."""
    rows = jnp.arange(columns.shape[0])[:, None]
    return buffer.replace(priorities=buffer.priorities.at[rows, columns].set(jnp.abs(td_errors) + PRIORITY_EPS))


def env_keys(key: jax.Array, num_local: int) -> jax.Array:
    """[n, 2]: a key per env row from its global index (this device's rows inside `shard_map`)."""
    try:
        return mesh_lib.per_item_keys(key, num_local)
    except NameError:  # outside shard_map: no data axis, rows are the global envs 0..n-1
        return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(num_local))


def fill(buffer: Buffer) -> jax.Array:
    """float32 []: the fraction of the buffer written."""
    return buffer.size / capacity(buffer)
