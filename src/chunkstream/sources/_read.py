"""Reading a chunk's pieces from a source: one ``read_into`` per piece, retried after
a transient error, every failure raised as :class:`~chunkstream.ChunkLoadError`
naming the window and, when known, the field.

A piece is any object with ``offset``, ``length``, ``start`` and ``stop`` (a
:class:`~chunkstream.plans.Piece`): rows ``[offset, offset + length)`` of the
output hold timesteps ``[start, stop)``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np

from .._errors import ChunkLoadError, ChunkstreamError, NonFiniteError
from ._base import Source, describe_source, field_of
from ._leave import leave_when

__all__ = ["call_with_retries", "read_owned_window", "read_window", "reading"]

_T = TypeVar("_T")
# The loader's logger: a user's logging set-up for the pipeline covers its retries.
_log = logging.getLogger("chunkstream.pipeline")
_RETRY_BACKOFF_S = 0.05


@contextlib.contextmanager
def reading(source: Source, piece: Any) -> Iterator[None]:
    """Raise any failure inside as :class:`ChunkLoadError` naming ``piece``'s window and,
    when known, the field."""
    try:
        yield
    except ChunkLoadError:
        raise
    except BaseException as exc:
        name = field_of(exc)
        where = f" field {name!r}" if name else ""
        raise ChunkLoadError(
            f"reading window [{piece.start}, {piece.stop}){where} of "
            f"{describe_source(source)} failed: {type(exc).__name__}: {exc}",
            window=(piece.start, piece.stop),
            field=name,
        ) from exc


def read_window(
    source: Source,
    pieces: Sequence[Any],
    out: Mapping[str, np.ndarray],
    *,
    check_finite: bool,
    retries: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> None:
    """Read ``pieces`` of every field into consecutive rows of ``out``.

    Piece ``p`` fills rows ``[p.offset, p.offset + p.length)`` with one
    ``source.read_into`` on a leading-axis (so C-contiguous) slice. Transient
    errors are retried (:func:`call_with_retries`); any failure is raised as
    :class:`ChunkLoadError` naming the piece's window and, when known, the field.
    """
    for piece in pieces:
        rows = {name: a[piece.offset : piece.offset + piece.length] for name, a in out.items()}
        window = (piece.start, piece.stop)
        with reading(source, piece):
            call_with_retries(partial(source.read_into, *window, rows), retries, window, cancelled)
            if check_finite:
                _check_finite(rows, *window)


def read_owned_window(
    piece: Any,
    *,
    source: Any,
    check_finite: bool,
    retries: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> dict[str, np.ndarray]:
    """``source.read_owned`` of ``piece``'s window (a :class:`~._base.HandsOver` source),
    retried and checked as :func:`read_window` reads."""
    window = (piece.start, piece.stop)
    with reading(source, piece):
        arrays = call_with_retries(partial(source.read_owned, *window), retries, window, cancelled)
        if check_finite:
            _check_finite(arrays, *window)
    return arrays


def call_with_retries(
    call: Callable[[], _T],
    retries: int,
    window: tuple[int, int],
    cancelled: Callable[[], bool] = lambda: False,
) -> _T:
    """``call()``, retried up to ``retries`` times after a transient error (I/O and network
    hiccups, not bad data or a missing path), waiting ``_RETRY_BACKOFF_S * 2**attempt``
    between tries; the last error is raised as it is. A zarr read inside ``call`` is left
    once ``cancelled()`` (:func:`~._leave.leave_when`)."""
    for attempt in range(retries + 1):
        try:
            with leave_when(cancelled):  # a zarr read in flight is left once cancelled
                return call()
        except Exception as exc:
            if attempt == retries or not _transient(exc) or cancelled():
                raise
            delay = _RETRY_BACKOFF_S * 2**attempt
            _log.warning(
                "chunkstream: transient error reading [%d, %d) (%s: %s); retry %d/%d in %.2f s",
                *window,
                type(exc).__name__,
                exc,
                attempt + 1,
                retries,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ChunkstreamError):
        return False
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(exc, (OSError, ConnectionError, TimeoutError))


def _check_finite(out: Mapping[str, np.ndarray], start: int, stop: int) -> None:
    for name, array in out.items():
        if array.dtype.kind not in "fc":
            continue
        finite = np.isfinite(array)
        if not finite.all():
            bad = np.argwhere(~finite)[0]
            position = (start + int(bad[0]), *(int(i) for i in bad[1:]))
            raise NonFiniteError(
                f"field {name!r} holds {array[tuple(bad)]} at index {position} "
                f"(timestep {position[0]}); {int((~finite).sum())} non-finite values in window "
                f"[{start}, {stop}). Clean the data, or pass check_finite=False to train on it."
            )
