"""cs.Recordings: several real zarr stores streamed as one dataset (issue 44)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkstream as cs
from tests.stores import make_array, random_data

# Three recordings of different lengths; the third has fewer neurons.
SHAPES = {"a": (3000, 8), "b": (5000, 8), "c": (1700, 6)}
WINDOW = 20


@pytest.fixture
def stores(tmp_path):
    """name -> (path, data) of three real zarr stores (stored time chunk 100)."""
    out = {}
    for i, (name, (T, N)) in enumerate(SHAPES.items()):
        data = make_array(tmp_path / f"{name}.zarr", random_data((T, N), seed=i), chunks=(100, N))
        out[name] = (str(tmp_path / f"{name}.zarr"), data)
    return out


def open_recordings(stores, weights=None, names=tuple(SHAPES)):
    return cs.Recordings(
        [cs.ZarrSource(stores[n][0]) for n in names], weights=weights, names=list(names)
    )


def check_pieces(chunk, recs, stores):
    """Every piece lies in one recording, its id field says which, its rows are that
    store's rows (padded with zeros and masked where the store is narrower)."""
    names = recs.names
    for p in chunk.pieces:
        ids = chunk["recording"][p.offset : p.offset + p.length].numpy()
        r = int(ids[0])
        assert (ids == r).all()
        start, stop = p.start - recs.offsets[r], p.stop - recs.offsets[r]
        assert 0 <= start < stop <= recs.lengths[r]
        data = stores[names[r]][1][start:stop]
        got = chunk["data"][p.offset : p.offset + p.length].numpy()
        np.testing.assert_array_equal(got[:, : data.shape[1]], data)
        assert not got[:, data.shape[1] :].any()
        if "data_mask" in chunk:
            mask = chunk["data_mask"][p.offset : p.offset + p.length].numpy()
            assert mask[:, : data.shape[1]].all() and not mask[:, data.shape[1] :].any()
    return chunk


def test_three_stores_stream_weighted_resumable_disjoint_epochs(stores):
    """The Done-when test: no window crosses a recording, shares match the weights
    within sampling error, a mid-epoch resume gives exactly the rest, two ranks get
    disjoint windows."""
    weights = [1.0, 1.0, 2.0]
    recs = open_recordings(stores, weights=weights)
    kw = dict(device="cpu", seed=7)
    opts = dict(pieces=4, window=WINDOW)
    assert recs.fields["data"].shape == (8,) and "data_mask" in recs.fields

    def pieces_of(chunks):
        return [check_pieces(c, recs, stores).pieces for c in chunks]

    with cs.ChunkLoader(recs, 400, options=cs.LoaderOptions(**opts), **kw) as loader:
        per_pass = loader.plan.windows_per_pass
        full = [pieces_of(loader.epoch(per_pass)) for _ in range(3)]
    # Shares: timesteps per recording over three epochs against the weights' shares.
    got = np.zeros(3)
    for epoch in full:
        for chunk in epoch:
            for p in chunk:
                got[recs.recording_of(p.start)] += p.length
    want = np.array(weights) / sum(weights)
    np.testing.assert_allclose(got / got.sum(), want, atol=0.03)
    # The same under random sampling (with replacement: a real sampling error).
    with cs.ChunkLoader(
        recs, 400, sampling="random", options=cs.LoaderOptions(**opts), **kw
    ) as loader:
        counts = np.zeros(3)
        for chunk in loader.epoch(300):
            for p in chunk.pieces:
                counts[int(chunk["recording"][p.offset])] += 1
    n = counts.sum()
    sigma = np.sqrt(want * (1 - want) / n)
    assert (np.abs(counts / n - want) < 4 * sigma).all(), (counts / n, want)
    # A mid-epoch resume gives exactly the rest.
    for cut in (1, per_pass // 2):
        with cs.ChunkLoader(recs, 400, options=cs.LoaderOptions(**opts), **kw) as loader:
            it = loader.epoch(per_pass)
            head = pieces_of(next(it) for _ in range(cut))
            state = loader.state_dict()
        with cs.ChunkLoader(recs, 400, options=cs.LoaderOptions(**opts), **kw) as loader:
            loader.load_state_dict(state)
            tail = pieces_of(loader.epoch(per_pass))
        assert head + tail == full[0]
    # Two ranks: between them exactly the one-rank epoch's chunks, each on one rank.
    shares = []
    for rank in range(2):
        ranked = cs.LoaderOptions(rank=rank, world_size=2, **opts)
        with cs.ChunkLoader(recs, 400, options=ranked, **kw) as loader:
            shares.append(pieces_of(loader.epoch(per_pass // 2)))
    assert len(shares[0]) == len(shares[1]) == per_pass // 2
    assert [c for pair in zip(*shares, strict=True) for c in pair] == full[0][: 2 * (per_pass // 2)]
    # Unweighted, a pass tiles every recording once: no timestep reaches both ranks.
    plain = open_recordings(stores)
    spans = []
    for rank in range(2):
        ranked = cs.LoaderOptions(rank=rank, world_size=2, **opts)
        with cs.ChunkLoader(plain, 400, options=ranked, **kw) as loader:
            n = loader.plan.windows_per_pass // 2
            spans.append({(p.start, p.stop) for c in loader.epoch(n) for p in c.pieces})
    assert spans[0] and spans[1] and not spans[0] & spans[1]
    recs.close()


def test_batches_carry_the_recording_and_never_cross_one(stores):
    recs = open_recordings(stores)
    opts = cs.LoaderOptions(pieces=4, window=WINDOW)
    with cs.ChunkLoader(recs, 400, device="cpu", seed=1, options=opts) as loader:
        stream = cs.BatchStream(
            loader,
            window=WINDOW,
            batch_size=32,
            batches_per_chunk=4,
            fields=("data", "data_mask"),
            options=cs.StreamOptions(chunks_per_epoch=6),
        )
        seen = set()
        for batch in stream:
            ids = batch["recording"]  # each window's recording (issue 49: one per window)
            assert ids.shape == (32,) and ids.dtype == torch.int64
            seen.update(ids.tolist())
            narrow = ids == 2  # recording "c" has 6 neurons: padded and masked
            assert not batch["data"][narrow][..., 6:].any()
            assert batch["data_mask"][narrow][..., :6].all()
            assert not batch["data_mask"][narrow][..., 6:].any()
            assert batch["data_mask"][~narrow].all()
        assert seen == {0, 1, 2}  # the buffer mixes recordings


def test_same_shape_recordings_need_no_mask(stores):
    recs = open_recordings(stores, names=("a", "b"))
    assert set(recs.fields) == {"data", "recording"}
    assert recs.segments == cs.Segments([(0, 3000, "a"), (3000, 8000, "b")])
    assert recs.shares == pytest.approx({"a": 3 / 8, "b": 5 / 8})
    out = {n: np.empty((200, *s.shape), s.dtype) for n, s in recs.fields.items()}
    recs.read_into(2900, 3100, out)  # across the boundary: each part from its store
    np.testing.assert_array_equal(out["data"][:100], stores["a"][1][2900:])
    np.testing.assert_array_equal(out["data"][100:], stores["b"][1][:100])
    assert (
        out["recording"][:100].tolist() == [0] * 100
        and out["recording"][100:].tolist() == [1] * 100
    )
    with cs.ChunkLoader(recs, 500, device="cpu", seed=2) as loader:  # contiguous chunks too
        for chunk in loader.epoch(loader.plan.windows_per_pass):
            check_pieces(chunk, recs, stores)


def test_recordings_start_on_the_stored_chunk_grid(tmp_path):
    a = make_array(tmp_path / "a.zarr", random_data((250, 3)), chunks=(64, 3))
    b = make_array(tmp_path / "b.zarr", random_data((300, 3), seed=1), chunks=(32, 3))
    recs = cs.Recordings([cs.ZarrSource(tmp_path / "a.zarr"), cs.ZarrSource(tmp_path / "b.zarr")])
    assert recs.time_chunk == 64 and recs.offsets == (0, 256) and len(recs) == 556
    out = {n: np.empty((300, *s.shape), s.dtype) for n, s in recs.fields.items()}
    recs.read_into(200, 500, out)
    np.testing.assert_array_equal(out["data"][:50], a[200:])
    assert not out["data"][50:56].any() and (out["recording"][50:56] == -1).all()
    np.testing.assert_array_equal(out["data"][56:], b[:244])


def test_segments_compose_with_the_recordings(stores):
    recs = open_recordings(stores)
    splits = cs.split_segments(recs.segments, fractions=(0.8, 0.2), gap=WINDOW - 1)
    opts = cs.LoaderOptions(pieces=2, window=WINDOW, segments=splits["train"])
    with cs.ChunkLoader(recs, 200, device="cpu", options=opts) as loader:
        assert loader.plan.segments == splits["train"]
        for chunk in loader.epoch(loader.plan.windows_per_pass):
            for p in chunk.pieces:
                seg = splits["train"][p.segment]
                assert seg.start <= p.start < p.stop <= seg.stop
    # A segment over a boundary is cut there: no piece crosses.
    opts = cs.LoaderOptions(segments=[(2000, 4000, "x")])
    with cs.ChunkLoader(recs, 200, device="cpu", options=opts) as loader:
        assert loader.plan.segments == cs.Segments([(2000, 3000, "x@0"), (3000, 4000, "x@1")])


def test_incompatible_recordings_are_refused_naming_recording_and_field(tmp_path, stores):
    make_array(tmp_path / "f64.zarr", random_data((500, 8), "float64"), chunks=(100, 8))
    with pytest.raises(cs.FieldDtypeError, match=r"recording 'x'.*field 'data'.*float64"):
        cs.Recordings(
            [cs.ZarrSource(stores["a"][0]), cs.ZarrSource(tmp_path / "f64.zarr")], names=["a", "x"]
        )
    other = cs.NumpySource({"voltage": np.zeros((100, 8), np.float32)})
    with pytest.raises(cs.ConfigError, match=r"recording 'v'.*'data'"):
        cs.Recordings([cs.ZarrSource(stores["a"][0]), other], names=["a", "v"])
    flat = cs.NumpySource({"data": np.zeros((100,), np.float32)})
    with pytest.raises(cs.ConfigError, match=r"recording 'f'.*field 'data'.*number of axes"):
        cs.Recordings([cs.ZarrSource(stores["a"][0]), flat], names=["a", "f"])
    clash = cs.NumpySource({"recording": np.zeros((100,), np.int64)})
    with pytest.raises(cs.ConfigError, match="recording"):
        cs.Recordings([clash])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(weights=[1, 2]), "weights"),
        (dict(weights=[1, 0, 1]), r"weights\['b'\]"),
        (dict(weights={"a": 1, "zz": 2}), "Unknown"),
        (dict(names=["a", "a", "b"]), "names"),
        (dict(names=["a"]), "names"),
    ],
)
def test_bad_weights_and_names_are_refused(kwargs, match):
    parts = [cs.NumpySource({"x": np.zeros((50, 2), np.float32)}) for _ in range(3)]
    kwargs.setdefault("names", ["a", "b", "c"])
    with pytest.raises(cs.ConfigError, match=match):
        cs.Recordings(parts, **kwargs)
    with pytest.raises(cs.ConfigError, match="sources"):
        cs.Recordings([])
    with pytest.raises(cs.ConfigError, match="sources"):
        cs.Recordings("a.zarr")


def test_weighted_plan_is_pure_and_covers_every_tile_across_passes():
    strata = ((0, 1000, 1.0), (1000, 1200, 4.0))
    segs = cs.Segments([(0, 1000, "a"), (1000, 1200, "b")])
    plan = cs.PiecePlan(
        total_timesteps=1200, chunk_size=40, pieces=2, segments=segs, recordings=strata, seed=3
    )
    again = cs.PiecePlan(
        total_timesteps=1200, chunk_size=40, pieces=2, segments=segs, recordings=strata, seed=3
    )
    n = plan.windows_per_pass
    assert plan.chunks(0, np.arange(n)) == again.chunks(0, np.arange(n))
    pieces = [p for c in plan.chunks(0, np.arange(12 * n)) for p in c]
    in_b = sum(p.segment == 1 for p in pieces) / len(pieces)
    assert in_b == pytest.approx(0.8, abs=0.02)
    # "a" is drawn below its length's share (12 of its 50 tiles a pass, a keyed choice):
    # over passes its tiles all come (1 - 0.76**12: 96% expected).
    starts_a = {p.start for p in pieces if p.segment == 0}
    assert len(starts_a) > 0.9 * (1000 // 20)


def test_tools_plan_inspect_and_bench_take_several_runs(stores, capsys):
    from chunkstream.cli import main

    paths = [stores[n][0] for n in SHAPES]
    args = ["--chunk-size", "400", "--batch-size", "32", "--window", str(WINDOW), "--device", "cpu"]
    assert main(["plan", *paths, *args, "--pieces", "4", "--weights", "1", "1", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    runs = report["pieces"]["recordings"]
    assert [r["name"] for r in runs] == ["a.zarr", "b.zarr", "c.zarr"]
    assert [r["timesteps"] for r in runs] == [3000, 5000, 1700]
    assert [r["share"] for r in runs] == pytest.approx([0.25, 0.25, 0.5])
    assert [r["drawn"] for r in runs] == pytest.approx([0.25, 0.25, 0.5], abs=0.02)
    assert main(["plan", *paths, *args]) == 0
    out = capsys.readouterr().out
    assert "recordings (one pass" in out and "c.zarr" in out
    assert main(["inspect", *paths]) == 0
    out = capsys.readouterr().out
    assert "as one dataset (cs.Recordings, 3 runs)" in out and "'data_mask' true where real" in out
    assert main(["inspect", *paths, "--json"]) == 0
    together = json.loads(capsys.readouterr().out)["recordings"]
    assert [r["offset"] for r in together["runs"]] == [0, 3000, 8000]
    bench = ["--chunk-size", "400", "--prefetch", "2", "--workers", "1", "--chunks", "4"]
    assert main(["bench", *paths, *bench, "--train-ms", "1", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert " + " in out["path"] and len(out["settings"]) == 1


def test_resident_and_streamed_recordings_give_identical_chunks(stores):
    recs = open_recordings(stores, weights=[2, 1, 1])
    runs = {}
    for resident in (True, False):
        opts = cs.LoaderOptions(pieces=4, window=WINDOW, resident=resident)
        with cs.ChunkLoader(recs, 400, device="cpu", seed=4, options=opts) as loader:
            runs[resident] = [
                (c.pieces, {k: v.clone() for k, v in c.items()})
                for c in loader.epoch(loader.plan.windows_per_pass)
            ]
    for (pa, a), (pb, b) in zip(runs[True], runs[False], strict=True):
        assert pa == pb
        for name in a:
            torch.testing.assert_close(a[name], b[name])


@pytest.mark.gpu
def test_recordings_stream_to_the_device(stores):
    recs = open_recordings(stores)
    opts = cs.LoaderOptions(pieces=4, window=WINDOW)
    with cs.ChunkLoader(recs, 400, device="cuda", seed=3, options=opts) as loader:
        stream = cs.BatchStream(
            loader,
            window=WINDOW,
            batch_size=32,
            batches_per_chunk=4,
            options=cs.StreamOptions(chunks_per_epoch=6),
        )
        for batch in stream:
            ids = batch["recording"]
            assert ids.is_cuda and ids.shape == (32,)
            narrow = ids == 2
            assert not batch["data"][narrow][..., 6:].any()
            assert batch["data_mask"][~narrow].all()
        for chunk in loader.epoch(2):
            check_pieces(_to_cpu(chunk), recs, stores)


def _to_cpu(chunk):
    class Host(dict):
        pieces = chunk.pieces

    return Host({k: v.cpu() for k, v in chunk.items()})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(30, 400), min_size=1, max_size=4),
    weights=st.lists(st.floats(0.1, 10.0), min_size=4, max_size=4),
    pieces=st.sampled_from([1, 2, 4]),
    sampling=st.sampled_from(["shuffled", "random"]),
    seed=st.integers(0, 2**20),
)
def test_weighted_pieces_stay_inside_one_recording(lengths, weights, pieces, sampling, seed):
    bounds, at = [], 0
    for n in lengths:
        bounds.append((at, at + n))
        at += n
    strata = tuple((a, b, w) for (a, b), w in zip(bounds, weights, strict=False))
    segs = cs.Segments([(a, b, f"r{i}") for i, (a, b) in enumerate(bounds)])
    kw = dict(
        total_timesteps=at,
        chunk_size=40,
        pieces=pieces,
        sampling=sampling,
        segments=segs,
        recordings=strata,
        seed=seed,
        batch_window=5,
    )
    plan, again = cs.PiecePlan(**kw), cs.PiecePlan(**kw)
    n = plan.windows_per_pass or 20
    chunks = plan.chunks(1, np.arange(2 * n))
    assert chunks == again.chunks(1, np.arange(2 * n))
    assert chunks[n:] == [plan.chunk(1, i) for i in range(n, 2 * n)]  # scalar = vectorised
    for chunk in chunks:
        for p in chunk:
            a, b = bounds[p.segment]
            assert a <= p.start < p.stop <= b
