"""What the consumer receives: a read-only mapping from field name to tensor."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..plans import Piece
from ._times import Origin, piece_origins

__all__ = ["Chunk", "Origin", "Piece", "hand_over"]


def hand_over(tensors: Iterable[torch.Tensor], ready: Any, stream: Any) -> None:
    """Make ``tensors`` safe to use on ``stream``: it waits (on the device, not the host)
    for the ``ready`` event, if any, and each tensor is recorded as used there, so the
    caching allocator does not reuse its block before the stream's queued work ran."""
    if ready is not None:
        stream.wait_event(ready)
    for tensor in tensors:
        tensor.record_stream(stream)


class Chunk(Mapping[str, torch.Tensor]):
    """One chunk of every field, as tensors on the loader's device.

    ``pieces`` is a tuple of :class:`Piece` ``(offset, start, stop, segment)``: rows
    ``[offset, offset + stop - start)`` of every field hold timesteps ``[start,
    stop)``. A contiguous chunk is one piece ``(0, start, stop, None)`` and
    ``chunk["voltage"]`` has shape ``(stop - start, *field_shape)``; a pieced chunk
    has ``length`` rows and ``start``/``stop`` are its first piece's bounds.
    ``epoch`` and ``index`` (the position within the epoch on this rank) say where
    it came from. The loader never overwrites a tensor the user still holds.
    ``offsets`` are where the source's recordings start on the loader's time axis
    (``Recordings.offsets``; ``(0,)``, the default, for a plain source), so that
    :attr:`origins` says where each piece lies in its own recording, in the terms
    of a :class:`~chunkstream.BatchStream` batch's ``"start"`` and ``"recording"``.

    CUDA: the tensors are ready on the stream that was current when the chunk was
    received. To use them on another stream ``s``, call :meth:`use_on` (``s`` waits
    for the copy and the caching allocator learns that ``s`` uses the memory); by
    hand that is ``s.wait_stream(torch.cuda.current_stream())`` right after
    receiving and ``t.record_stream(s)`` for each tensor. Receiving inside ``with
    torch.cuda.stream(s):`` needs neither.
    """

    __slots__ = (
        "_ready",
        "_starts",
        "_tensors",
        "epoch",
        "index",
        "offsets",
        "pieces",
        "start",
        "stop",
    )

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        start: int,
        stop: int,
        epoch: int,
        index: int,
        ready: torch.cuda.Event | None = None,
        pieces: Sequence[Piece] | None = None,
        offsets: Sequence[int] = (0,),
    ) -> None:
        self._tensors = tensors
        self._ready = ready  # the event recorded after the copy (CUDA), else None
        self.start, self.stop, self.epoch, self.index = (
            int(start),
            int(stop),
            int(epoch),
            int(index),
        )
        self.pieces: tuple[Piece, ...] = (
            tuple(Piece(*p) for p in pieces) if pieces else (Piece(0, self.start, self.stop),)
        )
        self.offsets: tuple[int, ...] = tuple(int(o) for o in offsets)
        # Valid window starts per window length, built once per chunk on its device
        # (consumer/_sampling.py), so drawing a batch never copies host to device.
        self._starts: dict[int, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(
                f"chunk has no field {name!r}; its fields are {sorted(self._tensors)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def use_on(self, stream: torch.cuda.Stream | None = None) -> Chunk:
        """Make the tensors safe to use on ``stream`` (default: the current one); returns self.

        ``stream`` waits, on the device, for the event recorded after this chunk's
        copy, and each tensor is recorded as used on it (``record_stream``). A no-op
        on the CPU. Call it once per stream, before queueing work there.
        """
        tensors = list(self._tensors.values())
        if not tensors or not tensors[0].is_cuda:
            return self
        device = tensors[0].device
        if stream is None:
            stream = torch.cuda.current_stream(device)
        if self._ready is None:  # built by hand: wait for whatever the current stream has queued
            stream.wait_stream(torch.cuda.current_stream(device))
        hand_over(tensors, self._ready, stream)
        return self

    @property
    def length(self) -> int:
        """Rows (timesteps) in this chunk: its pieces' lengths together."""
        last = self.pieces[-1]
        return last.offset + last.stop - last.start

    @property
    def origins(self) -> tuple[Origin, ...]:
        """Per piece, ``Origin(recording, start, stop)``: the timesteps ``[start, stop)``
        of recording ``recording`` it holds (index in ``Recordings.names``; 0 for a
        plain source, where ``start`` and ``stop`` are the piece's own)."""
        return piece_origins(self.pieces, self.offsets)

    @property
    def nbytes(self) -> int:
        """Bytes of all fields' tensors together."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    @property
    def device(self) -> torch.device:
        """The device the tensors live on (the loader's ``device``)."""
        return next(iter(self._tensors.values())).device

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self._tensors.items())
        return (
            f"Chunk(epoch={self.epoch}, index={self.index}, window=[{self.start}, {self.stop}), "
            + (f"pieces={len(self.pieces)}, " if len(self.pieces) > 1 else "")
            + f"{shapes}, device={self.device})"
        )
