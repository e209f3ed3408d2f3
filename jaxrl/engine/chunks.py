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
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl import config as config_lib, mesh as mesh_lib
from jaxrl.jitting import jit_method
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
                  check_vma: bool = True, donate: bool = False):
    """The program that runs `num_updates` (traced) of `update(state, hp) -> (state, metrics)` for every run:
    (state, hp, num_updates) -> (state, metrics [R] per chunk). `state_specs`: the PartitionSpec of each state
    leaf ([R, ...] over `runs`, and any axis the algorithm splits over `data`). Returns (compiled, seconds).

    `donate`: the program takes the input state's memory for its output (the state is then held once, not
    twice: what a replay buffer needs to fit), and the input state is gone after the call. The training loop
    donates only when it need not go back to a chunk's start (`checkpoint.on_nonfinite` "stop"): freezing or
    rolling back a diverged run replays its chunk from there (`jaxrl.run.divergence`)."""
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
                           donate_argnums=(0,) if donate else ())


def compile_per_run(fn, args: tuple, mesh, *, in_axes: tuple, in_specs: tuple, out_specs,
                    in_shardings=None, out_shardings=None, xla_options=(), check_vma: bool = True,
                    donate_argnums: tuple = ()):
    """`fn` (one run on this device's share) over every run, under shard_map on `mesh`, jitted and compiled
    for `args`. Returns (compiled program, seconds it took to compile).

    in_axes: per argument, 0 (one value per run) or None (shared); in_specs / out_specs: the shard_map
    PartitionSpecs; xla_options: ((name, value), ...) XLA compile options; donate_argnums: the arguments
    whose memory the program may reuse (they are gone after a call).
    """
    sharded = jax.shard_map(mesh_lib.over_local_runs(fn, in_axes), mesh=mesh, in_specs=in_specs,
                            out_specs=out_specs, check_vma=check_vma)
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
    """One line for `ChunkRunner.xla_choice`: what config.xla_options "auto" kept, and each candidate's time."""
    def named(options) -> str:
        return ",".join(f"{name}={value}" for name, value in options) or "XLA's defaults"
    timings = ", ".join(f"{named(options)} {seconds:.4g} s" for options, seconds in zip(choice["candidates"],
                                                                                         choice["seconds"]))
    differed = "" if choice["equal"] else "; the states after it differed, so the first is kept whatever the times"
    return f"xla_options auto: kept {named(choice['options'])} (one update: {timings}{differed})"


class ChunkRunner:
    """What every algorithm object does the same way around its `init(key)` (one run's state) and
    `_update(state, hp)`, given `mesh`, `settings.xla_options` and `chunk_specs(state)` (the PartitionSpec of
    each state leaf; every leaf over `runs` unless overridden): the runs' initial states on the mesh
    (`init_seeds`), and `run_chunk`, compiled on its first call with each `donate` (the seconds it took are
    added to `compile_seconds`). With `settings.xla_options` "auto" the first `run_chunk` (or
    `choose_xla_options`) first picks the compile options (`xla_choice`)."""

    _chunk_fns: dict | None = None  # (xla options, donate) -> the compiled chunk
    compile_seconds = 0.0
    vma_checks = True  # shard_map's varying-axes checks (off for envs whose code does not pass them)
    # With xla_options "auto", once chosen: {"options": the options kept, "candidates": every candidate, "seconds":
    # the fastest timing of one update per candidate, "equal": whether their states after it were bitwise equal}
    xla_choice: dict | None = None

    def xla_candidates(self) -> tuple:
        """The XLA compile options the chunk program may take (`config.xla_candidates`)."""
        return config_lib.xla_candidates(self.settings.xla_options)

    def _xla_options(self) -> tuple:
        """The options the chunk program is compiled with now: the chosen ones, else the first candidate."""
        return self.xla_choice["options"] if self.xla_choice else self.xla_candidates()[0]

    def choose_xla_options(self, state, hp, rounds: int = 3) -> None:
        """With several candidate options (`xla_candidates`): compile the chunk program with each, time one
        update of each on `state` `rounds` times in turns (`state` is left as it was), and keep the fastest for
        this object's programs when every candidate's state after that update is bitwise equal to the first's
        (else the first). Process 0's choice holds for all processes. The seconds it takes count as compiling
        (`compile_seconds`). While it runs, the state is held three times (the input and two results)."""
        candidates = self.xla_candidates()
        if self.xla_choice is not None or len(candidates) == 1:
            return
        tick, compiled_before = time.perf_counter(), self.compile_seconds
        programs = [self.chunk_program(state, hp, xla_options=options) for options in candidates]
        hp = mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh)
        # the states after one update (a metric may differ in its last bits: the text GRPO step's approx_kl read
        # 1.2e-14 with YNNPACK's fusions and 0 without, its state bitwise equal)
        first = jax.block_until_ready(programs[0](state, hp, jnp.int32(1))[0])
        equal = all(bitwise_equal(first, jax.block_until_ready(program(state, hp, jnp.int32(1))[0]))
                    for program in programs[1:])
        del first
        seconds = [[] for _ in programs]
        for _ in range(rounds):
            for program, times in zip(programs, seconds):
                start = time.perf_counter()
                jax.block_until_ready(program(state, hp, jnp.int32(1)))
                times.append(time.perf_counter() - start)
        best = fastest_if_equal(seconds, equal)
        if jax.process_count() > 1:
            best = int(multihost_utils.broadcast_one_to_all(np.int32(best)))
        self.xla_choice = {"options": candidates[best], "candidates": candidates, "equal": equal,
                           "seconds": [round(min(times), 6) for times in seconds]}
        self.compile_seconds = compiled_before + time.perf_counter() - tick

    def chunk_specs(self, state):
        return jax.tree.map(lambda _: P(RUN_AXIS), state)

    def state_shardings(self, state):
        """NamedShardings of a state with a leading run axis, by `chunk_specs`."""
        return jax.tree.map(lambda spec, _: NamedSharding(self.mesh, spec), self.chunk_specs(state), state,
                            is_leaf=lambda x: isinstance(x, P))

    def init_seeds(self, seed: int, num_seeds: int, num_settings: int = 1):
        """The state of R = num_settings * num_seeds runs (leading run axis; see `seed_keys`), on the mesh."""
        keys = seed_keys(seed, num_seeds, num_settings)
        mesh_lib.check_runs(len(keys), self.mesh)
        state = self._init_runs(keys)
        return jax.device_put(state, self.state_shardings(state))

    @jit_method
    def _init_runs(self, keys: jax.Array):
        """One state per key [R, 2], compiled once per algorithm and run count. Runs one after another
        (lax.map, not vmap) on one device, then placed on the mesh: a batched QR (flax's orthogonal initialiser
        under vmap, in a network of the user's own) can deadlock XLA:CPU's LAPACK thread pool (jaxlib 0.10.2,
        seen on 1 and on 8 devices; jaxrl's networks use `networks.orthogonal`, which maps its QRs itself), and
        a replicated init would run it on every device."""
        return jax.lax.map(self.init, keys)

    def chunk_program(self, state, hp, donate: bool = False, xla_options: tuple | None = None):
        """The compiled chunk program for states shaped like `state` (arrays, or ShapeDtypeStructs with
        shardings: `jaxrl.run.fit` compiles it before any state exists), compiled once per `donate` and compile
        options (by default the chosen ones, `xla_choice`, else the first candidate)."""
        if self._chunk_fns is None:
            self._chunk_fns = {}
        key = (self._xla_options() if xla_options is None else xla_options, donate)
        if key not in self._chunk_fns:
            hp = mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh)
            self._chunk_fns[key], seconds = compile_chunk(
                self._update, state, hp, jnp.int32(1), self.mesh, self.chunk_specs(state),
                xla_options=key[0], check_vma=self.vma_checks, donate=donate)
            self.compile_seconds += seconds
        return self._chunk_fns[key]

    def run_chunk(self, state, hp, num_updates: int, donate: bool = False):
        """`num_updates` updates for every run in one compiled program; returns (state, metrics with leaves
        [R]). `hp` leaves are scalars (shared by every run) or [R] (one value per run: a sweep). `donate`:
        the program reuses `state`'s memory, which is gone after the call (`compile_chunk`)."""
        self.choose_xla_options(state, hp)
        program = self.chunk_program(state, hp, donate)
        return program(state, mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh), jnp.int32(num_updates))
