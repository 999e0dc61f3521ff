"""A shuffle buffer of chunks: each batch drawn over the windows of the last ``mix`` chunks.

Batches drawn inside one chunk all come from the same few stretches of the
recording, so ``batches_per_chunk`` consecutive gradient steps are correlated
however the chunk was made. A :class:`ChunkMixer` holds the last ``mix`` chunks
of an epoch and draws every batch uniformly over the valid window starts of all
of them (never across a piece or a chunk), the consumer-side counterpart of the
shuffle buffers of Grain, torchdata and MosaicML Streaming.

The stream runs as *events*, one per chunk (:meth:`ChunkMixer.events`): when
chunk ``e`` arrives it joins the buffer (evicting the oldest when ``mix`` are
held) and its share of batches is drawn over the held chunks, the last ``mix``
to arrive. With ``keep=True`` (what :class:`~chunkstream.BatchStream` and the
reference trainer use) the held chunks stay held when the next epoch starts,
so an epoch's first chunks mix with the previous epoch's last ones instead of
feeding their batches alone; in steady state every chunk is then held for
``mix`` events and feeds about its own share of batches over its life. Without
``keep`` the buffer starts empty each epoch. With ``mix=1`` an event is one
chunk, as without a mixer (nothing is kept: the held chunk is the loader's).
What event ``e`` draws is a pure function of the seed, the epoch, ``e`` and
the batch number, and the held chunks are the loader's chunks: so the state to
resume at an event is the loader's state before the oldest held chunk (which
may lie in an earlier epoch), the number of held chunks to re-read silently
(``refill``, at most ``mix - 1``) and the batches drawn; nothing else is saved.
Each chunk is held with the loader's state before it, and each :class:`Event`
(:meth:`ChunkMixer.run`) carries the two states that resume inside it and right
after it, made when the chunk joined: the state travels with the element.
:meth:`ChunkMixer.refill_across` re-reads the part of a refill that lies in
earlier epochs, :meth:`ChunkMixer.run` the rest.

Memory: with ``mix > 1`` the mixer copies each chunk's fields into storage it
owns, ``mix * rows`` timesteps per field, where its ``tier``
(:mod:`chunkstream.consumer._shuffle`) says: on the chunk's device (device
memory on CUDA), or for the host tier in one arena of host memory made at the
first chunk and filled by the loader's batch readers (the refill,
:mod:`chunkstream.pipeline._lane`). It drops the loader's chunk at once,
so the loader's buffers (its pinned or host arena, its device chunks) are never
held by the mixer and its own memory bounds are unchanged. On a device the copy
is one ``copy_`` per field per chunk, queued on the current stream after the
chunk's ready event. With ``mix=1`` the chunk itself is held (no copy), as a
plain loop would.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, NamedTuple

import torch

from .._errors import ConfigError
from .._memory import check_mix
from ..pipeline import Chunk, TimeTable
from ._sampling import check_align, gather_windows, local_pieces, piece_starts
from ._shuffle import BufferTier, DeviceTier

__all__ = ["ChunkMixer", "Event"]

Point = tuple[object, int]  # (loader state before the oldest chunk to re-read, how many)


class Event(NamedTuple):
    """One chunk's event: the chunk, now held, and the resume points made with it.

    ``at``: resume inside this event (its batches still being drawn); ``after``:
    resume at the next one. Each is ``(loader state, refill)``: load the state, then
    re-read ``refill`` chunks silently (``run(refill=)``) to hold again what the
    event's batches (or the next event's) are drawn over.
    """

    chunk: Chunk
    at: Point
    after: Point


class ChunkMixer:
    """Holds up to ``mix`` chunks and draws batches over all of their valid window starts.

    ``rows`` is the loader's chunk length (``loader.rows``), the most a chunk
    may hold; ``fields`` the fields kept (``None``: every field of the first
    chunk); ``align`` keeps only window starts at timesteps that are multiples
    of it (see :func:`~chunkstream.sample_windows`). Not thread-safe: one consumer loop owns it. The held chunks are
    :class:`~chunkstream.Chunk` objects with the loader's metadata (``epoch``,
    ``index``, ``pieces``) whose tensors are the mixer's copies (``mix > 1``).
    """

    def __init__(
        self,
        mix: int,
        *,
        window: int,
        rows: int,
        fields: Sequence[str] | None = None,
        align: int = 1,
        tier: BufferTier | None = None,
    ) -> None:
        self.mix = check_mix(mix)
        # Where the storage lives and how rows are copied into it (default: the chunks'
        # device); see chunkstream.consumer._shuffle.
        self.tier: BufferTier = DeviceTier() if tier is None else tier
        self.window = int(window)
        self.align = check_align(align)
        self.rows = int(rows)
        self.fields = None if fields is None else tuple(fields)
        self._storage: dict[str, torch.Tensor] = {}
        # Oldest first: (slot, held chunk, its starts in the storage, loader state before it).
        self._held: deque[tuple[int, Chunk, torch.Tensor, object]] = deque()
        self._arrivals = 0
        self._union: torch.Tensor | None = None
        self._times: TimeTable | None = None
        self._last: Event | None = None  # the event last yielded, with its resume points

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held(self) -> tuple[Chunk, ...]:
        """The held chunks, oldest first."""
        return tuple(h[1] for h in self._held)

    @property
    def nbytes(self) -> int:
        """Bytes of the mixer's own storage (0 with ``mix=1``)."""
        return sum(t.numel() * t.element_size() for t in self._storage.values())

    def clear(self) -> None:
        """Drop every held chunk (the storage is kept for the next epoch)."""
        self._held.clear()
        self._union = None
        self._times = None
        self._last = None

    def add(self, chunk: Chunk, before: object = None) -> Chunk:
        """Hold ``chunk`` (a copy when ``mix > 1``); ``before`` is the loader state before it."""
        if len(self._held) >= self.mix:
            raise ConfigError.bad(
                "chunk",
                f"chunk {chunk.index}",
                f"at most mix={self.mix} held chunks",
                "Evict the oldest (pop()) before adding another.",
            )
        if chunk.length > self.rows:
            raise ConfigError.bad(
                "chunk",
                f"a chunk of {chunk.length} timesteps",
                f"at most rows={self.rows}",
                "Build the mixer with rows=loader.rows.",
            )
        slot = self._arrivals % self.mix
        self._arrivals += 1
        starts = piece_starts(local_pieces(chunk), self.window, chunk.device, align=self.align)
        if self.mix == 1:
            held = chunk
        else:
            chunk.use_on()  # the copy below runs on the current stream
            names = self.fields if self.fields is not None else tuple(chunk)
            if not self._storage:
                self._storage = self.tier.store({n: chunk[n] for n in names}, self.mix * self.rows)
            tensors = {}
            for name in names:
                view = self._storage[name][slot * self.rows : slot * self.rows + chunk.length]
                self.tier.copy_rows(view, chunk[name])
                tensors[name] = view
            held = Chunk(
                tensors,
                start=chunk.start,
                stop=chunk.stop,
                epoch=chunk.epoch,
                index=chunk.index,
                pieces=chunk.pieces,
                offsets=chunk.offsets,
            )
            starts = starts + slot * self.rows
        self._held.append((slot, held, starts, before))
        self._union = None
        self._times = None
        return held

    def pop(self) -> Chunk:
        """Evict and return the oldest held chunk."""
        self._union = None
        self._times = None
        return self._held.popleft()[1]

    def starts(self) -> torch.Tensor:
        """Every valid window start of the held chunks, as rows of :meth:`field`'s tensors."""
        if self._union is None:
            if not self._held:
                raise ConfigError.bad("mixer", "empty", "at least one held chunk", "add() first.")
            self._union = torch.cat([h[2] for h in self._held])
        return self._union

    def times(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, recording)`` of the windows at ``rows`` (from :meth:`sample`): each
        window's first timestep in its own recording and that recording's index, int64
        on ``rows``' device (:func:`~chunkstream.pipeline._times.window_times`)."""
        if self._times is None:
            if not self._held:
                raise ConfigError.bad("mixer", "empty", "at least one held chunk", "add() first.")
            base = self.rows if self.mix > 1 else 0
            held = [(slot * base, chunk.pieces) for slot, chunk, _, _ in self._held]
            self._times = TimeTable(held, self._held[0][1].offsets, self._held[0][2].device)
        return self._times(rows)

    def field(self, name: str) -> torch.Tensor:
        """The tensor the starts index: the mixer's storage, or the single held chunk's field."""
        if self.mix == 1:
            return self._held[0][1][name]
        return self._storage[name]

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``batch_size`` starts uniform (with replacement) over all held chunks' windows."""
        table = self.starts()
        # A CPU generator draws on the host whatever the table's device, so that both
        # buffer tiers draw the same windows for the same seed (BatchStream's case).
        where = table.device if generator is None else generator.device
        idx = torch.randint(0, int(table.numel()), (batch_size,), generator=generator, device=where)
        if idx.device != table.device:
            idx = idx.pin_memory().to(table.device, non_blocking=True)
        return table[idx]

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Per field, the tensor :meth:`sample`'s starts index (see :meth:`field`)."""
        if self.mix == 1:
            return dict(self._held[0][1])
        return self._storage

    def gather(self, name: str, starts: torch.Tensor, dtype: torch.dtype | None = None):
        """The windows at ``starts`` (from :meth:`sample`) of field ``name``."""
        return gather_windows(self.field(name), starts, self.window, dtype=dtype)

    def run(
        self,
        chunks: Iterator[Chunk],
        state: Callable[[], object] | None = None,
        *,
        refill: int = 0,
        keep: bool = False,
    ) -> Iterator[Event]:
        """Run one epoch as events (module docs): yields each chunk's :class:`Event` once
        the chunk is held.

        While the consumer handles an event, the buffer holds its chunk and up to
        ``mix - 1`` chunks before it; ``state()`` (the loader's state) is called
        before and after each chunk is read, and the event carries the resume
        points made from them. The first ``refill`` chunks are only held, not
        yielded: they refill the buffer after a resume. ``keep=True`` (with
        ``mix > 1``) starts from the chunks held when the previous run ended and
        keeps them when this one runs to its end; without ``keep`` the run starts
        empty and empties the buffer at its end. A run closed early leaves the
        buffer as it was: its caller says what happens to it.
        """
        keep = keep and self.mix > 1
        if not keep:
            self.clear()
        while True:
            before = state() if state is not None else None
            chunk = next(chunks, None)
            if chunk is None:
                if not keep:
                    self.clear()
                return
            if len(self._held) == self.mix:
                self.pop()
            self.add(chunk, before)
            del chunk  # the loader may reuse its buffer (a copy is held when mix > 1)
            if refill > 0:
                refill -= 1
                continue
            self._last = self._event(state() if state is not None else None)
            yield self._last

    def _event(self, read: object) -> Event:
        """The newest held chunk's event; ``read`` is the loader's state after it."""
        held = list(self._held)
        after = held[1:] if len(held) == self.mix else held  # the oldest goes next
        return Event(
            held[-1][1],
            at=(held[0][3], len(held) - 1),
            after=(after[0][3], len(after)) if after else (read, 0),
        )

    def events(
        self,
        chunks: Iterator[Chunk],
        state: Callable[[], object] | None = None,
        *,
        refill: int = 0,
        keep: bool = False,
    ) -> Iterator[Chunk]:
        """:meth:`run`, yielding the chunks alone (:meth:`resume_point` has their points)."""
        for event in self.run(chunks, state, refill=refill, keep=keep):
            yield event.chunk

    def refill_across(
        self, loader: Any, state: Mapping[str, int] | None, refill: int, num_chunks: int
    ) -> int:
        """Re-read the part of a refill that lies in earlier epochs; returns the rest.

        Call it after ``loader.load_state_dict(state)``, ``state`` and ``refill``
        from :meth:`resume_point` of a run with ``keep=True``, and before the
        next ``loader.epoch``: while the refill reaches past the end of the
        loaded state's epoch, the rest of that epoch (then whole epochs of
        ``num_chunks`` chunks) is read into the buffer silently. The returned
        count is the ``refill`` for the next epoch's :meth:`events`
        (``keep=True``). Exact at the world size the state was saved with.
        """
        if not state or refill <= 0 or not int(state.get("num_chunks", 0)):
            return refill
        left = int(state["num_chunks"]) - int(state.get("step", 0))
        while 0 < left <= refill:
            chunks = islice(loader.epoch(num_chunks), left)
            for _ in self.events(chunks, loader.state_dict, refill=left, keep=True):
                pass  # nothing is yielded: every chunk of the run refills
            refill -= left
            left = num_chunks
        return refill

    def resume_point(self, *, done: bool) -> Point:
        """The last event's resume point: inside it (``done=False``) or after it
        (``done=True``); ``(None, 0)`` before any event. See :class:`Event`."""
        if self._last is None:
            return None, 0
        return self._last.after if done else self._last.at
