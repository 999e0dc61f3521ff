"""The work of one chunk: read its pieces into a host buffer set, then (CUDA) copy it.

Plain functions of their inputs: executor threads never hold the loader, so a
dropped loader can be collected. ``dropped()`` turns true once the chunk's
epoch run is abandoned, so a wait inside can give up early.

Buffer ownership: :func:`read_job` waits for the pool's future (set at
construction, or by :func:`learn_fields` for a source that learns its fields at
its first read), takes a set from the pool and hands it on in a :class:`Loaded`
that names the pool, or gives it back if the read fails. On the CPU
:func:`read_to_host` makes it the user's zero-copy tensors at once. On CUDA
:func:`copy_job` gives the slot back behind the event recorded after its copy
(``PinnedSlotPool.release(..., after=event)``), also after a copy that failed part-way.
Both jobs run in threads that bound the loader's CUDA device at start
(:func:`~chunkstream._device.device_binder`), so their CUDA calls run in that device's context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from .._errors import ChunkLoadError
from .._executor import wait_done
from .._memory import BufferSet, HostBufferPool, PinnedSlotPool
from ..plans import Piece
from ..sources import (
    HandsOver,
    Source,
    call_with_retries,
    read_owned_window,
    read_window,
    reading,
)
from ..stats import COPY, Trip, profiled
from ._run import Owned, Turn

__all__ = [
    "Delivery",
    "Loaded",
    "copy_job",
    "copy_on_stream",
    "copy_to_device",
    "learn_fields",
    "on_stream",
    "read_job",
    "read_to_host",
]
Pool = HostBufferPool | PinnedSlotPool

_log = logging.getLogger("chunkstream.pipeline")
Pieces = tuple[Piece, ...]  # a chunk: its pieces in row order (one for a plain window)


def chunk_rows(pieces: Pieces) -> int:
    """Rows the pieces fill together."""
    return pieces[-1].offset + pieces[-1].length


@dataclass
class Loaded:
    """A chunk's pieces read into a host buffer set (owned by the pipeline until handed
    on), with the pool it goes back to."""

    pieces: Pieces
    buffers: BufferSet
    pool: Pool


@dataclass
class Delivery:
    """A chunk's finished tensors on the loader's device. ``events`` is ``(begin, done)``
    around the CUDA copy (``None`` off CUDA): the consumer's stream must wait on ``done``."""

    pieces: Pieces
    tensors: dict[str, torch.Tensor]
    events: tuple[Any, Any] | None = None


def learn_fields(
    piece: Piece,
    *,
    source: Any,
    retries: int,
    make: Callable[[Any], Pool],
    owned: Owned,
    closed: Callable[[], bool],
    dropped: Callable[[], bool],
) -> Pool:
    """The job that makes the host buffers of a source that learns its fields: read
    ``piece`` for them (the epoch's read of it is then served from what was learned,
    :class:`~chunkstream.sources.LearnsFields`), then ``make`` the pool. Its future is
    the pool every read waits for; a failure is every read's error. Once its epoch is
    ``dropped`` (or the loader ``closed``) the learned arrays are forgotten, as the
    loader forgets them when it drops that epoch: whichever comes last finds them."""
    window = (piece.start, piece.stop)
    with reading(source, piece):
        call_with_retries(partial(source.learn, *window), retries, window, closed)
    try:
        owned.pool = pool = make(source.fields)
    except Exception as exc:
        source.forget(*window)  # the read it was learned for will not happen
        raise ChunkLoadError(
            f"allocating the host buffers failed: {type(exc).__name__}: {exc}", window=window
        ) from exc
    if closed():  # closed meanwhile: close() may have found no pool yet
        pool.close()
    if closed() or dropped():  # the read they were learned for may never come
        source.forget(*window)
    return pool


def read_job(
    pieces: Pieces,
    dropped: Callable[[], bool],
    trip: Trip,
    *,
    source: Source,
    pool: Future,
    check_finite: bool,
    retries: int,
    turn: Turn | None = None,
) -> Loaded:
    """Take a buffer set from the pool (``pool``'s result; made by :func:`learn_fields`
    for a source that learns its fields, waited for) and read ``pieces`` into it; the
    set is given back if the read fails; ``trip`` gets the read's span. With a ``turn``,
    the set is taken in window order (:class:`~chunkstream.pipeline._run.Turn`)."""
    window = (pieces[0].start, pieces[0].stop)
    if not wait_done(pool, dropped):
        raise InterruptedError("the epoch was dropped while this read waited for buffers")
    buffers_from: Pool = pool.result(timeout=0)  # done: the learning read's error is every read's
    acquire = partial(buffers_from.acquire, dropped)
    try:
        buffers = acquire() if turn is None else turn.take(acquire, dropped)
    except BaseException as exc:
        # Waiting for a pinned slot queries CUDA events, which can fail (a sticky error
        # from the user's kernels): a ChunkLoadError shuts the pipeline down.
        raise ChunkLoadError(
            f"waiting for a free host buffer for window [{window[0]}, {window[1]}) failed: "
            f"{type(exc).__name__}: {exc}",
            window=window,
        ) from exc
    try:
        with trip.reading(window):  # from here: waiting for a free slot is not reading
            read_window(
                source,
                pieces,
                buffers.views(chunk_rows(pieces)),
                check_finite=check_finite,
                retries=retries,
                cancelled=dropped,
            )
    except BaseException:
        buffers_from.release(buffers)
        raise
    return Loaded(tuple(pieces), buffers, buffers_from)


def read_to_host(
    pieces: Pieces, dropped: Callable[[], bool], trip: Trip, *, pool: Future, **read: Any
) -> Delivery:
    """The CPU path: read ``pieces``, then hand the set over as the user's tensors
    (zero-copy views; the pool reuses the set once no tensor refers to it); a one-piece
    chunk of a :class:`~chunkstream.sources.HandsOver` source takes no set at all."""
    if len(pieces) == 1 and isinstance(read["source"], HandsOver) and read["source"].hands_over:
        with trip.reading((pieces[0].start, pieces[0].stop)):
            arrays = read_owned_window(pieces[0], cancelled=dropped, **read)
        return Delivery(tuple(pieces), {name: torch.from_numpy(a) for name, a in arrays.items()})
    loaded = read_job(pieces, dropped, trip, pool=pool, **read)
    views = loaded.buffers.views(chunk_rows(loaded.pieces))
    tensors = {name: torch.from_numpy(a) for name, a in views.items()}
    loaded.pool.release(loaded.buffers)
    return Delivery(loaded.pieces, tensors)


def copy_job(
    loaded: Loaded, dropped: Callable[[], bool], trip: Trip, *, device: torch.device, stream: Any
) -> Delivery | None:
    """Copy ``loaded`` to fresh tensors on ``device``; the slot goes back to its pool behind
    the copy's event. ``None`` (slot given back at once) if the run was dropped meanwhile."""
    pool = loaded.pool
    if dropped():
        pool.release(loaded.buffers)
        return None
    window = (loaded.pieces[0].start, loaded.pieces[0].stop)
    trip.transfer_issued()
    try:
        with profiled(COPY, window):
            delivery = _copy(loaded, pool, device, stream)
    except BaseException as exc:
        _release_after_failed_copy(pool, loaded.buffers, stream)
        raise ChunkLoadError(
            f"copying window [{window[0]}, {window[1]}) to {device} failed: "
            f"{type(exc).__name__}: {exc}",
            window=window,
        ) from exc
    if delivery.events is not None:
        pool.release(loaded.buffers, after=delivery.events[1])
    return delivery


def _copy(loaded: Loaded, pool: Any, device: torch.device, stream: Any) -> Delivery:
    """Off CUDA the slot is given back once copied; on CUDA the caller gives it back
    behind ``Delivery.events[1]``."""
    rows = chunk_rows(loaded.pieces)
    if stream is None:  # a non-CUDA accelerator: a plain synchronous copy
        views = loaded.buffers.views(rows)
        tensors = {name: torch.from_numpy(array).to(device) for name, array in views.items()}
        pool.release(loaded.buffers)
        return Delivery(loaded.pieces, tensors)
    host = loaded.buffers.tensors
    assert host is not None  # CUDA always runs with pinned slots (internal invariant)
    # The thread's current device is ``device`` (set at thread start, with an index the
    # loader resolved), so no device guard is needed here.
    tensors, events = copy_on_stream({name: t[:rows] for name, t in host.items()}, device, stream)
    return Delivery(loaded.pieces, tensors, events)


def copy_on_stream(
    host: dict[str, torch.Tensor], device: torch.device, stream: Any
) -> tuple[dict[str, torch.Tensor], tuple[Any, Any]]:
    """Pinned host tensors copied to fresh tensors on ``device``, allocated and copied on
    ``stream`` between two events: ``(tensors, (begin, done))``. ``device`` must be the
    calling thread's current device; the consumer's stream waits on ``done``
    (:func:`~chunkstream.pipeline._stages.receive`)."""
    return on_stream(
        stream,
        lambda: {
            name: torch.empty(t.shape, dtype=t.dtype, device=device).copy_(t, non_blocking=True)
            for name, t in host.items()
        },
    )


def copy_to_device(
    host: dict[str, torch.Tensor], buffers: BufferSet, pool: Any, device: torch.device, stream: Any
) -> Delivery:
    """:func:`copy_on_stream` of ``host`` (views of ``buffers``, a slot of ``pool``), the
    slot given back behind the copy's done event, or after a failure part-way behind a
    fence (:func:`_release_after_failed_copy`), exactly as :func:`copy_job` does for a
    chunk: the batch lane (:mod:`chunkstream.pipeline._lane`) takes this path."""
    try:
        tensors, events = copy_on_stream(host, device, stream)
    except BaseException:
        _release_after_failed_copy(pool, buffers, stream)
        raise
    pool.release(buffers, after=events[1])
    return Delivery((), tensors, events)


def on_stream(stream: Any, work: Callable[[], Any]) -> tuple[Any, tuple[Any, Any]]:
    """``work()`` queued on ``stream`` between two timing events: its value and the
    events ``(begin, done)`` (the consumer's stream waits on ``done``)."""
    with torch.cuda.stream(stream):
        begin = torch.cuda.Event(enable_timing=True)
        # Blocking sync: a thread waiting for this copy (a pinned slot given back behind
        # it, _memory/_arena.py) sleeps in the driver instead of spinning a core.
        end = torch.cuda.Event(enable_timing=True, blocking=True)
        begin.record(stream)
        value = work()
        end.record(stream)
    return value, (begin, end)


def _release_after_failed_copy(pool: Any, buffers: BufferSet, stream: Any) -> None:
    """Give back a slot whose copy failed part-way, behind the copies it had queued.

    Copies of earlier fields may still be reading the slot, so it waits for a
    fence event; if none can be recorded (the context is broken) the slot is
    kept out of the pool: the loader shuts down after this error anyway.
    """
    if stream is None:
        pool.release(buffers)
        return
    try:
        fence = torch.cuda.Event(blocking=True)  # waited for as a copy's done event is
        fence.record(stream)
    except Exception:  # the original error is what the consumer must see
        _log.warning("chunkstream: no event after a failed copy; its pinned slot is retired")
        return
    pool.release(buffers, after=fence)
