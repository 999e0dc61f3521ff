"""One plan type: a sampling mode written once serves windows and pieces; every segment
is visited every pass, whatever chunk_size, pieces and segments."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import chunkstream as cs
from chunkstream.consumer._sampling import piece_starts
from chunkstream.plans import Sampling

T = 1000


class Strided(Sampling):
    """An evaluation mode, added here in one class: a pass visits every tile once, tile
    ``(slot * stride) % n`` for a stride coprime with the tile count, with no phase."""

    name = "strided"

    def __init__(self, stride: int = 7) -> None:
        self.stride = stride

    def per_pass(self, plan):
        return -(-plan.layout.n_tiles // plan.pieces)

    def draw(self, plan, epoch, index):
        layout, k = plan.layout, plan.pieces
        n = layout.n_tiles
        stride = next(s for s in itertools.count(self.stride) if math.gcd(s, n) == 1)
        owner = np.repeat(np.arange(index.size), k)
        slot = (index % self.per_pass(plan))[owner] * k + np.tile(np.arange(k), index.size)
        owner, slot = owner[slot < n], slot[slot < n]
        return layout.tile_draw(owner, (slot * stride) % n, 0)


def _strided_windows(total, chunk, stride=7):
    n = total // chunk
    stride = next(s for s in itertools.count(stride) if math.gcd(s, n) == 1)
    return [((i * stride) % n * chunk, (i * stride) % n * chunk + chunk) for i in range(n)]


def test_a_new_mode_in_one_class_serves_windows_and_pieces():
    source = cs.NumpySource({"x": np.arange(float(T))[:, None]})
    # windows: a window plan of the mode, from make_plan and from the loader
    plan = cs.make_plan(Strided(), total_timesteps=T, chunk_size=64, seed=3)
    expected = _strided_windows(T, 64)
    assert plan.windows_per_pass == len(expected) == 15
    assert [plan.window(0, i) for i in range(15)] == expected
    assert plan.windows(0, np.arange(15, 30)).tolist() == [list(w) for w in expected]
    with cs.ChunkLoader(source, 64, device="cpu", sampling=Strided()) as loader:
        chunks = list(loader.epoch())
    assert [(c.start, c.stop) for c in chunks] == expected
    assert all(c["x"][:, 0].tolist() == list(range(c.start, c.stop)) for c in chunks)
    # pieces: the same mode, four tiles a chunk, inside segments, from the plan and the loader
    segs = [(0, 300, "a"), (310, 330, "b"), (400, 1000, "c")]
    pieces = cs.PiecePlan(total_timesteps=T, chunk_size=64, pieces=4, sampling=Strided(),
                          segments=segs)  # fmt: skip
    n_tiles = 300 // 16 + 20 // 16 + 600 // 16
    assert pieces.windows_per_pass == -(-n_tiles // 4)
    with cs.ChunkLoader(source, 64, device="cpu", sampling=Strided(), options=cs.LoaderOptions(pieces=4, segments=segs)) as loader:  # fmt: skip
        got = [c.pieces for c in loader.epoch()]
    assert got == pieces.chunks(0, range(pieces.windows_per_pass))
    starts = sorted(p.start for c in got for p in c)
    tiles = [s + 16 * j for s, e, _ in segs for j in range((e - s) // 16)]
    assert starts == tiles  # every tile once, no phase
    # 56 tiles: stride 9 (7 divides 56); tiles 0, 9, 18 (b's one), 27 in tile order
    assert [p.segment for p in got[0]] == [0, 0, 1, 2]


@st.composite
def segment_lists(draw):
    """Sorted disjoint segments of [0, T), some far shorter than a piece, with gaps."""
    cuts = sorted(draw(st.sets(st.integers(1, T - 1), min_size=1, max_size=12)))
    bounds = [0, *cuts, T]
    segs = [(a, b, f"s{i}") for i, (a, b) in enumerate(itertools.pairwise(bounds))
            if draw(st.booleans()) or i == 0]  # fmt: skip
    return cs.Segments(segs)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segs=segment_lists(),
    k=st.sampled_from([1, 2, 4, 8]),
    piece=st.integers(4, 600),
    window=st.integers(1, 4),
    sampling=st.sampled_from(["shuffled", "sequential"]),
    seed=st.integers(0, 2**40),
    pass_=st.integers(0, 3),
)
def test_a_pass_visits_every_segment_in_proportion(segs, k, piece, window, sampling, seed,
                                                   pass_):  # fmt: skip
    chunk = k * piece
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # segments shorter than the window are skipped
        used = [s for s in segs if len(s) >= window]
        assume(used)
        try:
            plan = cs.PiecePlan(total_timesteps=T, chunk_size=chunk, pieces=k,
                                sampling=sampling, segments=segs, seed=seed,
                                batch_window=window)  # fmt: skip
        except cs.ConfigError as exc:  # pooled stretches too short to hold a window
            assert "2 * window - 1" in str(exc) and piece < 2 * (2 * window - 1)
            return
    n = plan.windows_per_pass
    chunks = plan.chunks(2, range(pass_ * n, (pass_ + 1) * n))
    hits = np.zeros(T, dtype=int)
    starts = np.zeros(T, dtype=int)
    for pieces in chunks:
        assert sum(p.length for p in pieces) <= chunk
        assert sampling == "sequential" or any(p.length >= window for p in pieces)
        for p in pieces:
            hits[p.start : p.stop] += 1
        fits = any(p.length >= window for p in pieces)
        for s in piece_starts(pieces, window).tolist() if fits else []:
            owner = [p for p in pieces if p.offset <= s < p.offset + p.length - window + 1]
            starts[owner[0].start + s - owner[0].offset] += 1
    assert hits.max() <= 1 and starts.max() <= 1  # none twice
    for seg in segs:
        read = int(hits[seg.start : seg.stop].sum())
        if len(seg) < window:
            assert read == 0
        elif sampling == "sequential" or len(seg) < piece:
            assert read == len(seg)  # all of it (a short segment joins the pool)
        else:
            assert len(seg) - piece < read <= len(seg)  # all but the phase's remainder
            assert starts[seg.start : seg.stop].sum() >= piece - window + 1
    # the epoch arithmetic counts the pass: its chunks, and what they read
    epoch = cs.plan_epoch(T, chunk, 1, segments=segs, pieces=k)
    if sampling == "shuffled" and len(used) == len(segs):
        assert epoch.chunks_per_epoch == n
        assert epoch.total_timesteps == hits.sum()


def test_a_chunk_longer_than_every_segment_holds_them_all():
    """The reported case: 8 segments of 24,576 steps, chunk_size=1000000, pieces=1."""
    segs = cs.split_segments([(i * 24_576, (i + 1) * 24_576, f"r{i}") for i in range(8)],
                             fractions=(0.9, 0.1))["train"]  # fmt: skip
    total = 8 * 24_576
    epoch = cs.plan_epoch(total, 1_000_000, 256, segments=segs)
    assert epoch.chunks_per_epoch == 1
    assert epoch.total_timesteps == segs.timesteps
    source = cs.NumpySource({"x": np.arange(float(total))[:, None]})
    for sampling in ("shuffled", "random", "sequential"):
        with cs.ChunkLoader(source, 1_000_000, device="cpu", sampling=sampling, options=cs.LoaderOptions(segments=segs, window=32)) as loader:  # fmt: skip
            assert loader.chunks_per_pass == (None if sampling == "random" else 1)
            (chunk,) = list(loader.epoch(epoch.chunks_per_epoch))
        assert [p.segment for p in chunk.pieces] == list(range(8)), sampling
        assert [(p.start, p.stop) for p in chunk.pieces] == [(s.start, s.stop) for s in segs]
        assert chunk.length == segs.timesteps
        assert chunk["x"][:, 0].tolist() == [t for s in segs for t in range(s.start, s.stop)]


@pytest.mark.parametrize("sampling", ["random", "shuffled", "sequential"])
def test_short_segments_share_a_chunk_and_random_weighs_them_by_length(sampling):
    segs = [(0, 500, "long"), (500, 530, "a"), (600, 650, "b")]
    plan = cs.PiecePlan(total_timesteps=T, chunk_size=100, segments=segs, sampling=sampling,
                        seed=1)  # fmt: skip
    chunks = plan.chunks(0, range(4000))
    rows = np.zeros(3)
    for pieces in chunks:
        for p in pieces:
            rows[p.segment] += p.length
    if sampling == "random":  # timesteps drawn per timestep of each segment, within 25%
        per_step = rows / np.array([500, 30, 50])
        assert per_step.max() / per_step.min() < 1.25
        assert plan.valid_starts() == {"long": 401, "a": 100, "b": 100}
    pooled = [c for c in chunks if any(p.segment != 0 for p in c)]
    assert pooled and all([p.segment for p in c] == [1, 2] for c in pooled)


def test_the_pool_turns_between_passes_so_every_window_start_is_reachable():
    segs = [(i * 50, i * 50 + 30, f"s{i}") for i in range(20)]  # 600 pooled steps, 64-step pieces
    window = 8
    plan = cs.PiecePlan(total_timesteps=T, chunk_size=128, pieces=2, segments=segs, seed=2,
                        batch_window=window)  # fmt: skip
    n = plan.windows_per_pass
    assert n == 5  # 10 tiles of 60 steps, 2 a chunk
    valid = {t for a, b, _ in segs for t in range(a, b - window + 1)}
    seen: set[int] = set()
    for epoch in range(20):
        hits = np.zeros(T, dtype=int)
        for pieces in plan.chunks(epoch, range(n)):
            for p in pieces:
                hits[p.start : p.stop] += 1
                seen.update(range(p.start, p.stop - window + 1))
        assert all((hits[a:b] == 1).all() for a, b, _ in segs) and hits.sum() == 600
    assert seen == valid  # a cut between two tiles moves from pass to pass
    # random: start numbers go round the pool; valid_starts counts those touching a segment
    rnd = cs.PiecePlan(total_timesteps=T, chunk_size=64, segments=segs, sampling="random",
                       batch_window=window)  # fmt: skip
    touched = {name: 0 for *_, name in segs}
    for u in range(rnd.layout.n_starts):
        draw = rnd.layout.start_draw(np.array([0]), np.array([u]))
        _, _, _, ids = draw.table.cut(draw.owner, draw.v0, draw.v1)
        for i in set(ids.tolist()):
            touched[segs[i][2]] += 1
    assert rnd.valid_starts() == touched and rnd.layout.n_starts == 600
    assert set(touched.values()) == {93}  # 30 + 64 - 1: every segment alike
