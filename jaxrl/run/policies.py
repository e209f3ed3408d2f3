"""Reuse a finished (or running) run: restore its checkpoint, evaluate it, load one seed's policy, export it.

    jaxrl.load_policy("runs/cartpole_ppo-...")          # a jitted actor (EnvActor or TextActor)
    evaluate_run("runs/smax_mappo-3m-...", episodes=64)  # the JSON summary `python -m jaxrl.evaluate` prints
    export_policy("runs/...", "policies/cartpole")       # the parameters alone (orbax), for deployment
    export_policy("runs/lm_grpo-...", "out/", format="hf")  # a pretrained model's run, as a Hugging Face directory

A run directory is a `jaxrl.train` workdir (config.json, checkpoints/) or one setting of a `jaxrl.sweep`
(config.json, its program's checkpoints in ../checkpoints/<program>/, found through ../sweep.json). An
exported policy directory holds config.json, params/ (one run's parameters) and, for text, tokenizer.json.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from jaxrl import config as config_lib, files, metrics as metrics_lib
from jaxrl.run import program, saved

def evaluate_run(workdir: str, checkpoint_step: int | None = None, episodes: int | None = None,
                 sample: bool = False, out_dir: str | None = None) -> dict:
    """Evaluate every seed of a run and write what the env or task can show (an episode GIF, sample
    completions) to `out_dir` (default <workdir>/eval-<update>/).

    With the defaults (greedy, config.eval.episodes episodes or problems) the figures are those the run's
    own evaluation logged at that update: the same programs, on the same key. Returns the summary (means
    over seeds, per-seed lists, `out_dir` and the files written there), which is also written as
    `out_dir`/evaluation.json.
    """
    run = saved.restore_run(workdir, checkpoint_step)
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
    if os.path.exists(os.path.join(path, saved.EXPORT_MARKER)):
        config, algo, params = saved.restore_exported(path)
        return algo.actor(params)
    run = saved.restore_run(path, checkpoint_step)
    if not 0 <= seed < run.config.num_seeds:
        raise ValueError(f"seed {seed} is not in this run (it trained {run.config.num_seeds} seeds)")
    return run.algorithm.actor(jax.tree.map(lambda x: x[seed], program.fetch(run.state.params)))


EXPORT_FORMATS = ("orbax", "hf")


def export_policy(workdir: str, out_dir: str, checkpoint_step: int | None = None, seed: int = 0,
                  format: str = "orbax") -> str:
    """Write one seed's parameters alone to `out_dir` and return it. "orbax": the parameters with the config (and
    the tokenizer for text) that rebuild its network, which `load_policy(out_dir)` loads; "hf" (a pretrained
    model's text run): a Hugging Face directory (safetensors, config.json, tokenizer) that transformers, vLLM and
    `jaxrl.models.from_pretrained` load."""
    if format not in EXPORT_FORMATS:
        raise ValueError(f"export format {format!r} is not one of {EXPORT_FORMATS}")
    if os.path.exists(out_dir) and os.listdir(out_dir):  # (before anything is restored)
        raise ValueError(f"{out_dir} exists and is not empty; export into a new directory")
    model_dir = os.path.join(workdir, "model")
    if format == "hf" and not os.path.isdir(model_dir):
        raise ValueError(f"{workdir} did not train a pretrained language model (no model/): only those export to "
                         "Hugging Face format")
    run = saved.restore_run(workdir, checkpoint_step)
    if not 0 <= seed < run.config.num_seeds:
        raise ValueError(f"seed {seed} is not in this run (it trained {run.config.num_seeds} seeds)")
    os.makedirs(out_dir, exist_ok=True)
    params = jax.tree.map(lambda x: x[seed], program.fetch(run.state.params))
    if format == "hf":
        from jaxrl import models

        tokenizer = models.read_spec(model_dir)[1]
        config = run.algorithm.parts.model.config  # the trained model's (with its adapters, which export merges)
        return models.save_pretrained(models.LanguageModel(config, params, tokenizer), out_dir)
    with ocp.StandardCheckpointer() as saver:
        saver.save(os.path.abspath(os.path.join(out_dir, "params")), params)
    config_lib.save(run.config, os.path.join(out_dir, "config.json"))
    run.algorithm.write_files(out_dir)  # e.g. the tokenizer
    files.write_json(os.path.join(out_dir, saved.EXPORT_MARKER),
                     {"workdir": os.path.abspath(workdir), "update": run.update, "seed": seed})
    return out_dir
