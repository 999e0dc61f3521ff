"""Storage dtype is not compute dtype: fields stream as stored, the gather converts.

float16, bool and int8/16/32 fields reach the chunk in their stored dtype through
every source; ``gather_windows(..., dtype=)`` and ``StreamOptions(dtype=)``
convert floating-point fields batch by batch on the device (exactly, for
float16 -> float32) and leave masks and indices as stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import chunkstream as cs
from tests.stores import make_array

T, N = 45, 5
STORED = ["float16", "bool", "int8", "int16", "int32"]


def _values(dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random((T, N)) > 0.5
    if dtype.startswith("int"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=(T, N), endpoint=True).astype(dtype)
    return (rng.standard_normal((T, N)) * 300).astype(dtype)  # spans float16's exponents


def _zarr(engine, zarr_format=3, codec="blosc-zstd"):
    def build(tmp: Path, data: np.ndarray):
        make_array(tmp / "a.zarr", data, (8, N), zarr_format=zarr_format, codec=codec)
        return cs.ZarrSource(tmp / "a.zarr", engine=engine)

    return build


def _tensorstore(tmp: Path, data: np.ndarray):
    pytest.importorskip("tensorstore")
    make_array(tmp / "a.zarr", data, (8, N), zarr_format=3, codec="zstd")
    return cs.TensorStoreSource(tmp / "a.zarr")


def _group(tmp: Path, data: np.ndarray):
    import zarr

    group = zarr.open_group(tmp / "g.zarr", mode="w")
    group.create_array("data", shape=data.shape, chunks=(8, N), dtype=data.dtype)[...] = data
    return cs.ZarrGroupSource(tmp / "g.zarr")


SOURCES = {
    "zarr3-fast": _zarr("chunkstream"),
    "zarr2-fast-raw": _zarr("chunkstream", 2, None),
    "zarr3-general": _zarr("zarr"),
    "tensorstore": _tensorstore,
    "numpy": lambda tmp, data: cs.NumpySource({"data": data}),
    "callable": lambda tmp, data: cs.CallableSource(
        lambda a, b: (data[a:b].copy(),), T, names=("data",)
    ),
    "group": _group,
    "join": lambda tmp, data: cs.JoinSource({"data": cs.NumpySource({"x": data})}),
}


@pytest.mark.parametrize("dtype", STORED)
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_every_source_streams_fields_as_stored(tmp_path, kind, dtype):
    data = _values(dtype)
    source = SOURCES[kind](tmp_path, data)
    assert source.fields["data"].dtype == np.dtype(dtype)
    with cs.ChunkLoader(
        source, 16, device="cpu", sampling="sequential", options=cs.LoaderOptions(close_source=True)
    ) as ld:
        chunks = list(ld.epoch())
        assert ld.stats.summary()["bytes"] == data.nbytes  # the stored bytes, not float32's
    assert len(chunks) == 3
    for chunk in chunks:
        tensor = chunk["data"]
        assert tensor.dtype == torch.from_numpy(data[:1]).dtype
        np.testing.assert_array_equal(tensor.numpy(), data[chunk.start : chunk.stop])


def test_float16_gathers_into_float32_exactly():
    x = torch.from_numpy(_values("float16"))
    starts = torch.tensor([0, 7, 30, 7, 35])
    batch = cs.gather_windows(x, starts, 10, dtype=torch.float32)
    assert batch.dtype == torch.float32 and batch.shape == (5, 10, N)
    expected = torch.stack([x[s : s + 10] for s in starts.tolist()]).float()
    assert torch.equal(batch, expected)  # x.half().float() semantics, bit for bit
    out = torch.full((5, 10, N), float("nan"))
    assert cs.gather_windows(x, starts, 10, out=out, dtype=torch.float32) is out
    assert torch.equal(out, expected)
    same = cs.gather_windows(x, starts, 10)  # no dtype: as stored
    assert same.dtype == torch.float16 and torch.equal(same.float(), expected)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32"])
def test_masks_and_indices_gather_as_stored(dtype):
    x = torch.from_numpy(_values(dtype))
    starts = torch.tensor([3, 0, 20])
    batch = cs.gather_windows(x, starts, 6, dtype=torch.float32)
    assert batch.dtype == x.dtype
    assert torch.equal(batch, torch.stack([x[s : s + 6] for s in (3, 0, 20)]))


class _Allocations(TorchDispatchMode):
    """Records the dtype and element count of every tensor an operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[tuple[str, torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(value, torch.Tensor):
                self.outputs.append((str(func), value.dtype, value.numel()))
        return result


def test_the_conversion_never_copies_the_chunk():
    chunk = torch.from_numpy((np.arange(4000 * 8) % 1000).astype(np.float16).reshape(4000, 8))
    starts = torch.tensor([5, 900, 3000])
    with _Allocations() as seen:
        batch = cs.gather_windows(chunk, starts, 16, dtype=torch.float32)
    assert batch.numel() == 3 * 16 * 8
    converted = [(op, n) for op, dtype, n in seen.outputs if dtype == torch.float32]
    assert converted and max(n for _, n in converted) == batch.numel(), converted
    # the float16 work is views of the chunk and at most the batch itself: on a device the
    # batch is gathered as stored and converted; on the CPU the gather's copies convert
    # window by window (numpy casts, outside torch), so no float16 batch exists at all
    copies = [n for op, dtype, n in seen.outputs if dtype == torch.float16 and "index" in op]
    assert copies in ([], [batch.numel()])
    torch.testing.assert_close(batch, torch.stack([chunk[s : s + 16] for s in starts]).float())


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, "float32", np.float32])
def test_unsupported_compute_dtype_is_refused(dtype):
    x = torch.zeros(20, 3, dtype=torch.float16)
    with pytest.raises(cs.ConfigError, match=r"dtype=.*torch\.float32"):
        cs.gather_windows(x, torch.tensor([0]), 4, dtype=dtype)


def test_out_of_the_stored_dtype_is_refused_when_converting():
    x = torch.zeros(20, 3, dtype=torch.float16)
    with pytest.raises(cs.ConfigError, match=r"out=.*torch\.float32"):
        cs.gather_windows(x, torch.tensor([0]), 4, out=torch.empty(1, 4, 3), dtype=torch.float64)


def test_batch_stream_upcasts_traces_and_keeps_the_mask(tmp_path):
    traces, mask = _values("float16", 1), _values("bool", 2)
    make_array(tmp_path / "t.zarr", traces, (8, N), codec="zstd")
    make_array(tmp_path / "m.zarr", mask, (8, N), zarr_format=2, codec="zstd")

    def epoch(dtype):
        join = cs.JoinSource({"traces": cs.ZarrSource(tmp_path / "t.zarr"),
                              "mask": cs.ZarrSource(tmp_path / "m.zarr")})  # fmt: skip
        with cs.ChunkLoader(
            join, 16, device="cpu", seed=4, options=cs.LoaderOptions(close_source=True)
        ) as loader:
            return list(cs.BatchStream(loader, window=4, batch_size=6, batches_per_chunk=2, options=cs.StreamOptions(dtype=dtype)))  # fmt: skip

    batches, stored = epoch(torch.float32), epoch(None)  # same seed and plan: same windows
    assert len(batches) == len(stored) > 0
    for up, raw in zip(batches, stored, strict=True):
        assert up["traces"].dtype == torch.float32 and raw["traces"].dtype == torch.float16
        assert torch.equal(up["traces"], raw["traces"].float())
        assert up["mask"].dtype == torch.bool and torch.equal(up["mask"], raw["mask"])


def test_batch_stream_refuses_a_bad_dtype_at_construction():
    source = cs.NumpySource({"x": np.zeros((40, 2), "f2")})
    with (
        cs.ChunkLoader(source, 10, device="cpu") as ld,
        pytest.raises(cs.ConfigError, match=r"dtype=torch\.int64"),
    ):
        cs.BatchStream(
            ld,
            window=4,
            batch_size=2,
            batches_per_chunk=1,
            options=cs.StreamOptions(dtype=torch.int64),
        )


@pytest.mark.gpu
def test_cuda_chunks_keep_the_stored_dtype_and_the_gather_converts_on_the_device(tmp_path):
    traces, mask = _values("float16", 1), _values("bool", 2)
    source = cs.NumpySource({"traces": traces, "mask": mask})
    with cs.ChunkLoader(source, 16, device="cuda", workers=2, seed=3) as loader:
        for chunk in loader.epoch():
            x, m = chunk["traces"], chunk["mask"]
            assert x.is_cuda and x.dtype == torch.float16 and m.dtype == torch.bool
            starts = cs.sample_windows(chunk, batch_size=5, window=4)
            batch = cs.gather_windows(x, starts, 4, dtype=torch.float32)
            assert batch.is_cuda and batch.dtype == torch.float32
            rows = [traces[s : s + 4] for s in (starts + chunk.start).tolist()]
            np.testing.assert_array_equal(batch.cpu().numpy(), np.stack(rows).astype(np.float32))
            assert cs.gather_windows(m, starts, 4, dtype=torch.float32).dtype == torch.bool


def test_the_plan_memory_table_counts_the_stored_dtype(tmp_path):
    from chunkstream.tools import layout_from_store, plan_memory

    sizes = {}
    for dtype in ("float16", "float32"):
        make_array(tmp_path / f"{dtype}.zarr", _values("float16").astype(dtype), (8, N))
        layout = layout_from_store(tmp_path / f"{dtype}.zarr")
        report = plan_memory(layout, chunk_size=16, batch_size=4, device="cuda")
        assert report.fields == {"data": [[N], dtype]}
        sizes[dtype] = (report.chunk_bytes, report.streaming.device_bytes, report.full.device_bytes)
    assert sizes["float16"][0] == 16 * N * 2
    assert [2 * b for b in sizes["float16"]] == list(sizes["float32"])  # half, row by row
