"""Resident mode: the reachable rows read once, every later chunk served from the device."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream._errors import ChunkLoadError, ConfigError
from tests.flat import loader_from
from tests.stores import make_array, random_data

T, N = 480, 6


class CountingZarr(cs.ZarrSource):
    """A real zarr source that counts the timesteps read through it."""

    rows_read = 0
    calls = 0
    _lock = threading.Lock()

    def read_into(self, start, stop, out):
        with self._lock:  # readers call it concurrently
            self.calls += 1
            self.rows_read += stop - start
        super().read_into(start, stop, out)


@pytest.fixture
def stores(tmp_path):
    traces = make_array(tmp_path / "traces.zarr", random_data((T, N), "float16"), (40, N))
    mask = make_array(tmp_path / "mask.zarr", random_data((T, N), seed=1) > 0, (30, N),
                      zarr_format=2, codec=None)  # fmt: skip
    return tmp_path, traces, mask


def _joined(tmp_path):
    traces = CountingZarr(tmp_path / "traces.zarr", {"traces": ()})
    mask = cs.ZarrSource(tmp_path / "mask.zarr", {"mask": ()})
    covariates = cs.NumpySource({"cov": random_data((T, 3), seed=2)})
    return traces, cs.JoinSource(traces, mask, covariates)


def _chunks(loader, epochs=3, num=None):
    return [(c.pieces, {k: v.clone() for k, v in c.items()})
            for _ in range(epochs) for c in loader.epoch(num)]  # fmt: skip


@pytest.mark.parametrize(
    "plan",
    [dict(sampling="shuffled"), dict(sampling="random"), dict(pieces=4),
     dict(segments=[(20, 200), (260, 470)], pieces=2, sampling="shuffled")],
    ids=["shuffled", "random", "pieces", "segments"],
)  # fmt: skip
def test_resident_and_streamed_runs_give_identical_chunks(stores, plan):
    tmp_path, traces, mask = stores
    runs = {}
    for resident in (True, False):
        _, source = _joined(tmp_path)
        with loader_from(source, 60, device="cpu", seed=7, **plan, resident=resident) as ld:
            assert ld.mode == ("resident" if resident else "streaming")
            runs[resident] = _chunks(ld, num=5 if plan.get("sampling") == "random" else None)
            state = ld.state_dict()
        runs[resident, "state"] = state
    assert runs[True, "state"] == runs[False, "state"]
    assert len(runs[True]) == len(runs[False]) > 0
    for (pieces_a, a), (pieces_b, b) in zip(runs[True], runs[False], strict=True):
        assert pieces_a == pieces_b
        assert a.keys() == b.keys() == {"traces", "mask", "cov"}
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
        assert a["mask"].dtype == torch.bool and a["traces"].dtype == torch.float16
        for piece in pieces_a:  # and both equal the stores' own rows
            rows = slice(piece.offset, piece.offset + piece.length)
            np.testing.assert_array_equal(
                a["traces"][rows].numpy(), traces[piece.start : piece.stop]
            )
            np.testing.assert_array_equal(a["mask"][rows].numpy(), mask[piece.start : piece.stop])


def test_resident_mode_reads_the_source_once(stores):
    tmp_path = stores[0]
    counter, source = _joined(tmp_path)
    with cs.ChunkLoader(
        source, 50, device="cpu", seed=0, workers=3, options=cs.LoaderOptions(resident=True)
    ) as ld:
        first = list(ld.epoch())
        assert counter.rows_read == T and counter.calls == -(-T // 50)  # every row, once
        del first
        for _ in range(3):
            assert sum(1 for _ in ld.epoch()) == ld.chunks_per_pass
        assert counter.rows_read == T  # no source read after the first epoch
    counter, source = _joined(tmp_path)
    with cs.ChunkLoader(
        source, 50, device="cpu", seed=0, options=cs.LoaderOptions(resident=False)
    ) as ld:
        for _ in range(3):
            list(ld.epoch())
        assert counter.rows_read == 3 * ld.chunks_per_pass * 50  # streaming reads every epoch


def test_resident_segments_hold_only_the_segments_hull(stores):
    counter, source = _joined(stores[0])
    segments = [(100, 220), (300, 400)]
    with cs.ChunkLoader(
        source, 40, device="cpu", options=cs.LoaderOptions(resident=True, segments=segments)
    ) as ld:
        chunks = list(ld.epoch())
        assert chunks and all(p.start >= 100 and p.stop <= 400 for c in chunks for p in c.pieces)
    assert counter.rows_read == 300  # [100, 400), not the whole store


def test_a_resumed_resident_epoch_yields_the_rest(stores):
    counter, source = _joined(stores[0])
    with cs.ChunkLoader(
        source, 40, device="cpu", seed=3, options=cs.LoaderOptions(resident=True)
    ) as ld:
        full = [c.pieces for c in ld.epoch()]
        it = ld.epoch()
        head = [next(it).pieces for _ in range(4)]
        state = ld.state_dict()
    assert counter.rows_read == T  # two epochs, one read
    source = _joined(stores[0])[1]
    with cs.ChunkLoader(
        source, 40, device="cpu", seed=3, options=cs.LoaderOptions(resident=True)
    ) as ld:
        ld.load_state_dict(state)
        rest = [c.pieces for c in ld.epoch()]
    streamed = cs.ChunkLoader(_joined(stores[0])[1], 40, device="cpu", seed=3)
    with streamed:
        list(streamed.epoch())
        expected = [c.pieces for c in streamed.epoch()]
    assert head + rest == expected and len(full) == len(expected)


def test_auto_decides_from_the_budget_and_says_why(stores, caplog):
    source = _joined(stores[0])[1]
    row = sum(s.step_nbytes for s in source.fields.values())
    with (
        caplog.at_level(logging.INFO, logger="chunkstream.pipeline"),
        cs.ChunkLoader(
            source,
            40,
            device="cpu",
            options=cs.LoaderOptions(resident="auto", host_memory=4 * T * row),
        ) as ld,
    ):
        assert ld.mode == "resident" and "fit host_memory" in ld.mode_reason
    assert sum("fit host_memory" in r.message for r in caplog.records) == 1  # said once
    with cs.ChunkLoader(
        source,
        40,
        device="cpu",
        options=cs.LoaderOptions(resident="auto", host_memory=8 * 40 * row),
    ) as ld:
        assert ld.mode == "streaming" and "exceed host_memory" in ld.mode_reason
        assert len(list(ld.epoch())) == ld.chunks_per_pass
    with cs.ChunkLoader(source, 40, device="cpu", options=cs.LoaderOptions(resident="auto")) as ld:
        # no budget given: this rank's share of the job's host memory decides (issue 42)
        assert ld.mode == "resident" and "this rank's host memory" in ld.mode_reason
    with cs.ChunkLoader(source, 40, device="cpu") as ld:  # the default streams
        assert ld.mode == "streaming"


def test_resident_refuses_a_budget_it_does_not_fit(stores):
    source = _joined(stores[0])[1]
    row = sum(s.step_nbytes for s in source.fields.values())
    with pytest.raises(ConfigError, match=r"resident=True is invalid.*exceed host_memory.*auto"):
        cs.ChunkLoader(
            source,
            40,
            device="cpu",
            options=cs.LoaderOptions(resident=True, host_memory=8 * 40 * row),
        )
    with pytest.raises(ConfigError, match="host_memory"):  # below one chunk: today's error
        cs.ChunkLoader(
            source, 40, device="cpu", options=cs.LoaderOptions(resident=True, host_memory=10 * row)
        )
    with pytest.raises(ConfigError, match=r"resident='yes' is invalid.*'auto', True or False"):
        cs.ChunkLoader(source, 40, device="cpu", options=cs.LoaderOptions(resident="yes"))


def test_a_failed_load_names_the_window_and_closes_the_loader(tmp_path):
    data = random_data((200, 4))

    def load(start, stop):
        if start <= 130 < stop:
            raise OSError("disk gone")
        return (data[start:stop],)

    source = cs.CallableSource(load, 200, ("x",))
    ld = cs.ChunkLoader(
        source, 50, device="cpu", options=cs.LoaderOptions(resident=True, read_retries=0)
    )
    with pytest.raises(ChunkLoadError, match=r"\[100, 150\).*disk gone"):
        next(iter(ld.epoch()))
    assert ld.closed


def test_a_load_that_hangs_is_a_stall_and_a_failed_load_does_not_read_the_rest(tmp_path):
    # A read that never returns: the first epoch() raises LoaderStalledError after
    # stall_timeout (with the stuck reader's stack) instead of waiting forever.
    release, calls = threading.Event(), []
    data = random_data((200, 4))

    def load(start, stop):
        if (start, stop) == (0, 50):  # not CallableSource's probe of the shapes
            release.wait(30)
        return (data[start:stop],)

    source = cs.CallableSource(load, 200, ("x",))
    ld = cs.ChunkLoader(
        source,
        50,
        device="cpu",
        workers=1,
        options=cs.LoaderOptions(resident=True, stall_timeout=0.5),
    )
    try:
        with pytest.raises(cs.LoaderStalledError, match="stall_timeout") as info:
            next(iter(ld.epoch()))
        assert info.value.window == (0, 200) and "load" in str(info.value)
        assert ld.closed
    finally:
        release.set()

    # One reader: the first failure ends the load; blocks not yet started are cancelled.
    def failing(start, stop):
        if stop - start < 50:  # CallableSource's probe of the shapes
            return (data[start:stop],)
        calls.append(start)
        if start > 0:
            time.sleep(0.5)  # the loader sees block 0's error while block 1 is read
        raise OSError("disk gone")

    ld = cs.ChunkLoader(cs.CallableSource(failing, 200, ("x",)), 50, device="cpu", workers=1, options=cs.LoaderOptions(resident=True, read_retries=0))  # fmt: skip
    with pytest.raises(ChunkLoadError, match=r"\[0, 50\).*disk gone"):
        next(iter(ld.epoch()))
    assert ld.closed and calls[0] == 0 and len(calls) <= 2


def test_resident_on_a_device_without_cuda_streams_nothing_after_the_load(stores):
    counter, source = _joined(stores[0])
    with cs.ChunkLoader(
        source, 60, device="meta", seed=1, options=cs.LoaderOptions(resident=True, pieces=3)
    ) as ld:
        chunks = [c for _ in range(2) for c in ld.epoch()]
        assert all(c["traces"].device.type == "meta" and c["traces"].shape == (60, N)
                   for c in chunks)  # fmt: skip
    assert counter.rows_read == T


@pytest.mark.gpu
def test_resident_on_cuda_matches_streaming(stores):
    tmp_path = stores[0]
    runs = []
    for resident in (True, False):
        counter, source = _joined(tmp_path)
        with cs.ChunkLoader(
            source, 60, device="cuda", seed=5, options=cs.LoaderOptions(resident=resident, pieces=2)
        ) as ld:
            runs.append([(c.pieces, {k: v.cpu() for k, v in c.items()}) for _ in range(2)
                         for c in ld.epoch()])  # fmt: skip
            if resident:
                assert ld.mode == "resident" and counter.rows_read == T
    for (pa, a), (pb, b) in zip(*runs, strict=True):
        assert pa == pb and all(torch.equal(a[k], b[k]) for k in a)
