"""``plan``: the epoch arithmetic and the memory a streaming configuration takes.

Memory model (the bounds the loader documents, see ``pipeline._config``), with
``chunk_bytes`` one window of every field:

* **full dataset on the device**: ``T * step_bytes`` on the device (and, while
  loading, the same again staged on the host);
* **streaming, CUDA**: device bytes ``(gpu_prefetch + 1) * chunk_bytes``, the
  chunks kept ready plus the one the user trains on (a loop that drops each
  chunk before asking for the next, as the trainer does; a plain ``for`` loop
  holds the previous one during ``next()``: one chunk more), plus validation
  data kept on the device (the trainer's held-out split of ``val_fraction``,
  per segment with ``segments``: ``chunkstream.plans.held_out_split``); the model's
  activations come on top; pinned host bytes ``host_slots * chunk_bytes``
  (default ``host_slots = prefetch + workers``; the loader pins exactly this,
  one registered arena);
  other host bytes: the decode scratch of the fast zarr reader, about two zarr
  chunks per decode thread (known only for a store);
* **streaming, CPU**: no device; host bytes ``(prefetch + workers + 2) *
  chunk_bytes`` (the loader's host arena) plus the validation data.

:func:`fit_budget` searches the largest chunk_size that fits ``gpu_mem`` /
``host_mem`` at the requested depths: a multiple of ``align``, at least
``window`` and ``batch_size``, a power of two where ``align`` allows, else a
multiple of ``lcm(align, batch_size)``; then the deepest prefetch depths that
fit at that chunk_size. Sizes are bytes; :func:`parse_bytes` reads ``"8GB"``
(decimal) or ``"512MiB"`` (binary).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from .._errors import ConfigError, check_int
from .._memory import LOOP_HELD, NodeShare, node_share, resident_decision, streaming_bytes
from ..plans import EpochPlan, Segments, held_out_split, plan_epoch
from ..sources import window_nbytes
from ._layout import (
    DataLayout,
    format_bytes,
    layout_from_shape,
    layout_from_store,
    parse_bytes,
)

__all__ = [
    "BudgetFit",
    "DataLayout",
    "MemoryRow",
    "PlanReport",
    "fit_budget",
    "format_bytes",
    "layout_from_shape",
    "layout_from_store",
    "parse_bytes",
    "plan_memory",
    "plan_share",
]


@dataclass(frozen=True, kw_only=True)
class MemoryRow:
    """Bytes one way of training takes: on the device, pinned on the host, other host."""

    name: str
    device_bytes: int | None
    pinned_bytes: int
    host_bytes: int | None
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class BudgetFit:
    """The largest chunk_size and depths that fit the budgets (see module docs)."""

    gpu_mem: int | None
    host_mem: int | None
    requested_fits: bool  # the requested chunk_size and depths fit
    chunk_size: int
    chunk_bytes: int
    prefetch: int  # deepest host prefetch at chunk_size (the requested one if no host budget)
    gpu_prefetch: int  # deepest device prefetch at chunk_size
    host_slots: int
    device_bytes: int | None
    pinned_bytes: int
    limited_by: str  # which budget bounds chunk_size
    host_from: str = "--host-mem"  # where host_mem came from: the flag, or this rank's share


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    """Everything ``chunkstream plan`` prints; ``to_dict()`` is its JSON."""

    where: str
    total_timesteps: int
    train_timesteps: int
    val_timesteps: int
    fields: dict[str, list]
    step_bytes: int
    device: str
    chunk_size: int
    chunk_bytes: int
    window: int
    prefetch: int
    gpu_prefetch: int
    workers: int
    host_slots: int
    epoch: EpochPlan
    full: MemoryRow
    streaming: MemoryRow
    saving: float  # 1 - streaming device bytes / full device bytes (CUDA)
    budget: BudgetFit | None = None
    notes: list[str] = field(default_factory=list)
    mode: str = ""  # what LoaderOptions(resident="auto") chooses for the training data, and why
    node: str = ""  # this rank's share of the node planned for (NodeShare.describe)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["epoch"] = {
            **asdict(self.epoch),
            "global_chunks_per_epoch": self.epoch.global_chunks_per_epoch,
            "chunk_batches": self.epoch.chunk_batches,
        }
        return out


def plan_share(ranks_per_node: int | None = None) -> NodeShare:
    """This process's share of the node (:func:`chunkstream._memory.node_share`), for
    ``ranks_per_node`` ranks on the node where given (``--ranks-per-node``)."""
    share = node_share()
    if ranks_per_node is None:
        return share
    check_int("--ranks-per-node", ranks_per_node, fix="Pass the processes per node, e.g. 8.")
    return replace(share, ranks=ranks_per_node, ranks_source="--ranks-per-node")


def _streaming_bytes(
    cb: int,
    *,
    on_cuda: bool,
    prefetch: int,
    gpu_prefetch: int,
    workers: int,
    host_slots: int,
    val_bytes: int,
) -> tuple[int | None, int, int]:
    """(device, pinned host, pipeline host) bytes of a streaming configuration: the
    loader's memory model (:func:`chunkstream._memory.streaming_bytes`) plus validation."""
    device, pinned, host = streaming_bytes(
        cb,
        on_cuda=on_cuda,
        prefetch=prefetch,
        gpu_prefetch=gpu_prefetch,
        workers=workers,
        host_slots=host_slots,
    )
    if on_cuda:
        return (device or 0) + val_bytes, pinned, host
    return None, pinned, host + val_bytes


def resident_mode(
    device: str, train: int, step: int, gpu_mem: int | None, host_mem: int | None
) -> str:
    """What ``LoaderOptions(resident="auto")`` chooses for ``train`` timesteps, and why."""
    on_cuda = device == "cuda"
    if on_cuda and gpu_mem is None and not torch.cuda.is_available():
        return (
            "streaming: no --gpu-mem given and no CUDA device here to measure (on CUDA, "
            "resident='auto' compares with the free memory minus a margin)"
        )
    _, why = resident_decision(
        "auto",
        device=torch.device(device),
        nbytes=train * step,
        rows=train,
        device_memory=gpu_mem if on_cuda else None,
        host_memory=host_mem,
    )
    return why


def _candidates_below(limit: int, *, align: int, batch: int) -> int | None:
    """The preferred chunk_size <= limit: a power of two that is a multiple of
    ``align``, else the largest multiple of ``lcm(align, batch)``, else of ``align``."""
    if limit < 1:
        return None
    power = 1 << (limit.bit_length() - 1)
    while power >= align and power % align:
        power >>= 1
    if power >= align and power % align == 0:
        return power
    for step in (math.lcm(align, batch), align):
        if limit >= step:
            return limit // step * step
    return None


def _budget_cost(
    on_cuda: bool, *, prefetch: int, gpu_prefetch: int, workers: int, val_bytes: int
) -> tuple[Callable[[int, int], int], Callable[[int, int], int]]:
    """``(device cost, host cost)``: each maps ``(chunk_bytes, depth)`` to the bytes the
    memory model (:func:`_streaming_bytes`) charges against ``--gpu-mem`` / ``--host-mem``
    at that ``gpu_prefetch`` / ``prefetch`` depth, validation data included."""

    def model(cb: int, p: int, gp: int) -> tuple[int | None, int, int]:
        return _streaming_bytes(
            cb,
            on_cuda=on_cuda,
            prefetch=p,
            gpu_prefetch=gp,
            workers=workers,
            host_slots=p + workers,
            val_bytes=val_bytes,
        )

    def device(cb: int, depth: int) -> int:
        return model(cb, prefetch, depth)[0] or 0

    def host(cb: int, depth: int) -> int:
        _, pinned, pageable = model(cb, depth, gpu_prefetch)
        return pinned + pageable

    return device, host


def _deepest(cost: Callable[[int, int], int], cb: int, budget: int, at_least: int) -> int:
    """The largest depth (>= ``at_least``) whose ``cost`` fits ``budget``; the model is
    linear in the depth, so this inverts it from its value at depths 0 and 1."""
    base = cost(cb, 0)
    return max(at_least, (budget - base) // (cost(cb, 1) - base))


def _budget_rows(
    limits: dict[str, int],
    smallest: int,
    step: int,
    costs: tuple,
    budgets: dict[str, int | None],
    val_bytes: int,
    depths: dict[str, int],
) -> tuple[str, int]:
    """``(the binding budget's flag, the most timesteps per chunk it allows)``; raises
    :class:`ConfigError` when that is below ``smallest``, naming the budget that would do."""
    limited_by, rows = min(limits.items(), key=lambda kv: kv[1])
    if rows >= smallest:
        return limited_by, rows
    if limited_by == "--gpu-mem":
        need = costs[0](smallest * step, depths["gpu_prefetch"])
        what = f"gpu_prefetch + 1 = {depths['gpu_prefetch'] + 1} chunks"
    else:
        # The host figure counts the pipeline's chunks alone (validation is shown beside it).
        need = costs[1](smallest * step, depths["prefetch"]) - costs[1](0, depths["prefetch"])
        what = "prefetch + workers chunks"
    raise ConfigError(
        f"{limited_by}={format_bytes(budgets[limited_by])} is too small: it must hold {what} of "
        f"at least max(window, batch_size)={smallest} timesteps ({format_bytes(need)} with "
        f"{format_bytes(val_bytes)} of validation data). Raise the budget to at least "
        f"{format_bytes(need)}, or lower the depths, the window or --val-fraction."
    )


def fit_budget(
    layout: DataLayout,
    *,
    chunk_size: int,
    batch_size: int,
    window: int = 1,
    prefetch: int = 2,
    gpu_prefetch: int = 1,
    workers: int = 2,
    val_fraction: float = 0.0,
    device: str = "cuda",
    align: int = 1,
    gpu_mem: int | None = None,
    host_mem: int | None = None,
    segments: object = None,
) -> BudgetFit:
    """Largest chunk_size (module docs) and deepest depths within ``gpu_mem``/``host_mem``.

    Raises :class:`ConfigError` when not even a chunk of ``max(window, batch_size)``
    timesteps fits at depth 1, naming the budget and the smallest that would do.
    """
    on_cuda = device == "cuda"
    step = layout.step_nbytes
    total = layout.total_timesteps
    val_bytes = held_out_split(total, val_fraction, window, segments).val_len * step
    smallest = max(window, min(batch_size, total), align)
    costs = _budget_cost(
        on_cuda, prefetch=prefetch, gpu_prefetch=gpu_prefetch, workers=workers, val_bytes=val_bytes
    )
    budgets = {"--gpu-mem": gpu_mem if on_cuda else None, "--host-mem": host_mem}
    # Timesteps per chunk each budget allows: what is left after the fixed bytes
    # (validation), over the bytes one timestep of every chunk held costs.
    limits = {}
    for (flag, budget), cost, depth in zip(
        budgets.items(), costs, (gpu_prefetch, prefetch), strict=True
    ):
        if budget is not None:
            limits[flag] = (budget - cost(0, depth)) // (cost(step, depth) - cost(0, depth))
    if not limits:
        raise ConfigError("fit_budget needs gpu_mem or host_mem (and gpu_mem only on cuda)")
    limited_by, rows = _budget_rows(
        limits,
        smallest,
        step,
        costs,
        budgets,
        val_bytes,
        {"gpu_prefetch": gpu_prefetch, "prefetch": prefetch},
    )
    best = total if rows >= total else _candidates_below(rows, align=align, batch=batch_size)
    if best is None or best < smallest:
        raise ConfigError(
            f"no chunk_size between {smallest} and {rows} timesteps is a multiple of "
            f"--align={align}: lower --align or raise the budget."
        )
    cb = window_nbytes(layout.fields, min(best, total))
    deepest_gpu = (
        gpu_prefetch
        if budgets["--gpu-mem"] is None
        else _deepest(costs[0], cb, gpu_mem, gpu_prefetch)
    )
    deepest_host = prefetch if host_mem is None else _deepest(costs[1], cb, host_mem, prefetch)
    slots = deepest_host + workers
    device_b, pinned_b, _ = _streaming_bytes(
        cb,
        on_cuda=on_cuda,
        prefetch=deepest_host,
        gpu_prefetch=deepest_gpu,
        workers=workers,
        host_slots=slots,
        val_bytes=val_bytes,
    )
    req_cb = window_nbytes(layout.fields, min(chunk_size, total))
    fits = (gpu_mem is None or not on_cuda or costs[0](req_cb, gpu_prefetch) <= gpu_mem) and (
        host_mem is None or costs[1](req_cb, prefetch) <= host_mem
    )
    return BudgetFit(
        gpu_mem=gpu_mem,
        host_mem=host_mem,
        requested_fits=fits,
        chunk_size=best,
        chunk_bytes=cb,
        prefetch=deepest_host,
        gpu_prefetch=deepest_gpu,
        host_slots=slots,
        device_bytes=device_b,
        pinned_bytes=pinned_b,
        limited_by=limited_by,
    )


def _check_plan_args(
    layout: DataLayout, ints: dict[str, int], device: str, val_fraction: float, segments: object
) -> tuple[int, int, Segments | None]:
    """``(validation timesteps, training timesteps, training segments)`` once every
    setting can run: the trainer's split (``plans.held_out_split``), per segment with
    ``segments``.

    ``ints`` maps each integer flag (``--chunk-size``, ``--batch-size``,
    ``--window``, ``--align`` and the depths) to its value; raises
    :class:`ConfigError` naming the first bad flag.
    """
    for name, value in ints.items():
        check_int(name, value)
    if device not in ("cuda", "cpu"):
        raise ConfigError.bad("--device", device, "'cuda' or 'cpu'")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError.bad("--val-fraction", val_fraction, "a fraction in [0, 1)")
    chunk_size, window = ints["--chunk-size"], ints["--window"]
    batch_size, align = ints["--batch-size"], ints["--align"]
    total = layout.total_timesteps
    split = held_out_split(total, val_fraction, window, segments)
    train, val_steps = split.train_len, split.val_len
    if window > chunk_size:
        raise ConfigError.bad(
            "--window",
            window,
            f"at most --chunk-size={chunk_size}",
            "Every training window must lie inside one chunk: raise --chunk-size or shorten "
            "the window (time_units * evolve_multiple_steps).",
        )
    if window > train:
        raise ConfigError.bad("--window", window, f"at most the {train} training timesteps")
    if batch_size > train:
        raise ConfigError.bad(
            "--batch-size",
            batch_size,
            f"at most the {train} training timesteps",
            "Lower --batch-size: not one batch fits in the data.",
        )
    if chunk_size % align:
        raise ConfigError.bad("--chunk-size", chunk_size, f"a multiple of --align={align}")
    return val_steps, train, split.train_segments


def _memory_rows(
    on_cuda: bool,
    full_bytes: int,
    streamed: tuple[int | None, int, int],
    scratch: int | None,
    *,
    prefetch: int,
    gpu_prefetch: int,
    workers: int,
    slots: int,
    val_bytes: int,
) -> tuple[MemoryRow, MemoryRow, float]:
    """``(full-dataset row, streaming row, device saving)`` of the memory table;
    ``streamed`` is :func:`_streaming_bytes`'s ``(device, pinned, host)``."""
    dev, pinned, host = streamed
    if on_cuda:
        full = MemoryRow(
            name="full dataset on the device",
            device_bytes=full_bytes,
            pinned_bytes=0,
            host_bytes=full_bytes,
            note="host: staged once while loading",
        )
        note = f"device: (gpu_prefetch {gpu_prefetch} + 1 held) chunks"
        note += " + validation" if val_bytes else ""
        note += f"; pinned: {slots} host slots"
        streaming = MemoryRow(
            name="streaming",
            device_bytes=dev,
            pinned_bytes=pinned,
            host_bytes=scratch,
            note=note + "; other: decode scratch (known for a store)",
        )
        return full, streaming, 1.0 - dev / full_bytes if dev is not None else 0.0
    full = MemoryRow(
        name="full dataset in memory", device_bytes=None, pinned_bytes=0, host_bytes=full_bytes
    )
    streaming = MemoryRow(
        name="streaming",
        device_bytes=None,
        pinned_bytes=0,
        host_bytes=host + (scratch or 0),
        note=f"(prefetch + workers + {LOOP_HELD} arena) = {prefetch + workers + LOOP_HELD} "
        "chunks + validation + decode scratch",
    )
    return full, streaming, 1.0 - (host or 0) / full_bytes


def plan_memory(
    layout: DataLayout,
    *,
    chunk_size: int,
    batch_size: int,
    window: int = 1,
    prefetch: int = 2,
    gpu_prefetch: int = 1,
    workers: int = 2,
    host_slots: int | None = None,
    passes: int = 1,
    world_size: int = 1,
    val_fraction: float = 0.0,
    device: str = "cuda",
    align: int = 1,
    gpu_mem: int | None = None,
    host_mem: int | None = None,
    decode_threads: int | None = None,
    segments: object = None,
    pieces: int = 1,
    share: NodeShare | None = None,
) -> PlanReport:
    """The epoch arithmetic and the memory table for one configuration (module docs).

    ``share``: the rank's share of the node planned for (:func:`plan_share` when
    ``None``): without ``host_mem`` the host and pinned bytes are checked against
    its :attr:`~chunkstream._memory.NodeShare.host_bytes`, and the decode scratch
    counts its thread budget (``decode_threads`` unless given).

    With ``segments`` (anything :class:`~chunkstream.Segments` takes, or a path)
    the training and held-out timesteps are the trainer's for them: the last
    ``val_fraction`` of every segment held out, and the epoch is the trainer's:
    the chunks one pass of ``pieces`` pieces a chunk reads (``plan_epoch``).

    Raises :class:`ConfigError` for settings that cannot run: a window longer
    than the chunk or the data, a batch larger than the data, budgets too small
    for one chunk, a validation fraction outside ``[0, 1)``.
    """
    ints = {
        "--chunk-size": chunk_size,
        "--batch-size": batch_size,
        "--window": window,
        "--prefetch": prefetch,
        "--gpu-prefetch": gpu_prefetch,
        "--workers": workers,
        "--passes": passes,
        "--world-size": world_size,
        "--align": align,
    }
    val_steps, train, train_segments = _check_plan_args(
        layout, ints, device, val_fraction, segments
    )
    if train_segments is None:
        epoch = plan_epoch(train, chunk_size, batch_size, passes, world_size=world_size)
    else:  # as the trainer: a chunk is at most the source, a pass whole tiles and the pool
        total = layout.total_timesteps
        epoch = plan_epoch(
            total,
            min(chunk_size, total),
            batch_size,
            passes,
            world_size=world_size,
            segments=train_segments,
            pieces=pieces,
        )
    on_cuda = device == "cuda"
    slots = host_slots if host_slots is not None else prefetch + workers
    if on_cuda and slots < workers:
        raise ConfigError.bad("--host-slots", slots, f"at least --workers={workers}")
    total, step = layout.total_timesteps, layout.step_nbytes
    rows = min(chunk_size, train)
    cb = window_nbytes(layout.fields, rows)
    val_bytes = val_steps * step
    share = plan_share() if share is None else share
    threads = decode_threads if decode_threads is not None else share.threads
    scratch = None if layout.zarr_chunk_bytes is None else 2 * threads * layout.zarr_chunk_bytes
    streamed = _streaming_bytes(
        cb,
        on_cuda=on_cuda,
        prefetch=prefetch,
        gpu_prefetch=gpu_prefetch,
        workers=workers,
        host_slots=slots,
        val_bytes=val_bytes,
    )
    full, streaming, saving = _memory_rows(
        on_cuda,
        total * step,
        streamed,
        scratch,
        prefetch=prefetch,
        gpu_prefetch=gpu_prefetch,
        workers=workers,
        slots=slots,
        val_bytes=val_bytes,
    )
    notes: list[str] = []
    if chunk_size > train:
        notes.append(
            f"chunk_size {chunk_size} exceeds the {train} training timesteps: every chunk is "
            "all of the data, so streaming saves nothing; keep the data on the device instead."
        )
    elif epoch.batches_per_chunk * batch_size < rows // 2:
        notes.append("batch_size is large against chunk_size: few batches per chunk.")
    host_from, given_host = "--host-mem", host_mem
    if host_mem is None:  # checked against the job's memory by default
        host_mem, host_from = share.host_bytes, "this rank's share of the job's host memory"
    budget = fit_budget(
        layout,
        chunk_size=chunk_size,
        batch_size=batch_size,
        window=window,
        prefetch=prefetch,
        gpu_prefetch=gpu_prefetch,
        workers=workers,
        val_fraction=val_fraction,
        device=device,
        align=align,
        gpu_mem=gpu_mem if on_cuda else None,
        host_mem=host_mem,
        segments=segments,
    )
    budget = replace(budget, host_from=host_from)
    return PlanReport(
        where=layout.where,
        total_timesteps=total,
        train_timesteps=train,
        val_timesteps=val_steps,
        fields={n: [list(s.shape), str(s.dtype)] for n, s in layout.fields.items()},
        step_bytes=step,
        device=device,
        chunk_size=chunk_size,
        chunk_bytes=cb,
        window=window,
        prefetch=prefetch,
        gpu_prefetch=gpu_prefetch,
        workers=workers,
        host_slots=slots,
        epoch=epoch,
        full=full,
        streaming=streaming,
        saving=saving,
        budget=budget,
        notes=notes,
        mode=resident_mode(device, train, step, gpu_mem, given_host),
        node=share.describe(),
    )
