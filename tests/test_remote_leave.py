"""A remote read in flight when its loader closes is left at once, and a failed read
leaves none of its requests running (issue 47: the remote-store race's close warning
``chunkstream-read-0 did not stop within 5.0 s`` and its unclosed aiohttp session, which
a failed read's leftover requests reopened on a closed s3fs filesystem)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
import zarr.core.sync

import chunkstream as cs
from tests.faults import Server, serve, wait_for_no_threads

T, F, ZCHUNK, WINDOW = 400, 8, 50, 100  # a window is 2 zarr chunks
WIDE_T, WIDE_CHUNK = 4096, 4  # a window of 1,024 chunks: far more than zarr runs at once


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp("remote-leave")
    data = np.random.default_rng(0).standard_normal((WIDE_T, F)).astype(np.float32)
    for name, chunk in (("x.zarr", ZCHUNK), ("wide.zarr", WIDE_CHUNK)):
        array = zarr.create_array(root / name, shape=data.shape, chunks=(chunk, F), dtype="f4")
        array[:] = data
    for running in serve(root):
        yield running
        running.faults.set("", "", 0)  # ends every stalled request


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def test_closing_a_loader_leaves_a_read_stalled_on_the_server(server):
    # Window 1's first chunk stalls on the server (held 10 s, then dropped, each attempt):
    # with these bounds its read would last about a minute.
    server.faults.set("/c/2/0", "stall", times=None)
    options = {"chunkstream": cs.RemoteOptions(timeout=30, retries=4)}
    try:
        with cs.ZarrSource(f"{server.url}/x.zarr", storage_options=options) as source:
            loader = cs.ChunkLoader(
                source,
                WINDOW,
                device="cpu",
                workers=1,
                prefetch=1,
                sampling="sequential",
                options=cs.LoaderOptions(read_retries=0),
            )
            chunks = iter(loader.epoch(2))
            assert next(chunks).start == 0
            _wait_for(lambda: server.faults.hits >= 1, "window 1's stalled request")
            begin = time.monotonic()
            loader.close()  # warned (an error here) when the reader stayed in the read
            closed_in = time.monotonic() - begin
            with pytest.raises(cs.LoaderClosedError):
                next(chunks)
        assert closed_in < loader.config.close_timeout
        assert wait_for_no_threads() == []
    finally:
        server.faults.set("", "", 0)


def _read_tasks_pending() -> int:
    """Tasks of zarr's chunk reads still pending on zarr's event loop."""

    async def count() -> int:
        return sum(
            1
            for task in asyncio.all_tasks()
            if not task.done() and "concurrent_map" in task.get_coro().__qualname__
        )

    return zarr.core.sync.sync(count())


def test_a_failed_read_leaves_none_of_its_requests_running(server):
    # Every chunk request stalls and times out (no retry): the first failure ends the read
    # while most of its 1,024 chunk requests have not even started.
    server.faults.set("/c/", "stall", times=None)
    options = {"chunkstream": cs.RemoteOptions(timeout=1.0, retries=0)}
    try:
        with cs.ZarrSource(f"{server.url}/wide.zarr", storage_options=options) as source:
            out = {"data": np.empty((WIDE_T, F), np.float32)}
            with pytest.raises(cs.RemoteStoreError):
                source.read_into(0, WIDE_T, out)
            # none left to call the store after the source closes (s3fs would open a new
            # client and session for it, which nobody closes)
            assert _read_tasks_pending() == 0
    finally:
        server.faults.set("", "", 0)
