"""Text for people: a byte count and a table, written the same way everywhere.

The command line, the tools' reports and the memory descriptions print sizes
through :func:`format_bytes` and tables through :func:`format_table`, so a size
reads alike in ``plan``, ``inspect``, ``bench``, the demo and an error message.
It imports nothing of chunkstream's: every package may use it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_bytes", "format_table"]

_DECIMAL = ("B", "kB", "MB", "GB", "TB", "PB")
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None, *, binary: bool = False) -> str:
    """``n`` bytes with three significant figures in the largest unit below 1000 of it:
    ``59.9 GB``, ``512 kB``, ``37 B``; ``-`` for ``None``.

    ``binary=True`` counts in powers of 1024 (``3 GiB``, ``768 MiB``): the unit of a
    memory limit (cgroups, Slurm's ``--mem``), which then reads back as it was set.
    """
    if n is None:
        return "-"
    base, units = (1024, _BINARY) if binary else (1000, _DECIMAL)
    if abs(n) < base:
        return f"{n:.0f} B"
    value = float(n)
    for unit in units[1:]:
        value /= base
        text = f"{value:.3g}"
        if abs(float(text)) < 1000:  # 999.7 kB rounds to 1000: written 1 MB
            return f"{text} {unit}"
    return f"{value:,.0f} {units[-1]}"


def format_table(
    rows: Sequence[Sequence[str]], *, align: str = "", indent: str = "  "
) -> list[str]:
    """The lines of a table: ``rows`` (a header row among them, if any) in columns two
    spaces apart, each as wide as its widest cell, after ``indent``.

    ``align`` gives one character per column, ``<`` (left, the default for a column
    it does not reach) or ``>`` (right: numbers); a line ends at its last character,
    so a left-aligned last column is free text.
    """
    if not rows:
        return []
    columns = max(len(r) for r in rows)
    rows = [tuple(r) + ("",) * (columns - len(r)) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(columns)]
    sides = align.ljust(columns, "<")
    return [
        indent
        + "  ".join(f"{c:{s}{w}}" for c, s, w in zip(row, sides, widths, strict=True)).rstrip()
        for row in rows
    ]
