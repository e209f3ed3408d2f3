"""Metrics a person can read while a run goes and plot afterwards: metrics.jsonl and a PNG curve."""

from __future__ import annotations

import json
import math
import os
from typing import Iterable

import numpy as np

from jaxrl import files

CURVE_KEYS = ("episode_return", "eval_return")
WIN_KEYS = ("win_rate", "eval_win_rate")
ACCURACY_KEYS = ("token_accuracy", "eval_accuracy")
# What a person watches: per-seed lists in metrics.jsonl, the progress bar, the run's printed summary.
HEADLINE_KEYS = ("episode_return", "eval_return", "win_rate", "eval_win_rate", "eval_accuracy", "eval_success", "eval_turns",
                 "solved", "turns", "tool_error_rate", "eval_ranking_accuracy", "eval_label_accuracy", "eval_best_of_n",
                 "eval_sampled_accuracy")
PER_SEED_PREFIXES = ("eval_pass@", "eval_pass^", "eval_head@")  # kept per seed too (pass@k, pass^k, best-of-k
# by the value head), whatever k
# What ranks evaluated policies (checkpoint.keep_best), the first an evaluation reports; higher is better.
EVAL_SCORE_KEYS = ("eval_win_rate", "eval_accuracy", "eval_return")


def eval_score(metrics: dict) -> float | None:
    """The evaluation's headline figure, mean over the runs, from metrics with leaves [R] (None: not evaluated,
    or no run finite)."""
    for key in EVAL_SCORE_KEYS:
        if key in metrics:
            values = np.asarray(metrics[key], np.float64)
            return float(np.nanmean(values)) if np.isfinite(values).any() else None
    return None


def summarize(per_seed: dict[str, np.ndarray]) -> dict[str, float | list[float]]:
    """Chunk metrics with leaves [S] -> one row: means over seeds (and per-seed lists when S > 1).

    Episode statistics arrive as sums and counts so that seeds and devices combine exactly; a seed that
    finished no episode in the chunk contributes NaN (written as null).
    """
    per_seed = {k: np.asarray(v, dtype=np.float64) for k, v in per_seed.items()}
    row: dict[str, float | list[float]] = {}
    episodes = per_seed.pop("episodes", None)
    for key in [k for k in per_seed if k.endswith("_sum")]:  # per-episode sums: episode_return, win_rate, ...
        per_seed[key[:-len("_sum")]] = per_episode(per_seed.pop(key), episodes)
    if episodes is not None:
        row["episodes"] = float(episodes.sum())
    for name, values in per_seed.items():
        row[name] = finite_or_none(np.nanmean(values)) if np.isfinite(values).any() else None
        if values.size > 1 and (name in HEADLINE_KEYS or name.startswith(PER_SEED_PREFIXES)):
            row[f"{name}_per_seed"] = [finite_or_none(v) for v in values]
    return row


def per_episode(total, episodes) -> np.ndarray:
    """An episode statistic's sum over a chunk -> its mean per episode (float64), NaN where no episode ended."""
    total, episodes = np.asarray(total, np.float64), np.asarray(episodes, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(episodes > 0, total / np.maximum(episodes, 1), np.nan)


def finite_or_none(x) -> float | None:
    """`x` as a float, or None (JSON null) when it is NaN or infinite."""
    x = float(x)
    return x if math.isfinite(x) else None


class MetricsWriter:
    """Appends one JSON object per line to `metrics.jsonl`."""

    def __init__(self, path: str):
        self.path = path

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_after(self, update: int) -> None:
        """Drop rows logged after `update` (a resumed run will log them again), and a last row that a kill cut
        short; the file is replaced atomically."""
        files.write_lines(self.path, rows_through(self.path, update))


def rows_through(path: str, update: int) -> list[dict]:
    """The rows of a metrics.jsonl logged at updates up to `update` (`read`)."""
    return [r for r in read(path) if r.get("update", 0) <= update]


def read(path: str) -> list[dict]:
    """Rows of a metrics.jsonl (missing file: no rows). A last line without its newline is a row a kill cut
    short while it was written: left out. Any other unreadable line is an error naming the file and line."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().split("\n")
    rows = []
    for number, line in enumerate(lines[:-1], 1):  # the part after the last newline is never a whole row
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not a JSON row ({error})") from None
    return rows


def curve_keys(rows: Iterable[dict]) -> tuple[tuple[str, ...], str]:
    """What to plot for these rows, and the y label: win rates when the env reports wins, accuracies for
    text tasks, else returns."""
    rows = list(rows)
    if any(r.get(key) is not None for r in rows for key in WIN_KEYS):
        return WIN_KEYS, "win rate"
    if any(r.get("eval_accuracy") is not None for r in rows):
        return ACCURACY_KEYS, "accuracy"
    return CURVE_KEYS, "return"


def plot_learning_curve(rows: Iterable[dict], path: str, keys: Iterable[str] | None = None,
                        title: str = "") -> str:
    """Plot each of `keys` (default: `curve_keys(rows)`) against env_steps into a PNG at `path`."""
    rows = list(rows)
    default_keys, ylabel = curve_keys(rows)
    keys = default_keys if keys is None else keys
    fig = new_figure(figsize=(6, 4))
    ax = fig.subplots()
    for key in keys:
        points = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            x, y = zip(*points)
            ax.plot(x, y, marker="o" if key.startswith("eval") else None, markersize=3, label=key)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return save_figure(fig, path, legend_size=10)


def new_figure(figsize: tuple[float, float], dpi: int = 100):
    """A matplotlib Figure drawn by the Agg canvas, outside pyplot: a run's plots neither switch a notebook's
    backend nor join pyplot's open figures (and skip importing pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str, legend_size: float = 8) -> str:
    """Grid on every axis and a legend where something is labelled, tight layout, write `path`; returns
    `path`."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path)
    return path


def per_seed(row: dict, key: str, num_seeds: int, complete: bool = False) -> list | None:
    """A metrics row's `key` for every seed: the `<key>_per_seed` list, or the value of a one-seed run.
    None when the row lacks it; with `complete`, also when some seed has no value (None) in it."""
    values = row.get(f"{key}_per_seed", [row[key]] if num_seeds == 1 and row.get(key) is not None else None)
    if values is None or (complete and any(v is None for v in values)):
        return None
    return values


def markdown_table(header: list, rows: list[list]) -> str:
    """A right-aligned markdown table with columns as wide as their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])
