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
from tests.stores import chunk_files, make_array, make_sharded, random_data

CODECS = [None, "blosc-zstd", "zstd", "gzip"]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    assert wait_for_no_threads() == [], "a test left chunkstream threads running"


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def _general_path_store(path: Path, data: np.ndarray, chunks) -> None:
    """A local v3 array with a transpose and a crc32c checksum codec: not fast-path
    eligible (zarr decodes)."""
    arr = zarr.create_array(
        str(path), shape=data.shape, chunks=chunks, dtype=data.dtype,
        filters=[zarr.codecs.TransposeCodec(order=(1, 0))],
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
        source,
        100,
        device="cpu",
        sampling="sequential",
        options=cs.LoaderOptions(check_finite=True),
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


# -- sharded arrays: the fast path reads each shard's index itself ------------------------


def _sharded(path: Path, **layout) -> np.ndarray:
    """200 x 5 float32 in 4 shards of 50 timesteps, each 2 inner chunks of 25 (zstd)."""
    return make_sharded(path, random_data((200, 5)), (25, 5), (50, 5), "zstd", **layout)


def _read(source: cs.ZarrSource, start: int, stop: int) -> np.ndarray:
    out = {"data": np.full((stop - start, 5), np.nan, np.float32)}
    source.read_into(start, stop, out)
    return out["data"]


def test_a_deleted_shard_is_missing_at_open_and_at_read_unless_allowed(tmp_path):
    path = tmp_path / "x.zarr"
    data = _sharded(path)
    source = cs.ZarrSource(path)
    assert source.uses_fast_path
    (path / "c" / "1" / "0").unlink()
    np.testing.assert_array_equal(_read(source, 0, 50), data[:50])
    with pytest.raises(cs.MissingChunkError, match="shard 'c/1/0' is missing") as info:
        _read(source, 40, 60)
    assert str(path / "c" / "1" / "0") in str(info.value)
    source.close()
    with pytest.raises(cs.MissingChunkError, match="c/1/0"):
        cs.ZarrSource(path)
    with cs.ZarrSource(path, check_missing=False) as allowed:
        got = _read(allowed, 40, 110)
    assert (got[10:60] == 0).all()
    np.testing.assert_array_equal(got[:10], data[40:50])
    np.testing.assert_array_equal(got[60:], data[100:110])


def test_an_inner_chunk_its_shard_left_out_is_missing_unless_allowed(tmp_path):
    # zarr's default (write_empty_chunks=False) leaves out an inner chunk equal to the fill
    # value and marks it empty in the index: the same rule as an unwritten chunk file
    path = tmp_path / "x.zarr"
    data = random_data((200, 5))
    data[75:100] = 0  # inner chunk 1 of shard 1
    make_sharded(path, data, (25, 5), (50, 5), "zstd", write_empty_chunks=False)
    source = cs.ZarrSource(path)  # every shard file is there: the open-time listing passes
    np.testing.assert_array_equal(_read(source, 0, 75), data[:75])
    with pytest.raises(cs.MissingChunkError) as info:
        _read(source, 60, 110)
    message = str(info.value)
    assert "inner chunk (1, 0)" in message and "'c/1/0'" in message
    assert "index marks it empty" in message and "write_empty_chunks=True" in message
    source.close()
    with cs.ZarrSource(path, check_missing=False) as allowed:
        np.testing.assert_array_equal(_read(allowed, 60, 110), data[60:110])


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize(
    "how, match",
    [
        ("truncated", "checksum fails"),  # the index is read from the wrong bytes
        ("empty", "fewer than its 36-byte index"),
        ("garbage", "checksum fails"),
        ("index-bit-flip", "checksum fails"),
    ],
)
def test_a_damaged_shard_is_corrupt_naming_the_file_and_window(tmp_path, location, how, match):
    path = tmp_path / "x.zarr"
    _sharded(path, index_location=location)
    victim = path / "c" / "1" / "0"
    raw = bytearray(victim.read_bytes())
    if how == "truncated":
        raw = raw[:-7] if location == "end" else raw[7:]
    elif how == "empty":
        raw = bytearray()
    elif how == "garbage":
        raw = bytearray(np.random.default_rng(1).bytes(len(raw)))
    else:  # an offset byte of the index's second entry (36 bytes: 2 x 16, then the crc32c)
        raw[16 if location == "start" else -20] ^= 0x01
    victim.write_bytes(bytes(raw))
    source = cs.ZarrSource(path)
    with pytest.raises(cs.CorruptChunkError, match=match) as info:
        _read(source, 50, 100)
    assert isinstance(info.value, ValueError)
    assert str(victim) in str(info.value) and "timesteps [50, 100)" in str(info.value)
    source.close()


def test_a_shard_index_without_checksum_is_still_checked_against_the_file(tmp_path):
    import struct

    path = tmp_path / "x.zarr"
    data = _sharded(path, checksum=False)
    victim = path / "c" / "1" / "0"
    raw = bytearray(victim.read_bytes())
    good = bytes(raw)
    offset, _ = struct.unpack_from("<QQ", raw, len(raw) - 16)  # inner chunk (1, 0)
    struct.pack_into("<QQ", raw, len(raw) - 16, offset, len(raw))  # runs past the file
    victim.write_bytes(bytes(raw))
    with cs.ZarrSource(path) as source:
        np.testing.assert_array_equal(_read(source, 50, 75), data[50:75])  # entry 0 is intact
        with pytest.raises(cs.CorruptChunkError, match=r"inner chunk \(1, 0\).*outside") as info:
            _read(source, 50, 100)
    assert str(victim) in str(info.value)
    victim.write_bytes(good)


def test_an_inner_chunk_of_the_wrong_size_is_corrupt_not_stale_bytes(tmp_path):
    # a hand-made shard, laid out as zarr's sharding codec writes it (no index checksum):
    # inner chunk 0 a well-formed zstd frame of 10 rows instead of 25, then the index
    import numcodecs

    path = tmp_path / "x.zarr"
    data = _sharded(path, checksum=False)
    frames = [numcodecs.Zstd().encode(data[50:60].tobytes()),
              numcodecs.Zstd().encode(data[75:100].tobytes())]  # fmt: skip
    index = np.array([[0, len(frames[0])], [len(frames[0]), len(frames[1])]], "<u8")
    victim = path / "c" / "1" / "0"
    victim.write_bytes(frames[0] + frames[1] + index.tobytes())
    with cs.ZarrSource(path) as source:
        np.testing.assert_array_equal(_read(source, 75, 100), data[75:100])  # the good one
        with pytest.raises(cs.CorruptChunkError, match="decodes to 200 bytes, expected 500"):
            _read(source, 50, 100)


@st.composite
def _sharded_case(draw):
    total, columns = draw(st.integers(5, 120)), draw(st.integers(1, 6))
    chunks = (draw(st.integers(1, 30)), draw(st.integers(1, columns)))
    shards = (chunks[0] * draw(st.integers(1, 4)), chunks[1] * draw(st.integers(1, 3)))
    window = st.integers(0, total - 1).flatmap(lambda a: st.tuples(st.just(a),
                                                                   st.integers(a + 1, total)))  # fmt: skip
    return {
        "total": total, "columns": columns, "chunks": chunks, "shards": shards,
        "dtype": draw(st.sampled_from(["float32", "int16", "float64"])),
        "codec": draw(st.sampled_from(CODECS)),
        "index_location": draw(st.sampled_from(["end", "start"])),
        "checksum": draw(st.booleans()),
        "field": draw(st.sampled_from(["all", "last", "part"])),
        "windows": draw(st.lists(window, min_size=1, max_size=6)),
        "seed": draw(st.integers(0, 999)),
    }  # fmt: skip


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(case=_sharded_case())
def test_sharded_reads_equal_zarrs_own_read(case):
    columns = case["columns"]
    index = {"all": (slice(None),), "last": (columns - 1,),
             "part": (slice(columns // 2, columns),)}[case["field"]]  # fmt: skip
    data = random_data((case["total"], columns), dtype=case["dtype"], seed=case["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.zarr"
        make_sharded(path, data, case["chunks"], case["shards"], case["codec"],
                     index_location=case["index_location"], checksum=case["checksum"])  # fmt: skip
        reference = zarr.open_array(path, mode="r")
        with warnings.catch_warnings():  # chunks wider than the field, on purpose
            warnings.simplefilter("ignore", cs.ReadAmplificationWarning)
            source = cs.ZarrSource(path, {"x": index}, read_threads=2)
        assert source.uses_fast_path
        with source:
            for start, stop in case["windows"]:
                out = {"x": np.zeros((stop - start, *source.fields["x"].shape), data.dtype)}
                source.read_into(start, stop, out)
                np.testing.assert_array_equal(out["x"], reference[(slice(start, stop), *index)])


# -- one integrity rule on every engine (issue 19) ----------------------------------------

ENGINES = ["auto", "chunkstream", "zarr", "zarrs"]


def _engine_source(path, engine: str, **kwargs) -> cs.ZarrSource:
    """``path`` through ``engine``; skipped where zarrs is not installed."""
    if engine == "zarrs":
        pytest.importorskip("zarrs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cs.ReadAmplificationWarning)
        return cs.ZarrSource(path, engine=engine, **kwargs)


def _filled(source: cs.ZarrSource, start: int, stop: int) -> dict[str, np.ndarray]:
    """A read of ``[start, stop)`` into buffers full of a sentinel (stale bytes show)."""
    out = {n: np.full((stop - start, *f.shape), 7, f.dtype) for n, f in source.fields.items()}
    source.read_into(start, stop, out)
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("location", ["end", "start"])
def test_an_inner_chunk_left_out_of_a_shard_is_missing_on_every_engine(tmp_path, engine, location):
    # issue 19 item 1: a crc32c inside the shards took auto to zarr's pipeline, where an inner
    # chunk zarr left out (write_empty_chunks=False) read as zeros on zarr and zarrs
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

    path = tmp_path / "x.zarr"
    data = random_data((20, 2))
    data[4:6, 0] = 0  # inner chunk (2, 0) of shard (0, 0) equals the fill value
    # zarrs refuses an uncompressed chain with crc32c (test_zarrs_refuses_*): zstd for it
    inner = [BytesCodec(), ZstdCodec() if engine == "zarrs" else Crc32cCodec()]
    sharding = ShardingCodec(chunk_shape=(2, 1), codecs=inner, index_location=location)
    zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(10, 2),
                      serializer=sharding, compressors=None)[...] = data  # fmt: skip
    source = _engine_source(path, engine)
    np.testing.assert_array_equal(_filled(source, 10, 20)["data"], data[10:20])
    with pytest.raises(cs.MissingChunkError) as info:
        _filled(source, 0, 10)
    assert "inner chunk (2, 0)" in str(info.value) and "'c/0/0'" in str(info.value)
    assert "write_empty_chunks=True" in str(info.value)
    source.close()
    with _engine_source(path, engine, check_missing=False) as allowed:
        np.testing.assert_array_equal(_filled(allowed, 0, 10)["data"], data[:10])


def test_an_inner_chunk_left_out_of_a_remote_shard_is_missing_when_checked():
    fsspec = pytest.importorskip("fsspec")
    data = random_data((40, 3))
    data[10:20] = 0
    url = f"memory://chunkstream-shards-{id(data)}.zarr"
    zarr.create_array(url, shape=data.shape, dtype=data.dtype, chunks=(10, 3),
                      shards=(20, 3))[...] = data  # fmt: skip
    try:
        with cs.ZarrSource(url, check_missing=True) as checked:
            np.testing.assert_array_equal(_filled(checked, 20, 40)["data"], data[20:40])
            with pytest.raises(cs.MissingChunkError, match=r"inner chunk \(1, 0\)"):
                _filled(checked, 5, 15)
    finally:
        fsspec.filesystem("memory").rm(f"/chunkstream-shards-{id(data)}.zarr", recursive=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_truncated_v2_blosc_chunk_in_fortran_order_is_corrupt(tmp_path, engine):
    # issue 19 item 2: v2 order="F" took auto to zarr's pipeline, whose blosc decode trusts
    # the header and returned the lost tail as uninitialised memory
    import numcodecs

    path = tmp_path / "x.zarr"
    data = random_data((100, 8))
    zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(50, 8),
                      zarr_format=2, order="F", compressors=numcodecs.Blosc())[...] = data  # fmt: skip
    source = _engine_source(path, engine)
    np.testing.assert_array_equal(_filled(source, 20, 80)["data"], data[20:80])
    victim = path / "0.0"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(cs.CorruptChunkError) as info:
        _filled(source, 0, 50)
    assert str(path) in str(info.value) and "[0, 50)" in str(info.value)
    assert "0.0" in str(info.value)  # the chunk, on every engine
    source.close()


@pytest.mark.parametrize("engine", ["auto", "zarr"])
@pytest.mark.parametrize("codec", ["bz2", "lz4", "zlib", "lzma", "blosc", "zstd"])
def test_any_codecs_error_for_a_damaged_chunk_is_corrupt_and_not_retried(tmp_path, engine, codec):
    # issue 19 item 3: OSError (bz2, lz4), zlib.error, LZMAError came through raw, and the
    # OSErrors were retried as transient I/O before failing
    import numcodecs

    compressor = {"bz2": numcodecs.BZ2(), "lz4": numcodecs.LZ4(), "zlib": numcodecs.Zlib(),
                  "lzma": numcodecs.LZMA(), "blosc": numcodecs.Blosc(),
                  "zstd": numcodecs.Zstd()}[codec]  # fmt: skip
    path = tmp_path / "x.zarr"
    data = random_data((100, 8))
    zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(50, 8),
                      zarr_format=2, order="F", compressors=compressor)[...] = data  # fmt: skip
    _damage(path / "0.0", "garbage")
    source = _engine_source(path, engine)
    with pytest.raises(cs.CorruptChunkError) as info:
        _filled(source, 0, 50)
    assert str(path) in str(info.value) and "[0, 50)" in str(info.value)
    assert "0.0" in str(info.value)  # the chunk, on every engine
    calls = []
    read = source.read_into

    def counted(*args):
        calls.append(args[:2])
        return read(*args)

    source.read_into = counted
    with (
        cs.ChunkLoader(
            source,
            50,
            device="cpu",
            sampling="sequential",
            options=cs.LoaderOptions(read_retries=2),
        ) as loader,
        pytest.raises(cs.ChunkLoadError) as failed,
    ):
        list(loader.epoch(2))
    assert isinstance(failed.value.__cause__, cs.CorruptChunkError)
    assert calls.count((0, 50)) == 1  # bad data is not retried as an I/O hiccup
    source.close()


@pytest.mark.parametrize("bad", [0, 1])
def test_every_engine_names_the_damaged_inner_chunk_of_a_shard(tmp_path, bad):
    # a hand-made last shard (no index checksum): inner chunk `bad` is a truncated zstd frame
    import numcodecs

    path = tmp_path / "x.zarr"
    data = make_sharded(path, random_data((200, 5)), (25, 5), (50, 5), "zstd", checksum=False)
    frames = [numcodecs.Zstd().encode(data[i : i + 25].tobytes()) for i in (150, 175)]
    frames[bad] = frames[bad][:-6]
    index = np.array([[0, len(frames[0])], [len(frames[0]), len(frames[1])]], "<u8")
    (path / "c" / "3" / "0").write_bytes(frames[0] + frames[1] + index.tobytes())
    for engine in ENGINES:
        with _engine_source(path, engine) as source:
            with pytest.raises(cs.CorruptChunkError) as info:
                _filled(source, 150, 200)
            assert f"inner chunk ({bad}, 0)" in str(info.value), (engine, str(info.value))
            assert "c/3/0" in str(info.value)


def test_a_zstd_frame_claiming_a_huge_size_inside_a_shard_is_corrupt(tmp_path):
    # issue 19 item 3: zarr's pipeline raised MemoryError (and zarrs aborted the process)
    # for a zstd frame whose content size field was damaged inside a shard. A hand-made shard, as zarr's sharding codec
    # writes it (no index checksum): inner chunk 0's frame claims 2**40 bytes
    import struct

    import numcodecs

    path = tmp_path / "x.zarr"
    data = make_sharded(path, random_data((40, 3)), (10, 3), (20, 3), "zstd", checksum=False)
    frames = [bytearray(numcodecs.Zstd().encode(data[i : i + 10].tobytes())) for i in (0, 10)]
    descriptor = frames[0][4]
    single = descriptor >> 5 & 1
    at = 5 + (0 if single else 1)
    width = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    frames[0] = (frames[0][:4] + bytes([3 << 6 | descriptor & 0x3F]) + frames[0][5:at]
                 + struct.pack("<Q", 2**40) + frames[0][at + width :])  # fmt: skip
    index = np.array([[0, len(frames[0])], [len(frames[0]), len(frames[1])]], "<u8")
    (path / "c" / "0" / "0").write_bytes(bytes(frames[0] + frames[1]) + index.tobytes())
    # on zarrs the frame's header is checked before zarrs would abort allocating 1 TiB
    for engine in ENGINES:
        with _engine_source(path, engine) as source:
            np.testing.assert_array_equal(_filled(source, 10, 20)["data"], data[10:20])
            with pytest.raises(cs.CorruptChunkError) as info:
                _filled(source, 0, 10)
            assert "[0, 10)" in str(info.value) and "c/0/0" in str(info.value)


@pytest.mark.parametrize("check_missing", ["auto", False])
def test_a_truncated_shard_without_an_index_checksum_is_corrupt_on_every_engine(
    tmp_path, check_missing
):
    # Cut in half, the shard's last 32 bytes are data read as its index: entries far past
    # the file's end. zarrs aborted the process on them (check_missing=False) or raised a
    # pyo3 PanicException, a BaseException (check_missing="auto"); zarr named a wrong damage
    # (and its offset arithmetic overflowed) before its sharding codec was checked.
    path = tmp_path / "x.zarr"
    data = make_sharded(path, random_data((64, 6)), (8, 6), (32, 6), "blosc-zstd",
                        checksum=False)  # fmt: skip
    shard = path / "c" / "1" / "0"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    for engine in ENGINES:
        with _engine_source(path, engine, check_missing=check_missing) as source:
            np.testing.assert_array_equal(_filled(source, 0, 32)["data"], data[:32])
            with pytest.raises(cs.CorruptChunkError) as info:
                _filled(source, 32, 64)
            message = str(info.value)
            assert "index entry for inner chunk" in message and "c/1/0" in message, engine
            assert "[32, 64)" in message
            assert str(path) in message, engine  # the file, or the store and the key


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "int16", "float64", "complex64"])
def test_big_endian_arrays_stream_in_native_order(tmp_path, engine, zarr_format, dtype):
    # issue 19 item 4: v2 '>f4' (common from older writers) was refused on every engine
    from zarr.codecs import BytesCodec

    if engine == "zarrs" and dtype == "complex64":
        pytest.skip("refused on zarrs: test_zarrs_refuses_the_layouts_it_misreads")
    path = tmp_path / "x.zarr"
    data = random_data((30, 4), dtype="float64")
    data = (data + 1j * data[::-1] if dtype.startswith("complex") else data * 100).astype(dtype)
    if zarr_format == 2:
        zarr.create_array(str(path), shape=data.shape, dtype=data.dtype.newbyteorder(">"),
                          chunks=(8, 3), zarr_format=2)[...] = data  # fmt: skip
    else:
        zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(8, 3),
                          serializer=BytesCodec(endian="big"))[...] = data  # fmt: skip
    with _engine_source(path, engine, fields={"a": (slice(None),), "b": (2,)}) as source:
        assert source.fields["a"].dtype == np.dtype(dtype)  # native: torch takes it as it is
        for start, stop in [(0, 30), (3, 13), (16, 24)]:  # whole and partial chunks
            got = _filled(source, start, stop)
            np.testing.assert_array_equal(got["a"], data[start:stop])
            np.testing.assert_array_equal(got["b"], data[start:stop, 2])


def test_zarrs_refuses_the_layouts_it_misreads(tmp_path):
    # issue 19 item 5: zarrs swaps the real and imaginary parts of big-endian complex data on
    # partial-chunk reads, and fails on blosc chunks that are not a multiple of the typesize;
    # found by the differential test: it skips the crc32c of an uncompressed chunk it reads in
    # part, and the adler32 of a zlib stream
    pytest.importorskip("zarrs")
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec

    data = (random_data((20, 2), "float32") * (1 + 2j)).astype("complex64")
    zarr.create_array(str(tmp_path / "c.zarr"), shape=data.shape, dtype=data.dtype,
                      chunks=(8, 2), serializer=BytesCodec(endian="big"))[...] = data  # fmt: skip
    ints = random_data((11, 3), "int16")
    zarr.create_array(str(tmp_path / "b.zarr"), shape=ints.shape, dtype=ints.dtype,
                      chunks=(3, 1), compressors=BloscCodec(typesize=8))[...] = ints  # fmt: skip
    zarr.create_array(str(tmp_path / "k.zarr"), shape=ints.shape, dtype=ints.dtype,
                      chunks=(3, 3), compressors=Crc32cCodec())[...] = ints  # fmt: skip
    zarr.create_array(str(tmp_path / "z.zarr"), shape=ints.shape, dtype=ints.dtype,
                      chunks=(3, 3), zarr_format=2, compressors=numcodecs.Zlib())[...] = ints  # fmt: skip
    for name, expected, why in [("c.zarr", data, "real and imaginary"),
                                ("b.zarr", ints, "typesize 8"),
                                ("k.zarr", ints, "without checking its crc32c"),
                                ("z.zarr", ints, "adler32")]:  # fmt: skip
        with pytest.raises(cs.ConfigError, match=why) as info:
            cs.ZarrSource(tmp_path / name, engine="zarrs")
        assert "engine='zarrs'" in str(info.value) and 'engine="auto"' in str(info.value)
        with cs.ZarrSource(tmp_path / name) as auto:
            np.testing.assert_array_equal(_filled(auto, 1, 10)["data"], expected[1:10])


@pytest.mark.parametrize("engine", ENGINES)
def test_an_int_index_beside_a_partial_edge_chunk_reads_on_every_engine(tmp_path, engine):
    # issue 19 item 5: zarrs raised UnsupportedVIndexingError for an int index here whenever
    # the window spanned two time chunks; ZarrSource reads the axis as a length-1 slice
    path = tmp_path / "x.zarr"
    data = random_data((18, 3, 3))
    make_array(path, data, (4, 2, 2), codec="zstd")  # axes 1 and 2 end in partial chunks
    fields = {"a": (1,), "b": (2, slice(1, 3)), "c": (slice(None), 2)}
    with _engine_source(path, engine, fields=fields) as source:
        for start, stop in [(3, 9), (0, 18), (7, 14)]:
            got = _filled(source, start, stop)
            for name, index in fields.items():
                np.testing.assert_array_equal(got[name], data[(slice(start, stop), *index)])


@pytest.mark.parametrize("engine", ["zarr", "zarrs"])
def test_an_index_error_means_a_bad_chunk_only_from_zarrs(tmp_path, monkeypatch, engine):
    """zarrs' Rust codecs raise IndexError for a chunk they cannot decode; zarr's pipeline
    raises none for a damaged chunk, so there an IndexError is a bug and stays one."""
    if engine == "zarrs":
        pytest.importorskip("zarrs")
    make_array(tmp_path / "a.zarr", random_data((64, 4)), (16, 4))
    with cs.ZarrSource(tmp_path / "a.zarr", engine=engine) as src:
        assert src.engine == engine
        out = {"data": np.empty((32, 4), np.float32)}
        src.read_into(0, 32, out)  # reads as it should

        def raise_index_error(self, *args, **kwargs):
            raise IndexError("list index out of range")

        # where the window is read, and where a failed window's chunks are tried one by one
        monkeypatch.setattr("chunkstream.sources._zarr.read_selection", raise_index_error)
        monkeypatch.setattr(zarr.Array, "get_basic_selection", raise_index_error)
        expected = IndexError if engine == "zarr" else cs.CorruptChunkError
        with pytest.raises(expected) as info:
            src.read_into(0, 32, out)
    if engine == "zarr":
        assert not isinstance(info.value, cs.ChunkstreamError)
    else:
        assert isinstance(info.value.__cause__, IndexError) and "does not decode" in str(info.value)
