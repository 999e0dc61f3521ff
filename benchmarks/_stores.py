"""The benchmark stores: synthetic FlyVis stores made by ``synth``, cached under ``_data/``.

Two chunkings of the ``(T, N, 4)`` timeseries, each uncompressed and with
blosc-zstd + bitshuffle: per-column ``(2000, N, 1)`` (a field's chunks hold only
its column) and interleaved ``(4096, N, 4)`` (every chunk holds all four
columns, so reading two fields decodes all four). A store is written once and
reused while its stamp matches (``ensure_synthetic``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from chunkstream.tools import ensure_synthetic

__all__ = ["DATA_DIR", "Geometry", "StoreSpec", "chunk_files", "make_store", "store_specs", "warm"]

DATA_DIR = Path(__file__).resolve().parent / "_data"


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """Store and window sizes; ``full()`` is >= 2 GB per store."""

    timesteps: int
    neurons: int
    stim_dims: int
    chunk_size: int  # timesteps per loader window

    @staticmethod
    def full() -> Geometry:
        # 131072 x 1024 x 4 float32 = 2.15 GB decoded; windows of 16384 steps = 80 MiB
        return Geometry(timesteps=131072, neurons=1024, stim_dims=256, chunk_size=16384)

    @staticmethod
    def tiny() -> Geometry:
        return Geometry(timesteps=4096, neurons=64, stim_dims=16, chunk_size=1024)

    @property
    def nbytes(self) -> int:
        return self.timesteps * self.neurons * 4 * 4

    @property
    def window_nbytes(self) -> int:
        """Decoded bytes of the two fields used (voltage + stimulus) per window."""
        return self.chunk_size * (self.neurons + self.stim_dims) * 4


@dataclass(frozen=True, kw_only=True)
class StoreSpec:
    name: str  # e.g. "percol-blosc"
    layout: str  # "percol" | "interleaved"
    codec: str  # "none" | "blosc-zstd"
    chunks: tuple[int, int, int]
    path: Path  # the synth output directory (holds timeseries.zarr)

    @property
    def compressed(self) -> bool:
        return self.codec != "none"

    @property
    def array_path(self) -> Path:
        return self.path / "timeseries.zarr"


def store_specs(geo: Geometry, root: Path = DATA_DIR) -> list[StoreSpec]:
    n = geo.neurons
    t_col = min(2000, geo.timesteps)
    t_int = min(4096, geo.timesteps)
    specs = []
    for layout, chunks in (("percol", (t_col, n, 1)), ("interleaved", (t_int, n, 4))):
        for codec, short in (("blosc-zstd", "blosc"), ("none", "raw")):
            tag = f"{layout}-{codec}-T{geo.timesteps}-N{n}-S{geo.stim_dims}"
            specs.append(
                StoreSpec(
                    name=f"{layout}-{short}",
                    layout=layout,
                    codec=codec,
                    chunks=chunks,
                    path=root / tag,
                )
            )
    return specs


def make_store(spec: StoreSpec, geo: Geometry) -> dict:
    """Write (or reuse) the store; returns synth's info plus the bytes on disk."""
    info = ensure_synthetic(
        spec.path, layout="flyvis", timesteps=geo.timesteps, neurons=geo.neurons,
        stim_dims=geo.stim_dims, zarr_format=3, codec=spec.codec, chunks=spec.chunks,
        progress=False,
    )  # fmt: skip
    on_disk = sum(p.stat().st_size for p in chunk_files(spec))
    return {"decoded_bytes": int(info.nbytes), "disk_bytes": int(on_disk), "chunks": spec.chunks}


def chunk_files(spec: StoreSpec) -> list[Path]:
    root = spec.array_path
    return [
        Path(d) / f
        for d, _, files in os.walk(root)
        for f in files
        if f not in ("zarr.json", ".zarray", ".zattrs", ".zgroup")
    ]


def warm(spec: StoreSpec) -> float:
    """Read every chunk file once so the page cache holds the store; returns seconds."""
    import time

    begin = time.perf_counter()
    buf = bytearray(1 << 24)
    view = memoryview(buf)
    for path in chunk_files(spec):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
    return time.perf_counter() - begin
