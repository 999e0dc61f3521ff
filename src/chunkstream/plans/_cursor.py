"""Where a loader is in its epochs: each rank's share of an epoch, and the cursor.

Pure bookkeeping, no threads, no buffers. :func:`epoch_share` splits what is
left of an epoch's global window indices over the ranks (the rule and the
``uneven`` policies are in :mod:`chunkstream.distributed`, which exports it);
an :class:`EpochCursor` answers which windows the next ``epoch()`` call yields
on this rank, and which state describes the position now, from a few integers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .._errors import ConfigError, check_int
from ._plan import Piece, Plan
from ._windows import remaining_indices

__all__ = ["EpochCursor", "EpochShare", "EpochSpan", "Position", "Uneven", "epoch_share"]

Uneven = Literal["exact", "pad", "drop"]
_UNEVEN = ("exact", "pad", "drop")


@dataclass(frozen=True, kw_only=True)
class EpochShare:
    """One rank's part of one epoch.

    ``indices`` are the global window indices this rank visits, in order;
    ``consumed`` and ``total`` the epoch's global windows delivered before the
    share starts and in all (``total`` as given, before any padding or dropping).
    """

    epoch: int
    consumed: int
    total: int
    rank: int
    world_size: int
    indices: range

    @property
    def first_step(self) -> int:
        """The per-rank step of the share's first window (``consumed // world_size``)."""
        return self.consumed // self.world_size

    def consumed_after(self, received: int) -> int:
        """Global windows delivered once every rank has received ``received`` of its share.

        This is what a checkpoint records: it is the same on every rank that has
        received the same count, and it is a valid ``consumed`` for any world size.
        """
        return min(self.total, self.consumed + received * self.world_size)


def epoch_share(
    *,
    epoch: int,
    consumed: int,
    total: int,
    rank: int,
    world_size: int,
    uneven: Uneven = "exact",
) -> EpochShare:
    """The global indices ``rank`` of ``world_size`` visits in what is left of an epoch.

    ``consumed`` windows of the epoch's ``total`` were delivered across all ranks
    (by any world size); see the module docs for ``uneven``.
    """
    if uneven not in _UNEVEN:
        raise ConfigError.bad(
            "uneven", uneven, f"one of {_UNEVEN}", "'exact' repeats and skips nothing."
        )
    exact = remaining_indices(consumed, total, rank, world_size)
    remainder = (total - consumed) % world_size
    end = total
    if uneven == "pad" and remainder:
        end = total + world_size - remainder
    elif uneven == "drop":
        end = total - remainder
    indices = range(exact.start, end, world_size) if exact.start < end else range(0)
    return EpochShare(
        epoch=epoch,
        consumed=consumed,
        total=total,
        rank=rank,
        world_size=world_size,
        indices=indices,
    )


@dataclass(eq=False)
class EpochSpan:
    """One started epoch on this rank: steps ``[first, stop)`` and their chunks' pieces.

    ``received`` is the step after the last chunk the consumer received;
    ``dropped`` turns true when the next epoch starts or the loader closes.
    """

    epoch: int
    share: EpochShare
    windows: list[tuple[Piece, ...]]
    first: int
    stop: int
    received: int
    dropped: bool = False

    @property
    def finished(self) -> bool:
        return self.received >= self.stop


@dataclass(frozen=True, eq=False)
class Position:
    """Where a cursor is, as one immutable value (published by one assignment, so a
    control call from a signal handler or another thread reads a whole one).

    ``epoch`` is the epoch the next :meth:`EpochCursor.begin` runs;
    ``resume_step`` the chunks of it received before a resume; ``resume_global``
    the epoch's global windows delivered before a resume and its global length
    (``None``: no resume pending, or a state without them); ``active`` the span
    started last (``None`` before the first, or after a resume).
    """

    epoch: int = 0
    resume_step: int = 0
    resume_global: tuple[int, int] | None = None
    uneven: Uneven = "exact"
    active: EpochSpan | None = None


class EpochCursor:
    """The epoch position of one rank's loader, and its ``state_dict``: the next
    :meth:`begin` runs epoch :attr:`epoch`; after :meth:`load_state` it yields the
    interrupted epoch's remaining windows (re-split over this world size if needed).

    The position is one immutable :class:`Position`: :meth:`draw` computes the next
    span from it without changing anything (drawing a plan can take long), and
    :meth:`publish` makes it current with one assignment, so :meth:`state_dict` never
    sees half of a change. The caller serialises publishers (the loader's lock).
    """

    def __init__(self, plan: Plan, *, rank: int, world_size: int) -> None:
        self.plan = plan
        self.rank, self.world_size = rank, world_size
        self.position = Position()

    @property
    def epoch(self) -> int:
        """The epoch the next :meth:`begin` runs."""
        return self.position.epoch

    @property
    def active(self) -> EpochSpan | None:
        return self.position.active

    @property
    def chunks_per_pass(self) -> int | None:
        """This rank's chunks in one pass of the plan (``None`` for ``random``)."""
        per_pass = self.plan.windows_per_pass
        return None if per_pass is None else max(1, per_pass // self.world_size)

    def begin(self, num_chunks: int | None, at: int = 0) -> EpochSpan:
        """Start the next epoch of ``num_chunks`` chunks at step ``at``; the previous span
        is dropped. Raises :class:`ConfigError` naming ``num_chunks`` or ``at``."""
        span, position = self.draw(num_chunks, at)
        self.publish(position)
        return span

    def draw(self, num_chunks: int | None, at: int = 0) -> tuple[EpochSpan, Position]:
        """The span :meth:`begin` would start, and the position after it; changes nothing."""
        now = self.position
        if num_chunks is None:
            num_chunks = self.chunks_per_pass
            if num_chunks is None:
                raise ConfigError.bad(
                    "num_chunks",
                    None,
                    "a number of chunks for sampling='random' (it has no natural pass)",
                    "Use cs.plan_epoch(...).chunks_per_epoch.",
                )
        check_int("num_chunks", num_chunks, 0, "Use cs.plan_epoch(...).chunks_per_epoch.")
        check_int("at", at, 0, f"Pass a step in [0, num_chunks={num_chunks}].")
        if at > num_chunks:
            raise ConfigError.bad(
                "at", at, f"a step in [0, num_chunks={num_chunks}]", "Pass at <= num_chunks."
            )
        pending = now.resume_step > 0 or now.resume_global is not None
        if at and pending:
            raise ConfigError.bad(
                "at",
                at,
                "0 while a load_state_dict() resume is pending",
                "The resumed state already says where the epoch starts; pass at=0.",
            )
        world = self.world_size
        if now.resume_global is not None and now.resume_global[0] > 0:
            consumed, total = now.resume_global
        else:  # a fresh epoch, or a state without global counts (same world size)
            consumed = min(max(now.resume_step, at), num_chunks) * world
            total = num_chunks * world
        share = epoch_share(
            epoch=now.epoch,
            consumed=consumed,
            total=total,
            rank=self.rank,
            world_size=world,
            uneven=now.uneven,
        )
        windows = self.plan.chunks(now.epoch, np.asarray(share.indices, dtype=np.int64))
        first = share.first_step
        span = EpochSpan(now.epoch, share, windows, first, first + len(windows), first)
        return span, Position(epoch=now.epoch + 1, uneven=now.uneven, active=span)

    def publish(self, position: Position) -> None:
        """Make ``position`` current (one assignment), then drop the span it replaces."""
        before, self.position = self.position, position
        if before.active is not None and before.active is not position.active:
            before.active.dropped = True

    def state_dict(self, position: Position | None = None) -> dict[str, int]:
        """The epoch and how many of its chunks the consumer received: ``step`` and
        ``num_chunks`` count this rank's chunks; ``consumed`` and ``total`` the epoch's
        global windows delivered and in all, assuming every rank received as many.
        Of ``position`` if given, else of the current one (read once)."""
        now = self.position if position is None else position
        seed = self.plan.seed
        span = now.active
        received = span.received if span is not None else 0  # read once: it moves
        if span is not None and received < span.stop and not span.dropped:
            return {
                "epoch": span.epoch,
                "step": received,
                "num_chunks": span.stop,
                "seed": seed,
                "world_size": self.world_size,
                "consumed": span.share.consumed_after(received - span.first),
                "total": span.share.total,
            }
        consumed, total = now.resume_global or (now.resume_step * self.world_size, 0)
        return {
            "epoch": now.epoch,
            "step": now.resume_step,
            "num_chunks": 0,
            "seed": seed,
            "world_size": self.world_size,
            "consumed": consumed,
            "total": total,
        }

    def load_state(self, state: dict[str, int], *, uneven: Uneven = "exact") -> None:
        """Make the next :meth:`begin` resume ``state`` (see ``ChunkLoader.load_state_dict``)."""
        self.publish(self.loaded(state, uneven=uneven))

    def loaded(self, state: dict[str, int], *, uneven: Uneven = "exact") -> Position:
        """The position :meth:`load_state` publishes for ``state``; validates it, changes
        nothing."""
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
        if uneven not in _UNEVEN:
            raise ConfigError.bad(
                "uneven", uneven, "'exact', 'pad' or 'drop'", "'exact' repeats and skips nothing."
            )
        seed = state.get("seed")
        if seed is not None and seed != self.plan.seed:
            warnings.warn(
                f"resuming a state saved with seed={seed} on a loader with seed="
                f"{self.plan.seed}: the remaining windows will differ from the interrupted run",
                stacklevel=3,
            )
        return Position(
            epoch=epoch,
            resume_step=step,
            resume_global=(consumed, total) if total else None,
            uneven=uneven,
        )
