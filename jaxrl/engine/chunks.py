"""Seeding, and the one way a training program is compiled: a chunk of updates for every run at once.

    shard_map over the (runs, data) mesh (runs split over `runs`, an algorithm's batch over `data`)
      over this device's runs (`mesh.over_local_runs`: vmap, or a plain call for a single run)
        `repeat_updates`: lax.fori_loop over a traced number of updates

A run is one seed of one sweep setting; every leaf of a state or of per-run hyperparameters carries the
leading run axis [R, ...].
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl import mesh as mesh_lib
from jaxrl.mesh import RUN_AXIS


def seed_keys(seed: int, num_seeds: int, num_settings: int = 1) -> jax.Array:
    """[R, 2] with R = num_settings * num_seeds, settings-major: run r trains seed r % num_seeds, and seed s
    of every setting (and of every run with the same `seed`) starts from the same key."""
    keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.arange(num_seeds))
    return jnp.tile(keys, (num_settings, 1))


def repeat_updates(update, state, hp, num_updates: jax.Array):
    """Apply `update(state, hp) -> (state, metrics)` a traced number of times (one compiled program for
    every chunk length); returns (state, metrics summed over the updates).

    The update is traced once: the loop body reuses the trace that gave the metrics' shapes (an inlined jit
    caches it), which was half of tracing a chunk program."""
    update = jax.jit(update, inline=True)
    _, shapes = jax.eval_shape(update, state, hp)
    zeros = jax.tree.map(mesh_lib.zeros_like_abstract, shapes)

    def body(_, carry):
        state, totals = carry
        state, metrics = update(state, hp)
        return state, jax.tree.map(jnp.add, totals, metrics)

    return jax.lax.fori_loop(0, num_updates, body, (state, zeros))


def chunk_metrics(totals: dict, num_updates: jax.Array) -> dict:
    """Metrics summed over a chunk's updates -> per chunk: `*_sum` keys and `episodes` stay sums (the host
    divides them by `episodes`), every other key becomes the mean over the updates."""
    return {k: v if k.endswith("_sum") or k == "episodes" else v / num_updates for k, v in totals.items()}


def compile_chunk(update, state, hp, num_updates: jax.Array, mesh, state_specs, *, xla_options=(),
                  check_vma: bool = True, donate: bool = False, sequential_runs: bool = False):
    """The program that runs `num_updates` (traced) of `update(state, hp) -> (state, metrics)` for every run:
    (state, hp, num_updates) -> (state, metrics [R] per chunk). `state_specs`: the PartitionSpec of each state
    leaf ([R, ...] over `runs`, and any axis the algorithm splits over `data`). Returns (compiled, seconds).

    `donate`: the program takes the input state's memory for its output (the state is then held once, not
    twice: what a replay buffer needs to fit), and the input state is gone after the call. The training loop
    donates only when it need not go back to a chunk's start (`checkpoint.on_nonfinite` "stop"): freezing or
    rolling back a diverged run replays its chunk from there (`jaxrl.run.divergence`). `sequential_runs`: a
    device's runs one after another (`mesh.over_local_runs`)."""
    def run_updates(state, hp, num_updates):
        state, totals = repeat_updates(update, state, hp, num_updates)
        return state, chunk_metrics(totals, num_updates)

    runs = P(RUN_AXIS)
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), state_specs,
                             is_leaf=lambda x: isinstance(x, P))
    per_run = NamedSharding(mesh, runs)
    return compile_per_run(run_updates, (state, hp, num_updates), mesh, in_axes=(0, 0, None),
                           in_specs=(state_specs, runs, P()), out_specs=(state_specs, runs),
                           in_shardings=(shardings, per_run, NamedSharding(mesh, P())),
                           out_shardings=(shardings, per_run), xla_options=xla_options, check_vma=check_vma,
                           donate_argnums=(0,) if donate else (), sequential_runs=sequential_runs)


def compile_per_run(fn, args: tuple, mesh, *, in_axes: tuple, in_specs: tuple, out_specs,
                    in_shardings=None, out_shardings=None, xla_options=(), check_vma: bool = True,
                    donate_argnums: tuple = (), sequential_runs: bool = False):
    """`fn` (one run on this device's share) over every run, under shard_map on `mesh`, jitted and compiled
    for `args`. Returns (compiled program, seconds it took to compile).

    in_axes: per argument, 0 (one value per run) or None (shared); in_specs / out_specs: the shard_map
    PartitionSpecs (a `model` entry in them is left to XLA, which reads it from `in_shardings`); xla_options:
    ((name, value), ...) XLA compile options; donate_argnums: the arguments whose memory the program may reuse
    (they are gone after a call).
    """
    # Along a `model` axis XLA partitions the program from the arguments' shardings: shard_map leaves it alone.
    in_specs, out_specs = jax.tree.map(mesh_lib.manual_spec, (in_specs, out_specs), is_leaf=lambda x: isinstance(x, P))
    sharded = jax.shard_map(mesh_lib.over_local_runs(fn, in_axes, sequential_runs), mesh=mesh, in_specs=in_specs,
                            out_specs=out_specs, check_vma=check_vma, axis_names=mesh_lib.manual_axes(mesh))
    jit_kwargs = {"donate_argnums": donate_argnums}
    if in_shardings is not None:
        jit_kwargs.update(in_shardings=in_shardings, out_shardings=out_shardings)
    tick = time.perf_counter()
    lowered = jax.jit(sharded, **jit_kwargs).lower(*args)
    compiled = lowered.compile(dict(xla_options) or None)
    return compiled, time.perf_counter() - tick


def bitwise_equal(a, b) -> bool:
    """Every leaf of the pytrees `a` and `b` (jax arrays) holds the same bytes on this process's devices."""
    def same(x, y):
        return all(np.asarray(u.data).tobytes() == np.asarray(v.data).tobytes()
                   for u, v in zip(x.addressable_shards, y.addressable_shards))
    return all(same(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def fastest_if_equal(seconds: list[list[float]], equal: bool) -> int:
    """The index of the program whose fastest timing is the shortest, or 0 (the first: XLA's defaults) when the
    programs' results were not bitwise equal, so that a run's numbers never depend on what a timing picked."""
    return min(range(len(seconds)), key=lambda i: min(seconds[i])) if equal else 0


def describe_xla_choice(choice: dict) -> str:
    """One line for `Algorithm.xla_choice`: what config.xla_options "auto" kept, and each candidate's time."""
    def named(options) -> str:
        return ",".join(f"{name}={value}" for name, value in options) or "XLA's defaults"
    timings = ", ".join(f"{named(options)} {seconds:.4g} s" for options, seconds in zip(choice["candidates"],
                                                                                         choice["seconds"]))
    differed = "" if choice["equal"] else "; the states after it differed, so the first is kept whatever the times"
    return f"xla_options auto: kept {named(choice['options'])} (one update: {timings}{differed})"
