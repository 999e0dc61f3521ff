"""Resident mode against streaming: epoch times on the benchmark store's layout.

    python -m benchmarks.run --only resident           # results/resident.json, its section

The store is the benchmark's ``percol-blosc`` layout (voltage and stimulus of a
FlyVis-shaped zarr v3 store, time chunks of 2000, blosc-zstd), shortened in the
quick run. For each mode a CPU ``ChunkLoader`` (``workers=2``, ``shuffled``
windows, ``host_memory`` large enough for the data) runs ``epochs`` epochs whose
consumer sums every chunk; the first epoch of a resident loader includes its
one read of the data. Modes run in turn, ``repeats`` times, page cache warm.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict

import chunkstream as cs

from ._measure import open_source
from ._stores import Geometry, make_store, store_specs

__all__ = ["resident_section", "run_resident"]


def _run(geo: Geometry, spec, resident: bool, epochs: int) -> dict:
    source = open_source(spec, geo)
    budget = 2 * geo.timesteps * (geo.neurons + geo.stim_dims) * 4
    times = []
    with cs.ChunkLoader(source, geo.chunk_size, device="cpu", workers=2, seed=0, options=cs.LoaderOptions(resident=resident, host_memory=budget, close_source=True)) as loader:  # fmt: skip
        for _ in range(epochs):
            begin = time.perf_counter()
            for chunk in loader.epoch():
                for tensor in chunk.values():
                    tensor.sum()  # touch the chunk, as a consumer would
            times.append(time.perf_counter() - begin)
        mode = loader.mode
    return {"mode": mode, "epoch_s": times}


def run_resident(geo: Geometry, *, quick: bool = False) -> dict:
    """Every figure of the resident section (module docs)."""
    if quick:
        geo = Geometry(timesteps=32768, neurons=geo.neurons, stim_dims=geo.stim_dims,
                       chunk_size=geo.chunk_size // 4)  # fmt: skip
    spec = next(s for s in store_specs(geo) if s.name == "percol-blosc")
    info = make_store(spec, geo)
    epochs, repeats = (4, 2) if quick else (6, 3)
    _run(geo, spec, False, 1)  # warm the page cache
    runs: dict[str, list[dict]] = {"streaming": [], "resident": []}
    for _ in range(repeats):
        for name in runs:
            runs[name].append(_run(geo, spec, name == "resident", epochs))
    return {"geometry": asdict(geo), "store": spec.name, "store_info": info, "epochs": epochs,
            "repeats": repeats, "runs": runs}  # fmt: skip


def resident_section(results: dict | None) -> list[str]:
    """The BENCHMARKS.md section of a ``run_resident`` result (with the run's metadata)."""
    if results is None or "resident" not in results:
        return []
    r, m = results["resident"], results.get("machine", {})
    g = r["geometry"]
    steps = g["timesteps"]
    lines = [
        "### resident mode against streaming",
        "",
        f"- command: `{results.get('command', 'python -m benchmarks.run --only resident')}` "
        f"({results.get('seconds', 0) / 60:.1f} min); 1-minute load "
        f"{results.get('load_1min_after', float('nan')):.2f} after; the machine was shared "
        "with other work (2 cores), so compare the rows with each other, not across runs",
        f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores; commit "
        f"{m.get('commit', '?')}",
        f"- store {r['store']}: {steps} timesteps, voltage {g['neurons']} + stimulus "
        f"{g['stim_dims']} float32 per step ({steps * (g['neurons'] + g['stim_dims']) * 4 / 1e9:.2f}"
        f" GB read); a CPU loader, 2 workers, shuffled windows of {g['chunk_size']} steps, "
        f"{r['epochs']} epochs per loader, {r['repeats']} loaders per mode in turn",
        "",
        "| mode | first epoch s (median) | later epochs s (median) | later timesteps/s (k) |",
        "|---|---|---|---|",
    ]
    for name, runs in r["runs"].items():
        first = statistics.median(run["epoch_s"][0] for run in runs)
        later = statistics.median(t for run in runs for t in run["epoch_s"][1:])
        lines.append(f"| {name} | {first:.3f} | {later:.4f} | {steps / later / 1e3:.0f} |")
    return [*lines, ""]
