"""Batches gathered on the host into a few reused slots, then delivered like chunks.

The host tier's delivery (:class:`BatchSlots`). A batch is gathered from host
storage (the shuffle buffer's arena, or a host chunk) by the gather pool
(:mod:`._gather`) into a *slot*: one array per field, ``batch_size`` windows.
:meth:`BatchSlots.submit` returns a :class:`Gather` (the gather's
:class:`~._gather.Job` and its slot); :meth:`BatchSlots.deliver` waits for the
job and makes the batch a :class:`~chunkstream.pipeline._jobs.Delivery`, the
type the loader's copy stage delivers chunks in; the consumer receives it with
the loader's own :func:`~chunkstream.pipeline._stages.receive`.

CUDA: the slots are page-locked (one registered arena, a
:class:`~chunkstream._memory.PinnedSlotPool` of ``slots`` sets). Ownership: the
pool, then the gather job (:meth:`BatchSlots.submit` acquires a slot, waiting
for the oldest copy's event if all are in flight), then, once every block is
done, the consumer, which queues the slot's copy with :meth:`BatchSlots.deliver`
in its own thread, in batch order: the loader's
:func:`~chunkstream.pipeline._jobs.copy_to_device` (fresh device tensors
allocated and copied on the transfer stream between two events; the slot back
behind the second, or behind a fence after a failed copy), so a slot is
refilled only once its copy has finished. A failed or cancelled gather gives
its slot back in the thread that ends it (:class:`_GiveBack`), and a gather
that finished but was never delivered is given back by the consumer
(:meth:`BatchSlots.abandon`). The consumer's stream waits on the done event
and ``record_stream`` tells the caching allocator where the tensors are used
(``receive``). The stored dtype is copied and converted on the device (half the
bytes for float16). Device memory: the batches in flight (``batch_prefetch``)
plus those the user holds.

The transfer stream is the slots' own: the host tier serves a CPU loader (a
CUDA loader's chunks are on the device already), which has no transfer stream
nor transfer thread; the copy path is the loader's function, run on one stream
made here per stream of batches.

CPU: the same path without the copy. The slots are pageable sets of a
:class:`~chunkstream._memory.HostBufferPool`; the batch handed to the user is
a view of its slot, and a slot is refilled only once no tensor refers to it
(an extra set is made while the user holds them all), so a steady loop writes
into pages already faulted in instead of fresh ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from .._memory import BufferSet, HostBufferPool, PinnedSlotPool
from ..pipeline import Delivery, copy_to_device
from ..sources import FieldSpec
from ._gather import GatherPool, Job, Watch, gather_blocks

__all__ = ["BatchSlots", "Gather"]


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a slot holding ``dtype`` (bfloat16 as its bits, int16)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.int16)
    return torch.empty(0, dtype=dtype).numpy().dtype


def _as_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if tensor.dtype != dtype else tensor


class BatchSlots:
    """Gathers batches of ``batch_size`` windows into ``slots`` reused host slots.

    ``device`` is where batches go (CPU or CUDA); ``pool`` the gather pool. The
    slot pool is made at the first batch, from the storage's shapes and dtypes.
    Not thread-safe: one consumer loop owns it (module docs for the slots' owners).
    """

    def __init__(
        self,
        device: torch.device,
        *,
        batch_size: int,
        window: int,
        slots: int,
        pool: GatherPool,
        watch: Watch | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.batch_size, self.window, self.slots = int(batch_size), int(window), int(slots)
        self.pool, self.watch = pool, watch
        self._slots: HostBufferPool | PinnedSlotPool | None = None
        self._layout: tuple | None = None
        # The transfer stream (module docs: a CPU loader has none to lend).
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
    ) -> Gather:
        """Start gathering the windows at ``starts`` (host ints, checked) of ``names``.

        ``storage[name]`` is a CPU tensor; ``dtypes[name]`` the batch's dtype. The
        gather runs on the pool's helpers now (and, unwatched, in the caller's
        :meth:`~._gather.Job.wait`); once its job is done, :meth:`deliver` makes
        the batch a :class:`~chunkstream.pipeline._jobs.Delivery`: on the CPU in
        ``dtypes`` (converted in the gather), on CUDA in the stored dtypes (converted
        on the device by the consumer, half the bytes copied for float16).
        """
        cuda = self._stream is not None
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
        job = self.pool.submit(fn, n_blocks, _GiveBack(slots, buffers), watch=self.watch)
        return Gather(job, slots, buffers, out)

    def deliver(self, gather: Gather) -> Delivery:
        """``gather``'s batch, its job done without error (waited for by the caller,
        bounded by its :class:`~._gather.Watch`): on the CPU the slot's views (the
        user's views keep it from reuse); on CUDA the slot copied on the transfer
        stream, back to its pool behind the copy (or behind a fence if the copy
        fails: the slot is this call's from its start). In the consumer's thread, in
        batch order (the copies queue in that order)."""
        if self._stream is None:
            gather.slots.release(gather.buffers)  # reused once no view of it is left
            return Delivery((), gather.out)
        with torch.cuda.device(self.device):
            return copy_to_device(
                gather.out, gather.buffers, gather.slots, self.device, self._stream
            )

    def abandon(self, gather: Gather) -> None:
        """Drop a gather never delivered: cancelled, its slot back now if every block was
        done, else by the job once its claimed blocks end (:class:`_GiveBack`)."""
        if gather.job.cancel():
            gather.slots.release(gather.buffers)  # nothing was queued from it


def _close_pools(pools: list[HostBufferPool | PinnedSlotPool]) -> None:
    for pool in pools:
        pool.close()  # idempotent; never raises; a copy still running keeps it pinned


class Gather(NamedTuple):
    """A batch being gathered: its job and the slot it fills (``out``: views of
    ``buffers``, a set of ``slots``)."""

    job: Job
    slots: HostBufferPool | PinnedSlotPool
    buffers: BufferSet
    out: dict[str, torch.Tensor]


class _GiveBack:
    """A gather job's ``then``, in the thread that ends it: after a failed or cancelled
    gather the slot goes back to its pool (nothing was queued from it); a finished
    one is the consumer's (:meth:`BatchSlots.deliver`)."""

    __slots__ = ("buffers", "slots")

    def __init__(self, slots: HostBufferPool | PinnedSlotPool, buffers: BufferSet) -> None:
        self.slots, self.buffers = slots, buffers

    def __call__(self, failed: bool) -> None:
        if failed:
            self.slots.release(self.buffers)
