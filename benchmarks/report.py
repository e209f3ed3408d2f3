"""Shared by the benchmark scripts: their tables, as markdown that reads well in a terminal too."""

from __future__ import annotations

from jaxrl.metrics import markdown_table  # noqa: F401  (re-exported for the scripts)


def replace_section(path: str, markers: tuple[str, str], section: str, title: str) -> None:
    """Put `section` between the two marker lines of the markdown file at `path`, replacing what was there;
    without the markers, append it under a new `## title` heading."""
    with open(path) as f:
        text = f.read()
    block = f"{markers[0]}\n{section}\n{markers[1]}"
    if markers[0] in text and markers[1] in text:
        start, end = text.index(markers[0]), text.index(markers[1]) + len(markers[1])
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def seed_band(ax, x, y, label: str) -> None:
    """Plot the mean over seeds of y [n, S] against x [n], with the min-max band."""
    ax.plot(x, y.mean(1), marker="o", markersize=3, label=label)
    ax.fill_between(x, y.min(1), y.max(1), alpha=0.15)


def save_figure(fig, path: str) -> None:
    """Grid and legend on every axis, tight layout, write `path`, free the figure."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt
    plt.close(fig)


def publish(section: str, update_results: bool, markers: tuple[str, str], title: str) -> None:
    """Print a benchmark's section; with `update_results`, also put it into benchmarks/RESULTS.md."""
    import os

    print(section)
    if update_results:
        replace_section(os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"), markers, section,
                        title)


def per_seed(row: dict, key: str, num_seeds: int) -> list[float] | None:
    """A metrics row's `key` for every seed (the `<key>_per_seed` list, or the value of a one-seed run);
    None where the row lacks it for some seed."""
    values = row.get(f"{key}_per_seed", [row.get(key)] if num_seeds == 1 else None)
    return None if values is None or any(v is None for v in values) else values
