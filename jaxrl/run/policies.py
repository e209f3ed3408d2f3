"""Reuse a finished (or running) run: restore its checkpoint, evaluate it, load one seed's policy, export it.

    jaxrl.load_policy("runs/cartpole_ppo-...")          # a jitted actor (EnvActor or TextActor)
    evaluate_run("runs/smax_mappo-3m-...", episodes=64)  # the JSON summary `python -m jaxrl.evaluate` prints
    export_policy("runs/...", "policies/cartpole")       # the parameters alone (orbax), for deployment

A run directory is a `jaxrl.train` workdir (config.json, checkpoints/) or one setting of a `jaxrl.sweep`
(config.json, its program's checkpoints in ../checkpoints/<program>/, found through ../sweep.json). An
exported policy directory holds config.json, params/ (one run's parameters) and, for text, tokenizer.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl import algos, checkpoint, config as config_lib, files, metrics as metrics_lib
from jaxrl.run import plan, program

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
    config = config_lib.load(os.path.join(workdir, "config.json"))
    num_runs = num_settings * config.num_seeds
    algo, _ = algos.build(config, plan.make_mesh(config, num_runs), run_dir=workdir)
    abstract = jax.eval_shape(lambda: algo.init_seeds(config.seed, config.num_seeds, num_settings))
    update, state = checkpoint.restore_from(checkpoint_dir, checkpoint.abstract_state(
        abstract, algo.state_shardings(abstract)), checkpoint_step)
    seeds = slice(position * config.num_seeds, (position + 1) * config.num_seeds)
    if num_settings > 1:
        state = jax.tree.map(lambda x: x[seeds], state)
    return RestoredRun(config, algo, state, update)


def evaluate_run(workdir: str, checkpoint_step: int | None = None, episodes: int | None = None,
                 sample: bool = False, out_dir: str | None = None) -> dict:
    """Evaluate every seed of a run and write what the env or task can show (an episode GIF, sample
    completions) to `out_dir` (default <workdir>/eval-<update>/).

    With the defaults (greedy, config.eval.episodes episodes or problems) the figures are those the run's
    own evaluation logged at that update: the same programs, on the same key. Returns the summary (means
    over seeds, per-seed lists, `out_dir` and the files written there), which is also written as
    `out_dir`/evaluation.json.
    """
    run = restore_run(workdir, checkpoint_step)
    config, algo = run.config, run.algorithm
    num = config.eval.episodes if episodes is None else episodes
    if num <= 0:
        raise ValueError(f"--episodes must be positive, got {num}")
    key = program.evaluation_key(config.seed, run.update)
    per_seed = program.fetch(algo.evaluate(run.state.params, key, num, sample))
    out_dir = out_dir or os.path.join(workdir, f"eval-{run.update}")
    os.makedirs(out_dir, exist_ok=True)
    written = algo.write_artifacts(out_dir, program.fetch(jax.tree.map(lambda x: x[:1], run.state.params)),
                                 config.seed, sample)
    summary = {"workdir": workdir, "update": run.update, "env_steps": run.update * algo.settings.batch_size,
               "episodes": num, "sample": sample, "num_seeds": config.num_seeds,
               **metrics_lib.summarize(per_seed), "out_dir": out_dir, "files": written}
    files.write_json(os.path.join(out_dir, "evaluation.json"), summary)
    return summary


def load_policy(path: str, checkpoint_step: int | None = None, seed: int = 0):
    """One seed's trained policy from a run directory (newest checkpoint, or `checkpoint_step`) or from an
    exported policy directory: the algorithm's actor, jitted (`EnvActor` for envs, `TextActor` for text)."""
    if os.path.exists(os.path.join(path, EXPORT_MARKER)):
        config, algo, params = _load_exported(path)
        return algo.actor(params)
    run = restore_run(path, checkpoint_step)
    if not 0 <= seed < run.config.num_seeds:
        raise ValueError(f"seed {seed} is not in this run (it trained {run.config.num_seeds} seeds)")
    return run.algorithm.actor(jax.tree.map(lambda x: x[seed], program.fetch(run.state.params)))


def export_policy(workdir: str, out_dir: str, checkpoint_step: int | None = None, seed: int = 0) -> str:
    """Write one seed's parameters alone (orbax), with the config (and the tokenizer for text) that rebuild
    its network, to `out_dir`; `load_policy(out_dir)` loads it. Returns out_dir."""
    if os.path.exists(out_dir) and os.listdir(out_dir):  # (before anything is restored)
        raise ValueError(f"{out_dir} exists and is not empty; export into a new directory")
    run = restore_run(workdir, checkpoint_step)
    if not 0 <= seed < run.config.num_seeds:
        raise ValueError(f"seed {seed} is not in this run (it trained {run.config.num_seeds} seeds)")
    os.makedirs(out_dir, exist_ok=True)
    params = jax.tree.map(lambda x: x[seed], program.fetch(run.state.params))
    with ocp.StandardCheckpointer() as saver:
        saver.save(os.path.abspath(os.path.join(out_dir, "params")), params)
    config_lib.save(run.config, os.path.join(out_dir, "config.json"))
    run.algorithm.write_files(out_dir)  # e.g. the tokenizer
    files.write_json(os.path.join(out_dir, EXPORT_MARKER),
                     {"workdir": os.path.abspath(workdir), "update": run.update, "seed": seed})
    return out_dir


def _load_exported(path: str):
    config = config_lib.load(os.path.join(path, "config.json"))
    algo, _ = algos.build(config, plan.make_mesh(config, 1), run_dir=path)
    abstract = jax.eval_shape(lambda: algo.init_seeds(config.seed, 1))
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), abstract.params)
    with ocp.StandardCheckpointer() as loader:
        params = loader.restore(os.path.abspath(os.path.join(path, "params")), target)
    return config, algo, params
