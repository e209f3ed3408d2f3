"""A run's directory: where it goes, what is saved beside the checkpoints, and whether a config may resume it.

    <workdir>/config.json      the config (a run resumes only with the same one, but for RESUMABLE_CHANGES and
                               keys added to jaxrl since the run began)
    <workdir>/run_info.json    git revision, jax version, devices, mesh, command line
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

import jax
from ml_collections import ConfigDict

from jaxrl import config as config_lib

# Keys that may change when a run is resumed (extending it, where its logs go, how often it evaluates and saves,
# what happens if it diverges): none changes what trains (the evaluation key depends on the update alone);
# anything else would make the saved state mean something different.
RESUMABLE_CHANGES = ("total_steps", "log.progress_bar", "log.backends", "log.wandb_project", "log.wandb_mode",
                     "eval.every_steps", "eval.num_envs", "checkpoint.every_steps", "checkpoint.keep",
                     "checkpoint.on_nonfinite", "checkpoint.max_rollbacks")


def default_workdir(config: ConfigDict) -> str:
    return os.path.join("runs", f"{config.experiment}-{time.strftime('%Y%m%d-%H%M%S')}")


def latest_workdir(experiment: str) -> str | None:
    """The newest `runs/<experiment>-*` directory, for `--resume` without `--workdir`."""
    dirs = sorted(glob.glob(os.path.join("runs", f"{experiment}-*")), key=os.path.getmtime)
    return dirs[-1] if dirs else None


def git_revision() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def check_saved(config: ConfigDict, workdir: str) -> None:
    """Raise ValueError if `workdir` holds a run whose saved config differs from `config` in a key that may
    not change on a resume (reads only: the loop checks this before compiling anything)."""
    saved_path = os.path.join(workdir, "config.json")
    if os.path.exists(saved_path):
        # Keys the saved config lacks were added to jaxrl after the run began (a new option at its default).
        changed = [k for k in config_lib.differences(config_lib.load(saved_path), config, added=False)
                   if k not in RESUMABLE_CHANGES]
        if changed:
            raise ValueError(f"{workdir} holds a run with a different config (keys {', '.join(changed)}); "
                             "choose another --workdir or resume with the saved config")


def prepare(config: ConfigDict, workdir: str, mesh) -> None:
    """Create the directory and save the config, or check that it matches the one saved there."""
    check_saved(config, workdir)
    os.makedirs(workdir, exist_ok=True)
    config_lib.save(config, os.path.join(workdir, "config.json"))
    info = {"git_revision": git_revision(), "jax_version": jax.__version__,
            "devices": [str(d) for d in jax.devices()], "processes": jax.process_count(),
            "mesh": dict(mesh.shape), "argv": sys.argv}
    with open(os.path.join(workdir, "run_info.json"), "w") as f:
        json.dump(info, f, indent=2)

