"""The loader's spans as a Chrome/Perfetto trace, and profiler ranges from worker threads."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.stats._latency import ChunkRecord
from chunkstream.stats._trace import COPY, READ, WAIT, chrome_trace, profiled
from tests.stores import make_array, random_data


def _tracks(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}  # fmt: skip


def _complete(trace: dict, name: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == name]


def _no_overlap(events: list[dict]) -> bool:
    by_track: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    return all(
        a_end <= b_begin + 1e-3
        for spans in by_track.values()
        for (_, a_end), (b_begin, _) in zip(sorted(spans), sorted(spans)[1:], strict=False)
    )


def test_export_trace_of_an_epoch_on_real_stores(tmp_path):
    data = random_data((400, 8))
    make_array(tmp_path / "a.zarr", data, (25, 8), codec="zstd")
    source = cs.ZarrSource(tmp_path / "a.zarr")
    with cs.ChunkLoader(
        source, 50, device="cpu", workers=3, seed=1, options=cs.LoaderOptions(close_source=True)
    ) as ld:
        for _ in range(2):
            for chunk in ld.epoch():
                np.testing.assert_array_equal(chunk["data"].numpy(), data[chunk.start : chunk.stop])
        records = list(ld.stats.chunks)
        path = ld.stats.export_trace(tmp_path / "out" / "trace.json")
    trace = json.loads(path.read_text())  # parses as JSON
    assert set(trace) >= {"traceEvents"}
    tracks = _tracks(trace)
    reads, waits = _complete(trace, READ), _complete(trace, WAIT)
    assert len(reads) == len(waits) == len(records) == 16  # one per chunk and stage
    assert not _complete(trace, COPY)  # a CPU run copies nothing
    readers = {tracks[e["tid"]] for e in reads}
    assert readers and all(name.startswith("chunkstream-read-") for name in readers)
    assert len(readers) <= 3
    assert {tracks[e["tid"]] for e in waits} == {"consumer"}
    assert _no_overlap(reads) and _no_overlap(waits)  # a thread does one thing at a time
    windows = sorted((e["args"]["epoch"], e["args"]["index"], e["args"]["start"],
                      e["args"]["stop"]) for e in reads)  # fmt: skip
    assert windows == sorted((r.epoch, r.index, r.start, r.stop) for r in records)
    assert all(e["args"]["bytes"] == 50 * 8 * 4 for e in reads)
    assert min(e["ts"] for e in reads + waits) == 0.0


def _record(i: int, begin: float, **kwargs) -> ChunkRecord:
    fields = dict(epoch=0, index=i, start=10 * i, stop=10 * i + 10, nbytes=40, wait_s=0.01,
                  read_s=0.2, queue_depth=0, read_begin=begin, read_end=begin + 0.2,
                  received=begin + 0.5)  # fmt: skip
    fields.update(kwargs)
    return ChunkRecord(**fields)


def test_copies_go_on_the_transfer_track_and_unnamed_reads_are_packed():
    records = [
        _record(
            0, 0.0, transfer_begin=0.25, transfer_end=0.3, transfer_thread="chunkstream-transfer-0"
        ),
        _record(1, 0.1),  # overlaps read 0: a second lane
        _record(2, 0.15, transfer_begin=0.4, transfer_end=None),  # a third; copy unresolved
        _record(3, 0.21),  # read 0 has ended: back on the first lane
    ]
    trace = chrome_trace(records)
    tracks = _tracks(trace)
    copies = _complete(trace, COPY)
    assert [tracks[e["tid"]] for e in copies] == ["chunkstream-transfer-0"]
    assert copies[0]["ts"] == pytest.approx(0.25e6) and copies[0]["dur"] == pytest.approx(0.05e6)
    reads = _complete(trace, READ)
    assert _no_overlap(reads)
    assert sorted({tracks[e["tid"]] for e in reads}) == ["reader 0", "reader 1", "reader 2"]
    assert tracks[0] == "consumer"


def test_profiled_is_a_shared_no_op_without_a_profiler():
    assert profiled(READ, (0, 5)) is profiled(WAIT)


def test_torch_profiler_sees_ranges_from_worker_threads(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    done = threading.Event()

    def reader() -> None:
        with profiled(READ, (3, 9)):
            torch.ones(64).sum()
        done.set()

    with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        worker = threading.Thread(target=reader, name="chunkstream-read-0")
        worker.start()
        worker.join(30)
        with profiled(WAIT, (3, 9)):
            torch.ones(8).sum()
    assert done.is_set()
    prof.export_chrome_trace(str(tmp_path / "profile.json"))
    events = json.loads((tmp_path / "profile.json").read_text())["traceEvents"]
    named = {e["name"]: e for e in events if str(e.get("name", "")).startswith("chunkstream.")}
    assert set(named) == {"chunkstream.read [3, 9)", "chunkstream.wait [3, 9)"}
    # the read was recorded on the worker's own thread, not the profiling one
    assert named["chunkstream.read [3, 9)"]["tid"] != named["chunkstream.wait [3, 9)"]["tid"]


@pytest.mark.gpu
def test_cuda_copies_are_in_the_trace(tmp_path):
    source = cs.NumpySource({"x": random_data((800, 64))})
    with cs.ChunkLoader(source, 100, device="cuda", workers=2, seed=0) as loader:
        n = sum(1 for _ in loader.epoch())
        torch.cuda.synchronize()
        trace = json.loads(loader.stats.export_trace(tmp_path / "t.json").read_text())
    tracks = _tracks(trace)
    copies = _complete(trace, COPY)
    assert len(copies) == len(_complete(trace, READ)) == n == 8
    assert {tracks[e["tid"]] for e in copies} == {"chunkstream-transfer-0"}
    assert _no_overlap(copies)


def _profiled_epoch(tmp_path, loader: cs.ChunkLoader) -> tuple[list[dict], list[tuple[int, int]]]:
    """The ``chunkstream.*`` events of a torch.profiler run over one epoch, and its windows."""
    from torch.profiler import ProfilerActivity, profile

    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        windows = [(chunk.start, chunk.stop) for chunk in loader.epoch()]
    prof.export_chrome_trace(str(tmp_path / "profile.json"))
    events = json.loads((tmp_path / "profile.json").read_text())["traceEvents"]
    return [e for e in events if str(e.get("name", "")).startswith("chunkstream.")], windows


def test_a_profiled_epoch_shows_reads_from_reader_threads_and_waits_from_the_consumer(tmp_path):
    make_array(tmp_path / "a.zarr", random_data((300, 8)), (25, 8), codec="zstd")
    source = cs.ZarrSource(tmp_path / "a.zarr")
    with cs.ChunkLoader(
        source, 50, device="cpu", workers=2, seed=3, options=cs.LoaderOptions(close_source=True)
    ) as ld:
        events, windows = _profiled_epoch(tmp_path, ld)
    names = {e["name"] for e in events}
    assert {f"{READ} [{a}, {b})" for a, b in windows} <= names
    assert {f"{WAIT} [{a}, {b})" for a, b in windows} <= names
    read_tids = {e["tid"] for e in events if e["name"].startswith(READ)}
    wait_tids = {e["tid"] for e in events if e["name"].startswith(WAIT)}
    assert len(wait_tids) == 1 and not read_tids & wait_tids  # the readers' own threads


def test_a_profiled_epoch_on_a_device_shows_copies_from_the_transfer_thread(tmp_path):
    source = cs.NumpySource({"x": random_data((200, 4))})
    with cs.ChunkLoader(source, 50, device="meta", workers=2, seed=0) as ld:
        events, windows = _profiled_epoch(tmp_path, ld)
    copies = [e for e in events if e["name"].startswith(COPY)]
    assert sorted(e["name"] for e in copies) == sorted(f"{COPY} [{a}, {b})" for a, b in windows)
    assert len({e["tid"] for e in copies}) == 1
    assert not {e["tid"] for e in copies} & {e["tid"] for e in events if e["name"].startswith(READ)}
