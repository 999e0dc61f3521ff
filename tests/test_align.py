"""Aligned windows inside a chunk: ``align=k`` draws only starts at absolute timesteps k * j.

The stores hold the timestep in column 0, so every delivered window says where it starts.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkstream as cs
from chunkstream.consumer._mixing import ChunkMixer
from chunkstream.consumer._sampling import WindowSampler, piece_starts
from tests.flat import loader_from, stream_from
from tests.stores import make_array, random_data

T = 1200
GRID = 16
SEGMENTS = cs.Segments([(5, 301, "a"), (340, 777, "b"), (800, 1190, "c")])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    data = random_data((T, 3), seed=11)
    data[:, 0] = np.arange(T)  # exact in float32: column 0 names the timestep
    path = tmp_path_factory.mktemp("align") / "x.zarr"
    make_array(path, data, (GRID, 3))
    source = cs.ZarrSource(path)
    yield source, data
    source.close()


def _aligned_rows(pieces, window, align):
    """Every row a window may start at, by brute force over the rows of the chunk."""
    rows = set()
    for p in pieces:
        for r in range(p.offset, p.offset + p.length - window + 1):
            if (p.start + r - p.offset) % align == 0:
                rows.add(r)
    return rows


def _piece_of(chunk, row):
    return next(p for p in chunk.pieces if p.offset <= row < p.offset + p.length)


@st.composite
def pieced(draw):
    count = draw(st.integers(1, 6))
    pieces, offset = [], 0
    for _ in range(count):
        start = draw(st.integers(0, 10_000))
        length = draw(st.integers(1, 60))
        pieces.append(cs.Piece(offset, start, start + length))
        offset += length
    return tuple(pieces)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=pieced(), window=st.integers(1, 20), align=st.integers(1, 25),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_aligned_starts_are_exactly_the_valid_ones_and_a_pass_reaches_each_once(
    pieces, window, align, seed
):
    expected = _aligned_rows(pieces, window, align)
    length = pieces[-1].offset + pieces[-1].length
    if not expected:
        fits = any(p.length >= window for p in pieces)
        with pytest.raises(cs.ConfigError, match=f"align={align}" if fits else f"window={window}"):
            piece_starts(pieces, window, align=align)
        return
    assert piece_starts(pieces, window, align=align).tolist() == sorted(expected)
    gen = torch.Generator().manual_seed(seed)
    sampler = WindowSampler(length, window, 7, gen, pieces=pieces, align=align)
    drawn = torch.cat(list(sampler)).tolist()
    assert sorted(drawn) == sorted(expected)  # without replacement: each start once per pass
    chunk = cs.Chunk({"x": torch.zeros(length, 1)}, start=pieces[0].start,
                     stop=pieces[0].stop, epoch=0, index=0, pieces=pieces)  # fmt: skip
    assert set(cs.sample_windows(chunk, 64, window, gen, align=align).tolist()) <= expected


def test_align_one_draws_exactly_what_was_drawn_before_align_existed():
    pieces = (cs.Piece(0, 100, 110), cs.Piece(10, 500, 503), cs.Piece(13, 7, 27))
    chunk = cs.Chunk({"x": torch.zeros(33, 2)}, start=100, stop=110, epoch=0, index=0,
                     pieces=pieces)  # fmt: skip

    def gen():
        return torch.Generator().manual_seed(3)

    assert cs.sample_windows(chunk, 8, 6, gen(), align=1).tolist() == [
        14, 16, 25, 15, 0, 0, 0, 13]  # fmt: skip
    assert cs.sample_windows(100, 8, 6, gen()).tolist() == [51, 68, 92, 12, 40, 15, 80, 65]
    assert cs.sample_windows(100, 8, 6, gen(), replacement=False).tolist() == [
        51, 49, 18, 82, 4, 35, 74, 76]  # fmt: skip
    assert [b.tolist() for b in WindowSampler(33, 6, 7, gen(), pieces=pieces)] == [
        [14, 20, 3, 15, 1, 13, 16], [17, 2, 25, 22, 19, 21, 27], [18, 4, 23, 0, 26, 24]]  # fmt: skip
    assert [b.tolist() for b in WindowSampler(20, 6, 7, gen(), replacement=True)] == [
        [1, 8, 7, 12, 10, 0, 0], [5, 1, 4, 4, 6, 5, 14], [6, 4, 0, 9, 5, 14, 6]]  # fmt: skip
    src = cs.NumpySource({"t": np.arange(400, dtype=np.int64)})
    expected = {
        1: [[288, 275, 313, 304, 278, 310], [306, 296, 309, 304, 299, 315],
            [144, 184, 171, 199, 159, 147], [197, 142, 176, 191, 195, 185]],
        4: [[278, 277, 7, 282, 8, 68], [272, 274, 131, 74, 133, 73],
            [258, 246, 101, 249, 261, 261], [183, 240, 250, 241, 101, 247]],
    }  # fmt: skip
    for k, starts in expected.items():
        with cs.ChunkLoader(
            src, 64, device="cpu", sampling="shuffled", seed=7, options=cs.LoaderOptions(pieces=k)
        ) as ld:
            stream = cs.BatchStream(ld, window=5, batch_size=6, batches_per_chunk=2, fields="t", mix=1, options=cs.StreamOptions(chunks_per_epoch=2, align=1))  # fmt: skip
            assert [b[:, 0].tolist() for b in stream] == starts


@pytest.mark.parametrize("align", [3, 8, 20])
def test_pieced_chunks_in_segments_give_only_aligned_starts_inside_one_piece(store, align):
    source, data = store
    window = 6
    kw = dict(device="cpu", pieces=4, sampling="random", segments=SEGMENTS, seed=2,
              window=window)  # fmt: skip
    gen = torch.Generator().manual_seed(align)
    seen = 0
    with loader_from(source, 128, **kw) as loader:
        for chunk in loader.epoch(12):
            x = chunk["data"]
            starts = cs.sample_windows(chunk, 40, window, gen, align=align)
            for row in starts.tolist():
                piece = _piece_of(chunk, row)
                t = piece.start + row - piece.offset
                assert t % align == 0 and row + window <= piece.offset + piece.length
                assert any(s.start <= t and t + window <= s.stop for s in SEGMENTS)
            batch = cs.gather_windows(x, starts, window)
            for row, w in zip(starts.tolist(), batch.numpy(), strict=True):
                piece = _piece_of(chunk, row)
                t = piece.start + row - piece.offset
                np.testing.assert_array_equal(w, data[t : t + window])  # the window it names
            seen += starts.numel()
    assert seen == 12 * 40


@pytest.mark.parametrize("mix", [1, 3])
def test_batch_stream_with_align_delivers_aligned_windows_and_resumes_exactly(store, mix):
    source, data = store
    align, window = 4, 5
    kw = dict(device="cpu", pieces=4, sampling="shuffled", segments=SEGMENTS, seed=9,
              window=window)  # fmt: skip
    args = dict(window=window, batch_size=16, batches_per_chunk=3, chunks_per_epoch=6,
                fields="data", mix=mix, align=align)  # fmt: skip
    with loader_from(source, 128, **kw) as loader:
        full = [b.clone() for b in stream_from(loader, **args)]
    for batch in full:
        for w in batch.numpy():
            t = int(w[0, 0])
            assert t % align == 0 and any(s.start <= t and t + window <= s.stop for s in SEGMENTS)
            np.testing.assert_array_equal(w, data[t : t + window])
    with loader_from(source, 128, **kw) as loader:
        stream = stream_from(loader, **args)
        it = iter(stream)
        head = [next(it).clone() for _ in range(8)]
        state = stream.state_dict()
    assert state["align"] == align
    with loader_from(source, 128, **kw) as loader:
        stream = stream_from(loader, **args)
        stream.load_state_dict(state)
        tail = list(stream)
    assert len(head + tail) == len(full) == 18
    for a, b in zip(head + tail, full, strict=True):
        torch.testing.assert_close(a, b)
    with loader_from(source, 128, **kw) as loader:
        other = stream_from(loader, **{**args, "align": 1})
        with pytest.warns(UserWarning, match="align=4 on a stream with align=1"):
            other.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            other.load_state_dict({k: v for k, v in state.items() if k != "align"})


def _chi_square_bound(df: int, z: float = 3.719) -> float:
    """The chi-square quantile for ``z`` standard deviations (Wilson-Hilferty; z=3.719: 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_draws_are_uniform_over_the_aligned_starts(store):
    source, _ = store
    with cs.ChunkLoader(source, 256, device="cpu", sampling="random", seed=1, options=cs.LoaderOptions(pieces=4, segments=SEGMENTS, window=7)) as loader:  # fmt: skip
        chunk = next(iter(loader.epoch(1)))
        valid = sorted(_aligned_rows(chunk.pieces, 7, 5))
        draws = 400 * len(valid)
        gen = torch.Generator().manual_seed(0)
        starts = torch.cat([cs.sample_windows(chunk, 1000, 7, gen, align=5)
                            for _ in range(draws // 1000 + 1)])[:draws]  # fmt: skip
        mixer = ChunkMixer(2, window=7, rows=loader.rows, align=5)
        mixer.add(chunk)
        mixed = mixer.sample(draws, torch.Generator().manual_seed(1))
    assert len(valid) > 30
    for drawn in (starts, mixed):
        counts = torch.bincount(drawn, minlength=chunk.length)
        assert set(torch.nonzero(counts).flatten().tolist()) == set(valid)
        observed = counts[valid].double()
        expected = draws / len(valid)
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < _chi_square_bound(len(valid) - 1), chi2


def test_a_chunk_without_an_aligned_start_names_align_and_the_fix():
    chunk = cs.Chunk({"x": torch.zeros(8, 1)}, start=3, stop=11, epoch=0, index=0)
    with pytest.raises(cs.ConfigError, match=r"align=16.*window=4.*Lower align"):
        cs.sample_windows(chunk, 2, 4, align=16)
    with pytest.raises(cs.ConfigError, match=r"window=9.*chunk length 8"):
        cs.sample_windows(chunk, 2, 9, align=2)  # too long a window stays the window error
    assert set(cs.sample_windows(chunk, 50, 4, align=4).tolist()) == {1}  # timestep 4
    # a bare tensor counts from row 0
    assert set(cs.sample_windows(torch.zeros(10, 1), 60, 3, align=3).tolist()) == {0, 3, 6}


@pytest.mark.gpu
def test_aligned_draws_stay_on_the_device(store):
    source, data = store
    kw = dict(device="cuda", pieces=4, sampling="shuffled", segments=SEGMENTS, seed=3, window=5)
    with loader_from(source, 128, **kw) as loader:
        stream = cs.BatchStream(loader, window=5, batch_size=32, batches_per_chunk=2, fields="data", mix=2, options=cs.StreamOptions(chunks_per_epoch=3, align=4))  # fmt: skip
        batches = []
        for b in stream:
            assert b.device.type == "cuda"  # gathered on the device, from the mixer's storage
            batches.append(b.cpu())
        chunk = next(iter(loader.epoch(1)))
        gen = torch.Generator(device=chunk.device).manual_seed(0)
        starts = cs.sample_windows(chunk, 64, 5, gen, align=4)
        assert starts.device == chunk.device
        for row in starts.tolist():
            piece = _piece_of(chunk, row)
            assert (piece.start + row - piece.offset) % 4 == 0
    assert len(batches) == 6
    for batch in batches:
        for w in batch.numpy():
            t = int(w[0, 0])
            assert t % 4 == 0
            np.testing.assert_array_equal(w, data[t : t + 5])
