"""``cs.BatchStream(source, ...)``: a stream that builds, owns and closes its loader (issue 47)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.consumer._owned import CHUNK_BYTES, default_chunk_size
from tests.stores import make_array

T, WIDTH, GRID, WINDOW, BATCH = 6000, 3, 64, 12, 16
LOADER_THREADS = ("chunkstream-read", "chunkstream-batch", "chunkstream-transfer")


@pytest.fixture
def path(tmp_path):
    """A zarr store of time-coded data: column ``c`` at timestep ``t`` holds ``t * 10 + c``."""
    t = np.arange(T, dtype=np.float64)[:, None]
    path = tmp_path / "timecoded.zarr"
    make_array(path, (t * 10 + np.arange(WIDTH)).astype(np.float32), (GRID, WIDTH))
    return path


def _alive(prefixes: tuple[str, ...]) -> list[str]:
    deadline = time.monotonic() + 5
    while True:
        names = [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.05)


def test_a_stream_from_a_zarr_source_streams_an_epoch_of_true_windows_and_closes(path):
    with cs.ZarrSource(path) as source:
        stream = cs.BatchStream(source, window=WINDOW, batch_size=BATCH, device="cpu")
        with stream:
            assert stream.loader.device.type == "cpu" and stream.buffer.tier == "host"
            assert stream.loader.rows % GRID == 0 or stream.loader.rows == T
            seen = 0
            for batch in stream:
                x, start = batch["data"], batch["start"]
                assert x.shape == (BATCH, WINDOW, WIDTH) and start.shape == (BATCH,)
                t = start[:, None] + torch.arange(WINDOW)  # each window's true timesteps
                expected = (t[..., None] * 10 + torch.arange(WIDTH)).float()
                torch.testing.assert_close(x, expected, rtol=0, atol=0)
                seen += 1
            assert seen == len(stream) > 0
        assert stream.loader.closed
        assert _alive(LOADER_THREADS) == []
        stream.close()  # idempotent
        with pytest.raises(cs.LoaderClosedError):
            next(iter(stream))
    assert _alive(("chunkstream-",)) == []  # the source's own pool went with the source


def test_a_stream_from_a_source_takes_a_plan_and_loader_settings(path):
    with cs.ZarrSource(path) as source:
        plan = cs.plan_epoch(T, 1024, BATCH)
        with cs.BatchStream(
            source,
            window=WINDOW,
            plan=plan,
            device="cpu",
            loader_options={"seed": 7, "sampling": "shuffled"},
        ) as stream:
            assert stream.loader.rows == 1024 and stream.loader.plan.seed == 7
            assert stream.batch_size == BATCH and len(stream) == plan.batches_per_epoch
            assert len(list(stream)) == len(stream)
    assert _alive(LOADER_THREADS) == []


def test_the_loader_first_form_leaves_closing_to_the_loader(path):
    with cs.ZarrSource(path) as source, cs.ChunkLoader(source, 512, device="cpu") as loader:
        with cs.BatchStream(loader, window=WINDOW, batch_size=BATCH, batches_per_chunk=2) as s:
            next(iter(s))
        assert not loader.closed  # the stream's close() is the loader's to make
        with pytest.raises(cs.ConfigError, match="loader_options"):
            cs.BatchStream(
                loader,
                window=WINDOW,
                batch_size=BATCH,
                batches_per_chunk=2,
                loader_options={"seed": 1},
            )


def test_a_failed_stream_closes_the_loader_it_built(path):
    with cs.ZarrSource(path) as source, pytest.raises(cs.ConfigError, match="fields"):
        cs.BatchStream(source, window=WINDOW, batch_size=BATCH, device="cpu", fields="nope")
    assert _alive(LOADER_THREADS) == []


def test_the_default_chunk_size_is_whole_stored_chunks_within_the_budget():
    data = np.zeros((1 << 20, 256), dtype=np.float32)  # 1 KiB a step
    source = cs.NumpySource({"x": data})
    rows = default_chunk_size(source, window=100)
    assert rows * 1024 <= CHUNK_BYTES and rows >= 100
    assert default_chunk_size(source, window=100, host_bytes=32 << 20) == 1024  # 1/32 of it
    assert default_chunk_size(source, window=5000, host_bytes=1 << 20) == 5000  # a window
    assert default_chunk_size(cs.NumpySource({"x": data[:300]}), window=10) == 300


def test_the_tier_of_a_stream_from_a_source_counts_what_the_stream_holds(monkeypatch):
    """Before its loader exists, a stream from a source asks ``choose_tier`` as the trainer
    does: with its batch sets and decode scratch beside the loader, its ``mix`` and its
    ``host_memory``. Sizes (1 MiB chunks, 64 a pass, a device tier of 16): 40 MiB of host
    memory hold 20 chunks alone, but 15 beside the five 2 MiB batch sets the lane keeps
    on CUDA, so the device tier is the larger buffer."""
    from chunkstream._memory import NodeShare, choose_tier, node_share
    from chunkstream.consumer._owned import owned_tier

    monkeypatch.setenv("CHUNKSTREAM_HOST_MEMORY", str(40 << 20))
    share = node_share()
    assert isinstance(share, NodeShare) and share.host_bytes == 40 << 20
    source = cs.NumpySource({"data": np.zeros((64 * 1024, 256), np.float32)})  # 1 KiB a step
    cuda = torch.device("cuda", 0)
    asked = dict(chunk_size=1024, batch_size=64, window=32, pass_chunks=64, loader_nbytes=0)

    def tier(device=cuda, mix=None, options=None):
        return owned_tier(source, buffer="auto", device=device, mix=mix, fields=None,
                          options=options, share=share, device_memory=1 << 30, **asked)  # fmt: skip

    alone, _ = choose_tier("auto", cuda, chunk_nbytes=1 << 20, pass_chunks=64, loader_nbytes=0,
                           share=share, device_memory=1 << 30)  # fmt: skip
    assert alone == "host"  # what the choice was without the stream's own bytes
    assert tier() == "device"
    assert tier(options=cs.StreamOptions(batch_prefetch=0)) == "device"  # 4 sets: 16 chunks
    # float16 batches halve the sets (5 MiB): the host holds 17 chunks, more than 16
    assert tier(options=cs.StreamOptions(dtype=torch.float16)) == "host"
    assert tier(options=cs.StreamOptions(host_memory=1 << 30)) == "host"  # a budget as given
    assert tier(mix=4) == "device"  # a mix given on CUDA: the device tier, as the trainer's
    assert tier(device=torch.device("cpu")) == "host"
