"""Host buffers the readers fill: a fixed pinned pool (CUDA) or reusable host arrays (CPU).

A *buffer set* holds one array per field, ``chunk_size`` rows long; a reader
fills the first ``stop - start`` rows of each in place.

Ownership, CUDA (:class:`PinnedSlotPool`)
    ``slots`` buffer sets of page-locked memory are allocated once, at start, so
    pinned bytes are exactly ``slots * chunk_bytes`` for the loader's life. A
    slot is owned by the pool (free), then by one reader (filling), then by the
    transfer stage (copying); the transfer stage gives it back with
    :meth:`PinnedSlotPool.release_after` and the event recorded after its copy,
    and the slot is handed out again only once that event has completed.
    User tensors never alias a slot: they get device copies.

Ownership, CPU (:class:`HostBufferPool`)
    The consumer's tensors are zero-copy views of the buffer set, so a set
    is reused only once no tensor of the user's refers to it any more. That is
    detected from reference counts: ``torch.from_numpy`` keeps a reference to
    its array for as long as any tensor or view of that memory is alive. The
    pool keeps at most ``max_free`` idle sets (reused pages are ~40% cheaper to
    fill than fresh ones); sets still held by the user are simply forgotten and
    freed by Python when the user drops them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

import numpy as np
import torch

from ..sources._base import FieldSpec

__all__ = ["BufferSet", "HostBufferPool", "PinnedSlotPool"]

_POLL_S = 0.1


class BufferSet:
    """One array per field, ``rows`` timesteps long; ``arrays`` is what a reader fills."""

    __slots__ = ("arrays", "busy", "tensors")

    def __init__(self, arrays: dict[str, np.ndarray], tensors: dict[str, torch.Tensor] | None):
        self.arrays = arrays
        self.tensors = tensors  # the pinned tensors behind ``arrays`` (CUDA slots only)
        self.busy = False  # held by the pipeline (CPU pool): not reusable whatever the refcount

    def views(self, rows: int) -> dict[str, np.ndarray]:
        return {name: array[:rows] for name, array in self.arrays.items()}


class HostBufferPool:
    """Reusable pageable host buffer sets for the CPU path (see module docs)."""

    def __init__(self, fields: Mapping[str, FieldSpec], rows: int, *, max_free: int) -> None:
        self._fields = dict(fields)
        self._rows = int(rows)
        self._max_free = int(max_free)
        self._lock = threading.Lock()
        self._sets: list[BufferSet] = []  # every set the pool still tracks
        self.allocated = 0  # how many sets were ever allocated (a test and stats figure)
        # The reference count of an array nobody else holds, as _refs sees it.
        self._baseline = self._refs(BufferSet({"probe": np.empty(0)}, None))

    def acquire(self, cancelled: Callable[[], bool] | None = None) -> BufferSet:
        del cancelled  # never waits: a new set is allocated when none is free
        with self._lock:
            free = [b for b in self._sets if not b.busy and self._is_free(b)]
            # Keep at most max_free idle sets; sets still in use stay tracked so they
            # can be reused once the user lets go.
            for extra in free[self._max_free :]:
                self._sets.remove(extra)
            if free:
                buffers = free[0]
            else:
                buffers = BufferSet(
                    {
                        name: np.empty((self._rows, *spec.shape), dtype=spec.dtype)
                        for name, spec in self._fields.items()
                    },
                    None,
                )
                self.allocated += 1
                self._sets.append(buffers)
            buffers.busy = True
            return buffers

    def release(self, buffers: BufferSet) -> None:
        """The pipeline is done with ``buffers``; reuse waits until the user's tensors die."""
        buffers.busy = False

    @staticmethod
    def _refs(buffers: BufferSet) -> int:
        return max(sys.getrefcount(array) for array in buffers.arrays.values())

    def _is_free(self, buffers: BufferSet) -> bool:
        # Any view or tensor made from an array (a reader's slice, a user's
        # tensor) adds a reference above the baseline measured at start.
        return self._refs(buffers) <= self._baseline

    def close(self) -> None:
        with self._lock:
            self._sets.clear()


class PinnedSlotPool:
    """A fixed pool of page-locked buffer sets reused across chunks (see module docs)."""

    def __init__(self, fields: Mapping[str, FieldSpec], rows: int, *, slots: int) -> None:
        self.slots = int(slots)
        self._cond = threading.Condition()
        self._free: deque[BufferSet] = deque()
        self._pending: deque[tuple[torch.cuda.Event, BufferSet]] = deque()
        self._closed = False
        for _ in range(self.slots):
            tensors = {
                name: torch.empty(
                    (rows, *spec.shape),
                    dtype=torch.from_numpy(np.empty(0, dtype=spec.dtype)).dtype,
                    pin_memory=True,
                )
                for name, spec in fields.items()
            }
            arrays = {name: tensor.numpy() for name, tensor in tensors.items()}
            self._free.append(BufferSet(arrays, tensors))
        self.nbytes = sum(
            t.numel() * t.element_size() for b in self._free for t in (b.tensors or {}).values()
        )

    def acquire(self, cancelled: Callable[[], bool] | None = None) -> BufferSet:
        """A free slot; waits (polling, stoppable) for the oldest copy to finish if none is."""
        while True:
            with self._cond:
                if self._closed:
                    raise RuntimeError("pinned slot pool is closed")
                if self._free:
                    return self._free.popleft()
                if self._pending and self._pending[0][0].query():
                    return self._pending.popleft()[1]
                has_pending = bool(self._pending)
                if not has_pending:
                    self._cond.wait(_POLL_S)
            if cancelled is not None and cancelled():
                raise InterruptedError("acquire cancelled")
            if has_pending:
                # The copy of the oldest slot is in flight; it finishes on its own.
                time.sleep(0.0005)

    def release_after(self, buffers: BufferSet, event: torch.cuda.Event | None) -> None:
        """Give a slot back; it is reused only once ``event`` (its copy) has completed."""
        with self._cond:
            if event is None:
                self._free.append(buffers)
            else:
                self._pending.append((event, buffers))
            self._cond.notify_all()

    def release(self, buffers: BufferSet) -> None:
        self.release_after(buffers, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
