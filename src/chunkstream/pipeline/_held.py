"""The held chunks as a source, and the tight window copies a batch is read with.

The shuffle buffer's storage (one tensor per field, ``mix * rows`` timesteps,
on the host: :meth:`~chunkstream.consumer._shuffle.HostTier.store`) is a :class:`HeldSource`: a
:class:`~chunkstream.sources.Source` whose fields are the stream's and whose
time axis is the storage's rows. A batch is a chunk of ``B`` one-window pieces
drawn over it, and :meth:`HeldSource.read_windows` reads those pieces into a
buffer set of shape ``(B, window, *field_shape)`` in one tight loop per field
(:func:`copy_windows`): no future per window; the parallelism is several batches
read at once on the executor's threads (:mod:`._lane`).

Each window is one numpy slice copy, a ``memcpy`` or a cast that releases the
GIL (torch's ``index_select`` runs on its intra-op pool, whose threads spin at
a barrier for one the OS has descheduled: on a busy node one batch then costs
tens of times its idle CPU time). A same-dtype window is copied as unsigned
ints by ``np.positive`` (the identity on them, bit for bit, NaN payloads
included), not by assignment: numpy's assignment is a ``memcpy``, which glibc
runs as ``rep movsb`` for a window of 2 KiB to 1 MiB, slower on AMD cores than
the vector loop it uses above that, where the ufunc's loop is one.

Thread-safety: reads only read the storage; the storage's rows are written by
the refill (:meth:`~._lane.BatchLane.fill`), which the lane runs only once
every read over those rows has finished (the ownership rule, :mod:`._lane`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Mapping

import numpy as np
import torch

from .._errors import ConfigError
from .._executor import Executor, done_within
from .._memory import thread_budget
from ..sources import FieldSpec

__all__ = [
    "HeldSource",
    "as_numpy",
    "check_host_starts",
    "compute_dtype",
    "copy_rows",
    "copy_windows",
    "gather_on_lent",
    "lend",
    "numpy_dtype",
]


def as_numpy(tensor: torch.Tensor) -> np.ndarray | None:
    """A numpy view of a CPU tensor's memory, or ``None`` for a dtype numpy lacks.

    bfloat16 is viewed as int16: copies move bytes, they need no arithmetic.
    """
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):  # complex32 and the like
        return None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a host buffer holding ``dtype`` (bfloat16 as its bits, int16)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.int16)
    return torch.empty(0, dtype=dtype).numpy().dtype


#: Windows of at least this many bytes are copied by glibc's ``memcpy``, which writes
#: with streaming stores above its non-temporal threshold (a share of the L3 it sees;
#: ``GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=...`` sets it); smaller ones by a
#: ufunc loop over the bytes as unsigned ints.
MEMCPY_FROM = 4 << 20

_BITS = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}


# The loops below are a batch read's only per-window Python: one slice and one copy each.
def _numpy_windows(src: np.ndarray, dst: np.ndarray, starts: list[int], window: int) -> None:
    for b, s in enumerate(starts):
        dst[b] = src[s : s + window]


def _bits_windows(src: np.ndarray, dst: np.ndarray, starts: list[int], window: int) -> None:
    for b, s in enumerate(starts):
        np.positive(src[s : s + window], out=dst[b])


def _torch_windows(src: torch.Tensor, dst: torch.Tensor, starts: list[int], window: int) -> None:
    for b, s in enumerate(starts):
        dst[b].copy_(src[s : s + window])


def window_copy(
    src_t: torch.Tensor, out_t: torch.Tensor
) -> tuple[Callable[..., None], object, object]:
    """``(copy, src, dst)``: ``copy(src, dst, starts, window)`` fills ``out_t[b] =
    src_t[s_b : s_b + window]`` (CPU tensors), converting where the dtypes differ
    (numpy's cast, or torch's for a dtype numpy lacks)."""
    src, dst = as_numpy(src_t), as_numpy(out_t)
    mixed = src_t.dtype != out_t.dtype and torch.bfloat16 in (src_t.dtype, out_t.dtype)
    if src is None or dst is None or mixed:
        return _torch_windows, src_t, out_t
    if src.dtype == dst.dtype and src.dtype.itemsize in _BITS:
        if dst[:1].nbytes >= MEMCPY_FROM:  # a window this large: glibc's memcpy
            return _numpy_windows, src, dst
        bits = _BITS[src.dtype.itemsize]  # the same bytes, copied by a ufunc loop
        return _bits_windows, src.view(bits), dst.view(bits)
    return _numpy_windows, src, dst


def copy_windows(src: torch.Tensor, out: torch.Tensor, starts: list[int], window: int) -> None:
    """``out[b] = src[starts[b] : starts[b] + window]`` for every ``b``, in this thread."""
    copy, a, b = window_copy(src, out)
    copy(a, b, starts, window)


#: The readers of the CPU loaders open now (:func:`lend`): a gather in the caller's own
#: loop (``cs.gather_windows`` on the CPU) splits its windows over the caller and them.
_LENT: weakref.WeakSet[Executor] = weakref.WeakSet()
#: A batch smaller than this is copied by the caller alone (a split would cost more).
SPLIT_FROM = 1 << 20


def lend(readers: Executor) -> None:
    """Let gathers in the caller's loop use ``readers`` (a CPU loader's; until they close)."""
    _LENT.add(readers)


def gather_on_lent(src: torch.Tensor, out: torch.Tensor, starts: list[int], window: int) -> None:
    """:func:`copy_windows`, its windows split over this thread and an open CPU loader's
    readers (:func:`lend`; at most this process's thread budget in all).

    This thread copies the first part, then every part no reader has started (it
    claims it back and copies it itself: one atomic step, where ``Future.cancel``
    would take the future's condition, which a signal handler raising in this thread
    could leave held), then waits for the parts readers are copying: busy readers (a
    chunk's read) never make a gather wait behind them, and a gather is never slower
    than this thread alone. A part refused by readers that closed since they were
    picked was never claimed by one, so it is copied here. A part's error is raised here.
    """
    readers = next((r for r in list(_LENT) if not r.closed), None)
    parts = 1 if readers is None else min(thread_budget(), 1 + len(readers.threads))
    if parts < 2 or out.nbytes < SPLIT_FROM or len(starts) < 2 * parts:
        copy_windows(src, out, starts, window)
        return
    cut = [round(k * len(starts) / parts) for k in range(parts + 1)]
    spans = list(itertools.pairwise(cut))

    def part(lo: int, hi: int) -> None:
        copy_windows(src, out[lo:hi], starts[lo:hi], window)

    lent = [(readers.submit(part, lo, hi, what="gather"), lo, hi) for lo, hi in spans[1:]]
    part(*spans[0])
    running = []
    for future, lo, hi in lent:
        if future.claim():  # no reader started it (or its readers closed): copied here
            part(lo, hi)
        else:
            running.append(future)
    for future in running:
        while not done_within(future):  # a reader is copying it: at most 1/parts of the batch
            pass
        future.result(timeout=0)


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[:] = src`` (same shape, CPU): one numpy copy (a ``memcpy``), or torch's."""
    a, b = as_numpy(dst), as_numpy(src)
    if a is None or b is None or dst.dtype != src.dtype:
        dst.copy_(src)
    else:
        a[...] = b


# The compute dtypes a floating-point chunk may be converted to in the gather.
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def compute_dtype(dtype: object, stored: torch.dtype) -> torch.dtype:
    """The dtype a chunk of ``stored`` dtype gathers into, given ``dtype=``."""
    if dtype is None:
        return stored
    if not any(dtype is d for d in COMPUTE_DTYPES):  # `is`: a numpy dtype's == would convert
        raise ConfigError.bad(
            "dtype",
            dtype,
            f"None or one of {', '.join(map(str, COMPUTE_DTYPES))}",
            "Pass a floating torch dtype such as torch.float32 (masks and indices keep "
            "their stored dtype on their own).",
        )
    return dtype if stored.is_floating_point else stored


def check_host_starts(starts: torch.Tensor, length: int, window: int) -> list[int]:
    """``starts`` as host ints, each a valid window start in a tensor of ``length`` rows."""
    values = starts.tolist()
    if values and (min(values) < 0 or max(values) > length - window):
        bad = next(v for v in values if not 0 <= v <= length - window)
        raise ConfigError.bad(
            "starts",
            f"a start {bad}",
            f"starts in [0, {length - window}] (window={window})",
            "Draw them with cs.sample_windows(chunk, ...) over this tensor.",
        )
    return values


class HeldSource:
    """The held chunks on the host as a :class:`~chunkstream.sources.Source`.

    ``storage``: one CPU tensor per field (the buffer's arena, or with ``mix=1`` the
    held chunk itself), all with the same rows; its fields are the stream's.
    ``read_into`` reads a plain window of rows (the source protocol);
    :meth:`read_windows` reads a batch: ``B`` one-window pieces.
    """

    def __init__(self, storage: Mapping[str, torch.Tensor]) -> None:
        self.storage = dict(storage)
        self._len = int(next(iter(self.storage.values())).shape[0]) if self.storage else 0

    @property
    def fields(self) -> dict[str, FieldSpec]:
        return {
            n: FieldSpec(tuple(t.shape[1:]), numpy_dtype(t.dtype)) for n, t in self.storage.items()
        }

    def __len__(self) -> int:
        return self._len

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        for name, array in out.items():
            src = as_numpy(self.storage[name][start:stop])
            if src is None:
                raise ConfigError.bad("field", name, "a field of a dtype numpy can view")
            array[...] = src

    def read_windows(self, starts: list[int], window: int, out: Mapping[str, torch.Tensor]) -> None:
        """``out[name][b] = storage[name][starts[b] : starts[b] + window]`` for each field
        of ``out`` (CPU tensors of shape ``(B, window, ...)``, converting to their dtype)."""
        for name, dst in out.items():
            copy_windows(self.storage[name], dst, starts, window)

    def close(self) -> None:
        """Nothing to release: the storage is the stream's."""
