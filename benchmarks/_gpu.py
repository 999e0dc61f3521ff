"""The GPU mode (``--device cuda``, ``benchmarks/gpu.sh``): under 5 minutes on one GPU.

Measured on the per-column stores (written here if absent, ~25 s each):

* H2D GB/s of the loader's copies from its pinned slots (CUDA events on the
  transfer stream, from ``loader.stats``) against torch's pinned-copy peak (one
  pinned tensor of a chunk's size copied with ``non_blocking=True``, timed
  with CUDA events);
* whether the host ever blocks on a copy: the consumer's wait per chunk after
  the first while training is slower than reading (a blocking copy would show
  up there as at least the copy time), and the host time ``next()`` takes
  against the copy time;
* device memory: ``torch.cuda.max_memory_allocated`` over an epoch, minus what
  the model, optimizer and batch buffers hold between batches, against the
  documented bound ``(gpu_prefetch + 1) * chunk_bytes`` (the loop drops each
  chunk before asking for the next) plus the training step's own transient
  peak (activations, gradients), measured on a resident chunk: the epoch's peak
  is reached inside a training step, so a bound without it would fail on any
  real model;
* overlap with real training: an MLP trained with matmuls on 64 batches of 256
  windows gathered on the device per chunk; the bound is
  ``first_read + n * max(read, train)`` with ``train`` timed on a resident chunk
  (``torch.cuda.synchronize`` around it, said here because it is a host clock);
* read throughput scaling with workers 1, 2, 4, ... up to the machine's cores
  (k workers on a decode pool of k threads).
"""

from __future__ import annotations

import statistics
import time

import torch

import chunkstream as cs
from chunkstream.consumer import gather_windows, sample_windows

from . import _measure as m
from ._stores import Geometry, make_store, store_specs, warm

__all__ = ["run_gpu"]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] gpu: {msg}", flush=True)


def pinned_peak(nbytes: int, repeats: int, device: torch.device) -> list[float]:
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    out = []
    for _ in range(repeats + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dev.copy_(host, non_blocking=True)
        b.record()
        b.synchronize()
        out.append(nbytes / (a.elapsed_time(b) / 1e3) / 1e9)
    return out[1:]


class _Model(torch.nn.Module):
    def __init__(self, n: int, s: int, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n + s, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
            torch.nn.GELU(), torch.nn.Linear(hidden, n),
        )  # fmt: skip

    def forward(self, v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([v, s], dim=-1))


def _train_chunk(model, opt, x, s, gen, bufs) -> None:
    for _ in range(m.BATCHES):
        starts = sample_windows(x, m.BATCH, m.WINDOW, generator=gen)
        bv = gather_windows(x, starts, m.WINDOW, out=bufs[0])
        bs = gather_windows(s, starts, m.WINDOW, out=bufs[1])
        pred = model(bv[:, :-1], bs[:, :-1])
        loss = torch.nn.functional.mse_loss(pred, bv[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def run_gpu(geo: Geometry, *, quick: bool = False) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch")
    device = torch.device("cuda")
    res: dict = {"geometry": geo.__dict__, "device_name": torch.cuda.get_device_name(device)}
    specs = {s.name: s for s in store_specs(geo) if s.layout == "percol"}
    for spec in specs.values():
        _log(f"store {spec.name}")
        make_store(spec, geo)
        warm(spec)
    spec = specs["percol-blosc"]
    nbytes = geo.window_nbytes
    n = 6 if quick else 12

    _log("pinned-copy peak")
    peak = pinned_peak(nbytes, 10, device)

    # scaling: k workers on a pool of k decode threads, CUDA loader (pinned slots)
    cores = m.cores()
    ks = sorted({k for k in (1, 2, 4, 8, 16, cores) if k <= cores})
    _log(f"scaling over workers {ks}")
    res["scaling"] = {}
    for k in ks:
        src = m.open_source(spec, geo, read_threads=k)
        with cs.ChunkLoader(src, geo.chunk_size, device=device, workers=k, sampling="random",
                            seed=0) as loader:  # fmt: skip
            m._delivered(loader, 2, nbytes)
            res["scaling"][f"w{k}"] = [m._delivered(loader, n, nbytes) for _ in range(2)]
        src.close()

    _log("overlap with matmul training, H2D, memory")
    gen = torch.Generator(device=device).manual_seed(0)
    model = _Model(geo.neurons, geo.stim_dims, 2048).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    bufs = (torch.empty(m.BATCH, m.WINDOW, geo.neurons, device=device),
            torch.empty(m.BATCH, m.WINDOW, geo.stim_dims, device=device))  # fmt: skip
    src = m.open_source(spec, geo)
    gpu_prefetch = 1
    with cs.ChunkLoader(src, geo.chunk_size, device=device, workers=2, gpu_prefetch=gpu_prefetch,
                        sampling="random", seed=1) as loader:  # fmt: skip
        # the read interval with an idle consumer
        begin = time.perf_counter()
        times = []
        for chunk in loader.epoch(n):
            times.append(time.perf_counter())
            resident = chunk
        torch.cuda.synchronize()
        read_s = (times[-1] - times[0]) / (n - 1)
        first_s = times[0] - begin
        # train time on a resident chunk (host clock around synchronize)
        x, s = resident["voltage"], resident["stimulus"]
        _train_chunk(model, opt, x, s, gen, bufs)  # warm-up: kernels, allocator
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(2):
            _train_chunk(model, opt, x, s, gen, bufs)
        torch.cuda.synchronize()
        train_s = (time.perf_counter() - t0) / 2
        # What a training step adds on top of what stays allocated between steps.
        step_bytes = torch.cuda.max_memory_allocated(device) - before
        del resident, x, s, chunk
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loader.stats.reset()
        begin = time.perf_counter()
        host_next = []
        it = loader.epoch(n)
        while True:
            t = time.perf_counter()
            try:
                chunk = next(it)
            except StopIteration:
                break
            host_next.append(time.perf_counter() - t)
            _train_chunk(model, opt, chunk["voltage"], chunk["stimulus"], gen, bufs)
            del chunk
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - begin
        peak_alloc = torch.cuda.max_memory_allocated(device) - baseline
        loader.stats.resolve_transfers()
        recs = list(loader.stats.chunks)
    src.close()
    waits = sorted(r.wait_s for r in recs[1:])
    transfers = [r.transfer_s for r in recs if r.transfer_s]
    bound = recs[0].wait_s + n * max(read_s, train_s)
    res["overlap"] = {
        "read_s": read_s, "first_read_s": first_s, "train_s": train_s, "elapsed_s": elapsed,
        "bound_s": bound, "ratio": elapsed / bound,
        "wait_after_first_median_s": statistics.median(waits) if waits else 0.0,
        "wait_after_first_max_s": max(waits) if waits else 0.0,
    }  # fmt: skip
    res["h2d"] = {
        "peak_gbps": peak, "peak_gbps_median": statistics.median(peak),
        "loader_gbps": [nbytes / t / 1e9 for t in transfers],
        "loader_gbps_median": statistics.median(nbytes / t / 1e9 for t in transfers)
        if transfers else 0.0,
    }  # fmt: skip
    med_transfer = statistics.median(transfers) if transfers else 0.0
    res["host_blocking"] = {
        "next_host_s_after_first": host_next[1:],
        "transfer_s_median": med_transfer,
        # a host that blocked on a copy would spend at least the copy time in next()
        "blocked": bool(transfers) and any(t >= 0.5 * med_transfer for t in host_next[1:])
        if train_s > read_s else None,
    }  # fmt: skip
    res["memory"] = {
        "peak_loader_bytes": peak_alloc, "chunk_bytes": nbytes, "gpu_prefetch": gpu_prefetch,
        # documented: gpu_prefetch chunks plus the one the loop holds (dropped before
        # next()), plus the training step's transient peak measured above
        "step_bytes": step_bytes,
        "bound_bytes": (gpu_prefetch + 1) * nbytes + step_bytes,
    }  # fmt: skip
    return res
