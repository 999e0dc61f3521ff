"""Host buffers the readers fill: one arena of buffer sets, pinned on CUDA.

A *buffer set* holds one array per field, ``chunk_size`` rows long; a reader fills
the first rows of each in place. The arena is one anonymous ``mmap`` carved into
``slots`` sets (each field's offset aligned to 256 B), allocated at construction:
on the CPU faulted in there (by the kernel, ``MAP_POPULATE``, where it offers that;
on transparent huge pages only if :data:`HUGEPAGES` is set), on CUDA faulted in and
page-locked by ``cudaHostRegister``.

CUDA (:class:`PinnedSlotPool`): a slot is owned by the pool, then one reader, then
the copy job, which gives it back with :meth:`~PinnedSlotPool.release` (``after=`` its event) and
the event recorded after its copy; the slot is handed out again only once that
event has completed. User tensors never alias a slot. The arena bypasses torch's
caching host allocator (which rounds blocks up to a power of two and keeps them
cached); only if registration fails is it one ``pin_memory=True`` block, with a
warning. Register and unregister each run on a one-call ``pin`` executor (a thread
bound to the pool's device), waited for with a deadline, so a failed call leaves no CUDA
"last error" in the caller's thread. After a CUDA
error (an event's ``query()`` raises) the copies are not proven finished, so the
arena stays pinned and referenced and ``close`` warns instead of raising.

CPU (:class:`HostBufferPool`): the consumer's tensors are zero-copy views of a set,
so a set is reused only once no tensor refers to it (its arrays' reference counts
are back at their baseline); when the user holds every set, an extra one is
allocated, and idle extras are kept only up to the arena's size.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Protocol

import numpy as np
import torch

from .._device import device_binder
from .._executor import POLL_S as _POLL_S
from .._executor import Executor
from .._text import format_bytes


class FieldSpec(Protocol):
    """What the arena reads of a field (``chunkstream.sources.FieldSpec``): named here,
    not imported, since ``sources`` sizes its decode threads from this package."""

    @property
    def dtype(self) -> object: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


__all__ = ["BufferSet", "HostBufferPool", "PinnedSlotPool"]


class BufferSet:
    """One array per field, ``rows`` timesteps long; ``arrays`` is what a reader fills."""

    __slots__ = ("arrays", "baseline", "busy", "in_arena", "tensors")

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        tensors: dict[str, torch.Tensor] | None,
        *,
        in_arena: bool = True,
    ) -> None:
        self.arrays = arrays
        self.tensors = tensors  # the pinned tensors behind ``arrays`` (CUDA slots only)
        self.busy = False  # held by the pipeline (CPU pool): not reusable whatever the refcount
        self.in_arena = in_arena
        self.baseline = _refs(self)  # the reference count while nobody else holds the set

    def views(self, rows: int) -> dict[str, np.ndarray]:
        return {name: array[:rows] for name, array in self.arrays.items()}


def _owner(array: np.ndarray) -> object:
    """The object every view of ``array`` references (numpy collapses view chains to it)."""
    return array if array.base is None else array.base


def _refs(buffers: BufferSet) -> int:
    return max((sys.getrefcount(_owner(a)) for a in buffers.arrays.values()), default=0)


_ALIGN = 256  # each field's offset in the arena: aligned for any dtype and for DMA
_PAGE = mmap.PAGESIZE
# Ask for transparent huge pages. Off: where the kernel compacts memory on such a fault
# (THP defrag "madvise", the common default) that stalls construction for seconds and
# gains no read speed (BENCHMARKS.md, "A new loader's first epoch").
HUGEPAGES = False

_Layout = list[tuple[str, int, int, np.dtype, tuple[int, ...]]]


def _layout(fields: Mapping[str, FieldSpec], rows: int, slots: int) -> tuple[_Layout, int]:
    """Where each slot's fields lie in the arena, and the bytes they use."""
    layout: _Layout = []
    offset = 0
    for _ in range(slots):
        for name, spec in fields.items():
            dtype = np.dtype(spec.dtype)
            size = int(rows) * int(np.prod(spec.shape, dtype=np.int64)) * dtype.itemsize
            layout.append((name, offset, size, dtype, (int(rows), *spec.shape)))
            offset += -(-max(size, 1) // _ALIGN) * _ALIGN
    return layout, offset


def _anonymous(nbytes: int, *, touch: bool) -> mmap.mmap:
    """Private anonymous pages, page-aligned, at least ``nbytes``; ``touch`` (the CPU
    arena) faults every page in now (on CUDA, registering does)."""
    size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
    huge = touch and HUGEPAGES and hasattr(mmap, "MADV_HUGEPAGE")
    # MAP_POPULATE faults the pages in inside mmap, faster than a write per page; huge
    # pages must be asked for before the first fault, so they are touched by hand.
    populate = mmap.MAP_POPULATE if touch and not huge and hasattr(mmap, "MAP_POPULATE") else 0
    flags = getattr(mmap, "MAP_PRIVATE", 0) | populate
    mapping = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    if huge:
        with contextlib.suppress(OSError):  # a kernel without THP: plain pages
            mapping.madvise(mmap.MADV_HUGEPAGE)
    if touch and not populate:
        np.frombuffer(mapping, dtype=np.uint8)[::_PAGE] = 0
    return mapping


def _carve(arena: np.ndarray, layout: _Layout, fields: int, *, tensors: bool) -> list[BufferSet]:
    """The buffer sets ``layout`` describes, as views of ``arena`` (a flat uint8 array)."""
    sets = []
    memory = memoryview(arena)
    for k in range(len(layout) // max(1, fields)):
        # One buffer object per array, so each array is the base of its own views and
        # its reference count tells whether anyone still holds this set (_refs).
        arrays = {
            name: np.frombuffer(memory[begin : begin + length], dtype=dtype).reshape(shape)
            for name, begin, length, dtype, shape in layout[k * fields : (k + 1) * fields]
        }
        pinned = {name: torch.from_numpy(a) for name, a in arrays.items()} if tensors else None
        sets.append(BufferSet(arrays, pinned))
    return sets


class HostBufferPool:
    """Reusable pageable host buffer sets for the CPU path: an arena of ``slots`` sets
    faulted in at construction, plus extra sets while the user holds them all."""

    def __init__(self, fields: Mapping[str, FieldSpec], rows: int, *, slots: int) -> None:
        self._fields = dict(fields)
        self._rows = int(rows)
        self.slots = int(slots)
        self._lock = threading.Lock()
        layout, nbytes = _layout(self._fields, self._rows, self.slots)
        mapping = _anonymous(nbytes, touch=True)
        # Every set's arrays reference the mapping; it is freed with the last of them.
        self._sets = _carve(
            np.frombuffer(mapping, dtype=np.uint8), layout, len(self._fields), tensors=False
        )
        self.nbytes = len(mapping)
        self.allocated = len(self._sets)  # sets ever allocated, the arena's included

    def acquire(self, cancelled: Callable[[], bool] | None = None) -> BufferSet:
        """A set no one holds (an arena set first); never waits: allocates one if none is."""
        del cancelled
        with self._lock:
            free = [b for b in self._sets if not b.busy and _refs(b) <= b.baseline]
            extra_idle = [b for b in free if not b.in_arena]
            for extra in extra_idle[max(0, self.slots - (len(free) - len(extra_idle))) :]:
                self._sets.remove(extra)  # idle sets beyond the arena's size are let go
                free.remove(extra)
            if free:
                buffers = free[0]
            else:
                arrays = {
                    name: np.empty((self._rows, *spec.shape), dtype=spec.dtype)
                    for name, spec in self._fields.items()
                }
                buffers = BufferSet(arrays, None, in_arena=False)
                self.allocated += 1
                self._sets.append(buffers)
            buffers.busy = True
            return buffers

    def release(self, buffers: BufferSet, after: object = None) -> None:
        """The pipeline is done with ``buffers``; reuse waits until the user's tensors die
        (``after``: ``None``; no copy reads pageable sets in the background)."""
        assert after is None, "a pageable set is never read by a queued copy"
        buffers.busy = False

    def close(self, timeout: float = 0.0, *, unpin: bool = True) -> bool:
        """Forget every set (user tensors keep theirs alive); nothing is pinned here."""
        del timeout, unpin
        with self._lock:
            self._sets.clear()
        return True


def _power_of_two_ceil(n: int) -> int:
    """What torch's caching host allocator rounds a pinned block up to."""
    return 1 << max(0, n - 1).bit_length()


_REGISTER_TIMEOUT_S = 120.0  # pinning tens of GB takes seconds; a hung driver call gives up here
_KEPT: list[object] = []  # arenas kept pinned: referenced until the process exits


def _cuda_call(
    device: torch.device, call: Callable[[], object], what: str, timeout: float
) -> str | None:
    """Run ``call`` (a CUDA runtime call returning its error code) on a one-call ``pin``
    executor bound to ``device``; ``None`` on success, else what went wrong, exception
    text included.

    A failed call sets its thread's CUDA "last error", which torch would later
    report as its own failure, so it runs in a thread that does nothing else and
    ends with it; the wait gives up after ``timeout`` s (a hung driver call does not
    hang the caller; its daemon thread is left to the process).
    """
    pin = Executor("pin", 1, device_binder(device))
    future = pin.submit(call, what=what)
    try:
        code = int(future.result(timeout))  # type: ignore[call-overload]
    except FutureTimeout:
        return f"{what} did not return within {timeout:.0f} s"
    except Exception as exc:  # a thread boundary: handed to the caller as text
        return f"{type(exc).__name__}: {exc}"
    finally:
        pin.close(time.monotonic() + (_POLL_S if future.done() else 0.0))
    return None if code == 0 else f"cudaError {code}"


def _register(device: torch.device, ptr: int, nbytes: int) -> str | None:
    """``cudaHostRegister(ptr, nbytes, Portable)``; ``None`` or what went wrong."""
    # 1 = cudaHostRegisterPortable: pinned for every CUDA context, as torch's pinned memory.
    return _cuda_call(
        device,
        lambda: torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1),
        "cudaHostRegister",
        _REGISTER_TIMEOUT_S,
    )


def _unregister(device: torch.device, ptr: int, timeout: float) -> str | None:
    """``cudaHostUnregister(ptr)``; ``None`` or what went wrong."""
    return _cuda_call(
        device, lambda: torch.cuda.cudart().cudaHostUnregister(ptr), "cudaHostUnregister", timeout
    )


class PinnedSlotPool:
    """A fixed pool of page-locked buffer sets reused across chunks (see module docs).

    ``nbytes``: page-locked bytes held (the arena's true size, 0 once ``close`` released
    it); ``requested_nbytes``: what the slots use; ``registered``: false on the fallback.
    """

    def __init__(
        self,
        fields: Mapping[str, FieldSpec],
        rows: int,
        *,
        slots: int,
        device: torch.device | None = None,
    ) -> None:
        self.slots = int(slots)
        # An explicit index: the pool's CUDA calls run in other threads (module docs).
        self.device = (
            torch.device(device)
            if device is not None
            else torch.device("cuda", torch.cuda.current_device())
        )
        # Entered as ``with self._lock`` (C code), never ``with self._cond``: a signal
        # handler that raises inside Condition.__enter__, a Python function, after it
        # took the lock would leak it (bpo-29988), and the main thread takes this one.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._free: deque[BufferSet] = deque()
        self._pending: deque[tuple[torch.cuda.Event, BufferSet]] = deque()
        self._closed, self._close_lock = False, threading.Lock()
        self._released: bool | None = None  # what close() returned, once it ran
        self._kept: list[object] = []  # this pool's arenas in _KEPT (see _keep)
        layout, offset = _layout(fields, rows, self.slots)
        self.requested_nbytes = offset
        # Registration faults every page in, so the mapping is not touched here.
        self._mmap: mmap.mmap | None = _anonymous(offset, touch=False)
        size = len(self._mmap)
        arena = np.frombuffer(self._mmap, dtype=np.uint8)
        self._ptr: int | None = arena.ctypes.data
        self._torch_arena: torch.Tensor | None = None
        error = _register(self.device, self._ptr, size)
        if error is None:
            self.registered, self.nbytes = True, size
        else:
            if "did not return" in error:  # timed out: the call may still pin these pages
                self._keep(self._mmap)
            # Otherwise the arena goes back to the OS when its views die; pin through
            # torch instead.
            del arena
            self._mmap, self._ptr = None, None
            # Under the pool's device: this may be the first CUDA call of the caller's
            # thread, whose current device can be another GPU (or none yet).
            with torch.cuda.device(self.device):
                self._torch_arena = torch.empty(offset, dtype=torch.uint8, pin_memory=True)
            arena = self._torch_arena.numpy()
            self.registered, self.nbytes = False, _power_of_two_ceil(offset)
            warnings.warn(
                f"chunkstream: cudaHostRegister of the {format_bytes(size)} pinned arena failed "
                f"({error}); pinned it with torch instead, which rounds it up to "
                f"{format_bytes(self.nbytes)}. Lower host_slots or chunk_size if that is too much.",
                RuntimeWarning,
                stacklevel=3,
            )
        self._free.extend(_carve(arena, layout, len(fields), tensors=True))

    def _keep(self, arena: object) -> None:
        """Never free ``arena`` (a CUDA call may still use it), even after this pool dies."""
        self._kept.append(arena)
        _KEPT.append(arena)

    def acquire(self, cancelled: Callable[[], bool] | None = None) -> BufferSet:
        """A free slot; if none is, the oldest one given back once its copy has finished.

        That wait is the copy event's ``synchronize()`` (a blocking-sync event, so the
        thread sleeps in the driver, never spins or polls) outside the pool's lock; it
        is bounded by the copies already queued on the one transfer stream. With nothing
        given back yet it waits on the condition (a release wakes it), checking
        ``cancelled`` every :data:`POLL_S`. The event stays queued while it is waited
        for, so :meth:`close` still waits for that copy before unpinning. ``synchronize``
        has no device guard: the caller must have set the pool's device.
        """
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("pinned slot pool is closed")
                if self._free:
                    return self._free.popleft()
                oldest = self._pending[0] if self._pending else None
                if oldest is None:
                    self._cond.wait(_POLL_S)
            if oldest is not None:
                oldest[0].synchronize()  # one stream: copies end in order, this one first
                with self._lock:
                    if not self._closed and self._pending and self._pending[0] is oldest:
                        return self._pending.popleft()[1]
                # Another acquirer took it, or the pool closed: look again.
            if cancelled is not None and cancelled():
                raise InterruptedError("acquire cancelled")

    def release(self, buffers: BufferSet, after: torch.cuda.Event | None = None) -> None:
        """Give a slot back; it is reused only once ``after`` (its copy's event, if any)
        has completed."""
        with self._lock:
            if after is None:
                self._free.append(buffers)
            else:
                self._pending.append((after, buffers))
            self._cond.notify_all()

    def close(self, timeout: float = 5.0, *, unpin: bool = True) -> bool:
        """Stop handing out slots; once every queued copy has finished, unpin the arena.

        ``unpin=False`` (a copy may still be issued), a copy unfinished at ``timeout``
        or a CUDA error while checking leaves the memory pinned and referenced until
        the process ends (never unmapped under a DMA), with a warning but for the first.
        Returns whether the arena was released; never raises; at most ``timeout`` plus
        one poll; idempotent (a second call returns the first one's answer).
        """
        # Held for the whole close, so a concurrent second call cannot unpin while the
        # first still waits for copies; the holder's waits are all bounded.
        with self._close_lock:
            if self._released is not None:
                return self._released
            with self._lock:
                self._closed = True
                pending = [event for event, _ in self._pending]
                self._pending.clear()
                self._free.clear()
                self._cond.notify_all()
            self._released = self._release(pending, time.monotonic() + timeout, unpin)
            return self._released

    def _copies_finished(self, pending: list[torch.cuda.Event], deadline: float) -> bool:
        # Often called from the main thread, whose current device may be another
        # GPU (or none yet): query() has no device guard.
        with torch.cuda.device(self.device), self._lock:
            while not all(event.query() for event in pending):
                if time.monotonic() >= deadline:
                    return False
                # Closed: nothing notifies. A CUDA event has no wait with a timeout and
                # close has a deadline, so the events are checked once per POLL_S.
                self._cond.wait(_POLL_S)
        return True

    def _release(self, pending: list[torch.cuda.Event], deadline: float, unpin: bool) -> bool:
        problem = None  # why the arena must stay pinned and referenced, if it must
        if unpin and pending:
            try:
                if not self._copies_finished(pending, deadline):
                    problem = "its last copies had not finished by close's deadline"
            except Exception as exc:  # a sticky CUDA error: the copies are not proven done
                problem = f"checking that its copies finished failed ({type(exc).__name__}: {exc})"
        ptr, self._ptr = self._ptr, None
        torch_arena, self._torch_arena = self._torch_arena, None
        if ptr is not None and unpin and problem is None:
            # A reader stuck past close may still write into its slot: that is plain
            # host memory after this, and the mmap lives until its last view dies.
            # On the pin thread: a failure must not stay as this thread's last error.
            error = _unregister(self.device, ptr, max(deadline - time.monotonic(), _POLL_S))
            if error is not None:  # maybe still registered: never unmap it
                problem = f"cudaHostUnregister failed ({error})"
        elif torch_arena is not None and unpin and problem is None:
            try:  # all under the pool's device: freeing queries events, emptying cudaFreeHost
                with torch.cuda.device(self.device):
                    torch.cuda.synchronize(self.device)  # the allocator's free-time events
                    torch_arena = None  # its slots' views were dropped above: the block is free
                    empty = getattr(torch._C, "_host_emptyCache", None)
                    if empty is not None:  # hands every *free* cached pinned block back to the OS
                        empty()
            except Exception as exc:
                problem = f"freeing it on {self.device} failed ({type(exc).__name__}: {exc})"
        if not unpin or problem is not None:
            # Keep the arena referenced, so it is never unmapped under a copy.
            self._keep((torch_arena, self._mmap))
            if problem is not None:
                warnings.warn(
                    f"chunkstream: the {format_bytes(self.nbytes)} pinned arena on {self.device} "
                    f"stays pinned until the process exits: {problem}. Nothing to do unless "
                    "the process keeps running and creating loaders; then restart it.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return False
        self._mmap, self.nbytes = None, 0
        return True
