"""The outer training loop: compiled chunks of updates, then log, evaluate and checkpoint between them.

    python -m jaxrl.train --config=experiments/cartpole_ppo.py --config.total_steps=200000
    python -m jaxrl.train --workdir=runs/cartpole_ppo-20261121-120000        # resume from the directory
    python -m jaxrl.train --config=experiments/cartpole_ppo.py --resume      # resume its newest run
    python -m jaxrl.train --config=experiments/cartpole_ppo.py --print_config   # every key and its value

A run directory holds `config.json`, `run_info.json`, `metrics.jsonl`, `checkpoints/<update>/`,
`learning_curve.png` and, for envs that can draw themselves (SMAX), `eval_episode.gif`. Starting on a
directory that has checkpoints resumes from the newest readable one; on CPU the resumed run ends with the same
parameters as one that ran straight through. A sweep's directory, a saved run of another config, metrics
without a checkpoint and a directory another process trains in are refused (`--overwrite` starts a run again).
SIGTERM or Ctrl-C finishes the current chunk, saves a checkpoint and exits with status 143.

What each config key means: the comments of `jaxrl/config.py` (the keys every run has) and of each algorithm's
`default_config` in `jaxrl/algos/`; `--print_config` shows an experiment's keys and values.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import signal
import sys

import jax

from jaxrl import config as config_lib, distributed, host, metrics as metrics_lib
from jaxrl.run import cli
from jaxrl.run.program import run  # noqa: F401  (the API: jaxrl.train.run(config, workdir))
from jaxrl.run import workdir as workdir_lib
from jaxrl.run.workdir import latest_workdir

EXIT_DIVERGED = 3  # every seed turned non-finite and the run stopped (its checkpoints hold finite states)

EXIT_STOPPED = 128 + signal.SIGTERM  # stopped by SIGTERM or Ctrl-C after saving a checkpoint


def main(argv) -> int:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    FLAGS = flags.FLAGS
    if FLAGS.print_config:
        return print_config(FLAGS)
    with cli.input_phase():
        setup_process(FLAGS)
        config, workdir = config_and_workdir(FLAGS)
    result = run(config, workdir, overwrite=FLAGS.overwrite)
    last = result.metrics[-1] if result.metrics else {}
    keys = ("env_steps", *metrics_lib.HEADLINE_KEYS, "wall_time")
    summary = {k: last[k] for k in keys if k in last}
    if distributed.is_main_process():
        print(json.dumps({"workdir": result.workdir, **summary}))
        if result.interrupted:
            print(f"to resume: {cli.resume_command('jaxrl.train', sys.argv, result.workdir)}", file=sys.stderr)
    if result.interrupted:
        return EXIT_STOPPED
    return EXIT_DIVERGED if result.diverged else 0


def print_config(FLAGS) -> int:
    """--print_config: the experiment's config as this command line sets it (every key), then exit."""
    if FLAGS.config is None:
        raise cli.InputError("--print_config needs --config=experiments/<name>.py")
    print(FLAGS.config.to_json(indent=2, sort_keys=True))
    return 0


def config_and_workdir(FLAGS):
    """(config, workdir) from --config, --workdir and --resume; InputError when they do not name a run."""
    config, workdir = FLAGS.config, FLAGS.workdir
    if config is None and workdir is None and not FLAGS.resume:
        raise cli.InputError("give --config=experiments/<name>.py (and optionally --workdir), or --workdir=<run dir> "
                             "to resume a run")
    if FLAGS.resume and workdir is None:
        if config is None:
            raise cli.InputError("--resume needs --config (to find the latest run of that experiment) or --workdir")
        workdir = latest_workdir(config.experiment)
        if workdir is None:
            raise cli.InputError(f"--resume: no run of {config.experiment!r} found under runs/ (sweeps are resumed "
                                 "with their jaxrl.sweep command)")
    if FLAGS.resume and FLAGS.overwrite:
        raise cli.InputError("--resume and --overwrite contradict each other: give one")
    if config is None:
        workdir_lib.check_kind(workdir, workdir_lib.RUN)  # a file, or a sweep (which has no config.json of its own)
        if not os.path.isdir(workdir):
            raise cli.InputError(f"--workdir={workdir} does not exist (pass --config to start a new run there)")
        saved = os.path.join(workdir, "config.json")
        if not os.path.exists(saved):
            raise cli.InputError(f"{workdir} has no config.json: pass --config as well")
        config = config_lib.load(saved)
    return config, workdir


def setup_process(FLAGS) -> None:
    """Before any JAX computation: the host's malloc setting (`jaxrl.host`), and joining a multi-process run
    when the flags ask for one."""
    host.keep_freed_memory(FLAGS.malloc_pad_mb)
    if FLAGS.coordinator_address or FLAGS.distributed:
        distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    if FLAGS.workdir is None and jax.process_count() > 1:
        raise cli.InputError("a multi-process run needs --workdir on a filesystem every process sees "
                             "(each process would otherwise pick its own time-stamped directory)")


def define_flags():
    """The flags of `python -m jaxrl.train` (and of `jaxrl.sweep`)."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "experiment config file, experiments/<name>.py[:<argument>] "
                                    "(see the list above); --config.<key>=<value> sets a key", lock_config=True)
    flags.DEFINE_string("workdir", None, "run directory (default runs/<experiment>-<time>); resumed if it "
                        "holds checkpoints")
    flags.DEFINE_bool("resume", False, "resume the newest runs/<experiment>-* directory when --workdir is not given")
    flags.DEFINE_bool("overwrite", False, "delete the run (or sweep) saved in --workdir and start it again")
    flags.DEFINE_bool("print_config", False, "print the config (every key, with this command line's values) and "
                      "exit")
    flags.DEFINE_bool("distributed", False, "join a multi-process run whose coordinator JAX finds in the "
                      "environment (TPU pod, SLURM, Open MPI)")
    flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for a multi-process run started "
                        "by hand (with --num_processes and --process_id)")
    flags.DEFINE_integer("num_processes", 0, "processes in the run (with --coordinator_address)")
    flags.DEFINE_integer("process_id", -1, "this process's index, 0 to num_processes - 1 (with --coordinator_address)")
    flags.DEFINE_integer("malloc_pad_mb", 256, "glibc's malloc keeps freed memory for reuse, its heaps growing this "
                         "many MiB at a time (jaxrl.host: XLA:CPU programs run faster); 0 leaves malloc as it is")



def experiments_help() -> str:
    """The experiment files beside the package (a source checkout) with the first line of each docstring."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
    lines = []
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        with open(path) as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        summary = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
        lines.append(f"  experiments/{os.path.basename(path):<18} {summary}")
    return "\nExperiments (--config=experiments/<name>.py[:<argument>]):\n" + "\n".join(lines) + "\n" if lines else ""


if __name__ == "__main__":
    __doc__ += experiments_help()  # what `--help` prints above the flags
    define_flags()
    cli.run_main(main)
