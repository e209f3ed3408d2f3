"""Training one compiled program of settings x seeds: its plan, then start, step (one chunk) and finish.

    result = run(config, workdir)                 # a single run: one setting
    result = run_settings(settings, checkpoint_dir)  # every setting x seed of a sweep's program

`run_settings` reads the configs once into a `plan.Plan`; `start` builds or restores the state and opens the
run directories; then, inside `opened` (the loggers, signal handlers, checkpointer), `step` runs one chunk of
updates and does what the plan says after it (check for divergence, evaluate, log, tune, save), and `finish`
writes the curves and artifacts. SIGTERM or Ctrl-C
finishes the current chunk, saves a checkpoint and returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
from ml_collections import ConfigDict

from jaxrl import algos, checkpoint, distributed, mesh as mesh_lib, metrics as metrics_lib
from jaxrl.engine import describe_xla_choice
from jaxrl.run import divergence, fit as fit_lib, loggers as loggers_lib, plan as plan_lib
from jaxrl.run import population as population_lib, saved, workdir as workdir_lib
from jaxrl.run.plan import Plan, Setting


@dataclasses.dataclass
class RunResult:
    workdir: str
    state: Any  # the algorithm's TrainState, leaves with a leading seed axis
    metrics: list[dict]  # every row of metrics.jsonl
    interrupted: bool  # stopped by a signal before total_steps
    diverged: bool = False  # stopped because every seed turned non-finite (frozen at its last finite state)


class ProgramResult(NamedTuple):
    """What `run_settings` returns."""

    state: Any  # the algorithm's state, leaves [R, ...] (every run finite)
    rows: list[list[dict]]  # each setting's metric rows
    interrupted: bool
    diverged: bool  # every run turned non-finite, so the program stopped early


def run(config: ConfigDict, workdir: str | None = None, *, progress: bool | None = None,
        overwrite: bool = False) -> RunResult:
    """Train `config` in `workdir` (created, or resumed when it holds checkpoints). `overwrite`: delete the run
    saved there and start again (once the input is checked). A directory of another kind (a sweep, a sweep's
    setting), a saved run this config would mislabel or lose, and a directory another process trains in are
    refused before anything is compiled or written (`jaxrl.run.workdir`)."""
    workdir = workdir or workdir_lib.default_workdir(config)
    workdir_lib.check_kind(workdir, workdir_lib.RUN)
    with workdir_lib.locked(workdir):
        result = run_settings([Setting(config, workdir)], os.path.join(workdir, "checkpoints"), progress=progress,
                              overwrite=overwrite)
    return RunResult(workdir, result.state, result.rows[0], result.interrupted, result.diverged)


def run_settings(settings: list[Setting], checkpoint_dir: str, *, progress: bool | None = None,
                 tuning: tuple[population_lib.Options, list[population_lib.Tuned]] | None = None,
                 start_state: Callable | None = None, kind: str = workdir_lib.RUN,
                 overwrite: bool = False) -> ProgramResult:
    """Train every setting x seed as one compiled program.

    The settings must differ only in hyperparameters (`algos.static_signature`). Runs are settings-major
    (run r is setting r // num_seeds, seed r % num_seeds; seed s of every setting starts from the same
    key) and are split over the mesh's `runs` axis. The program's checkpoints go to `checkpoint_dir`, each
    setting's config, metrics.jsonl and plots to its own workdir (by process 0 only).

    After every chunk each run is checked for non-finite state and metrics (`divergence.Guard`): a diverged
    run is frozen at its last finite state or rolled back (`config.checkpoint.on_nonfinite`), so no
    checkpoint ever holds a non-finite value; the program stops early when every run is frozen, or at once
    with "stop" (whose chunks reuse their input state's memory: the state is held once).

    `tuning`: (options, swept hyperparameters) of a PBT or successive-halving program
    (`jaxrl.run.population`), which decides between chunks. `start_state`: (algo, abstract state) -> (update,
    state), where a program without checkpoints begins (a fork of a saved run) instead of `init_seeds` (or
    the warm start of an algorithm that starts from a saved run's parameters: `saved.warm_start`).
    `kind`: what each setting's directory is (`workdir_lib.KINDS`: a single run, or a sweep's setting).
    `overwrite`: delete what the settings' directories and `checkpoint_dir` hold, once the input is checked.
    """
    settings = plan_lib.as_trained(settings)
    config = settings[0].config
    mesh = mesh_lib.mesh_for_runs(config.mesh, num_runs=len(settings) * config.num_seeds)
    algo, _ = algos.build(config, mesh)
    plan = plan_lib.make(settings, algo.settings, checkpoint_dir, kind=kind, progress=progress, tuning=tuning,
                         overwrite=overwrite)
    training = start(plan, algo, mesh, start_state)
    with opened(plan, training):
        while training.update < plan.num_updates and step(plan, training):
            pass
        return finish(plan, training)


@dataclasses.dataclass
class Training:
    """A program as it trains: what changes from chunk to chunk, and what the chunks write to."""

    algo: Any
    mesh: jax.sharding.Mesh
    hyperparams: Any  # leaves [R]
    guard: divergence.Guard
    population: population_lib.Population | None
    checkpointer: checkpoint.Checkpointer
    main: bool  # process 0: writes the directories' files
    state: Any = None  # leaves [R, ...]; None while a donating chunk runs
    update: int = 0  # updates every run has done
    chunk_index: int = 0  # chunks done since update 0 (counting in whole chunks)
    marked: bool = False  # the settings' run_info records a complete checkpoint
    wall_offset: float = 0.0  # the wall time of the rows logged before this command (resumed)
    started: float = 0.0  # time.perf_counter() when training began
    loggers: list = dataclasses.field(default_factory=list)  # per setting (process 0)
    stop: _StopRequests | None = None
    bar: Any = None  # the progress bar (process 0, log.progress_bar)
    told_xla_choice: bool = False
    interrupted: bool = False  # stopped by a signal
    diverged: bool = False  # every run frozen, or one diverged with on_nonfinite "stop"


# --- start -------------------------------------------------------------------------------------------------------

def start(plan: Plan, algo, mesh, start_state: Callable | None = None) -> Training:
    """Check the input, compile the chunk program for the state's shapes (one that cannot fit fails here,
    before anything is allocated or written), restore the state (or make it) and prepare the settings'
    directories."""
    main = distributed.is_main_process()
    hyperparams = _hyperparams(plan, mesh)
    _check_input(plan, forking=start_state is not None)
    start_state = start_state or saved.warm_start(algo, plan)  # (reads the saved parameters before compiling)
    guard = divergence.Guard(plan.on_nonfinite, plan.max_rollbacks, plan.num_seeds, plan.num_settings,
                             plan.checkpoint_dir, fetch)
    abstract = algo.abstract_seeds(plan.seed, plan.num_seeds, plan.num_settings)
    # Chunks reuse their input's memory (donate) unless the guard may replay them from their start.
    check_fit = functools.partial(fit_lib.check, algo, abstract, hyperparams, restoring=plan.resuming,
                                  donate=not guard.replays_chunks)
    # A run whose newest checkpoint is its last update has nothing left to compile: it only reports.
    finished = plan.resuming and checkpoint.saved_steps(plan.checkpoint_dir)[-1] >= plan.num_updates
    fit = None if finished else check_fit()
    if main:
        _before_writing(plan, fit)
    t = Training(algo, mesh, hyperparams, guard, _population(plan), checkpoint.Checkpointer(
        plan.checkpoint_dir, keep=plan.keep, keep_best=plan.keep_best), main)
    if plan.resuming:  # restored into the abstract state: one copy ever allocated
        _resume(plan, t, abstract)
    else:
        _begin(plan, t, abstract, start_state)
    if fit is None and t.update < plan.num_updates:  # the last checkpoint was damaged and an older one restored
        check_fit()
    if main:
        for setting in plan.settings:
            workdir_lib.prepare(setting.config, setting.workdir, mesh, plan.kind, t.update, plan.resuming)
            algo.write_files(setting.workdir)  # what else the run needs to be reloaded (e.g. a tokenizer)
    if guard.replays_chunks and plan.num_updates - t.update > plan.chunk and not algo.host_state:
        _predict_time(plan, t)  # (envs on the host cannot take the timed update back)
    t.wall_offset, t.marked, t.chunk_index = _wall_offset(plan, t.update), plan.resuming, t.update // plan.chunk
    t.started = time.perf_counter()
    return t


def _check_input(plan: Plan, forking: bool) -> None:
    """Before compiling: a log library that is not installed, and a directory whose run this program would
    mislabel or lose (`forking`: it starts from another run's checkpoint) are input errors."""
    loggers_lib.check_backends(plan.config)
    if not plan.overwrite:
        for setting in plan.settings:
            workdir_lib.check_saved(setting.config, setting.workdir, resuming=plan.resuming or forking)


def _hyperparams(plan: Plan, mesh):
    """Every run's traced hyperparameters, leaves [R] (settings-major), split over the mesh's runs axis."""
    stacked = jax.tree.map(lambda *xs: jnp.repeat(jnp.stack(xs), plan.num_seeds),
                           *[algos.hyperparams(s.config) for s in plan.settings])
    return mesh_lib.runs_of(stacked, plan.num_runs, mesh)


def _before_writing(plan: Plan, fit: fit_lib.ProgramFit | None) -> None:
    """Process 0, once the program fits: print its memory, clear what --overwrite deletes, and note a
    total_steps that is not a whole number of updates."""
    if fit is not None:  # (None: a finished run, nothing compiled)
        print(fit.describe() + (f"; close to the limit: {fit.advice()}" if fit.close_to_the_limit else ""),
              file=sys.stderr)
    if plan.overwrite:
        for directory in {*(s.workdir for s in plan.settings), plan.checkpoint_dir}:
            workdir_lib.clear(directory)
            print(f"--overwrite: deleted what {directory} held", file=sys.stderr)
    trained = plan.num_updates * plan.batch
    if trained != plan.total_steps:
        print(f"note: total_steps={plan.total_steps} is not a multiple of one update's {plan.batch} env steps: "
              f"training {plan.num_updates} update{'s' * (plan.num_updates != 1)}, {trained} env steps",
              file=sys.stderr)


def _population(plan: Plan) -> population_lib.Population | None:
    """The tuning of a PBT or halving program (None for any other)."""
    if plan.tuning is None:
        return None
    return population_lib.Population(plan.tuning, list(plan.tuned), plan.tuned_values, plan.num_seeds,
                                     plan.num_updates, plan.chunk, plan.batch, plan.seed, plan.checkpoint_dir)


def _begin(plan: Plan, t: Training, abstract, start_state: Callable | None) -> None:
    """The state a program without checkpoints starts from: `start_state`'s (a fork), else `init_seeds`."""
    t.update, t.state = start_state(t.algo, abstract) if start_state else (0, t.algo.init_seeds(
        plan.seed, plan.num_seeds, plan.num_settings))
    if t.population is not None:
        t.population.start(t.main)


def _resume(plan: Plan, t: Training, abstract) -> None:
    """Restore the newest readable checkpoint, the guard's frozen runs and the population's hyperparameters as
    they were then."""
    t.update, t.state = t.checkpointer.restore_latest(abstract)
    t.guard.resume(t.update)
    if t.population is not None:
        t.hyperparams = mesh_lib.runs_of(t.population.resume(t.update, t.hyperparams, t.main), plan.num_runs,
                                         t.mesh)
    if t.main:
        print(f"resuming from {plan.checkpoint_dir} at update {t.update} ({t.update * plan.batch} env steps)",
              file=sys.stderr)


def _predict_time(plan: Plan, t: Training) -> None:
    """Print how long a chunk and the rest of the run will take, from one update timed now. Worth it only for
    a run of several chunks: a run of one chunk prints its time when done, and timing would cost it one or
    two updates more."""
    left = plan.num_updates - t.update
    seconds = _time_one_update(t.algo, t.state, t.hyperparams)
    if t.main:
        print(f"expected: {_duration(seconds * plan.chunk)} per chunk of {plan.chunk} updates, "
              f"{_duration(seconds * left)} for the {left} updates left (one update timed before training)",
              file=sys.stderr)


def _wall_offset(plan: Plan, update: int) -> float:
    """The wall time the rows up to `update` ended at (later rows are redone)."""
    path = os.path.join(plan.settings[0].workdir, "metrics.jsonl")
    previous = metrics_lib.rows_through(path, update)
    return previous[-1]["wall_time"] if previous else 0.0


@contextlib.contextmanager
def opened(plan: Plan, training: Training):
    """Everything open while the program trains (`step` runs inside it), closed however it ends: the loggers (metrics.jsonl, and
    TensorBoard and W&B when log.backends names them; process 0 only), the signal handlers, the checkpointer,
    the progress bar."""
    with contextlib.ExitStack() as opened:
        if training.main:
            training.loggers = [opened.enter_context(contextlib.closing(loggers_lib.open_loggers(
                s.config, s.workdir, training.update, training.update * plan.batch))) for s in plan.settings]
        training.stop = opened.enter_context(_StopRequests())
        opened.callback(_record_complete_checkpoint, plan, training)  # after the checkpointer's close
        opened.callback(training.checkpointer.close)
        if training.main and plan.progress_bar:
            training.bar = _progress_bar(plan.num_updates * plan.batch, training.update * plan.batch,
                                         plan.experiment)
            opened.callback(training.bar.close)
        yield


def _record_complete_checkpoint(plan: Plan, training: Training) -> None:
    """From the first complete checkpoint on, metrics without a checkpoint mean its checkpoints were lost:
    the settings' run_info records it (process 0)."""
    if training.main and training.checkpointer.completed and not training.marked:
        for setting in plan.settings:
            workdir_lib.mark_checkpointed(setting.workdir)
        training.marked = True


# --- step --------------------------------------------------------------------------------------------------------

def step(plan: Plan, training: Training) -> bool:
    """One chunk: run it, check it for divergence, evaluate, log, tune and save as the plan says. Whether the
    program goes on (False: it stopped, diverged or was interrupted; it also ends after its last update)."""
    t = training
    num = min(plan.chunk, plan.num_updates - t.update)
    metrics, seconds, compile_seconds = _run_chunk(t, num)
    if t.guard.stopped:
        t.diverged = True
        if t.main:
            _report_stop(t, t.update + num)
        return False
    t.update += num
    t.chunk_index += 1
    done = t.update >= plan.num_updates
    shared = _shared_row(plan, t, num, seconds, compile_seconds)  # (timed before the evaluation)
    evaluated = plan.evaluates_after(t.chunk_index, done)
    if evaluated:
        key = evaluation_key(plan.seed, t.update)
        metrics.update(fetch(t.algo.evaluate(t.state.params, key, plan.eval_episodes)))
    _log(plan, t, num, shared, metrics)
    t.diverged = t.guard.all_frozen
    t.interrupted = t.stop.signum is not None and not done
    if t.population is not None:
        t.population.observe(t.update, metrics, t.main)  # (before a save: a resume rebuilds the curves to it)
        if t.population.due(t.update) and not t.diverged:
            _tune(plan, t, metrics)
    if done or t.diverged or t.interrupted or plan.saves_after(t.chunk_index, evaluated):
        t.checkpointer.save(t.update, t.state, metrics_lib.eval_score(metrics))  # (None: not evaluated)
        if t.main:
            t.guard.save()
        _record_complete_checkpoint(plan, t)  # (the previous save completed before this one started)
    return not ((t.diverged and not done) or t.interrupted)


def _run_chunk(t: Training, num: int) -> tuple[dict, float, float]:
    """Run `num` updates of every run and check them (`divergence.Guard`): (host metrics [R], seconds the
    chunk ran, seconds it spent compiling)."""
    tick, compiled_before = time.perf_counter(), t.algo.compile_seconds
    if t.guard.replays_chunks:  # the chunk leaves `state` as it was: a run that diverged in it goes back
        next_state, metrics = t.algo.run_chunk(t.state, t.hyperparams, num)
    else:  # the chunk reuses the state's memory; a save still reading it must finish first
        t.checkpointer.wait()
        next_state, metrics = t.algo.run_chunk(t.state, t.hyperparams, num, donate=True)
        t.state = None
    metrics = fetch(metrics)
    if t.main and not t.told_xla_choice and t.algo.xla_choice:
        print(describe_xla_choice(t.algo.xla_choice), file=sys.stderr)
        t.told_xla_choice = True
    compile_seconds = t.algo.compile_seconds - compiled_before
    seconds = time.perf_counter() - tick - compile_seconds
    t.state, metrics, messages = t.guard.check(t.algo.run_chunk, t.state, next_state, metrics, t.hyperparams,
                                               num, t.update + 1)
    if t.main:
        for message in messages:
            print(f"warning: {message}", file=sys.stderr)
    return metrics, seconds, compile_seconds


def _report_stop(t: Training, update: int) -> None:
    saved = t.checkpointer.latest_step()
    kept = f"the checkpoints end at update {saved}" if saved is not None else "nothing was saved"
    print(f"stopped at update {update} (checkpoint.on_nonfinite=stop): {kept}. "
          "checkpoint.on_nonfinite=freeze finds the update and lets the other seeds go on, "
          "holding the state twice", file=sys.stderr)


def _shared_row(plan: Plan, t: Training, num: int, seconds: float, compile_seconds: float) -> dict:
    """What every setting's row of this chunk holds: update, env steps, wall time, throughput, compile time."""
    shared = {"update": t.update, "env_steps": t.update * plan.batch,
              "wall_time": round(t.wall_offset + time.perf_counter() - t.started, 3),
              "steps_per_second": round(num * plan.batch * plan.num_seeds * plan.num_settings / seconds, 1)}
    if compile_seconds:
        shared["compile_seconds"] = round(compile_seconds, 2)
    return shared


def _log(plan: Plan, t: Training, num: int, shared: dict, metrics: dict) -> None:
    """Write each setting's row (a setting that successive halving dropped logs no more) and move the bar."""
    groups = t.population.groups() if t.population else _setting_groups(plan.num_settings, plan.num_seeds)
    rows = _rows(shared, metrics, t.guard, groups)
    for logger, row, group in zip(t.loggers, rows, groups):
        if len(group):
            logger.write(row)
    if t.bar is not None:
        t.bar.update(num * plan.batch)
        shown = next(row for row, group in zip(rows, groups) if len(group))  # (the first still training)
        t.bar.set_postfix(_postfix(shown), refresh=False)


def _tune(plan: Plan, t: Training, metrics: dict) -> None:
    """A PBT or halving decision: runs continue others' states with new hyperparameters."""
    event = t.population.decide(t.update, metrics)
    state, hyperparams = t.population.apply(event, t.state, t.hyperparams)
    # placed as the program's inputs were at the start: same shardings, so nothing recompiles
    t.state = jax.device_put(state, t.algo.state_shardings(state))
    t.hyperparams = mesh_lib.runs_of(hyperparams, plan.num_runs, t.mesh)
    t.guard.thaw(np.flatnonzero(np.asarray(event["parents"]) != np.arange(plan.num_runs)))
    if t.main:
        t.population.record(event)


# --- finish ------------------------------------------------------------------------------------------------------

def finish(plan: Plan, t: Training) -> ProgramResult:
    """Every setting's rows and learning curve, the artifacts of the first setting's first seed (e.g. an
    episode GIF; with log.artifacts, not after a stop or interruption) and how the program ended."""
    all_rows = [metrics_lib.read(os.path.join(s.workdir, "metrics.jsonl")) for s in plan.settings]
    first_params = (fetch(jax.tree.map(lambda x: x[:1], t.state.params))
                    if plan.artifacts and not (t.interrupted or t.guard.stopped) else None)
    if t.main:
        for setting, rows in zip(plan.settings, all_rows):
            metrics_lib.plot_learning_curve(rows, os.path.join(setting.workdir, "learning_curve.png"),
                                            title=plan.experiment)
        if first_params is not None:
            for path in t.algo.write_artifacts(plan.settings[0].workdir, first_params, plan.seed):
                if path.endswith(".gif"):
                    t.loggers[0].write_gif(path, t.update * plan.batch)
        if t.diverged and t.update < plan.num_updates and not t.guard.stopped:
            print(f"stopped at update {t.update}: every run diverged (see the warnings above); the "
                  "checkpoints hold their last finite states", file=sys.stderr)
        if t.interrupted:
            print(f"stopped at update {t.update}; checkpoint saved", file=sys.stderr)
    return ProgramResult(t.state, all_rows, t.interrupted, t.diverged)


# --- helpers -----------------------------------------------------------------------------------------------------

class _StopRequests:
    """SIGTERM / SIGINT set a flag that the loop checks between chunks; a second Ctrl-C aborts at once."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nreceived {signal.Signals(signum).name}: saving a checkpoint after this chunk "
              "(Ctrl-C again to abort without saving)", file=sys.stderr)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


_RETIME_UNDER = 10.0  # seconds: a longer first call is kept as it is rather than spend as long again


def evaluation_key(seed: int, update: int) -> jax.Array:
    """The key of the evaluation after `update` updates of a run seeded `seed` (the same for every seed of the
    program: runs differ only by their policies)."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), update)


def _time_one_update(algo, state, hyperparams) -> float:
    """Seconds one update of every run takes, timed on `state` (left as it was: the program does not donate
    it) with the compiled chunk program. A first call includes one-off work (thread pools, allocations), which
    on a busy machine took over a second for an update of milliseconds: unless the first call was long enough
    for that not to matter (`_RETIME_UNDER` seconds), a second call is timed and the faster one kept. With
    several processes, process 0's first timing decides for all: each call is a collective program that every
    process must run."""
    def timed() -> float:  # without what the call spent compiling (or choosing a program: xla_options "auto")
        tick, compiled_before = time.perf_counter(), algo.compile_seconds
        jax.block_until_ready(algo.run_chunk(state, hyperparams, 1))
        return time.perf_counter() - tick - (algo.compile_seconds - compiled_before)
    seconds = timed()
    if jax.process_count() > 1:
        seconds = float(multihost_utils.broadcast_one_to_all(np.float32(seconds)))
    return min(seconds, timed()) if seconds < _RETIME_UNDER else seconds


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 7200 else f"{seconds / 3600:.3g} h"


def fetch(tree):
    """Host (numpy) copies of a pytree of global arrays; with several processes, every process calls this
    and receives the whole arrays."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def _setting_groups(num_settings: int, num_seeds: int) -> list[np.ndarray]:
    """Per setting, its runs (settings-major)."""
    return [np.arange(s * num_seeds, (s + 1) * num_seeds) for s in range(num_settings)]


def _rows(shared: dict, metrics: dict, guard: divergence.Guard, groups: list[np.ndarray]) -> list[dict]:
    """One metrics row per setting: `shared` (update, env steps, times), the means and per-seed values of the
    chunk's metrics [R] over the setting's runs (`groups`), and which of them (positions) are frozen."""
    rows = [{**shared, **metrics_lib.summarize(per_setting)} for per_setting in _split_runs(metrics, groups)]
    for row, group in zip(rows, groups):
        if frozen := [i for i, run in enumerate(group) if run in guard.frozen]:
            row["frozen_seeds"] = frozen
    return rows


def _split_runs(metrics: dict, groups: list[np.ndarray]) -> list[dict]:
    """Metrics with leaves [R] -> one dict per group of runs with leaves [len(group)]; scalars (e.g. token
    throughputs measured over all runs) are given to every group."""
    def part(x, group):
        x = np.asarray(x)
        return x[group] if x.ndim else x
    return [{k: part(v, group) for k, v in metrics.items()} for group in groups]


def _progress_bar(total: int, initial: int, name: str):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=name, unit="step", unit_scale=True, dynamic_ncols=True,
                mininterval=1.0)


def _postfix(row: dict) -> dict:
    out = {"sps": f"{row['steps_per_second']:.3g}"}
    for key in metrics_lib.HEADLINE_KEYS:
        if row.get(key) is not None:
            out[key.replace("episode_", "")] = f"{row[key]:.3g}"
    return out
