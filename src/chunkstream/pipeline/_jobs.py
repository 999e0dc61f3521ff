"""The work of one window: read it into a host buffer, then (CUDA) copy it to the device.

These are plain functions of their inputs (they never see the loader), so the
executor threads hold no reference to a :class:`~chunkstream.ChunkLoader` and a
loader the user drops can be collected and stopped. Each call gets its own
window and a ``dropped()`` callable that turns true once its epoch run is
abandoned, so a long wait inside can give up early.

Buffer ownership along the way: :func:`read_job` takes a buffer set from the
pool and either hands it on inside a :class:`Loaded` or gives it back when the
read fails. On the CPU, :func:`read_to_host` turns it into the user's tensors
at once (zero copy; the pool reuses the set only once those tensors are gone).
On CUDA, :func:`copy_job` gives the slot back with the event recorded after its
copy (``PinnedSlotPool.release_after``), so the slot is refilled only once the
copy has finished; a copy that fails part-way gives its slot back the same way,
behind an event recorded after whatever copies it had queued.

Threads: both jobs run in executor threads that set the loader's CUDA device at
start (``Executor(init=...)``), so their CUDA calls (an event's ``query()``
while waiting for a slot, allocations, copies) run in the right device's context.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from .._errors import ChunkLoadError, ChunkstreamError, NonFiniteError
from ..plans import Piece
from ..sources import Source, describe_source
from ..stats import COPY, READ, profiled
from ._buffers import BufferSet, HostBufferPool, PinnedSlotPool
from ._pieces import chunk_rows, piece_views, read_pieces

_T = TypeVar("_T")

__all__ = [
    "Delivery",
    "Loaded",
    "call_with_retries",
    "copy_job",
    "device_binder",
    "give_back",
    "read_job",
    "read_to_host",
    "read_window",
]

_log = logging.getLogger("chunkstream.pipeline")
_RETRY_BACKOFF_S = 0.05

Window = tuple[int, int]
Pieces = tuple[Piece, ...]  # a chunk: its pieces in row order (one for a plain window)


@dataclass
class Loaded:
    """A chunk's pieces read into a host buffer set (owned by the pipeline until handed on)."""

    pieces: Pieces
    buffers: BufferSet
    read_begin: float
    read_end: float
    thread: str = field(default_factory=lambda: threading.current_thread().name)  # the reader

    @property
    def window(self) -> Window:
        """The first piece's bounds (the chunk's ``start``/``stop``)."""
        return self.pieces[0].start, self.pieces[0].stop

    @property
    def rows(self) -> int:
        return chunk_rows(self.pieces)


@dataclass
class Delivery:
    """A window's finished tensors on the loader's device, and how they got there.

    ``events`` is ``(begin, done)``, the CUDA events around the copy (``None`` off
    CUDA); the consumer's stream must wait on ``done`` before using the tensors.
    """

    pieces: Pieces
    tensors: dict[str, torch.Tensor]
    read_begin: float
    read_end: float
    issued: float | None = None
    events: tuple[Any, Any] | None = None
    read_thread: str | None = None  # the threads that read and copied it (trace tracks)
    transfer_thread: str | None = None

    @property
    def window(self) -> Window:
        """The first piece's bounds (the chunk's ``start``/``stop``)."""
        return self.pieces[0].start, self.pieces[0].stop


def read_window(
    source: Source,
    pieces: Pieces,
    out: Mapping[str, np.ndarray],
    *,
    check_finite: bool,
    retries: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> None:
    """Read a chunk's ``pieces`` of every field into consecutive rows of ``out``.

    Transient errors are retried (:func:`call_with_retries`); any failure is
    raised as :class:`ChunkLoadError` naming the piece's window and, when known,
    the field.
    """

    def read(call: Callable[[], None], piece: Piece) -> None:
        call_with_retries(call, retries, (piece.start, piece.stop), cancelled)
        if check_finite:
            _check_finite(piece_views(out, piece), piece.start, piece.stop)

    try:
        read_pieces(source, pieces, out, read=read)
    except ChunkLoadError:
        raise
    except BaseException as exc:
        piece = getattr(exc, "chunkstream_piece", pieces[0])
        start, stop = piece.start, piece.stop
        field = getattr(exc, "chunkstream_field", None)
        where = f" field {field!r}" if field else ""
        raise ChunkLoadError(
            f"reading window [{start}, {stop}){where} of {describe_source(source)} failed: "
            f"{type(exc).__name__}: {exc}",
            window=(start, stop),
            field=field,
        ) from exc


def read_job(
    pieces: Pieces,
    dropped: Callable[[], bool],
    *,
    source: Source,
    pool: HostBufferPool | PinnedSlotPool,
    check_finite: bool,
    retries: int,
) -> Loaded:
    """Take a buffer set from ``pool`` and read the chunk's ``pieces`` into it; the set is
    given back if the read fails."""
    start, stop = pieces[0].start, pieces[0].stop
    try:
        buffers = pool.acquire(dropped)
    except BaseException as exc:
        # Waiting for a pinned slot queries CUDA events, which can fail (a sticky
        # error from the user's kernels); the consumer must get a ChunkLoadError,
        # which shuts the pipeline down, not a bare RuntimeError.
        raise ChunkLoadError(
            f"waiting for a free host buffer for window [{start}, {stop}) failed: "
            f"{type(exc).__name__}: {exc}",
            window=(start, stop),
        ) from exc
    begin = time.perf_counter()
    try:
        with profiled(READ, (start, stop)):
            read_window(source, pieces, buffers.views(chunk_rows(pieces)),
                        check_finite=check_finite, retries=retries, cancelled=dropped)  # fmt: skip
    except BaseException:
        pool.release(buffers)
        raise
    return Loaded(tuple(pieces), buffers, begin, time.perf_counter())


def read_to_host(pieces: Pieces, dropped: Callable[[], bool], *, pool: HostBufferPool,
                 **read: Any) -> Delivery:  # fmt: skip
    """The CPU path: read ``pieces``, then hand the buffer set over as the user's tensors.

    The tensors are zero-copy views; the pool reuses the set only once no
    tensor refers to it any more (``HostBufferPool``).
    """
    loaded = read_job(pieces, dropped, pool=pool, **read)
    tensors = {name: torch.from_numpy(a) for name, a in loaded.buffers.views(loaded.rows).items()}
    pool.release(loaded.buffers)
    return Delivery(loaded.pieces, tensors, loaded.read_begin, loaded.read_end,
                    read_thread=loaded.thread)  # fmt: skip


def call_with_retries(
    call: Callable[[], _T],
    retries: int,
    window: Window,
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


def give_back(pool: HostBufferPool | PinnedSlotPool, loaded: Loaded) -> None:
    """Return the buffer set of a read nobody will consume (its epoch was dropped)."""
    pool.release(loaded.buffers)


def copy_job(
    loaded: Loaded,
    dropped: Callable[[], bool],
    *,
    pool: PinnedSlotPool | HostBufferPool,
    device: torch.device,
    stream: Any,
) -> Delivery | None:
    """Copy ``loaded`` to fresh tensors on ``device``; the slot goes back to ``pool`` behind
    the copy's event. ``None`` (slot given back at once) if the run was dropped meanwhile."""
    if dropped():
        pool.release(loaded.buffers)
        return None
    start, stop = loaded.window
    issued = time.perf_counter()
    try:
        with profiled(COPY, (start, stop)):
            delivery = _copy(loaded, pool, device, stream, issued)
    except BaseException as exc:
        _release_after_failed_copy(pool, loaded.buffers, stream)
        raise ChunkLoadError(
            f"copying window [{start}, {stop}) to {device} failed: "
            f"{type(exc).__name__}: {exc}",
            window=(start, stop),
        ) from exc
    if delivery.events is not None:
        pool.release_after(loaded.buffers, delivery.events[1])
    return delivery


def _copy(loaded: Loaded, pool: Any, device: torch.device, stream: Any, issued: float) -> Delivery:
    """:func:`copy_job`'s copy. Off CUDA the slot is given back once copied; on CUDA the
    caller gives it back behind ``Delivery.events[1]``."""
    rows, me = loaded.rows, threading.current_thread().name
    if stream is None:  # a non-CUDA accelerator: a plain synchronous copy
        tensors = {
            name: torch.from_numpy(array).to(device)
            for name, array in loaded.buffers.views(rows).items()
        }
        pool.release(loaded.buffers)
        return Delivery(loaded.pieces, tensors, loaded.read_begin, loaded.read_end, issued,
                        read_thread=loaded.thread, transfer_thread=me)  # fmt: skip
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
    return Delivery(loaded.pieces, tensors, loaded.read_begin, loaded.read_end, issued,
                    (begin, done), read_thread=loaded.thread, transfer_thread=me)  # fmt: skip


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


def device_binder(device: torch.device) -> Callable[[], None]:
    """An executor thread's start hook: make ``device`` the thread's current CUDA device."""

    def bind() -> None:
        try:
            torch.cuda.set_device(device)
        except Exception as exc:  # every later future of the executor fails with this
            raise ChunkLoadError(
                f"setting the CUDA device {device} in thread "
                f"{threading.current_thread().name!r} failed: {type(exc).__name__}: {exc}. "
                "Check that the device is visible (CUDA_VISIBLE_DEVICES) and healthy."
            ) from exc

    return bind
