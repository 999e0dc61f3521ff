"""A soak test: thousands of epochs with early breaks, new loaders and injected failures.

Runs in CI (marked ``slow``; skip locally with ``-m 'not slow'``). A deadlock fails
through the faulthandler timeout in pyproject.toml rather than hanging the job.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
import zlib
from collections import deque

import numpy as np
import pytest

import chunkstream as cs
from tests.faults import Wrapped, wait_for_no_threads
from tests.stores import make_array, random_data

psutil = pytest.importorskip("psutil")

EPOCHS = 2000
WARM_UP = 200
T, N, CHUNK = 3000, 16, 100


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


@pytest.mark.slow
def test_soak_many_epochs_loaders_and_failures(tmp_path, monkeypatch):
    # thousands of retry warnings would swamp a failure report
    monkeypatch.setattr(logging.getLogger("chunkstream.pipeline"), "level", logging.ERROR)
    process = psutil.Process()
    data = make_array(
        tmp_path / "x.zarr", random_data((T, N, 2), seed=5), (50, 4, 1)
    )  # the stimulus field is whole chunks
    expected = {"v": data[:, :, 0], "s": data[:, :4, 1]}
    rng = random.Random(1234)
    fail_lock = threading.Lock()

    def transient(start: int, attempt: int) -> bool:
        with fail_lock:  # random.Random is not meant to be shared across threads
            return rng.random() < 0.02

    source = Wrapped(
        cs.ZarrSource(tmp_path / "x.zarr", {"v": (slice(None), 0), "s": (slice(0, 4), 1)}),
        transient=transient,
    )
    # zarr's own io/asyncio threads are process-wide and started by now; the source's
    # decode pool starts with the first read, so every thread after this point is ours
    baseline_threads = threading.active_count()
    counts = {"chunks": 0, "failed_epochs": 0, "loaders": 0, "breaks": 0}
    rss_after_warm_up = None
    loader = None
    held: deque = deque(maxlen=3)  # chunks the "user" keeps for a while
    begin = time.monotonic()
    try:
        for epoch in range(EPOCHS):
            if loader is None or loader.closed or rng.random() < 0.02:
                if loader is not None:
                    loader.close()
                loader = cs.ChunkLoader(source, CHUNK, device="cpu", workers=rng.randint(1, 4), prefetch=rng.randint(1, 3), sampling=rng.choice(["random", "shuffled", "sequential"]), seed=rng.randint(0, 10**6), options=cs.LoaderOptions(read_retries=rng.choice([0, 2, 2, 2]), stall_timeout=60.0))  # fmt: skip
                counts["loaders"] += 1
            n = rng.randint(1, 6)
            stop_after = rng.randint(0, n) if rng.random() < 0.3 else None
            try:
                for k, chunk in enumerate(loader.epoch(n)):
                    for name, array in expected.items():
                        got = chunk[name].numpy()
                        assert _crc(got) == _crc(array[chunk.start : chunk.stop]), (
                            epoch, name, chunk.start,
                        )  # fmt: skip
                    counts["chunks"] += 1
                    if rng.random() < 0.1:
                        held.append((chunk, _crc(chunk["v"].numpy())))
                    if stop_after is not None and k == stop_after:
                        counts["breaks"] += 1
                        break
            except cs.ChunkLoadError as error:
                # only injected transient failures (with read_retries=0) may end an epoch
                assert isinstance(error.__cause__, ConnectionError), error
                counts["failed_epochs"] += 1
            for chunk, crc in held:  # a held chunk is never overwritten by later reads
                assert _crc(chunk["v"].numpy()) == crc
            if epoch == WARM_UP:
                gc.collect()
                rss_after_warm_up = process.memory_info().rss
    finally:
        if loader is not None:
            loader.close()
        held.clear()
        source.close()
    elapsed = time.monotonic() - begin

    gc.collect()
    rss_end = process.memory_info().rss
    assert wait_for_no_threads() == []
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == baseline_threads, threading.enumerate()
    assert rss_end <= rss_after_warm_up * 1.05, (rss_after_warm_up, rss_end)
    # the run exercised what it claims to
    assert counts["loaders"] >= 20 and counts["breaks"] >= 100, counts
    assert source.injected > 0 and counts["failed_epochs"] > 0, counts
    assert counts["chunks"] >= EPOCHS, counts
    print(f"soak: {counts}, {source.injected} injected failures, {elapsed:.1f} s, "
          f"RSS {rss_after_warm_up / 2**20:.0f} -> {rss_end / 2**20:.0f} MiB")  # fmt: skip
