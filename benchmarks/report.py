"""Shared by the benchmark scripts: their tables, as markdown that reads well in a terminal too."""

from __future__ import annotations


def markdown_table(header: list, rows: list[list]) -> str:
    """A right-aligned markdown table with columns as wide as their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])
