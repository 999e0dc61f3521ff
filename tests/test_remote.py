"""Remote zarr over real servers on 127.0.0.1: an HTTP file server and moto's S3 server,
each behind a fault hook that returns 500s, stalls or drops connections on demand."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import FsspecStore, ObjectStore

import chunkstream as cs
from chunkstream.sources import _remote
from chunkstream.sources._remote import (
    RemoteOptions,
    RemoteStoreError,
    close_store,
)
from chunkstream.tools._throughput import compare_throughput
from tests.faults import Server, s3_server, serve

T, F, ZCHUNK, WINDOW = 400, 8, 50, 100
FAST = RemoteOptions(timeout=0.5, retries=3, backoff=0.01, max_backoff=0.05)


# -- data and servers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("remote")
    data = np.random.default_rng(0).standard_normal((T, F)).astype(np.float32)
    array = zarr.create_array(root / "x.zarr", shape=data.shape, chunks=(ZCHUNK, F), dtype="f4")
    array[:] = data
    return root, data


@pytest.fixture(scope="module")
def http_server(data_dir) -> Iterator[Server]:
    yield from serve(data_dir[0])


@pytest.fixture(scope="module")
def s3_fixture(data_dir) -> Iterator[tuple[Server, dict]]:
    pytest.importorskip("moto.server")
    with s3_server(data_dir[0]) as (proxy, s3):
        # obstore's names for the S3 settings
        yield proxy, {"endpoint": s3["endpoint"], "region": s3["region"],
                      "access_key_id": s3["key"], "secret_access_key": s3["secret"]}  # fmt: skip


@pytest.fixture
def http_faults(http_server) -> Iterator[Server]:
    yield http_server
    http_server.faults.set("", "", 0)


@pytest.fixture
def s3(s3_fixture) -> Iterator[tuple[Server, dict]]:
    yield s3_fixture
    s3_fixture[0].faults.set("", "", 0)


def read_all(url: str, options: dict) -> np.ndarray:
    """Every timestep through a ChunkLoader (sequential windows, 2 readers)."""
    with (
        cs.ZarrSource(url, {"x": (slice(None),)}, storage_options=options) as source,
        cs.ChunkLoader(
            source,
            WINDOW,
            device="cpu",
            workers=2,
            sampling="sequential",
            options=cs.LoaderOptions(read_retries=0),
        ) as loader,
    ):
        assert isinstance(source.array.store, ObjectStore)  # obstore, no wrapper of ours
        return np.concatenate([c["x"].numpy() for c in loader.epoch(T // WINDOW)])


# -- HTTP --------------------------------------------------------------------------------


def test_http_reads_identical_data(http_faults, data_dir):
    got = read_all(f"{http_faults.url}/x.zarr", {"chunkstream": FAST})
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["500", "stall", "drop"])
def test_http_transient_faults_are_survived(http_faults, data_dir, kind):
    http_faults.faults.set("/c/", kind, times=2)
    got = read_all(f"{http_faults.url}/x.zarr", {"chunkstream": FAST})
    assert http_faults.faults.hits == 2  # the faults happened, and were retried
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["500", "stall", "drop"])
def test_http_persistent_fault_names_the_url_and_window(http_faults, kind):
    http_faults.faults.set("/c/3/0", kind, times=None)  # zarr chunk 3: timesteps [150, 200)
    url = f"{http_faults.url}/x.zarr"
    with pytest.raises(cs.ChunkLoadError) as info:
        read_all(url, {"chunkstream": FAST})
    message = str(info.value)
    assert f"{url}/c/3/0" in message and "[100, 200)" in message
    assert f"after {FAST.retries} retries" in message  # obstore's account of the attempts
    assert isinstance(info.value.__cause__, RemoteStoreError)
    assert "Debug source" not in message  # obstore's Rust dump stays out of the message
    assert http_faults.faults.hits == 1 + FAST.retries


def test_http_permanent_error_is_not_retried(http_faults):
    http_faults.faults.set("/c/0/0", "403", times=None)
    with pytest.raises(cs.ChunkLoadError):
        read_all(f"{http_faults.url}/x.zarr", {"chunkstream": FAST})
    assert http_faults.faults.hits == 1


def test_missing_url_is_a_source_error(http_faults):
    with pytest.raises(cs.SourceNotFoundError, match=r"nothing\.zarr"):
        cs.ZarrSource(f"{http_faults.url}/nothing.zarr", storage_options={"chunkstream": FAST})


def test_compare_throughput_against_the_local_copy(http_faults, data_dir):
    report = compare_throughput(
        f"{http_faults.url}/x.zarr",
        data_dir[0] / "x.zarr",
        fields={"x": (slice(None),)},
        chunk_size=WINDOW,
        windows=4,
        workers=2,
        storage_options={"chunkstream": FAST},
    )
    assert report.nbytes == 4 * WINDOW * F * 4
    assert report.remote_gbps > 0 and report.local_gbps > 0 and report.ratio > 0


def test_bench_on_a_url_reports_throughput_against_the_local_copy(http_faults, data_dir, capsys):
    from chunkstream.cli import main

    url, local = f"{http_faults.url}/x.zarr", str(data_dir[0] / "x.zarr")
    code = main(["bench", url, "--local", local, "--chunk-size", str(WINDOW), "--chunks", "3",
                 "--prefetch", "1", "--workers", "2", "--train-ms", "0", "--device", "cpu",
                 "--no-progress", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    remote = json.loads(out)["remote"]
    assert remote["url"] == url and remote["local"] == local and remote["windows"] == 3
    assert remote["nbytes"] == 3 * WINDOW * F * 4
    assert remote["remote_s"] > 0 and remote["local_s"] > 0
    assert remote["remote_gbps"] == pytest.approx(remote["nbytes"] / remote["remote_s"] / 1e9)
    assert remote["local_gbps"] == pytest.approx(remote["nbytes"] / remote["local_s"] / 1e9)
    assert remote["ratio"] == pytest.approx(remote["remote_gbps"] / remote["local_gbps"])


def test_closing_a_url_source_closes_its_store(http_faults, data_dir):
    source = cs.ZarrSource(f"{http_faults.url}/x.zarr", storage_options={"chunkstream": FAST})
    out = {"data": np.empty((WINDOW, F), np.float32)}
    source.read_into(0, WINDOW, out)
    np.testing.assert_array_equal(out["data"], data_dir[1][:WINDOW])
    store = source.array.store
    assert store._is_open
    source.close()
    source.close()  # idempotent
    assert not store._is_open
    with cs.ZarrSource(data_dir[0] / "x.zarr") as local:  # a local store is not the source's
        assert local._close_store is None


def test_closing_an_fsspec_store_closes_its_http_session(http_faults, data_dir):
    # fsspec still opens the schemes obstore does not; its aiohttp session is closed with it
    store = FsspecStore.from_url(f"{http_faults.url}/x.zarr", read_only=True,
                                 storage_options={"skip_instance_cache": True})  # fmt: skip
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[:], data_dir[1])
    session = store.fs._session  # opened by the read
    assert session is not None and not session.closed
    close_store(store)
    close_store(store)  # idempotent
    assert session.closed


@pytest.mark.parametrize("bad", [{"array": "x"}, {"fields": {"x": (9,)}}])
def test_a_failed_open_closes_the_store(http_faults, monkeypatch, bad):
    opened = []
    open_store = _remote.open_remote_store
    monkeypatch.setattr("chunkstream.sources._open.open_remote_store",
                        lambda *a, **k: opened.append(open_store(*a, **k)) or opened[-1])  # fmt: skip
    with pytest.raises(cs.SourceError if "fields" in bad else cs.ConfigError):
        cs.ZarrSource(f"{http_faults.url}/x.zarr", storage_options={"chunkstream": FAST}, **bad)
    assert len(opened) == 1 and not opened[0]._is_open


def test_fsspec_style_storage_options_get_an_error_naming_obstore_settings(http_faults):
    with pytest.raises(cs.ConfigError, match=r"storage_options.*obstore.*access_key_id"):
        cs.ZarrSource("s3://bucket/x.zarr", storage_options={"key": "k", "secret": "s"})


def test_a_source_is_a_context_manager_that_closes_its_store(http_faults, data_dir):
    with cs.ZarrSource(f"{http_faults.url}/x.zarr", storage_options={"chunkstream": FAST}) as src:
        store = src.array.store
        assert store._is_open
    assert not store._is_open


def test_a_collected_source_closes_its_store(http_faults):
    import gc

    source = cs.ZarrSource(f"{http_faults.url}/x.zarr", storage_options={"chunkstream": FAST})
    store = source.array.store
    del source
    gc.collect()
    assert not store._is_open


def test_a_group_over_http_needs_consolidated_metadata(tmp_path):
    group = zarr.open_group(tmp_path / "g.zarr", mode="w", zarr_format=2)
    for name, width in (("v", 8), ("s", 3)):
        group.create_array(name, shape=(T, width), chunks=(ZCHUNK, width), dtype="f4")[:] = width
    options = {"chunkstream": FAST}
    for server in serve(tmp_path):
        url = f"{server.url}/g.zarr"
        with pytest.raises(RemoteStoreError, match="consolidate_metadata"):
            cs.ZarrGroupSource(url, storage_options=options)  # HTTP has no listing
        zarr.consolidate_metadata(tmp_path / "g.zarr", zarr_format=2)
        with cs.ZarrGroupSource(url, storage_options=options) as source:
            out = {"v": np.empty((WINDOW, 8), np.float32), "s": np.empty((WINDOW, 3), np.float32)}
            source.read_into(0, WINDOW, out)
        assert (out["v"] == 8).all() and (out["s"] == 3).all()


# -- damaged shards: the local reader's integrity rule, over HTTP --------------------------

#: damage -> (inner codec, index crc32c, what the error says). Each store is 200 x 5 float32
#: in 4 shards of 50 timesteps (2 inner chunks of 25), with the index at either end; shard
#: 'c/1/0' is damaged and inner chunk (1, 0) (timesteps [75, 100)) is the one damaged where
#: the damage is one chunk's. Truncating a shard whose index is at its start leaves the
#: index whole, pointing past the new end.
SHARD_DAMAGES = {
    "truncated": ("zstd", True, r"crc32c checksum fails|entry for inner chunk \(\d, 0\)"),
    "truncated-without-checksum": ("zstd", False, r"index entry for inner chunk \(\d, 0\)"),
    "index-garbage": ("zstd", True, "crc32c checksum fails"),
    "inner-chunk-blosc": ("blosc-zstd", True, "blosc frame"),
    "inner-chunk-zstd": ("zstd", True, "does not decode"),
    "empty": ("zstd", True, "holds 0 bytes, fewer than its 36-byte index"),
    "entry-past-end": ("zstd", True, r"inner chunk \(1, 0\) at bytes \[\d+, \d+\), outside its"),
}
#: the damaged shard read whole (one GET), its damaged inner chunk alone (the index and one
#: chunk by range), and parts of three shards
DAMAGED_WINDOWS = [(50, 100), (75, 100), (40, 110)]


def _damage_shard(shard: Path, how: str, checksum: bool, location: str) -> None:
    import struct

    from chunkstream.sources._shards import crc32c

    raw = bytearray(shard.read_bytes())
    size = 36 if checksum else 32
    at = 0 if location == "start" else len(raw) - size  # the index
    offset, nbytes = struct.unpack_from("<QQ", raw, at + 16)  # inner chunk (1, 0)
    if how.startswith("truncated"):
        raw = raw[: len(raw) // 2]
    elif how == "index-garbage":
        raw[at : at + size] = np.random.default_rng(1).bytes(size)
    elif how.startswith("inner-chunk"):
        raw[offset : offset + nbytes] = np.random.default_rng(2).bytes(nbytes)
    elif how == "empty":
        raw = bytearray()
    else:  # entry-past-end: a well-formed index (its crc32c recomputed) past the file's end
        struct.pack_into("<QQ", raw, at + 16, offset, len(raw))
        raw[at + 32 : at + 36] = crc32c(bytes(raw[at : at + 32])).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def shard_stores(tmp_path_factory) -> Path:
    """A folder of stores: one per damage in SHARD_DAMAGES, and an intact one."""
    from tests.stores import make_sharded

    root = tmp_path_factory.mktemp("shards")
    data = np.random.default_rng(0).standard_normal((200, 5)).astype(np.float32)
    make_sharded(root / "intact.zarr", data, (25, 5), (50, 5), "zstd")
    for how, (codec, checksum, _) in SHARD_DAMAGES.items():
        for location in ("end", "start"):
            path = root / f"{how}-{location}.zarr"
            make_sharded(path, data, (25, 5), (50, 5), codec, checksum=checksum,
                         index_location=location)  # fmt: skip
            _damage_shard(path / "c" / "1" / "0", how, checksum, location)
    return root


@pytest.fixture(scope="module")
def damaged_shards(shard_stores) -> Iterator[tuple[Server, Path]]:
    """:func:`shard_stores` served over HTTP."""
    for server in serve(shard_stores):
        yield server, shard_stores


def _read_window(source: cs.ZarrSource, start: int, stop: int) -> np.ndarray:
    out = {"data": np.full((stop - start, 5), np.nan, np.float32)}  # stale bytes would show
    source.read_into(start, stop, out)
    return out["data"]


@pytest.mark.parametrize("check_missing", ["auto", True])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("how", sorted(SHARD_DAMAGES))
def test_a_damaged_remote_shard_is_corrupt_naming_the_shard_and_window(
    damaged_shards, how, location, check_missing
):
    server, root = damaged_shards
    store = f"{how}-{location}.zarr"
    url = f"{server.url}/{store}"
    options = {"chunkstream": FAST}
    with cs.ZarrSource(url, check_missing=check_missing, storage_options=options) as source:
        assert source.engine == "zarr"  # zarr's pipeline does the requests
        for start, stop in DAMAGED_WINDOWS:
            with pytest.raises(cs.CorruptChunkError, match=SHARD_DAMAGES[how][2]) as info:
                _read_window(source, start, stop)
            message = str(info.value)
            assert "'c/1/0'" in message and f"timesteps [{start}, {stop})" in message, message
            assert url in message
            assert not isinstance(info.value, ConnectionError)  # never a "network" error
        # the shards around it read exactly what zarr-python reads from the local store
        reference = zarr.open_array(root / store, mode="r")
        for start, stop in [(0, 50), (100, 200), (110, 135)]:
            np.testing.assert_array_equal(_read_window(source, start, stop),
                                          reference[start:stop])  # fmt: skip
    # the local reader finds the same damage in the same windows
    with cs.ZarrSource(root / store) as local:
        for start, stop in DAMAGED_WINDOWS:
            with pytest.raises(cs.CorruptChunkError, match=r"c/1/0"):
                _read_window(local, start, stop)


def test_a_damaged_shard_over_s3_is_corrupt_naming_the_shard_and_window(shard_stores):
    # S3 answers a range past the end (HTTP 416) and a HEAD as an object store does
    pytest.importorskip("moto.server")
    with s3_server(shard_stores) as (_proxy, s3):
        options = {"endpoint": s3["endpoint"], "region": s3["region"], "chunkstream": FAST,
                   "access_key_id": s3["key"], "secret_access_key": s3["secret"]}  # fmt: skip
        for how, (_, _, what) in sorted(SHARD_DAMAGES.items()):
            url = f"s3://bucket/{how}-end.zarr"
            with cs.ZarrSource(url, storage_options=options) as source:
                for start, stop in DAMAGED_WINDOWS:
                    with pytest.raises(cs.CorruptChunkError, match=what) as info:
                        _read_window(source, start, stop)
                    message = str(info.value)
                    assert "'c/1/0'" in message and f"timesteps [{start}, {stop})" in message
                reference = zarr.open_array(shard_stores / f"{how}-end.zarr", mode="r")
                np.testing.assert_array_equal(_read_window(source, 100, 200), reference[100:200])


def test_an_intact_remote_shard_costs_no_extra_request(damaged_shards):
    # the checks ask for a shard's size only after a range request fails or comes back
    # short: a whole shard is one GET, an inner chunk its index and its bytes
    server, root = damaged_shards
    reference = zarr.open_array(root / "intact.zarr", mode="r")
    with cs.ZarrSource(f"{server.url}/intact.zarr", storage_options={"chunkstream": FAST}) as src:
        for (start, stop), requests in [((100, 150), 1), ((125, 150), 2), ((0, 200), 4)]:
            before = server.faults.requests
            np.testing.assert_array_equal(_read_window(src, start, stop), reference[start:stop])
            assert server.faults.requests - before == requests, (start, stop)


@pytest.mark.parametrize("head", ["fails", "answers"])
def test_a_network_error_on_a_shard_stays_a_network_error(damaged_shards, head):
    # a failed range request is held against the shard's size: a size that cannot be had
    # (head="fails": the 500s go on) or that shows the shard whole is the network's fault
    server, _root = damaged_shards
    url = f"{server.url}/intact.zarr"
    server.faults.set("/intact.zarr/c/2/0", "500", None if head == "fails" else 1 + FAST.retries)
    try:
        with (
            cs.ZarrSource(url, storage_options={"chunkstream": FAST}) as source,
            pytest.raises(RemoteStoreError) as info,
        ):
            _read_window(source, 125, 135)  # the index of shard 'c/2/0' by range
    finally:
        server.faults.set("", "", 0)
    assert f"{url}/c/2/0" in str(info.value) and "[125, 135)" in str(info.value)
    assert not isinstance(info.value, cs.CorruptChunkError)


def test_a_short_answer_for_an_intact_shard_is_a_network_error(damaged_shards):
    # a range served short of what was asked (not at the file's end), though the file holds
    # it, is the transfer's fault: obstore refuses it, and the shard's size, asked for after,
    # shows the shard whole
    server, root = damaged_shards
    url = f"{server.url}/intact.zarr"
    reference = zarr.open_array(root / "intact.zarr", mode="r")
    with cs.ZarrSource(url, storage_options={"chunkstream": FAST}) as source:
        server.faults.set("/intact.zarr/c/2/0", "short", 1)  # the shard index's request
        try:
            with pytest.raises(RemoteStoreError) as info:
                _read_window(source, 125, 135)
            assert server.faults.hits == 1
        finally:
            server.faults.set("", "", 0)
        assert url in str(info.value) and "[125, 135)" in str(info.value)
        assert not isinstance(info.value, cs.CorruptChunkError)
        np.testing.assert_array_equal(_read_window(source, 125, 135), reference[125:135])


# -- S3 (moto server) -------------------------------------------------------------------


def test_s3_reads_identical_data(s3, data_dir):
    _proxy, options = s3
    got = read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["500", "drop"])
def test_s3_transient_faults_are_survived(s3, data_dir, kind):
    proxy, options = s3
    proxy.faults.set("/c/", kind, times=2)
    got = read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    assert proxy.faults.hits == 2
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["stall", "drop"])
def test_s3_persistent_stall_or_drop_names_the_url_and_window(s3, kind):
    proxy, options = s3
    proxy.faults.set("/c/2/0", kind, times=None)  # timesteps [100, 150)
    with pytest.raises(cs.ChunkLoadError) as info:
        read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    assert "bucket/x.zarr/c/2/0" in str(info.value) and "[100, 200)" in str(info.value)
    assert isinstance(info.value.__cause__, RemoteStoreError)
    assert proxy.faults.hits == 1 + FAST.retries


def test_s3_persistent_fault_names_the_url_and_window(s3):
    proxy, options = s3
    proxy.faults.set("/c/2/0", "500", times=None)  # timesteps [100, 150)
    with pytest.raises(cs.ChunkLoadError) as info:
        read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    assert "bucket/x.zarr/c/2/0" in str(info.value) and "[100, 200)" in str(info.value)
    assert isinstance(info.value.__cause__, RemoteStoreError)


# -- the benchmark's fsspec baseline ---------------------------------------------------


def test_baseline_transient_classification():
    # what benchmarks/_fsspec_baseline.py (the store obstore was raced against) retries
    from benchmarks._fsspec_baseline import is_transient

    assert is_transient(TimeoutError()) and is_transient(ConnectionResetError())
    assert not is_transient(FileNotFoundError()) and not is_transient(PermissionError())
    assert not is_transient(ValueError()) and not is_transient(cs.ConfigError("x"))
    aiohttp = pytest.importorskip("aiohttp")
    assert is_transient(aiohttp.ServerDisconnectedError())
    info = aiohttp.RequestInfo(url="http://x", method="GET", headers={}, real_url="http://x")  # type: ignore[arg-type]
    for status, transient in ((500, True), (503, True), (429, True), (404, False), (403, False)):
        error = aiohttp.ClientResponseError(info, (), status=status)
        assert is_transient(error) is transient


def test_remote_options_are_validated():
    with pytest.raises(cs.ConfigError, match="timeout"):
        RemoteOptions(timeout=0)
    with pytest.raises(cs.ConfigError, match="retries"):
        RemoteOptions(retries=-1)


# -- closing without being asked (issue 12) ---------------------------------------------

#: Streams a URL through a ChunkLoader ("loader") or reads it on the main thread ("read",
#: which is what left fsspec's session unclosed before), then exits closing nothing.
STREAM_AND_EXIT = """
import sys, numpy as np, chunkstream as cs
options = {"chunkstream": cs.RemoteOptions(timeout=5, retries=1)}
options.update(dict(arg.split("=", 1) for arg in sys.argv[3:]))
src = cs.ZarrSource(sys.argv[1], storage_options=options)
if sys.argv[2] == "loader":
    loader = cs.ChunkLoader(src, 100, device="cpu", workers=2, sampling="sequential")
    for chunk in loader.epoch(4):
        pass
else:
    src.read_into(0, 100, {"data": np.empty((100, 8), np.float32)})
"""

#: A read through zarr's fsspec store (what opens the schemes obstore does not), tied to
#: the source as ZarrSource ties a store it opens; ``own=0`` leaves it untied.
FSSPEC_STREAM_AND_EXIT = """
import sys, numpy as np, zarr, chunkstream as cs
from zarr.storage import FsspecStore
from chunkstream.sources._remote import own_store
store = FsspecStore.from_url(sys.argv[1], read_only=True,
                             storage_options={"skip_instance_cache": True})
src = cs.ZarrSource(zarr.open_array(store, mode="r"))
if sys.argv[2] == "own=1":
    own_store(src, store)
out = {"data": np.empty((100, 8), np.float32)}
src.read_into(0, 100, out)  # a read on the main thread is what leaves the session behind
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("how", ["loader", "read"])
def test_streaming_over_http_and_exiting_without_closing_prints_nothing(http_faults, how):
    done = _run(STREAM_AND_EXIT, f"{http_faults.url}/x.zarr", how)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("how", ["loader", "read"])
def test_streaming_over_s3_and_exiting_without_closing_prints_nothing(s3, how):
    _proxy, options = s3  # the subprocess inherits the moto environment the fixture set
    settings = (f"{k}={v}" for k, v in options.items())
    done = _run(STREAM_AND_EXIT, "s3://bucket/x.zarr", how, *settings)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_an_fsspec_store_tied_to_its_source_is_closed_at_exit(http_faults):
    url = f"{http_faults.url}/x.zarr"
    untied = _run(FSSPEC_STREAM_AND_EXIT, url, "own=0")
    assert untied.returncode == 0 and "Unclosed client session" in untied.stderr  # the bug
    tied = _run(FSSPEC_STREAM_AND_EXIT, url, "own=1")
    assert tied.returncode == 0, tied.stderr
    assert tied.stderr == ""


def test_a_loader_closes_its_source_only_when_it_owns_it(http_faults, data_dir):
    url = f"{http_faults.url}/x.zarr"
    options = {"chunkstream": FAST}
    with cs.ZarrSource(url, storage_options=options) as shared:
        for _ in range(2):  # a shared source outlives the loaders
            with cs.ChunkLoader(shared, WINDOW, device="cpu", sampling="sequential") as loader:
                next(iter(loader.epoch(1)))
        assert shared.array.store._is_open
    owned = cs.ZarrSource(url, storage_options=options)
    with cs.ChunkLoader(
        owned, WINDOW, device="cpu", options=cs.LoaderOptions(close_source=True)
    ) as loader:
        next(iter(loader.epoch(1)))
    assert not owned.array.store._is_open


# -- refusals, permission errors, closing at exit ------------------------------------------


@pytest.mark.parametrize("status", ["401", "403"])
def test_a_refused_request_is_a_permission_error(http_faults, status):
    http_faults.faults.set("/c/1/0", status, times=None)
    url = f"{http_faults.url}/x.zarr"
    with pytest.raises(cs.ChunkLoadError) as info:
        read_all(url, {"chunkstream": FAST})
    cause = info.value.__cause__
    assert isinstance(cause, cs.RemotePermissionError)
    assert isinstance(cause, PermissionError) and isinstance(cause, cs.RemoteStoreError)
    assert f"{url}/c/1/0" in str(cause) and "credentials" in str(cause)
    assert http_faults.faults.hits == 1  # refused for good: not retried


def test_the_zarrs_engine_refuses_a_url(http_faults):
    # zarrs does a URL's I/O in Rust: a server's 500 would read as a corrupt chunk
    pytest.importorskip("zarrs")
    url = f"{http_faults.url}/x.zarr"
    with pytest.raises(cs.ConfigError, match=r"engine='zarrs'") as info:
        cs.ZarrSource(url, storage_options={"chunkstream": FAST}, engine="zarrs")
    assert url in str(info.value) and 'engine="auto"' in str(info.value)
    assert http_faults.faults.requests >= 1  # opened, refused, closed: no read happened


def test_the_zarrs_engine_over_a_store_it_cannot_rebuild_names_the_engine():
    pytest.importorskip("zarrs")
    from obstore.store import MemoryStore

    arr = zarr.create_array(ObjectStore(MemoryStore()), shape=(10, 4), chunks=(5, 4), dtype="f4")
    with pytest.raises(cs.ConfigError, match=r"engine='zarrs'.*\"auto\""):
        cs.ZarrSource(arr, engine="zarrs")


def test_closing_a_filesystem_on_zarrs_loop_thread_only_logs(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        args[0].close()  # the coroutine never runs
        raise zarr.core.sync.SyncError("Calling sync() from within a running loop")

    monkeypatch.setattr(zarr.core.sync, "sync", refuse)
    with caplog.at_level("DEBUG", logger="chunkstream.sources.remote"):
        _remote._close_filesystem(object())
    assert "closing the session" in caplog.text


def test_the_exit_hook_closes_every_store_when_one_fails(caplog):
    class Store:
        def __init__(self, fails: bool) -> None:
            self.fails, self.closed = fails, False

        def close(self) -> None:
            self.closed = True
            if self.fails:
                raise RuntimeError("boom")

    class Owner:
        pass

    owners = [Owner() for _ in range(3)]
    stores = [Store(fails=i == 0) for i in range(3)]
    for owner, store in zip(owners, stores, strict=True):
        _remote.own_store(owner, store)
    with caplog.at_level("WARNING", logger="chunkstream.sources.remote"):
        _remote._close_owned_at_exit()
    assert all(store.closed for store in stores)
    assert "closing a store at exit failed" in caplog.text
    assert not any(id(store) in _remote._owned for store in stores)


# -- flyvis.read_metadata over a URL ----------------------------------------------------


@pytest.fixture(scope="module")
def flyvis_server(tmp_path_factory) -> Iterator[tuple[Server, np.ndarray]]:
    from tests.stores import make_flyvis

    root = tmp_path_factory.mktemp("flyvis-remote")
    make_flyvis(root / "run", 40, 8, chunks=(16, 4, 1))
    meta = cs.flyvis.read_metadata(root / "run")
    for server in serve(root):
        yield server, meta


def test_read_metadata_over_http_uses_the_remote_store_and_closes_it(flyvis_server, monkeypatch):
    server, meta = flyvis_server
    opened = []
    open_store = _remote.open_remote_store
    monkeypatch.setattr("chunkstream.sources._open.open_remote_store",
                        lambda *a, **k: opened.append(open_store(*a, **k)) or opened[-1])  # fmt: skip
    got = cs.flyvis.read_metadata(f"{server.url}/run", storage_options={"chunkstream": FAST})
    np.testing.assert_array_equal(got, meta)
    assert len(opened) == 1 and isinstance(opened[0], ObjectStore) and not opened[0]._is_open


def test_read_metadata_over_http_maps_a_persistent_fault(flyvis_server):
    server, _ = flyvis_server
    server.faults.set("/run/metadata.zarr/c/", "500", times=None)
    try:
        with pytest.raises(RemoteStoreError, match=r"metadata\.zarr"):
            cs.flyvis.read_metadata(f"{server.url}/run", storage_options={"chunkstream": FAST})
        assert server.faults.hits == 1 + FAST.retries  # obstore's retries, then our error
    finally:
        server.faults.set("", "", 0)


def test_a_new_fault_rule_ends_the_requests_the_last_one_stalled(tmp_path):
    """A stalled request holds a server thread (10 s at most) until the next rule is set,
    so a benchmark part never finds the server still busy with the last part's stalls."""
    import http.client
    import threading
    import time

    def conn_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "test-http-conn" and t.is_alive()}

    (tmp_path / "a").write_bytes(b"x")
    for server in serve(tmp_path):
        before = conn_threads()  # other servers' connections, left out of the count
        server.faults.set("/a", "stall", times=None)
        port = int(server.url.rsplit(":", 1)[1])
        for _ in range(3):
            client = http.client.HTTPConnection("127.0.0.1", port, timeout=0.2)
            with pytest.raises(TimeoutError):
                client.request("GET", "/a")
                client.getresponse()
            client.close()
        assert server.faults.hits == 3 and len(conn_threads() - before) == 3  # still stalled
        began = time.monotonic()
        server.faults.set("", "", 0)
        while conn_threads() - before and time.monotonic() - began < 5:
            time.sleep(0.01)
        assert not conn_threads() - before, "the stalled requests still hold their threads"
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        client.request("GET", "/a")
        assert client.getresponse().read() == b"x"  # served again at once
        client.close()


# -- absent chunks over HTTP -------------------------------------------------------------


@pytest.mark.parametrize("sharded", [False, True])
def test_an_absent_remote_chunk_is_a_fill_value_unless_checked_then_names_url_key_window(
    tmp_path, sharded
):
    from tests.stores import make_sharded

    data = np.random.default_rng(3).standard_normal((200, 5)).astype(np.float32)
    if sharded:
        make_sharded(tmp_path / "x.zarr", data, (25, 5), (50, 5), "zstd")
    else:
        zarr.create_array(tmp_path / "x.zarr", shape=data.shape, chunks=(50, 5), dtype="f4")[:] = (
            data
        )
    (tmp_path / "x.zarr" / "c" / "1" / "0").unlink()  # timesteps [50, 100)
    expected = zarr.open_array(tmp_path / "x.zarr", mode="r")[40:110]
    assert (expected[10:60] == 0).all()  # zarr's fill value
    for server in serve(tmp_path):
        url = f"{server.url}/x.zarr"
        options = {"chunkstream": FAST}
        with cs.ZarrSource(url, storage_options=options) as source:  # the remote default
            np.testing.assert_array_equal(_read_window(source, 40, 110), expected)
        with cs.ZarrSource(url, check_missing=True, storage_options=options) as source:
            with pytest.raises(cs.MissingChunkError) as info:
                _read_window(source, 40, 110)
            message = str(info.value)
            assert url in message and "'c/1/0'" in message and "timesteps [40, 110)" in message
            np.testing.assert_array_equal(_read_window(source, 100, 200), data[100:200])
