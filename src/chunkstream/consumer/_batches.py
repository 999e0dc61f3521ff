"""``BatchStream``: a loader's chunks as one iterable of device batches per epoch.

For loops that want batches, not chunks (a Lightning ``train_dataloader``, a
plain ``for batch in stream``): each ``iter(stream)`` runs one epoch of the
:class:`~chunkstream.ChunkLoader` and yields ``batches_per_epoch`` batches of
``batch_size`` windows, ``batches_per_chunk`` from each chunk (the last chunk
of an epoch gives only what is left), on the chunk's device
(:func:`sample_windows` + :func:`gather_windows`; in a pieced chunk, only
windows inside one piece; with ``align``, only windows starting on its grid).
With a plan, an epoch is the plan's ``batches_per_epoch``: one pass over the
data counted in batches, which is up to one chunk more than the chunk loop's
``chunks_per_epoch * batches_per_chunk``.

Resume is exact because nothing is hidden RNG state: batch ``b`` of the chunk
at position ``index`` of ``epoch`` has starts drawn from a generator seeded with
a hash of ``(seed, epoch, index, b, rank)``. Each batch travels with the state
that resumes right after it, made when its starts were drawn, and
:meth:`BatchStream.state_dict` is the state of the last batch handed out
(Grain's ``(element, state)``; no counter is kept beside the batches). That
state is the loader's state
as it was *before* the current chunk, plus how many of that chunk's batches
were handed out; loading it re-delivers that chunk and skips those batches.
With ``mix > 1`` the state's loader state is the one before the oldest chunk
held with the current one, and ``refill`` counts the held chunks before the
current one: loading the state re-reads them into the buffer (drawing
nothing) before the current chunk's batches, so the buffer holds what it held
when the state was saved (see :mod:`chunkstream.consumer._mixing`). The held
chunks stay held from one epoch to the next, so that loader state may lie in
an earlier epoch; the re-read then runs the rest of that epoch first.
"Handed out" means yielded: a consumer that fetches ahead of what it trains on
must save the state of what it trained on. Lightning 2.x does not fetch ahead
for a loader with ``__len__`` (its prefetching is only for unsized iterables),
so the state it saves with a checkpoint is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from .._device import resolve_device
from .._errors import ConfigError, check_int
from .._executor import Cancelled
from .._memory import choose_tier, host_tier_hint, stream_buffer, stream_held
from .._options import check_moved, check_options
from .._resume import check_stream_state
from ..pipeline import (
    RECORDING_KEY,
    START_KEY,
    BatchLane,
    Chunk,
    ChunkLoader,
    Request,
    check_gather_threads,
    compute_dtype,
)
from ..plans import M64, EpochPlan, Uneven, hash_words, seed_key
from ..sources import Recordings, Source, decode_scratch_nbytes
from ._mixing import ChunkMixer, Event
from ._options import StreamOptions
from ._owned import owned_loader
from ._sampling import check_align
from ._settings import check_window, choose_fields, epoch_length, plan_defaults
from ._shuffle import BufferTier, DeviceTier, HostTier

__all__ = ["BatchStream"]

_log = logging.getLogger(__name__)

_TAG_BATCH = 0xBA7C_0000_0000_0001  # keeps batch seeds apart from the plans' hashes

Batch = torch.Tensor | dict[str, torch.Tensor]


class BatchStream:
    """Batches of windows drawn inside each chunk of ``loader``; one epoch per ``iter()``.

    Parameters
    ----------
    loader:
        A source (:class:`~chunkstream.sources.Source`): the stream builds and owns
        the :class:`~chunkstream.ChunkLoader` its tier needs (chunk size, plan and
        device by the defaults' policy, :mod:`chunkstream.consumer._owned`; with
        ``plan=``, the plan's) and closes it with :meth:`close` or at the end of a
        ``with`` block. Or a :class:`~chunkstream.ChunkLoader` to draw chunks from;
        the stream starts its epochs (``loader.epoch``), so use the loader through
        the stream only, and closing stays the loader's.
    window:
        Timesteps per sample (``time_units * evolve_multiple_steps``), at most
        the loader's chunk length.
    batch_size, batches_per_chunk:
        Windows per batch, batches drawn from each chunk; ``None`` takes the
        plan's (``plan=``, a :func:`~chunkstream.plan_epoch` result).
    fields:
        ``None``: every field, each batch a dict ``{name: (batch_size, window,
        *field_shape)}``; a list of names: a dict of those; one name: that
        field's tensor alone.
    mix:
        Chunks held and mixed per batch (a shuffle buffer of chunks,
        :class:`~chunkstream.consumer.ChunkMixer`): each batch's windows are
        drawn uniformly over every valid start of the last ``mix`` chunks
        (never across a piece), so consecutive batches are no longer drawn
        from one chunk; each chunk still feeds ``batches_per_chunk`` batches.
        Memory: ``mix`` chunks of the chosen fields copied into storage the
        stream owns, where ``buffer`` says; the loader's own buffers are
        released as before. ``"auto"`` sizes it for the tier
        (:mod:`chunkstream._memory._defaults`: on the host tier half of what
        this rank's part of the job's memory leaves beside the loader, cgroup
        limits and the job's ranks on the node included, up to the whole split;
        :attr:`buffer` says what was chosen, from what memory, and why). The
        held chunks stay held when the next epoch starts (an epoch's first
        batches mix with the previous epoch's last chunks), except after an
        epoch's iterator was closed early. ``None`` (the default) is
        ``"auto"``, or ``1`` for a source whose fields are known only after its
        first read. ``1`` draws each batch from one chunk, without a copy (the
        original's behaviour). An int larger than the chunks of one pass is
        refused.
    buffer, device:
        Where the shuffle buffer lives (:mod:`chunkstream._memory._buffer`) and
        where batches go (``None``: the loader's device). ``"device"``: on the
        loader's device, batches gathered there. ``"host"``: in one host arena,
        each batch gathered on the host into a few reused slots and, with
        ``device="cuda"``, copied there from page-locked memory on a transfer
        stream (the device holds only the batches in flight); needs a loader on
        the CPU. ``"auto"``: host with a CPU loader, device with a CUDA one.
        Both tiers draw the same windows for the same seed and share one
        ``state_dict``.
    loader_options:
        With a source: keywords for the loader the stream builds (``chunk_size``,
        ``sampling``, ``seed``, ``align``, ``prefetch``, ``workers``, ``options=``
        a :class:`~chunkstream.LoaderOptions`).
    options:
        A :class:`~chunkstream.StreamOptions` with the less common settings: the
        epoch's length in chunks or batches, the batch seed, the compute dtype,
        the window grid (``align``), the host tier's budget, prefetch depth and
        gather threads (each described there).

    Notes
    -----
    ``len(stream)`` is ``batches_per_epoch``, the batches of a whole epoch
    (``plan.batches_per_epoch`` on one rank); the epoch reads
    ``chunks_per_epoch`` chunks. An epoch resumed from a mid-epoch state
    yields only its remaining batches.

    Batches are gathered copies, so holding one never pins a chunk; the chunk
    itself is released once its last batch was drawn. On the host tier on the
    CPU a batch is a view of a reused slot, refilled only once no tensor refers
    to it (never while the user holds the batch).
    Iterating again, also mid-epoch, starts the next epoch (the rest of the
    old one is abandoned, as with ``loader.epoch``).

    Ending an epoch early: once the epoch's iterator is *closed* (its
    ``close()``, or, in CPython, at once when a ``break`` leaves
    ``for batch in stream``), the epoch counts as over, and :meth:`state_dict`
    points at the next epoch, which is what this stream's next ``iter()`` would
    start. A state saved while the iterator is still held (inside the loop, or
    by a trainer that keeps it until the next epoch, such as Lightning's
    ``limit_train_batches``) resumes inside the epoch, at the next batch: give
    such a trainer the epoch length it will use (``batches_per_epoch=`` the
    limit), so that its epoch and the stream's end together.
    """

    def __init__(
        self,
        loader: ChunkLoader | Source,
        *,
        window: int,
        batch_size: int | None = None,
        batches_per_chunk: int | None = None,
        plan: EpochPlan | None = None,
        mix: int | str | None = None,
        buffer: str = "auto",
        device: str | torch.device | None = None,
        fields: str | Sequence[str] | None = None,
        options: StreamOptions | None = None,
        loader_options: Mapping[str, Any] | None = None,
        **moved: object,
    ) -> None:
        options = check_moved("BatchStream", StreamOptions, moved, options)
        #: The loader this stream built from a source and closes (``None``: the user's).
        self._owns: ChunkLoader | None = None
        if isinstance(loader, Source) and not isinstance(loader, ChunkLoader):
            loader, plan = owned_loader(
                loader,
                window=window,
                batch_size=batch_size,
                device=device,
                buffer=buffer,
                mix=mix,
                fields=fields,
                options=options,
                plan=plan,
                loader_options=loader_options,
            )
            self._owns = loader
        elif loader_options is not None:
            raise ConfigError.bad(
                "loader_options",
                "given with a loader",
                "None when the stream is built from a cs.ChunkLoader",
                "Pass the source instead (the stream then builds its loader), or build the "
                "loader with those settings.",
            )
        try:
            self._init(
                loader,
                window,
                batch_size,
                batches_per_chunk,
                plan,
                mix,
                buffer,
                device,
                fields,
                options,
            )
        except BaseException:
            self.close()
            raise

    def _init(
        self,
        loader: ChunkLoader,
        window: int,
        batch_size: int | None,
        batches_per_chunk: int | None,
        plan: EpochPlan | None,
        mix: int | str | None,
        buffer: str,
        device: str | torch.device | None,
        fields: str | Sequence[str] | None,
        options: StreamOptions | None,
    ) -> None:
        self.options = o = check_options(options, StreamOptions, "batches_per_epoch=100")
        chunks_per_epoch, batches_per_epoch = o.chunks_per_epoch, o.batches_per_epoch
        seed, dtype, align = o.seed, o.dtype, o.align
        host_memory, batch_prefetch = o.host_memory, o.batch_prefetch
        if not isinstance(loader, ChunkLoader):
            raise ConfigError.bad(
                "loader",
                type(loader).__name__,
                "a source (cs.ZarrSource, cs.NumpySource, ...) or a cs.ChunkLoader",
                "Pass the source (the stream builds its loader), or build one with "
                "cs.ChunkLoader(source, chunk_size, ...) and pass it.",
            )
        if plan is not None:
            batch_size, batches_per_chunk, batches_per_epoch = plan_defaults(
                plan, batch_size, batches_per_chunk, chunks_per_epoch, batches_per_epoch
            )
        self.loader = loader
        self.window = check_window(loader, window)
        self.batch_size = check_int(
            "batch_size",
            batch_size,
            minimum=1,
            fix="Pass the windows per batch (or plan=cs.plan_epoch(...)).",
        )
        self.batches_per_chunk = check_int(
            "batches_per_chunk",
            batches_per_chunk,
            minimum=1,
            fix="Pass how many batches each chunk feeds (plan.batches_per_chunk).",
        )
        self.chunks_per_epoch, self.batches_per_epoch = epoch_length(
            loader, self.batches_per_chunk, chunks_per_epoch, batches_per_epoch
        )
        self.fields: tuple[str, ...] = choose_fields(loader.source, fields)
        self._single = isinstance(fields, str)
        # What a dict batch carries beside its fields (pipeline/_times.py).
        self._recordings = isinstance(loader.source, Recordings)
        if seed is None:
            seed = loader.plan.seed
        self.seed = check_int(
            "seed", seed, minimum=0, fix="Pass a non-negative seed, or None for the loader's."
        )
        self._key = seed_key(self.seed)
        compute_dtype(dtype, torch.float32)  # refuse a bad dtype now, not at the first batch
        self.dtype = dtype
        self.align = check_align(align)
        self.device = loader.device if device is None else resolve_device(device)
        tier, why = choose_tier(buffer, self.device, loader_device=loader.device)
        self.batch_prefetch = check_int(
            "batch_prefetch",
            batch_prefetch,
            minimum=0,
            fix="Pass how many batches the host tier gathers ahead (0: none).",
        )
        threads = check_gather_threads(o.gather_threads)
        if host_memory is not None:
            check_int(
                "host_memory",
                host_memory,
                minimum=1,
                fix="Pass a budget in bytes for the host tier's buffer, or None.",
            )
        # The batch lane's sets and the decode scratch, counted before the buffer is sized.
        held = stream_held(
            loader.source.fields or {},
            self.fields,
            batch_size=self.batch_size,
            window=self.window,
            batch_prefetch=self.batch_prefetch,
            cuda=self.device.type == "cuda",
            dtype=self.dtype,
            decode_scratch=decode_scratch_nbytes(loader.source),
            lane=tier == "host" or loader.device.type == "cpu",
        )
        #: The shuffle buffer: tier, chunks, bytes, share of the split, pieces per batch, why.
        self.buffer = stream_buffer(
            loader,
            self.fields,
            mix=mix,
            tier=tier,
            why=why,
            device=self.device,
            host_memory=host_memory,
            held=held,
        )
        self.mix = self.buffer.mix
        _log.info("%s", self.buffer.describe())
        if self.buffer.note and self.mix > 1:
            _log.info("%s", self.buffer.note)
        if mix in (None, "auto") and tier == "device" and self.device.type == "cuda":
            _log.info("%s", host_tier_hint(self.buffer, self.device))
        # The shuffle buffer's tier, chosen once (chunkstream.consumer._shuffle). Host
        # storage is read by the loader's own batch lane (chunkstream.pipeline._lane).
        lane = BatchLane(
            loader,
            self.fields,
            window=self.window,
            batch_size=self.batch_size,
            device=self.device,
            depth=self.batch_prefetch,
            threads=threads,
            dtype=self.dtype,
        )
        self._tier: BufferTier
        if tier == "host":
            self._tier = HostTier(lane)
        else:
            on_host = loader.device.type == "cpu"
            self._tier = DeviceTier(
                self.fields, window=self.window, dtype=self.dtype, lane=lane if on_host else None
            )
        self._mixer = ChunkMixer(
            self.mix,
            window=self.window,
            rows=loader.rows,
            fields=self.fields,
            align=self.align,
            tier=self._tier,
        )
        # Drawn on the host for both tiers: the same windows for the same seed on each.
        self._generator = torch.Generator()
        # The current run (one per iter(), or the one load_state_dict prepared) and the
        # state of the last batch it delivered (see _Run).
        self._run = _Run(None)

    def close(self) -> None:
        """Close the loader this stream built from a source (joined within its deadline);
        idempotent, safe from a signal handler. A stream built from a loader leaves it
        open: closing stays the loader's."""
        owned = getattr(self, "_owns", None)
        if owned is not None:
            owned.close()

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Batches per epoch: ``batches_per_epoch``."""
        return self.batches_per_epoch

    def _batches_in(self, index: int) -> int:
        """Batches drawn from the epoch's chunk at ``index``: the last one feeds the rest."""
        return min(self.batches_per_chunk, self.batches_per_epoch - index * self.batches_per_chunk)

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of batches (the rest of an interrupted one after :meth:`load_state_dict`)."""
        return self._epoch()

    def _epoch(self) -> Iterator[Batch]:
        # A generator: nothing starts before the first next(), so a consumer may call
        # iter() and then load_state_dict() (Lightning does) and still resume.
        run = self._claim_run()
        try:
            yield from self._batches(run)
        except Cancelled:
            return  # a newer iteration or a load_state_dict took over
        except GeneratorExit:  # closed early (close(), or collected after a break)
            if not run.dropped:  # the epoch is over: resume at the next one, buffer empty
                run.state = _stream_state(self._next_epoch_state(), 0, 0)
                self._mixer.clear()
            raise

    def _claim_run(self) -> _Run:
        """The run this iteration drives: the one prepared (at construction or by
        :meth:`load_state_dict`), or a new one that takes over from the run in progress."""
        run = self._run
        if run.started:
            run = _Run(run.state)
            old, self._run = self._run, run
            old.dropped = True  # the old iteration stops at its next batch
        run.started = True
        return run

    def _next_epoch_state(self) -> dict[str, int]:
        """The loader's state as it would be had the current epoch run to its end."""
        state = self.loader.state_dict()
        if state["num_chunks"]:  # the epoch is still in progress in the loader
            state.update(epoch=state["epoch"] + 1, step=0, num_chunks=0, consumed=0, total=0)
        return state

    def _batches(self, run: _Run) -> Iterator[Batch]:
        loader, mixer = self.loader, self._mixer
        skip = refill = 0
        if run.resume is not None:
            loaded, skip, refill = run.resume
            # Again here, in the consumer's thread: a dropped run may have read on since
            # load_state_dict() (from a signal handler, say) positioned the loader.
            loader.load_state_dict(loaded, uneven=run.uneven)
            mixer.clear()  # the refill puts back what the saved run held
            # The held chunks of earlier epochs are re-read first.
            refill = mixer.refill_across(loader, loaded, refill, self.chunks_per_epoch)
        if run.state is None:  # the first run: its position until a batch is handed out
            run.state = _stream_state(loader.state_dict(), 0, 0)
        run.check()
        chunks = loader.epoch(self.chunks_per_epoch)
        # One event per chunk (ChunkMixer.run): its batches are drawn over it and the up
        # to mix - 1 chunks before it, kept across epochs; after a resume the first
        # `refill` chunks only refill the buffer.
        for event in mixer.run(chunks, loader.state_dict, refill=refill, keep=True):
            run.check()
            requests = self._requests(event, skip, self._batches_in(event.chunk.index))
            for tensors, state in self._tier.batches(mixer.storage, requests):
                run.check()
                batch = tensors[self.fields[0]] if self._single else tensors
                run.state = state  # delivered: the state that resumes right after it
                yield batch
                del batch
            skip = 0
            del event  # let the loader reuse its buffer while the next one arrives

    def _requests(self, event: Event, first: int, count: int) -> list[Request]:
        """Batches ``first..count-1`` of ``event``: starts, and the state after each.

        A list, drawn at once (each draw is a pure function of the seed): no suspended
        generator is left for the garbage collector to close, where a signal handler's
        exception could only be ignored."""
        requests = []
        for b in range(first, count):
            if b + 1 < count:
                (loader_state, refill), batch = event.at, b + 1
            else:  # the event is done: resume at the next one (maybe the next epoch's)
                (loader_state, refill), batch = event.after, 0
            starts = self._starts(event.chunk, b)
            state = _stream_state(loader_state, batch, refill)
            requests.append(Request(starts, state, None if self._single else self._times(starts)))
        return requests

    def _times(self, starts: torch.Tensor) -> dict[str, torch.Tensor]:
        """A dict batch's ``"start"`` (and, for a Recordings, ``"recording"``) per window."""
        start, recording = self._mixer.times(starts)
        if self._recordings:
            return {START_KEY: start, RECORDING_KEY: recording}
        return {START_KEY: start}

    def _starts(self, chunk: Chunk, b: int) -> torch.Tensor:
        """Batch ``b`` of ``chunk``'s event: its window starts, a pure function of the seed."""
        key = hash_words(self._key, _TAG_BATCH, chunk.epoch, chunk.index, b, self.loader.rank)
        self._generator.manual_seed(key & M64)
        return self._mixer.sample(self.batch_size, self._generator)

    # -- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, object]:
        """``{"loader": <ChunkLoader state>, "batch": k, "refill": r, ...}``: a few integers.

        The state that resumes right after the last batch handed out, which
        travelled with that batch. Mid-chunk, ``loader`` is the state before that
        chunk and ``batch`` the batches of it already handed out; between chunks
        ``batch`` is 0. With ``mix > 1``, ``loader`` is the state before the oldest
        chunk the current (or next) chunk's batches mix with, and ``refill`` the
        chunks before the current one to re-read into the buffer on resume. After
        the epoch's iterator was closed early, the next epoch's start (see the
        class notes). Safe from a signal handler and from any thread: it reads
        one reference, never waits.
        """
        state = self._run.state
        if state is None:  # nothing handed out or loaded yet: the loader's own position
            state = _stream_state(self.loader.state_dict(), 0, 0)
        loader_state, batch, refill = state
        return {
            "loader": dict(loader_state),  # type: ignore[call-overload]
            "batch": batch,
            "refill": refill,
            "batches_per_chunk": self.batches_per_chunk,
            "seed": self.seed,
            "align": self.align,
        }

    def load_state_dict(self, state: Mapping[str, object], *, uneven: Uneven = "exact") -> None:
        """Resume: the next ``iter()`` yields the interrupted epoch's remaining batches.

        Safe from a signal handler and from any thread: it checks ``state``,
        positions the loader, and swaps in a new run holding it; an iteration in
        progress stops at its next batch, and the buffer is refilled by the next
        iteration, in the consumer's thread. ``uneven`` is the loader's
        (:meth:`ChunkLoader.load_state_dict`): how a state saved under another
        world size splits the rest of its epoch.
        """
        loader_state, batch, refill = check_stream_state(
            state,
            batches_per_chunk=self.batches_per_chunk,
            mix=self.mix,
            seed=self.seed,
            align=self.align,
        )
        self.loader.load_state_dict(loader_state, uneven=uneven)  # type: ignore[arg-type]
        loaded = _stream_state(dict(loader_state), batch, refill)  # type: ignore[call-overload]
        run = _Run(loaded, resume=loaded, uneven=uneven)
        old, self._run = self._run, run  # one reference: state_dict() sees old or new
        old.dropped = True  # an iteration in progress stops at its next batch

    def __repr__(self) -> str:
        return (
            f"BatchStream(window={self.window}, batch_size={self.batch_size}, "
            f"batches_per_chunk={self.batches_per_chunk}, "
            f"batches_per_epoch={self.batches_per_epoch}, "
            f"chunks_per_epoch={self.chunks_per_epoch}, fields={list(self.fields)}, "
            f"mix={self.mix}, align={self.align}, buffer={self.buffer.tier!r}, "
            f"device={self.device})"
        )


def _stream_state(loader_state: object, batch: int, refill: int) -> tuple[object, int, int]:
    """A stream state as it travels with a batch: never mutated once made, so a reader
    in a signal handler or another thread always sees a whole one."""
    return (loader_state, int(batch), int(refill))


class _Run:
    """One iteration of a :class:`BatchStream` (an epoch, or the rest of one), as the
    loader's :class:`~chunkstream.pipeline._run.EpochRun` is one of the loader.

    ``state``: the state that resumes right after the last batch this run handed
    out (``None``: the loader's own); ``resume``: where it starts, after
    :meth:`BatchStream.load_state_dict`, with the loader's ``uneven`` for it;
    ``dropped``: a newer run took over, so this
    one stops at its next batch (:meth:`check` raises
    :class:`~chunkstream._executor.Cancelled`) and leaves the buffer alone.
    """

    __slots__ = ("dropped", "resume", "started", "state", "uneven")

    def __init__(
        self, state: tuple | None, resume: tuple | None = None, uneven: Uneven = "exact"
    ) -> None:
        self.state = state
        self.resume = resume
        self.uneven = uneven
        self.started = False
        self.dropped = False

    def check(self) -> None:
        if self.dropped:
            raise Cancelled("a newer iteration of this BatchStream took over")
