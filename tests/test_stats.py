"""LatencyStats: arithmetic, batch timing, the printed table, TensorBoard scalars, the timeline."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import chunkstream.stats as cstats
from chunkstream.pipeline import ChunkLoader, LoaderOptions
from chunkstream.sources import NumpySource
from chunkstream.stats import ChunkRecord, LatencyStats, plot_timeline


def _record(index: int, wait: float, read: float, nbytes: int, received: float, epoch: int = 0):
    return ChunkRecord(
        epoch=epoch, index=index, start=index * 10, stop=index * 10 + 10, nbytes=nbytes,
        wait_s=wait, read_s=read, queue_depth=index % 3, read_begin=received - read - wait,
        read_end=received - wait, received=received,
    )  # fmt: skip


def test_summary_arithmetic_matches_numpy():
    stats = LatencyStats()
    waits = [0.5, 0.01, 0.02, 0.3, 0.0]
    reads = [0.2, 0.1, 0.4, 0.3, 0.25]
    stats.epoch_started()
    for i, (w, r) in enumerate(zip(waits, reads, strict=True)):
        stats.record_chunk(_record(i, w, r, 1000 * (i + 1), received=10.0 + i))
    stats.epoch_ended()
    s = stats.summary()
    assert s["num_chunks"] == 5
    assert s["wait_mean_ms"] == pytest.approx(1e3 * np.mean(waits))
    assert s["wait_p50_ms"] == pytest.approx(1e3 * np.percentile(waits, 50))
    assert s["wait_p95_ms"] == pytest.approx(1e3 * np.percentile(waits, 95))
    assert s["wait_max_ms"] == pytest.approx(500.0)
    assert s["wait_after_first_mean_ms"] == pytest.approx(1e3 * np.mean(waits[1:]))
    assert s["read_total_ms"] == pytest.approx(1e3 * sum(reads))
    assert s["bytes"] == 15000
    assert s["queue_empty_count"] == 2  # indices 0 and 3
    elapsed = s["elapsed_s"]
    assert elapsed > 0
    assert s["stall_fraction"] == pytest.approx(sum(waits) / elapsed)
    assert s["stall_fraction_after_first"] == pytest.approx(sum(waits[1:]) / elapsed)
    assert s["chunks_per_s"] == pytest.approx(5 / elapsed)
    assert s["gb_per_s"] == pytest.approx(15000 / elapsed / 1e9)
    # each chunk's compute span ends where the next chunk was asked for
    for a, b in zip(stats.chunks, stats.chunks[1:], strict=False):
        assert a.compute_end == pytest.approx(b.received - b.wait_s)
    assert stats.chunks[-1].compute_end is not None


def test_empty_summary_is_zeros():
    s = LatencyStats().summary()
    assert s["num_chunks"] == 0 and s["wait_mean_ms"] == 0.0 and s["stall_fraction"] == 0.0


def test_batch_timer_samples_every_kth_batch_on_cpu():
    stats = LatencyStats()
    timer = stats.batch_timer("cpu", every=3)
    x = torch.randn(64, 64, requires_grad=True)
    spans = []
    for _ in range(10):
        begin = time.perf_counter()
        with timer.batch() as b:
            loss = (x @ x).sum()
            b.mark("forward")
            loss.backward()
            b.mark("backward")
        spans.append(time.perf_counter() - begin)
    assert len(stats.batches) == 4  # batches 0, 3, 6, 9
    for record, span in zip(stats.batches, spans[::3], strict=True):
        assert min(record.forward_s, record.backward_s, record.step_s) >= 0
        assert record.forward_s + record.backward_s + record.step_s <= span
    s = stats.summary()
    assert s["num_batches"] == 4
    assert s["forward_mean_ms"] == pytest.approx(
        1e3 * np.mean([b.forward_s for b in stats.batches])
    )


def test_batch_timer_unmarked_phases_are_zero_and_failures_not_recorded():
    stats = LatencyStats()
    timer = stats.batch_timer("cpu")
    with timer.batch():
        torch.randn(10).sum()
    assert stats.batches[0].forward_s == 0.0 and stats.batches[0].backward_s == 0.0
    with pytest.raises(RuntimeError), timer.batch():
        raise RuntimeError("boom")
    assert len(stats.batches) == 1


def _run_loader(stats: LatencyStats, chunks: int = 6) -> None:
    data = np.arange(4000 * 8, dtype=np.float32).reshape(4000, 8)
    with ChunkLoader(
        NumpySource({"x": data}), 500, device="cpu", seed=3, options=LoaderOptions(stats=stats)
    ) as loader:
        for chunk in loader.epoch(chunks):
            assert torch.equal(chunk["x"], torch.from_numpy(data[chunk.start : chunk.stop]))
            time.sleep(0.005)


def test_loader_fills_stats_and_print_summary(capsys):
    stats = LatencyStats()
    _run_loader(stats)
    assert len(stats.chunks) == 6
    assert all(c.nbytes == 500 * 8 * 4 and c.read_s >= 0 for c in stats.chunks)
    stats.print_summary()
    text = capsys.readouterr().out
    for label in ("consumer wait", "read", "chunks 6", "stall", "GB/s"):
        assert label in text


def test_log_to_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    stats = LatencyStats()
    _run_loader(stats, chunks=4)
    with SummaryWriter(log_dir=str(tmp_path)) as writer:
        stats.log_to(writer, 7)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "latency/stall_fraction" in tags and "latency/read_mean_ms" in tags
    (event,) = acc.Scalars("latency/chunks_per_s")
    assert event.step == 7 and event.value > 0
    (read,) = acc.Scalars("latency/read_mean_ms")
    assert read.value == pytest.approx(stats.summary()["read_mean_ms"], rel=1e-5)


def test_plot_timeline_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    stats = LatencyStats()
    _run_loader(stats)
    path = plot_timeline(stats, tmp_path / "sub" / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_public_names():
    assert cstats.__all__ == sorted(cstats.__all__)
    assert {"LatencyStats", "ChunkRecord", "BatchTimer", "plot_timeline"} <= set(cstats.__all__)


@pytest.mark.gpu
def test_event_timed_batches_and_transfers_on_cuda():
    stats = LatencyStats()
    timer = stats.batch_timer("cuda", every=1)
    x = torch.randn(2048, 2048, device="cuda", requires_grad=True)
    for _ in range(3):
        with timer.batch() as b:
            loss = (x @ x).square().mean()
            b.mark("forward")
            loss.backward()
            b.mark("backward")
    torch.cuda.synchronize()
    stats.resolve_pending()
    assert stats.pending_batches == 0 and len(stats.batches) == 3
    assert all(r.forward_s > 0 and r.backward_s > 0 for r in stats.batches)
    data = np.random.default_rng(0).standard_normal((8192, 256)).astype(np.float32)
    with ChunkLoader(
        NumpySource({"x": data}), 2048, device="cuda", options=LoaderOptions(stats=stats)
    ) as loader:
        for chunk in loader.epoch(4):
            assert chunk["x"].is_cuda
            assert torch.equal(chunk["x"].cpu(), torch.from_numpy(data[chunk.start : chunk.stop]))
    torch.cuda.synchronize()
    s = stats.summary()
    assert s["transfer_mean_ms"] > 0
    assert all(c.transfer_s is not None and c.transfer_end is not None for c in stats.chunks)


def test_plot_timeline_leaves_the_users_backend_alone(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    before = matplotlib.rcParams["backend"]
    matplotlib.use("svg")
    try:
        with ChunkLoader(NumpySource({"x": np.zeros((100, 2), np.float32)}), 10) as loader:
            list(loader.epoch(2))
        plot_timeline(loader.stats, tmp_path / "timeline.png")
        assert matplotlib.get_backend() == "svg"
        assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    finally:
        matplotlib.rcParams["backend"] = before
