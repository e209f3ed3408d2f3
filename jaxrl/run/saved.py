"""Saved runs read back: which program holds a run directory's checkpoints, a run's state at a checkpoint, an
exported policy's parameters, and the parameters a warm start begins from (`config.init_from`).

    run = restore_run("runs/text_sft-...")        # config, rebuilt algorithm, state [S, ...], update
    params = start_params("runs/text_sft-...")     # its seeds' parameters [S, ...] (or an exported policy's [1, ...])

Reading is read-only: a checkpoint that cannot be restored is an error naming it, never moved aside.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from jaxrl import algos, checkpoint, mesh as mesh_lib, models
from jaxrl.algos.registry import saved_config
from jaxrl.run.plan import Plan

EXPORT_MARKER = "exported_policy.json"


@dataclasses.dataclass
class RestoredRun:
    """A run's config, its algorithm and the state of its seeds at update `update`."""

    config: Any
    algorithm: Any
    state: Any  # leaves [S, ...]: this setting's seeds
    update: int


def program_of(workdir: str) -> tuple[str, int, int]:
    """(checkpoint directory, number of settings in its program, this setting's position) of a run or sweep
    setting directory; ValueError naming the directory when it holds no run."""
    if not os.path.exists(os.path.join(workdir, "config.json")):
        raise ValueError(f"{workdir} is not a run directory (no config.json); a sweep's runs are its setting "
                         "directories, <sweep>/<setting>")
    own = os.path.join(workdir, "checkpoints")
    if os.path.isdir(own):
        return own, 1, 0
    sweep_dir, name = os.path.split(os.path.normpath(workdir))
    sweep_json = os.path.join(sweep_dir, "sweep.json")
    if os.path.exists(sweep_json):
        with open(sweep_json) as f:
            programs = json.load(f)["programs"]
        for number, names in enumerate(programs):
            if name in names:
                return os.path.join(sweep_dir, "checkpoints", str(number)), len(names), names.index(name)
    raise ValueError(f"{workdir} has no checkpoints (checkpoints/ is missing)")


def restore_run(workdir: str, checkpoint_step: int | None = None) -> RestoredRun:
    """The run in `workdir` at its newest checkpoint, or at update `checkpoint_step`."""
    checkpoint_dir, num_settings, position = program_of(workdir)
    config = saved_config(os.path.join(workdir, "config.json"))
    num_runs = num_settings * config.num_seeds
    algo, _ = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, num_runs), run_dir=workdir)
    update, state = checkpoint.restore_from(checkpoint_dir, algo.abstract_seeds(config.seed, config.num_seeds,
                                                                                num_settings), checkpoint_step)
    seeds = slice(position * config.num_seeds, (position + 1) * config.num_seeds)
    if num_settings > 1:
        state = jax.tree.map(lambda x: x[seeds], state)
    return RestoredRun(config, algo, state, update)


def restore_exported(path: str):
    """(config, algorithm, one seed's parameters, no seed axis) of an exported policy directory (`export_policy`)."""
    config = saved_config(os.path.join(path, "config.json"))
    algo, _ = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, 1), run_dir=path)
    abstract = algo.abstract_seeds(config.seed, 1)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), abstract.params)
    with ocp.StandardCheckpointer() as loader:
        params = loader.restore(os.path.abspath(os.path.join(path, "params")), target)
    return config, algo, params


def start_params(path: str, checkpoint_step: int | None = None):
    """The parameters a run warm-started from `path` begins with, leaves [S', ...]: every seed's of a run (or
    sweep setting) directory, at its newest checkpoint or at update `checkpoint_step`; an exported policy's
    one, [1, ...]; a pretrained model's (`jaxrl.models`: a name, a Hugging Face directory, a .gguf file), [1, ...]."""
    if os.path.exists(os.path.join(path, EXPORT_MARKER)):
        return jax.tree.map(lambda x: x[None], restore_exported(path)[2])
    if models.is_pretrained(path):
        params = models.read_params(path, models.read_spec(path)[0])
        return jax.tree.map(lambda x: x[None], params)
    return restore_run(path, checkpoint_step).state.params


def warm_start(algo, program_plan: Plan) -> Callable | None:
    """`program.start`'s `start_state` for an algorithm that starts from a saved run's parameters
    (`algo.starts_from`) or keeps other runs' frozen (`algo.frozen_from`): those parameters, read and checked against
    the algorithm's here, before anything is compiled. None for any other algorithm, and for a program that resumes from its own checkpoints."""
    if not (algo.starts_from or algo.frozen_from) or program_plan.resuming:
        return None
    params = start_params(algo.starts_from) if algo.starts_from else None
    frozen = {name: start_params(path) for name, path in algo.frozen_from}
    runs = (program_plan.seed, program_plan.num_seeds, program_plan.num_settings)
    algo.abstract_seeds(*runs, start_params=params, frozen=frozen)  # parameters that do not fit raise here
    return lambda algo, abstract: (0, algo.init_seeds(*runs, start_params=params, frozen=frozen))
