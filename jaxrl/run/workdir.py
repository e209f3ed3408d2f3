"""A run's directory: what it is, whose it is, and whether a command may train in it.

    <workdir>/config.json      the config (a run resumes only with the same one, but for RESUMABLE_CHANGES and
                               keys added to jaxrl since the run began)
    <workdir>/run_info.json    what the directory is (KINDS), and the history of the commands that trained in it:
                               command line, git revision, jax version, devices, processes, mesh, start update;
                               whether a checkpoint of it was ever complete

The process that trains in a directory holds a lock on it (flock; released when the process ends, however it
ends): a second process is refused.

A directory is of one kind: a single run (`jaxrl.train`), a sweep (`jaxrl.sweep`, with a directory per setting
and its programs' checkpoints), or one setting of a sweep. A command refuses a directory of another kind, a
directory whose saved run it would mislabel or lose (another config, other swept settings, metrics without a
checkpoint to resume them from) and one that another process trains in, before compiling or writing anything;
`--overwrite` starts a run or sweep again on purpose.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import time

import jax
from ml_collections import ConfigDict

from jaxrl import config as config_lib, files, metrics as metrics_lib

RUN, SWEEP, SETTING = "run", "sweep", "sweep setting"
KINDS = (RUN, SWEEP, SETTING)
RUN_INFO, SWEEP_FILE = "run_info.json", "sweep.json"

# Keys that may change when a run is resumed (extending it, where its logs go, how often it evaluates and saves,
# what happens if it diverges): none changes what trains (the evaluation key depends on the update alone);
# anything else would make the saved state mean something different. total_steps may only grow.
RESUMABLE_CHANGES = ("total_steps", "log.progress_bar", "log.artifacts", "log.backends", "log.wandb_project",
                     "log.wandb_mode", "eval.every_steps", "eval.episodes", "checkpoint.every_steps", "checkpoint.keep",
                     "checkpoint.keep_best", "checkpoint.on_nonfinite", "checkpoint.max_rollbacks")


def default_workdir(config: ConfigDict, kind: str = RUN) -> str:
    infix = "-sweep" if kind == SWEEP else ""
    return os.path.join("runs", f"{config.experiment}{infix}-{time.strftime('%Y%m%d-%H%M%S')}")


def kind_of(directory: str) -> str | None:
    """RUN, SWEEP or SETTING for a directory jaxrl wrote, None for one it did not (or that does not exist).
    Directories written before run_info.json named their kind are told by their files."""
    info = _read_info(directory)
    if info.get("kind") in KINDS:
        return info["kind"]
    if os.path.exists(os.path.join(directory, SWEEP_FILE)):
        return SWEEP
    if os.path.exists(os.path.join(os.path.dirname(os.path.normpath(directory)), SWEEP_FILE)):
        return SETTING
    if any(os.path.exists(os.path.join(directory, name)) for name in ("config.json", "checkpoints", "metrics.jsonl")):
        return RUN
    return None


def latest_workdir(experiment: str) -> str | None:
    """The newest single run of `experiment` under runs/ (`runs/<experiment>-*`, sweeps and runs of other
    experiments left out), for `--resume` without `--workdir`."""
    def ours(path: str) -> bool:
        config = os.path.join(path, "config.json")
        return (kind_of(path) == RUN and os.path.exists(config)
                and files.read_json(config, {}).get("experiment") == experiment)
    dirs = sorted((d for d in glob.glob(os.path.join("runs", f"{experiment}-*")) if ours(d)), key=os.path.getmtime)
    return dirs[-1] if dirs else None


def git_revision() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def check_kind(directory: str, kind: str) -> None:
    """ValueError, before anything is written, when `directory` is a file or a directory of another kind than
    `kind` (what the command writes), saying what it is and what to run instead."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"--workdir={directory} is a file, not a directory")
    found = kind_of(directory)
    if found is None or found == kind:
        return
    parent = os.path.dirname(os.path.normpath(directory)) or "."
    what = {RUN: "a single run (of jaxrl.train)", SWEEP: "a sweep (of jaxrl.sweep)",
            SETTING: f"one setting of the sweep {parent}, whose checkpoints belong to the sweep's program"}[found]
    todo = {RUN: f"resume it with `python -m jaxrl.train --workdir={directory}`, or fork it into a sweep with "
                 f"`--sweep.fork={directory}`",
            SWEEP: f"resume it by running its jaxrl.sweep command again with --workdir={directory}; evaluate a "
                   f"setting with `python -m jaxrl.evaluate --workdir={directory}/<setting>`",
            SETTING: f"resume the sweep with its jaxrl.sweep command and --workdir={parent}, or evaluate this "
                     f"setting with `python -m jaxrl.evaluate --workdir={directory}`"}[found]
    raise ValueError(f"{directory} is {what}, not a place for {'a ' + kind if kind != RUN else 'a single run'}: "
                     f"{todo}; or choose another --workdir")


def check_saved(config: ConfigDict, workdir: str, *, resuming: bool) -> None:
    """ValueError (read only: before compiling) when training `config` in `workdir` would mislabel or lose the run
    saved there: a config that differs in a key that may not change on a resume, a total_steps below the saved
    one, or metrics with no checkpoint to resume them from (`resuming`: the program has checkpoints)."""
    saved_path = os.path.join(workdir, "config.json")
    if os.path.exists(saved_path):
        saved = config_lib.load(saved_path)
        # Keys the saved config lacks were added to jaxrl after the run began (a new option at its default).
        changed = [k for k in config_lib.differences(saved, config, added=False) if k not in RESUMABLE_CHANGES]
        if changed:
            raise ValueError(f"{workdir} holds a run with a different config (keys {', '.join(changed)}); "
                             "choose another --workdir, resume with the saved config, or pass --overwrite to "
                             "start it again")
        if config.total_steps < saved.total_steps:
            raise ValueError(f"total_steps={config.total_steps} is below the {saved.total_steps} that {workdir} was "
                             "started with: a resumed run may only be extended (its checkpoints may lie past the new "
                             "end); choose another --workdir, or pass --overwrite to start it again")
    rows = metrics_lib.read(os.path.join(workdir, "metrics.jsonl"))
    # A run killed before its first checkpoint was complete has rows and no checkpoint: starting it again redoes
    # them. One that had a checkpoint (or whose run_info predates the record) has lost its checkpoints.
    if rows and not resuming and _read_info(workdir).get("checkpointed", True):
        raise ValueError(f"{workdir} has metrics up to update {rows[-1].get('update')} but no checkpoint to resume "
                         "them from (deleted or moved aside?): starting over would overwrite them. Put the "
                         "checkpoints back, choose another --workdir, or pass --overwrite to start it again")


def clear(directory: str) -> None:
    """Delete what a run or sweep wrote in `directory` (for --overwrite), keeping the directory (and its lock)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


class DirectoryInUse(RuntimeError):
    """Another process holds the directory's lock."""


@contextlib.contextmanager
def locked(directory: str):
    """Hold a lock on `directory` (flock on the directory itself: nothing is written, and the kernel releases it
    when the process ends however it ends) while the block runs; process 0 of a multi-process run holds it for
    all. A directory created here and left empty (an input error before anything was written) is removed
    again. DirectoryInUse when another process holds it."""
    if jax.process_index() != 0:
        yield
        return
    created = not os.path.isdir(directory)
    fd = open_directory(directory)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryInUse(f"{directory} is in use: another process is training in it; wait for it to "
                                 "finish or stop it, or choose another --workdir") from None
        except OSError:  # a filesystem without flock (some network filesystems): no lock to be had
            pass
        yield
    finally:
        os.close(fd)  # releases the lock
        if created and not os.listdir(directory):
            os.rmdir(directory)


def open_directory(directory: str) -> int:
    """A descriptor of `directory`, created if need be; ValueError (the input's) when it cannot be."""
    try:
        os.makedirs(directory, exist_ok=True)
        return os.open(directory, os.O_RDONLY)
    except OSError as error:
        raise ValueError(f"--workdir={directory} cannot be created or opened ({error.strerror}: "
                         f"{error.filename})") from None


def _read_info(directory: str) -> dict:
    try:
        return files.read_json(os.path.join(directory, RUN_INFO), {})
    except ValueError:  # written before run_info.json was written atomically, and cut short
        return {}


def record_start(directory: str, kind: str, start_update: int | None, mesh=None, resuming: bool = False,
                 **extra) -> None:
    """Write `directory`'s run_info.json: its kind, what started it first (kept), one more entry in its history
    of the commands, revisions and machines that trained in it, and whether it has had a complete checkpoint
    (kept once true; true when `resuming` from one)."""
    info = _read_info(directory)
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv, "git_revision": git_revision(),
             "jax_version": jax.__version__, "devices": [str(d) for d in jax.devices()],
             "processes": jax.process_count(), **({"mesh": dict(mesh.shape)} if mesh is not None else {}),
             "start_update": start_update}
    history = info.get("history") or ([{k: info[k] for k in entry if k in info}] if info else [])
    first = {k: v for k, v in (history[0] if history else entry).items() if k not in ("time", "start_update")}
    files.write_json(os.path.join(directory, RUN_INFO), {**first, "kind": kind, **extra, "history": [*history, entry],
                                                         "checkpointed": bool(info.get("checkpointed")) or resuming},
                     indent=1)


def prepare(config: ConfigDict, workdir: str, mesh, kind: str = RUN, start_update: int = 0,
            resuming: bool = False) -> None:
    """Create the directory, save the config and record this command in run_info.json (`resuming`: from a
    checkpoint)."""
    os.makedirs(workdir, exist_ok=True)
    config_lib.save(config, os.path.join(workdir, "config.json"))
    extra = {"sweep": os.path.dirname(os.path.normpath(workdir))} if kind == SETTING else {}
    record_start(workdir, kind, start_update, mesh, resuming, **extra)


def mark_checkpointed(workdir: str) -> None:
    """Record in run_info.json that the run has a complete checkpoint: from now on, metrics without one mean its
    checkpoints were lost (`check_saved`)."""
    info = _read_info(workdir)
    if not info.get("checkpointed"):
        files.write_json(os.path.join(workdir, RUN_INFO), {**info, "checkpointed": True})
