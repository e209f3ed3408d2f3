"""The outer training loop: compiled chunks of updates, then log, evaluate and checkpoint between them.

    python -m jaxrl.train --config=experiments/cartpole_ppo.py --config.total_steps=200000
    python -m jaxrl.train --workdir=runs/cartpole_ppo-20261121-120000        # resume from the directory

A run directory holds `config.json`, `run_info.json`, `metrics.jsonl`, `checkpoints/<update>/`,
`learning_curve.png` and, for envs that can draw themselves (SMAX), `eval_episode.gif`. Starting on a directory that has checkpoints resumes from the newest readable one;
on CPU the resumed run ends with the same parameters as one that ran straight through. SIGTERM or Ctrl-C
finishes the current chunk, saves a checkpoint and exits.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from jaxrl import algos, checkpoint, config as config_lib, distributed, host, mesh as mesh_lib, metrics as metrics_lib

# Keys that may change when a run is resumed: extending a run is allowed, anything else would make the
# saved state mean something different.
RESUMABLE_CHANGES = ("total_steps", "log.progress_bar")


@dataclasses.dataclass
class RunResult:
    workdir: str
    state: Any  # the algorithm's TrainState, leaves with a leading seed axis
    metrics: list[dict]  # every row of metrics.jsonl
    interrupted: bool  # stopped by a signal before total_steps


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


def default_workdir(config: ConfigDict) -> str:
    return os.path.join("runs", f"{config.experiment}-{time.strftime('%Y%m%d-%H%M%S')}")


def latest_workdir(experiment: str) -> str | None:
    """The newest `runs/<experiment>-*` directory, for `--resume` without `--workdir`."""
    dirs = sorted(glob.glob(os.path.join("runs", f"{experiment}-*")), key=os.path.getmtime)
    return dirs[-1] if dirs else None


def _git_revision() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _prepare_workdir(config: ConfigDict, workdir: str, mesh) -> None:
    """Create the directory and save the config, or check that it matches the one saved there."""
    os.makedirs(workdir, exist_ok=True)
    saved_path = os.path.join(workdir, "config.json")
    if os.path.exists(saved_path):
        changed = [k for k in config_lib.differences(config_lib.load(saved_path), config)
                   if k not in RESUMABLE_CHANGES]
        if changed:
            raise ValueError(f"{workdir} holds a run with a different config (keys {', '.join(changed)}); "
                             "choose another --workdir or resume with the saved config")
    config_lib.save(config, saved_path)
    info = {"git_revision": _git_revision(), "jax_version": jax.__version__,
            "devices": [str(d) for d in jax.devices()], "processes": jax.process_count(),
            "mesh": dict(mesh.shape), "argv": sys.argv}
    with open(os.path.join(workdir, "run_info.json"), "w") as f:
        json.dump(info, f, indent=2)


def _every(every_steps: int, chunk_steps: int) -> int:
    """How many chunks between two events that should happen every `every_steps` env steps (>= 1)."""
    return max(1, round(every_steps / chunk_steps))


@dataclasses.dataclass
class Setting:
    """One point of a sweep: a config and the directory its metrics, plots and config go to."""

    config: ConfigDict
    workdir: str


def run(config: ConfigDict, workdir: str | None = None, *, progress: bool | None = None) -> RunResult:
    """Train `config` in `workdir` (created, or resumed when it holds checkpoints)."""
    workdir = workdir or default_workdir(config)
    state, rows, interrupted = run_settings([Setting(config, workdir)], os.path.join(workdir, "checkpoints"),
                                            progress=progress)
    return RunResult(workdir, state, rows[0], interrupted)


def run_settings(settings: list[Setting], checkpoint_dir: str, *, progress: bool | None = None):
    """Train every setting x seed as one compiled program; returns (state [R, ...], each setting's metric
    rows, interrupted).

    The settings must differ only in hyperparameters (`algos.static_signature`). Runs are settings-major
    (run r is setting r // num_seeds, seed r % num_seeds; seed s of every setting starts from the same
    key) and are split over the mesh's `runs` axis. The program's checkpoints go to `checkpoint_dir`, each
    setting's config, metrics.jsonl and plots to its own workdir (by process 0 only).
    """
    config = settings[0].config
    for setting in settings:
        algos.validate(setting.config)
        if algos.static_signature(setting.config) != algos.static_signature(config):
            raise ValueError(f"{setting.workdir}: settings of one program may differ only in the hyperparameter "
                             f"keys {', '.join(algos.hyperparam_keys(config))}")
    num_seeds, num_settings = config.num_seeds, len(settings)
    mesh = make_mesh(config, num_runs=num_settings * num_seeds)
    algo, _ = algos.build(config, mesh)
    hyperparams = jax.tree.map(lambda *xs: jnp.repeat(jnp.stack(xs), num_seeds),
                               *[algos.hyperparams(s.config) for s in settings])
    main = distributed.is_main_process()
    if main:
        for setting in settings:
            _prepare_workdir(setting.config, setting.workdir, mesh)
            algo.write_files(setting.workdir)  # what else the run needs to be reloaded (e.g. a tokenizer)

    batch = algo.settings.batch_size
    num_updates = algo.settings.num_updates
    chunk = max(1, config.log.every_steps // batch)
    checkpoint_every = _every(config.checkpoint.every_steps, chunk * batch) if config.checkpoint.every_steps else 1
    eval_every = _every(config.eval.every_steps, chunk * batch) if config.eval.every_steps else None

    checkpointer = checkpoint.Checkpointer(checkpoint_dir, keep=config.checkpoint.keep)
    writers = [metrics_lib.MetricsWriter(os.path.join(s.workdir, "metrics.jsonl")) for s in settings]
    state = algo.init_seeds(config.seed, num_seeds, num_settings)
    update = 0
    if checkpointer.latest_step() is not None:
        update, state = checkpointer.restore_latest(checkpoint.abstract_state(state))
        if main:
            print(f"resuming from {checkpoint_dir} at update {update} ({update * batch} env steps)",
                  file=sys.stderr)
    if main:
        for writer in writers:
            writer.truncate_after(update)
    previous_rows = metrics_lib.read(writers[0].path)
    wall_offset = previous_rows[-1]["wall_time"] if previous_rows else 0.0
    start = time.perf_counter()

    show_progress = main and (config.log.progress_bar if progress is None else progress)
    bar = _progress_bar(num_updates * batch, update * batch, config.experiment) if show_progress else None
    interrupted = False
    chunk_index = update // chunk
    with _StopRequests() as stop:
        try:
            while update < num_updates:
                num = min(chunk, num_updates - update)
                tick, compiled_before = time.perf_counter(), algo.compile_seconds
                state, chunk_metrics = algo.run_chunk(state, hyperparams, num)
                chunk_metrics = fetch(chunk_metrics)
                compile_seconds = algo.compile_seconds - compiled_before
                seconds = time.perf_counter() - tick - compile_seconds
                update += num
                chunk_index += 1
                done = update >= num_updates
                shared = {"update": update, "env_steps": update * batch,
                          "wall_time": round(wall_offset + time.perf_counter() - start, 3),
                          "steps_per_second": round(num * batch * num_seeds * num_settings / seconds, 1)}
                if compile_seconds:
                    shared["compile_seconds"] = round(compile_seconds, 2)
                if done or (eval_every and chunk_index % eval_every == 0):
                    eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed), update)
                    chunk_metrics.update(fetch(algo.evaluate(state.params, eval_key, config.eval.num_envs)))
                rows = [{**shared, **metrics_lib.summarize(per_setting)}
                        for per_setting in _split_runs(chunk_metrics, num_settings)]
                if main:
                    for writer, row in zip(writers, rows):
                        writer.write(row)
                if bar is not None:
                    bar.update(num * batch)
                    bar.set_postfix(_postfix(rows[0]), refresh=False)
                if done or stop.signum is not None or chunk_index % checkpoint_every == 0:
                    checkpointer.save(update, state)
                if stop.signum is not None and not done:
                    interrupted = True
                    break
        finally:
            if bar is not None:
                bar.close()
            checkpointer.close()
    all_rows = [metrics_lib.read(writer.path) for writer in writers]
    first_params = fetch(jax.tree.map(lambda x: x[:1], state.params)) if not interrupted else None
    if main:
        for setting, rows in zip(settings, all_rows):
            metrics_lib.plot_learning_curve(rows, os.path.join(setting.workdir, "learning_curve.png"),
                                            title=setting.config.experiment)
        if first_params is not None:  # from the first setting's first seed (e.g. an episode GIF)
            algo.write_artifacts(settings[0].workdir, first_params, config.seed)
        if interrupted:
            print(f"stopped at update {update}; checkpoint saved. Run the same command with --workdir="
                  f"{os.path.dirname(checkpoint_dir)} to resume.", file=sys.stderr)
    return state, all_rows, interrupted


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
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)


def _split_runs(metrics: dict, num_settings: int) -> list[dict]:
    """Metrics with leaves [R] (runs settings-major) -> one dict per setting with leaves [S]; scalars (e.g.
    token throughputs measured over all runs) are given to every setting."""
    def part(x, i):
        x = np.asarray(x)
        return x.reshape(num_settings, -1)[i] if x.ndim else x
    return [{k: part(v, i) for k, v in metrics.items()} for i in range(num_settings)]


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


def main(argv) -> int:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    FLAGS = flags.FLAGS
    setup_process(FLAGS)
    config, workdir = FLAGS.config, FLAGS.workdir
    if config is None and workdir is None and not FLAGS.resume:
        raise SystemExit("give --config=experiments/<name>.py (and optionally --workdir), or --workdir=<run dir> "
                         "to resume a run")
    if FLAGS.resume and workdir is None:
        if config is None:
            raise SystemExit("--resume needs --config (to find the latest run of that experiment) or --workdir")
        workdir = latest_workdir(config.experiment)
        if workdir is None:
            raise SystemExit(f"--resume: no run of {config.experiment!r} found under runs/")
    if config is None:
        saved = os.path.join(workdir, "config.json")
        if not os.path.exists(saved):
            raise SystemExit(f"{workdir} has no config.json: pass --config as well")
        config = config_lib.load(saved)
    result = run(config, workdir)
    last = result.metrics[-1] if result.metrics else {}
    keys = ("env_steps", *metrics_lib.HEADLINE_KEYS, "wall_time")
    summary = {k: last[k] for k in keys if k in last}
    if distributed.is_main_process():
        print(json.dumps({"workdir": result.workdir, **summary}))
    return 128 + signal.SIGTERM if result.interrupted else 0


def setup_process(FLAGS) -> None:
    """Before any JAX computation: the host's malloc setting (`jaxrl.host`), and joining a multi-process run
    when the flags ask for one."""
    host.keep_freed_memory(FLAGS.malloc_pad_mb)
    if FLAGS.coordinator_address or FLAGS.distributed:
        distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    if FLAGS.workdir is None and jax.process_count() > 1:
        raise SystemExit("a multi-process run needs --workdir on a filesystem every process sees "
                         "(each process would otherwise pick its own time-stamped directory)")


def define_flags():
    """The flags of `python -m jaxrl.train` (and of `jaxrl.sweep`)."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "experiment config file, e.g. experiments/cartpole_ppo.py",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "run directory (default runs/<experiment>-<time>); resumed if it "
                        "holds checkpoints")
    flags.DEFINE_bool("resume", False, "resume the newest runs/<experiment>-* directory when --workdir is not given")
    flags.DEFINE_bool("distributed", False, "join a multi-process run whose coordinator JAX finds in the "
                      "environment (TPU pod, SLURM, Open MPI)")
    flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for a multi-process run started "
                        "by hand (with --num_processes and --process_id)")
    flags.DEFINE_integer("num_processes", 0, "processes in the run (with --coordinator_address)")
    flags.DEFINE_integer("process_id", -1, "this process's index, 0 to num_processes - 1 (with --coordinator_address)")
    flags.DEFINE_integer("malloc_pad_mb", 256, "MiB of freed memory glibc's malloc keeps for reuse (jaxrl.host: "
                         "XLA:CPU programs run faster); 0 leaves malloc as it is")


if __name__ == "__main__":
    from absl import app

    define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
