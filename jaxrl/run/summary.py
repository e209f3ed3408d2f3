"""A sweep's summary: final values with a 95% confidence interval over seeds, as CSV, table and plot."""

from __future__ import annotations

import csv
import math

import numpy as np

from jaxrl import metrics as metrics_lib

def confidence_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its two-sided Student-t interval (NaN bounds for one
    value); None values (seeds that logged nothing) are left out."""
    from scipy import stats

    values = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, df=values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
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


def format_summary(summary: list[dict]) -> str:
    """The summary as a table: each headline metric as `mean [low, high]`."""
    keys = [k for k in metrics_lib.HEADLINE_KEYS if any(k in row for row in summary)]
    header = ["setting", "seeds", "env steps", *keys]
    cell = lambda row, k: (f"{row[k]:.3g} [{row[k + '_ci_low']:.3g}, {row[k + '_ci_high']:.3g}]"
                           if k in row else "-")
    rows = [[row["setting"], row["num_seeds"], row["env_steps"], *(cell(row, k) for k in keys)] for row in summary]
    return metrics_lib.markdown_table(header, rows)

