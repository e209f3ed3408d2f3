"""A sweep as compiled programs: every combination of the swept values (a setting) x seeds, grouped into as few
programs as the settings allow (`expand_sweep`) and trained one program after another (`run_sweep`, through
`jaxrl.run.program`); tuned inside one program (PBT, successive halving: `jaxrl.run.population`); forks of a
saved run. `python -m jaxrl.sweep` is its command line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys

from ml_collections import ConfigDict

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import algos, checkpoint, config as config_lib, distributed, files, metrics as metrics_lib
from jaxrl.run import population as population_lib, program, workdir as workdir_lib
from jaxrl.run.plan import Setting
from jaxrl.run.summary import plot_lineage, plot_sweep, summarize_population, summarize_sweep, write_summary

ALIASES = {"lr": "learning_rate", "seeds": "num_seeds"}


def resolve_key(config: ConfigDict, name: str) -> str:
    """The full dotted config key that `name` (full, last part, or alias) stands for."""
    name = ALIASES.get(name, name)
    flat = _flat_keys(config)
    if name in flat:
        return name
    matches = [key for key in flat if key.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"--sweep.{name} is ambiguous: {', '.join(matches)}; give the full key")
    raise ValueError(f"--sweep.{name}: the config has no key {name!r}")


def _flat_keys(config: ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        if isinstance(value, ConfigDict):
            keys += _flat_keys(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


def parse_values(config: ConfigDict, key: str, text: str) -> list:
    """`a,b,c` as values of the type the config key holds."""
    current = config_lib.get_value(config, key)
    kind = type(current)
    if isinstance(current, (tuple, list, ConfigDict)) or current is None:
        raise ValueError(f"--sweep.{key}: only numbers, booleans and strings can be swept, not {kind.__name__}")

    def parse(item: str):
        item = item.strip()
        if kind is bool:
            if item.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--sweep.{key}: {item!r} is not a boolean")
            return item.lower() in ("true", "1")
        try:
            value = kind(float(item)) if kind is int else kind(item)
        except ValueError:
            raise ValueError(f"--sweep.{key}: {item!r} is not a {kind.__name__}") from None
        if kind is int and value != float(item):
            raise ValueError(f"--sweep.{key}: {item!r} is not an integer")
        return value

    values = [parse(item) for item in text.split(",") if item.strip()]
    if not values:
        raise ValueError(f"--sweep.{key}: no values given")
    if len(set(values)) != len(values):
        raise ValueError(f"--sweep.{key}: repeated values in {text!r}")
    return values


@dataclasses.dataclass(frozen=True)
class Range:
    """`--sweep.<key>=low:high`: PBT draws its population's initial values from it (log-uniform when low > 0)
    and keeps explored values inside it."""

    low: float
    high: float

    def draw(self, rng: np.random.Generator, count: int) -> list[float]:
        if self.low > 0:
            return np.exp(rng.uniform(np.log(self.low), np.log(self.high), count)).tolist()
        return rng.uniform(self.low, self.high, count).tolist()


def parse_range(config: ConfigDict, key: str, text: str) -> Range:
    """`low:high` for a float config key."""
    if not isinstance(config_lib.get_value(config, key), float):
        raise ValueError(f"--sweep.{key}={text}: a range low:high needs a float key")
    try:
        low, high = (float(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--sweep.{key}={text}: write a range as low:high, two numbers") from None
    if not low < high:
        raise ValueError(f"--sweep.{key}={text}: the range needs low < high")
    return Range(low, high)


def draw_ranges(sweep: dict[str, list | Range], population: int, seed: int) -> list[dict]:
    """`population` joint draws {key: value} of the swept ranges (one empty draw when there are none)."""
    ranges = {k: v for k, v in sweep.items() if isinstance(v, Range)}
    if not ranges:
        return [{}]
    rng = np.random.default_rng([seed, population])
    drawn = {k: r.draw(rng, population) for k, r in ranges.items()}
    return [{k: drawn[k][i] for k in ranges} for i in range(population)]


def expand(config: ConfigDict, sweep: dict[str, list], draws: list[dict] = ({},)) -> list[tuple[dict, ConfigDict]]:
    """Every combination of the swept values (and of `draws`, joint values of the ranges): (overrides
    {key: value}, config with them applied)."""
    listed = {k: v for k, v in sweep.items() if not isinstance(v, Range)}
    points = []
    for draw, values in itertools.product(draws, itertools.product(*listed.values())):
        overrides = {**draw, **dict(zip(listed, values))}
        point = config.copy_and_resolve_references()
        for key, value in overrides.items():
            config_lib.set_value(point, key, value)
        point.lock()
        algos.validate(point)
        points.append((overrides, point))
    return points


def setting_name(overrides: dict, short: dict[str, str]) -> str:
    """A directory name for one setting, e.g. `learning_rate=0.0003,num_envs=64`."""
    return ",".join(f"{short[k]}={_format(v)}" for k, v in overrides.items()) or "default"


def _format(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each key's last part, or the full key where last parts collide."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (name if last.count(name) == 1 else k) for k, name in zip(keys, last)}


def group_programs(points: list[tuple[dict, ConfigDict]]) -> list[list[int]]:
    """Indices of the points that can share a compiled program (equal `algos.static_signature`), in order."""
    groups: dict[str, list[int]] = {}
    for i, (_, point) in enumerate(points):
        groups.setdefault(algos.static_signature(point), []).append(i)
    return list(groups.values())


def tuned_hyperparams(config: ConfigDict, sweep: dict[str, list | Range], what: str) -> list[population_lib.Tuned]:
    """The swept keys as `Tuned` (field and range); ValueError naming a key that is not a traced
    hyperparameter, since `what` (PBT, halving, a fork) changes values inside one program."""
    fields = {key: field for field, key in algos.recipe(config.algorithm).keys.items()}
    tuned = []
    for key, values in sweep.items():
        if key not in fields:
            raise ValueError(f"--sweep.{key}: {what} varies only the hyperparameters traced inside one program "
                             f"({', '.join(algos.hyperparam_keys(config))}); {key} changes the program")
        low, high = (values.low, values.high) if isinstance(values, Range) else (min(values), max(values))
        tuned.append(population_lib.Tuned(key, fields[key], float(low), float(high)))
    return tuned


def check_one_program(programs: list[list[int]], names: list[str], method: str) -> None:
    """ValueError when the settings of a PBT or halving population need more than one compiled program."""
    if len(programs) > 1:
        raise ValueError(f"--sweep.method={method} tunes one program, but {names[programs[1][0]]} needs "
                         f"another than {names[0]} (a value that changes the program, e.g. a weight decay of 0)")


class Interrupted(Exception):
    """A sweep stopped by SIGTERM or Ctrl-C (its program saved a checkpoint): running it again resumes it."""

    def __init__(self, workdir: str, program: int):
        super().__init__(f"sweep stopped during program {program}; checkpoint saved")
        self.workdir, self.program = workdir, program


def run_sweep(config: ConfigDict, sweep: dict[str, list | Range], workdir: str, *, progress: bool | None = None,
              options: population_lib.Options = population_lib.Options(), population: int = 8,
              fork: Fork | None = None, overwrite: bool = False) -> list[dict]:
    """Train every setting of `sweep` (config keys -> values or ranges; `num_seeds` from the config) under
    `workdir`; returns the summary rows (also written to summary.csv, with sweep.png).

    `options.method` "pbt" or "halving" trains every setting as one population (`jaxrl.run.population`;
    ranges give `population` initial settings drawn from them); `fork`: every setting starts from a saved
    run's checkpoint. Both write the lineage and its plot too (population.csv, lineage.png).

    `workdir` must be new, or hold this same sweep (which is resumed); a single run, a sweep of other settings or
    a directory another process trains in is refused before anything is written, and `overwrite` deletes a saved
    sweep and starts again. Interrupted (after its program saved a checkpoint) when SIGTERM or Ctrl-C stops it."""
    workdir_lib.check_kind(workdir, workdir_lib.SWEEP)
    with workdir_lib.locked(workdir):
        return _run_sweep(config, sweep, workdir, progress, options, population, fork, overwrite)


@dataclasses.dataclass(frozen=True)
class Expanded:
    """A sweep's settings and programs, checked: what `run_sweep` trains."""

    points: list[tuple[dict, ConfigDict]]  # per setting: (overrides {key: value}, its config)
    names: list[str]  # per setting: its directory's name (`setting_name`)
    programs: list[list[int]]  # the settings of each compiled program (`group_programs`)
    tuned: list[population_lib.Tuned]  # what PBT or halving tunes (empty for a grid)
    forked_update: int | None = None  # the parent's update a fork starts from


def expand_sweep(config: ConfigDict, sweep: dict[str, list | Range], options: population_lib.Options,
                 population: int, fork: Fork | None) -> Expanded:
    """Every setting of `sweep` (`expand`), grouped into programs; ValueError when the method, the ranges or
    the fork cannot train them."""
    tuning = options.method != "grid"
    ranges = [k for k, v in sweep.items() if isinstance(v, Range)]
    if ranges and options.method != "pbt":
        raise ValueError(f"--sweep.{ranges[0]}: a range low:high is for --sweep.method=pbt; give values a,b,c")
    tuned = tuned_hyperparams(config, sweep, f"--sweep.method={options.method}") if tuning else []
    points = expand(config, sweep, draw_ranges(sweep, population, config.seed))
    forked_update = None
    if fork is not None:
        tuned_hyperparams(config, sweep, "a fork")
        forked_update = fork.check([point for _, point in points])
    programs = group_programs(points)
    short = _short_names(list(sweep))
    names = [setting_name(overrides, short) for overrides, _ in points]
    if tuning:
        check_one_program(programs, names, options.method)
    return Expanded(points, names, programs, tuned, forked_update)


def _run_sweep(config, sweep, workdir, progress, options, population, fork, overwrite) -> list[dict]:
    expanded = expand_sweep(config, sweep, options, population, fork)
    described = describe(config, sweep, options, fork, [[expanded.names[i] for i in p] for p in expanded.programs])
    if not overwrite:  # read only, every program's settings before anything of the sweep is written
        check_same_sweep(workdir, described)
        _check_saved_settings(workdir, expanded, fork)
    main = distributed.is_main_process()
    if main:
        if overwrite:
            workdir_lib.clear(workdir)
        os.makedirs(workdir, exist_ok=True)
        files.write_json(os.path.join(workdir, workdir_lib.SWEEP_FILE), described, indent=2)
        workdir_lib.record_start(workdir, workdir_lib.SWEEP, None)
        print(f"sweep: {len(expanded.points)} settings x {config.num_seeds} seeds in {len(expanded.programs)} "
              f"compiled program(s), {options.method}{' from a fork' if fork else ''}, under {workdir}",
              file=sys.stderr)
    tuning = (options, expanded.tuned) if options.method != "grid" else None
    rows = _train_programs(expanded, workdir, progress, tuning, fork)
    summary = summarize_sweep([overrides for overrides, _ in expanded.points], expanded.names, rows,
                              config.num_seeds)
    if main:
        _write_results(config, workdir, expanded, rows, summary, tuning)
    return summary


def _check_saved_settings(workdir: str, expanded: Expanded, fork: Fork | None) -> None:
    """ValueError (read only) when a setting's directory holds a run this sweep would mislabel or lose."""
    for number, members in enumerate(expanded.programs):
        resuming = checkpoint.has_checkpoints(program_dir(workdir, number)) or fork is not None
        for i in members:
            workdir_lib.check_saved(algos.resolve(expanded.points[i][1]), os.path.join(workdir, expanded.names[i]),
                                    resuming=resuming)


def _train_programs(expanded: Expanded, workdir: str, progress, tuning, fork: Fork | None) -> list[list[dict]]:
    """Train each program in turn (`program.run_settings`): every setting's metric rows, in the settings'
    order. Interrupted when a signal stopped one (after it saved a checkpoint)."""
    rows_by_setting: dict[int, list[dict]] = {}
    for number, members in enumerate(expanded.programs):
        settings = [Setting(expanded.points[i][1], os.path.join(workdir, expanded.names[i])) for i in members]
        checkpoint_dir = program_dir(workdir, number)
        start_state = None
        if fork is not None and not checkpoint.has_checkpoints(checkpoint_dir):
            start_state = fork.start(expanded.forked_update, len(settings))
            if distributed.is_main_process():
                for setting in settings:
                    fork.copy_metrics(expanded.forked_update, setting.workdir)
        result = program.run_settings(settings, checkpoint_dir, progress=progress, tuning=tuning,
                                      start_state=start_state, kind=workdir_lib.SETTING)
        if result.interrupted:
            raise Interrupted(workdir, number)
        rows_by_setting.update(zip(members, result.rows))  # (a program whose every run diverged ends early)
    return [rows_by_setting[i] for i in range(len(expanded.points))]


def _write_results(config: ConfigDict, workdir: str, expanded: Expanded, rows: list[list[dict]],
                   summary: list[dict], tuning) -> None:
    """summary.csv and sweep.png; for PBT and halving, population.csv and lineage.png too (process 0)."""
    write_summary(summary, os.path.join(workdir, "summary.csv"))
    plot_sweep(expanded.names, rows, config.num_seeds, os.path.join(workdir, "sweep.png"), title=config.experiment)
    if tuning is not None:
        options, tuned = tuning
        lineage = population_lib.read_lineage(lineage_path(workdir))
        write_summary(summarize_population(lineage, expanded.names, rows, config.num_seeds),
                      os.path.join(workdir, "population.csv"))
        plot_lineage(lineage, [t.key for t in tuned], os.path.join(workdir, "lineage.png"),
                     title=f"{config.experiment}: {options.method}")


# What identifies a sweep: a directory holding another is not resumed as this one (its states would be labelled
# with these settings).
IDENTITY = ("num_seeds", "sweep", "method", "fork")


def describe(config: ConfigDict, sweep: dict[str, list | Range], options: population_lib.Options,
             fork: Fork | None, programs: list[list[str]]) -> dict:
    """sweep.json: the swept keys and values (ranges as {low, high}), seeds, method, fork and each program's
    settings, as JSON values."""
    saved = {k: (dataclasses.asdict(v) if isinstance(v, Range) else v) for k, v in sweep.items()}
    return json.loads(json.dumps({"num_seeds": config.num_seeds, "sweep": saved, "method": dataclasses.asdict(options),
                                  "fork": dataclasses.asdict(fork) if fork else None, "programs": programs}))


def check_same_sweep(workdir: str, described: dict) -> None:
    """ValueError when `workdir` holds a sweep of other settings, seeds, method or fork than `described`."""
    saved = files.read_json(os.path.join(workdir, workdir_lib.SWEEP_FILE))
    if saved is None:
        return
    if isinstance(saved.get("method"), dict):  # an option added since it was saved had its default then
        saved["method"] = {**json.loads(json.dumps(dataclasses.asdict(population_lib.Options()))), **saved["method"]}
    differ = [key for key in IDENTITY if saved.get(key) != described[key]]
    if differ:
        shown = "; ".join(f"{key}: saved {json.dumps(saved.get(key))}, now {json.dumps(described[key])}"
                          for key in differ)
        raise ValueError(f"{workdir} holds a sweep of other settings ({shown}): run it with its saved values to "
                         "resume it, choose another --workdir, or pass --overwrite to start it again")


def program_dir(workdir: str, number: int) -> str:
    """Where program `number` of a sweep keeps its checkpoints (and, tuned, its lineage)."""
    return os.path.join(workdir, "checkpoints", str(number))


def lineage_path(workdir: str) -> str:
    """The lineage of a PBT or halving sweep (one program)."""
    return os.path.join(program_dir(workdir, 0), population_lib.LINEAGE_FILE)


@dataclasses.dataclass(frozen=True)
class Fork:
    """A saved run (`run_dir`, trained by `jaxrl.train` or one setting of a sweep) at checkpoint `update` (None:
    its newest), continued as every setting of a sweep: each setting's runs start from the parent's state of
    every seed (same environment states and random keys) and differ only in traced hyperparameters."""

    run_dir: str
    update: int | None = None

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")

    def config(self) -> ConfigDict:
        path = os.path.join(self.run_dir, "config.json")
        if not os.path.exists(path):
            raise ValueError(f"--sweep.fork={self.run_dir}: no config.json there (give a run directory)")
        return config_lib.load(path)

    def check(self, configs: list[ConfigDict]) -> int:
        """The update forked; ValueError when there is no such checkpoint, or a setting's config differs from
        the parent's in its seed count or in more than traced hyperparameters and what a resume may change."""
        parent, steps = self.config(), []
        if checkpoint.has_checkpoints(self.checkpoint_dir):
            manager = checkpoint.Checkpointer(self.checkpoint_dir)
            try:
                steps = manager.steps()
            finally:
                manager.close()
        if not steps:
            raise ValueError(f"--sweep.fork={self.run_dir}: no checkpoints under {self.checkpoint_dir}")
        if self.update is not None and self.update not in steps:
            raise ValueError(f"--sweep.fork_update={self.update}: {self.run_dir} has checkpoints at updates "
                             f"{', '.join(map(str, steps))}")
        for config in configs:
            if config.num_seeds != parent.num_seeds:
                raise ValueError(f"a fork continues the parent's {parent.num_seeds} seeds; the config has "
                                 f"num_seeds={config.num_seeds}")
            allowed = set(algos.hyperparam_keys(config)) | set(workdir_lib.RESUMABLE_CHANGES)
            changed = [k for k in config_lib.differences(parent, config, added=False) if k not in allowed]
            if changed:
                raise ValueError(f"--sweep.fork={self.run_dir}: a fork may change only traced hyperparameters and "
                                 f"{workdir_lib.RESUMABLE_CHANGES[0]} (and logging), not {', '.join(changed)}")
        return self.update if self.update is not None else max(steps)

    def start(self, update: int, num_settings: int):
        """The `start_state` of `program.run_settings`: (algo, abstract state of the program) -> (`update`, the
        parent's state of every seed at that update, repeated for each of the `num_settings` settings, on the
        program's mesh)."""
        def start(algo, abstract):
            replicated = jax.sharding.NamedSharding(algo.mesh, jax.sharding.PartitionSpec())
            parent = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // num_settings, *x.shape[1:]),
                                                                 x.dtype, sharding=replicated), abstract)
            _, state = checkpoint.restore_from(self.checkpoint_dir, parent, update)
            state = jax.tree.map(lambda x: jnp.tile(x, (num_settings,) + (1,) * (x.ndim - 1)), state)
            return update, jax.device_put(state, algo.state_shardings(state))
        return start

    def copy_metrics(self, update: int, child_dir: str) -> None:
        """Start a child's metrics.jsonl with the parent's rows up to `update` (its curve continues them)."""
        rows = metrics_lib.rows_through(os.path.join(self.run_dir, "metrics.jsonl"), update)
        os.makedirs(child_dir, exist_ok=True)
        files.write_lines(os.path.join(child_dir, "metrics.jsonl"), rows)

