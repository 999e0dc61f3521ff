"""The batch lane: a batch is a chunk of one-window pieces, read and delivered as chunks are.

A batch is ``B`` one-window pieces drawn over the held chunks, a
:class:`~._held.HeldSource`. The loader's own run machinery reads it: for each
event (one chunk's share of batches) an :class:`~chunkstream.pipeline._run.EpochRun`
over the batches' requests runs on the loader's executors
(:meth:`~chunkstream.ChunkLoader.lane`): up to ``depth + 1`` batches read ahead
(at least 2) on the ``chunkstream-batch-<n>`` threads, each into a buffer set of the
lane's pool with one tight copy loop per field (:meth:`~._held.HeldSource.read_windows`);
on CUDA the loader's transfer thread copies each set to fresh device tensors on
its transfer stream between two events, in batch order; the consumer waits for
each batch as for a chunk (:meth:`~chunkstream.ChunkLoader.wait_for`: the
loader's ``close()`` and stall watchdog, the error raised at its own turn) and
receives it with the loader's ``receive``. Each batch carries the stream state
that resumes right after it and its window starts (:class:`Request`).

Ownership of a batch's buffer set: the pool; the read (given back if it fails);
on the CPU, once read, the user's tensors (back in the pool at once, reused only
once no tensor refers to it); on CUDA the copy that follows the read on the
transfer thread (back behind the copy's done event, or a fence after a failed
copy), or after a drop its reclaim. Pinned sets are taken in batch order
(:class:`~chunkstream.pipeline._run.Turn`).

Ownership of the held rows: the batch reads only read the storage; the refill
(:meth:`BatchLane.fill`, the store's loader feeding the held source: a chunk's
rows copied into its slot) writes it. **A held slot is refilled only after every
batch read that draws from its old contents has finished**: :meth:`BatchLane.fill`
first settles the last run (every read it submitted, also after a drop, finished
or cancelled, :meth:`~chunkstream.pipeline._run.EpochRun.settle`), and a run starts
only after the fill before it returned, so no read sees rows being written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import torch

from .._errors import LoaderClosedError, check_int
from .._executor import Cancelled
from .._memory import BufferSet, HostBufferPool, PinnedSlotPool, batch_sets, thread_budget
from ..sources import FieldSpec
from ._held import HeldSource, as_numpy, compute_dtype, copy_rows, numpy_dtype
from ._jobs import Delivery, copy_to_device
from ._loader import ChunkLoader
from ._run import EpochRun, Turn
from ._stages import receive
from ._times import times_to

__all__ = ["BatchLane", "Request", "check_gather_threads", "default_gather_threads"]

_MAX_THREADS = 4  # a batch read is memory bound: more threads than this buy nothing
_BLOCK_BYTES = 4 << 20  # a refill's rows per job


class Request(NamedTuple):
    """One batch to make: its window starts (rows of the held storage), the stream
    state that resumes right after it, and the windows' times (``"start"``, maybe
    ``"recording"``: :mod:`chunkstream.pipeline._times`, on the starts' device),
    which the batch carries beside its fields on the batch's device."""

    starts: torch.Tensor
    state: Any
    times: Mapping[str, torch.Tensor] | None = None


def default_gather_threads() -> int:
    """Batch readers: this rank's share of the cores (its thread budget), at most 4."""
    return max(1, min(_MAX_THREADS, thread_budget()))


def check_gather_threads(threads: object) -> int:
    """``threads`` (``None``: :func:`default_gather_threads`) as an int >= 1."""
    if threads is None:
        return default_gather_threads()
    return check_int(
        "gather_threads",
        threads,
        1,
        "Pass None for this rank's share of the cores (at most 4), or e.g. 1 to read "
        "one batch at a time.",
    )


@dataclass
class _Read:
    """A batch read into a buffer set (the transfer's input on CUDA)."""

    out: dict[str, torch.Tensor]
    buffers: BufferSet
    pool: HostBufferPool | PinnedSlotPool
    request: Request


class _Made(NamedTuple):
    delivery: Delivery
    request: Request


def _as_tensor(array: Any, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if tensor.dtype != dtype else tensor


def read_batch(
    request: Request,
    dropped: Any,
    trip: Any,
    *,
    held: HeldSource,
    window: int,
    pool: HostBufferPool | PinnedSlotPool,
    dtypes: Mapping[str, torch.dtype],
    copies: bool,
    turn: Turn | None = None,
) -> _Read | _Made:
    """The read job of one batch (a batch reader): a buffer set from ``pool`` (in batch
    order with a ``turn``), the windows copied into it; on the CPU handed over as the
    user's tensors at once (``copies`` false), else handed to the transfer."""
    if dropped():
        raise InterruptedError("the batch run was dropped before this read")
    acquire = partial(pool.acquire, dropped)
    buffers = acquire() if turn is None else turn.take(acquire, dropped)
    try:
        starts = request.starts.tolist()
        out = {n: _as_tensor(buffers.arrays[n][: len(starts)], dtypes[n]) for n in dtypes}
        with trip.reading((min(starts, default=0), max(starts, default=0) + window)):
            held.read_windows(starts, window, out)
    except BaseException:
        pool.release(buffers)
        raise
    if copies:
        return _Read(out, buffers, pool, request)
    pool.release(buffers)  # reused once no view of it is left
    return _Made(Delivery((), out), request)


def copy_batch(
    read: _Read, dropped: Any, trip: Any, *, device: torch.device, stream: Any
) -> _Made | None:
    """The transfer job of one batch: its set copied to ``device`` on ``stream`` between
    two events, the set back behind the copy (the loader's ``copy_to_device``)."""
    if dropped():
        read.pool.release(read.buffers)
        return None
    trip.transfer_issued()
    return _Made(copy_to_device(read.out, read.buffers, read.pool, device, stream), read.request)


def _reclaim(read: _Read) -> None:
    read.pool.release(read.buffers)


class BatchLane:
    """Batches of ``batch_size`` windows of ``fields`` read from held storage on the
    loader's executors (module docs), ``depth`` ahead of the consumer.

    ``device``: where batches go; ``threads``: the lane's batch readers; ``dtype``:
    the compute dtype (``None``: stored). On the CPU a batch is converted in its read,
    on CUDA on the device after the copy (half the bytes for float16). Not
    thread-safe: one consumer loop owns a lane.
    """

    def __init__(
        self,
        loader: ChunkLoader,
        fields: Sequence[str],
        *,
        window: int,
        batch_size: int,
        device: torch.device,
        depth: int,
        threads: int,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.loader, self.fields = loader, tuple(fields)
        self.window, self.batch_size = int(window), int(batch_size)
        self.device, self.depth, self.threads = torch.device(device), int(depth), int(threads)
        self.dtype = dtype
        self._pool: HostBufferPool | PinnedSlotPool | None = None
        self._layout: tuple | None = None
        self._last: EpochRun | None = None  # the newest run: settled before a refill

    @property
    def nbytes(self) -> int:
        """Host bytes of the batch buffer sets (page-locked on CUDA); 0 before the first."""
        return 0 if self._pool is None else int(self._pool.nbytes)

    def _pool_for(self, held: HeldSource, dtypes: Mapping[str, torch.dtype], cuda: bool) -> Any:
        specs = {
            n: FieldSpec((self.window, *held.storage[n].shape[1:]), numpy_dtype(dtypes[n]))
            for n in dtypes
        }
        layout = tuple((n, s.shape, s.dtype.str) for n, s in specs.items())
        if self._pool is None or layout != self._layout:
            if self._pool is not None:
                self._pool.close(self.loader.config.close_timeout)
            sets = batch_sets(self.depth, cuda=cuda)  # counted in the budget (_memory/_stream.py)
            if cuda:
                pool: Any = PinnedSlotPool(specs, self.batch_size, slots=sets, device=self.device)
            else:
                pool = HostBufferPool(specs, self.batch_size, slots=sets)
            self.loader.lane(self.threads, self.device).owned.pools.append(pool)
            self._pool, self._layout = pool, layout
            if self.loader.closed:  # a close() that could not see it (a signal handler's)
                pool.close(self.loader.config.close_timeout)
        return self._pool

    def settle(self) -> None:
        """Drop the last run and wait until every read it submitted has ended (the
        ownership rule, module docs); a ``close()`` of the loader ends the wait."""
        run, self._last = self._last, None
        if run is None:
            return
        run.drop()
        loader = self.loader
        if not run.settle(lambda: loader.closed):
            raise LoaderClosedError(
                "the loader was closed while a batch was being read; create a new "
                "ChunkLoader and BatchStream (or do not call close() before the last batch)"
            )

    def fill(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst[:] = src`` (CPU): the refill of a held slot, in row blocks on the batch
        readers, waited for as a chunk is; only once the reads over ``dst``'s old
        contents have ended (:meth:`settle`)."""
        self.settle()
        rows = int(dst.shape[0])
        if rows == 0:
            return
        a = as_numpy(dst)
        row_bytes = a[:1].nbytes if a is not None else dst[:1].numel() * dst.element_size()
        per = max(1, _BLOCK_BYTES // max(1, row_bytes))
        readers = self.loader.lane(self.threads, self.device).readers
        since = time.monotonic()
        futures = [
            readers.submit(copy_rows, dst[lo : lo + per], src[lo : lo + per], what="refill")
            for lo in range(0, rows, per)
        ]
        try:
            for future in futures:
                self.loader.wait_for(future, since=since)
        finally:
            for future in futures:  # only after an error: the loader is shut down then
                future.cancel()

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]:
        """``(batch, state)`` per request, in request order, ``depth`` read ahead."""
        lane = self.loader.lane(self.threads, self.device)
        cuda = lane.copier is not None
        held = HeldSource({n: storage[n] for n in self.fields})
        targets = {n: compute_dtype(self.dtype, storage[n].dtype) for n in self.fields}
        read_as = {n: storage[n].dtype for n in self.fields} if cuda else targets
        pool = self._pool_for(held, read_as, cuda)
        requests = requests if isinstance(requests, list) else list(requests)
        self.settle()
        run = EpochRun(
            requests,
            read=partial(
                read_batch, held=held, window=self.window, pool=pool, dtypes=read_as, copies=cuda
            ),
            readers=lane.readers,
            depth=max(1, self.depth),  # plus the one being received: depth + 1 read ahead
            copy=partial(copy_batch, device=lane.device, stream=lane.stream) if cuda else None,
            copier=lane.copier,
            copy_depth=1,
            reclaim=_reclaim,
            ordered=cuda,
        )
        self._last = run
        try:
            for _ in requests:
                if run.dropped():  # a newer run of this lane took over (a new iteration)
                    raise Cancelled("a newer batch run of this stream took over")
                future, _trip = run.take()
                made = self.loader.wait_for(future, since=run.started)
                tensors, _ = receive(made.delivery, self.device)
                request = made.request
                times = times_to(dict(request.times or {}), self.device)
                batch = {n: t.to(targets[n]) for n, t in tensors.items()} | times
                # Only the user's references keep a CPU set from reuse (and extra sets, with
                # fresh pages, from being made): none is left here while the user holds it.
                del future, made, tensors
                yield batch, request.state
                del batch
            # Every read was taken and waited for: nothing to settle, and the run must not
            # keep the storage referenced (with mix=1 it is the loader's chunk, whose
            # buffer set the loader reuses once no one refers to it).
            if self._last is run:
                self._last = None
        finally:
            run.drop()  # reads not started are cancelled; fill() waits for the others
