"""The node-local cache of a remote store (``ZarrSource(url, cache=DIR)``), with real parts:
a zarr store on disk served by a local HTTP server (tests/faults.py, which counts every
request by path), worker processes (``tests/cache_worker.py``, started as fresh
interpreters) sharing one cache folder, and real files damaged, killed mid-write and
held open."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

import chunkstream as cs
from chunkstream.sources._remote import RemoteOptions
from tests.faults import Server, serve

T, F, ZCHUNK = 400, 64, 20  # 20 chunks of 5 KiB (uncompressed: each entry's size is known)
CHUNK_NBYTES = ZCHUNK * F * 4
ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"chunkstream": RemoteOptions(timeout=20.0, retries=2, backoff=0.01)}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Server, Path, np.ndarray]]:
    root = tmp_path_factory.mktemp("cache-store")
    data = np.random.default_rng(3).standard_normal((T, F)).astype(np.float32)
    array = zarr.create_array(root / "x.zarr", shape=data.shape, chunks=(ZCHUNK, F),
                              dtype="f4", compressors=None)  # fmt: skip
    array[:] = data
    for server in serve(root):
        yield server, root, data


@pytest.fixture
def server(served) -> Iterator[Server]:
    served[0].faults.paths.clear()
    yield served[0]
    served[0].faults.set("", "", 0)


def chunk_gets(server: Server) -> dict[str, int]:
    """Requests per chunk object of x.zarr since the test began."""
    return {p: n for p, n in server.faults.paths.items() if "/x.zarr/c/" in p}


def entries(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "entries").rglob("*") if p.is_file())


def held_bytes(folder: Path) -> int:
    """The bytes of the entries now (files come and go while workers run)."""
    total = 0
    for path in entries(folder):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def chunk_entries(folder: Path) -> list[Path]:
    """The entries that hold a chunk (its bytes and the 36-byte trailer), not metadata."""
    return [p for p in entries(folder) if p.stat().st_size == CHUNK_NBYTES + 36]


def start_worker(
    url: str, folder: Path, out: Path | str, *args: str, budget="none", who: list[str] | None = None
):
    """``tests.cache_worker`` in a process of its own; ``who``: run as ``runuser -u who[0]``
    (``who[1:]``: more runuser options), importing this checkout's ``chunkstream``."""
    command = [sys.executable, "-m", "tests.cache_worker", url, str(folder), str(budget),
               str(out), *args]  # fmt: skip
    if who is not None:
        env = ["env", f"PYTHONPATH={ROOT / 'src'}:{ROOT}"]
        command = ["runuser", "-u", *who, "--", *env, *command]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def read_here(url: str, folder: Path, **kwargs) -> tuple[np.ndarray, cs.ZarrSource]:
    with cs.ZarrSource(url, cache=folder, storage_options=OPTIONS, **kwargs) as source:
        out = {"data": np.empty((T, F), np.float32)}
        source.read_into(0, T, out)
    return out["data"], source


# -- several processes ------------------------------------------------------------------


def test_two_processes_share_one_folder_and_fetch_each_object_once(server, served, tmp_path):
    server.faults.set("/x.zarr/c/", "slow", times=None)  # fetches overlap in time
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    workers = [start_worker(url, folder, tmp_path / f"{i}.npy", *(["--reverse"] * i))
               for i in range(2)]  # fmt: skip
    counters = [finish(w) for w in workers]
    for i in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"{i}.npy"), served[2])
    gets = chunk_gets(server)
    assert len(gets) == T // ZCHUNK and set(gets.values()) == {1}, gets  # each object once
    assert sum(c["misses"] for c in counters) == T // ZCHUNK
    assert sum(c["hits"] for c in counters) == T // ZCHUNK  # the other's copy, waited for
    # a third process reads everything from the folder: no chunk request at all
    third = finish(start_worker(url, folder, tmp_path / "2.npy"))
    assert third["hits"] == T // ZCHUNK and third["misses"] == 0
    assert set(chunk_gets(server).values()) == {1}
    np.testing.assert_array_equal(np.load(tmp_path / "2.npy"), served[2])


def test_a_process_killed_mid_epoch_leaves_nothing_that_is_served(server, served, tmp_path):
    server.faults.set("/x.zarr/c/", "slow", times=None)
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    victim = start_worker(url, folder, "-")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and victim.poll() is None:
        if len(chunk_entries(folder)) >= 3 and any((folder / "partial").iterdir()):
            break  # some objects in place, another being fetched
        time.sleep(0.002)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)  # closes its pipes
    assert victim.returncode == -signal.SIGKILL
    assert 3 <= len(chunk_entries(folder)) < T // ZCHUNK  # killed during the cold epoch
    partial = list((folder / "partial").iterdir())
    assert partial, "no fetch was in flight when the process was killed"
    rerun_began = time.time()
    time.sleep(0.01)  # file times of the rerun's own files come after this
    counters = finish(start_worker(url, folder, tmp_path / "rerun.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "rerun.npy"), served[2])
    assert counters["hits"] >= 3 and counters["warnings"] == [], counters
    left = [p for p in (folder / "partial").iterdir() if p.stat().st_mtime < rerun_began]
    assert left == []  # every dead writer's file is gone
    assert len(chunk_entries(folder)) == T // ZCHUNK


def test_the_budget_is_never_exceeded(server, served, tmp_path):
    server.faults.set("/x.zarr/c/", "slow", times=None)
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    budget = 5 * CHUNK_NBYTES + 100  # five entries (each its bytes and a 36-byte trailer)
    workers = [start_worker(url, folder, tmp_path / f"{i}.npy", *(["--reverse"] * i),
                            budget=budget) for i in range(2)]  # fmt: skip
    largest = 0
    while any(w.poll() is None for w in workers):
        largest = max(largest, held_bytes(folder))
        time.sleep(0.002)
    counters = [finish(w) for w in workers]
    held = held_bytes(folder)
    assert largest <= budget and held <= budget, (largest, held, budget)
    assert held > 2 * CHUNK_NBYTES  # the cache was used, not bypassed
    assert sum(c["evicted_bytes"] for c in counters) > 0
    for i in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"{i}.npy"), served[2])


def test_eviction_skips_an_entry_another_process_is_reading(server, served, tmp_path):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    read_here(url, folder)
    oldest = sorted(chunk_entries(folder), key=lambda p: p.stat().st_mtime_ns)
    os.utime(oldest[0], ns=(1, 1))  # the least recently used of all
    fd = os.open(oldest[0], os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # what a reader holds while it reads an entry
        # another process opens the folder with a budget of two entries: it evicts at open
        counters = finish(start_worker(url, folder, "-", budget=2 * CHUNK_NBYTES + 100))
        assert oldest[0].exists()
        assert counters["evicted_bytes"] > 0
    finally:
        os.close(fd)


# -- damage, full disks, unwritable folders -----------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_a_damaged_entry_is_dropped_with_a_warning_and_fetched_again(
    server, served, tmp_path, damage
):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    read_here(url, folder)
    victim = chunk_entries(folder)[len(chunk_entries(folder)) // 2]
    raw = bytearray(victim.read_bytes())
    if damage == "flip":
        raw[len(raw) // 3] ^= 0x40
    elif damage == "truncate":
        del raw[-100:]
    else:
        raw += b"\0" * 8
    victim.write_bytes(bytes(raw))
    before = sum(chunk_gets(server).values())
    with pytest.warns(cs.CacheWarning, match=f"entry {victim}.*dropped and fetched again"):
        got, source = read_here(url, folder)
    np.testing.assert_array_equal(got, served[2])
    assert sum(chunk_gets(server).values()) == before + 1  # that one object, fetched again
    assert source.cache.counters.misses == 1 and source.cache.counters.hits == T // ZCHUNK - 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", cs.CacheWarning)
        np.testing.assert_array_equal(read_here(url, folder)[0], served[2])  # mended


def test_a_full_disk_degrades_to_reading_through_with_one_warning(server, served, tmp_path):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    # this process may write no file longer than half a chunk: a chunk's entry fails (EFBIG)
    counters = finish(start_worker(url, folder, tmp_path / "out.npy", "--fsize",
                                   str(CHUNK_NBYTES // 2)))  # fmt: skip
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), served[2])
    assert len(counters["warnings"]) == 1 and "cannot write" in counters["warnings"][0]
    assert counters["misses"] == T // ZCHUNK


def test_an_unwritable_folder_degrades_to_reading_through_with_one_warning(
    server, served, tmp_path
):
    url = f"{server.url}/x.zarr"
    # outside tmp_path, which only its owner may enter: the worker may run as nobody
    folder = Path(tempfile.mkdtemp(prefix="chunkstream-cache-test-"))
    out = folder.with_suffix(".npy")
    folder.chmod(0o555)
    args = ["--nobody"] if os.geteuid() == 0 else []  # root writes anywhere
    try:
        if args:  # the worker's own folder, trusted, yet not writable
            out.touch()
            os.chown(out, 65534, 65534)
            os.chown(folder, 65534, 65534)
        counters = finish(start_worker(url, folder, str(out), *args))
        np.testing.assert_array_equal(np.load(out), served[2])
    finally:
        out.unlink(missing_ok=True)
        folder.chmod(0o755)
        shutil.rmtree(folder)
    assert len(counters["warnings"]) == 1 and "cannot write" in counters["warnings"][0]
    assert counters["misses"] == T // ZCHUNK and entries(folder) == []


# -- metadata, hits, stats -------------------------------------------------------------


def test_a_second_read_makes_no_chunk_request(server, served, tmp_path):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    _first, source = read_here(url, folder)
    assert source.cache.counters.misses == T // ZCHUNK
    assert source.cache.counters.fetched_bytes == T * F * 4
    before = dict(server.faults.paths)
    second, source = read_here(url, folder)
    np.testing.assert_array_equal(second, served[2])
    assert source.cache.counters.hits == T // ZCHUNK and source.cache.counters.misses == 0
    asked = {p: n - before.get(p, 0) for p, n in server.faults.paths.items()}
    assert all("/c/" not in p for p, n in asked.items() if n)  # only the metadata, revalidated


def test_a_rewritten_store_is_noticed(tmp_path):
    root = tmp_path / "store"
    old = np.arange(T * 2, dtype=np.float32).reshape(T, 2)
    zarr.create_array(root / "y.zarr", shape=old.shape, chunks=(ZCHUNK, 2), dtype="f4")[:] = old
    folder = tmp_path / "cache"
    for server in serve(root):
        url = f"{server.url}/y.zarr"
        np.testing.assert_array_equal(_read_all(url, folder), old)
        new = -old
        zarr.create_array(root / "y.zarr", shape=old.shape, chunks=(ZCHUNK, 2), dtype="f4",
                          overwrite=True)[:] = new  # fmt: skip
        later = time.time() + 5  # Last-Modified counts seconds: the rewrite is later
        os.utime(root / "y.zarr" / "zarr.json", (later, later))
        np.testing.assert_array_equal(_read_all(url, folder), new)
        np.testing.assert_array_equal(_read_all(url, folder), new)  # from the cache now


def _read_all(url: str, folder: Path) -> np.ndarray:
    with cs.ZarrSource(url, cache=folder, storage_options=OPTIONS) as source:
        out = {"data": np.empty((len(source), *source.fields["data"].shape), np.float32)}
        source.read_into(0, len(source), out)
    return out["data"]


def test_the_environment_variable_gives_remote_sources_a_cache(server, tmp_path, monkeypatch):
    monkeypatch.setenv("CHUNKSTREAM_CACHE", str(tmp_path / "env-cache"))
    with cs.ZarrSource(f"{server.url}/x.zarr", storage_options=OPTIONS) as source:
        assert source.cache is not None and source.cache.root == tmp_path / "env-cache"
    local = tmp_path / "local.zarr"
    zarr.create_array(local, shape=(10, 2), chunks=(5, 2), dtype="f4")[:] = 1
    with cs.ZarrSource(local) as source:  # the variable is for remote stores only
        assert source.cache is None


def test_a_group_source_reads_through_the_cache_and_reports_it(tmp_path):
    """``ZarrGroupSource(url, cache=DIR)`` (the layout ``convert`` writes): each array's
    chunks fetched once, the second epoch all hits, the loader's summary the group's sum."""
    root = tmp_path / "store"
    group = zarr.create_group(root / "g.zarr")
    a = np.random.default_rng(4).standard_normal((T, 6)).astype(np.float32)
    b = np.random.default_rng(5).standard_normal((T, 3)).astype(np.float32)
    group.create_array("a", shape=a.shape, chunks=(ZCHUNK, 6), dtype="f4")[:] = a
    group.create_array("b", shape=b.shape, chunks=(ZCHUNK, 3), dtype="f4")[:] = b
    zarr.consolidate_metadata(root / "g.zarr")  # plain HTTP lists a group no other way
    folder = tmp_path / "cache"
    for server in serve(root):
        source = cs.ZarrGroupSource(f"{server.url}/g.zarr", cache=folder, storage_options=OPTIONS)
        assert source.cache is not None and source.cache.root == folder
        with cs.ChunkLoader(source, 100, device="cpu", sampling="sequential", workers=1) as loader:
            for epoch in range(2):
                before = dict(server.faults.paths)
                chunks = list(loader.epoch(T // 100))
                np.testing.assert_array_equal(np.concatenate([c["a"] for c in chunks]), a)
                np.testing.assert_array_equal(np.concatenate([c["b"] for c in chunks]), b)
                asked = {p: n - before.get(p, 0) for p, n in server.faults.paths.items()}
                chunk_asks = sum(n for p, n in asked.items() if "/c/" in p)
                assert chunk_asks == (2 * T // ZCHUNK if epoch == 0 else 0), asked
            summary = loader.stats.summary()
        source.close()
        assert summary["cache_misses"] == 2 * T // ZCHUNK  # both arrays' chunks, once
        assert summary["cache_hits"] == 2 * T // ZCHUNK  # the second epoch
        counters = source.cache.counters  # read as a ZarrSource's are, summed
        assert (counters.hits, counters.misses) == (2 * T // ZCHUNK, 2 * T // ZCHUNK)
        stored = sum(f.stat().st_size for f in (root / "g.zarr").glob("*/c/**/*") if f.is_file())
        assert counters.fetched_bytes == stored  # every chunk object's stored bytes, once


@pytest.mark.filterwarnings("ignore::chunkstream.ReadAmplificationWarning")  # both fields, 1 array
def test_flyvis_open_of_a_url_takes_the_cache(tmp_path):
    root = tmp_path / "store"
    data = np.random.default_rng(6).standard_normal((T, 8, 2)).astype(np.float32)
    zarr.create_array(
        root / "timeseries.zarr", shape=data.shape, chunks=(ZCHUNK, 8, 2), dtype="f4"
    )[:] = data
    for server in serve(root):
        for epoch in range(2):
            with cs.flyvis.open(
                server.url, stim_dims=3, cache=tmp_path / "cache", storage_options=OPTIONS
            ) as source:
                out = {n: np.empty((T, *f.shape), f.dtype) for n, f in source.fields.items()}
                source.read_into(0, T, out)
                counters = source.cache.counters
                if epoch == 0:
                    assert counters.misses >= T // ZCHUNK and counters.hits == 0
                else:  # every chunk object from the folder
                    assert counters.misses == 0 and counters.hits >= T // ZCHUNK
            np.testing.assert_array_equal(out["voltage"], data[:, :, 0])
            np.testing.assert_array_equal(out["stimulus"], data[:, :3, 1])


def test_the_loader_reports_cache_hits_and_misses(server, served, tmp_path):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    source = cs.ZarrSource(url, cache=folder, storage_options=OPTIONS)
    with cs.ChunkLoader(source, 100, device="cpu", sampling="sequential", workers=1) as loader:
        for epoch in range(2):
            got = np.concatenate([c["data"].numpy() for c in loader.epoch(T // 100)])
            np.testing.assert_array_equal(got, served[2])
            summary = loader.stats.summary()
            if epoch == 0:
                assert summary["cache_misses"] == T // ZCHUNK and summary["cache_hits"] == 0
                assert summary["cache_fetched_bytes"] == T * F * 4
        assert summary["cache_hits"] == T // ZCHUNK  # counted over both epochs
        table = loader.stats.format_summary()
        assert "cache: 20 hits, 20 misses (50% hits); 102 kB fetched, 0 B evicted" in table
        stats = loader.stats
    source.close()
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path / "tb")) as writer:
        stats.log_to(writer, 3)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (hits,) = events.Scalars("latency/cache_hits")
    assert hits.step == 3 and hits.value == T // ZCHUNK
    (fetched,) = events.Scalars("latency/cache_fetched_bytes")
    assert fetched.value == T * F * 4


# -- bad input -------------------------------------------------------------------------


def test_bad_cache_options_name_the_parameter_and_the_fix(server, tmp_path):
    url = f"{server.url}/x.zarr"
    for bad in (0, -5, 1.5, True):
        with pytest.raises(cs.ConfigError, match=r"cache_bytes=.*positive number of bytes"):
            cs.ZarrSource(url, cache=tmp_path, cache_bytes=bad)
    with pytest.raises(cs.ConfigError, match=r"cache_bytes=1000 .*Pass cache=DIR"):
        cs.ZarrSource(url, cache_bytes=1000)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(cs.ConfigError, match=r"cache=.* is a file\. Pass a folder"):
        cs.ZarrSource(url, cache=a_file)
    local = tmp_path / "local.zarr"
    zarr.create_array(local, shape=(10, 2), chunks=(5, 2), dtype="f4")[:] = 1
    with pytest.raises(cs.ConfigError, match=r"cache=.*None for the local path"):
        cs.ZarrSource(local, cache=tmp_path / "c")
    with pytest.raises(cs.ConfigError, match=r"cache=.*None for the memory:// URL"):
        cs.ZarrSource("memory://x", cache=tmp_path / "c")
    with pytest.raises(cs.ConfigError, match=r"cache=.*None for an opened zarr.Array"):
        cs.ZarrSource(zarr.open_array(local, mode="r"), cache=tmp_path / "c")


def test_bench_with_a_cache_reports_epoch_1_and_epoch_2(server, tmp_path, capsys):
    from chunkstream.cli import main

    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    args = ["bench", url, "--cache", str(folder), "--chunk-size", "100", "--chunks", "4",
            "--prefetch", "1", "--workers", "2", "--train-ms", "0", "--device", "cpu",
            "--no-progress"]  # fmt: skip
    assert main([*args, "--json"]) == 0
    cached = json.loads(capsys.readouterr().out)["cache"]
    assert cached["url"] == url and cached["windows"] == 4 and cached["nbytes"] == 4 * 100 * F * 4
    assert cached["misses"][0] > 0 and cached["fetched_bytes"][0] > 0  # epoch 1 fetched
    assert cached["misses"][1] == 0 and cached["fetched_bytes"][1] == 0  # epoch 2 did not
    assert cached["hits"][1] == sum(cached["hits"][:1]) + cached["misses"][0]
    assert cached["speedup"] == pytest.approx(cached["epoch_s"][0] / cached["epoch_s"][1])
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"through the cache {folder}, epoch 2:" in text and "epoch 2 / epoch 1 =" in text


def test_bench_refuses_a_cache_for_a_local_path(tmp_path, capsys):
    from chunkstream.cli import main

    local = tmp_path / "local.zarr"
    zarr.create_array(local, shape=(10, 2), chunks=(5, 2), dtype="f4")[:] = 1
    code = main(["bench", str(local), "--cache", str(tmp_path / "c"), "--device", "cpu"])
    assert code != 0
    assert "--cache" in capsys.readouterr().err


def test_a_sharded_store_is_cached_by_the_ranges_read(tmp_path):
    root = tmp_path / "store"
    data = np.random.default_rng(5).standard_normal((T, 8)).astype(np.float32)
    zarr.create_array(
        root / "s.zarr", shape=data.shape, chunks=(10, 8), shards=(50, 8), dtype="f4"
    )[:] = data
    folder = tmp_path / "cache"
    for server in serve(root):
        url = f"{server.url}/s.zarr"
        for _ in range(2):
            with cs.ZarrSource(url, cache=folder, storage_options=OPTIONS) as source:
                out = {"data": np.empty((35, 8), np.float32)}
                for start in (0, 120, 333):  # parts of shards: the index and inner chunks
                    source.read_into(start, start + 35, out)
                    np.testing.assert_array_equal(out["data"], data[start : start + 35])
            if not source.cache.counters.hits:
                cold = dict(server.faults.paths)
        assert source.cache.counters.misses == 0 and source.cache.counters.hits > 0
        assert {p: n for p, n in server.faults.paths.items() if "/c/" in p} == {
            p: n for p, n in cold.items() if "/c/" in p
        }  # the second pass asked for no shard bytes


def test_over_s3_the_metadata_is_revalidated_by_its_etag(served, tmp_path):
    pytest.importorskip("moto.server")
    from tests.faults import s3_server

    root, data = served[1], served[2]
    with s3_server(root) as (_proxy, s3):
        options = {"endpoint": s3["endpoint"], "region": s3["region"],
                   "access_key_id": s3["key"], "secret_access_key": s3["secret"], **OPTIONS}  # fmt: skip
        for _ in range(2):  # cold, then warm
            with cs.ZarrSource("s3://bucket/x.zarr", cache=tmp_path / "c",
                               storage_options=options) as source:  # fmt: skip
                out = {"data": np.empty((T, F), np.float32)}
                source.read_into(0, T, out)
                np.testing.assert_array_equal(out["data"], data)
                validators = dict(source.array.store._validators)
        assert source.cache.counters.hits == T // ZCHUNK and source.cache.counters.misses == 0
        assert validators and all(v.startswith("etag:") for v in validators.values())


def test_a_recordings_remote_caches_are_summed_in_the_loaders_stats(server, served, tmp_path):
    """A ``cs.Recordings`` of remote ZarrSources, each with its cache: the loader's
    summary (and so the demo's table) counts every recording's hits and misses."""
    url = f"{server.url}/x.zarr"
    parts = {n: cs.ZarrSource(url, cache=tmp_path / n, storage_options=OPTIONS) for n in "ab"}
    source = cs.Recordings(parts)
    with cs.ChunkLoader(source, 100, device="cpu", sampling="sequential", workers=1) as loader:
        list(loader.epoch(2 * T // 100))
        first = loader.stats.summary()
        list(loader.epoch(2 * T // 100))
        second = loader.stats.summary()
        table = loader.stats.format_summary()
    for part in parts.values():
        part.close()
    assert first["cache_misses"] == 2 * T // ZCHUNK and first["cache_hits"] == 0
    assert first["cache_fetched_bytes"] == 2 * T * F * 4
    assert second["cache_hits"] == 2 * T // ZCHUNK
    assert "cache: 40 hits, 40 misses" in table
