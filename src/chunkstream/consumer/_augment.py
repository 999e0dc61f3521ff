"""The original's augmentation: zero k random neurons, and find them with their CSR neighbours.

The connectivity is a CSR matrix: neuron ``i``'s neighbours are
``wmat_indices[wmat_indptr[i] : wmat_indptr[i + 1]]``. Everything runs on the
device of ``selected`` (the CSR arrays are moved there once per call if they
are not already); the only host sync is the neighbour count that sizes the
result.
"""

from __future__ import annotations

from typing import Any

import torch

from .._errors import ConfigError

__all__ = ["neighbour_union", "zero_neurons_with_neighbours"]


def _as_long(array: Any, device: torch.device) -> torch.Tensor:
    tensor = torch.as_tensor(array)
    return tensor.to(device=device, dtype=torch.long)


def neighbour_union(selected: torch.Tensor, wmat_indices: Any, wmat_indptr: Any) -> torch.Tensor:
    """Sorted unique ``selected ∪ {neighbours of each selected neuron}`` as a long tensor.

    ``wmat_indices`` and ``wmat_indptr`` are the CSR arrays (numpy or torch);
    the result lives on ``selected``'s device.
    """
    selected = torch.as_tensor(selected)
    device = selected.device
    selected = selected.to(torch.long).reshape(-1)
    indices = _as_long(wmat_indices, device)
    indptr = _as_long(wmat_indptr, device)
    if selected.numel() == 0:
        return selected.clone()
    rows = indptr.numel() - 1
    if rows < 1:
        raise ConfigError.bad("wmat_indptr", f"{indptr.numel()} entries", "at least 2 (CSR)")
    begin = indptr[selected]
    counts = indptr[selected + 1] - begin
    total = int(counts.sum())  # sizes the result: the one host sync
    if total == 0:
        return torch.unique(selected, sorted=True)
    # Flat positions into `indices`: each row's begin, repeated, plus 0..count-1.
    offsets = torch.cumsum(counts, 0) - counts
    row_begin = torch.repeat_interleave(begin - offsets, counts, output_size=total)
    flat = row_begin + torch.arange(total, device=device)
    return torch.unique(torch.cat([selected, indices[flat]]), sorted=True)


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
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= neurons:
        raise ConfigError.bad("num_neurons_to_zero", k, f"an int in [0, {neurons}]")
    device = batch.device
    if k == 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch, empty, empty.clone()
    selected = torch.randperm(neurons, generator=generator, device=device)[:k]
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    out = batch if inplace else batch.clone()
    out.index_fill_(-1, selected, 0)
    return out, selected, needed
