"""``ChunkLoader``: windows of a source, read ahead in threads and handed out in plan order.

The flow (see DESIGN.md)::

    plan ──> reader stage ──> [CUDA: pinned slot ──> transfer stage] ──> Chunk

* The reader stage is an :class:`~chunkstream.pipeline._stage.OrderedStage` of
  ``workers`` threads with capacity ``prefetch + workers``; each job takes a
  host buffer set, calls ``source.read_into`` on it and times the read.
* On CUDA the transfer stage (one thread, capacity ``gpu_prefetch``) copies each
  pinned slot into fresh device tensors on its own stream, records an event and
  gives the slot back to the pool to be reused once that event completes. The
  consumer's stream waits on the event (``wait_event``), so the host never
  blocks on a copy, and ``record_stream`` tells the caching allocator the
  tensors are used on the consumer's stream.
* On CPU the readers' buffers become the user's tensors (zero copy); a buffer
  is reused only after every tensor of the user's that refers to it is gone.

Threads live as long as the loader; each :meth:`ChunkLoader.epoch` call starts a
new generation of jobs, so breaking out of an epoch and starting the next costs
no thread churn, and stale reads are discarded with their buffers returned.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import torch

from .._errors import (
    ChunkLoadError,
    ConfigError,
    LoaderClosedError,
    LoaderStalledError,
)
from ..distributed import EpochShare, Uneven, epoch_share
from ..distributed import resolve_rank as _resolve_rank
from ..plans import PiecePlan, Segments, WindowPlan, chunk_pieces, make_plan
from ..sources._base import Source, window_nbytes
from ..stats._latency import ChunkRecord, LatencyStats
from ._buffers import HostBufferPool, PinnedSlotPool
from ._chunk import Chunk, Piece
from ._config import LoaderConfig, resolve_device, warn_if_not_local_rank
from ._jobs import OnDevice, describe_source, discard_loaded, read_job, transfer_job
from ._pieces import stored_time_chunk
from ._stage import EndOfJobs, OrderedStage, StageClosed

__all__ = ["ChunkLoader"]

_POLL_S = 0.1


class ChunkLoader:
    """Stream windows of ``source`` as :class:`Chunk` objects, read ahead in background threads.

    Parameters
    ----------
    source:
        A :class:`~chunkstream.Source` (``ZarrSource``, ``NumpySource``, ...).
    chunk_size:
        Timesteps per window. A chunk_size larger than the data gives the whole data.
    device:
        ``"cuda"``, ``"cuda:k"``, ``"cpu"``, or ``None`` for CUDA when present.
        ``"cuda"`` is the current CUDA device, as in torch: under torchrun call
        ``torch.cuda.set_device(local_rank)`` first, or pass
        ``device=f"cuda:{local_rank}"`` (``LOCAL_RANK``); otherwise every rank
        streams to ``cuda:0``, and the loader warns.
    prefetch, gpu_prefetch, workers, host_slots:
        Read-ahead depth in host memory, chunks kept ready on the device, reader
        threads, and pinned slots (CUDA; default ``prefetch + workers``).
    host_memory, device_memory:
        Byte budgets; when given they set ``prefetch``/``host_slots`` and
        ``gpu_prefetch`` to the largest depths that fit.
    sampling, align, seed:
        The window plan: ``"random"``, ``"shuffled"``, ``"sequential"`` or a
        :class:`~chunkstream.plans.WindowPlan`; starts are multiples of ``align``.
    pieces, segments, window:
        ``pieces=k`` makes each chunk ``k`` pieces of ``chunk_size // k``
        timesteps from independent places (:class:`~chunkstream.plans.PiecePlan`;
        starts aligned to the source's stored time chunks when the piece length
        is a multiple of them); ``chunk.pieces`` says which rows hold which
        timesteps. ``segments`` (a :class:`~chunkstream.Segments`, a sequence of
        ``(start, stop[, name])`` or a CSV/JSON path) bounds every piece: no
        chunk, piece or sampled window crosses a segment's end. ``window`` (the
        batch window) must fit in a piece; segments shorter than it are
        skipped with a warning.
    rank, world_size:
        This process's share of every epoch (defaults from torch.distributed
        when it is initialised, else 0 and 1).
    stall_timeout:
        Seconds without any progress before the consumer gets a
        :class:`LoaderStalledError` holding the stuck workers' stacks (``None``: never).
    check_finite:
        Raise :class:`NonFiniteError` naming the position of any NaN/Inf read.
    read_retries:
        Retries (with exponential backoff from 50 ms) of a read that failed with a
        transient I/O or network error; bad data and missing paths fail at once.
    close_source:
        Whether the loader owns ``source``: ``True`` closes it (a ``ZarrSource``'s
        remote store with it) when the loader closes. ``False`` (the default) leaves
        it open, since one source may feed several loaders; a ``ZarrSource`` opened
        from a URL still closes its store when collected or at interpreter exit.

    Notes
    -----
    Every blocking wait polls at 0.1 s, so errors reach the consumer within a
    second and ``close()`` is seen promptly. ``close()`` is idempotent; the
    loader is a context manager.
    """

    def __init__(
        self,
        source: Source,
        chunk_size: int,
        *,
        device: str | torch.device | None = None,
        prefetch: int | None = None,
        gpu_prefetch: int | None = None,
        workers: int = 2,
        host_slots: int | None = None,
        host_memory: int | None = None,
        device_memory: int | None = None,
        sampling: str | WindowPlan = "shuffled",
        align: int = 1,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        stall_timeout: float | None = 300.0,
        check_finite: bool = False,
        read_retries: int = 2,
        stats: LatencyStats | None = None,
        close_source: bool = False,
        pieces: int = 1,
        segments: Segments | str | object | None = None,
        window: int | None = None,
    ) -> None:
        self._closed = True  # until fully built, so __del__ and close() are safe
        if not isinstance(close_source, bool):
            raise ConfigError.bad("close_source", close_source, "True or False", "Pass a bool.")
        self._close_source = close_source
        self._stages: list[OrderedStage] = []
        if not isinstance(source, Source):
            raise ConfigError.bad(
                "source",
                type(source).__name__,
                "a chunkstream Source (fields, __len__, read_into, close)",
                "Wrap arrays in cs.NumpySource, zarr in cs.ZarrSource, a function in cs.CallableSource.",
            )
        self.source = source
        self.device = resolve_device(device)
        warn_if_not_local_rank(device, self.device, os.environ)
        on_cuda = self.device.type == "cuda"
        total = len(source)
        if total < 1:
            raise ConfigError.bad("source", f"{len(source)} timesteps", "at least 1 timestep")
        rows_probe = chunk_size if isinstance(chunk_size, int) else 0
        rows = min(rows_probe, total) if rows_probe > 0 else 1
        self.chunk_bytes = window_nbytes(source.fields, rows)
        budget = LoaderConfig.from_budget(
            chunk_bytes=self.chunk_bytes,
            workers=workers,
            host_memory=host_memory,
            device_memory=device_memory,
            on_cuda=on_cuda,
        )
        self.config = LoaderConfig(
            chunk_size=chunk_size,
            prefetch=prefetch if prefetch is not None else budget.get("prefetch", 2),
            gpu_prefetch=gpu_prefetch
            if gpu_prefetch is not None
            else budget.get("gpu_prefetch", 1),
            workers=workers,
            host_slots=host_slots if host_slots is not None else budget.get("host_slots"),
            stall_timeout=stall_timeout,
            check_finite=check_finite,
            read_retries=read_retries,
        )
        if on_cuda and self.config.slots < self.config.workers:
            raise ConfigError.bad(
                "host_slots",
                self.config.slots,
                f"at least workers={workers} pinned slots",
                "Raise host_slots (or host_memory), or use fewer workers.",
            )
        self.rank, self.world_size = _resolve_rank(rank, world_size)
        self.plan = _make_plan(
            sampling, source, total, chunk_size, align, seed, pieces, segments, window
        )
        self.rows = rows
        if stats is not None and not isinstance(stats, LatencyStats):
            raise ConfigError.bad(
                "stats", type(stats).__name__, "a cs.LatencyStats or None",
                "Pass stats=None to let the loader make one, or share one cs.LatencyStats().",
            )  # fmt: skip
        self.stats = stats if stats is not None else LatencyStats()

        # Everything that can fail is made before the first thread starts.
        self._stream = torch.cuda.Stream(device=self.device) if on_cuda else None
        # Buffers and stages. Nothing below refers to ``self``, so a loader the
        # user drops is collected, and its __del__ stops the threads.
        self._windows: list[tuple[Piece, ...]] = []
        if on_cuda:
            self._pool: HostBufferPool | PinnedSlotPool = PinnedSlotPool(
                source.fields, rows, slots=self.config.slots, device=self.device
            )
        else:
            self._pool = HostBufferPool(
                source.fields, rows, max_free=self.config.reader_capacity + 1
            )
        self._transfer: OrderedStage | None = None
        try:
            windows, pool = self._windows, self._pool
            # Every CUDA stage thread binds the loader's device before its first job: a new
            # thread starts on device 0, where its first CUDA call would create a context.
            init = _device_binder(self.device) if on_cuda else None
            self._reader = OrderedStage(
                "read",
                lambda job, ticket: read_job(
                    job,
                    ticket,
                    windows=windows,
                    source=source,
                    pool=pool,
                    check_finite=check_finite,
                    retries=read_retries,
                ),
                workers=self.config.workers,
                capacity=self.config.reader_capacity
                if not on_cuda
                else min(self.config.reader_capacity, self.config.slots),
                discard=lambda value: discard_loaded(value, pool),
                thread_init=init,
            )
            self._stages = [self._reader]
            if self.device.type != "cpu":
                reader = self._reader
                stream, device_ = self._stream, self.device
                self._transfer = OrderedStage(
                    "transfer",
                    lambda job, ticket: transfer_job(
                        job, ticket, upstream=reader, pool=pool, device=device_, stream=stream
                    ),
                    workers=1,
                    capacity=self.config.gpu_prefetch,
                    thread_init=init,
                )
                self._stages.append(self._transfer)
        except BaseException:
            # Never leak the started readers, nor a registered arena (its mapping
            # would be unmapped while still registered, and __del__ does nothing here).
            for stage in reversed(self._stages):
                stage.close(self.config.close_timeout)
            self._close_pool([], self.config.close_timeout)
            raise
        self._closed = False
        self._lock = threading.Lock()
        self._epoch = 0  # the epoch the next epoch() call runs
        self._resume_step = 0  # chunks of that epoch already received before a resume
        # Global windows (across ranks) of that epoch delivered before a resume, and the
        # epoch's global length; ``None``: no resume pending, or one saved by an old state.
        self._resume_global: tuple[int, int] | None = None
        self._uneven: Uneven = "exact"
        self._share: EpochShare | None = None
        self._active: _EpochIterator | None = None

    # -- epochs ------------------------------------------------------------------------

    def epoch(self, num_chunks: int | None = None) -> Iterator[Chunk]:
        """Start the next epoch and iterate over its ``num_chunks`` chunks (on this rank).

        Reading starts at once. Breaking out early is fine: the next ``epoch()``
        call abandons what is left. ``num_chunks=None`` means one pass of the
        plan (``shuffled``/``sequential``); ``random`` needs a number.

        After :meth:`load_state_dict` of a mid-epoch state the call yields what
        is left of the interrupted epoch, whose length comes from the state
        (``num_chunks`` is then only checked). If the state came from another
        world size, the remaining global windows are re-split over this one
        (:func:`chunkstream.distributed.epoch_share`): counts then differ by at
        most one across ranks unless ``uneven`` asked for padding or dropping.
        """
        self._check_open()
        if num_chunks is None:
            per_pass = self.plan.windows_per_pass
            if per_pass is None:
                raise ConfigError.bad(
                    "num_chunks",
                    None,
                    "a number of chunks for sampling='random' (it has no natural pass)",
                    "Use cs.plan_epoch(...).chunks_per_epoch.",
                )
            num_chunks = max(1, per_pass // self.world_size)
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 0:
            raise ConfigError.bad(
                "num_chunks",
                num_chunks,
                "an integer >= 0",
                "Use cs.plan_epoch(...).chunks_per_epoch.",
            )
        with self._lock:
            if self._active is not None:
                self._active.abandon()
            epoch, world = self._epoch, self.world_size
            if self._resume_global is not None and self._resume_global[0] > 0:
                consumed, total = self._resume_global
            else:  # a fresh epoch, or a state without global counts (same world size)
                consumed = min(self._resume_step, num_chunks) * world
                total = num_chunks * world
            self._resume_step, self._resume_global = 0, None
            self._epoch += 1
            share = epoch_share(
                epoch=epoch,
                consumed=consumed,
                total=total,
                rank=self.rank,
                world_size=world,
                uneven=self._uneven,
            )
            windows = [chunk_pieces(self.plan, epoch, index) for index in share.indices]
            self._windows[:] = windows
            for stage in self._stages:
                stage.reset(len(windows))
            first = share.first_step
            iterator = _EpochIterator(self, epoch, first, first + len(windows))
            self._share = share
            self._active = iterator
        self.stats.epoch_started()
        return iterator

    def _next_chunk(self, iterator: _EpochIterator) -> Chunk:
        """The consumer side of one chunk; called by the epoch iterator."""
        stage = self._transfer if self._transfer is not None else self._reader
        depth = stage.ready()
        asked = time.perf_counter()
        while True:
            try:
                value = stage.get(timeout=_POLL_S)
                break
            except TimeoutError:
                self._check_stalled(asked)
            except StageClosed:
                self._check_open()
                raise
            except ChunkLoadError as failure:
                try:
                    self._after_failure()
                except Exception as exc:  # the worker's error is what the consumer must see
                    failure.add_note(
                        f"chunkstream: closing the loader after this error also failed: "
                        f"{type(exc).__name__}: {exc}"
                    )
                raise
        received = time.perf_counter()
        if isinstance(value, OnDevice):
            loaded, tensors = value.loaded, value.tensors
            ready = value.done
            if value.done is not None:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(value.done)  # the consumer's stream waits, not the host
                for tensor in tensors.values():
                    tensor.record_stream(consumer)
        else:
            loaded, ready = value, None
            rows = loaded.rows
            tensors = {
                name: torch.from_numpy(array) for name, array in loaded.buffers.views(rows).items()
            }
            self._pool.release(loaded.buffers)  # reuse now follows the user's references
        index = iterator.first + loaded.job
        record = ChunkRecord(
            epoch=iterator.epoch,
            index=index,
            start=loaded.start,
            stop=loaded.stop,
            nbytes=sum(t.numel() * t.element_size() for t in tensors.values()),
            wait_s=received - asked,
            read_s=loaded.read_end - loaded.read_begin,
            queue_depth=depth,
            read_begin=loaded.read_begin,
            read_end=loaded.read_end,
            received=received,
            read_thread=loaded.thread,
        )
        if isinstance(value, OnDevice):
            record.transfer_begin, record.transfer_thread = value.issued, value.thread
            if value.done is not None:
                record._events = (value.begin, value.done)
        self.stats.record_chunk(record)
        return Chunk(
            tensors, start=loaded.start, stop=loaded.stop, epoch=iterator.epoch, index=index,
            ready=ready, pieces=loaded.pieces,
        )  # fmt: skip

    def _check_stalled(self, asked: float) -> None:
        self._check_open()
        timeout = self.config.stall_timeout
        if timeout is None:
            return
        now = time.monotonic()
        last = max(stage.last_progress for stage in self._stages)
        if time.perf_counter() - asked >= timeout and now - last >= timeout:
            stacks = [s for stage in self._stages for s in stage.busy_stacks()]
            windows = self._windows
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
            first = (windows[0][0].start, windows[0][0].stop) if windows else None
            raise LoaderStalledError(message, window=first)

    def _after_failure(self) -> None:
        # DESIGN: after a worker error the pipeline shuts down.
        self.close()

    # -- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """A few integers: the epoch and how many of its chunks the consumer received.

        ``step`` and ``num_chunks`` count this rank's chunks; ``consumed`` and
        ``total`` count the epoch's global windows (across ranks) delivered and
        in all, assuming every rank received as many as this one (save it from
        any one rank of a DDP loop, which keeps ranks in lockstep). The global
        counts are what lets a run resume with another world size.
        """
        seed = int(getattr(self.plan, "seed", 0))
        with self._lock:
            active, share = self._active, self._share
            if active is not None and not active.finished and share is not None:
                return {
                    "epoch": active.epoch,
                    "step": active.received,
                    "num_chunks": active.num_chunks,
                    "seed": seed,
                    "world_size": self.world_size,
                    "consumed": share.consumed_after(active.received - active.first),
                    "total": share.total,
                }
            consumed, total = self._resume_global or (self._resume_step * self.world_size, 0)
            return {
                "epoch": self._epoch,
                "step": self._resume_step,
                "num_chunks": 0,
                "seed": seed,
                "world_size": self.world_size,
                "consumed": consumed,
                "total": total,
            }

    def load_state_dict(self, state: dict[str, int], *, uneven: Uneven = "exact") -> None:
        """Resume: the next ``epoch(n)`` yields the interrupted epoch's remaining windows.

        The state may come from another world size (elastic resume): the
        remaining global windows are re-split over this loader's ranks with no
        repeat and no omission. ``uneven`` says what to do when they do not
        split evenly: ``"exact"`` (counts differ by at most one), ``"pad"`` or
        ``"drop"``; see :mod:`chunkstream.distributed`.
        """
        try:
            epoch, step = int(state["epoch"]), int(state["step"])
            saved_world = int(state.get("world_size", self.world_size))
            consumed = int(state.get("consumed", step * saved_world))
            total = int(state.get("total", int(state.get("num_chunks", 0)) * saved_world))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError.bad(
                "state", state, "a dict from ChunkLoader.state_dict() with 'epoch' and 'step'"
            ) from exc
        if epoch < 0 or step < 0 or saved_world < 1 or consumed < 0:
            raise ConfigError.bad("state", state, "non-negative 'epoch' and 'step'")
        if consumed and consumed > total:
            raise ConfigError.bad("state", state, f"'consumed'={consumed} at most 'total'={total}")
        if saved_world != self.world_size and consumed and not total:
            raise ConfigError.bad(
                "state",
                state,
                "'total' or 'num_chunks' to re-split the epoch over another world size",
                "Save the state with ChunkLoader.state_dict() during the epoch.",
            )
        if uneven not in ("exact", "pad", "drop"):
            raise ConfigError.bad(
                "uneven", uneven, "'exact', 'pad' or 'drop'", "'exact' repeats and skips nothing."
            )
        seed = state.get("seed")
        if seed is not None and seed != getattr(self.plan, "seed", seed):
            warnings.warn(
                f"resuming a state saved with seed={seed} on a loader with seed="
                f"{self.plan.seed}: the remaining windows will differ from the interrupted run",
                stacklevel=2,
            )
        with self._lock:
            if self._active is not None:
                self._active.abandon()
                self._active = None
            self._epoch, self._resume_step = epoch, step
            self._resume_global = (consumed, total) if total else None
            self._uneven = uneven

    # -- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop every thread (joined within a deadline); idempotent, safe from any state."""
        self._shutdown(deadline_s=self.config.close_timeout if self._stages else 0.0, warn=True)

    def _shutdown(self, *, deadline_s: float, warn: bool) -> str:
        """Stop everything within one deadline of ``deadline_s`` seconds (plus a poll).

        Every step runs even if an earlier one raises (the first error is raised
        at the end). Returns a note for the caller's error message when the
        source was left open (``""`` otherwise); ``warn`` also warns about it
        and about threads that did not stop.
        """
        if self._closed:
            return ""
        self._closed = True
        end = time.monotonic() + deadline_s
        alive: list[str] = []
        note = ""
        try:
            self.stats.epoch_ended()
        finally:
            try:
                # The transfer thread reads from the readers, so stop it first.
                for stage in reversed(self._stages):
                    alive += stage.close(max(0.0, end - time.monotonic()))
            finally:
                try:
                    self._close_pool(alive, max(0.0, end - time.monotonic()))
                finally:
                    note = self._close_owned_source(alive)
                    if alive and warn:
                        warnings.warn(
                            f"chunkstream: threads {alive} did not stop within "
                            f"{self.config.close_timeout} s (a read that ignores "
                            f"cancellation); they are daemon threads and end with the "
                            f"process{note}",
                            RuntimeWarning,
                            stacklevel=3,
                        )
        return note

    def _close_pool(self, alive: list[str], timeout: float) -> None:
        if isinstance(self._pool, PinnedSlotPool):
            # Unpinning under a copy would be a use-after-free: only once the transfer
            # thread has stopped and every queued copy has finished.
            transfer_alive = any(name.startswith("chunkstream-transfer") for name in alive)
            self._pool.close(timeout, unpin=not transfer_alive)
        else:
            self._pool.close()

    def _close_owned_source(self, alive: list[str]) -> str:
        """Close the source if the loader owns it and no reader is still inside a read.

        A reader stuck in ``read_into`` (a hung file system, a decode task that
        never ends) would make ``source.close()`` wait for it too (a
        ``ZarrSource`` joins its decode pool), past every deadline; closing a
        store under a live read is no better. So the source is then left open,
        and the returned note says so.
        """
        if not self._close_source:
            return ""
        readers = [name for name in alive if name.startswith("chunkstream-read")]
        if readers:
            return (
                f"; the source was left open (close_source=True) because {readers} "
                "are still reading from it: call source.close() once the read returns, "
                "or let the process exit"
            )
        self.source.close()
        return ""

    @property
    def pinned_bytes(self) -> int:
        """Page-locked host bytes the loader holds: its pinned arena's true size (0 on CPU)."""
        return self._pool.nbytes if isinstance(self._pool, PinnedSlotPool) else 0

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

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(
                "ChunkLoader was not closed; use `with ChunkLoader(...)` or call close()",
                ResourceWarning,
                stacklevel=2,
            )
            self.close()

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The loader's worker threads (named ``chunkstream-<stage>-<n>``), for diagnostics."""
        return tuple(t for stage in self._stages for t in stage.threads)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ChunkLoader({describe_source(self.source)}, chunk_size={c.chunk_size}, "
            f"device={self.device}, prefetch={c.prefetch}, gpu_prefetch={c.gpu_prefetch}, "
            f"workers={c.workers}, plan={type(self.plan).__name__})"
        )


def _make_plan(
    sampling: str | WindowPlan,
    source: Source,
    total: int,
    chunk_size: int,
    align: int,
    seed: int,
    pieces: int,
    segments: object,
    window: int | None,
) -> WindowPlan | PiecePlan:
    """The loader's plan: a window plan for contiguous chunks, a :class:`PiecePlan` for
    pieces or segments (so ``pieces=1`` without segments keeps today's windows)."""
    if pieces == 1 and segments is None:
        if window is not None and isinstance(chunk_size, int) and window > min(chunk_size, total):
            raise ConfigError.bad(
                "window", window, f"at most the chunk length {min(chunk_size, total)}",
                "Use a larger chunk_size or a shorter window.",
            )  # fmt: skip
        return make_plan(
            sampling, total_timesteps=total, chunk_size=chunk_size, align=align, seed=seed
        )
    if not isinstance(sampling, str):
        raise ConfigError.bad(
            "sampling", type(sampling).__name__,
            "'random', 'shuffled' or 'sequential' with pieces or segments",
            "Pieces and segments need a built-in plan; use pieces=1 and no segments with a "
            "custom WindowPlan.",
        )  # fmt: skip
    if isinstance(segments, str | os.PathLike):
        segments = Segments.read(segments)
    if pieces != 1 and isinstance(chunk_size, int) and chunk_size > total:
        # Buffers hold min(chunk_size, T) rows; k pieces drawn from less data could need more.
        raise ConfigError.bad(
            "pieces", pieces, f"1 when chunk_size={chunk_size} exceeds the data ({total} timesteps)",
            "Use pieces=1 (a chunk is then the whole data) or a chunk_size <= the data.",
        )  # fmt: skip
    return PiecePlan(
        total_timesteps=total, chunk_size=chunk_size, pieces=pieces, sampling=sampling,
        segments=segments, align=align, seed=seed, grid=stored_time_chunk(source),
        batch_window=1 if window is None else window,
    )  # fmt: skip


def _device_binder(device: torch.device) -> Callable[[], None]:
    """A stage thread's start hook: make ``device`` the thread's current CUDA device."""

    def bind() -> None:
        try:
            torch.cuda.set_device(device)
        except Exception as exc:  # the consumer's next call raises this (OrderedStage)
            raise ChunkLoadError(
                f"setting the CUDA device {device} in thread "
                f"{threading.current_thread().name!r} failed: {type(exc).__name__}: {exc}. "
                "Check that the device is visible (CUDA_VISIBLE_DEVICES) and healthy."
            ) from exc

    return bind


class _EpochIterator:
    """Iterates one epoch; abandoned when the next epoch starts or the loader closes."""

    def __init__(self, loader: ChunkLoader, epoch: int, first: int, num_chunks: int) -> None:
        self._loader = loader
        self.epoch = epoch
        self.first = first
        self.num_chunks = num_chunks
        self.received = first
        self.finished = first >= num_chunks
        self._abandoned = False

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Chunk:
        if self._abandoned or self.finished:
            # The epoch's clock stops here, not at the last chunk's hand-out, so the
            # training on that chunk counts (epoch_ended is idempotent).
            self._loader.stats.epoch_ended()
            raise StopIteration
        try:
            chunk = self._loader._next_chunk(self)
        except (EndOfJobs, StageClosed):
            self.finished = True
            self._loader.stats.epoch_ended()
            raise StopIteration from None
        self.received += 1
        if self.received >= self.num_chunks:
            self.finished = True  # state_dict() now points at the next epoch
        return chunk

    def abandon(self) -> None:
        self._abandoned = True
        self._loader.stats.epoch_ended()

    def __len__(self) -> int:
        return self.num_chunks - self.first
