"""Every batch says where its windows start (issue 49): ``batch["start"]`` within the
window's own recording and, for a ``cs.Recordings``, ``batch["recording"]``.

The data are time-coded: recording ``r``'s value at its timestep ``t`` and neuron
``n`` is ``r * CODE + t * N + n`` (float32, exact at these sizes), so a window's
true start and recording are read back from its own first value.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.pipeline import TimeTable
from chunkstream.pipeline._times import window_times
from tests.stores import make_array

N = 4
CODE = 1_000_000  # recording r's values start at r * CODE (exact in float32)
LENGTHS = {"a": 600, "b": 900, "c": 400}
WINDOW, BATCH = 10, 16


def coded(T: int, recording: int = 0) -> np.ndarray:
    t, n = np.meshgrid(np.arange(T), np.arange(N), indexing="ij")
    return (recording * CODE + t * N + n).astype(np.float32)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "one.zarr"
    make_array(path, coded(2000), chunks=(50, N))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    paths = []
    for r, (name, T) in enumerate(LENGTHS.items()):
        make_array(tmp_path / f"{name}.zarr", coded(T, r), chunks=(50, N))
        paths.append(str(tmp_path / f"{name}.zarr"))
    return paths


def open_source(kind, store, runs):
    if kind == "one":
        return cs.ZarrSource(store)
    return cs.Recordings([cs.ZarrSource(p) for p in runs], names=list(LENGTHS))


def check_batch(batch, recordings: bool, align: int = 1) -> None:
    """The batch's times are the windows' true ones (read from their first values)."""
    x = batch["data"]
    first = x[:, 0, 0].to(torch.int64)
    start = batch["start"]
    assert start.dtype == torch.int64 and start.shape == (x.shape[0],)
    assert start.device == x.device
    assert torch.equal(start, (first % CODE) // N)
    assert (start % align == 0).all()
    assert ("recording" in batch) == recordings
    if recordings:
        rec = batch["recording"]
        assert rec.dtype == torch.int64 and rec.shape == start.shape and rec.device == x.device
        assert torch.equal(rec, first // CODE)
    # The whole window is contiguous in that recording.
    steps = torch.arange(WINDOW, dtype=torch.int64) * N
    assert torch.equal(x[:, :, 0].to(torch.int64) - first[:, None], steps.expand(len(x), -1))


def stream(source, *, mix, buffer="auto", pieces=1, align=1, chunks=6, seed=0, **lopts):
    opts = cs.LoaderOptions(pieces=pieces, window=WINDOW, **lopts)
    loader = cs.ChunkLoader(source, 200, device="cpu", seed=seed, options=opts)
    return loader, cs.BatchStream(
        loader,
        window=WINDOW,
        batch_size=BATCH,
        batches_per_chunk=3,
        mix=mix,
        buffer=buffer,
        options=cs.StreamOptions(chunks_per_epoch=chunks, align=align),
    )


@pytest.mark.parametrize("kind", ["one", "recordings"])
@pytest.mark.parametrize("mix", [1, 3])
@pytest.mark.parametrize("buffer", ["host", "device"])
@pytest.mark.parametrize(("pieces", "align"), [(1, 1), (4, 1), (4, 7)])
def test_every_batch_carries_its_windows_true_starts(store, runs, kind, mix, buffer, pieces, align):
    loader, batches = stream(
        open_source(kind, store, runs), mix=mix, buffer=buffer, pieces=pieces, align=align
    )
    with loader:
        assert batches.buffer.tier == buffer
        seen = set()
        for _ in range(2):  # the buffer is kept across epochs
            for batch in batches:
                check_batch(batch, kind == "recordings", align)
                if kind == "recordings":
                    seen.update(batch["recording"].tolist())
        assert kind == "one" or seen == {0, 1, 2}


def test_segments_and_a_resident_loader(store):
    segments = cs.Segments([(100, 700, "a"), (900, 1800, "b")])
    for resident in (False, True):
        loader, batches = stream(
            cs.ZarrSource(store), mix=2, pieces=2, segments=segments, resident=resident
        )
        with loader:
            for batch in batches:
                check_batch(batch, False)
                s = batch["start"]
                assert (
                    ((s >= 100) & (s <= 700 - WINDOW)) | ((s >= 900) & (s <= 1800 - WINDOW))
                ).all()


def test_chunks_say_where_their_pieces_start(runs):
    recs = open_source("recordings", None, runs)
    opts = cs.LoaderOptions(pieces=4, window=WINDOW)
    with cs.ChunkLoader(recs, 200, device="cpu", seed=2, options=opts) as loader:
        assert loader.plan is not None
        for chunk in loader.epoch(5):
            assert len(chunk.origins) == len(chunk.pieces)
            for piece, origin in zip(chunk.pieces, chunk.origins, strict=True):
                assert origin.stop - origin.start == piece.length
                row = chunk["data"][piece.offset, 0].to(torch.int64)
                assert origin.recording == int(row) // CODE
                assert origin.start == (int(row) % CODE) // N
                assert origin.recording == int(chunk["recording"][piece.offset])


@pytest.mark.parametrize("kind", ["one", "recordings"])
@pytest.mark.parametrize("mix", [1, 3])
def test_a_mid_epoch_resume_gives_the_same_times(store, runs, kind, mix):
    def times(batch):
        rec = batch["recording"].tolist() if "recording" in batch else None
        return batch["start"].tolist(), rec

    loader, batches = stream(open_source(kind, store, runs), mix=mix)
    with loader:
        full = [times(b) for b in batches]
    loader, batches = stream(open_source(kind, store, runs), mix=mix)
    with loader:
        epoch = iter(batches)
        for _ in range(7):
            next(epoch)
        state = batches.state_dict()
    loader, batches = stream(open_source(kind, store, runs), mix=mix)
    with loader:
        batches.load_state_dict(state)
        rest = []
        for batch in batches:
            check_batch(batch, kind == "recordings")
            rest.append(times(batch))
    assert rest == full[7:]


def test_an_elastic_resume_keeps_true_times(runs):
    source = open_source("recordings", None, runs)
    loader, batches = stream(source, mix=2, chunks=8, rank=0, world_size=2)
    with loader:
        epoch = iter(batches)
        for _ in range(4):
            check_batch(next(epoch), True)
        state = batches.state_dict()
    loader, batches = stream(open_source("recordings", None, runs), mix=2, chunks=8)
    with loader:
        batches.load_state_dict(state, uneven="pad")
        count = 0
        for batch in batches:
            check_batch(batch, True)
            count += 1
        assert count > 0


def test_a_field_named_like_a_reserved_key_is_refused():
    src = cs.NumpySource({"data": np.zeros((500, 2), np.float32), "start": np.zeros(500)})
    with cs.ChunkLoader(src, 100, device="cpu") as loader:
        with pytest.raises(cs.ConfigError, match="'start'"):
            cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=2)
        ok = cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=2, fields=["data"])
        assert set(next(iter(ok))) == {"data", "start"}
        alone = cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=2, fields="start")
        assert next(iter(alone)).shape == (4, 5)


def test_a_recordings_recording_field_is_the_per_window_key(runs):
    recs = open_source("recordings", None, runs)
    with cs.ChunkLoader(recs, 200, device="cpu") as loader:
        with pytest.raises(cs.ConfigError, match="batch_size,"):
            cs.BatchStream(
                loader, window=5, batch_size=4, batches_per_chunk=2, fields=["data", "recording"]
            )
        s = cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=2, mix=1)
        assert s.fields == ("data",)


def test_window_times_is_one_pure_function():
    # Two held chunks at buffer rows 0 and 100, pieces of recordings at offsets 0, 1000.
    pieces = [
        (0, [cs.Piece(0, 10, 60), cs.Piece(50, 1200, 1250)]),
        (100, [cs.Piece(0, 1500, 1600)]),
    ]
    table = TimeTable(pieces, (0, 1000), torch.device("cpu"))
    start, rec = table(torch.tensor([0, 49, 50, 99, 100, 150]))
    assert start.tolist() == [10, 59, 200, 249, 500, 550]
    assert rec.tolist() == [0, 0, 1, 1, 1, 1]
    again = window_times(torch.tensor([120]), table.row0, table.first, table.offsets)
    assert again[0].tolist() == [520] and again[1].tolist() == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("buffer", ["host", "device"])
def test_times_on_the_device(store, runs, buffer):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    recs = open_source("recordings", store, runs)
    opts = cs.LoaderOptions(pieces=4, window=WINDOW)
    on = "cpu" if buffer == "host" else "cuda"
    with cs.ChunkLoader(recs, 200, device=on, seed=1, options=opts) as loader:
        batches = cs.BatchStream(
            loader,
            window=WINDOW,
            batch_size=BATCH,
            batches_per_chunk=3,
            mix=3,
            device="cuda",
            options=cs.StreamOptions(chunks_per_epoch=6, align=5),
        )
        for batch in batches:
            assert batch["start"].is_cuda and batch["recording"].is_cuda
            check_batch({k: v.cpu() for k, v in batch.items()}, True, 5)


@pytest.mark.gpu
def test_times_to_keeps_its_pinned_copy_source_until_the_copy_ran():
    # times_to drops its page-locked staging tensor as soon as the copy is queued: the
    # caching host allocator must not hand that block out again before the copy ran
    # (the copy records an event on its stream). A delayed stream keeps the copy pending
    # while same-sized pinned blocks are allocated and overwritten.
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from chunkstream.pipeline import times_to

    n = 4096
    times = {"start": torch.arange(n), "recording": torch.arange(n) % 3}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # the copy below waits behind this on the stream
        out = times_to(times, torch.device("cuda"))
        for _ in range(16):
            torch.full((2, n), -1, dtype=torch.int64).pin_memory().fill_(-2)
    stream.synchronize()
    assert torch.equal(out["start"].cpu(), times["start"])
    assert torch.equal(out["recording"].cpu(), times["recording"])
