"""The memory model shared by ``ChunkLoader`` and ``chunkstream plan``.

What a streaming loader holds (:func:`streaming_bytes`; its host arena, the one
place that figure is computed: :func:`arena_bytes`), the depths that fit byte
budgets (:func:`budget_depths`), and whether data fits on the device to run
resident (:func:`resident_decision`; on the CPU this rank's host memory,
:func:`~chunkstream._memory.node_share`).
"""

from __future__ import annotations

import torch

from .._errors import ConfigError
from .._text import format_bytes
from ._node import NodeShare, node_share

__all__ = [
    "CUDA_MARGIN_FRACTION",
    "CUDA_MARGIN_MIN",
    "LOOP_HELD",
    "arena_bytes",
    "budget_depths",
    "check_arena_fits",
    "resident_decision",
    "streaming_bytes",
]

CUDA_MARGIN_FRACTION = 0.10  # of the device's memory, left for the model and fragmentation
CUDA_MARGIN_MIN = 2 << 30
#: Host buffer sets a plain ``for`` loop holds on the CPU beyond the pipeline's
#: ``prefetch + workers``: the chunk it works on and the one ``next()`` fills.
LOOP_HELD = 2


def arena_bytes(
    chunk_bytes: int,
    *,
    on_cuda: bool,
    prefetch: int,
    workers: int,
    host_slots: int | None = None,
) -> int:
    """Bytes of a loader's host arena, allocated when it is built (``chunk_bytes``: one
    window of every field it reads).

    CUDA: ``host_slots`` pinned sets (default ``prefetch + workers``); CPU: the
    pipeline's ``prefetch + workers`` sets and the :data:`LOOP_HELD` a plain ``for``
    loop holds. The one place this figure is computed: the loader, its budgets,
    ``BatchStream``, ``plan`` and the trainer ask here.
    """
    if on_cuda:
        sets = prefetch + workers if host_slots is None else host_slots
    else:
        sets = prefetch + workers + LOOP_HELD
    return int(sets) * int(chunk_bytes)


def check_arena_fits(nbytes: int, share: NodeShare) -> None:
    """:class:`ConfigError` where a loader's host arena of ``nbytes`` does not fit this
    rank's part of the job's host memory (``share``, read before it allocates)."""
    if nbytes <= share.host_bytes:
        return
    raise ConfigError(
        f"the loader's host buffers ({format_bytes(nbytes, binary=True)}) do not fit this rank's share "
        f"of the memory this job may use: {share.describe()}. Lower chunk_size, prefetch or "
        "workers (or pass host_memory= to size the depths from a budget), or run the job with "
        f"a larger memory limit or fewer ranks per node."
    )


def streaming_bytes(
    chunk_bytes: int,
    *,
    on_cuda: bool,
    prefetch: int,
    gpu_prefetch: int,
    workers: int,
    host_slots: int,
) -> tuple[int | None, int, int]:
    """``(device, pinned host, pageable host)`` bytes a streaming loader holds.

    CUDA: ``gpu_prefetch + 1`` chunks on the device for a loop that drops each
    chunk before asking for the next, and ``host_slots`` pinned chunks. CPU: the
    host arena, ``prefetch + workers`` sets for the pipeline plus two for the
    chunks a plain ``for`` loop holds (device ``None``: there is none).
    """
    arena = arena_bytes(
        chunk_bytes, on_cuda=on_cuda, prefetch=prefetch, workers=workers, host_slots=host_slots
    )
    if on_cuda:
        return (gpu_prefetch + 1) * chunk_bytes, arena, 0
    return None, 0, arena


def budget_depths(
    *,
    chunk_bytes: int,
    workers: int,
    host_memory: int | None,
    device_memory: int | None,
    on_cuda: bool,
) -> dict[str, int]:
    """The largest ``prefetch``/``host_slots`` (host budget) and ``gpu_prefetch`` (device
    budget) that fit; :class:`ConfigError` naming the budget that holds too few chunks."""
    derived: dict[str, int] = {}
    if host_memory is not None:
        fit = int(host_memory) // max(1, chunk_bytes)
        # The inverse of streaming_bytes: on CUDA the pinned slots are the host memory;
        # on the CPU the arena is prefetch + workers sets plus the two a loop holds.
        least = workers + 1 if on_cuda else workers + 1 + LOOP_HELD
        if fit < least:
            raise ConfigError.bad(
                "host_memory",
                host_memory,
                f"room for at least {least} chunks of {format_bytes(chunk_bytes)} "
                f"(workers={workers}, prefetch >= 1"
                + ("" if on_cuda else ", 2 held by the loop")
                + ")",
                "Raise the budget, lower chunk_size, or use fewer workers.",
            )
        derived["prefetch"] = fit - workers if on_cuda else fit - workers - LOOP_HELD
        if on_cuda:
            derived["host_slots"] = fit
    if device_memory is not None:
        fit = int(device_memory) // max(1, chunk_bytes)
        if fit < 2:  # gpu_prefetch >= 1 chunk in flight beside the one delivered
            raise ConfigError.bad(
                "device_memory",
                device_memory,
                f"room for at least two chunks of {format_bytes(chunk_bytes)} (one delivered, one in flight)",
                "Raise the budget or lower chunk_size.",
            )
        derived["gpu_prefetch"] = fit - 1
    return derived


def _budget(
    device: torch.device, device_memory: int | None, host_memory: int | None
) -> tuple[int | None, str]:
    if device.type == "cpu":
        if host_memory is not None:
            return host_memory, "host_memory"
        share = node_share()
        return share.host_bytes, f"this rank's host memory ({share.describe()})"
    if device_memory is not None:
        return device_memory, "device_memory"
    if device.type != "cuda":
        return None, "device_memory"
    free, total = torch.cuda.mem_get_info(device)
    margin = max(CUDA_MARGIN_MIN, int(CUDA_MARGIN_FRACTION * total))
    why = f"free memory of {device} minus a {format_bytes(margin, binary=True)} margin"
    return max(0, free - margin), why


def resident_decision(
    resident: object,
    *,
    device: torch.device,
    nbytes: int,
    rows: int,
    device_memory: int | None,
    host_memory: int | None,
) -> tuple[bool, str]:
    """Whether a loader runs resident, and why (one line for the log and ``chunkstream plan``).

    ``nbytes`` is what the ``rows`` reachable timesteps take on the device. The
    budget is ``device_memory`` when given; else on CUDA the free memory minus a
    margin (:data:`CUDA_MARGIN_FRACTION` of the total, at least
    :data:`CUDA_MARGIN_MIN`); on the CPU ``host_memory``, else this rank's part of
    the job's host memory (:attr:`~chunkstream._memory.NodeShare.host_bytes`). ``resident=True`` with
    a budget they exceed is a :class:`ConfigError`.
    """
    if not (isinstance(resident, bool) or resident == "auto"):
        raise ConfigError.bad(
            "resident",
            resident,
            "'auto', True or False",
            "Pass resident='auto' to keep the data on the device when it fits.",
        )
    if resident is False:
        return False, "streaming: resident=False"
    budget, what = _budget(device, device_memory, host_memory)
    need = f"{rows} timesteps ({format_bytes(nbytes)})"
    if budget is not None and nbytes > budget:
        if resident is True:
            raise ConfigError.bad(
                "resident",
                True,
                f"data that fits the budget: {need} exceed {what} ({format_bytes(budget)})",
                "Raise device_memory (host_memory on the CPU), cut the data with segments, or "
                "pass resident='auto' to stream when it does not fit.",
            )
        return False, f"streaming: {need} exceed {what} ({format_bytes(budget)})"
    if budget is None:
        if resident is True:
            return True, f"resident: resident=True ({need}, no budget given)"
        return False, f"streaming: no {what} budget to hold {need} on {device.type}"
    return True, f"resident: {need} fit {what} ({format_bytes(budget)})"
