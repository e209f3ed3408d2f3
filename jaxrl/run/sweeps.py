"""Sweeps: every combination of settings x seeds, in as few compiled programs as the settings allow."""

from __future__ import annotations

import itertools
import json
import os
import sys

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib, distributed
from jaxrl.run import loop
from jaxrl.run.summary import plot_sweep, summarize_sweep, write_summary

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
        settings = [loop.Setting(points[i][1], os.path.join(workdir, names[i])) for i in program]
        result = loop.run_settings(settings, os.path.join(workdir, "checkpoints", str(number)), progress=progress)
        rows = result.rows  # a program whose every run diverged stopped early: its rows end there
        if result.interrupted:
            raise KeyboardInterrupt(f"sweep stopped during program {number}; rerun the command with "
                                    f"--workdir={workdir} to resume")
        rows_by_setting.update(zip(program, rows))
    rows = [rows_by_setting[i] for i in range(len(points))]
    summary = summarize_sweep([overrides for overrides, _ in points], names, rows, config.num_seeds)
    if main:
        write_summary(summary, os.path.join(workdir, "summary.csv"))
        plot_sweep(names, rows, config.num_seeds, os.path.join(workdir, "sweep.png"), title=config.experiment)
    return summary

