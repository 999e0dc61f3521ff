"""What the consumer receives: a read-only mapping from field name to tensor."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from ..plans import Piece

__all__ = ["Chunk", "Piece"]


class Chunk(Mapping[str, torch.Tensor]):
    """One chunk of every field, as tensors on the loader's device.

    ``chunk.pieces`` is a tuple of :class:`Piece` ``(offset, start, stop,
    segment)``: rows ``[offset, offset + stop - start)`` of every field hold
    timesteps ``[start, stop)``. A contiguous chunk is one piece ``(0, start,
    stop, None)``, and ``chunk["voltage"]`` has shape ``(stop - start,
    *field_shape)``; a pieced chunk (``ChunkLoader(pieces=k)``) has ``length``
    rows, the pieces' lengths together, and ``start``/``stop`` are its first
    piece's bounds. ``epoch`` and ``index`` (the position within the epoch on
    this rank) say where it came from.
    A tensor handed out here is never overwritten by the loader while the user
    still holds it.

    Consuming on another stream (CUDA): the tensors are ready on the stream
    that was current when the chunk was received (the loader made that stream
    wait for the copy, on the device, and told the caching allocator about it).
    To use them on another stream ``s``, two things are needed: ``s`` must wait
    for the copy, and the allocator must know ``s`` uses the memory, or it may
    hand the memory to a new tensor while ``s`` still reads it.
    :meth:`use_on` does both::

        side = torch.cuda.Stream()
        for chunk in loader.epoch(n):
            chunk.use_on(side)                 # side waits for the copy (no host sync)
            with torch.cuda.stream(side):
                loss = model(chunk["voltage"])  # ...

    By hand that is ``side.wait_stream(torch.cuda.current_stream())`` right
    after receiving the chunk, and ``t.record_stream(side)`` for each tensor.
    Receiving inside ``with torch.cuda.stream(side):`` needs neither.
    """

    __slots__ = ("_ready", "_starts", "_tensors", "epoch", "index", "pieces", "start", "stop")

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
    ) -> None:
        self._tensors = tensors
        self._ready = ready  # the event recorded after the copy (CUDA), else None
        self.start = int(start)
        self.stop = int(stop)
        self.epoch = int(epoch)
        self.index = int(index)
        self.pieces: tuple[Piece, ...] = (
            tuple(Piece(*p) for p in pieces) if pieces else (Piece(0, self.start, self.stop),)
        )
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

        ``stream`` waits (on the device, the host never blocks) for the event
        recorded after this chunk's copy, and each tensor is recorded as used
        on ``stream`` (``Tensor.record_stream``) so the caching allocator keeps
        its memory until the work queued there so far has finished. On the CPU
        it does nothing. Call it once per stream, before queueing work there.
        """
        tensors = list(self._tensors.values())
        if not tensors or not tensors[0].is_cuda:
            return self
        device = tensors[0].device
        if stream is None:
            stream = torch.cuda.current_stream(device)
        if self._ready is not None:
            stream.wait_event(self._ready)
        else:  # built by hand: wait for whatever the current stream has queued
            stream.wait_stream(torch.cuda.current_stream(device))
        for tensor in tensors:
            tensor.record_stream(stream)
        return self

    @property
    def length(self) -> int:
        """Rows (timesteps) in this chunk: its pieces' lengths together."""
        last = self.pieces[-1]
        return last.offset + last.stop - last.start

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
