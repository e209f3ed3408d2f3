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
from ml_collections import ConfigDict

from jaxrl import algos, checkpoint, config as config_lib, mesh as mesh_lib, metrics as metrics_lib

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


def _prepare_workdir(config: ConfigDict, workdir: str) -> None:
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
            "devices": [str(d) for d in jax.devices()], "argv": sys.argv}
    with open(os.path.join(workdir, "run_info.json"), "w") as f:
        json.dump(info, f, indent=2)


def _every(every_steps: int, chunk_steps: int) -> int:
    """How many chunks between two events that should happen every `every_steps` env steps (>= 1)."""
    return max(1, round(every_steps / chunk_steps))


def run(config: ConfigDict, workdir: str | None = None, *, progress: bool | None = None) -> RunResult:
    """Train `config` in `workdir` (created, or resumed when it holds checkpoints)."""
    config_lib.validate(config)
    workdir = workdir or default_workdir(config)
    mesh = mesh_lib.make_mesh(config.mesh.num_devices)
    algo, hyperparams = algos.build(config, mesh)
    _prepare_workdir(config, workdir)
    if hasattr(algo, "write_files"):  # what else the run needs to be reloaded (e.g. a tokenizer)
        algo.write_files(workdir)

    batch = algo.settings.batch_size
    num_updates = algo.settings.num_updates
    chunk = max(1, config.log.every_steps // batch)
    checkpoint_every = _every(config.checkpoint.every_steps, chunk * batch) if config.checkpoint.every_steps else 1
    eval_every = _every(config.eval.every_steps, chunk * batch) if config.eval.every_steps else None

    checkpointer = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
    writer = metrics_lib.MetricsWriter(os.path.join(workdir, "metrics.jsonl"))
    state = algo.init_seeds(config.seed, config.num_seeds)
    update = 0
    if checkpointer.latest_step() is not None:
        update, state = checkpointer.restore_latest(checkpoint.abstract_state(state))
        print(f"resuming {workdir} from update {update} ({update * batch} env steps)", file=sys.stderr)
    writer.truncate_after(update)
    previous_rows = metrics_lib.read(writer.path)
    wall_offset = previous_rows[-1]["wall_time"] if previous_rows else 0.0
    start = time.perf_counter()

    show_progress = config.log.progress_bar if progress is None else progress
    bar = _progress_bar(num_updates * batch, update * batch, config.experiment) if show_progress else None
    interrupted = False
    chunk_index = update // chunk
    with _StopRequests() as stop:
        try:
            while update < num_updates:
                num = min(chunk, num_updates - update)
                tick, compiled_before = time.perf_counter(), algo.compile_seconds
                state, chunk_metrics = algo.run_chunk(state, hyperparams, num)
                chunk_metrics = jax.device_get(chunk_metrics)
                compile_seconds = algo.compile_seconds - compiled_before
                seconds = time.perf_counter() - tick - compile_seconds
                update += num
                chunk_index += 1
                done = update >= num_updates
                row = {"update": update, "env_steps": update * batch,
                       "wall_time": round(wall_offset + time.perf_counter() - start, 3),
                       "steps_per_second": round(num * batch * config.num_seeds / seconds, 1),
                       **metrics_lib.summarize(chunk_metrics)}
                if compile_seconds:
                    row["compile_seconds"] = round(compile_seconds, 2)
                if done or (eval_every and chunk_index % eval_every == 0):
                    eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed), update)
                    row.update(metrics_lib.summarize(jax.device_get(
                        algo.evaluate(state.params, eval_key, config.eval.num_envs))))
                writer.write(row)
                if bar is not None:
                    bar.update(num * batch)
                    bar.set_postfix(_postfix(row), refresh=False)
                if done or stop.signum is not None or chunk_index % checkpoint_every == 0:
                    checkpointer.save(update, state)
                if stop.signum is not None and not done:
                    interrupted = True
                    break
        finally:
            if bar is not None:
                bar.close()
            checkpointer.close()
    rows = metrics_lib.read(writer.path)
    metrics_lib.plot_learning_curve(rows, os.path.join(workdir, "learning_curve.png"), title=config.experiment)
    if not interrupted:
        save_eval_episode(algo, state, config.seed, os.path.join(workdir, "eval_episode.gif"))
    if interrupted:
        print(f"stopped at update {update}; checkpoint saved in {workdir}. Run the same command with "
              f"--workdir={workdir} to resume.", file=sys.stderr)
    return RunResult(workdir, state, rows, interrupted)


def save_eval_episode(algo, state, seed: int, path: str) -> str | None:
    """A GIF of one greedy episode of the first seed, when the env can draw itself; returns its path."""
    env = algo.agent_env
    if not hasattr(env, "render_frames"):
        return None
    from envs.rendering import save_gif

    params = jax.tree.map(lambda x: x[0], state.params)
    states = algo.episode_states(params, jax.random.PRNGKey(seed))
    return save_gif(env.render_frames(states), path)


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
    print(json.dumps({"workdir": result.workdir, **summary}))
    return 128 + signal.SIGTERM if result.interrupted else 0


def _define_flags():
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "experiment config file, e.g. experiments/cartpole_ppo.py",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "run directory (default runs/<experiment>-<time>); resumed if it "
                        "holds checkpoints")
    flags.DEFINE_bool("resume", False, "resume the newest runs/<experiment>-* directory when --workdir is not given")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
