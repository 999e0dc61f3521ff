"""Storage dtype: the same traces stored as float16 and as float32, streamed and gathered.

    python -m benchmarks.run --only dtype           # results/dtype.json, its BENCHMARKS.md section

Two stores hold the same values (float16-representable, so both are exact), one
field ``(T, N)`` chunked along time only, uncompressed and blosc-zstd. For each
store: epochs of a CPU ``ChunkLoader`` (``workers=2``, ``sequential``, page cache
warm), the delivered GB/s and bytes from ``LatencyStats``, and the timesteps/s
that training sees; stores measured in turn, repeats alternating. Then the gather
of a batch from a chunk (``gather_windows`` with ``dtype=torch.float32`` from the
float16 chunk against the plain gather from the float32 one), and the cost of
``stats._trace.profiled`` with no profiler running, against one chunk's read.
"""

from __future__ import annotations

import statistics
import timeit
from pathlib import Path

import numpy as np
import torch

import chunkstream as cs
from chunkstream import flyvis
from chunkstream.stats._trace import READ, profiled

from ._stores import DATA_DIR

__all__ = ["dtype_section", "run_dtype"]

_DTYPES = ("float32", "float16")
_CODECS = ("none", "blosc-zstd")


def _stores(timesteps: int, neurons: int, root: Path) -> dict[tuple[str, str], Path]:
    """Write (once) the float16 and float32 stores of the same values; return their paths."""
    paths = {}
    rng = np.random.default_rng(0)
    values = None
    for codec in _CODECS:
        for dtype in _DTYPES:
            path = root / f"dtype-{timesteps}x{neurons}-{codec}-{dtype}.zarr"
            if not (path / "zarr.json").exists():
                if values is None:
                    values = rng.standard_normal((timesteps, neurons), np.float32)
                    values = values.astype(np.float16)  # exact in both dtypes
                flyvis.write_array(path, values.astype(dtype), (1024, neurons),
                                   codec=None if codec == "none" else codec)  # fmt: skip
            paths[(codec, dtype)] = path
    return paths


def _epoch(path: Path, chunk_size: int) -> dict[str, float]:
    with cs.ChunkLoader(cs.ZarrSource(path), chunk_size, device="cpu", workers=2, sampling="sequential", options=cs.LoaderOptions(close_source=True)) as loader:  # fmt: skip
        for chunk in loader.epoch():
            chunk["data"].sum()  # touch the chunk, as a consumer would
        s = loader.stats.summary()
    return {"gb_per_s": s["gb_per_s"], "bytes": s["bytes"], "elapsed_s": s["elapsed_s"],
            "read_mean_ms": s["read_mean_ms"]}  # fmt: skip


def _gather_ms(chunk: torch.Tensor, dtype: torch.dtype | None, batch: int, window: int) -> float:
    gen = torch.Generator().manual_seed(0)
    starts = cs.sample_windows(chunk, batch_size=batch, window=window, generator=gen)
    runs = timeit.repeat(lambda: cs.gather_windows(chunk, starts, window, dtype=dtype),
                         number=5, repeat=5)  # fmt: skip
    return min(runs) / 5 * 1e3


def run_dtype(
    *, quick: bool = False, root: Path = DATA_DIR, size: tuple[int, int, int] | None = None
) -> dict:
    """Every figure of the storage-dtype section (module docs); ``size`` is
    ``(timesteps, neurons, chunk_size)``, by default set by ``quick``."""
    if size is None:
        size = (16384, 512, 2048) if quick else (32768, 1024, 4096)
    timesteps, neurons, chunk_size = size
    repeats = 3 if quick else 7  # short epochs on a shared machine: many, alternating
    root.mkdir(parents=True, exist_ok=True)
    paths = _stores(timesteps, neurons, root)
    for path in paths.values():  # warm the page cache: the figures compare decode and copy
        _epoch(path, chunk_size)
    runs: dict[str, list[dict]] = {f"{c}-{d}": [] for c, d in paths}
    for _ in range(repeats):
        for (codec, dtype), path in paths.items():
            runs[f"{codec}-{dtype}"].append(_epoch(path, chunk_size))
    stores = {}
    for name, rs in runs.items():
        stores[name] = {
            "gb_per_s": [r["gb_per_s"] for r in rs],
            "bytes": rs[0]["bytes"],
            "epoch_s": [r["elapsed_s"] for r in rs],
            "read_mean_ms": [r["read_mean_ms"] for r in rs],
            "timesteps_per_s": [timesteps / r["elapsed_s"] for r in rs],
        }
    half = torch.from_numpy(np.random.default_rng(1).standard_normal((chunk_size, neurons),
                                                                     np.float32)).half()  # fmt: skip
    batch, window = 64, 32
    gather = {
        "float16 chunk, dtype=float32": _gather_ms(half, torch.float32, batch, window),
        "float32 chunk, no dtype": _gather_ms(half.float(), None, batch, window),
        "float16 chunk, no dtype": _gather_ms(half, None, batch, window),
    }
    calls = 200_000
    per_call_s = min(timeit.repeat(lambda: profiled(READ, (0, 1)), number=calls, repeat=3)) / calls
    read_s = min(statistics.median(s["read_mean_ms"]) for s in stores.values()) / 1e3
    return {
        "geometry": {
            "timesteps": timesteps,
            "neurons": neurons,
            "chunk_size": chunk_size,
            "time_chunk": 1024,
            "repeats": repeats,
            "workers": 2,
        },
        "stores": stores,
        "gather_ms": gather,
        "gather_shape": [batch, window, neurons],
        "profiled_off_ns": per_call_s * 1e9,
        # three ranges per chunk (read, copy, wait) against the cheapest chunk read here
        "profiled_fraction_of_read": 3 * per_call_s / read_s if read_s > 0 else None,
    }


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return f"{min(values):{fmt}} / {statistics.median(values):{fmt}} / {max(values):{fmt}}"


def dtype_section(results: dict | None) -> list[str]:
    """The BENCHMARKS.md section of a ``run_dtype`` result (with the run's metadata)."""
    if results is None or "dtype" not in results:
        return []
    d, g = results["dtype"], results["dtype"]["geometry"]
    m = results.get("machine", {})
    lines = [
        "### storage dtype",
        "",
        f"- command: `{results.get('command', 'python -m benchmarks.run --only dtype')}` "
        f"({results.get('seconds', 0) / 60:.1f} min); 1-minute load "
        f"{results.get('load_1min_after', float('nan')):.2f} after; the machine was shared "
        "with other work, so compare rows of this table with each other, not across runs",
        f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores; commit "
        f"{m.get('commit', '?')}; load {m.get('load_1min_before', float('nan')):.2f} before",
        f"- one field of {g['timesteps']} x {g['neurons']}, time chunks of {g['time_chunk']}, "
        f"the same values (float16-representable) in both dtypes; a CPU `ChunkLoader`, "
        f"{g['workers']} workers, windows of {g['chunk_size']} steps, sequential epochs, page "
        f"cache warm; {g['repeats']} epochs per store, stores in turn",
        "",
        "| store | bytes per epoch | delivered GB/s min / median / max "
        "| timesteps/s (k) min / median / max | epoch s median |",
        "|---|---|---|---|---|",
    ]
    for name, s in d["stores"].items():
        lines.append(
            f"| {name} | {s['bytes'] / 1e6:.1f} MB | {_spread(s['gb_per_s'])} | "
            f"{_spread([v / 1e3 for v in s['timesteps_per_s']], '.0f')} | "
            f"{statistics.median(s['epoch_s']):.3f} |"
        )
    lines.append("")
    for codec in _CODECS:
        a, b = d["stores"].get(f"{codec}-float16"), d["stores"].get(f"{codec}-float32")
        if a and b:
            ratio = statistics.median(a["timesteps_per_s"]) / statistics.median(
                b["timesteps_per_s"]
            )
            lines.append(f"- {codec}: float16 moves {a['bytes'] / b['bytes']:.2f}x the bytes "
                         f"of float32 and delivers {ratio:.2f}x its timesteps/s (medians)")  # fmt: skip
    shape = " x ".join(map(str, d["gather_shape"]))
    gathers = "; ".join(f"{k} {v:.3f} ms" for k, v in d["gather_ms"].items())
    lines.append(
        f"- gather of a {shape} batch (best of 5x5, CPU): {gathers}. On the CPU the "
        "conversion is torch's float16 -> float32 kernel, slow on this machine; on "
        "CUDA it is one elementwise kernel over the batch (not measured here: no GPU)"
    )
    frac = d["profiled_fraction_of_read"]
    lines.append(
        f"- `profiled(...)` with no profiler running: {d['profiled_off_ns']:.0f} ns a call; "
        f"three a chunk are {100 * frac:.4f}% of the fastest store's mean chunk read"
        if frac is not None
        else "- `profiled(...)`: no read time measured"
    )
    return [*lines, ""]
