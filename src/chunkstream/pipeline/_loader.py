"""``ChunkLoader``: windows of a source, read ahead in threads and handed out in plan order.

The flow (docs/architecture.md follows one window through it)::

    EpochCursor ──> EpochRun: read futures ──> [copy futures] ──> Chunk
    (which windows)  (a buffer set each)       (CUDA: on a stream)

Each :meth:`ChunkLoader.epoch` call asks the :class:`EpochCursor` for this
rank's chunks and starts an :class:`EpochRun` on the loader's long-lived
executors, dropping the previous run. What a read and a transfer do is the
loader's delivery stage, chosen at construction (:mod:`._stages`: host, copy,
resident).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from .._device import device_binder
from .._errors import LoaderClosedError, LoaderStalledError
from .._executor import POLL_S, Executor, GatedFuture, done_within, helper_stacks
from .._memory import HostBufferPool, NodeShare, PinnedSlotPool, check_arena_fits, node_share
from .._options import check_moved, check_options
from .._resume import check_loader_state
from ..distributed import resolve_rank, warn_if_not_local_rank
from ..plans import EpochCursor, EpochSpan, Piece, Position, Uneven, WindowPlan, loader_plan
from ..sources import (
    FieldSpec,
    HandsOver,
    Source,
    check_source,
    describe_source,
    source_caches,
    stored_time_chunk,
    window_nbytes,
)
from ..stats import WAIT, ChunkRecord, LatencyStats, profiled
from ._chunk import Chunk
from ._config import ResolvedSettings, resolve_device
from ._held import lend
from ._jobs import learn_fields
from ._options import LoaderOptions, loader_settings
from ._resident import make_resident
from ._run import EpochIterator, EpochRun, Owned, forgotten, shutdown
from ._stages import CopyStage, DeliveryStage, HostStage, ResidentStage, receive
from ._times import recording_offsets

__all__ = ["ChunkLoader", "Lane", "host_pool"]

# The threads of the sources' own pools (docs/architecture.md, row 8), whose tasks a
# read waits for with no timeout: a stall error shows those that are busy.
_SOURCE_POOLS = ("chunkstream-decode-", "chunkstream-join-")


@dataclass(frozen=True)
class Lane:
    """Where a stream of batches drawn from a loader's chunks runs (:meth:`ChunkLoader.lane`):
    ``readers`` (``chunkstream-batch-<n>``) read batches, ``copier`` (the transfer thread,
    ``None`` on the CPU) copies them to ``device`` on ``stream``; all the loader's, so its
    stall watchdog sees them and its ``close()`` stops them under its one deadline."""

    readers: Executor
    copier: Executor | None
    stream: Any
    device: torch.device
    owned: Owned


def host_pool(
    fields: Mapping[str, FieldSpec], rows: int, sets: int, device: torch.device, *, used: bool
) -> HostBufferPool | PinnedSlotPool:
    """The host buffer sets the readers fill: ``sets`` pinned slots on a CUDA ``device``,
    else pageable sets; none where no host set is ``used`` (resident chunks are views or
    gathers). A module function: the learning job that calls it must not hold the loader."""
    if not used:
        return HostBufferPool(fields, rows, slots=0)
    if device.type == "cuda":
        return PinnedSlotPool(fields, rows, slots=sets, device=device)
    return HostBufferPool(fields, rows, slots=sets)


class ChunkLoader:
    """Stream windows of ``source`` as :class:`Chunk` objects, read ahead in background threads.

    Every parameter has a row in docs/parameters.md; in short:

    * ``chunk_size``: timesteps per window (more than the data: the whole data).
    * ``device``: ``"cuda"``, ``"cuda:k"``, ``"cpu"``, or ``None`` for CUDA when
      present. ``"cuda"`` is the current CUDA device, as in torch: under torchrun
      call ``torch.cuda.set_device(local_rank)`` first or pass ``f"cuda:{local_rank}"``
      (``LOCAL_RANK``); otherwise every rank streams to one GPU, and the loader warns.
    * ``prefetch``, ``gpu_prefetch``, ``workers``: read-ahead depth (default 2),
      chunks kept ready on the device (1), reader threads (2, or 1 where this
      process's thread budget is 1: its CPUs over the job's ranks on the node); the options'
      ``host_memory``/``device_memory`` byte budgets set the depths not given to
      the largest that fit.
    * ``sampling``, ``align``, ``seed``: the window plan (``"random"``, ``"shuffled"``,
      ``"sequential"`` or a :class:`~chunkstream.plans.WindowPlan`); starts are
      multiples of ``align``.
    * ``options``: a :class:`~chunkstream.LoaderOptions` with the less common
      settings (pinned slots and byte budgets, resident mode, pieces and segments,
      rank and world size, the stall watchdog and ``close()``'s deadline, NaN
      checks, read retries, shared stats, closing the source).
    * ``config``: deprecated, removed in 0.3 (a ``FutureWarning``): another loader's
      ``.config`` in place of ``chunk_size``, the depths and the options it holds.
      Pass the keywords and ``options=`` instead, e.g. ``ChunkLoader(src,
      chunk_size=c.chunk_size, prefetch=c.prefetch, gpu_prefetch=c.gpu_prefetch,
      workers=c.workers, options=other.options)``.

    ``loader.config`` holds the settings the loader resolved (its depths, from any byte
    budget), read-only; ``loader.options`` is the :class:`~chunkstream.LoaderOptions` it
    was given.

    With ``options.pieces=k`` a chunk is ``k`` pieces from independent places
    (:class:`~chunkstream.plans.PiecePlan`, ``chunk.pieces``; starts on the stored
    time-chunk grid when the piece length is a multiple of it); ``options.segments``
    bounds every chunk, piece and sampled window, and ``options.window`` (the batch
    window) must fit in a piece. ``options.resident=True`` reads the reachable
    timesteps once, at the first ``epoch()``, and serves chunks from the device as
    views or gathers (never modify one in place then); ``"auto"`` does so when they
    fit the budget, decided at construction (``loader.mode``, ``loader.mode_reason``).
    ``options.stall_timeout`` seconds without progress raise
    :class:`LoaderStalledError` with the stuck workers' stacks. A source is left
    open by ``close()`` unless ``options.close_source`` (one source may feed several
    loaders; a ``ZarrSource`` opened from a URL still closes its store when
    collected or at interpreter exit).

    Every wait of the consumer and of the loader's jobs polls at 0.1 s, so errors
    reach the consumer within a second (a read waits for its source's own tasks
    without a timeout: a hung one is the stall watchdog's). ``close()`` is
    idempotent and joins every thread within a deadline; the loader is a context
    manager; a loader dropped without ``close()`` warns (``ResourceWarning``) and
    is shut down the same way when collected.

    A source that learns its fields at its first read (``CallableSource(...,
    specs="first")``) is read for them by the first job of the first epoch, in a
    reader thread, which then allocates the host buffers; that epoch's reads wait
    for it.
    """

    def __init__(
        self,
        source: Source,
        chunk_size: int | None = None,
        *,
        device: str | torch.device | None = None,
        prefetch: int | None = None,
        gpu_prefetch: int | None = None,
        workers: int | None = None,
        sampling: str | WindowPlan = "shuffled",
        align: int = 1,
        seed: int = 0,
        options: LoaderOptions | None = None,
        config: ResolvedSettings | None = None,
        **moved: object,
    ) -> None:
        self._closed = True  # until fully built, so close() is safe
        options = check_moved("ChunkLoader", LoaderOptions, moved, options)
        self.options = o = check_options(options, LoaderOptions, "stall_timeout=60")
        self.source = check_source(source)
        # Everything close() releases; a loader collected unclosed releases it through a
        # finalizer, which must not refer to the loader itself.
        self._owned = Owned(source=self.source if o.close_source else None)
        self.device = resolve_device(device)
        warn_if_not_local_rank(device, self.device, os.environ)
        on_cuda = self.device.type == "cuda"
        settings = loader_settings(
            chunk_size,
            prefetch=prefetch,
            gpu_prefetch=gpu_prefetch,
            workers=workers,
            options=o,
            config=config,
        )
        self.config, self.rows = ResolvedSettings.for_source(source, on_cuda=on_cuda, **settings)
        chunk_size = self.config.chunk_size
        self.rank, self.world_size = resolve_rank(o.rank, o.world_size)
        self.plan = loader_plan(
            sampling,
            total=len(source),
            chunk_size=chunk_size,
            align=align,
            seed=seed,
            pieces=o.pieces,
            segments=o.segments if o.segments is not None else getattr(source, "segments", None),
            window=o.window,
            grid=stored_time_chunk(source),
            recordings=getattr(source, "strata", None),  # a cs.Recordings: its weights
        )
        self.stats = o.stats if o.stats is not None else LatencyStats()
        self._offsets = recording_offsets(self.source)  # each chunk's origins (Chunk.origins)
        caches = source_caches(source)  # remote ZarrSources' node-local caches
        if caches:
            self.stats.watch_cache(*(cache.counters for cache in caches))
        self._cursor = EpochCursor(self.plan, rank=self.rank, world_size=self.world_size)
        # Serialises what changes the cursor and the run (epoch()'s publication, a resume),
        # for a few steps at a time, never across long work; see _publishing.
        self._lock = threading.Lock()
        self._holder: int | None = None  # the thread inside _lock, for a nested signal handler
        self._resumes: deque[Position] = deque()  # load_state_dict() positions not yet applied
        self._lane: Lane | None = None  # the batch lane (lane()), made at its first call
        # Everything that can fail is made before the first thread starts.
        self._stream = torch.cuda.Stream(device=self.device) if on_cuda else None
        self._resident, self.mode_reason = make_resident(
            self.plan,
            self.source,
            self.device,
            self._stream,
            o.resident,
            o.host_memory,
            o.device_memory,
        )
        # The host buffers, as a future: made here, or for a source that learns its
        # fields by the first epoch's first job (learn_fields), which every read waits for.
        self._pool_made: Future = GatedFuture()
        # The window whose arrays the learning job keeps for the first epoch's read of it
        # (None until that job is queued); forgotten when that epoch is dropped, should
        # its read never come: the first drop pops it from ``_unread`` (one atomic pop, so
        # a drop from a signal handler and the one it interrupted forget it once).
        self._learned: tuple[int, int] | None = None
        self._unread: list[tuple[int, int]] = []
        sets, used = self.config.host_sets(on_cuda), self._resident is None
        #: This process's share of the node, read before the arena is allocated (so what
        #: the arena takes is counted once by whatever sizes from it, e.g. BatchStream).
        self.share: NodeShare = node_share()
        if used and o.host_memory is None and self.source.fields is not None:
            check_arena_fits(
                self.config.arena_bytes(window_nbytes(self.source.fields, self.rows), on_cuda),
                self.share,
            )
        # The learning job's recipe: no reference to the loader (that job holds it).
        self._make_pool = partial(
            host_pool, rows=self.rows, sets=sets, device=self.device, used=used
        )
        try:
            if self.source.fields is not None:
                self._owned.pool = host_pool(
                    self.source.fields, rows=self.rows, sets=sets, device=self.device, used=used
                )
                self._pool_made.set_result(self._owned.pool)
            self._stage = self._make_stage()
            self._start_executors(on_cuda)
        except BaseException:  # never leak started threads nor a registered arena
            shutdown(self._owned, deadline_s=self.config.close_timeout)
            raise
        self._finalizer = weakref.finalize(
            self, forgotten, self._owned, self.stats, self.config.close_timeout
        )
        self._finalizer.atexit = False  # at exit the daemon threads end with the process
        self._closed = False

    def _make_stage(self) -> DeliveryStage:
        """How the readers' buffers become chunks (:mod:`._stages`), chosen once."""
        c = self.config
        reading = dict(source=self.source, check_finite=c.check_finite, retries=c.read_retries)
        if self._resident is not None:  # the readers load it once, then serve from it
            return ResidentStage(self._resident, c.reader_capacity)
        if self.device.type == "cpu":
            return HostStage(self._pool_made, c.reader_capacity, **reading)
        # No more reads than slots: the oldest read finds one once the copies ahead finish.
        return CopyStage(
            self._pool_made,
            min(c.reader_capacity, c.slots),
            device=self.device,
            stream=self._stream,
            **reading,
        )

    def _start_executors(self, on_cuda: bool) -> None:
        """The readers and, on a device, the copy thread; their jobs never refer to the
        loader, so a loader the user drops is collected."""
        # Every CUDA thread binds the loader's device first (a new thread starts on device 0).
        init = device_binder(self.device) if on_cuda else None
        readers = Executor("read", self.config.workers, init)
        self._owned.executors.append(readers)
        if not on_cuda:  # idle between chunks: they help cs.gather_windows in the user's loop
            lend(readers)
        if self._stage.transfer is not None:
            self._owned.executors.append(Executor("transfer", 1, init))

    def _needs_learning(self) -> bool:
        """Whether the host buffers wait for a first job to learn the source's fields: not
        once made or asked for, nor where the CPU hands one-piece chunks over as the
        source's own arrays (the first read then learns them itself, and no buffer is used)."""
        if self._learned is not None or self._pool_made.done():
            return False
        source = self.source
        hands_over = isinstance(source, HandsOver) and source.hands_over
        return not (self.device.type == "cpu" and hands_over and self.plan.pieces == 1)

    def _learn_fields(self, piece: Piece, span: EpochSpan) -> None:
        """Queue the job that learns the source's fields from ``piece`` (the first piece of
        the first epoch, ``span``) and makes the host buffers; the epoch's reads wait for it."""
        self._learned = (piece.start, piece.stop)
        self._unread.append(self._learned)
        readers = self._executors[0]
        job = partial(
            learn_fields,
            piece,
            source=self.source,
            retries=self.config.read_retries,
            make=self._make_pool,
            owned=self._owned,
            closed=lambda: readers.closed,
            dropped=lambda: span.dropped,
        )
        readers.submit(job, what="learning the fields", future=self._pool_made)

    def lane(self, threads: int, device: torch.device) -> Lane:
        """The executors of a stream of batches drawn from this loader's chunks (made at
        the first call, the same lane after): ``threads`` batch readers and, for batches
        on a CUDA ``device``, the loader's transfer thread and stream (made for the lane
        when the chunks stay on the host). Closed with the loader."""
        self._check_open()
        if self._lane is None:
            device = torch.device(device)
            on_cuda = device.type == "cuda"
            init = device_binder(device) if on_cuda else None
            readers = self._own(Executor("batch", threads, init))
            copier, stream = None, None
            if on_cuda and self._stage.transfer is not None and device == self.device:
                copier, stream = self._executors[1], self._stream
            elif on_cuda:
                stream = torch.cuda.Stream(device=device)
                copier = self._own(Executor("transfer", 1, init))
            self._lane = Lane(readers, copier, stream, device, self._owned)
        return self._lane

    def _own(self, executor: Executor) -> Executor:
        """``executor``, now closed with the loader; stopped at once if a ``close()`` (from
        a signal handler, say) ran while it was being made and could not see it."""
        self._owned.executors.append(executor)
        if self._closed:
            executor.close(time.monotonic() + self.config.close_timeout)
            self._check_open()
        return executor

    def wait_for(self, future: Future, *, since: float) -> Any:
        """``future``'s value, waited for as a chunk is (its error, a close or a stall
        shuts the loader down and is raised within one poll); ``since``: when the work
        it waits for was queued (``monotonic``)."""
        return self._wait(future, None, time.perf_counter(), failed=lambda: None, since=since)

    @property
    def _pool(self) -> HostBufferPool | PinnedSlotPool | None:
        """The host buffers (``None`` until a source that learns its fields was read)."""
        return self._owned.pool

    @property
    def _executors(self) -> list[Executor]:
        return self._owned.executors

    # -- epochs ------------------------------------------------------------------------

    def epoch(self, num_chunks: int | None = None, *, at: int = 0) -> Iterator[Chunk]:
        """Start the next epoch and iterate over its ``num_chunks`` chunks (on this rank).

        Reading starts at once; breaking out early is fine (the next call abandons
        what is left). ``num_chunks=None`` is one pass of the plan (``random``
        needs a number). ``at`` skips the first ``at`` chunks of this rank's share
        (``0 <= at <= num_chunks``): they are neither read nor yielded. After a
        mid-epoch :meth:`load_state_dict` the call yields the rest of the
        interrupted epoch, re-split over this world size if it changed.
        """
        self._check_open()
        if self._resident is not None and not self._resident.loaded:
            self._load_resident()
        while True:
            self._resume_left()  # a resume queued by a handler that found the lock taken
            before = self._cursor.position
            span, after = self._cursor.draw(num_chunks, at)  # can take long: no lock held
            with self._publishing():
                if self._cursor.position is not before or self._resumes:
                    continue  # a resume came in meanwhile: draw again from it
                self._cursor.publish(after)
                self._drop_run()
                if self._needs_learning() and span.windows:
                    self._learn_fields(span.windows[0][0], span)
                stage = self._stage
                run = EpochRun(
                    span.windows,
                    read=stage.read,
                    readers=self._executors[0],
                    depth=stage.depth,
                    copy=stage.transfer,
                    copier=self._executors[1] if stage.transfer else None,
                    copy_depth=self.config.gpu_prefetch,
                    reclaim=stage.reclaim,
                    ordered=stage.ordered,
                )
                self._owned.run = run
            break
        if self._closed:  # a close() that did not see this run yet: it stops it here
            run.drop()
        self.stats.epoch_started()
        return EpochIterator(self, span, run)

    @contextmanager
    def _publishing(self) -> Iterator[None]:
        """Hold the loader's lock for a few steps that change the cursor or the run, then
        apply the resumes queued meanwhile (:meth:`load_state_dict` from a signal handler
        that interrupted this very thread inside the lock queues its resume for it)."""
        with self._lock:
            self._holder = threading.get_ident()
            try:
                yield
                self._apply_resumes()
            finally:
                self._holder = None
        self._resume_left()

    def _apply_resumes(self) -> None:
        """Publish each queued resume in turn (under the lock); removed only once
        published, so :meth:`state_dict` finds it either queued or current."""
        while self._resumes:
            self._cursor.publish(self._resumes[0])
            self._resumes.popleft()
            self._drop_run()

    def _resume_left(self) -> None:
        """Apply resumes queued after the holder's last look, taking the lock if free."""
        while self._resumes and self._lock.acquire(blocking=False):
            try:
                self._apply_resumes()
            finally:
                self._lock.release()

    def _drop_run(self) -> None:
        """Drop the run in progress; takes no lock (close() calls it from anywhere)."""
        run = self._owned.run
        if run is None:
            return
        self._owned.run = None
        run.drop()  # idempotent: a drop from a handler and the one it interrupted agree
        try:
            window = self._unread.pop()  # the learning epoch: its first read may not come
        except IndexError:
            pass
        else:
            self.source.forget(*window)  # a no-op once that read took them
        # The epoch's clock stops here if its iterator did not run to the end.
        self.stats.epoch_ended()

    def _next_chunk(self, span: EpochSpan, run: EpochRun) -> Chunk:
        """The consumer side of one chunk; called by the epoch iterator."""
        self._check_open()
        depth = run.ready()
        try:
            future, trip = run.take()
        except IndexError:
            # A control call from a signal handler (or another thread) dropped the run
            # between the checks above and the take: say why, as the next call would.
            self._check_open()
            if span.dropped or run.dropped():
                raise StopIteration from None
            raise
        asked = time.perf_counter()
        first = span.windows[span.received - span.first][0]
        with profiled(WAIT, (first.start, first.stop)):
            delivery = self._wait(
                future, (first.start, first.stop), asked, failed=run.failed, since=run.started
            )
        received = time.perf_counter()
        tensors, ready = receive(delivery, self.device)
        start, stop = delivery.pieces[0].start, delivery.pieces[0].stop
        chunk = Chunk(
            tensors,
            start=start,
            stop=stop,
            epoch=span.epoch,
            index=span.received,
            ready=ready,
            pieces=delivery.pieces,
            offsets=self._offsets,
        )
        record = ChunkRecord(
            epoch=span.epoch,
            index=span.received,
            start=start,
            stop=stop,
            nbytes=chunk.nbytes,
            wait_s=received - asked,
            read_s=trip.read_end - trip.read_begin,
            queue_depth=depth,
            read_begin=trip.read_begin,
            read_end=trip.read_end,
            received=received,
            transfer_begin=trip.transfer_begin,
            read_thread=trip.read_thread,
            transfer_thread=trip.transfer_thread,
        )
        self.stats.record_chunk(record, events=delivery.events)
        return chunk

    def _wait(
        self,
        future: Future,
        window: tuple[int, int],
        asked: float,
        *,
        failed: Callable[[], Future | None],
        since: float,
    ) -> Any:
        """``future``'s value (for ``window``). Its error, or the error of a later future
        (``failed()``), shuts the loader down and is raised as it is (within one poll)."""
        while not done_within(future, POLL_S):
            later = failed()
            if later is not None:
                future = later  # the pipeline stops anyway
                break
            self._check_stalled(asked, window, since=since)
        try:
            return future.result(timeout=0)  # done: done_within said so, or a later failure
        except BaseException as failure:
            self._close_after(failure)
            raise

    def _close_after(self, failure: BaseException) -> None:
        """Shut the loader down after a worker's ``failure`` (the error contract of
        docs/_guarantees.md), which the caller then raises; a close that also fails is
        noted on it."""
        self._check_open()  # closed meanwhile: that is what the consumer must hear
        try:
            self.close()
        except Exception as exc:  # the worker's error is what the consumer must see
            failure.add_note(
                f"chunkstream: closing the loader after this error also failed: "
                f"{type(exc).__name__}: {exc}"
            )

    def _load_resident(self) -> None:
        """Read the resident rows once, waiting as for a chunk: the first read error in row
        order, a close, or a stall (no reader progress for ``stall_timeout``) ends the wait."""
        resident = self._resident
        assert resident is not None
        reads = resident.start(self.source, self._executors[0], self.rows, self.config)
        asked, started = time.perf_counter(), time.monotonic()

        def failed() -> Future | None:
            return next(
                (f for f in reads if f.done() and not f.cancelled() and f.exception(timeout=0)),
                None,
            )

        for future in reads:
            self._wait(future, (resident.lo, resident.hi), asked, failed=failed, since=started)
        resident.finish()

    def _check_stalled(self, asked: float, window: tuple[int, int], *, since: float) -> None:
        """:class:`LoaderStalledError` for ``window`` (after shutting down) once
        ``stall_timeout`` has passed since ``asked`` (``perf_counter``) and since any
        worker's last progress, or ``since`` (``monotonic``) if none came after it."""
        self._check_open()
        timeout = self.config.stall_timeout
        if timeout is None:
            return
        last = max([e.last_progress for e in self._executors] + [since])
        if time.perf_counter() - asked < timeout or time.monotonic() - last < timeout:
            return
        raise self._stalled(timeout, window)

    def _stalled(self, timeout: float, window: tuple[int, int] | None) -> LoaderStalledError:
        """The stall error, with the busy workers' stacks, after shutting the loader down."""
        stacks = [s for executor in self._executors for s in executor.busy_stacks()]
        stacks += helper_stacks(_SOURCE_POOLS)  # the tasks a stuck read waits for
        message = (
            f"no chunk arrived for {timeout:.1f} s (stall_timeout) and no worker made "
            f"progress; the loader is shut down. Stuck workers:\n" + "\n".join(stacks)
            if stacks
            else f"no chunk arrived for {timeout:.1f} s (stall_timeout) and no worker is busy"
        )
        # The stuck thread cannot be joined; its stack is in the error instead.
        try:
            message += self._shutdown(deadline_s=0.2, warn=False)
        except Exception as exc:  # handed on: the stall is what the consumer must see
            message += f"; closing the loader also failed: {type(exc).__name__}: {exc}"
        return LoaderStalledError(message, window=window)

    # -- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """A few integers: the epoch and how many of its chunks the consumer received
        (see :meth:`EpochCursor.state_dict`); save it from any one rank of a DDP loop.

        Takes no lock, so it is safe from a signal handler at any moment and from any
        thread: it reads the cursor's position (one immutable value) or, if a resume
        is queued, the last one queued."""
        resumes = list(self._resumes)  # one C call: a snapshot
        return self._cursor.state_dict(resumes[-1] if resumes else None)

    def load_state_dict(self, state: dict[str, int], *, uneven: Uneven = "exact") -> None:
        """Resume: the next ``epoch(n)`` yields the interrupted epoch's remaining windows,
        re-split with no repeat or omission if the state came from another world size;
        ``uneven`` (``"exact"``, ``"pad"``, ``"drop"``) as in :mod:`chunkstream.distributed`.

        Safe from a signal handler at any moment: where its own thread holds the lock
        (the handler interrupted ``epoch()`` while it published), or another thread
        holds it past one poll, the resume is queued and applied by the holder before
        it lets go; :meth:`state_dict` reports it from then on."""
        check_loader_state(state)
        self._resumes.append(self._cursor.loaded(state, uneven=uneven))
        mine = self._holder == threading.get_ident()
        if self._lock.acquire(timeout=0 if mine else POLL_S):
            try:
                self._apply_resumes()
            finally:
                self._lock.release()
        self._resume_left()

    # -- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop every thread (joined within a deadline); idempotent, safe from any state,
        from any thread and from a signal handler at any moment (it takes no lock the
        interrupted frame may hold)."""
        self._shutdown(deadline_s=self.config.close_timeout, warn=True)

    def _shutdown(self, *, deadline_s: float, warn: bool) -> str:
        """Stop everything within one deadline (see :func:`shutdown`); returns its note."""
        if self._closed:
            return ""
        self._closed = True  # epoch() checks this after publishing its run
        self._finalizer.detach()  # this is the loader's one shutdown
        try:
            self._drop_run()  # an iterator of it raises LoaderClosedError from now on
            self.stats.epoch_ended()
        finally:
            note = shutdown(
                self._owned,
                deadline_s=deadline_s,
                warn_after=self.config.close_timeout if warn else None,
            )
        return note

    @property
    def pinned_bytes(self) -> int:
        """Page-locked host bytes the loader holds: its pinned arena's true size (0 on CPU,
        before the first read of a source that learns its fields, and once close() unpinned it)."""
        pool = self._owned.pool
        return pool.nbytes if isinstance(pool, PinnedSlotPool) else 0

    @property
    def chunk_bytes(self) -> int | None:
        """Bytes of one full window over every field (``None`` while a source that
        learns its fields at the first read has not read yet)."""
        fields = self.source.fields
        return None if fields is None else window_nbytes(fields, self.rows)

    @property
    def mode(self) -> str:
        """``"resident"`` or ``"streaming"`` (``mode_reason`` says why), fixed at construction."""
        return "streaming" if self._resident is None else "resident"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (or the loader shut down after an error)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LoaderClosedError(
                "the loader is closed; create a new ChunkLoader (or do not call close() "
                "before the last epoch)"
            )

    def __enter__(self) -> ChunkLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The loader's worker threads (named ``chunkstream-<stage>-<n>``), for diagnostics."""
        return tuple(t for executor in self._executors for t in executor.threads)

    @property
    def chunks_read(self) -> int:
        """Windows read without error since construction (prefetched ones included; resident:
        the load's reads and every chunk served)."""
        return self._executors[0].completed if self._executors else 0

    @property
    def chunks_per_pass(self) -> int | None:
        """This rank's chunks in one pass of the plan: the length of ``epoch()`` with no
        ``num_chunks`` (``None`` for ``sampling="random"``, which has no pass)."""
        return self._cursor.chunks_per_pass

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ChunkLoader({describe_source(self.source)}, chunk_size={c.chunk_size}, "
            f"device={self.device}, prefetch={c.prefetch}, gpu_prefetch={c.gpu_prefetch}, "
            f"workers={c.workers}, plan={type(self.plan).__name__})"
        )
