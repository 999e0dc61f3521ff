"""The work each stage does: a reader job fills a host buffer, a transfer job copies it.

These are plain functions of their inputs (they never see the loader), so the
stage threads hold no reference to a :class:`~chunkstream.ChunkLoader` and a
loader the user drops can be collected and stopped.

Buffer ownership along the way: :func:`read_job` takes a buffer set from the
pool and either hands it on inside a :class:`Loaded` or gives it back when the
read fails; :func:`transfer_job` gives the slot back with the event recorded
after its copy (``PinnedSlotPool.release_after``), so the slot is refilled only
once the copy has finished. A copy that fails part-way gives its slot back the
same way, behind an event recorded after whatever copies it had queued.

Threads: both jobs run in stage threads that set the loader's CUDA device at
start (``OrderedStage(thread_init=...)``), so their CUDA calls (an event's
``query()`` while waiting for a slot, allocations, copies) run in the right
device's context.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from .._errors import ChunkLoadError, ChunkstreamError, NonFiniteError
from ..plans._pieces import Piece
from ..sources._base import Source
from ._buffers import BufferSet, HostBufferPool, PinnedSlotPool
from ._pieces import chunk_rows, piece_views, read_pieces
from ._stage import OrderedStage, StageClosed, Ticket

_T = TypeVar("_T")

__all__ = ["Loaded", "OnDevice", "describe_source", "discard_loaded", "read_job", "transfer_job"]

_log = logging.getLogger("chunkstream.pipeline")
_POLL_S = 0.1
_RETRY_BACKOFF_S = 0.05


@dataclass
class Loaded:
    """A chunk read into a host buffer set (owned by the pipeline until handed on).

    ``start``/``stop`` are the first piece's bounds; ``rows`` the rows filled.
    """

    job: int
    start: int
    stop: int
    buffers: BufferSet
    read_begin: float
    read_end: float
    thread: str = field(default_factory=lambda: threading.current_thread().name)  # the reader
    pieces: tuple[Piece, ...] = ()

    @property
    def rows(self) -> int:
        return chunk_rows(self.pieces) if self.pieces else self.stop - self.start


@dataclass
class OnDevice:
    """A window copied to device tensors; ``done`` is the event recorded after the copy."""

    loaded: Loaded
    tensors: dict[str, torch.Tensor]
    begin: Any
    done: Any
    issued: float
    thread: str = field(default_factory=lambda: threading.current_thread().name)  # the copier


def describe_source(source: Source) -> str:
    path = getattr(source, "path", None)
    return f"{type(source).__name__}({str(path)!r})" if path is not None else type(source).__name__


def read_job(
    job: int,
    ticket: Ticket,
    *,
    windows: list[tuple[Piece, ...]],
    source: Source,
    pool: HostBufferPool | PinnedSlotPool,
    check_finite: bool,
    retries: int,
) -> Loaded:
    pieces = windows[job]
    start, stop = pieces[0].start, pieces[0].stop
    try:
        buffers = pool.acquire(ticket.cancelled)
    except BaseException as exc:
        # Waiting for a pinned slot queries CUDA events, which can fail (a sticky
        # error from the user's kernels); the consumer must get a ChunkLoadError,
        # which shuts the pipeline down, not a bare RuntimeError. A cancelled wait
        # is dropped by the stage as stale, wrapped or not.
        raise ChunkLoadError(
            f"waiting for a free host buffer for window [{start}, {stop}) failed: "
            f"{type(exc).__name__}: {exc}",
            window=(start, stop),
        ) from exc
    begin = time.perf_counter()
    views = buffers.views(chunk_rows(pieces))

    def read(call: Callable[[], None], piece: Piece) -> None:
        call_with_retries(call, retries, (piece.start, piece.stop), ticket.cancelled)
        if check_finite:
            _check_finite(piece_views(views, piece), piece.start, piece.stop)

    try:
        read_pieces(source, pieces, views, read=read)
    except BaseException as exc:
        pool.release(buffers)
        if isinstance(exc, ChunkLoadError):
            raise
        failed = getattr(exc, "chunkstream_piece", None)
        if failed is not None:
            start, stop = failed.start, failed.stop
        field = getattr(exc, "chunkstream_field", None)
        where = f" field {field!r}" if field else ""
        raise ChunkLoadError(
            f"reading window [{start}, {stop}){where} of {describe_source(source)} failed: "
            f"{type(exc).__name__}: {exc}",
            window=(start, stop),
            field=field,
        ) from exc
    return Loaded(job, start, stop, buffers, begin, time.perf_counter(), pieces=tuple(pieces))


def call_with_retries(
    call: Callable[[], _T],
    retries: int,
    window: tuple[int, int],
    cancelled: Callable[[], bool] = lambda: False,
) -> _T:
    """``call()``, retried up to ``retries`` times after a transient error (:func:`_transient`),
    waiting ``_RETRY_BACKOFF_S * 2**attempt`` between tries; the last error is raised as it is."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == retries or not _transient(exc) or cancelled():
                raise
            delay = _RETRY_BACKOFF_S * 2**attempt
            _log.warning(
                "chunkstream: transient error reading [%d, %d) (%s: %s); retry %d/%d in %.2f s",
                *window, type(exc).__name__, exc, attempt + 1, retries, delay,
            )  # fmt: skip
            time.sleep(delay)
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _transient(exc: BaseException) -> bool:
    """Errors worth retrying: I/O and network hiccups, not bad data or a missing path."""
    if isinstance(exc, ChunkstreamError):
        return False
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(exc, (OSError, ConnectionError, TimeoutError))


def _check_finite(views: dict[str, np.ndarray], start: int, stop: int) -> None:
    for name, array in views.items():
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


def transfer_job(
    job: int,
    ticket: Ticket,
    *,
    upstream: OrderedStage,
    pool: PinnedSlotPool | HostBufferPool,
    device: torch.device,
    stream: Any,
) -> OnDevice:
    del job
    while True:
        try:
            loaded: Loaded = upstream.get(timeout=_POLL_S, generation=ticket.generation)
            break
        except TimeoutError:
            if ticket.cancelled():
                raise StageClosed("transfer") from None
    rows = loaded.rows
    issued = time.perf_counter()
    try:
        if stream is None:  # a non-CUDA accelerator: a plain synchronous copy
            tensors = {
                name: torch.from_numpy(array).to(device)
                for name, array in loaded.buffers.views(rows).items()
            }
            pool.release(loaded.buffers)
            return OnDevice(loaded, tensors, None, None, issued)
        host = loaded.buffers.tensors
        assert host is not None  # CUDA always runs with pinned slots (internal invariant)
        # The thread's current device is ``device`` (set at thread start, with an
        # index the loader resolved), so no device guard is needed here.
        with torch.cuda.stream(stream):
            begin = torch.cuda.Event(enable_timing=True)
            done = torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            # Allocated on the transfer stream; the consumer calls record_stream.
            tensors = {
                name: torch.empty(t[:rows].shape, dtype=t.dtype, device=device).copy_(
                    t[:rows], non_blocking=True
                )
                for name, t in host.items()
            }
            done.record(stream)
    except BaseException as exc:
        _release_after_failed_copy(pool, loaded.buffers, stream)
        raise ChunkLoadError(
            f"copying window [{loaded.start}, {loaded.stop}) to {device} failed: "
            f"{type(exc).__name__}: {exc}",
            window=(loaded.start, loaded.stop),
        ) from exc
    pool.release_after(loaded.buffers, done)
    return OnDevice(loaded, tensors, begin, done, issued)


def _release_after_failed_copy(pool: Any, buffers: BufferSet, stream: Any) -> None:
    """Give back a slot whose copy failed part-way, behind the copies it had queued.

    Copies of earlier fields may still be reading the slot; handing it out at
    once would let a reader overwrite memory under a DMA. If no event can be
    recorded either (the context is broken), the slot is kept out of the pool:
    the loader shuts down after this error anyway.
    """
    if stream is None:
        pool.release(buffers)
        return
    try:
        fence = torch.cuda.Event()
        fence.record(stream)
    except Exception:  # the original error is what the consumer must see
        _log.warning("chunkstream: no event after a failed copy; its pinned slot is retired")
        return
    pool.release_after(buffers, fence)


def discard_loaded(value: Loaded, pool: Any) -> None:
    pool.release(value.buffers)
