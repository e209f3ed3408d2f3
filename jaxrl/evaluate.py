"""Evaluate a run's policies and look at them.

    python -m jaxrl.evaluate --workdir=runs/smax_mappo-3m-20261124-101500
    python -m jaxrl.evaluate --workdir=RUN --checkpoint=240 --episodes=256 --sample
    python -m jaxrl.evaluate --workdir=RUN --export=policies/smax_3m --seed=2
    python -m jaxrl.evaluate --workdir=runs/lm_grpo-... --export=out/ --format=hf   # for transformers / vLLM

Restores the run's newest checkpoint (or `--checkpoint`, an update number), plays `--episodes` episodes per
seed (held-out problems for text; default: the run's eval.episodes) greedily, or sampling from the policy
with `--sample`, and prints a JSON summary: return, episode length and win rate, or held-out accuracy and
pass@k, as means over seeds with per-seed lists. With the defaults the figures are the ones the run's own
evaluation logged at that update. Writes evaluation.json, an episode GIF for envs that draw themselves and
sample completions for text to `--out` (default <workdir>/eval-<update>/). `--export=DIR` writes one seed's
parameters alone instead (`jaxrl.load_policy(DIR)` loads them).
"""

from __future__ import annotations

import json
import os
import sys

from jaxrl import config as config_lib, host
from jaxrl.run import cli, policies, saved

cli.input_stage(saved.restore_run)  # reading the run directory is input; evaluating it is not


def main(argv) -> int:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)
    FLAGS = flags.FLAGS
    host.keep_freed_memory()
    with cli.input_phase():
        check_flags(FLAGS)
    if FLAGS.export:
        out = policies.export_policy(FLAGS.workdir, FLAGS.export, FLAGS.checkpoint, FLAGS.seed, FLAGS.format)
        print(json.dumps({"exported": out, "workdir": FLAGS.workdir, "seed": FLAGS.seed, "format": FLAGS.format}))
        return 0
    summary = policies.evaluate_run(FLAGS.workdir, FLAGS.checkpoint, FLAGS.episodes, FLAGS.sample, FLAGS.out)
    print(json.dumps(summary))
    return 0


def check_flags(FLAGS) -> None:
    """InputError for flags that name no run, no seed of it or nowhere to write, before anything is restored."""
    if FLAGS.workdir is None:
        raise cli.InputError("give --workdir=<run directory>")
    if not os.path.isdir(FLAGS.workdir):
        what = "a file" if os.path.exists(FLAGS.workdir) else "no such directory"
        raise cli.InputError(f"--workdir={FLAGS.workdir} is not a run directory ({what})")
    saved.program_of(FLAGS.workdir)  # a run (or sweep setting) directory with checkpoints
    if FLAGS.episodes is not None and FLAGS.episodes <= 0:
        raise cli.InputError(f"--episodes must be a positive number of episodes per seed, got {FLAGS.episodes}")
    if FLAGS.checkpoint is not None and FLAGS.checkpoint < 0:
        raise cli.InputError(f"--checkpoint is an update number, got {FLAGS.checkpoint}")
    if FLAGS.export:
        if os.path.exists(FLAGS.export) and (not os.path.isdir(FLAGS.export) or os.listdir(FLAGS.export)):
            raise cli.InputError(f"--export={FLAGS.export} exists and is not an empty directory; export into a new one")
        num_seeds = config_lib.load(os.path.join(FLAGS.workdir, "config.json")).num_seeds
        if not 0 <= FLAGS.seed < num_seeds:
            raise cli.InputError(f"--seed={FLAGS.seed} is not a seed of this run: it trained {num_seeds} "
                                 f"(0 to {num_seeds - 1})")
        if FLAGS.format == "hf" and not os.path.isdir(os.path.join(FLAGS.workdir, "model")):
            raise cli.InputError(f"--format=hf: {FLAGS.workdir} did not train a pretrained language model (no "
                                 "model/); only those export to Hugging Face format")
    elif FLAGS["seed"].present or FLAGS["format"].present:
        raise cli.InputError("--seed and --format choose what --export writes; evaluation covers every seed")
    if FLAGS.out and os.path.exists(FLAGS.out) and not os.path.isdir(FLAGS.out):
        raise cli.InputError(f"--out={FLAGS.out} is a file, not a directory")


def define_flags():
    from absl import flags

    flags.DEFINE_string("workdir", None, "the run directory (of jaxrl.train, or one setting of jaxrl.sweep)")
    flags.DEFINE_integer("checkpoint", None, "the update of the checkpoint to load (default: the newest)")
    flags.DEFINE_integer("episodes", None, "episodes (or held-out problems) per seed; default: the run's "
                         "eval.episodes")
    flags.DEFINE_bool("sample", False, "sample actions (tokens) from the policy instead of taking the most likely")
    flags.DEFINE_string("out", None, "where evaluation.json, the GIF or the sample completions go "
                        "(default <workdir>/eval-<update>)")
    flags.DEFINE_string("export", None, "write one seed's parameters (orbax) and config to this new directory "
                        "instead of evaluating")
    flags.DEFINE_integer("seed", 0, "with --export: which seed of the run")
    flags.DEFINE_enum("format", "orbax", policies.EXPORT_FORMATS, "with --export: orbax (for jaxrl.load_policy) or hf "
                      "(a pretrained model's run as a Hugging Face directory for transformers and vLLM)")


if __name__ == "__main__":
    define_flags()
    cli.run_main(lambda argv: sys.exit(main(argv)))
