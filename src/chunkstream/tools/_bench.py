"""``bench``: does background loading keep up with training? The prefetch diagnosis.

For every setting (prefetch depth x reader workers) a fresh
:class:`~chunkstream.ChunkLoader` streams ``num_chunks`` random windows of the
source while a simulated training step runs on each chunk: ``sleep`` for
``train_ms`` (the GPU is busy, the host is idle), or ``matmul``, real matrix
work on the chunk on the device (timed after ``torch.cuda.synchronize()`` on
CUDA, so the span is the work's, not the launch's).

Per chunk it keeps the loader's record (queue depth when the consumer asked,
wait, read time, transfer time) and the training span. Per setting it reports
mean/max wait, how often the queue was empty or full when asked, and the epoch
time against the ideal pipeline bound, with a verdict that names the
bottleneck and its fix (:mod:`chunkstream.tools._diagnosis`).

On a URL, :func:`compare_local` also streams the same windows from the URL and
from a local copy of the same store and reports both GB/s and their ratio
(:func:`chunkstream.tools._throughput.compare_throughput`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from .._errors import ConfigError, check_int
from .._progress import progress_bar
from ..pipeline import ChunkLoader, LoaderOptions, resolve_device
from ..sources import Source, window_nbytes
from ..stats import LatencyStats
from ._diagnosis import BenchChunk, SettingResult, recommend, summarise

__all__ = [
    "BenchChunk",
    "BenchReport",
    "SettingResult",
    "compare_local",
    "default_bench_chunk_size",
    "open_bench_source",
    "plot_bench",
    "run_bench",
]

_TARGET_CHUNK_BYTES = 64 * 2**20


@dataclass(kw_only=True)
class BenchReport:
    """All settings of one ``bench`` run; ``to_dict()`` is its JSON."""

    path: str
    device: str
    chunk_size: int
    chunk_bytes: int
    num_chunks: int
    train: str
    settings: list[SettingResult]
    recommendation: str

    def worst(self) -> SettingResult:
        return max(self.settings, key=lambda s: (s.stall_fraction, s.overlap))

    def find(self, prefetch: int, workers: int) -> SettingResult:
        for s in self.settings:
            if (s.prefetch, s.workers) == (prefetch, workers):
                return s
        raise ConfigError.bad(
            "--plot-setting",
            f"{prefetch},{workers}",
            f"one of the settings run: {[(s.prefetch, s.workers) for s in self.settings]}",
        )

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["settings"] = [s.to_dict() for s in self.settings]
        return out


def default_bench_chunk_size(total: int, step_bytes: int) -> int:
    """The largest power of two of at most ~64 MiB of windows, capped at the data."""
    rows = max(1, _TARGET_CHUNK_BYTES // max(1, step_bytes))
    return min(total, 1 << (rows.bit_length() - 1))


def open_bench_source(
    path: str | os.PathLike,
    fields: Sequence[str] | None = None,
    *,
    flyvis: bool = False,
    column: str | int = "voltage",
    stim_dims: int | None = None,
) -> Source:
    """A ZarrSource over ``path`` (a store or URL) with the fields as ``plan`` reads them.

    All fields must lie in one array (a ZarrSource reads one array).
    """
    from ..sources import ZarrSource

    _, array, selection = _bench_selection(
        path, fields, flyvis=flyvis, column=column, stim_dims=stim_dims
    )
    return ZarrSource(array, selection)


def compare_local(
    path: str | os.PathLike,
    local: str | os.PathLike,
    fields: Sequence[str] | None = None,
    *,
    flyvis: bool = False,
    column: str | int = "voltage",
    stim_dims: int | None = None,
    chunk_size: int,
    windows: int = 8,
    workers: int = 4,
    seed: int = 0,
    progress: bool = False,
) -> Any:
    """Throughput of ``path`` (a URL) against ``local``, a local copy of the same store.

    The fields are chosen as for :func:`open_bench_source`; both copies stream
    the same ``windows`` shuffled windows of ``chunk_size`` timesteps, each counted on
    a progress bar where ``progress``. Returns a
    :class:`~chunkstream.tools._throughput.ThroughputReport`.
    """
    from ._throughput import compare_throughput

    root, array, selection = _bench_selection(
        path, fields, flyvis=flyvis, column=column, stim_dims=stim_dims
    )
    local_root = f"{str(local).rstrip('/')}/timeseries.zarr" if flyvis else str(local)
    return compare_throughput(
        root,
        local_root,
        fields=selection,
        array=array.path or None,
        chunk_size=chunk_size,
        windows=windows,
        workers=workers,
        seed=seed,
        progress=progress,
    )


def compare_cache(
    path: str | os.PathLike,
    cache: str | os.PathLike,
    fields: Sequence[str] | None = None,
    *,
    flyvis: bool = False,
    column: str | int = "voltage",
    stim_dims: int | None = None,
    chunk_size: int,
    windows: int = 8,
    workers: int = 4,
    seed: int = 0,
    progress: bool = False,
) -> Any:
    """Epoch 1 against epoch 2 of ``path`` (a URL) through the node-local cache in
    ``cache``: the same ``windows`` windows twice (a progress bar per epoch where
    ``progress``). Returns a
    :class:`~chunkstream.tools._throughput.CacheEpochsReport`."""
    from ._throughput import cache_epochs

    root, array, selection = _bench_selection(
        path, fields, flyvis=flyvis, column=column, stim_dims=stim_dims
    )
    return cache_epochs(
        root,
        cache,
        fields=selection,
        array=array.path or None,
        chunk_size=chunk_size,
        windows=windows,
        workers=workers,
        seed=seed,
        progress=progress,
    )


def _bench_selection(
    path: str | os.PathLike,
    fields: Sequence[str] | None,
    *,
    flyvis: bool,
    column: str | int,
    stim_dims: int | None,
) -> tuple[str, Any, dict[str, Any]]:
    """``(store root, zarr array, {field: index})`` of the fields bench streams."""
    from ._fieldspec import FieldRequest, parse_fields
    from ._layout import check_flyvis_stim_dims, flyvis_requests
    from ._stores import open_arrays, resolve_field

    if flyvis:
        if fields:
            raise ConfigError("--flyvis names the fields itself: drop --fields.")
        requests = flyvis_requests(column, stim_dims)
        root = f"{str(path).rstrip('/')}/timeseries.zarr"
        arrays = open_arrays(root)
        check_flyvis_stim_dims({"timeseries": next(iter(arrays.values()))}, stim_dims, root)
        requests = [FieldRequest(name=r.name, array=None, index=r.index) for r in requests]
    else:
        root = str(path)
        arrays = open_arrays(path)
        requests = parse_fields(fields) if fields else None
        if requests is None:
            if len(arrays) != 1:
                raise ConfigError(
                    f"{str(path)!r} holds several arrays ({sorted(arrays)}): say what to "
                    "stream with --fields NAME=ARRAY[INDEX] ... or --flyvis."
                )
            requests = [FieldRequest(name="data", array=None, index=())]
    resolved = [resolve_field(r, arrays) for r in requests]
    names = {name for name, _, _ in resolved}
    if len(names) > 1:
        raise ConfigError(
            f"bench streams fields of one array, but these read {sorted(names)}: bench one "
            "array at a time, or `chunkstream convert` them into one store."
        )
    selection = {r.name: index for r, (_, _, index) in zip(requests, resolved, strict=True)}
    return root, resolved[0][1], selection


def _trainer(kind: str, train_ms: float, device: torch.device, steps: int) -> Callable[[Any], None]:
    """The simulated training step on one chunk (see module docs)."""
    if kind == "sleep":
        seconds = train_ms / 1e3

        def sleep(chunk: Any) -> None:
            del chunk
            time.sleep(seconds)

        return sleep
    if kind != "matmul":
        raise ConfigError.bad("--train", kind, "'sleep' or 'matmul'")
    weights: dict[int, torch.Tensor] = {}

    def matmul(chunk: Any) -> None:
        x = next(iter(chunk.values()))
        x = x.reshape(x.shape[0], -1)
        if not x.is_floating_point():
            x = x.float()
        w = weights.get(x.shape[1])
        if w is None:
            w = weights[x.shape[1]] = torch.randn(x.shape[1], 256, device=x.device, dtype=x.dtype)
        for _ in range(steps):
            (x @ w).relu_()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # time the work itself, not its launch

    return matmul


def _run_setting(
    source: Source,
    *,
    chunk_size: int,
    prefetch: int,
    workers: int,
    gpu_prefetch: int,
    device: torch.device,
    num_chunks: int,
    train: Callable[[Any], None],
    seed: int,
    amplification: float,
    compressed: bool,
) -> SettingResult:
    stats = LatencyStats()
    spans: list[tuple[float, float]] = []
    with ChunkLoader(
        source,
        chunk_size,
        device=device,
        prefetch=prefetch,
        gpu_prefetch=gpu_prefetch,
        workers=workers,
        sampling="random",
        seed=seed,
        options=LoaderOptions(stats=stats),
    ) as loader:
        on_cuda = loader.device.type == "cuda"
        capacity = gpu_prefetch if on_cuda else loader.config.reader_capacity
        t0 = time.perf_counter()
        for chunk in loader.epoch(num_chunks):
            begin = time.perf_counter()
            train(chunk)
            spans.append((begin, time.perf_counter()))
            del chunk  # the CPU pool reuses a buffer only once the user lets go of it
        epoch_s = time.perf_counter() - t0
        if on_cuda:
            torch.cuda.synchronize(loader.device)  # so every copy's events can be read
        stats.resolve_transfers()
    chunks = []
    for record, (begin, end) in zip(stats.chunks, spans, strict=True):
        record.compute_end = end  # the training span, for the timeline
        chunks.append(
            BenchChunk(
                index=record.index,
                start=record.start,
                queue_depth=record.queue_depth,
                wait_s=record.wait_s,
                read_s=record.read_s,
                transfer_s=record.transfer_s,
                train_s=end - begin,
                read_begin=record.read_begin - t0,
                read_end=record.read_end - t0,
                transfer_begin=None
                if record.transfer_begin is None
                else record.transfer_begin - t0,
                received=record.received - t0,
                train_end=end - t0,
            )
        )
    result = summarise(
        prefetch, workers, gpu_prefetch, capacity, epoch_s, chunks, amplification, compressed
    )
    result.stats = stats
    return result


def run_bench(
    source: Source,
    *,
    chunk_size: int | None = None,
    prefetch: Sequence[int] = (1, 2, 4, 6),
    workers: Sequence[int] = (1, 2),
    gpu_prefetch: int = 1,
    num_chunks: int = 16,
    train: str = "sleep",
    train_ms: float = 50.0,
    train_steps: int = 4,
    device: str | torch.device | None = None,
    seed: int = 0,
    progress: bool = False,
    path: str | None = None,
) -> BenchReport:
    """Run every (prefetch, workers) setting on ``source`` and diagnose it (module docs)."""
    check_int(
        "--chunks",
        num_chunks,
        2,
        expected="an integer >= 2 (the first one only fills the pipeline)",
    )
    if train_ms < 0:
        raise ConfigError.bad("--train-ms", train_ms, "a time >= 0")
    for name, values in (("--prefetch", prefetch), ("--workers", workers)):
        if not values:
            raise ConfigError.bad(name, list(values), "a list of integers >= 1, e.g. 1,2,4,6")
        for v in values:
            check_int(name, v, expected="a list of integers >= 1, e.g. 1,2,4,6")
    resolved = resolve_device(device)
    total = len(source)
    step = window_nbytes(source.fields, 1)
    chunk_size = default_bench_chunk_size(total, step) if chunk_size is None else chunk_size
    trainer = _trainer(train, train_ms, resolved, train_steps)
    amplification = max(getattr(source, "read_amplification", {}).values(), default=1.0)
    array = getattr(source, "array", None)
    compressed = bool(getattr(array, "compressors", None)) if array is not None else False
    grid = [(p, w) for w in workers for p in prefetch]
    results = []
    with progress_bar(grid, desc="bench", unit="setting", enabled=progress) as bar:
        for p, w in bar:
            bar.set_postfix_str(f"prefetch={p} workers={w}")
            results.append(
                _run_setting(
                    source,
                    chunk_size=chunk_size,
                    prefetch=p,
                    workers=w,
                    gpu_prefetch=gpu_prefetch,
                    device=resolved,
                    num_chunks=num_chunks,
                    train=trainer,
                    seed=seed,
                    amplification=amplification,
                    compressed=compressed,
                )
            )
    what = f"sleep {train_ms:g} ms" if train == "sleep" else f"matmul x{train_steps} on {resolved}"
    return BenchReport(
        path=str(path if path is not None else getattr(source, "path", type(source).__name__)),
        device=str(resolved),
        chunk_size=chunk_size,
        chunk_bytes=window_nbytes(source.fields, min(chunk_size, total)),
        num_chunks=num_chunks,
        train=what,
        settings=results,
        recommendation=recommend(results),
    )


def plot_bench(
    report: BenchReport, out: str | os.PathLike, setting: SettingResult | None = None
) -> str:
    """Draw the read / transfer / compute lanes per chunk of ``setting`` (default the
    worst) over time into ``out`` (a PNG, via :func:`chunkstream.stats.plot_timeline`);
    returns the path. Needs matplotlib."""
    from ..stats import plot_timeline

    s = setting if setting is not None else report.worst()
    state = "keeping up" if s.keeping_up else "NOT keeping up"
    title = (
        f"{report.path}: {s.label}, train {report.train}: {state}, "
        f"stall {s.stall_fraction:.0%}, epoch "
        + (f"{s.overlap:.2f}x the ideal bound" if s.overlap >= 1 else "under the ideal estimate")
    )
    return str(plot_timeline(s.stats, out, title=title))
