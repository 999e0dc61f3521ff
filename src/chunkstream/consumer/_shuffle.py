"""The shuffle buffer's two tiers behind one protocol: where held chunks are stored and
how a batch is made from them.

A :class:`~chunkstream.BatchStream` picks its tier once, at construction, as a
loader picks its delivery stage (:mod:`chunkstream.pipeline._stages`), and never
branches on it afterwards; :class:`~chunkstream.consumer.ChunkMixer` stores the
chunks it holds where the tier says. Both tiers draw the same windows for the
same seed (the starts are drawn on the host) and take the same requests: a
batch's starts and the stream state that resumes right after that batch, which
travels with the batch to the consumer (Grain's ``(element, state)``).

* :class:`HostTier`: the buffer in one pageable host arena, a
  :class:`~chunkstream.pipeline._held.HeldSource`; each batch is a chunk of one-window pieces read
  from it by the loader's own run machinery (:class:`~chunkstream.pipeline._lane.BatchLane`: the
  loader's batch readers, on CUDA its transfer thread and stream), ``depth``
  batches ahead, every wait under the loader's ``close()`` and stall watchdog.
* :class:`DeviceTier`: the buffer on the chunks' device. On CUDA each batch is
  gathered there in the consumer's thread (``index_select``) when the consumer
  asks for it; on the CPU it is host memory, and batches and refills take the
  batch lane as on the host tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from .._memory import HostBufferPool
from ..pipeline import BatchLane, Request
from ..sources import FieldSpec
from ._sampling import gather_windows

__all__ = ["BufferTier", "DeviceTier", "HostTier"]


class BufferTier(Protocol):
    """Where a shuffle buffer's chunks are stored and how batches are made from them.

    ``store`` allocates the buffer's storage like ``like`` (one tensor per field)
    for ``rows`` timesteps; ``copy_rows`` copies a chunk's field into it (the
    refill, after every batch read over the old rows ended); ``batches`` turns
    requests into ``(batch, state)`` pairs in request order, each batch ready to
    use on the consumer's current stream, and drops what it read ahead once the
    consumer stops iterating. Not thread-safe: one consumer loop owns a tier.
    """

    name: str

    def store(self, like: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]: ...

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]: ...


class DeviceTier:
    """The buffer on the chunks' device; on CUDA a batch gathered there when asked for.

    ``fields``: the names a batch holds; ``dtype``: the compute dtype (``None``:
    stored); ``lane``: the batch lane that reads CPU storage (``None``: CUDA storage
    only, or a plain gather in the caller's thread).
    """

    name = "device"

    def __init__(
        self,
        fields: Sequence[str] = (),
        *,
        window: int = 1,
        dtype: torch.dtype | None = None,
        lane: BatchLane | None = None,
    ) -> None:
        self.fields, self.window, self.dtype = tuple(fields), int(window), dtype
        self.lane = lane

    def store(self, like: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        return {
            n: torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
            for n, t in like.items()
        }

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.device.type == "cpu" and self.lane is not None:
            self.lane.fill(dst, src)
        else:  # on a device: queued on the current stream, after the chunk's ready event
            dst.copy_(src, non_blocking=dst.device.type != "cpu")

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]:
        first = storage[self.fields[0]] if self.fields else None
        if self.lane is not None and first is not None and first.device.type == "cpu":
            yield from self.lane.batches(storage, requests)
            return
        for starts, state, times in requests:
            batch = {
                n: gather_windows(storage[n], starts, self.window, dtype=self.dtype)
                for n in self.fields
            }
            batch.update(times or {})  # made on the starts' device: the batch's
            yield batch, state


class HostTier:
    """The buffer in one host arena; batches read from it by the batch ``lane``."""

    name = "host"

    def __init__(self, lane: BatchLane) -> None:
        self.lane = lane
        self.fields, self.dtype, self.depth = lane.fields, lane.dtype, lane.depth
        self.device = lane.device

    def store(self, like: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        """``rows`` timesteps of each field in one pageable arena, faulted in now.

        Only the batch buffer sets are page-locked (the copies to the device read
        those), so the buffer, often most of the host's memory, is not locked.
        """
        fields = {n: FieldSpec(tuple(t.shape[1:]), t.numpy().dtype) for n, t in like.items()}
        buffers = HostBufferPool(fields, rows, slots=1).acquire()  # the storage's for life
        return {n: torch.from_numpy(a) for n, a in buffers.arrays.items()}

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.lane.fill(dst, src)

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]:
        return self.lane.batches(storage, requests)
