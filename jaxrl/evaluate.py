"""Evaluate a run's policies and look at them.

    python -m jaxrl.evaluate --workdir=runs/smax_mappo-3m-20261124-101500
    python -m jaxrl.evaluate --workdir=RUN --checkpoint=240 --episodes=256 --sample
    python -m jaxrl.evaluate --workdir=RUN --export=policies/smax_3m --seed=2

Restores the run's newest checkpoint (or `--checkpoint`, an update number), plays `--episodes` episodes per
seed (held-out problems for text; default: the run's eval.num_envs) greedily, or sampling from the policy
with `--sample`, and prints a JSON summary: return, episode length and win rate, or held-out accuracy and
pass@k, as means over seeds with per-seed lists. With the defaults the figures are the ones the run's own
evaluation logged at that update. Writes evaluation.json, an episode GIF for envs that draw themselves and
sample completions for text to `--out` (default <workdir>/eval-<update>/). `--export=DIR` writes one seed's
parameters alone instead (`jaxrl.load_policy(DIR)` loads them).
"""

from __future__ import annotations

import json
import sys

from jaxrl import host
from jaxrl.run import cli, policies

cli.input_stage(policies.restore_run)  # reading the run directory is input; evaluating it is not


def main(argv) -> int:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)
    FLAGS = flags.FLAGS
    host.keep_freed_memory()
    if FLAGS.workdir is None:
        raise cli.InputError("give --workdir=<run directory>")
    if FLAGS.export:
        out = policies.export_policy(FLAGS.workdir, FLAGS.export, FLAGS.checkpoint, FLAGS.seed)
        print(json.dumps({"exported": out, "workdir": FLAGS.workdir, "seed": FLAGS.seed}))
        return 0
    summary = policies.evaluate_run(FLAGS.workdir, FLAGS.checkpoint, FLAGS.episodes, FLAGS.sample, FLAGS.out)
    print(json.dumps(summary))
    return 0


def define_flags():
    from absl import flags

    flags.DEFINE_string("workdir", None, "the run directory (of jaxrl.train, or one setting of jaxrl.sweep)")
    flags.DEFINE_integer("checkpoint", None, "the update of the checkpoint to load (default: the newest)")
    flags.DEFINE_integer("episodes", None, "episodes (or held-out problems) per seed; default: the run's "
                         "eval.num_envs")
    flags.DEFINE_bool("sample", False, "sample actions (tokens) from the policy instead of taking the most likely")
    flags.DEFINE_string("out", None, "where evaluation.json, the GIF or the sample completions go "
                        "(default <workdir>/eval-<update>)")
    flags.DEFINE_string("export", None, "write one seed's parameters (orbax) and config to this new directory "
                        "instead of evaluating")
    flags.DEFINE_integer("seed", 0, "with --export: which seed of the run")


if __name__ == "__main__":
    define_flags()
    cli.run_main(lambda argv: sys.exit(main(argv)))
