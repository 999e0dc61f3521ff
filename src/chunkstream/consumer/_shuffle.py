"""The shuffle buffer's two tiers behind one protocol: where held chunks are stored and
how a batch is made from them.

A :class:`~chunkstream.BatchStream` picks its tier once, at construction, as a
loader picks its delivery stage (:mod:`chunkstream.pipeline._stages`), and never
branches on it afterwards; :class:`~chunkstream.consumer.ChunkMixer` stores the
chunks it holds where the tier says. Both tiers draw the same windows for the
same seed (the starts are drawn on the host) and take the same requests: a
batch's starts and the stream state that resumes right after that batch, which
travels with the batch to the consumer (Grain's ``(element, state)``).

* :class:`DeviceTier`: the buffer on the chunks' device; each batch gathered
  there in the consumer's thread (``index_select`` on CUDA, the gather pool on
  the CPU), when the consumer asks for it.
* :class:`HostTier`: the buffer in one pageable host arena; each batch gathered
  on the host into a reused slot (:mod:`._slots`) by the gather pool's helpers
  and, on CUDA, copied on the loader's copy path by the consumer's thread, in
  batch order, as soon as it is gathered; ``depth`` batches are gathered (and
  copied) ahead, as a bounded deque of jobs in batch order (the loader's
  read-ahead, one stage on). Every wait for a gather is bounded like the wait
  for a chunk (:class:`~._gather.Watch`: the loader's ``close()`` and
  ``stall_timeout``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from .._memory import HostBufferPool
from ..pipeline import Delivery, receive, times_to
from ..sources import FieldSpec
from ._gather import GatherPool, Watch, gather_pool, host_copy_rows
from ._sampling import _compute_dtype, gather_windows
from ._slots import BatchSlots, Gather

__all__ = ["BufferTier", "DeviceTier", "HostTier", "Request"]


class Request(NamedTuple):
    """One batch to make: its window starts (rows of the buffer's storage), the
    stream state that resumes right after it, and the windows' times (``"start"``,
    maybe ``"recording"``: :mod:`chunkstream.pipeline._times`, on the starts'
    device), which the batch carries beside its fields on the batch's device."""

    starts: torch.Tensor
    state: Any
    times: Mapping[str, torch.Tensor] | None = None


class BufferTier(Protocol):
    """Where a shuffle buffer's chunks are stored and how batches are made from them.

    ``store`` allocates the buffer's storage like ``like`` (one tensor per field)
    for ``rows`` timesteps; ``copy_rows`` copies a chunk's field into it (in the
    consumer's thread); ``batches`` turns requests into ``(batch, state)`` pairs in
    request order, each batch ready to use on the consumer's current stream, and
    gives back whatever it gathered ahead once the consumer stops iterating.
    Not thread-safe: one consumer loop owns a tier.
    """

    name: str

    def store(self, like: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]: ...

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]: ...


class DeviceTier:
    """The buffer on the chunks' device; a batch gathered there when it is asked for.

    ``fields``: the names a batch holds; ``dtype``: the compute dtype (``None``:
    stored); ``gather``: the pool of CPU copies (``None``: the process's);
    ``watch``: how the CPU copies into the buffer are waited for.
    """

    name = "device"

    def __init__(
        self,
        fields: Sequence[str] = (),
        *,
        window: int = 1,
        dtype: torch.dtype | None = None,
        gather: GatherPool | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.fields, self.window, self.dtype = tuple(fields), int(window), dtype
        self.gather, self.watch = gather, watch

    def store(self, like: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        return {
            n: torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
            for n, t in like.items()
        }

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.device.type == "cpu":  # the gather pool, not torch's spinning one
            host_copy_rows(dst, src, pool=self.gather or gather_pool(), watch=self.watch)
        else:  # queued on the current stream, after the chunk's ready event (use_on)
            dst.copy_(src, non_blocking=True)

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]:
        for starts, state, times in requests:
            batch = {
                n: gather_windows(storage[n], starts, self.window, dtype=self.dtype)
                for n in self.fields
            }
            batch.update(times or {})  # made on the starts' device: the batch's
            yield batch, state


class HostTier:
    """The buffer in one host arena; batches gathered into reused slots, ``depth`` ahead.

    ``device``: where batches go (CPU or CUDA); ``slots``: the :class:`BatchSlots`
    (``depth + 2`` of them: those ahead, the one yielded, one the user holds);
    ``watch``: how every gather is waited for (``None``: a default
    :class:`~._gather.Watch`, the loader's default ``stall_timeout``, no close).
    """

    name = "host"

    def __init__(
        self,
        fields: Sequence[str],
        *,
        window: int,
        batch_size: int,
        device: torch.device,
        depth: int,
        gather: GatherPool,
        dtype: torch.dtype | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.fields, self.dtype, self.depth = tuple(fields), dtype, int(depth)
        self.device, self.gather = torch.device(device), gather
        self.watch = Watch() if watch is None else watch
        self.slots = BatchSlots(
            self.device,
            batch_size=batch_size,
            window=window,
            slots=self.depth + 2,
            pool=gather,
            watch=self.watch,
        )

    def store(self, like: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        """``rows`` timesteps of each field in one pageable arena, faulted in now.

        Only the batch slots are page-locked (the copies to the device read those),
        so the buffer, often most of the host's memory, is not locked.
        """
        fields = {n: FieldSpec(tuple(t.shape[1:]), t.numpy().dtype) for n, t in like.items()}
        buffers = HostBufferPool(fields, rows, slots=1).acquire()  # the storage's for life
        return {n: torch.from_numpy(a) for n, a in buffers.arrays.items()}

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        host_copy_rows(dst, src, pool=self.gather, watch=self.watch)

    def batches(
        self, storage: Mapping[str, torch.Tensor], requests: Iterable[Request]
    ) -> Iterator[tuple[dict[str, torch.Tensor], Any]]:
        """The batches in request order; ``depth`` gathered (and copied) ahead of the one
        the consumer waits for. On CUDA each finished gather's copy is queued at once,
        in batch order, so the copy overlaps the consumer's step as the gather does."""
        targets = {n: _compute_dtype(self.dtype, storage[n].dtype) for n in self.fields}
        pending = iter(requests)
        ahead: deque[_Ahead] = deque()
        try:
            while True:
                while len(ahead) <= self.depth and (request := next(pending, None)) is not None:
                    starts = request.starts.tolist()
                    gather = self.slots.submit(storage, self.fields, starts, targets)
                    ahead.append(_Ahead(gather, request.state, request.times))
                if not ahead:
                    return
                for item in ahead:  # the copies of the gathers done, in batch order
                    if item.taken:
                        continue
                    if item is ahead[0]:
                        item.gather.job.wait()  # bounded (Watch); a failed gather raises here
                    elif not item.gather.job.succeeded():
                        break  # a failed gather's error is raised at its own turn
                    item.taken = True  # the slot is deliver's now, even if the copy fails
                    item.delivery = self.slots.deliver(item.gather)
                item = ahead.popleft()
                tensors, _ = receive(item.delivery, self.device)  # type: ignore[arg-type]
                state, times = item.state, times_to(dict(item.times or {}), self.device)
                del item
                batch = {n: t.to(targets[n]) for n, t in tensors.items()}
                yield batch | times, state
        finally:
            for item in ahead:  # a taken one's slot is back behind its copy already
                if not item.taken:
                    self.slots.abandon(item.gather)


class _Ahead:
    """A batch in the tier's deque: its gather, whether its slot was handed to
    :meth:`~._slots.BatchSlots.deliver` (``taken``), its delivery once made (on CUDA:
    its copy queued), the stream state after it and the batch's times (host tensors)."""

    __slots__ = ("delivery", "gather", "state", "taken", "times")

    def __init__(
        self, gather: Gather, state: Any, times: Mapping[str, torch.Tensor] | None
    ) -> None:
        self.gather, self.state, self.times = gather, state, times
        self.taken = False
        self.delivery: Delivery | None = None
