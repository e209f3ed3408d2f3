"""An algorithm as a value: its static settings, the mesh, and pure functions, compiled here.

    algorithm = engine.Algorithm(settings, mesh, init=init, update=update, evaluate=evaluate, actor=actor)
    state = algorithm.init_seeds(seed=0, num_seeds=4)                  # leaves [R, ...] on the mesh
    state, metrics = algorithm.run_chunk(state, hyperparams, num_updates=100)

A family builds one from its own functions (usually bound to a small frozen context holding its env, network
and settings); nothing subclasses it. The record also keeps what the engine learns about its programs (the
compiled chunk programs, the seconds spent compiling, the XLA options chosen), which is why it is not frozen.

A state is a pytree whose leaves carry a leading run axis [R, ...] (R = settings x seeds) with a leaf
`update_step` [R]; hyperparameters are a pytree of traced numbers with scalar or [R] leaves.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl import checkpoint, config as config_lib, mesh as mesh_lib
from jaxrl.engine import staleness
from jaxrl.engine.chunks import bitwise_equal, compile_chunk, fastest_if_equal, seed_keys
from jaxrl.jitting import RUNS_ONCE, jit_method
from jaxrl.mesh import RUN_AXIS


def every_leaf_over_runs(state):
    """The default state layout: every leaf split over the mesh's runs axis only."""
    return jax.tree.map(lambda _: P(RUN_AXIS), state)


def no_files(workdir: str) -> list[str]:
    return []


@dataclasses.dataclass(eq=False)
class Algorithm:
    """What the training loop (`jaxrl.train`), sweeps and benchmarks ask of an algorithm."""

    settings: Any  # static choices; `.batch_size` (env steps or samples per update, all devices), `.num_updates`
    mesh: jax.sharding.Mesh  # the (runs, data) mesh its programs run on
    init: Callable  # key [2] -> one run's state (no run axis; a leaf `update_step`)
    update: Callable  # (one run's state on this device, hp) -> (state, metrics): inside shard_map, traced
    evaluate: Callable  # (params [R, ...], key, num) -> metrics of the current policies (leaves [R])
    actor: Callable  # one run's params -> a loaded policy (`jaxrl.load_policy`)
    state_specs: Callable = every_leaf_over_runs  # state -> a PartitionSpec per leaf ([R, ...] over runs)
    # At the start of a run: what else a run directory needs to be reloaded (e.g. a tokenizer).
    write_files: Callable[[str], Any] = no_files
    # (workdir, params [1, ...], seed) -> at the end of a run, files to look at (an episode GIF, completions)
    write_artifacts: Callable[..., list[str]] = lambda workdir, params, seed: []
    # memory advice (`jaxrl.run.fit`): state field -> the config key that sizes it
    sized_by: dict = dataclasses.field(default_factory=dict)
    # (key [2], one run's params) -> one run's state starting from those parameters (a warm start: text GRPO
    # from an SFT run); None: the algorithm cannot start from parameters
    init_from_params: Callable | None = None
    # a saved run (or exported policy) whose parameters the runs start from: the run layer reads them
    # (`jaxrl.run.saved.warm_start`) and passes them to `init_seeds`; "" for none
    starts_from: str = ""
    # ((name, saved run), ...): other runs' parameters the state keeps frozen (a reward model), read as `starts_from`
    # is and passed to `init_from_params` as keyword `name` (leaves without the run axis)
    frozen_from: tuple[tuple[str, str], ...] = ()
    vma_checks: bool = True  # shard_map's varying-axes checks (off for envs whose code does not pass them)
    # its envs live on the host (`envs.Environment.host_state`): a device's runs go one after another, and a
    # state is stepped once (no update timed before training, no XLA options chosen by timing candidates)
    host_state: bool = False
    # the update as `jaxrl.engine.staleness.update` composes it (sample, learn, roles, eta), when it does: with envs
    # on the host and a `role` axis, the engine runs the two halves as two programs in two threads
    stale: Any = None
    parts: Any = None  # the family's own objects (env policy, model, task, ...): for tests and notebooks
    # What the engine keeps: seconds spent compiling so far (the loop reports a chunk's compile time apart);
    # with xla_options "auto", once chosen, {"options", "candidates", "seconds", "equal"} (`choose_xla_options`)
    compile_seconds: float = 0.0
    xla_choice: dict | None = None
    _programs: dict = dataclasses.field(default_factory=dict, repr=False)  # (xla options, donate) -> program
    _threaded: Any = dataclasses.field(default=None, repr=False)  # `staleness.ThreadedRoles`, once built

    def xla_candidates(self) -> tuple:
        """The XLA compile options the chunk program may take (`config.xla_candidates` of
        `settings.xla_options`; settings without them: XLA's defaults)."""
        return config_lib.xla_candidates(getattr(self.settings, "xla_options", ()))

    def _xla_options(self) -> tuple:
        return self.xla_choice["options"] if self.xla_choice else self.xla_candidates()[0]

    def state_shardings(self, state):
        """NamedShardings of a state with a leading run axis, by `state_specs`."""
        return jax.tree.map(lambda spec, _: NamedSharding(self.mesh, spec), self.state_specs(state), state,
                            is_leaf=lambda x: isinstance(x, P))

    def init_seeds(self, seed: int, num_seeds: int, num_settings: int = 1, start_params=None, frozen=None):
        """The state of R = num_settings * num_seeds runs (leading run axis; see `seed_keys`), on the mesh.
        With `start_params` (leaves [S', ...], the seeds of a saved run: a warm start) run r starts from those
        of seed (r mod num_seeds) mod S'; `frozen` ({name: leaves [S', ...]}, `frozen_from`'s) are chosen alike."""
        keys = self._keys(seed, num_seeds, num_settings)
        self._check_sources(start_params, frozen)
        if start_params is None and not frozen:
            return self._placed(self._init_runs(keys))
        pick = lambda tree: jax.tree.map(  # noqa: E731
            lambda x: x[jnp.arange(len(keys)) % num_seeds % x.shape[0]], tree)
        return self._placed(self._warm_runs(keys, pick(start_params), pick(frozen or {})))

    def abstract_seeds(self, seed: int, num_seeds: int, num_settings: int = 1, start_params=None, frozen=None):
        """`init_seeds`' state as ShapeDtypeStructs with their shardings, nothing allocated or read: what the fit
        check compiles for and what a checkpoint is restored into. With `start_params` (and `frozen`), traced from
        them (a warm start's shapes are a fresh one's; parameters that do not fit this algorithm's raise here)."""
        keys = self._keys(seed, num_seeds, num_settings)
        if start_params is None and not frozen:
            abstract = self._init_runs.eval_shape(keys)
        else:
            self._check_sources(start_params, frozen)
            runs = lambda tree: jax.tree.map(  # noqa: E731
                lambda x: jax.ShapeDtypeStruct((len(keys), *x.shape[1:]), x.dtype), tree)
            abstract = self._warm_runs.eval_shape(keys, runs(start_params), runs(frozen or {}))
        return checkpoint.abstract_state(abstract, self.state_shardings(abstract))

    def _check_sources(self, start_params, frozen) -> None:
        """The parameters passed are those the algorithm reads from saved runs (`starts_from`, `frozen_from`)."""
        if (start_params is not None or frozen) and self.init_from_params is None:
            raise ValueError("this algorithm cannot start from another run's parameters")
        if start_params is None and self.starts_from:
            raise ValueError(f"these runs start from the parameters of {self.starts_from}: pass them as "
                             "start_params (`jaxrl.run.saved.start_params`), or train with `jaxrl.train.run`")
        wanted, given = sorted(name for name, _ in self.frozen_from), sorted(frozen or {})
        if wanted != given:
            raise ValueError(f"these runs keep the frozen parameters {wanted} (of {dict(self.frozen_from)}), given "
                             f"{given}: pass them as frozen (`jaxrl.run.saved.warm_start`)")

    def _keys(self, seed: int, num_seeds: int, num_settings: int) -> jax.Array:
        keys = seed_keys(seed, num_seeds, num_settings)
        mesh_lib.check_runs(len(keys), self.mesh)
        return keys

    def _placed(self, state):
        return jax.device_put(state, self.state_shardings(state))

    @jit_method(compiler_options=RUNS_ONCE)
    def _warm_runs(self, keys: jax.Array, params, frozen: dict):
        """One state per key [R, 2] from params [R, ...] or None, and frozen {name: [R, ...]} (`init_from_params`),
        one after another as `_init_runs` (a fresh network's orthogonal initialiser under vmap: a batched QR)."""
        return jax.lax.map(lambda run: self.init_from_params(run[0], run[1], **run[2]), (keys, params, frozen))

    @jit_method(compiler_options=RUNS_ONCE)
    def _init_runs(self, keys: jax.Array):
        """One state per key [R, 2], one after another (lax.map, not vmap) on one device, then placed on the
        mesh: a batched QR (flax's orthogonal initialiser under vmap) can deadlock XLA:CPU's LAPACK thread pool
        (jaxlib 0.10.2), and a replicated init would run on every device."""
        return jax.lax.map(self.init, keys)

    def chunk_program(self, state, hp, donate: bool = False, xla_options: tuple | None = None):
        """The compiled chunk program for states shaped like `state` (arrays, or ShapeDtypeStructs with
        shardings: `jaxrl.run.fit` compiles it before any state exists), compiled once per `donate` and compile
        options (by default the chosen ones, else the first candidate)."""
        key = (self._xla_options() if xla_options is None else xla_options, donate)
        if key not in self._programs:
            hp = mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh)
            self._programs[key], seconds = compile_chunk(
                self.update, state, hp, jnp.int32(1), self.mesh, self.state_specs(state), xla_options=key[0],
                check_vma=self.vma_checks, donate=donate, sequential_runs=self.host_state)
            self.compile_seconds += seconds
        return self._programs[key]

    def choose_xla_options(self, state, hp, rounds: int = 3) -> None:
        """With several candidate options: compile the chunk program with each, time one update of each on
        `state` `rounds` times in turns (`state` is left as it was), and keep the fastest when every candidate's
        state after that update is bitwise equal to the first's (else the first). Process 0's choice holds for
        all processes. The seconds it takes count as compiling. While it runs, the state is held three times."""
        candidates = self.xla_candidates()
        if self.xla_choice is not None or len(candidates) == 1:
            return
        if self.host_state:
            raise ValueError("xla_options 'auto' times candidate programs on one state, which envs on the host "
                             "cannot give twice: name the options (or leave them at XLA's defaults)")
        tick, compiled_before = time.perf_counter(), self.compile_seconds
        programs = [self.chunk_program(state, hp, xla_options=options) for options in candidates]
        hp = mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh)
        # a metric may differ in its last bits where the state is bitwise equal (text GRPO's approx_kl)
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

    def run_chunk(self, state, hp, num_updates: int, donate: bool = False):
        """`num_updates` updates for every run in one compiled program; returns (state, metrics with leaves
        [R]). `hp` leaves are scalars (shared by every run) or [R] (one value per run: a sweep). `donate`
        (only with `checkpoint.on_nonfinite` "stop"): the program reuses `state`'s memory, which is gone
        after the call."""
        if self.host_state and self.stale is not None and mesh_lib.split_actor(self.mesh):
            return self._run_threaded(state, hp, num_updates)
        self.choose_xla_options(state, hp)
        program = self.chunk_program(state, hp, donate)
        return program(state, mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh), jnp.int32(num_updates))

    def _run_threaded(self, state, hp, num_updates: int):
        """`run_chunk` for envs on the host with actor and learner devices: `staleness.ThreadedRoles`."""
        if self._threaded is None:
            self._threaded = staleness.ThreadedRoles(self.stale, self.mesh, self.state_specs, self.state_shardings,
                                                     check_vma=self.vma_checks, sequential_runs=self.host_state)
        before = self._threaded.compile_seconds
        out = self._threaded.run_chunk(state, hp, num_updates)
        self.compile_seconds += self._threaded.compile_seconds - before
        return out
