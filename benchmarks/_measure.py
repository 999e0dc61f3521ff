"""The CPU measurements: ceilings, chunkstream, the original approach, and the whole job.

Each function takes a store, the geometry and how many repetitions, and returns
plain dicts of floats (GB/s of the delivered window, or windows/s), so the
runner can write them to JSON and the smoke test can call them on a tiny store.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings

import numpy as np
import torch

import chunkstream as cs

# the consumer helpers are not re-exported at the top level yet
from chunkstream.consumer import gather_windows, sample_windows

from ._ceilings import (
    PageCacheReader,
    ThreadPoolReader,
    decode_scaling,
    flyvis_fields,
    memcpy_gbps,
)
from ._peers import OriginalLoader, WindowDataset, dataloader_rate, original_gather
from ._stores import Geometry, StoreSpec

__all__ = [
    "ceilings",
    "chunkstream_rates",
    "dataloader_rates",
    "open_source",
    "original_rates",
    "spread",
    "whole_job",
    "window_starts",
]

BATCHES, BATCH, WINDOW = 64, 256, 64  # the whole job: 64 batches of 256 windows of 64 steps


def spread(values: list[float]) -> dict:
    """min/median/max of a list (the form every figure takes in BENCHMARKS.md)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "n": len(values)}  # fmt: skip


def window_starts(geo: Geometry, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(s) for s in rng.integers(0, geo.timesteps - geo.chunk_size + 1, size=n)]


def open_source(spec: StoreSpec, geo: Geometry, read_threads: int | None = None) -> cs.ZarrSource:
    with warnings.catch_warnings():
        # interleaved chunks hold all four columns: the amplification is the point there
        warnings.simplefilter("ignore", cs._errors.ReadAmplificationWarning)
        return cs.flyvis.open(
            spec.path, column="voltage", stim_dims=geo.stim_dims, read_threads=read_threads
        )


def ceilings(spec: StoreSpec, geo: Geometry, windows: int, cores: int) -> dict:
    """GB/s (delivered bytes) of memcpy, the page-cache read (raw) and the thread-pool reader."""
    nbytes = geo.window_nbytes
    fields = flyvis_fields(geo.neurons, geo.stim_dims)
    starts = window_starts(geo, windows + 1, seed=1)
    out: dict = {"memcpy": memcpy_gbps(nbytes, windows, cores)}
    out["memcpy_1_thread"] = memcpy_gbps(nbytes, windows, 1)
    out["decode_scaling"] = decode_scaling(spec.array_path, sorted({1, cores}))
    tp = ThreadPoolReader(spec.array_path, fields, geo.chunk_size, cores)
    try:
        rates = []
        for s in starts:
            begin = time.perf_counter()
            tp.read(s, s + geo.chunk_size)
            rates.append(nbytes / (time.perf_counter() - begin) / 1e9)
        out["thread_pool_reader"] = rates[1:]
        # the ceiling reader must agree with chunkstream on the data, or the race is void
        src = open_source(spec, geo)
        try:
            ref = {n: np.empty_like(a) for n, a in tp.out.items()}
            src.read_into(starts[-1], starts[-1] + geo.chunk_size, ref)
            out["thread_pool_reader_matches"] = all(np.array_equal(ref[n], tp.out[n]) for n in ref)
        finally:
            src.close()
    finally:
        tp.close()
    if not spec.compressed:
        pc = PageCacheReader(spec.array_path, fields, geo.chunk_size, cores)
        try:
            rates, read = [], 0
            for s in starts:
                begin = time.perf_counter()
                read = pc.read(s, s + geo.chunk_size)
                rates.append(nbytes / (time.perf_counter() - begin) / 1e9)
            out["page_cache_read"] = rates[1:]
            out["page_cache_bytes_per_window"] = read
        finally:
            pc.close()
    return out


def _delivered(loader: cs.ChunkLoader, n: int, nbytes: int) -> float:
    """Steady delivered GB/s over one epoch of ``n`` chunks (from the first chunk on)."""
    times = []
    for chunk in loader.epoch(n):
        times.append(time.perf_counter())
        del chunk
    return (len(times) - 1) * nbytes / (times[-1] - times[0]) / 1e9


def chunkstream_rates(
    spec: StoreSpec, geo: Geometry, *, workers: list[int], chunks: int, runs: int,
    device: str = "cpu", default_workers: int = 2,
) -> dict:  # fmt: skip
    """Delivered GB/s per run: ``scaling[k]`` runs k workers on a decode pool of k threads
    (k cores in use); ``default`` is the shipped configuration (workers=2, pool of all cores)."""
    configs = [(f"w{k}", k, k) for k in workers] + [("default", default_workers, None)]
    out: dict = {}
    for key, k, threads in configs:
        src = open_source(spec, geo, read_threads=threads)
        with cs.ChunkLoader(
            src, geo.chunk_size, device=device, workers=k, sampling="random", seed=0
        ) as loader:
            _delivered(loader, 2, geo.window_nbytes)  # warm: threads, buffers, code paths
            out[key] = [_delivered(loader, chunks, geo.window_nbytes) for _ in range(runs)]
        out.setdefault("fast_path", src.uses_fast_path)
        src.close()
    return out


def original_rates(
    spec: StoreSpec, geo: Geometry, *, chunks: int, runs: int, device: str = "cpu"
) -> list[float]:
    """Delivered GB/s of the original approach (one thread, re-open per read, copy)."""
    rates = []
    for r in range(runs):
        loader = OriginalLoader(
            spec.array_path, stim_dims=geo.stim_dims, chunk_size=geo.chunk_size,
            starts=window_starts(geo, chunks, seed=10 + r), device=device,
        )  # fmt: skip
        try:
            times = [time.perf_counter() for _ in loader]
        finally:
            loader.close()
        rates.append((len(times) - 1) * geo.window_nbytes / (times[-1] - times[0]) / 1e9)
    return rates


def _job_chunk(x: torch.Tensor, s: torch.Tensor, outs, gen, gather) -> None:
    for _ in range(BATCHES):
        starts = sample_windows(x, BATCH, WINDOW, generator=gen)
        if outs is None:
            gather(x, starts, WINDOW)
            gather(s, starts, WINDOW)
        else:
            gather(x, starts, WINDOW, out=outs[0])
            gather(s, starts, WINDOW, out=outs[1])


def whole_job(spec: StoreSpec, geo: Geometry, *, chunks: int, runs: int) -> dict:
    """Windows/s of "load a chunk + sample 64 batches of 256 windows of 64 steps" (CPU).

    chunkstream: the loader (shipped defaults) and ``gather_windows`` into reused
    batch buffers; the original: its loader and an advanced-indexing gather."""
    gen = torch.Generator().manual_seed(0)
    n_windows = chunks * BATCHES * BATCH
    out: dict = {"chunkstream": [], "original": []}
    outs = (
        torch.empty(BATCH, WINDOW, geo.neurons),
        torch.empty(BATCH, WINDOW, geo.stim_dims),
    )
    src = open_source(spec, geo)
    with cs.ChunkLoader(src, geo.chunk_size, device="cpu", sampling="random", seed=3) as loader:
        for _ in range(runs):
            begin = time.perf_counter()
            for chunk in loader.epoch(chunks):
                _job_chunk(chunk["voltage"], chunk["stimulus"], outs, gen, gather_windows)
                del chunk
            out["chunkstream"].append(n_windows / (time.perf_counter() - begin))
    src.close()
    for r in range(runs):
        loader = OriginalLoader(
            spec.array_path, stim_dims=geo.stim_dims, chunk_size=geo.chunk_size,
            starts=window_starts(geo, chunks, seed=20 + r),
        )  # fmt: skip
        try:
            begin = time.perf_counter()
            for _, x, s in loader:
                _job_chunk(x, s, None, gen, original_gather)
            out["original"].append(n_windows / (time.perf_counter() - begin))
        finally:
            loader.close()
    return out


def dataloader_rates(
    spec: StoreSpec, geo: Geometry, *, batches: int, workers: tuple[int, ...] = (0, 2)
) -> dict:
    """Windows/s of a torch DataLoader over a map-style window dataset, per configuration."""
    out = {}
    for reader in ("zarr", "tensorstore"):
        ds = WindowDataset(spec.array_path, stim_dims=geo.stim_dims, window=WINDOW, reader=reader)
        for w in workers:
            out[f"{reader}-w{w}"] = dataloader_rate(
                ds, workers=w, batch_size=BATCH, batches=batches
            )
    return out


def cores() -> int:
    return len(os.sched_getaffinity(0))
