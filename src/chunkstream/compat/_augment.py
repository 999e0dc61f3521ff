"""The original's augmentation: zero k random neurons, and find them with their CSR neighbours;
and its batch sampler, :func:`sample_batch_within_chunk` (``chunkstream.compat`` exports it).

The connectivity is a CSR matrix: neuron ``i``'s neighbours are
``wmat_indices[wmat_indptr[i] : wmat_indptr[i + 1]]``. Everything runs on the
device of ``selected``.

Per-batch cost on a GPU: the CSR arrays are uploaded to the device once per
(array, device) and reused while the caller's arrays live (a numpy array
copied from pageable memory on every batch would be a synchronous upload: the
host waits for the stream first); and the one host sync is the size of the
result (the union's size is data-dependent, so a ``nonzero`` must read it
back). Neighbours are gathered with a padded ``(k, max_degree)`` index built
on the device, the maximum degree being known on the host at upload, so no
count is read back to size an intermediate. The cache assumes the CSR arrays
are not modified in place while cached (it holds weak references and is keyed
by identity); an entry is dropped, with its device copy, as soon as either of the
caller's arrays is collected (a weakref callback), and at most 8 are kept.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

from .._errors import ConfigError, check_int

__all__ = ["neighbour_union", "sample_batch_within_chunk", "zero_neurons_with_neighbours"]


class _DeviceCSR:
    """The CSR arrays on one device, as long tensors, with the maximum row degree."""

    __slots__ = ("indices", "indptr", "max_degree", "refs", "width")

    def __init__(self, indices: Any, indptr: Any, device: torch.device, refs: tuple) -> None:
        host_ptr = torch.as_tensor(indptr).reshape(-1).to("cpu", torch.long)
        host_idx = torch.as_tensor(indices).reshape(-1).to("cpu", torch.long)
        # copies even on the CPU: a view would keep the caller's arrays alive (as_tensor
        # shares a numpy array's memory), so the cache's weak references would never die
        self.indptr = host_ptr.to(device, copy=True)
        self.indices = host_idx.to(device, copy=True)
        self.max_degree = int((host_ptr[1:] - host_ptr[:-1]).max()) if host_ptr.numel() > 1 else 0
        # Neuron ids the union can hold: the rows, and any column index beyond them.
        rows = max(0, host_ptr.numel() - 1)
        self.width = max(rows, int(host_idx.max()) + 1 if host_idx.numel() else 0)
        self.refs = refs  # weak references to the caller's arrays (identity check)


_CACHE: dict[tuple[int, int, str], _DeviceCSR] = {}
# Reentrant: a weakref callback (_forget) can run from a collection triggered while this
# thread holds the lock.
_CACHE_LOCK = threading.RLock()
_CACHE_SIZE = 8  # distinct (CSR, device) pairs kept; a run uses one or two
#: CSR uploads so far (a test figure: one per CSR and device); counted under the lock.
uploads = 0


def _forget(key: tuple[int, int, str], ref: weakref.ref) -> None:
    """Weakref callback: one of the caller's arrays died, so drop its device copy now."""
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        if entry is not None and any(r is ref for r in entry.refs):
            del _CACHE[key]


def _weak(obj: Any, key: tuple[int, int, str]) -> Any:
    try:
        return weakref.ref(obj, lambda ref: _forget(key, ref))
    except TypeError:  # a list or other container: never cached
        return None


def _device_csr(indices: Any, indptr: Any, device: torch.device) -> _DeviceCSR:
    """The cached device copy of the CSR (uploaded on first use for this device)."""
    global uploads
    key = (id(indices), id(indptr), str(device))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit.refs[0]() is indices and hit.refs[1]() is indptr:
            return hit
    refs = (_weak(indices, key), _weak(indptr, key))
    csr = _DeviceCSR(indices, indptr, device, refs)
    with _CACHE_LOCK:
        uploads += 1
        if refs[0] is not None and refs[1] is not None:
            while len(_CACHE) >= _CACHE_SIZE:  # oldest first; pop: a callback may race us
                _CACHE.pop(next(iter(_CACHE)), None)
            _CACHE[key] = csr
    return csr


def neighbour_union(selected: torch.Tensor, wmat_indices: Any, wmat_indptr: Any) -> torch.Tensor:
    """Sorted unique ``selected ∪ {neighbours of each selected neuron}`` as a long tensor.

    ``wmat_indices`` and ``wmat_indptr`` are the CSR arrays (numpy or torch);
    the result lives on ``selected``'s device. One host sync (the result's size).
    """
    selected = torch.as_tensor(selected)
    device = selected.device
    selected = selected.to(torch.long).reshape(-1)
    if selected.numel() == 0:
        return selected.clone()
    csr = _device_csr(wmat_indices, wmat_indptr, device)
    if csr.indptr.numel() < 2:
        raise ConfigError.bad("wmat_indptr", f"{csr.indptr.numel()} entries", "at least 2 (CSR)")
    # A mask over the neurons: the union and its sorting come from one nonzero().
    mask = torch.zeros(csr.width, dtype=torch.bool, device=device)
    # index_fill_ takes its value as a kernel argument; `mask[idx] = True` would first
    # copy a CPU scalar tensor to the device, a synchronous copy per call.
    mask.index_fill_(0, selected, True)
    if csr.max_degree > 0:
        begin = csr.indptr[selected]
        counts = csr.indptr[selected + 1] - begin
        offsets = torch.arange(csr.max_degree, device=device)
        flat = begin[:, None] + offsets  # (k, max_degree) positions into `indices`
        valid = offsets < counts[:, None]
        # Padding positions read index 0 of `indices`, then point at a selected neuron
        # (already in the union), so no entry is filtered out with a sync.
        flat = torch.where(valid, flat, torch.zeros_like(flat))
        neighbours = torch.where(valid, csr.indices[flat], selected[:, None])
        mask.index_fill_(0, neighbours.reshape(-1), True)
    return torch.nonzero(mask).reshape(-1)  # the one host sync: the union's size


def zero_neurons_with_neighbours(
    batch: torch.Tensor,
    num_neurons_to_zero: int,
    wmat_indices: Any,
    wmat_indptr: Any,
    *,
    generator: torch.Generator | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero ``num_neurons_to_zero`` random neurons (the last axis of ``batch``).

    Returns ``(batch, selected, needed)``: the batch with those neurons set to 0
    (a copy unless ``inplace``), the selected neuron ids, and
    :func:`neighbour_union` of them (the neurons whose inputs changed).
    ``num_neurons_to_zero = 0`` returns the batch untouched and two empty tensors.
    """
    k = num_neurons_to_zero
    neurons = int(batch.shape[-1])
    check_int("num_neurons_to_zero", k, 0, maximum=neurons)
    device = batch.device
    if k == 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch, empty, empty.clone()
    selected = torch.randperm(neurons, generator=generator, device=device)[:k]
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    out = batch if inplace else batch.clone()
    out.index_fill_(-1, selected, 0)
    return out, selected, needed


def _also_chunk_stim(function):
    """Accept the keyword ``chunk_stim=`` (the integration guide's name) for ``_chunk_stim=``."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "chunk_stim" in kwargs:
            if "_chunk_stim" in kwargs or len(args) > 1:
                raise TypeError(
                    "sample_batch_within_chunk() got the stimulus twice (_chunk_stim and chunk_stim)"
                )
            kwargs["_chunk_stim"] = kwargs.pop("chunk_stim")
        return function(*args, **kwargs)

    return wrapper


@_also_chunk_stim
def sample_batch_within_chunk(
    chunk_data: torch.Tensor,
    _chunk_stim: torch.Tensor,
    wmat_indices: Any,
    wmat_indptr: Any,
    batch_size: int,
    total_steps: int,
    num_neurons_to_zero: int,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random batch starts inside a chunk, plus the original's neuron-zeroing augmentation.

    Returns ``(batch_indices, selected_neurons, needed_indices)``: ``batch_size``
    starts uniform in ``[0, chunk_len - total_steps)``; if ``num_neurons_to_zero > 0``,
    that many neurons drawn with replacement and the sorted unique union of them
    with their CSR neighbours, else two empty long tensors. The draws are the
    original's ``torch.randint`` calls (same torch seed, same tensors). The unused
    stimulus may be passed as ``_chunk_stim=`` or ``chunk_stim=``.
    """
    chunk_len = int(chunk_data.shape[0])
    high = chunk_len - int(total_steps)
    if high <= 0:
        raise ConfigError(
            f"total_steps={total_steps} does not fit in a chunk of {chunk_len} timesteps: "
            "batch starts are drawn from [0, chunk_len - total_steps), which is empty. "
            "Use a larger chunk_size or a shorter rollout."
        )
    batch_indices = torch.randint(low=0, high=high, size=(int(batch_size),), device=device)
    if num_neurons_to_zero <= 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch_indices, empty, empty.clone()
    num_neurons = int(chunk_data.shape[1])
    selected = torch.randint(
        low=0, high=num_neurons, size=(int(num_neurons_to_zero),), device=device
    )
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    return batch_indices, selected, needed
