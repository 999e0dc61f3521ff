"""Where a window starts: buffer rows mapped to ``(start in its recording, recording)``.

Every batch of a :class:`~chunkstream.BatchStream` in dict form carries, per
window, ``"start"`` (its first timestep within its own recording) and, for a
:class:`~chunkstream.Recordings` source, ``"recording"`` (the recording's index
in ``Recordings.names`` order); a :class:`~chunkstream.Chunk` says the same of
each of its pieces (:attr:`~chunkstream.Chunk.origins`). Both come from one pure
function, :func:`window_times`, over a table of the pieces that hold the rows:

* a piece whose first row is ``row0`` holds timestep ``first + (row - row0)`` at
  ``row`` (the loader's time axis: a ``Recordings`` lays its recordings end to
  end, recording ``i`` from ``offsets[i]``);
* timestep ``t`` lies in recording ``i = max{j : offsets[j] <= t}`` and is its
  timestep ``t - offsets[i]`` (a plain source is one recording at offset 0).

A piece never crosses a recording (the loader cuts its segments at their
bounds), so a window's start says where the whole window lies. The function is
vectorised (two ``searchsorted``) and runs where its tensors are, so a device
tier maps a batch's starts on the device without a host round trip. The values
derive from the drawn rows alone, so they are deterministic and resume exactly
as the data do, on every tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from ..plans import Piece
from ..sources import Recordings, Source

__all__ = ["Origin", "TimeTable", "recording_offsets", "times_to", "window_times"]

#: The batch keys that :class:`~chunkstream.BatchStream` reserves beside the fields.
START_KEY = "start"
RECORDING_KEY = "recording"


class Origin(NamedTuple):
    """Where a piece of a chunk comes from: timesteps ``[start, stop)`` of recording
    ``recording`` (its index in ``Recordings.names``; 0 for a plain source)."""

    recording: int
    start: int
    stop: int


def recording_offsets(source: Source) -> tuple[int, ...]:
    """Where each recording starts on the loader's time axis (``(0,)``: one recording)."""
    if isinstance(source, Recordings):
        return tuple(int(o) for o in source.offsets)
    return (0,)


def window_times(
    rows: torch.Tensor, row0: torch.Tensor, first: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, recording)`` of the windows starting at ``rows``: int64 tensors like ``rows``.

    ``row0`` (ascending) and ``first`` are the holding pieces' first rows and
    first timesteps on the loader's time axis, ``offsets`` (ascending, from 0)
    where each recording starts on it; all int64, on ``rows``' device. A row
    belongs to the last piece whose ``row0`` it is not below (rows are valid
    window starts, so they lie inside a piece). Pure: nothing is read back to
    the host.
    """
    piece = torch.searchsorted(row0, rows, right=True) - 1
    t = first[piece] + (rows - row0[piece])
    recording = torch.searchsorted(offsets, t, right=True) - 1
    return t - offsets[recording], recording


class TimeTable:
    """The pieces held in a buffer's rows, ready for :func:`window_times` on ``device``.

    ``held``: per held chunk, the buffer row of its row 0 and its pieces;
    ``offsets``: :func:`recording_offsets` of the loader's source.
    """

    __slots__ = ("first", "offsets", "row0")

    def __init__(
        self,
        held: Iterable[tuple[int, Sequence[Piece]]],
        offsets: Sequence[int],
        device: torch.device,
    ) -> None:
        pieces = sorted((base + p.offset, p.start) for base, ps in held for p in ps)
        table = torch.tensor(pieces, dtype=torch.int64).reshape(-1, 2)
        both = torch.cat([table.T.reshape(-1), torch.tensor(offsets, dtype=torch.int64)])
        if device.type == "cuda":  # one asynchronous copy from page-locked memory
            both = both.pin_memory().to(device, non_blocking=True)
        else:
            both = both.to(device)
        n = len(pieces)
        self.row0, self.first, self.offsets = both[:n], both[n : 2 * n], both[2 * n :]

    def __call__(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, recording)`` of the windows at buffer ``rows`` (:func:`window_times`)."""
        return window_times(rows, self.row0, self.first, self.offsets)


def piece_origins(pieces: Sequence[Piece], offsets: Sequence[int]) -> tuple[Origin, ...]:
    """Each piece's :class:`Origin`, by :func:`window_times` over the pieces' own rows."""
    table = TimeTable([(0, pieces)], offsets, torch.device("cpu"))
    rows = torch.tensor([p.offset for p in pieces], dtype=torch.int64)
    start, recording = table(rows)
    return tuple(
        Origin(r, s, s + p.length)
        for p, s, r in zip(pieces, start.tolist(), recording.tolist(), strict=True)
    )


def times_to(times: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch's host-made ``times`` (``"start"``, maybe ``"recording"``) on ``device``:
    on CUDA one asynchronous copy from page-locked memory, queued on the current
    stream (so the consumer's work there sees them); elsewhere as they are."""
    if device.type != "cuda" or not times:
        return times
    names = list(times)
    # The pinned temporary may be dropped at once: the copy records an event for its block
    # on the current stream, and PyTorch's caching host allocator reuses the block only
    # after that event (tests/test_window_times.py checks it on a delayed stream).
    both = torch.stack([times[n] for n in names]).pin_memory().to(device, non_blocking=True)
    return dict(zip(names, both.unbind(0), strict=True))
