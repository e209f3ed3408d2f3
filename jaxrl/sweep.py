"""Hyperparameter sweeps: every combination of settings x seeds, vmapped in as few compiled programs as the
settings allow.

    python -m jaxrl.sweep --config=experiments/cartpole_ppo.py --sweep.seeds=16 --sweep.lr=1e-4,3e-4,1e-3
    python -m jaxrl.sweep --config=experiments/smax_mappo.py:3m --sweep.seeds=4 \\
        --sweep.ppo.ent_coef=0,0.01 --sweep.num_envs=64,128

`--sweep.<key>=a,b,c` names a config key in full (`ppo.learning_rate`), by its last part when that is
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

import csv
import itertools
import json
import math
import os
import sys
import time

import numpy as np
from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib, distributed, metrics as metrics_lib, train

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


def expand(config: ConfigDict, sweep: dict[str, list]) -> list[tuple[dict, ConfigDict]]:
    """Every combination of the swept values: (overrides {key: value}, config with them applied)."""
    points = []
    for values in itertools.product(*sweep.values()):
        overrides = dict(zip(sweep, values))
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


def run_sweep(config: ConfigDict, sweep: dict[str, list], workdir: str, *, progress: bool | None = None) -> list[dict]:
    """Train every setting of `sweep` (config keys -> values; `num_seeds` from the config) under `workdir`;
    returns the summary rows (also written to summary.csv, with sweep.png)."""
    points = expand(config, sweep)
    programs = group_programs(points)
    short = _short_names(list(sweep))
    names = [setting_name(overrides, short) for overrides, _ in points]
    main = distributed.is_main_process()
    if main:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "sweep.json"), "w") as f:
            json.dump({"num_seeds": config.num_seeds, "sweep": sweep,
                       "programs": [[names[i] for i in p] for p in programs]}, f, indent=2)
        print(f"sweep: {len(points)} settings x {config.num_seeds} seeds in {len(programs)} compiled "
              f"program(s), under {workdir}", file=sys.stderr)
    rows_by_setting: dict[int, list[dict]] = {}
    for number, program in enumerate(programs):
        settings = [train.Setting(points[i][1], os.path.join(workdir, names[i])) for i in program]
        _, rows, interrupted = train.run_settings(settings, os.path.join(workdir, "checkpoints", str(number)),
                                                  progress=progress)
        if interrupted:
            raise KeyboardInterrupt(f"sweep stopped during program {number}; rerun the command with "
                                    f"--workdir={workdir} to resume")
        rows_by_setting.update(zip(program, rows))
    rows = [rows_by_setting[i] for i in range(len(points))]
    summary = summarize_sweep([overrides for overrides, _ in points], names, rows, config.num_seeds)
    if main:
        write_summary(summary, os.path.join(workdir, "summary.csv"))
        plot_sweep(names, rows, config.num_seeds, os.path.join(workdir, "sweep.png"), title=config.experiment)
    return summary


# ------------------------------------------------------------------------------------------------------
# Summary: final values with a 95% confidence interval over seeds

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (beyond: the normal 1.96).
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
          2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
          2.045, 2.042)


def confidence_interval(values) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its 95% Student-t interval (NaN bounds for one value)."""
    values = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    df = values.size - 1
    half = (_T_975[df - 1] if df <= len(_T_975) else 1.96) * values.std(ddof=1) / math.sqrt(values.size)
    return mean, mean - half, mean + half


def summarize_sweep(overrides: list[dict], names: list[str], rows: list[list[dict]], num_seeds: int) -> list[dict]:
    """One row per setting: its swept values, then for each headline metric of its last logged value the
    mean, 95% interval and per-seed values."""
    summary = []
    for setting, name, setting_rows in zip(overrides, names, rows):
        out = {"setting": name, **setting, "num_seeds": num_seeds}
        last = setting_rows[-1] if setting_rows else {}
        out["env_steps"] = last.get("env_steps")
        for key in metrics_lib.HEADLINE_KEYS:
            values = metrics_lib.per_seed(last, key, num_seeds)
            if values is None:
                continue
            mean, low, high = confidence_interval(values)
            out.update({key: mean, f"{key}_ci_low": low, f"{key}_ci_high": high,
                        f"{key}_per_seed": " ".join("nan" if v is None else f"{v:.4g}" for v in values)})
        summary.append(out)
    return summary


def write_summary(summary: list[dict], path: str) -> str:
    columns = list(dict.fromkeys(k for row in summary for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for row in summary:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return path


def plot_sweep(names: list[str], rows: list[list[dict]], num_seeds: int, path: str, title: str = "") -> str:
    """Mean over seeds and 95% confidence band of the training curve's headline metric, one line per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys, ylabel = metrics_lib.curve_keys(row for setting_rows in rows for row in setting_rows)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, setting_rows in zip(names, rows):
        key = _curve_key(setting_rows, keys, num_seeds)
        if key is None:
            continue
        points = [(r["env_steps"], confidence_interval(values)) for r in setting_rows
                  if (values := metrics_lib.per_seed(r, key, num_seeds)) is not None]
        x = [p[0] for p in points]
        mean, low, high = (np.array([p[1][i] for p in points]) for i in range(3))
        line, = ax.plot(x, mean, label=f"{name} ({key})")
        if num_seeds > 1:
            ax.fill_between(x, low, high, alpha=0.15, color=line.get_color())
    ax.set_xlabel("environment steps per run")
    ax.set_ylabel(f"{ylabel} (mean, 95% CI over {num_seeds} seeds)")
    ax.set_title(title)
    return metrics_lib.save_figure(fig, path, legend_size=7)


def _curve_key(rows: list[dict], keys: tuple[str, ...], num_seeds: int) -> str | None:
    """The first of `keys` logged in more than one row (a curve), else the first logged at all."""
    counts = {k: sum(metrics_lib.per_seed(r, k, num_seeds) is not None for r in rows) for k in keys}
    logged = [k for k in keys if counts[k]]
    curves = [k for k in logged if counts[k] > 1]
    return (curves or logged or [None])[0]


# ------------------------------------------------------------------------------------------------------
# Command line

def split_sweep_flags(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(argv without the --sweep.<key>=<values> flags, [(key, values)] in order)."""
    rest, sweep = [], []
    for arg in argv:
        if arg.startswith("--sweep."):
            name, sep, values = arg[len("--sweep."):].partition("=")
            if not sep:
                raise SystemExit(f"{arg}: write --sweep.<key>=<value>,<value>,...")
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
    if FLAGS.config is None:
        raise SystemExit("give --config=experiments/<name>.py and --sweep.<key>=<values> flags")
    train.setup_process(FLAGS)
    config, sweep = sweep_from_flags(FLAGS.config, sweep_flags)
    workdir = FLAGS.workdir or os.path.join("runs", f"{config.experiment}-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = run_sweep(config, sweep, workdir)
    if distributed.is_main_process():
        print(format_summary(summary))
        print(f"\n{workdir}/summary.csv, {workdir}/sweep.png")
    return 0


def format_summary(summary: list[dict]) -> str:
    """The summary as a table: each headline metric as `mean [low, high]`."""
    keys = [k for k in metrics_lib.HEADLINE_KEYS if any(k in row for row in summary)]
    header = ["setting", "seeds", "env steps", *keys]
    cell = lambda row, k: (f"{row[k]:.3g} [{row[k + '_ci_low']:.3g}, {row[k + '_ci_high']:.3g}]"
                           if k in row else "-")
    rows = [[row["setting"], row["num_seeds"], row["env_steps"], *(cell(row, k) for k in keys)] for row in summary]
    return metrics_lib.markdown_table(header, rows)


if __name__ == "__main__":
    from absl import app

    argv, sweep_flags = split_sweep_flags(sys.argv)
    train.define_flags()
    app.run(lambda argv: sys.exit(main(argv, sweep_flags)), argv=argv)
