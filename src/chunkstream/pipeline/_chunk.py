"""What the consumer receives: a read-only mapping from field name to tensor."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

__all__ = ["Chunk"]


class Chunk(Mapping[str, torch.Tensor]):
    """One window ``[start, stop)`` of every field, as tensors on the loader's device.

    ``chunk["voltage"]`` has shape ``(stop - start, *field_shape)``. ``epoch`` and
    ``index`` (the position within the epoch on this rank) say where it came from.
    A tensor handed out here is never overwritten by the loader while the user
    still holds it. On CUDA the tensors are ready to use on the stream that was
    current when the chunk was received (the loader made that stream wait for
    the copy); use them on another stream only after ``tensor.record_stream``.
    """

    __slots__ = ("_tensors", "epoch", "index", "start", "stop")

    def __init__(
        self, tensors: dict[str, torch.Tensor], *, start: int, stop: int, epoch: int, index: int
    ) -> None:
        self._tensors = tensors
        self.start = int(start)
        self.stop = int(stop)
        self.epoch = int(epoch)
        self.index = int(index)

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

    @property
    def length(self) -> int:
        """Timesteps in this chunk: ``stop - start``."""
        return self.stop - self.start

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
            f"{shapes}, device={self.device})"
        )
