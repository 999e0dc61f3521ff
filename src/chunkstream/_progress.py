"""The progress bar every long command shows: one convention, in one place.

A tqdm bar on standard error, so standard output stays the command's result (a
table, ``--json``). ``disable=None`` shows it only when standard error is a
terminal: a log file or a pipe gets no bar. ``enabled=False`` (``--no-progress``,
``progress=False``) hides it everywhere. tqdm is imported on first use, so a
command's ``--help`` does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(
    iterable: Iterable | None = None,
    *,
    desc: str,
    unit: str,
    total: int | None = None,
    initial: int = 0,
    enabled: bool = True,
    leave: bool = True,
) -> Any:
    """A tqdm bar (a context manager; wraps ``iterable`` where given) named ``desc``,
    counting ``unit``\\ s up to ``total`` from ``initial``; shown on a terminal only,
    never when ``enabled`` is False (module docs)."""
    from tqdm.auto import tqdm

    return tqdm(
        iterable,
        desc=desc,
        unit=unit,
        total=total,
        initial=initial,
        leave=leave,
        disable=None if enabled else True,
    )
