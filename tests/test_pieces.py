"""Pieced chunks, segments and splits, on real zarr stores and real threads."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkstream as cs
from chunkstream.consumer._sampling import WindowSampler, piece_starts
from tests.flat import loader_from, stream_from
from tests.stores import make_array, random_data

T = 1000
GRID = 16  # the store's time chunk


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("pieces") / "x.zarr"
    data = make_array(path, random_data((T, 5), seed=4), (GRID, 5))
    source = cs.ZarrSource(path)
    yield source, data
    source.close()


@st.composite
def segment_sets(draw, total=T):
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), min_size=1, max_size=10)))
    bounds = [0, *cuts, total]
    segs = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        if draw(st.booleans()) or i == 0:  # keep some ranges, leave gaps between others
            segs.append((a, b, f"s{i}"))
    return cs.Segments(segs)


def _inside_one(segs, start, stop):
    return [i for i, s in enumerate(segs) if s.start <= start and stop <= s.stop]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segs=segment_sets(),
    k=st.sampled_from([1, 2, 4, 8, 16]),
    piece=st.sampled_from([8, 16, 32, 48]),
    window=st.integers(1, 8),
    sampling=st.sampled_from(["random", "shuffled", "sequential"]),
    seed=st.integers(0, 2**40),
    index=st.integers(0, 10**6),
)
def test_pieces_and_windows_never_cross_a_segment_or_piece(
    segs, k, piece, window, sampling, seed, index
):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # segments shorter than the window are skipped
        try:
            plan = cs.PiecePlan(total_timesteps=T, chunk_size=k * piece, pieces=k,
                                sampling=sampling, segments=segs, seed=seed, grid=GRID,
                                batch_window=window)  # fmt: skip
        except cs.ConfigError as exc:
            # no segment holds a window, or the pooled short ones leave a chunk none
            assert all(len(s) < window for s in segs) or "2 * window - 1" in str(exc), exc
            return
    pieces = plan.chunk(3, index)
    assert pieces == plan.chunk(3, index)  # pure
    assert len(pieces) >= 1
    if sampling != "sequential":  # k tiles; a tile of the short segments' pool spans several
        assert sum(len(segs[p.segment]) >= piece for p in pieces) <= k
    offset = 0
    for p in pieces:
        assert p.offset == offset
        offset += p.length
        assert p.length >= 1
        inside = _inside_one(segs, p.start, p.stop)
        assert inside == [p.segment], (p, segs)
        assert len(segs[p.segment]) >= window
        if sampling != "sequential":
            assert p.length <= piece
            if p.length == piece and piece % GRID == 0 and p.start % GRID:
                # not on the grid only when the segment leaves no room for an aligned piece
                seg = segs[p.segment]
                assert -(-seg.start // GRID) * GRID + piece > seg.stop
    assert offset <= k * piece
    # every start the consumer may draw lies in one piece, the window with it
    starts = piece_starts(pieces, window) if any(p.length >= window for p in pieces) else []
    for s in (int(x) for x in starts):
        owner = [p for p in pieces if p.offset <= s and s + window <= p.offset + p.length]
        assert len(owner) == 1


@pytest.mark.parametrize("sampling", ["random", "shuffled", "sequential"])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_chunk_rows_are_the_source_slices_its_pieces_name(store, sampling, k):
    source, data = store
    segs = [(0, 230, "a"), (250, 251, "tiny"), (300, 700, "b"), (705, 1000, "c")]
    with pytest.warns(UserWarning, match="'tiny'"):
        loader = cs.ChunkLoader(source, 128, device="cpu", sampling=sampling, seed=7, workers=2, options=cs.LoaderOptions(pieces=k, segments=segs, window=4))  # fmt: skip
    with loader:
        seen = 0
        for chunk in loader.epoch(6):
            x = chunk["data"].numpy()
            assert len(x) == chunk.length == sum(p.length for p in chunk.pieces)
            assert (chunk.start, chunk.stop) == chunk.pieces[0][1:3]
            for p in chunk.pieces:
                np.testing.assert_array_equal(
                    x[p.offset : p.offset + p.length], data[p.start : p.stop]
                )
                assert segs[p.segment][0] <= p.start < p.stop <= segs[p.segment][1]
                assert p.segment != 1
            seen += 1
        assert seen == 6


def test_pieces_start_on_the_stored_time_chunk_grid(store):
    source, _ = store
    with cs.ChunkLoader(
        source, 256, device="cpu", sampling="random", options=cs.LoaderOptions(pieces=8)
    ) as loader:
        assert loader.plan.piece_align == GRID
        starts = [p.start for c in loader.epoch(5) for p in c.pieces]
    assert len(starts) == 40 and all(s % GRID == 0 for s in starts)
    # a piece shorter than the stored chunk cannot cover whole chunks: plain align
    with cs.ChunkLoader(
        source, 64, device="cpu", sampling="random", options=cs.LoaderOptions(pieces=8)
    ) as loader:
        assert loader.plan.piece_align == 1


def test_shuffled_delivers_every_tiled_timestep_once_per_pass():
    segs = cs.Segments([(0, 300), (310, 330), (400, 1000)])
    plan = cs.PiecePlan(total_timesteps=T, chunk_size=64, pieces=4, sampling="shuffled",
                        segments=segs, seed=3)  # fmt: skip
    for epoch in range(3):
        hits = np.zeros(T, dtype=int)
        n = plan.windows_per_pass
        for index in range(epoch * n, (epoch + 1) * n):  # one pass, wherever it starts
            for p in plan.chunk(epoch, index):
                hits[p.start : p.stop] += 1
        assert hits.max() == 1
        # tiles cover each segment but for less than one piece (the phase's remainder)
        for s in segs:
            assert len(s) - 16 < hits[s.start : s.stop].sum() <= len(s)
        assert hits.sum() == sum(hits[s.start : s.stop].sum() for s in segs)


def test_sequential_covers_each_segment_exactly_once_and_never_mixes_two_in_a_piece():
    segs = cs.split_segments([(0, 333, "c0"), (333, 1000, "c1")], gap=3)["val"]
    plan = cs.PiecePlan(total_timesteps=T, chunk_size=64, pieces=4, sampling="sequential",
                        segments=segs)  # fmt: skip
    hits = np.zeros(T, dtype=int)
    for index in range(plan.windows_per_pass):
        for p in plan.chunk(0, index):
            assert len(_inside_one(segs, p.start, p.stop)) == 1
            hits[p.start : p.stop] += 1
    expected = np.zeros(T, dtype=int)
    for s in segs:
        expected[s.start : s.stop] = 1
    np.testing.assert_array_equal(hits, expected)


def test_contiguous_chunks_stay_inside_a_segment(store):
    source, data = store
    segs = [(0, 100), (100, 400), (420, 1000)]
    with cs.ChunkLoader(
        source, 150, device="cpu", sampling="random", options=cs.LoaderOptions(segments=segs)
    ) as loader:
        for chunk in loader.epoch(30):
            (p,) = chunk.pieces
            assert len(_inside_one(cs.Segments(segs), p.start, p.stop)) == 1
            np.testing.assert_array_equal(chunk["data"].numpy(), data[p.start : p.stop])


def test_pieces_one_without_segments_keeps_todays_plan(store):
    source, _ = store
    with cs.ChunkLoader(source, 100, device="cpu", seed=2) as loader:
        assert isinstance(loader.plan, cs.ShuffledPlan)
        chunks = list(loader.epoch(3))
    for i, chunk in enumerate(chunks):
        start, stop = loader.plan.window(0, i)
        assert chunk.pieces == (cs.Piece(0, start, stop, None),)


@pytest.mark.parametrize("sampling", ["random", "shuffled"])
def test_resume_is_exact_and_ranks_are_disjoint(store, sampling):
    source, _ = store
    kw = dict(device="cpu", pieces=4, sampling=sampling, seed=11, segments=[(0, 480), (500, 1000)])

    def pieces_of(chunks):
        return [c.pieces for c in chunks]

    with loader_from(source, 64, **kw) as loader:
        full = pieces_of(loader.epoch(10)) + pieces_of(loader.epoch(4))
    for cut in (0, 3, 9):
        with loader_from(source, 64, **kw) as loader:
            it = loader.epoch(10)
            head = pieces_of(next(it) for _ in range(cut))
            state = loader.state_dict()
        with loader_from(source, 64, **kw) as loader:
            loader.load_state_dict(state)
            tail = pieces_of(loader.epoch(10)) + pieces_of(loader.epoch(4))
        assert head + tail == full
    shares = []
    for rank in range(3):
        with loader_from(source, 64, **kw, rank=rank, world_size=3) as loader:
            shares.append(pieces_of(loader.epoch(4)))
    assert [len(s) for s in shares] == [4, 4, 4]
    plan = cs.PiecePlan(total_timesteps=T, chunk_size=64, pieces=4, sampling=sampling, seed=11,
                        segments=kw["segments"], grid=GRID)  # fmt: skip
    for rank, share in enumerate(shares):
        assert share == [plan.chunk(0, step * 3 + rank) for step in range(4)]
    if sampling == "shuffled":  # one pass: no timestep reaches two ranks
        starts = [p.start for share in shares for c in share for p in c]
        assert len(starts) == len(set(starts))


def test_batch_stream_resumes_mid_chunk_and_draws_inside_pieces(store):
    source, data = store
    kw = dict(device="cpu", pieces=8, sampling="shuffled", seed=5, window=6)
    args = dict(window=6, batch_size=16, batches_per_chunk=4, chunks_per_epoch=5)
    with loader_from(source, 128, **kw) as loader:
        full = [b.clone() for b in stream_from(loader, **args, fields="data")]
    with loader_from(source, 128, **kw) as loader:
        stream = stream_from(loader, **args, fields="data")
        it = iter(stream)
        head = [next(it).clone() for _ in range(7)]
        state = stream.state_dict()
    with loader_from(source, 128, **kw) as loader:
        stream = stream_from(loader, **args, fields="data")
        stream.load_state_dict(state)
        tail = list(stream)
    assert len(head + tail) == len(full) == 20
    for a, b in zip(head + tail, full, strict=True):
        torch.testing.assert_close(a, b)
    # every window is a contiguous stretch of the source
    rows = {tuple(data[t]): t for t in range(T)}
    for batch in full:
        for w in batch.numpy():
            t0 = rows[tuple(w[0])]
            np.testing.assert_array_equal(w, data[t0 : t0 + 6])


def test_window_sampler_and_sample_windows_cover_only_piece_starts():
    pieces = (cs.Piece(0, 100, 110), cs.Piece(10, 500, 503), cs.Piece(13, 7, 27))
    valid = set(range(0, 5)) | set(range(13, 28))  # 10 - 6 + 1 and 20 - 6 + 1 starts
    sampler = WindowSampler(33, window=6, batch_size=7, pieces=pieces)
    drawn = torch.cat(list(sampler)).tolist()
    assert sorted(drawn) == sorted(valid) and len(sampler) == 3
    chunk = cs.Chunk({"x": torch.zeros(33, 2)}, start=100, stop=110, epoch=0, index=0,
                     pieces=pieces)  # fmt: skip
    assert set(cs.sample_windows(chunk, 500, window=6).tolist()) == valid
    with pytest.raises(cs.ConfigError, match=r"window=30.*longest piece \(20"):
        cs.sample_windows(chunk, 4, window=30)


def test_segments_files_and_splits(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text("start,stop,name\n0,650,cond0\n650,2000,cond1\n# note\n2000,2900,cond2\n")
    js = tmp_path / "s.json"
    js.write_text(json.dumps({"cond0": [0, 650], "cond1": [650, 2000], "cond2": [2000, 2900]}))
    assert cs.Segments.read(csv) == cs.Segments.read(js)
    splits = cs.split_segments(csv, fractions=(0.7, 0.1, 0.2), gap=5)
    assert [s.name for s in splits["val"]] == ["cond0/val", "cond1/val", "cond2/val"]
    for i, cond in enumerate(cs.Segments.read(csv)):
        tr, va, te = (splits[n][i] for n in ("train", "val", "test"))
        assert tr.start == cond.start and te.stop == cond.stop
        assert va.start - tr.stop == 5 and te.start - va.stop == 5
        usable = len(cond) - 10
        assert abs(len(tr) - 0.7 * usable) <= 1 and abs(len(va) - 0.1 * usable) <= 1


@pytest.mark.parametrize("sampling", ["random", "shuffled", "sequential"])
def test_the_loader_gets_each_plans_chunks_in_one_call(sampling):
    from chunkstream.plans import chunk_pieces, epoch_pieces

    indices = [3, 0, 7, 7, 12]
    window_plan = cs.make_plan(sampling, total_timesteps=1000, chunk_size=64, seed=5)
    piece_plan = cs.PiecePlan(total_timesteps=1000, chunk_size=64, pieces=4, sampling=sampling,
                              seed=5)  # fmt: skip
    for plan in (window_plan, piece_plan):
        for epoch in (0, 2):
            got = epoch_pieces(plan, epoch, np.asarray(indices))
            assert got == [chunk_pieces(plan, epoch, i) for i in indices]
            assert all(isinstance(p.start, int) and isinstance(p.stop, int)
                       for pieces in got for p in pieces)  # fmt: skip
    with cs.ChunkLoader(cs.NumpySource({"x": np.arange(1000.0)[:, None]}), 64, device="cpu",
                        sampling=sampling, seed=5) as loader:  # fmt: skip
        starts = [chunk.start for chunk in loader.epoch(5)]
    assert starts == [window_plan.window(0, i)[0] for i in range(5)]
