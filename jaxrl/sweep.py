"""Hyperparameter sweeps: every combination of settings x seeds, vmapped in as few compiled programs as the
settings allow.

    python -m jaxrl.sweep --config=experiments/cartpole_ppo.py --sweep.seeds=16 --sweep.lr=1e-4,3e-4,1e-3
    python -m jaxrl.sweep --config=experiments/smax_mappo.py:3m --sweep.seeds=4 \\
        --sweep.loss.ent_coef=0,0.01 --sweep.num_envs=64,128

`--sweep.<key>=a,b,c` names a config key in full (`optim.learning_rate`), by its last part when that is
unique (`learning_rate`), or by an alias (`lr`). Keys that are traced hyperparameters of the algorithm
(`jaxrl.algos.ALGORITHMS[...].keys`) vary inside one program: their values become a run axis that is
vmapped, and split over the devices (and hosts) of the mesh's `runs` axis. Keys that change shapes or
code paths (`num_envs`, `network.kind`, ...) start one program per distinct value. `--sweep.seeds=S`
trains S seeds of every setting; seed s of every setting starts from the same key.

Output, under `--workdir` (default `runs/<experiment>-sweep-<time>`):
    <key=value,...>/     one run directory per setting: config.json, metrics.jsonl (means over seeds and
                         per-seed lists), learning_curve.png
    checkpoints/<i>/     program i's state (every setting and seed); rerunning the command resumes
    summary.csv          one line per setting: final mean, 95% confidence interval and per-seed values
    sweep.png            mean and 95% confidence band of the headline metric per setting
    sweep.json           the swept keys and values
"""

from __future__ import annotations

import os
import sys
import time

from ml_collections import ConfigDict

from jaxrl import distributed, train
from jaxrl.run import cli
from jaxrl.run.summary import confidence_interval, format_summary  # noqa: F401  (the API)
from jaxrl.run.sweeps import expand, group_programs, parse_values, resolve_key, run_sweep  # noqa: F401

def split_sweep_flags(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(argv without the --sweep.<key>=<values> flags, [(key, values)] in order)."""
    rest, sweep = [], []
    for arg in argv:
        if arg.startswith("--sweep."):
            name, sep, values = arg[len("--sweep."):].partition("=")
            if not sep:
                raise cli.InputError(f"{arg}: write --sweep.<key>=<value>,<value>,...")
            sweep.append((name, values))
        else:
            rest.append(arg)
    return rest, sweep


def sweep_from_flags(config: ConfigDict, flags: list[tuple[str, str]]) -> tuple[ConfigDict, dict[str, list]]:
    """(config with --sweep.seeds applied, {full key: values})."""
    config = config.copy_and_resolve_references()
    sweep: dict[str, list] = {}
    for name, values in flags:
        key = resolve_key(config, name)
        if key == "num_seeds":
            seeds = parse_values(config, key, values)
            if len(seeds) != 1:
                raise ValueError("--sweep.seeds takes one number: how many seeds per setting")
            config.num_seeds = seeds[0]
            continue
        if key in sweep:
            raise ValueError(f"--sweep.{name}: {key} is swept twice")
        sweep[key] = parse_values(config, key, values)
    config.lock()
    return config, sweep


def main(argv, sweep_flags) -> int:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)
    FLAGS = flags.FLAGS
    with cli.input_phase():
        if FLAGS.config is None:
            raise cli.InputError("give --config=experiments/<name>.py and --sweep.<key>=<values> flags")
        train.setup_process(FLAGS)
        config, sweep = sweep_from_flags(FLAGS.config, sweep_flags)
    workdir = FLAGS.workdir or os.path.join("runs", f"{config.experiment}-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = run_sweep(config, sweep, workdir)
    if distributed.is_main_process():
        print(format_summary(summary))
        print(f"\n{workdir}/summary.csv, {workdir}/sweep.png")
    return 0



if __name__ == "__main__":
    try:
        argv, sweep_flags = split_sweep_flags(sys.argv)
    except cli.InputError as error:
        cli.report(error, cli.verbose_requested(sys.argv))
    train.define_flags()
    cli.run_main(lambda argv: main(argv, sweep_flags), argv=argv)
