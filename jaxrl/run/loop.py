"""The training loop: compiled chunks of updates, then log, evaluate and checkpoint between them.

One program trains every setting x seed of `run_settings` (a single run is one setting); SIGTERM or Ctrl-C
finishes the current chunk, saves a checkpoint and returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
from ml_collections import ConfigDict

from jaxrl import algos, checkpoint, config as config_lib, distributed, mesh as mesh_lib, metrics as metrics_lib
from jaxrl.engine import describe_xla_choice
from jaxrl.run import divergence, fit as fit_lib, loggers as loggers_lib, population as population_lib
from jaxrl.run import workdir as workdir_lib

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


class _StopRequests:
    """SIGTERM / SIGINT set a flag that the loop checks between chunks; a second Ctrl-C aborts at once."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        if _in_main_thread():
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


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _every(every_steps: int, chunk_steps: int) -> int:
    """How many chunks between two events that should happen every `every_steps` env steps (>= 1)."""
    return max(1, round(every_steps / chunk_steps))


@dataclasses.dataclass
class Setting:
    """One point of a sweep: a config and the directory its metrics, plots and config go to."""

    config: ConfigDict
    workdir: str


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
                 start_state=None, kind: str = workdir_lib.RUN, overwrite: bool = False) -> ProgramResult:
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
    state), where a program without checkpoints begins (a fork of a saved run) instead of `init_seeds`.
    `kind`: what each setting's directory is (`workdir_lib.KINDS`: a single run, or a sweep's setting).
    `overwrite`: delete what the settings' directories and `checkpoint_dir` hold, once the input is checked.
    """
    for setting in settings:
        algos.validate(setting.config)
    resolved = [dataclasses.replace(s, config=algos.resolve(s.config)) for s in settings]
    if distributed.is_main_process():
        for given, setting in zip(settings, resolved):
            derived = config_lib.differences(given.config, setting.config)
            if derived:
                print("config as it trains: " + ", ".join(
                    f"{k} {config_lib.get_value(given.config, k)} -> {config_lib.get_value(setting.config, k)}"
                    for k in derived), file=sys.stderr)
    settings = resolved
    config = settings[0].config
    for setting in settings:
        algos.validate(setting.config)  # again: the checks that involve derived keys
        if algos.static_signature(setting.config) != algos.static_signature(config):
            raise ValueError(f"{setting.workdir}: settings of one program may differ only in the hyperparameter "
                             f"keys {', '.join(algos.hyperparam_keys(config))}")
    num_seeds, num_settings = config.num_seeds, len(settings)
    mesh = make_mesh(config, num_runs=num_settings * num_seeds)
    algo, _ = algos.build(config, mesh)
    hyperparams = jax.tree.map(lambda *xs: jnp.repeat(jnp.stack(xs), num_seeds),
                               *[algos.hyperparams(s.config) for s in settings])
    hyperparams = mesh_lib.runs_of(hyperparams, num_settings * num_seeds, mesh)
    main = distributed.is_main_process()
    loggers_lib.check_backends(config)  # a log library that is not installed: before compiling
    resuming = checkpoint.has_checkpoints(checkpoint_dir) and not overwrite
    if not overwrite:  # a directory whose run this would mislabel or lose is an input error: before compiling
        for setting in settings:
            workdir_lib.check_saved(setting.config, setting.workdir, resuming=resuming or start_state is not None)
    guard = divergence.Guard(config.checkpoint.on_nonfinite, config.checkpoint.max_rollbacks, num_seeds,
                             num_settings, checkpoint_dir, fetch)
    # The chunk program, compiled for the state's shapes before it exists: one that cannot fit in memory
    # fails here, before anything is allocated or written. Chunks reuse their input's memory (donate) unless
    # the guard may replay them from their start.
    abstract = fit_lib.abstract_state(algo, config, num_settings)
    fit = fit_lib.check(algo, abstract, config, hyperparams, donate=not guard.replays_chunks, restoring=resuming)
    if main and fit is not None:
        print(fit.describe() + (f"; close to the limit: {fit.advice()}" if fit.close_to_the_limit else ""),
              file=sys.stderr)
    if overwrite and main:
        for directory in {*(s.workdir for s in settings), checkpoint_dir}:
            workdir_lib.clear(directory)
            print(f"--overwrite: deleted what {directory} held", file=sys.stderr)

    batch = algo.settings.batch_size
    num_updates = algo.settings.num_updates
    if main and num_updates * batch != config.total_steps:
        print(f"note: total_steps={config.total_steps} is not a multiple of one update's {batch} env steps: "
              f"training {num_updates} update{'s' * (num_updates != 1)}, {num_updates * batch} env steps",
              file=sys.stderr)
    chunk = max(1, config.log.every_steps // batch)
    checkpoint_every = _every(config.checkpoint.every_steps, chunk * batch) if config.checkpoint.every_steps else 1
    eval_every = _every(config.eval.every_steps, chunk * batch) if config.eval.every_steps else None

    population = None
    if tuning and tuning[0].method != "grid":
        options, tuned = tuning
        values = {t.key: [config_lib.get_value(s.config, t.key) for s in settings] for t in tuned}
        population = population_lib.Population(options, tuned, values, num_seeds, num_updates, chunk, batch,
                                               config.seed, checkpoint_dir)
    checkpointer = checkpoint.Checkpointer(checkpoint_dir, keep=config.checkpoint.keep,
                                           keep_best=config.checkpoint.keep_best)
    update = 0
    if resuming:  # restored into the abstract state: one copy ever allocated
        update, state = checkpointer.restore_latest(abstract)
        guard.resume(update)
        if population is not None:
            hyperparams = mesh_lib.runs_of(population.resume(update, hyperparams, main), num_seeds * num_settings,
                                           mesh)
        if main:
            print(f"resuming from {checkpoint_dir} at update {update} ({update * batch} env steps)",
                  file=sys.stderr)
    else:
        update, state = (start_state(algo, abstract) if start_state
                         else (0, algo.init_seeds(config.seed, num_seeds, num_settings)))
        if population is not None:
            population.start(main)
    if main:
        for setting in settings:
            workdir_lib.prepare(setting.config, setting.workdir, mesh, kind, update, resuming)
            algo.write_files(setting.workdir)  # what else the run needs to be reloaded (e.g. a tokenizer)
    # Worth predicting only for a run of several chunks: a run of one chunk prints its time when done, and
    # timing would cost it one or two updates more.
    left = num_updates - update
    if fit is not None and guard.replays_chunks and left > chunk:
        seconds = _time_one_update(algo, state, hyperparams)
        if main:
            print(f"expected: {_duration(seconds * chunk)} per chunk of {chunk} updates, "
                  f"{_duration(seconds * left)} for the {left} updates left (one update timed before training)",
                  file=sys.stderr)
    metric_paths = [os.path.join(s.workdir, "metrics.jsonl") for s in settings]
    previous_rows = [r for r in metrics_lib.read(metric_paths[0]) if r["update"] <= update]  # (later rows: redone)
    wall_offset = previous_rows[-1]["wall_time"] if previous_rows else 0.0
    start = time.perf_counter()
    show_progress = main and (config.log.progress_bar if progress is None else progress)
    interrupted = diverged = told_xla_choice = False
    marked = resuming  # whether the settings' run_info records a complete checkpoint
    chunk_index = update // chunk
    # Everything opened here is closed however the loop ends: the loggers (metrics.jsonl, and TensorBoard and
    # W&B when config.log.backends names them; process 0 only), the signal handlers, the checkpointer, the bar.
    with contextlib.ExitStack() as opened:
        loggers = [opened.enter_context(contextlib.closing(loggers_lib.open_loggers(
            s.config, s.workdir, update, update * batch))) for s in settings] if main else []
        stop = opened.enter_context(_StopRequests())

        def record_complete_checkpoint():  # from then on, metrics without a checkpoint mean its checkpoints were lost
            nonlocal marked
            if main and checkpointer.completed and not marked:
                for setting in settings:
                    workdir_lib.mark_checkpointed(setting.workdir)
                marked = True
        opened.callback(record_complete_checkpoint)  # after the checkpointer's close (callbacks run last first)
        opened.callback(checkpointer.close)
        bar = _progress_bar(num_updates * batch, update * batch, config.experiment) if show_progress else None
        if bar is not None:
            opened.callback(bar.close)
        while update < num_updates:
            num = min(chunk, num_updates - update)
            tick, compiled_before = time.perf_counter(), algo.compile_seconds
            if guard.replays_chunks:  # the chunk leaves `state` as it was: a run that diverged in it goes back
                next_state, chunk_metrics = algo.run_chunk(state, hyperparams, num)
            else:  # the chunk reuses the state's memory; a save still reading it must finish first
                checkpointer.wait()
                next_state, chunk_metrics = algo.run_chunk(state, hyperparams, num, donate=True)
                state = None
            chunk_metrics = fetch(chunk_metrics)
            if main and not told_xla_choice and getattr(algo, "xla_choice", None):
                print(describe_xla_choice(algo.xla_choice), file=sys.stderr)
                told_xla_choice = True
            compile_seconds = algo.compile_seconds - compiled_before
            seconds = time.perf_counter() - tick - compile_seconds
            state, chunk_metrics, messages = guard.check(algo.run_chunk, state, next_state, chunk_metrics,
                                                         hyperparams, num, update + 1)
            if main:
                for message in messages:
                    print(f"warning: {message}", file=sys.stderr)
            if guard.stopped:
                diverged = True
                if main:
                    saved = checkpointer.latest_step()
                    kept = f"the checkpoints end at update {saved}" if saved is not None else "nothing was saved"
                    print(f"stopped at update {update + num} (checkpoint.on_nonfinite=stop): {kept}. "
                          "checkpoint.on_nonfinite=freeze finds the update and lets the other seeds go on, "
                          "holding the state twice", file=sys.stderr)
                break
            update += num
            chunk_index += 1
            done = update >= num_updates
            shared = {"update": update, "env_steps": update * batch,
                      "wall_time": round(wall_offset + time.perf_counter() - start, 3),
                      "steps_per_second": round(num * batch * num_seeds * num_settings / seconds, 1)}
            if compile_seconds:
                shared["compile_seconds"] = round(compile_seconds, 2)
            evaluated = done or bool(eval_every and chunk_index % eval_every == 0)
            if evaluated:
                eval_key = evaluation_key(config.seed, update)
                chunk_metrics.update(fetch(algo.evaluate(state.params, eval_key, config.eval.num_envs)))
            groups = population.groups() if population else _setting_groups(num_settings, num_seeds)
            rows = _rows(shared, chunk_metrics, guard, groups)
            for logger, row, group in zip(loggers, rows, groups):
                if len(group):  # (a setting that successive halving dropped logs no more)
                    logger.write(row)
            if bar is not None:
                bar.update(num * batch)
                shown = next(row for row, group in zip(rows, groups) if len(group))  # (the first still training)
                bar.set_postfix(_postfix(shown), refresh=False)
            diverged = guard.all_frozen
            interrupted = stop.signum is not None and not done
            if population is not None and population.due(update) and not diverged:
                event = population.decide(update, chunk_metrics)
                state, hyperparams = population.apply(event, state, hyperparams)
                # placed as the program's inputs were at the start: same shardings, so nothing recompiles
                state = jax.device_put(state, algo.state_shardings(state))
                hyperparams = mesh_lib.runs_of(hyperparams, num_seeds * num_settings, mesh)
                guard.thaw(np.flatnonzero(np.asarray(event["parents"]) != np.arange(num_seeds * num_settings)))
                if main:
                    population.record(event)
            best_candidate = evaluated and config.checkpoint.keep_best > 0
            if done or diverged or interrupted or best_candidate or chunk_index % checkpoint_every == 0:
                checkpointer.save(update, state, metrics_lib.eval_score(chunk_metrics))  # (None: not evaluated)
                if main:
                    guard.save()
                record_complete_checkpoint()  # (the previous save completed before this one started)
            if (diverged and not done) or interrupted:
                break
        all_rows = [metrics_lib.read(path) for path in metric_paths]
        first_params = (fetch(jax.tree.map(lambda x: x[:1], state.params))
                        if not (interrupted or guard.stopped) else None)
        if main:
            for setting, rows in zip(settings, all_rows):
                metrics_lib.plot_learning_curve(rows, os.path.join(setting.workdir, "learning_curve.png"),
                                                title=setting.config.experiment)
            if first_params is not None:  # from the first setting's first seed (e.g. an episode GIF)
                for path in algo.write_artifacts(settings[0].workdir, first_params, config.seed):
                    if path.endswith(".gif"):
                        loggers[0].write_gif(path, update * batch)
            if diverged and update < num_updates and not guard.stopped:
                print(f"stopped at update {update}: every run diverged (see the warnings above); the "
                      "checkpoints hold their last finite states", file=sys.stderr)
            if interrupted:
                print(f"stopped at update {update}; checkpoint saved", file=sys.stderr)
    return ProgramResult(state, all_rows, interrupted, diverged)


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


def make_mesh(config: ConfigDict, num_runs: int):
    """The (runs, data) mesh of `config.mesh` for `num_runs` runs; run_devices 0 gives the runs axis as many
    devices as divide both the mesh and the runs (runs need no communication)."""
    num_devices = config.mesh.num_devices or jax.device_count()
    run_devices = config.mesh.run_devices or mesh_lib.auto_run_devices(num_devices, num_runs)
    mesh = mesh_lib.make_mesh(config.mesh.num_devices, run_devices)
    mesh_lib.check_runs(num_runs, mesh)
    return mesh


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

