r"""Hyperparameter sweeps: every combination of settings x seeds, vmapped in as few compiled programs as the
settings allow.

    python -m jaxrl.sweep --config=experiments/cartpole_ppo.py --sweep.seeds=16 --sweep.lr=1e-4,3e-4,1e-3
    python -m jaxrl.sweep --config=experiments/smax_mappo.py:3m --sweep.seeds=4 \
        --sweep.loss.ent_coef=0,0.01 --sweep.num_envs=64,128

`--sweep.<key>=a,b,c` names a config key in full (`optim.learning_rate`), by its last part when that is
unique (`learning_rate`), or by an alias (`lr`). Keys that are traced hyperparameters of the algorithm
(`jaxrl.algos.ALGORITHMS[...].keys`) vary inside one program: their values become a run axis that is
vmapped, and split over the devices (and hosts) of the mesh's `runs` axis. Keys that change shapes or
code paths (`num_envs`, `network.kind`, ...) start one program per distinct value. `--sweep.seeds=S`
trains S seeds of every setting; seed s of every setting starts from the same key.

Tuning inside one program (`jaxrl.run.population`; every swept key must be a traced hyperparameter):

    python -m jaxrl.sweep --config=experiments/cartpole_ppo.py --sweep.method=pbt --sweep.lr=1e-4:1e-2 \
        --sweep.pbt.population=8 --sweep.pbt.every_steps=50000
    python -m jaxrl.sweep --config=experiments/cartpole_ppo.py --sweep.method=halving \
        --sweep.lr=1e-4,3e-4,1e-3,3e-3 --sweep.seeds=2 --sweep.halving.at=0.25,0.5

    --sweep.method=pbt        exploit and explore every --sweep.pbt.every_steps (default: 4 times a run):
                              --sweep.pbt.fraction (0.25), --sweep.pbt.perturb (0.8,1.25); a swept key given
                              as values a,b,c starts those settings and explores between min and max, one
                              given as a range low:high draws --sweep.pbt.population (8) starts from it
    --sweep.method=halving    drop the worse half of the settings at each fraction of total_steps in
                              --sweep.halving.at (default 0.125,0.25,0.5); their runs continue the survivors
    --sweep.<method>.score_key  the metric runs are ranked by (default: win_rate, else episode_return)
    --sweep.<method>.rank     current (default): the score of the chunk before the decision; predicted: the
                              score at the end of the run extrapolated from each run's learning curve

Fork a saved run into variants: every setting starts from its checkpoint (every seed, same env states
and keys) and differs only in traced hyperparameters; the children's curves continue the parent's:

    python -m jaxrl.sweep --sweep.fork=runs/cartpole_ppo-20261121-120000 --sweep.fork_update=40 \
        --sweep.lr=1e-4,3e-4 [--config=<the parent's experiment> --config.total_steps=...]

Output, under `--workdir` (default `runs/<experiment>-sweep-<time>`):
    <key=value,...>/     one run directory per setting: config.json, metrics.jsonl (means over seeds and
                         per-seed lists), learning_curve.png
    checkpoints/<i>/     program i's state (every setting and seed); rerunning the command resumes (a sweep of
                         other values in the same directory is refused; --overwrite starts it again)
    summary.csv          one line per setting: final mean, 95% confidence interval and per-seed values
    sweep.png            mean and 95% confidence band of the headline metric per setting
    sweep.json           the swept keys and values, the method and the fork
    population.csv       PBT and halving: one line per run, best first (final values, origin, copies)
    lineage.png          PBT and halving: each run's swept values over time, the best run's ancestry in bold

The keys a sweep can name: `python -m jaxrl.train --config=experiments/<name>.py --print_config` prints an
experiment's keys and values; what each means: the comments of `jaxrl/config.py` and of each algorithm's
`default_config` in `jaxrl/algos/`.
"""

from __future__ import annotations

import sys

from ml_collections import ConfigDict

from jaxrl import distributed, train
from jaxrl.run import cli, population as population_lib, workdir as workdir_lib
from jaxrl.run.summary import confidence_interval, format_summary  # noqa: F401  (the API)
from jaxrl.run.sweep_programs import (Fork, Interrupted, Range, draw_ranges, expand,  # noqa: F401
                                      group_programs, lineage_path, parse_range, parse_values, resolve_key, run_sweep)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


# --sweep.<name> flags that say how to sweep rather than naming a config key: name -> (what it sets, parser)
HOW_FLAGS = {"method": ("method", str), "pbt.every_steps": ("every_steps", int), "pbt.fraction": ("fraction", float),
             "pbt.perturb": ("perturb", _floats), "pbt.score_key": ("score_key", str),
             "pbt.population": ("population", int), "halving.at": ("at", _floats),
             "halving.score_key": ("score_key", str), "pbt.rank": ("rank", str), "halving.rank": ("rank", str),
             "fork": ("fork", str), "fork_update": ("fork_update", int)}


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


def method_from_flags(flags: list[tuple[str, str]]):
    """(Options, PBT population size, Fork or None, the flags that name config keys) from the --sweep flags."""
    given, rest = {}, []
    for name, text in flags:
        if name in HOW_FLAGS:
            field, parse = HOW_FLAGS[name]
            try:
                given[field] = parse(text)
            except ValueError:
                raise ValueError(f"--sweep.{name}: {text!r} is not valid") from None
        elif name.startswith(("pbt.", "halving.")):
            known = [n for n in HOW_FLAGS if n.startswith(name.split(".")[0] + ".")]
            raise ValueError(f"--sweep.{name}: is not an option; known: {', '.join(known)}")
        else:
            rest.append((name, text))
    population, fork, fork_update = given.pop("population", 8), given.pop("fork", None), given.pop("fork_update", None)
    options = population_lib.Options(**given)
    check_options(options, population, {name for name, _ in flags})
    if fork_update is not None and fork is None:
        raise ValueError("--sweep.fork_update needs --sweep.fork=<run directory>")
    return options, population, (Fork(fork, fork_update) if fork else None), rest


def check_options(options: population_lib.Options, population: int, given: set[str]) -> None:
    """ValueError naming the flag of a method option that is out of range or belongs to another method."""
    if options.method not in population_lib.METHODS:
        raise ValueError(f"--sweep.method: is one of {', '.join(population_lib.METHODS)}")
    for name in given:
        method = name.split(".")[0]
        if method in ("pbt", "halving") and options.method != method:
            raise ValueError(f"--sweep.{name} is an option of --sweep.method={method}")
    if not 0 < options.fraction <= 0.5:
        raise ValueError("--sweep.pbt.fraction must be in (0, 0.5]")
    if options.every_steps < 0 or population < 2:
        raise ValueError("--sweep.pbt.every_steps must be >= 0 and --sweep.pbt.population >= 2")
    if not options.perturb or any(f <= 0 for f in options.perturb):
        raise ValueError("--sweep.pbt.perturb: factors must be > 0")
    if any(not 0 < f < 1 for f in options.at) or list(options.at) != sorted(set(options.at)):
        raise ValueError("--sweep.halving.at: increasing fractions of total_steps, each in (0, 1)")
    population_lib.check_rank(options)


def sweep_from_flags(config: ConfigDict, flags: list[tuple[str, str]]) -> tuple[ConfigDict, dict[str, list]]:
    """(config with --sweep.seeds applied, {full key: values, or a Range for low:high})."""
    config = config.copy_and_resolve_references()
    sweep: dict[str, list | Range] = {}
    for name, values in flags:
        key = resolve_key(config, name)
        if key == "num_seeds":
            seeds = parse_values(config, key, values)
            if len(seeds) != 1 or seeds[0] < 1:
                raise ValueError(f"--sweep.seeds takes one positive number, how many seeds per setting; got {values!r}")
            config.num_seeds = seeds[0]
            continue
        if key in sweep:
            raise ValueError(f"--sweep.{name}: {key} is swept twice")
        sweep[key] = parse_range(config, key, values) if ":" in values else parse_values(config, key, values)
    config.lock()
    return config, sweep


def main(argv, sweep_flags) -> int:
    from absl import flags, logging

    del argv
    logging.set_verbosity(logging.WARNING)
    FLAGS = flags.FLAGS
    with cli.input_phase():
        options, population, fork, sweep_flags = method_from_flags(sweep_flags)
        if FLAGS.config is None and fork is None:
            raise cli.InputError("give --config=experiments/<name>.py and --sweep.<key>=<values> flags")
        train.setup_process(FLAGS)
        config, sweep = sweep_from_flags(FLAGS.config if FLAGS.config is not None else fork.config(), sweep_flags)
        if fork is not None:
            if any(name in ("seeds", "num_seeds") for name, _ in sweep_flags):
                raise cli.InputError("--sweep.seeds with --sweep.fork: a fork continues the parent's seeds")
            with config.unlocked():
                config.num_seeds = fork.config().num_seeds
        if FLAGS.resume or FLAGS.print_config:
            raise cli.InputError(f"--{'resume' if FLAGS.resume else 'print_config'} is a flag of jaxrl.train; a sweep "
                                 "resumes when its command runs again with the same --workdir")
    workdir = FLAGS.workdir or workdir_lib.default_workdir(config, workdir_lib.SWEEP)
    try:
        summary = run_sweep(config, sweep, workdir, options=options, population=population, fork=fork,
                            overwrite=FLAGS.overwrite)
    except Interrupted as stopped:
        if distributed.is_main_process():
            print(f"{stopped}; to resume: {cli.resume_command('jaxrl.sweep', sys.argv, workdir)}", file=sys.stderr)
        return train.EXIT_STOPPED
    if distributed.is_main_process():
        print(format_summary(summary))
        print(f"\n{workdir}/summary.csv, {workdir}/sweep.png")
    return 0



if __name__ == "__main__":
    try:
        argv, sweep_flags = split_sweep_flags(sys.argv)
    except cli.InputError as error:
        cli.report(error, cli.verbose_requested(sys.argv))
    __doc__ += train.experiments_help()  # what `--help` prints above the flags
    train.define_flags()
    cli.run_main(lambda argv: main(argv, sweep_flags), argv=argv)
