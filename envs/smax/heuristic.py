"""The built-in enemy: a per-unit heuristic that runs inside `SMAX.step`.

Each enemy unit, seeing the allies within its sight range:
  - attacks when some visible ally is within attack range: it keeps its last target while that one
    stays attackable, else picks the closest (or, in "random" mode, a random) attackable ally;
  - otherwise moves toward a random visible ally, or, seeing none, toward its home (its start
    position mirrored through the map centre), by whichever of N, E, S, W best aligns with the way.

Everything is computed for all enemies at once on [E, A] matrices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NUM_MOVES = 4  # N, E, S, W; action 4 is stop, actions 5.. attack
STOP = 4
# Unit vectors of the moves, then stop: row a is the direction of action a.
DIRECTIONS = jnp.array([[0.0, 1.0], [1.0, 0.0], [0.0, -1.0], [-1.0, 0.0], [0.0, 0.0]])


def pick_true(u: jax.Array, mask: jax.Array) -> jax.Array:
    """[...] int32 index of the true entry of `mask` [..., N] that a uniform `u` [...] in [0, 1) selects
    (each true entry equally likely); 0 where there is none.

    One uniform per row and a cumulative count: much cheaper on CPU than Gumbel-max sampling. The count
    is a matmul with a triangle of ones (exact: small integers in float32), several times faster on CPU
    than `cumsum`, which XLA runs as a windowed reduction.
    """
    n = mask.shape[-1]
    upper = np.triu(np.ones((n, n), np.float32))  # upper[j, i] = 1 where j <= i
    running = jnp.dot(mask.astype(jnp.float32), upper, precision="highest")  # [..., N] true entries up to i
    count = running[..., -1]
    rank = jnp.minimum(jnp.floor(u * count), count - 1)  # -1 where there is none: argmax then gives 0
    return jnp.argmax(running > rank[..., None], axis=-1).astype(jnp.int32)


def sample_true(key: jax.Array, mask: jax.Array) -> jax.Array:
    """[...] int32 index of a uniformly random true entry along the last axis of `mask` [..., N]; 0 if none."""
    return pick_true(jax.random.uniform(key, mask.shape[:-1]), mask)


def best_move(vector: jax.Array) -> jax.Array:
    """[N] int32 move action (0-3) best aligned with each `vector` [N, 2]; ties go to the first."""
    vx, vy = vector[:, 0], vector[:, 1]
    # Dot products with N, E, S, W written out (a matmul may run at reduced precision on accelerators).
    return jnp.argmax(jnp.stack([vy, vx, -vy, -vx], axis=-1), axis=-1).astype(jnp.int32)


def heuristic_targets(noise: jax.Array, enemy_pos: jax.Array, ally_pos: jax.Array, dist: jax.Array,
                      enemy_alive: jax.Array, ally_alive: jax.Array, sight_range: jax.Array,
                      attack_range: jax.Array, last_target: jax.Array, home: jax.Array,
                      attack_mode: str = "closest") -> tuple[jax.Array, jax.Array]:
    """What every enemy does this step.

    Args: `noise` [2, E] uniforms in [0, 1) (which visible ally to chase; which attackable one to pick
    in "random" mode); positions `enemy_pos` [E, 2], `ally_pos` [A, 2]; `dist` [E, A] between them;
    alive flags [E] and [A]; the enemies' `sight_range`, `attack_range` [E]; `last_target` [E] (ally
    index or -1); `home` [E, 2].
    Returns: `target` [E] int32 ally to attack or -1 (also the next step's `last_target`), and
    `move` [E] int32 move action (0-3), used when not attacking.
    """
    visible = enemy_alive[:, None] & ally_alive[None, :] & (dist < sight_range[:, None])  # [E, A]
    attackable = visible & (dist < attack_range[:, None])
    can_attack = attackable.any(axis=1)
    if attack_mode == "closest":
        fresh = jnp.argmin(jnp.where(attackable, dist, jnp.inf), axis=1)
    elif attack_mode == "random":
        fresh = pick_true(noise[1], attackable)
    else:
        raise ValueError(f"unknown attack_mode {attack_mode!r}; use 'closest' or 'random'")
    keep = (last_target >= 0) & jnp.take_along_axis(attackable, jnp.maximum(last_target, 0)[:, None], 1)[:, 0]
    target = jnp.where(can_attack, jnp.where(keep, last_target, fresh), -1).astype(jnp.int32)

    # A fresh random visible ally to chase each step; home when none is visible.
    chase = pick_true(noise[0], visible)
    goal = jnp.where(visible.any(axis=1)[:, None], ally_pos[chase], home)
    move = best_move(goal - enemy_pos)
    return target, move
