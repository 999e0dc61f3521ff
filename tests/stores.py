"""Small real zarr stores for tests (other test modules import these helpers).

Every function writes real data with zarr-python to a path the caller gives
(use pytest's ``tmp_path``) and returns the numpy array it wrote, so a test
can compare what a source reads with plain numpy slicing.

``codec`` is one of ``"blosc-zstd"`` (blosc with zstd and bitshuffle),
``"zstd"``, ``"gzip"`` or ``None`` (uncompressed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chunkstream import flyvis

__all__ = ["chunk_files", "make_array", "make_flyvis", "make_sharded", "random_data"]


def random_data(shape: tuple[int, ...], dtype: str = "float32", seed: int = 0) -> np.ndarray:
    """Reproducible random data (distinct values, so misplaced reads show)."""
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def make_array(
    path: str | Path,
    data: np.ndarray,
    chunks: tuple[int, ...],
    zarr_format: int = 3,
    codec: str | None = "blosc-zstd",
) -> np.ndarray:
    """Write ``data`` as a zarr array at ``path`` with ``chunks``; return ``data``."""
    flyvis.write_array(path, data, chunks, zarr_format=zarr_format, codec=codec)
    return data


def make_sharded(
    path: str | Path,
    data: np.ndarray,
    chunks: tuple[int, ...],
    shards: tuple[int, ...],
    codec: str | None = "blosc-zstd",
    *,
    index_location: str = "end",
    checksum: bool = True,
    write_empty_chunks: bool = True,
    index_endian: str = "little",
) -> np.ndarray:
    """Write ``data`` as a sharded zarr v3 array (inner ``chunks``, ``shards``); return ``data``.

    ``index_endian="big"`` stores the shard index's uint64 pairs big-endian
    (``BytesCodec(endian="big")``, a valid array zarr reads).
    ``checksum=False`` writes the shard index without zarr's default crc32c;
    ``write_empty_chunks=False`` (zarr's default) leaves out inner chunks that
    equal the fill value (0), so their index entries read as empty.
    """
    import zarr
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    inner = [BytesCodec()] + ([] if codec is None else [flyvis._compressors(codec, 3)])
    sharding = ShardingCodec(chunk_shape=chunks, codecs=inner, index_location=index_location,
                             index_codecs=[BytesCodec(endian=index_endian)] + [Crc32cCodec()] * checksum)  # fmt: skip
    arr = zarr.create_array(
        str(path), shape=data.shape, dtype=data.dtype, chunks=shards, serializer=sharding,
        compressors=None, config={"write_empty_chunks": write_empty_chunks},
    )  # fmt: skip
    arr[...] = data
    return data


def make_flyvis(
    path: str | Path,
    T: int,
    N: int,
    chunks: tuple[int, int, int] | None = None,
    zarr_format: int = 3,
    codec: str | None = "blosc-zstd",
    seed: int = 0,
) -> np.ndarray:
    """Write a FlyVis dataset under ``path``; return the ``(T, N, 4)`` timeseries written.

    ``chunks`` defaults to ``(min(T, 64), N, 1)`` (one column per chunk). The
    stimulus field (``[:, :stim_dims, 1]``) then decodes ``N / stim_dims`` times
    what it uses and ``flyvis.open`` warns (ReadAmplificationWarning) when that
    exceeds 1.5: pass ``chunks=(t, stim_dims, 1)`` to avoid it. The metadata is
    ``(N, 5)`` float32 with column 0 the neuron index.
    """
    data = random_data((T, N, 4), seed=seed)
    meta = random_data((N, 5), seed=seed + 1)
    meta[:, 0] = np.arange(N)
    flyvis.write(path, data, meta, chunks=chunks or (min(T, 64), N, 1),
                 zarr_format=zarr_format, codec=codec)  # fmt: skip
    return data


def chunk_files(path: str | Path) -> list[Path]:
    """Every chunk file of the zarr array at ``path`` (metadata files excluded), sorted."""
    skip = {"zarr.json", ".zarray", ".zattrs", ".zgroup"}
    return sorted(p for p in Path(path).rglob("*") if p.is_file() and p.name not in skip)
