"""Data integrity: missing and corrupt chunks are errors, never data; the loader delivers
exactly the stored bytes, in exactly the plan's windows (an end-to-end property test)."""

from __future__ import annotations

import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkstream as cs
from chunkstream.plans import make_plan
from tests.faults import wait_for_no_threads
from tests.stores import chunk_files, make_array, random_data

CODECS = [None, "blosc-zstd", "zstd", "gzip"]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    assert wait_for_no_threads() == [], "a test left chunkstream threads running"


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def _general_path_store(path: Path, data: np.ndarray, chunks) -> None:
    """A local v3 array with a crc32c checksum codec: not fast-path eligible (zarr decodes)."""
    arr = zarr.create_array(
        str(path), shape=data.shape, chunks=chunks, dtype=data.dtype,
        compressors=[zarr.codecs.Crc32cCodec()],
    )  # fmt: skip
    arr[...] = data


# -- missing chunks ---------------------------------------------------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_missing_chunk_is_found_at_open_with_its_key_by_default(tmp_path, zarr_format):
    path = tmp_path / "x.zarr"
    make_array(path, random_data((300, 4)), (50, 4), zarr_format=zarr_format)
    victim = chunk_files(path)[3]
    key = victim.relative_to(path).as_posix()
    victim.unlink()
    with pytest.raises(cs.MissingChunkError, match=key) as info:
        cs.ZarrSource(path)
    assert isinstance(info.value, FileNotFoundError)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("route", ["fast", "general"])
def test_chunk_deleted_after_open_is_found_at_read_with_its_key(tmp_path, route):
    path = tmp_path / "x.zarr"
    data = random_data((300, 4))
    if route == "fast":
        make_array(path, data, (50, 4), codec="zstd")
    else:
        _general_path_store(path, data, (50, 4))
    source = cs.ZarrSource(path)
    assert source.uses_fast_path == (route == "fast")
    (path / "c" / "2" / "0").unlink()
    with cs.ChunkLoader(source, 50, device="cpu", sampling="sequential") as loader:
        received = []
        with pytest.raises(cs.ChunkLoadError) as info:
            for chunk in loader.epoch(6):
                received.append(chunk.start)
    assert isinstance(info.value.__cause__, cs.MissingChunkError)
    assert "c/2/0" in str(info.value.__cause__)
    # an error is raised as soon as a worker hits it, so only chunks before it, if any
    assert received == [0, 50][: len(received)]
    source.close()


def test_remote_store_is_checked_only_when_asked():
    fsspec = pytest.importorskip("fsspec")
    data = random_data((120, 3))
    url = f"memory://chunkstream-integrity-{id(data)}.zarr"
    arr = zarr.create_array(url, shape=data.shape, chunks=(40, 3), dtype=data.dtype)
    arr[...] = data
    fsspec.filesystem("memory").rm(f"/chunkstream-integrity-{id(data)}.zarr/c/1/0")
    out = {"data": np.empty((120, 3), np.float32)}
    # default for a remote store: not checked (listing a bucket is costly); zarr fills
    unchecked = cs.ZarrSource(url)
    unchecked.read_into(0, 120, out)
    assert np.all(out["data"][40:80] == 0)
    unchecked.close()
    # opt-in at open: one listing
    with pytest.raises(cs.MissingChunkError, match="c/1/0"):
        cs.ZarrSource(url, check_missing="open")
    # opt-in per read: the window's keys are checked before reading
    checked = cs.ZarrSource(url, check_missing=True)
    checked.read_into(0, 40, out)
    with pytest.raises(cs.MissingChunkError, match="c/1/0"):
        checked.read_into(30, 90, out)
    checked.close()


# -- corrupt chunks ---------------------------------------------------------------------


def _damage(file: Path, how: str) -> None:
    raw = file.read_bytes()
    if how == "truncated":
        file.write_bytes(raw[: len(raw) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    else:  # "garbage": same length, random bytes
        file.write_bytes(np.random.default_rng(1).bytes(len(raw)))


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("how", ["truncated", "empty", "garbage"])
def test_damaged_chunk_on_the_fast_path_is_an_error_naming_the_file(
    tmp_path, zarr_format, codec, how
):
    if codec is None and how == "garbage":
        pytest.skip("raw bytes of the right size cannot be told from data: use a checksum codec")
    path = tmp_path / "x.zarr"
    data = make_array(path, random_data((200, 5)), (50, 5), zarr_format=zarr_format, codec=codec)
    source = cs.ZarrSource(path)
    assert source.uses_fast_path
    victim = chunk_files(path)[1]
    _damage(victim, how)
    with cs.ChunkLoader(source, 50, device="cpu", sampling="sequential") as loader:
        received = []
        with pytest.raises(cs.ChunkLoadError) as info:
            for chunk in loader.epoch(4):
                received.append(chunk["data"].numpy().copy())
    cause = info.value.__cause__
    assert isinstance(cause, cs.CorruptChunkError) and isinstance(cause, ValueError)
    assert str(victim) in str(cause)
    assert info.value.window == (50, 100)
    assert len(received) <= 1
    for array in received:
        np.testing.assert_array_equal(array, data[:50])
    source.close()


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_damaged_chunk_on_the_general_path_is_an_error_naming_the_store(tmp_path, codec):
    path = tmp_path / "x.zarr"
    make_array(path, random_data((200, 5)), (50, 5), codec=codec)
    source = cs.ZarrSource(path, engine="zarr")
    _damage(chunk_files(path)[1], "garbage")
    out = {"data": np.empty((50, 5), np.float32)}
    with pytest.raises(cs.CorruptChunkError, match="does not decode") as info:
        source.read_into(50, 100, out)
    assert str(path) in str(info.value)
    source.close()


def test_a_bit_flip_is_caught_by_a_checksum_codec(tmp_path):
    path = tmp_path / "x.zarr"
    _general_path_store(path, random_data((200, 5)), (50, 5))
    victim = chunk_files(path)[2]
    raw = bytearray(victim.read_bytes())
    raw[17] ^= 0x01  # one bit of the data, the file size unchanged
    victim.write_bytes(bytes(raw))
    source = cs.ZarrSource(path)
    with (
        cs.ChunkLoader(source, 50, device="cpu", sampling="sequential") as loader,
        pytest.raises(cs.ChunkLoadError) as info,
    ):
        list(loader.epoch(4))
    assert isinstance(info.value.__cause__, cs.CorruptChunkError)
    assert "checksum" in str(info.value.__cause__)
    source.close()


# -- the finite check -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_finite_check_names_field_and_position_on_a_zarr_store(tmp_path, bad):
    path = tmp_path / "x.zarr"
    data = random_data((400, 3, 2))
    data[263, 2, 1] = bad
    make_array(path, data, (40, 3, 1))
    source = cs.ZarrSource(path, {"a": (slice(None), 0), "b": (slice(None), 1)})
    with cs.ChunkLoader(
        source, 100, device="cpu", sampling="sequential", check_finite=True
    ) as loader:
        received = []
        with pytest.raises(cs.ChunkLoadError) as info:
            for chunk in loader.epoch(4):
                received.append(chunk.start)
    cause = info.value.__cause__
    assert isinstance(cause, cs.NonFiniteError) and isinstance(cause, ValueError)
    assert "'b'" in str(cause) and "(263, 2)" in str(cause) and "timestep 263" in str(cause)
    assert received == [0, 100][: len(received)]
    # without the check the value is delivered as stored: nothing is altered silently
    with cs.ChunkLoader(source, 100, device="cpu", sampling="sequential") as loader:
        chunk = next(c for c in loader.epoch(4) if c.start == 200)
        stored = chunk["b"][63, 2].item()
        assert (np.isnan(stored) and np.isnan(bad)) or stored == bad
    source.close()


# -- end to end: every delivered byte is the stored byte, every window the plan's --------


@st.composite
def _case(draw):
    total = draw(st.integers(30, 400))
    return {
        "total": total,
        "columns": draw(st.integers(1, 5)),
        "dtype": draw(st.sampled_from(["float32", "int16", "float64"])),
        "zarr_format": draw(st.sampled_from([2, 3])),
        "codec": draw(st.sampled_from(CODECS)),
        "zchunk": draw(st.integers(1, 80)),
        "zcols": draw(st.sampled_from(["all", "one"])),
        "chunk_size": draw(st.integers(1, total + 20)),
        "sampling": draw(st.sampled_from(["random", "shuffled", "sequential"])),
        "workers": draw(st.integers(1, 4)),
        "prefetch": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 2**31)),
        "epochs": draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)),
        "break_at": draw(st.none() | st.integers(0, 5)),
        "hold": draw(st.booleans()),
    }


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(case=_case())
def test_delivered_chunks_equal_the_stored_bytes_in_plan_order(case):
    with tempfile.TemporaryDirectory() as tmp:
        _run_case(Path(tmp) / "x.zarr", case)


def _run_case(path: Path, case: dict) -> None:
    total, columns = case["total"], case["columns"]
    data = random_data((total, columns, 2), dtype=case["dtype"], seed=case["seed"] % 1000)
    zcols = columns if case["zcols"] == "all" else 1
    make_array(path, data, (case["zchunk"], zcols, 1), case["zarr_format"], case["codec"])
    fields = {"x": (slice(None), 0), "y": (slice(0, max(1, columns - 1)), 1)}
    expected = {"x": data[:, :, 0], "y": data[:, : max(1, columns - 1), 1]}
    chunk_size = case["chunk_size"]
    plan = make_plan(case["sampling"], total_timesteps=total, chunk_size=chunk_size,
                     seed=case["seed"])  # fmt: skip
    with warnings.catch_warnings():  # interleaved layouts decode extra bytes on purpose
        warnings.simplefilter("ignore", cs.ReadAmplificationWarning)
        source = cs.ZarrSource(path, fields)
    held = []
    with cs.ChunkLoader(
        source, chunk_size, device="cpu", workers=case["workers"], prefetch=case["prefetch"],
        sampling=case["sampling"], seed=case["seed"],
    ) as loader:  # fmt: skip
        for epoch, n in enumerate(case["epochs"]):
            delivered = []
            for k, chunk in enumerate(loader.epoch(n)):
                assert (chunk.epoch, chunk.index) == (epoch, k)
                for name, array in expected.items():
                    got = chunk[name].numpy()
                    want = array[chunk.start : chunk.stop]
                    assert got.dtype == want.dtype and got.shape == want.shape
                    assert _crc(got) == _crc(want), (name, chunk.start, chunk.stop)
                delivered.append((chunk.start, chunk.stop))
                if case["hold"]:
                    held.append((chunk, {n_: _crc(a[chunk.start : chunk.stop])
                                         for n_, a in expected.items()}))  # fmt: skip
                if case["break_at"] is not None and k == case["break_at"]:
                    break
            want_n = n if case["break_at"] is None else min(n, case["break_at"] + 1)
            # no window dropped, none duplicated, none out of order
            assert delivered == [plan.window(epoch, i) for i in range(want_n)]
    # chunks the user held were never overwritten by later reads
    for chunk, crcs in held:
        assert {name: _crc(chunk[name].numpy()) for name in crcs} == crcs
    source.close()


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_a_well_formed_chunk_of_the_wrong_size_is_corrupt_not_stale_bytes(
    tmp_path, zarr_format, codec
):
    # gzip and zstd decode a short frame into the buffer without complaint; the fast path
    # checks the size the frame declares, so the buffer's old bytes never pass as data.
    import numcodecs

    path = tmp_path / "x.zarr"
    make_array(path, random_data((200, 5)), (50, 5), zarr_format=zarr_format, codec=codec)
    victim = chunk_files(path)[1]
    short = random_data((10, 5)).tobytes()
    victim.write_bytes((numcodecs.Zstd() if codec == "zstd" else numcodecs.GZip()).encode(short))
    source = cs.ZarrSource(path)
    assert source.uses_fast_path
    out = {"data": np.full((50, 5), 7.0, np.float32)}  # "stale" bytes in a reused buffer
    with pytest.raises(cs.CorruptChunkError, match="decodes to 200 bytes, expected 1000") as info:
        source.read_into(50, 100, out)
    assert str(victim) in str(info.value)
    source.close()
