"""Conformance suite every source passes, plus the sources' validation errors."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

import chunkstream.sources as sources
from chunkstream._errors import (
    ConfigError,
    CorruptChunkError,
    FieldDtypeError,
    FieldLengthError,
    FieldSelectionError,
    MissingChunkError,
    NotZarrError,
    ReadAmplificationWarning,
    SourceNotFoundError,
)
from chunkstream.sources import (
    CallableSource,
    JoinSource,
    NumpySource,
    Source,
    TensorStoreSource,
    ZarrGroupSource,
    ZarrSource,
)
from chunkstream.sources._base import field_of, tag_field
from tests.stores import chunk_files, make_array, make_sharded, random_data

T, N = 53, 6
FIELDS = {"v": (slice(None), 0), "s": (slice(0, 5), 1), "w": (slice(1, 6), 3)}


def _expected(data: np.ndarray) -> dict[str, np.ndarray]:
    return {"v": data[:, :, 0], "s": data[:, 0:5, 1], "w": data[:, 1:6, 3]}


def _open(path: Path, engine: str) -> ZarrSource:
    """The conformance fields of the array at ``path`` through ``engine``, checked to use it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReadAmplificationWarning)  # some layouts on purpose
        src = ZarrSource(path, FIELDS, read_threads=3, engine=engine)
    assert src.engine == engine
    assert src.uses_fast_path is (engine == "chunkstream")
    return src


def _zarr_kind(zarr_format, codec, chunks, engine):
    def build(tmp_path: Path):
        if engine == "zarrs":
            pytest.importorskip("zarrs")
        data = make_array(tmp_path / "a.zarr", random_data((T, N, 4)), chunks, zarr_format, codec)
        return _open(tmp_path / "a.zarr", engine), _expected(data)

    return build


def _sharded(engine, chunks=(4, N, 1), shards=(8, N, 4), **layout):
    def build(tmp_path: Path):
        if engine == "zarrs":
            pytest.importorskip("zarrs")
        if layout:
            data = make_sharded(tmp_path / "s.zarr", random_data((T, N, 4)), chunks, shards,
                                **layout)  # fmt: skip
        else:  # zarr's defaults: zstd inner chunks, the index at the end with its crc32c
            data = random_data((T, N, 4))
            arr = zarr.create_array(tmp_path / "s.zarr", shape=data.shape, dtype=data.dtype,
                                    chunks=chunks, shards=shards)  # fmt: skip
            arr[...] = data
        return _open(tmp_path / "s.zarr", engine), _expected(data)

    return build


def _numpy(tmp_path: Path):
    data = random_data((T, N, 4))
    exp = _expected(data)
    return NumpySource({k: np.ascontiguousarray(v) for k, v in exp.items()}), exp


def _npy(tmp_path: Path):
    exp = _expected(random_data((T, N, 4)))
    for k, v in exp.items():
        np.save(tmp_path / f"{k}.npy", v)
    return NumpySource({k: tmp_path / f"{k}.npy" for k in exp}), exp


def _tensorstore(zarr_format):
    def build(tmp_path: Path):
        pytest.importorskip("tensorstore")
        data = make_array(tmp_path / "t.zarr", random_data((T, N, 4)), (7, N, 1), zarr_format,
                          "blosc-zstd")  # fmt: skip
        return TensorStoreSource(tmp_path / "t.zarr", FIELDS), _expected(data)

    return build


def _callable(tmp_path: Path):
    exp = _expected(random_data((T, N, 4)))

    def load_fn(start, stop):
        return tuple(exp[k][start:stop].copy() for k in ("v", "s", "w"))

    return CallableSource(load_fn, T, names=("v", "s", "w")), exp


def _join(labelled: bool, with_tensorstore: bool = False):
    """A join of three real stores: numpy, zarr v2 and zarr v3 (or tensorstore) parts."""

    def build(tmp_path: Path):
        if with_tensorstore:
            pytest.importorskip("tensorstore")
        data = random_data((T, N, 4))
        exp = _expected(data)
        make_array(tmp_path / "s.zarr", np.ascontiguousarray(data[:, :, 1]), (7, N), 2, "zstd")
        make_array(tmp_path / "w.zarr", data, (8, N, 1), 3, "blosc-zstd")
        s = ZarrSource(tmp_path / "s.zarr", {"s": (slice(0, 5),)})
        w_fields = {"w": (slice(1, 6), 3)}
        w = (TensorStoreSource(tmp_path / "w.zarr", w_fields) if with_tensorstore
             else ZarrSource(tmp_path / "w.zarr", w_fields, read_threads=2))  # fmt: skip
        if labelled:  # one-field parts take their label
            v = NumpySource({"anything": np.ascontiguousarray(exp["v"])})
            return JoinSource({"v": v, "s": s, "w": w}), exp
        return JoinSource(NumpySource({"v": np.ascontiguousarray(exp["v"])}), s, w), exp

    return build


KINDS = {
    "zarr3-blosc-fast": _zarr_kind(3, "blosc-zstd", (7, N, 1), "chunkstream"),
    "zarr3-zstd-fast": _zarr_kind(3, "zstd", (8, N, 1), "chunkstream"),
    "zarr3-raw-fast": _zarr_kind(3, None, (7, N, 1), "chunkstream"),
    "zarr3-gzip-fast-blocks": _zarr_kind(3, "gzip", (5, 4, 2), "chunkstream"),
    "zarr2-blosc-fast": _zarr_kind(2, "blosc-zstd", (8, N, 1), "chunkstream"),
    "zarr2-zstd-fast-blocks": _zarr_kind(2, "zstd", (6, 4, 4), "chunkstream"),
    "zarr2-raw-fast": _zarr_kind(2, None, (7, N, 1), "chunkstream"),
    "zarr3-blosc-general": _zarr_kind(3, "blosc-zstd", (7, N, 1), "zarr"),
    "zarr2-zstd-general-blocks": _zarr_kind(2, "zstd", (5, 4, 2), "zarr"),
    "zarr3-sharded-fast": _sharded("chunkstream"),
    "zarr3-sharded-fast-blosc-start-blocks": _sharded(
        "chunkstream", (4, 3, 2), (8, 6, 4), codec="blosc-zstd", index_location="start"
    ),
    "zarr3-sharded-fast-raw-nocrc": _sharded("chunkstream", codec=None, checksum=False),
    "zarr3-sharded-general": _sharded("zarr"),
    "zarr3-blosc-zarrs": _zarr_kind(3, "blosc-zstd", (7, N, 1), "zarrs"),
    "zarr3-raw-zarrs": _zarr_kind(3, None, (7, N, 1), "zarrs"),
    "zarr2-zstd-zarrs-blocks": _zarr_kind(2, "zstd", (5, 4, 2), "zarrs"),
    "zarr3-sharded-zarrs": _sharded("zarrs"),
    "numpy": _numpy,
    "npy-memmap": _npy,
    "tensorstore-zarr3": _tensorstore(3),
    "tensorstore-zarr2": _tensorstore(2),
    "callable": _callable,
    "join": _join(labelled=False),
    "join-labelled": _join(labelled=True),
    "join-tensorstore": _join(labelled=False, with_tensorstore=True),
}

# crossing chunk boundaries, whole chunks, the last partial chunk, one step, everything
WINDOWS = [(0, T), (0, 1), (3, 19), (7, 14), (8, 24), (40, T), (T - 1, T), (13, 14), (20, 41)]


@pytest.fixture(params=sorted(KINDS))
def built(request, tmp_path):
    src, exp = KINDS[request.param](tmp_path)
    yield src, exp
    src.close()


def _buffers(src, rows: int, garbage: float = np.nan) -> dict[str, np.ndarray]:
    return {n: np.full((rows, *f.shape), garbage, f.dtype) for n, f in src.fields.items()}


def test_len_and_fields(built):
    src, exp = built
    assert isinstance(src, Source)
    assert len(src) == T
    assert set(src.fields) == set(exp)
    for name, spec in src.fields.items():
        assert spec.shape == exp[name].shape[1:]
        assert spec.dtype == exp[name].dtype


def test_windows_match_numpy_and_dirty_buffers_are_overwritten(built):
    src, exp = built
    rng = np.random.default_rng(1)
    starts = rng.integers(0, T - 1, size=12)
    windows = WINDOWS + [(int(s), int(rng.integers(s + 1, T + 1))) for s in starts]
    out = _buffers(src, T + 3)  # one reused, larger, garbage-filled buffer
    for start, stop in windows:
        for arr in out.values():
            arr.fill(np.nan)
        src.read_into(start, stop, out)
        for name, arr in out.items():
            np.testing.assert_array_equal(arr[: stop - start], exp[name][start:stop])
            assert np.isnan(arr[stop - start :]).all()  # rows past the window untouched


def test_concurrent_reads_from_four_threads(built):
    src, exp = built
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        out = _buffers(src, T)
        try:
            for _ in range(15):
                start = int(rng.integers(0, T - 1))
                stop = int(rng.integers(start + 1, T + 1))
                src.read_into(start, stop, out)
                for name, arr in out.items():
                    np.testing.assert_array_equal(arr[: stop - start], exp[name][start:stop])
        except BaseException as exc:  # handed to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]


def test_close_is_idempotent(built):
    src, _ = built
    src.close()
    src.close()


def _group(tmp_path: Path):
    zarr.open_group(tmp_path / "g", mode="w")
    make_array(tmp_path / "g" / "a", random_data((T, N)), (8, N))
    return ZarrGroupSource(tmp_path / "g"), None


# One source of each public class, for what every class promises beyond reading.
ONE_OF_EACH = {
    "CallableSource": _callable,
    "JoinSource": _join(labelled=False),
    "NumpySource": _numpy,
    "TensorStoreSource": _tensorstore(3),
    "ZarrGroupSource": _group,
    "ZarrSource": _zarr_kind(3, "blosc-zstd", (7, N, 1), "chunkstream"),
}


def test_one_of_each_covers_every_public_source_class():
    assert set(ONE_OF_EACH) == {
        n for n in sources.__all__ if n.endswith("Source") and n != "Source"
    }


@pytest.mark.parametrize("name", sorted(ONE_OF_EACH))
def test_every_source_is_a_context_manager_that_closes(name, tmp_path):
    src, _ = ONE_OF_EACH[name](tmp_path)
    assert type(src) is getattr(sources, name)
    calls = []
    close = src.close

    def counted_close():
        calls.append(name)
        close()

    src.close = counted_close  # `with` calls it through the instance
    with src as entered:
        assert entered is src
        src.read_into(0, 3, _buffers(src, 3))
    assert len(calls) == 1
    with pytest.raises(RuntimeError, match="in the block"), src:
        raise RuntimeError("in the block")  # propagates, and the source closes again
    assert len(calls) == 2


def test_a_field_tag_keeps_the_innermost_name_unless_replaced():
    exc = OSError("read failed")
    assert field_of(exc) is None
    tag_field(exc, "inner")
    tag_field(exc, "outer")
    assert field_of(exc) == "inner"
    tag_field(exc, "exposed", replace=True)
    assert field_of(exc) == "exposed"

    class Frozen(OSError):
        def __setattr__(self, name, value):
            raise AttributeError(name)

    frozen = Frozen("read failed")
    tag_field(frozen, "x")  # an exception that cannot carry the name goes untagged
    assert field_of(frozen) is None


# -- ZarrSource validation ------------------------------------------------------------


def _store(tmp_path, chunks=(8, N, 1), codec="blosc-zstd", zarr_format=3, data=None):
    data = random_data((T, N, 4)) if data is None else data
    return make_array(tmp_path / "a.zarr", data, chunks, zarr_format, codec), tmp_path / "a.zarr"


def test_missing_path(tmp_path):
    with pytest.raises(SourceNotFoundError, match=r"nope\.zarr"):
        ZarrSource(tmp_path / "nope.zarr")


def test_not_a_zarr_folder(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.txt").write_text("hi")
    with pytest.raises(NotZarrError, match="plain"):
        ZarrSource(tmp_path / "plain")


def test_group_needs_array_name(tmp_path):
    group = zarr.open_group(tmp_path / "g.zarr", mode="w")
    group.create_array("ts", shape=(10, 3), dtype="f4")[...] = 1
    with pytest.raises(ConfigError, match="ts"):
        ZarrSource(tmp_path / "g.zarr")
    src = ZarrSource(tmp_path / "g.zarr", array="ts")
    assert len(src) == 10 and src.fields["data"].shape == (3,)
    src.close()


def test_open_zarr_array_object(tmp_path):
    data, path = _store(tmp_path)
    src = ZarrSource(zarr.open_array(path, mode="r"), {"v": (slice(None), 2)})
    out = _buffers(src, 10)
    src.read_into(5, 15, out)
    np.testing.assert_array_equal(out["v"], data[5:15, :, 2])
    src.close()


@pytest.mark.parametrize(
    "index, match",
    [
        ((slice(None), 4), "out of range"),
        ((slice(0, 7), 0), "exceeds"),
        ((slice(None), 0, 1), "non-time axes"),
        ((slice(3, 3), 0), "no elements"),
        (([0, 1], 0), "fancy"),
    ],
)
def test_bad_selection(tmp_path, index, match):
    _, path = _store(tmp_path)
    with pytest.raises(FieldSelectionError, match=match) as info:
        ZarrSource(path, {"bad": index})
    assert "'bad'" in str(info.value)


def test_step_slice_rejected(tmp_path):
    _, path = _store(tmp_path)
    with pytest.raises(FieldSelectionError, match=r"step 1.*") as info:
        ZarrSource(path, {"v": (slice(0, 6, 2), 0)})
    assert "'v'" in str(info.value) and "slice(0, 6, 2)" in str(info.value)


def test_bad_dtype(tmp_path):
    with pytest.raises(FieldDtypeError, match="uint32"):
        ZarrSource(make_array(tmp_path / "u.zarr", np.zeros((5, 2), "u4"), (5, 2)) is not None
                   and tmp_path / "u.zarr")  # fmt: skip


def test_missing_chunk_detected_at_open_with_key(tmp_path):
    _, path = _store(tmp_path)
    (path / "c" / "2" / "0" / "0").unlink()
    with pytest.raises(MissingChunkError, match="c/2/0/0"):
        ZarrSource(path, FIELDS)
    # a chunk no field needs may be absent
    src = ZarrSource(path, {"w": (slice(1, 6), 3)})
    src.close()


@pytest.mark.parametrize("engine", ["chunkstream", "zarr", "zarrs"])
@pytest.mark.parametrize("check_missing", [True, "open"])
def test_missing_chunk_after_open(tmp_path, engine, check_missing):
    if engine == "zarrs":
        pytest.importorskip("zarrs")
    _, path = _store(tmp_path)
    src = ZarrSource(path, FIELDS, check_missing=check_missing, engine=engine)
    (path / "c" / "3" / "0" / "1").unlink()
    out = _buffers(src, 20)
    src.read_into(0, 20, out)  # chunks 0..2 in time are intact
    with pytest.raises(MissingChunkError, match="c/3/0/1") as info:
        src.read_into(20, 40, out)
    assert getattr(info.value, "chunkstream_field", None) == "s"
    src.close()


@pytest.mark.parametrize("engine", ["chunkstream", "zarr", "zarrs"])
def test_missing_chunk_allowed_reads_fill_value(tmp_path, engine):
    # also what zarrs does on its own: ZarrSource's check is what catches an absent chunk
    if engine == "zarrs":
        pytest.importorskip("zarrs")
    data, path = _store(tmp_path)
    (path / "c" / "0" / "0" / "0").unlink()
    src = ZarrSource(path, FIELDS, check_missing=False, engine=engine)
    out = _buffers(src, 16)
    src.read_into(0, 16, out)
    assert (out["v"][:8] == 0).all()
    np.testing.assert_array_equal(out["v"][8:], data[8:16, :, 0])
    src.close()


@pytest.mark.parametrize("codec", ["blosc-zstd", "zstd", "gzip", None])
@pytest.mark.parametrize("engine", ["chunkstream", "zarr", "zarrs"])
def test_truncated_chunk_is_corrupt(tmp_path, codec, engine):
    if engine == "zarrs":
        pytest.importorskip("zarrs")
    fast = engine == "chunkstream"
    _, path = _store(tmp_path, codec=codec)
    victim = path / "c" / "1" / "0" / "0"
    victim.write_bytes(victim.read_bytes()[:-7])
    src = ZarrSource(path, FIELDS, engine=engine)
    out = _buffers(src, T)
    with pytest.raises(CorruptChunkError) as info:
        src.read_into(0, T, out)
    # the fast path names the chunk file; zarr's general path only knows the array
    assert str(victim if fast else path) in str(info.value)
    src.close()


def test_read_amplification_warned_for_interleaved_chunks(tmp_path):
    _, path = _store(tmp_path, chunks=(8, N, 4))
    with pytest.warns(ReadAmplificationWarning, match=r"'v'.*4\.0x.*convert"):
        src = ZarrSource(path, {"v": (slice(None), 0)})
    assert src.read_amplification == {"v": 4.0}
    src.close()


def test_no_read_amplification_warning_for_per_column_chunks(tmp_path):
    _, path = _store(tmp_path, chunks=(8, N, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadAmplificationWarning)
        src = ZarrSource(path, {"v": (slice(None), 0), "c": (slice(None), 2)})
    assert src.read_amplification == {"v": 1.0, "c": 1.0}
    assert src.nbytes_per_step == 2 * N * 4
    assert src.chunks == (8, N, 1)
    src.close()


def test_zarrs_engine_without_zarrs_names_the_extra(tmp_path, monkeypatch):
    _, path = _store(tmp_path)
    monkeypatch.setitem(sys.modules, "zarrs", None)  # as if not installed
    with pytest.raises(ImportError, match=r"chunkstream\[zarrs\]"):
        ZarrSource(path, FIELDS, engine="zarrs")
    with ZarrSource(path, FIELDS) as src:  # the default install needs no zarrs
        assert src.engine == "chunkstream"


def _decode_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("chunkstream-decode-")}


def test_decode_threads_are_named(tmp_path):
    from chunkstream._memory import node_share

    _, path = _store(tmp_path)
    shared = ZarrSource(path, FIELDS)  # the process's one decode pool, its thread budget
    other = ZarrSource(path, FIELDS)
    shared.read_into(0, T, _buffers(shared, T))
    before = _decode_threads()
    assert before and len(before) <= node_share().threads
    src = ZarrSource(path, FIELDS, read_threads=2)  # a pool of its own
    src.read_into(0, T, _buffers(src, T))
    seen = _decode_threads() - before
    assert seen
    src.close()
    assert not any(t.name in seen and t.is_alive() for t in threading.enumerate())
    # closing one source leaves the shared pool to the others; the last one ends it
    shared.close()
    other.read_into(0, T, _buffers(other, T))
    assert before <= _decode_threads()
    other.close()
    deadline = time.monotonic() + 5
    while _decode_threads() & before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _decode_threads() & before


def test_url_store_uses_general_path():
    pytest.importorskip("fsspec")
    data = random_data((T, N, 4))
    url = f"memory://chunkstream-test-{id(data)}.zarr"
    arr = zarr.create_array(url, shape=data.shape, chunks=(8, N, 1), dtype=data.dtype)
    arr[...] = data
    src = ZarrSource(url, FIELDS)
    assert not src.uses_fast_path
    out = _buffers(src, 30)
    src.read_into(10, 40, out)
    np.testing.assert_array_equal(out["s"], data[10:40, 0:5, 1])
    src.close()


def test_sharded_arrays_take_the_fast_path_by_default(tmp_path):
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, TransposeCodec

    data = random_data((T, N, 4))
    arr = zarr.create_array(tmp_path / "s.zarr", shape=data.shape, dtype=data.dtype,
                            chunks=(4, N, 1), shards=(8, N, 4))  # fmt: skip
    arr[...] = data
    with ZarrSource(tmp_path / "s.zarr", FIELDS) as src:
        assert src.engine == "chunkstream" and src.uses_fast_path
    # a checksum inside the shards is checked by our reader
    inner = ShardingCodec(chunk_shape=(4, N, 1), codecs=[BytesCodec(), Crc32cCodec()])
    zarr.create_array(tmp_path / "c.zarr", shape=data.shape, dtype=data.dtype, chunks=(8, N, 4),
                      serializer=inner, compressors=None)[...] = data  # fmt: skip
    with ZarrSource(tmp_path / "c.zarr", FIELDS) as src:
        assert src.engine == "chunkstream" and src.uses_fast_path
        out = _buffers(src, 10)
        src.read_into(20, 30, out)
        np.testing.assert_array_equal(out["s"], data[20:30, 0:5, 1])
    # a transpose inside the shards is not a chain our reader takes: zarr's pipeline reads it
    inner = ShardingCodec(chunk_shape=(4, N, 1), codecs=[TransposeCodec(order=(2, 1, 0)),
                                                          BytesCodec()])  # fmt: skip
    zarr.create_array(tmp_path / "t.zarr", shape=data.shape, dtype=data.dtype, chunks=(8, N, 4),
                      serializer=inner, compressors=None)[...] = data  # fmt: skip
    with ZarrSource(tmp_path / "t.zarr", FIELDS) as src:
        assert src.engine == "zarr" and not src.uses_fast_path
        out = _buffers(src, 10)
        src.read_into(20, 30, out)
        np.testing.assert_array_equal(out["s"], data[20:30, 0:5, 1])


def test_each_shard_is_opened_once_per_read(tmp_path, monkeypatch):
    import chunkstream.sources._fastzarr as fastzarr

    data = make_sharded(tmp_path / "s.zarr", random_data((T, N, 4)), (4, N, 1), (8, N, 4))
    opened: list[Path] = []
    real = fastzarr.open_shard

    def counting(path, layout, window):
        opened.append(path)
        return real(path, layout, window)

    monkeypatch.setattr(fastzarr, "open_shard", counting)
    with ZarrSource(tmp_path / "s.zarr", FIELDS) as src:
        out = _buffers(src, 20)
        src.read_into(5, 25, out)  # shards 0..3 in time; 2 inner chunks of each per column
        np.testing.assert_array_equal(out["w"], data[5:25, 1:6, 3])
    assert sorted(p.relative_to(tmp_path / "s.zarr").as_posix() for p in opened) == [
        f"c/{t}/0/0" for t in range(4)
    ]


def test_bad_check_missing(tmp_path):
    _, path = _store(tmp_path)
    with pytest.raises(ConfigError, match="check_missing"):
        ZarrSource(path, check_missing="sometimes")


# -- NumpySource / CallableSource validation --------------------------------------------


def test_numpy_rejects_object_dtype():
    with pytest.raises(FieldDtypeError, match="'x'"):
        NumpySource({"x": np.array([["a"], ["b"]], dtype=object)})
    with pytest.raises(FieldDtypeError, match="'y'"):
        NumpySource({"y": np.array(["ab", "cd"])})


def test_numpy_rejects_different_lengths_and_empty():
    with pytest.raises(FieldLengthError, match="a=5, b=4"):
        NumpySource({"a": np.zeros((5, 2), "f4"), "b": np.zeros((4, 2), "f4")})
    with pytest.raises(ConfigError):
        NumpySource({"a": np.zeros((0, 2), "f4")})
    with pytest.raises(ConfigError):
        NumpySource({})


def test_numpy_missing_npy(tmp_path):
    with pytest.raises(SourceNotFoundError, match=r"x\.npy"):
        NumpySource({"a": tmp_path / "x.npy"})


def test_callable_checks_every_result():
    good = np.zeros((10, 3), "f4")
    calls: list[tuple[int, int]] = []

    def load_fn(start, stop):
        calls.append((start, stop))
        rows = good[start:stop]
        return (rows, rows[:, :2]) if start >= 5 else (rows, rows.copy())

    src = CallableSource(load_fn, 10, names=("a", "b"))
    assert calls == [(0, 2)]
    assert src.fields["b"].shape == (3,)
    out = _buffers(src, 5)
    src.read_into(0, 4, out)
    with pytest.raises(ValueError, match=r"'b'.*\(3, 2\).*expected shape \(3, 3\)"):
        src.read_into(5, 8, out)


def test_callable_with_specs_and_wrong_count():
    spec = sources.FieldSpec((2,), np.dtype("f4"))
    src = CallableSource(lambda a, b: (np.zeros((b - a, 2), "f4"),), 7, names=("x", "y"),
                         specs={"x": spec, "y": spec})  # fmt: skip
    with pytest.raises(ValueError, match="expected a tuple of 2"):
        src.read_into(0, 3, _buffers(src, 3))
    with pytest.raises(ConfigError, match="total_timesteps"):
        CallableSource(lambda a, b: (), 0)


def test_public_names():
    assert sources.__all__ == sorted(sources.__all__)
    assert {"CallableSource", "NumpySource", "TensorStoreSource", "ZarrSource"} <= set(
        sources.__all__
    )
    assert chunk_files  # helper used by other modules


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (OSError("incomplete frame"), CorruptChunkError),  # zarrs' truncated zstd frame
        (PermissionError(13, "Permission denied"), PermissionError),
        (FileNotFoundError(2, "No such file"), FileNotFoundError),
        (RuntimeError("Permission denied (os error 13)"), RuntimeError),  # a Rust I/O error
        (MissingChunkError("chunk c/0/0/0 is missing"), MissingChunkError),
    ],
)
def test_zarrs_io_errors_are_not_called_corrupt(tmp_path, monkeypatch, raised, expected):
    # root reads a chmod-000 file, so the I/O failure is injected where zarrs raises it
    pytest.importorskip("zarrs")
    _, path = _store(tmp_path)
    src = ZarrSource(path, FIELDS, engine="zarrs")

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr("chunkstream.sources._zarr.read_selection", fail)  # where zarrs raises
    with pytest.raises(expected) as info:
        src.read_into(0, 8, _buffers(src, 8))
    assert (type(info.value) is CorruptChunkError) == (expected is CorruptChunkError)
    if expected is not CorruptChunkError:
        assert info.value is raised
    src.close()
