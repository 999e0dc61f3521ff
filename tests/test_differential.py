"""Differential test: every engine reads what zarr-python reads, or raises the documented error.

Random small zarr stores (formats 2 and 3; every numcodecs compressor on v2, with or without
a filter, either memory order; blosc, zstd, gzip and crc32c on v3, alone or chained under
a second zstd or gzip (``[bytes, gzip, zstd]``), with or without a transpose; sharded with
the index at either end, little- or big-endian, with or without its checksum; every
streamable dtype in both byte orders; chunks that overhang the array) are read through
every engine and compared element for element with ``zarr.open_array(...)[...]``. Damaged
stores (a chunk or shard file truncated, overwritten with random bytes or deleted, an inner
chunk left out of its shard; a truncated shard whose index is at its start loses the index,
or keeps it and ends at the start or in the middle of the inner chunk the window needs)
must raise the error ``docs/parameters.md`` documents: ``MissingChunkError`` or
``CorruptChunkError``, never data. An engine may refuse an array at open only for a
documented reason (``ZarrSource.engine.*``); ``"auto"`` and ``"zarr"`` never refuse.
``tensorstore`` documents that it reads absent chunks as fill values, so it is compared on
undamaged stores only.

The remote path (zarr's pipeline over obstore, with chunkstream's checked codecs) reads the
same stores served by one local HTTP server that answers byte ranges as object stores do,
opened by URL with ``check_missing`` at its remote default (absent chunks read as zarr's
fill values) and ``True`` (``MissingChunkError``); a damaged chunk or shard is
``CorruptChunkError`` naming the URL and window, never a ``RemoteStoreError``. Sharded
stores get a run of their own, since one random store in five is sharded.

The remote path also runs through the node-local cache (``cache=DIR``): cold, warm (no
request for a chunk) and with every other entry removed, with the same outcomes.

Bounded for CI: 400 small stores on the local engines, derandomized so a run is
reproducible (about 20 s on 2 cores); on the remote path the same 400 (slow: about 40 s)
and 100 sharded ones (about 13 s); through the cache 100 (three passes each).
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

import chunkstream as cs
from chunkstream.sources._remote import RemoteOptions
from tests.faults import Server, serve

DTYPES = ["float32", "float64", "int16", "int64", "uint8", "bool", "complex64"]
V2_COMPRESSORS = [None, "blosc", "zstd", "gzip", "bz2", "lz4", "lzma", "zlib"]
V3_COMPRESSORS = [None, "blosc", "zstd", "gzip"]
DAMAGE = ["none", "none", "truncate", "garbage", "delete", "left-out"]
ENGINES = ["auto", "chunkstream", "zarr", "zarrs"]


def _v2_compressor(name: str | None):
    return {
        None: None, "blosc": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
        "zstd": numcodecs.Zstd(), "gzip": numcodecs.GZip(), "bz2": numcodecs.BZ2(),
        "lz4": numcodecs.LZ4(), "lzma": numcodecs.LZMA(), "zlib": numcodecs.Zlib(),
    }[name]  # fmt: skip


def _v3_compressor(name: str | None) -> list:
    return {None: [], "blosc": [BloscCodec(cname="zstd", shuffle="bitshuffle")],
            "zstd": [ZstdCodec()], "gzip": [GzipCodec()]}[name]  # fmt: skip


@st.composite
def _case(draw, sharded_only: bool = False) -> dict:
    ndim = draw(st.integers(2, 3))
    shape = (draw(st.integers(4, 40)), *(draw(st.integers(1, 5)) for _ in range(ndim - 1)))
    chunks = tuple(draw(st.integers(1, s + 1)) for s in shape)  # may overhang the array
    fmt = 3 if sharded_only else draw(st.sampled_from([2, 3]))
    dtype = draw(st.sampled_from(DTYPES))
    sharded = sharded_only or (fmt == 3 and draw(st.booleans()))
    case = {
        "shape": shape, "chunks": chunks, "fmt": fmt, "dtype": dtype,
        "big": draw(st.booleans()), "sharded": sharded, "seed": draw(st.integers(0, 2**16)),
        "compressor": draw(st.sampled_from(V2_COMPRESSORS if fmt == 2 else V3_COMPRESSORS)),
        "order": draw(st.sampled_from(["C", "F"])),
        "delta": fmt == 2 and dtype.startswith(("int", "uint")) and draw(st.booleans()),
        "crc32c": fmt == 3 and draw(st.booleans()),
        "transpose": fmt == 3 and not sharded and draw(st.booleans()),
        "shards": tuple(c * draw(st.integers(1, 3)) for c in chunks) if sharded else None,
        "index_at": draw(st.sampled_from(["end", "start"])),
        "index_crc": draw(st.booleans()),
        "damage": draw(st.sampled_from(DAMAGE)),
        # where a truncated shard with its index at the start ends (module docs)
        "cut": sharded and draw(st.sampled_from(["index", "chunk-start", "chunk-middle"])),
    }  # fmt: skip
    # drawn last, so the cases drawn before these two existed stay as they were
    case["index_big"] = sharded and draw(st.booleans())  # BytesCodec(endian="big") index
    chained = fmt == 3 and case["compressor"] is not None
    case["chain"] = draw(st.sampled_from([None, "zstd", "gzip"])) if chained else None
    if case["damage"] == "garbage" and case["compressor"] is None and not case["crc32c"]:
        case["damage"] = "truncate"  # raw bytes of the right size cannot be told from data
    # a truncated shard that keeps its index at the start: the index is whole, crc or not
    index_kept = case["cut"] in ("chunk-start", "chunk-middle") and case["index_at"] == "start"
    if sharded and not case["index_crc"] and case["damage"] in ("truncate", "garbage") \
            and not (case["damage"] == "truncate" and index_kept):  # fmt: skip
        case["damage"] = "delete"  # without its checksum a damaged index is found only likely
    item = draw(st.sampled_from(["all", "int", "part"]))
    size = shape[1]
    case["index"] = {"all": (), "int": (draw(st.integers(0, size - 1)),),
                     "part": (slice(draw(st.integers(0, size - 1)), size),)}[item]  # fmt: skip
    start = draw(st.integers(0, shape[0] - 1))
    case["window"] = (start, draw(st.integers(start + 1, shape[0])))
    return case


def _data(case: dict) -> np.ndarray:
    rng = np.random.default_rng(case["seed"])
    shape, dtype = case["shape"], np.dtype(case["dtype"])
    if dtype.kind == "b":
        # all True where a chunk is left out on purpose: no other chunk equals the fill value
        return np.ones(shape, bool) if case["damage"] == "left-out" else rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(1, 100, size=shape).astype(dtype)  # never the fill value 0
    values = rng.standard_normal(shape) + 3.0
    if dtype.kind == "c":
        values = values + 1j * (rng.standard_normal(shape) - 3.0)
    return values.astype(dtype)


def _write(path: Path, case: dict, data: np.ndarray) -> None:
    big = case["big"] and data.dtype.itemsize > 1
    config = {"write_empty_chunks": case["damage"] != "left-out"}
    if case["fmt"] == 2:
        dtype = data.dtype.newbyteorder(">") if big else data.dtype
        filters = [numcodecs.Delta(dtype=dtype.str)] if case["delta"] else None
        arr = zarr.create_array(
            str(path), shape=data.shape, dtype=dtype, chunks=case["chunks"], zarr_format=2,
            order=case["order"], compressors=_v2_compressor(case["compressor"]),
            filters=filters, config=config,
        )  # fmt: skip
    else:
        serializer = BytesCodec(endian="big" if big else "little")
        compressors = (_v3_compressor(case["compressor"]) + _v3_compressor(case["chain"])
                       + [Crc32cCodec()] * case["crc32c"])  # fmt: skip
        filters = [TransposeCodec(order=tuple(reversed(range(data.ndim))))]
        kwargs = {"filters": filters if case["transpose"] else None,
                  "serializer": serializer, "compressors": compressors}  # fmt: skip
        chunks = case["chunks"]
        if case["sharded"]:
            sharding = ShardingCodec(
                chunk_shape=case["chunks"], codecs=[serializer, *compressors],
                index_location=case["index_at"],
                index_codecs=[BytesCodec(endian="big" if case["index_big"] else "little")]
                + [Crc32cCodec()] * case["index_crc"],
            )  # fmt: skip
            kwargs = {"serializer": sharding, "compressors": None}
            chunks = case["shards"]
        arr = zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=chunks,
                                config=config, **kwargs)  # fmt: skip
    arr[...] = data


def _first_element(case: dict) -> tuple[int, ...]:
    """The array index of the window's first element of the field."""
    rest = tuple(i.start if isinstance(i, slice) else i for i in case["index"])
    return (case["window"][0], *rest, *[0] * (len(case["shape"]) - 1 - len(rest)))


def _damage(path: Path, case: dict) -> str:
    """Damage the file holding the window's first element; the outcome every engine owes."""
    arr = zarr.open_array(str(path), mode="r")
    grid = case["shards"] or case["chunks"]
    coords = tuple(e // g for e, g in zip(_first_element(case), grid, strict=True))
    victim = path / arr.metadata.encode_chunk_key(coords)
    damage = case["damage"]
    if damage == "none":
        return "none"
    if damage == "left-out":
        # zarr leaves out a chunk file, or a shard file whose inner chunks are all left out
        return "missing-at-read" if victim.exists() else "missing-at-open"
    raw = victim.read_bytes()
    if damage == "delete":
        victim.unlink()
        return "missing-at-open"
    if damage == "truncate":
        cut = raw[: len(raw) // 2]
        if case["sharded"] and case["index_at"] == "start":
            # the index is lost, as at the end; or it is kept, and the file ends at the start
            # or in the middle of the inner chunk the window needs, which its entry places
            # past the new end (a range request for it fails, or comes back short)
            end = _inner_chunk_end(raw, case)
            cut = raw[len(raw) // 2 :] if end is None else raw[:end]
        victim.write_bytes(cut)
    else:
        victim.write_bytes(np.random.default_rng(case["seed"]).bytes(len(raw)))
    return "corrupt"


def _inner_chunk_end(raw: bytes, case: dict) -> int | None:
    """Where the shard file ``raw`` (its index at its start) is cut for ``case["cut"]``: at
    the first byte or the middle of the inner chunk holding the window's first element;
    ``None``: not there (the index is cut off)."""
    if case["cut"] == "index":
        return None
    per_shard = [s // c for s, c in zip(case["shards"], case["chunks"], strict=True)]
    position = tuple(e // c % n for e, c, n in zip(_first_element(case), case["chunks"],
                                                   per_shard, strict=True))  # fmt: skip
    entry = int(np.ravel_multi_index(position, per_shard))
    offset, nbytes = struct.unpack_from(">QQ" if case["index_big"] else "<QQ", raw, 16 * entry)
    return offset + (nbytes // 2 if case["cut"] == "chunk-middle" else 0)


def _left_out(case: dict, data: np.ndarray) -> np.ndarray:
    """``data`` with the (inner) chunk holding the window's first element set to 0."""
    data = data.copy()
    pairs = zip(_first_element(case), case["chunks"], strict=True)
    region = tuple(slice(e // c * c, e // c * c + c) for e, c in pairs)
    data[region] = 0
    return data


def _open(path: Path, engine: str, index: tuple, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cs.ReadAmplificationWarning)
        return cs.ZarrSource(path, {"x": index}, engine=engine, read_threads=2, **kwargs)


def _read(source, start: int, stop: int) -> np.ndarray:
    spec = source.fields["x"]
    out = {"x": np.full((stop - start, *spec.shape), 1, spec.dtype)}  # not the fill value
    source.read_into(start, stop, out)
    return out["x"]


def _refusal_is_documented(engine: str, case: dict, error: cs.ConfigError) -> bool:
    message = str(error)
    if engine == "chunkstream":  # its reader takes one compressor and no transpose
        return (case["transpose"] or case["chain"] is not None) and "no transpose" in message
    if engine == "zarrs":
        return "zarrs" in message  # its defects, or a codec it cannot read (strict pipeline)
    return False


def _prepare(case: dict, path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """Write the case's store at ``path`` and damage it: ``(zarr's read of the window and
    of the whole field before the damage, the outcome every read path owes)``."""
    data = _data(case)
    if case["damage"] == "left-out":
        data = _left_out(case, data)
    _write(path, case, data)
    reference = zarr.open_array(str(path), mode="r")
    index = (slice(None), *case["index"])
    start, stop = case["window"]
    # zarr's own read, before any damage: the bytes every engine must deliver
    expected = reference[(slice(start, stop), *case["index"])]
    whole = reference[index]
    np.testing.assert_array_equal(whole, data[index])  # the store holds the data
    return expected, whole, _damage(path, case)


def _run(case: dict, tmp: Path) -> None:
    path = tmp / "x.zarr"
    expected, whole, outcome = _prepare(case, path)
    start, stop = case["window"]
    zarrs_installed = True
    try:
        import zarrs  # noqa: F401
    except ImportError:
        zarrs_installed = False
    for engine in ENGINES:
        if engine == "zarrs" and not zarrs_installed:
            continue
        try:
            source = _open(path, engine, case["index"])
        except cs.MissingChunkError as exc:
            assert outcome == "missing-at-open", (engine, outcome, exc)
            continue
        except cs.ConfigError as exc:
            assert _refusal_is_documented(engine, case, exc), (engine, exc)
            continue
        assert outcome != "missing-at-open", (engine, "opened a store with a chunk missing")
        with source:
            if outcome == "none":
                np.testing.assert_array_equal(_read(source, start, stop), expected)
                np.testing.assert_array_equal(_read(source, 0, case["shape"][0]), whole)
            elif outcome == "missing-at-read":
                with pytest.raises(cs.MissingChunkError) as info:
                    _read(source, start, stop)
                assert f"[{start}, {stop})" in str(info.value), (engine, info.value)
            else:
                with pytest.raises(cs.CorruptChunkError) as info:
                    _read(source, start, stop)
                assert str(path) in str(info.value) and f"[{start}, {stop})" in str(info.value)
    if outcome.startswith("missing"):
        # absent chunks allowed: every engine reads zarr's fill values
        fill = zarr.open_array(str(path), mode="r")[(slice(start, stop), *case["index"])]
        for engine in ["auto", "zarr"]:
            with _open(path, engine, case["index"], check_missing=False) as source:
                np.testing.assert_array_equal(_read(source, start, stop), fill)
    if outcome == "none" and not case["sharded"]:
        pytest.importorskip("tensorstore")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cs.ReadAmplificationWarning)
                ts_source = cs.TensorStoreSource(path, {"x": case["index"]})
        except ValueError as exc:  # a codec or filter tensorstore does not implement
            assert any(why in str(exc) for why in ("not supported", "not registered")), exc
            return
        try:
            np.testing.assert_array_equal(_read(ts_source, start, stop), expected)
        finally:
            ts_source.close()


@settings(
    max_examples=400, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
@given(case=_case())
def test_every_engine_reads_zarrs_bytes_or_raises_the_documented_error(case):
    with tempfile.TemporaryDirectory() as tmp:
        _run(case, Path(tmp))


# -- the remote path: the same stores over HTTP -------------------------------------------

#: Generous bounds: a loaded CI machine must not turn a slow answer into a network error.
REMOTE = RemoteOptions(timeout=10.0, retries=2, backoff=0.01, max_backoff=0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Server, Path]]:
    """One HTTP server (byte ranges as object stores serve them) over a folder that holds
    each example's store in a fresh sub-folder."""
    root = tmp_path_factory.mktemp("remote-differential")
    yield from ((server, root) for server in serve(root))


def _read_or_error(source, start: int, stop: int) -> np.ndarray | Exception:
    try:
        return _read(source, start, stop)
    except Exception as exc:  # the caller says which error, if any, the case owes
        return exc


def _run_remote(case: dict, server: Server, root: Path, cached: bool = False) -> None:
    folder = Path(tempfile.mkdtemp(dir=root))
    cache = Path(tempfile.mkdtemp()) if cached else None
    try:
        _check_remote(case, server, folder, cache)
    finally:
        shutil.rmtree(folder)
        if cache is not None:
            shutil.rmtree(cache)


def _check_remote(case: dict, server: Server, folder: Path, cache: Path | None) -> None:
    """Every window's bytes or error through zarr's pipeline over HTTP; with ``cache``,
    through the node-local cache there, cold, warm and with every other entry evicted."""
    path = folder / "x.zarr"
    expected, whole, outcome = _prepare(case, path)
    start, stop = case["window"]
    if outcome.startswith("missing"):  # what zarr reads there: absent chunks as fill values
        expected = zarr.open_array(str(path), mode="r")[(slice(start, stop), *case["index"])]
    url = f"{server.url}/{folder.name}/x.zarr"
    for phase in ("cold", "warm", "half-evicted") if cache is not None else ("uncached",):
        if phase == "half-evicted":
            for entry in sorted(p for p in (cache / "entries").rglob("*") if p.is_file())[::2]:
                entry.unlink()
        for check_missing in ("auto", True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cs.ReadAmplificationWarning)
                source = cs.ZarrSource(url, {"x": case["index"]}, check_missing=check_missing,
                                       storage_options={"chunkstream": REMOTE},
                                       cache=cache)  # fmt: skip
            with source:
                # zarr's pipeline over obstore; through the cache, an unsharded store's
                # chunks come to chunkstream's reader
                engines = ("zarr",) if cache is None or case["sharded"] else ("chunkstream", "zarr")
                assert source.engine in engines, source.engine
                _check_remote_reads(case, source, url, expected, whole, outcome, check_missing)
                if phase == "warm" and outcome == "none":
                    assert source.cache.counters.misses == 0, source.cache.counters


def _check_remote_reads(case, source, url, expected, whole, outcome, check_missing) -> None:
    start, stop = case["window"]
    got = _read_or_error(source, start, stop)
    what = (check_missing, outcome, got)
    if outcome == "none":
        assert isinstance(got, np.ndarray), what
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(_read(source, 0, case["shape"][0]), whole)
        # more windows, each a shard read whole or by range, or chunks in parts
        rng = np.random.default_rng(case["seed"])
        for _ in range(3):
            lo = int(rng.integers(0, case["shape"][0]))
            hi = int(rng.integers(lo + 1, case["shape"][0] + 1))
            np.testing.assert_array_equal(_read(source, lo, hi), whole[lo:hi])
    elif outcome.startswith("missing") and check_missing == "auto":
        # a remote store is not checked for absent chunks unless asked
        assert isinstance(got, np.ndarray), what
        np.testing.assert_array_equal(got, expected)
    else:
        owed = cs.MissingChunkError if outcome.startswith("missing") else cs.CorruptChunkError
        assert isinstance(got, owed), what  # never data
        assert not isinstance(got, cs.RemoteStoreError), what  # nor a network error
        assert url in str(got) and f"[{start}, {stop})" in str(got), what


@pytest.mark.slow
@settings(
    max_examples=400, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
@given(case=_case())
def test_the_remote_path_reads_zarrs_bytes_or_raises_the_documented_error(served, case):
    _run_remote(case, *served)


@settings(
    max_examples=100, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
@given(case=_case(sharded_only=True))
def test_the_remote_path_reads_sharded_stores_as_zarr_or_raises_the_documented_error(served, case):
    # a shard is read whole or by range, each request checked (one in five random stores
    # above is sharded: too few for the ways a shard read can go)
    _run_remote(case, *served)


@settings(
    max_examples=100, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
@given(case=_case())
def test_the_remote_path_through_the_cache_reads_zarrs_bytes_or_raises_the_documented_error(
    served, case
):
    # the node-local cache (ZarrSource(url, cache=DIR)) cold, warm and half evicted: the
    # same bytes, and every damaged or absent chunk the same error, as without it
    _run_remote(case, *served, cached=True)


# -- two layouts once refused falsely, each also among the random stores above ---------------


def _fixed_case(**changes) -> dict:
    case = {
        "shape": (30, 4), "chunks": (4, 2), "fmt": 3, "dtype": "float32", "big": False,
        "sharded": False, "seed": 1, "compressor": "zstd", "order": "C", "delta": False,
        "crc32c": False, "transpose": False, "shards": None, "index_at": "end",
        "index_crc": True, "damage": "none", "cut": False, "index_big": False, "chain": None,
        "index": (), "window": (3, 21),
    }  # fmt: skip
    return {**case, **changes}


@pytest.mark.parametrize("damage", ["none", "left-out", "garbage", "truncate"])
@pytest.mark.parametrize("index_at", ["end", "start"])
def test_a_big_endian_shard_index_is_read_and_checked_as_a_little_endian_one(damage, index_at):
    # Opened with the default check_missing (it once refused: "expected False").
    case = _fixed_case(sharded=True, shards=(8, 4), index_big=True, index_at=index_at,
                       damage=damage, cut="chunk-middle")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        _run(case, Path(tmp))


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize(("compressor", "chain"), [("gzip", "zstd"), ("zstd", "zstd"),
                                                   ("blosc", "zstd"), ("zstd", "gzip")])  # fmt: skip
@pytest.mark.parametrize("damage", ["none", "garbage"])
def test_chained_compressors_read_on_every_engine(compressor, chain, sharded, damage):
    # zarrs once held [bytes, gzip, zstd] chunks corrupt: its zstd frame, gzip's output,
    # declares more than the chunk's bytes. Tiny chunks, where that always happens.
    case = _fixed_case(compressor=compressor, chain=chain, chunks=(1, 1), damage=damage,
                       sharded=sharded, shards=(2, 2) if sharded else None)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        _run(case, Path(tmp))
