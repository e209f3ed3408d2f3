"""A sweep's summary: final values with a 95% confidence interval over seeds (and the difference the seeds can
detect), as CSV, table and plot."""

from __future__ import annotations

import csv
import math

import numpy as np

from jaxrl import files, metrics as metrics_lib

def confidence_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its two-sided Student-t interval (NaN bounds for one
    value); None values (seeds that logged nothing) are left out."""
    from scipy import stats

    values = _present(values)
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, df=values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    return mean, mean - half, mean + half


def _present(values) -> np.ndarray:
    """float64 [n]: the values of the seeds that logged one (None left out)."""
    return np.asarray([v for v in values if v is not None], dtype=np.float64)


def detectable_difference(values, power: float = 0.8, level: float = 0.95) -> float:
    """The smallest difference of means between this setting and another of as many seeds and the same spread that a
    two-sided test at `level` finds with probability `power`: (z_(1/2 + level/2) + z_power) s sqrt(2 / n), s the
    seeds' standard deviation (a power analysis, normal approximation; NaN for fewer than two values). Differences
    smaller than this need more seeds to be told apart."""
    from scipy import stats

    values = _present(values)
    if values.size < 2:
        return math.nan
    z = stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power)
    return float(z * values.std(ddof=1) * math.sqrt(2.0 / values.size))


def summarize_sweep(overrides: list[dict], names: list[str], rows: list[list[dict]], num_seeds: int) -> list[dict]:
    """One row per setting: its swept values, then for each headline metric of its last logged value the
    mean, 95% interval, per-seed values and the difference its seeds can detect (`detectable_difference`)."""
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
                        f"{key}_per_seed": " ".join("nan" if v is None else f"{v:.4g}" for v in values),
                        f"{key}_detectable": detectable_difference(values)})
        summary.append(out)
    return summary


def write_summary(summary: list[dict], path: str) -> str:
    columns = list(dict.fromkeys(k for row in summary for k in row))
    with files.atomic_file(path, newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for row in summary:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return path


def plot_sweep(names: list[str], rows: list[list[dict]], num_seeds: int, path: str, title: str = "") -> str:
    """Mean over seeds and 95% confidence band of the training curve's headline metric, one line per setting."""
    keys, ylabel = metrics_lib.curve_keys(row for setting_rows in rows for row in setting_rows)
    fig = metrics_lib.new_figure(figsize=(7, 4.5))
    ax = fig.subplots()
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


def _format_cell(row: dict, key: str) -> str:
    if key not in row:
        return "-"
    low, high = row[key + "_ci_low"], row[key + "_ci_high"]
    interval = f" [{low:.3g}, {high:.3g}]" if math.isfinite(low) and math.isfinite(high) else ""
    return f"{row[key]:.3g}{interval}"


def format_summary(summary: list[dict]) -> str:
    """The summary as a table: each headline metric as `mean [low, high]`, or the mean alone where there is no
    interval (one seed)."""
    keys = [k for k in metrics_lib.HEADLINE_KEYS if any(k in row for row in summary)]
    header = ["setting", "seeds", "env steps", *keys]
    rows = [[row["setting"], row["num_seeds"], row["env_steps"], *(_format_cell(row, k) for k in keys)]
            for row in summary]
    return metrics_lib.markdown_table(header, rows)



def ancestry(lineage: list[dict], run: int) -> list[tuple[int, int]]:
    """[(update, run)] from the start to the end: the run that `run` (at the end) descends from after each
    event of the lineage (`jaxrl.run.population`), following copies back."""
    path = [(lineage[-1]["update"], run)]
    for event in reversed(lineage[1:]):
        run = event["parents"][run]
        path.append((event["update"] - 1, run))  # before the event (its chunk's last update)
    return list(reversed(path))


def summarize_population(lineage: list[dict], names: list[str], rows: list[list[dict]], num_seeds: int) -> list[dict]:
    """One row per run of a PBT or successive-halving program, best final headline first: the setting it
    trains at the end and the one its ancestry started from, how often it was copied over, its swept values at
    the end, and its last logged headline metrics."""
    last = lineage[-1]
    settings = np.asarray(last["settings"])
    first_settings = lineage[0]["settings"]
    out = []
    for run, setting in enumerate(settings):
        group = np.flatnonzero(settings == setting)
        position = int(np.flatnonzero(group == run)[0])
        path = ancestry(lineage, run)
        entry = {"run": run, "setting": names[setting], "origin": names[first_settings[path[0][1]]],
                 "copies": sum(a != b for (_, a), (_, b) in zip(path, path[1:])),
                 **{key: values[run] for key, values in last["values"].items()}}
        final = rows[setting][-1] if rows[setting] else {}
        entry["env_steps"] = final.get("env_steps")
        for key in metrics_lib.HEADLINE_KEYS:
            values = metrics_lib.per_seed(final, key, len(group))
            if values is not None:
                entry[key] = values[position]
        out.append(entry)
    headline = next((k for k in ("eval_win_rate", "eval_return", "eval_accuracy") if any(k in e for e in out)), None)
    if headline:
        out.sort(key=lambda e: -np.inf if e.get(headline) is None else -e[headline])
    return out


def plot_lineage(lineage: list[dict], keys: list[str], path: str, title: str = "") -> str:
    """Each tuned hyperparameter of every run over env steps (a line per run between decisions, a dotted
    jump where a run copied another and took its perturbed value), with the best run's ancestry in bold;
    and the score each decision ranked the runs by."""
    import matplotlib

    steps = [event["env_steps"] for event in lineage]
    end = steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1)
    ranked = [e for e in lineage if any(s is not None for s in e["scores"])]
    final_scores = np.array([np.nan if s is None else s for s in ranked[-1]["scores"]]) if ranked else None
    best = int(np.nanargmax(final_scores)) if final_scores is not None and np.isfinite(final_scores).any() else 0
    best_path = [run for _, run in ancestry(lineage, best)]  # the best run's ancestor in each interval
    num_runs = len(lineage[0]["parents"])
    colors = matplotlib.colormaps["viridis"](np.linspace(0, 1, num_runs))
    fig = metrics_lib.new_figure(figsize=(7, 2.6 * (len(keys) + 1)))
    axes = fig.subplots(len(keys) + 1, 1, sharex=True)
    for ax, key in zip(axes, keys):
        _plot_values(ax, lineage, key, [*steps, end], best_path, colors)
    for event in ranked:
        axes[-1].scatter([event["env_steps"]] * num_runs, [np.nan if s is None else s for s in event["scores"]],
                         c=colors, s=12)
    axes[-1].set_ylabel(f"score ({lineage[-1]['score_key']})")
    axes[-1].set_xlabel("environment steps per run")
    axes[0].set_title(f"{title}\nbold: the ancestry of run {best}, the best at the last decision; dotted: copies",
                      fontsize=10)
    return metrics_lib.save_figure(fig, path)


def _plot_values(ax, lineage: list[dict], key: str, bounds: list[int], best_path: list[int], colors) -> None:
    """Hyperparameter `key` of every run between decisions (`bounds`: the decisions' env steps and the end),
    the best run's ancestry in bold, a dotted jump where a run copied another."""
    for i, event in enumerate(lineage):
        x0, x1 = bounds[i], bounds[i + 1]
        values = event["values"][key]
        for run in range(len(values)):
            bold = best_path[i] == run
            ax.plot([x0, x1], [values[run]] * 2, color="k" if bold else colors[run], lw=2.5 if bold else 1,
                    zorder=3 if bold else 2)
            parent = event["parents"][run]
            if i and parent != run:
                ax.plot([x0, x0], [lineage[i - 1]["values"][key][parent], values[run]], ":",
                        color="k" if bold else colors[run], lw=1.5)
    if all(v > 0 for e in lineage for v in e["values"][key]):
        ax.set_yscale("log")
    ax.set_ylabel(key.rsplit(".", 1)[-1])
