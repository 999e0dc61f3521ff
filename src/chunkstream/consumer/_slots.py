"""Batches gathered on the host into a few reused slots, then delivered to the device.

The host tier's delivery (:class:`BatchSlots`). A batch is gathered from host
storage (the shuffle buffer's arena, or a host chunk) by the gather pool
(:mod:`._gather`) into a *slot*: one array per field, ``batch_size`` windows.

CUDA: the slots are page-locked (one registered arena, a
:class:`~chunkstream._memory.PinnedSlotPool` of ``slots`` sets). Ownership: the
pool, then the gather job (:meth:`BatchSlots.submit` acquires a slot, waiting
for the oldest copy's event if all are in flight), then the transfer stream:
the thread that finishes the gather's last block queues one ``copy_`` per
field, from the slot to a fresh device tensor allocated on the transfer
stream, records an event and gives the slot back behind it
(``release(..., after=event)``), so a slot is refilled only once its copy has finished.
The consumer's stream waits on that event and ``record_stream`` tells the
caching allocator the tensor is used there (:meth:`Pending.result`, called in
the consumer's thread). The stored dtype is copied and converted on the device
(half the bytes for float16). Device memory: the batches in flight
(``batch_prefetch``) plus those the user holds.

CPU: the same path without the copy. The slots are pageable sets of a
:class:`~chunkstream._memory.HostBufferPool`; the batch handed to the user is
a view of its slot, and a slot is refilled only once no tensor refers to it
(an extra set is made while the user holds them all), so a steady loop writes
into pages already faulted in instead of fresh ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .._memory import BufferSet, HostBufferPool, PinnedSlotPool
from ..pipeline import hand_over
from ..sources import FieldSpec
from ._gather import GatherPool, Job, gather_blocks

__all__ = ["BatchSlots", "Pending"]


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a slot holding ``dtype`` (bfloat16 as its bits, int16)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.int16)
    return torch.empty(0, dtype=dtype).numpy().dtype


def _as_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if tensor.dtype != dtype else tensor


class Pending:
    """A batch being gathered (and, on CUDA, copied); :meth:`result` in the consumer's thread."""

    __slots__ = ("_job", "_out", "device", "event", "targets")

    def __init__(
        self,
        job: Job | None,
        out: dict[str, torch.Tensor],
        device: torch.device,
        targets: dict[str, torch.dtype],
    ) -> None:
        self._job = job
        self._out = out  # the slot's views (CPU) or, once copied, the device tensors (CUDA)
        self.device = device
        self.targets = targets
        self.event: torch.cuda.Event | None = None

    def result(self) -> dict[str, torch.Tensor]:
        """The batch on the target device, safe to use on the current stream."""
        assert self._job is not None  # result() is called once
        job, self._job = self._job, None
        job.wait()
        out, self._out = self._out, {}
        if self.event is None:
            return out
        hand_over(out.values(), self.event, torch.cuda.current_stream(self.device))
        return {name: t.to(self.targets[name]) for name, t in out.items()}

    def cancel(self) -> None:
        """Abandon the batch; its slot goes back once the blocks already claimed are done."""
        if self._job is not None:
            self._job.cancel()
            self._job, self._out = None, {}


class BatchSlots:
    """Gathers batches of ``batch_size`` windows into ``slots`` reused host slots.

    ``device`` is where batches go (CPU or CUDA); ``pool`` the gather pool. The
    slot pool is made at the first batch, from the storage's shapes and dtypes.
    Not thread-safe: one consumer loop owns it (module docs for the slots' owners).
    """

    def __init__(
        self, device: torch.device, *, batch_size: int, window: int, slots: int, pool: GatherPool
    ) -> None:
        self.device = torch.device(device)
        self.batch_size, self.window, self.slots = int(batch_size), int(window), int(slots)
        self.pool = pool
        self._slots: HostBufferPool | PinnedSlotPool | None = None
        self._layout: tuple | None = None
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # The pinned arena is unregistered once its copies finished, when this object is
        # collected (a BatchStream has no close(); the loader's close() is the user's).
        self._made: list[HostBufferPool | PinnedSlotPool] = []
        weakref.finalize(self, _close_pools, self._made)

    @property
    def nbytes(self) -> int:
        """Host bytes of the slots (page-locked on CUDA); 0 before the first batch."""
        return 0 if self._slots is None else int(self._slots.nbytes)

    def _pool_for(self, fields: dict[str, FieldSpec]) -> HostBufferPool | PinnedSlotPool:
        layout = tuple((n, f.shape, f.dtype.str) for n, f in fields.items())
        if self._slots is None or layout != self._layout:
            if self._slots is not None:
                self._slots.close()  # waits for its copies (bounded), then unpins
            if self._stream is not None:
                self._slots = PinnedSlotPool(
                    fields, self.batch_size, slots=self.slots, device=self.device
                )
            else:
                self._slots = HostBufferPool(fields, self.batch_size, slots=self.slots)
            self._made.append(self._slots)
            self._layout = layout
        return self._slots

    def submit(
        self,
        storage: Mapping[str, torch.Tensor],
        names: Sequence[str],
        starts: list[int],
        dtypes: Mapping[str, torch.dtype],
    ) -> Pending:
        """Start gathering the windows at ``starts`` (host ints, checked) of ``names``.

        ``storage[name]`` is a CPU tensor; ``dtypes[name]`` the batch's dtype.
        The gather runs on the pool's helpers now and in :meth:`Pending.result`.
        """
        cuda = self._stream is not None
        # On CUDA the slot holds the stored dtype, converted on the device after the copy.
        held = {n: storage[n].dtype if cuda else dtypes[n] for n in names}
        fields = {
            n: FieldSpec((self.window, *storage[n].shape[1:]), _numpy_dtype(held[n])) for n in names
        }
        slots = self._pool_for(fields)
        if cuda:
            with torch.cuda.device(self.device):  # acquire queries events: no device guard
                buffers = slots.acquire()
        else:
            buffers = slots.acquire()
        b = len(starts)
        out = {n: _as_tensor(buffers.arrays[n][:b], held[n]) for n in names}
        fn, n_blocks = gather_blocks([(storage[n], out[n]) for n in names], starts, self.window)
        pending = Pending(None, out, self.device, dict(dtypes))
        if cuda:
            then = _CopyToDevice(slots, buffers, out, pending, self._stream)  # type: ignore[arg-type]
        else:
            then = _ReleaseSlot(slots, buffers)  # type: ignore[assignment]
        pending._job = self.pool.submit(fn, n_blocks, then)
        return pending


def _close_pools(pools: list[HostBufferPool | PinnedSlotPool]) -> None:
    for pool in pools:
        pool.close()  # idempotent; never raises; a copy still running keeps it pinned


class _ReleaseSlot:
    """CPU: the pipeline is done with the slot; the user's views keep it from reuse."""

    __slots__ = ("buffers", "slots")

    def __init__(self, slots: HostBufferPool, buffers: BufferSet) -> None:
        self.slots, self.buffers = slots, buffers

    def __call__(self, failed: bool) -> None:
        del failed
        self.slots.release(self.buffers)


class _CopyToDevice:
    """CUDA: queue the slot's copy on the transfer stream; the slot comes back behind it."""

    __slots__ = ("buffers", "out", "pending", "slots", "stream")

    def __init__(
        self,
        slots: PinnedSlotPool,
        buffers: BufferSet,
        out: dict[str, torch.Tensor],
        pending: Pending,
        stream: torch.cuda.Stream,
    ) -> None:
        self.slots, self.buffers, self.out = slots, buffers, out
        self.pending, self.stream = pending, stream

    def __call__(self, failed: bool) -> None:
        if failed:
            self.slots.release(self.buffers)  # nothing was queued from it
            return
        device = self.slots.device
        event = None
        try:
            # Runs in whichever thread finished the gather: bind the device and the stream.
            with torch.cuda.device(device), torch.cuda.stream(self.stream):
                copies = {
                    name: torch.empty(host.shape, dtype=host.dtype, device=device).copy_(
                        host, non_blocking=True
                    )
                    for name, host in self.out.items()
                }
                event = torch.cuda.Event()
                event.record(self.stream)
        finally:
            # With no event recorded nothing was queued after an error, or the copies
            # queued before it are ordered before anything the stream runs later:
            # synchronize the stream so the slot is certainly free.
            if event is None:
                with torch.cuda.device(device):
                    self.stream.synchronize()
            self.slots.release(self.buffers, after=event)
        self.pending._out, self.pending.event = copies, event
