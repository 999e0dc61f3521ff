"""The shuffle buffer's host tier (``BatchStream(buffer=)``) and the bounded host gather."""

from __future__ import annotations

import itertools
import json
import threading

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream._memory._buffer import BufferInfo, choose_tier, quality_note
from chunkstream.pipeline._held import copy_windows
from tests.flat import loader_from, stream_from
from tests.stores import make_array

T = 2000
GRID = 16
WINDOW = 5


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Column 0 is the timestep, column 1 a second channel; a float16 field beside it."""
    path = tmp_path_factory.mktemp("host_tier") / "x.zarr"
    t = np.arange(T, dtype=np.float32)
    make_array(path, np.stack([t, np.sin(t)], axis=1), (GRID, 2))
    source = cs.ZarrSource(path)
    yield source
    source.close()


def _loader(source, **kwargs):
    options = {"device": "cpu", "workers": 2, "prefetch": 2, "sampling": "shuffled", "seed": 3,
               "pieces": 4, "window": WINDOW}  # fmt: skip
    return loader_from(source, 256, **{**options, **kwargs})


def _stream(loader, **kwargs):
    options = {"window": WINDOW, "batch_size": 16, "batches_per_chunk": 4, "chunks_per_epoch": 6,
               "fields": "data", "mix": 3}  # fmt: skip
    return stream_from(loader, **{**options, **kwargs})


def _epochs(stream, n):
    return [b.clone() for _ in range(n) for b in stream]


# -- the same windows on both tiers ------------------------------------------------------


@pytest.mark.parametrize(("mix", "pieces"), [(1, 1), (3, 4), (8, 2)])
def test_both_tiers_draw_the_same_windows_for_the_same_seed(store, mix, pieces):
    with _loader(store, pieces=pieces) as loader:
        device = _epochs(_stream(loader, mix=mix, buffer="device"), 3)
    with _loader(store, pieces=pieces) as loader:
        stream = _stream(loader, mix=mix, buffer="host", batch_prefetch=3, gather_threads=3)
        host = _epochs(stream, 3)
        assert stream.buffer.tier == "host"
    assert len(device) == len(host) == 3 * 24
    for a, b in zip(device, host, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_host_batches_are_the_source_windows_in_the_compute_dtype(store):
    with _loader(store) as loader:
        stream = _stream(loader, fields=None, dtype=torch.float64, buffer="host")
        for batch in itertools.islice(iter(stream), 10):
            x = batch["data"]
            assert x.dtype == torch.float64 and x.shape == (16, WINDOW, 2)
            for w in x.numpy():
                t0 = int(w[0, 0])
                np.testing.assert_array_equal(w[:, 0], np.arange(t0, t0 + WINDOW))
                np.testing.assert_allclose(w[:, 1], np.sin(np.arange(t0, t0 + WINDOW,
                                                                     dtype=np.float32)))  # fmt: skip


def test_a_held_host_batch_is_never_overwritten(store):
    """Batches are views of reused slots: a slot is refilled only once nobody holds it."""
    with _loader(store) as loader:
        stream = _stream(loader, buffer="host", batch_prefetch=2)
        held, copies = [], []
        for k, batch in enumerate(_epochs_iter(stream, 2)):
            if k % 3 == 0:  # hold every third batch, drop the others at once
                held.append(batch)
                copies.append(batch.clone())
        slots = stream._tier.lane._pool
        assert slots.allocated < 2 * 24 - len(held)  # the dropped batches' slots were reused
    for a, b in zip(held, copies, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _epochs_iter(stream, n):
    for _ in range(n):
        yield from stream


# -- exact resume mid-buffer on the host tier ---------------------------------------------


@pytest.mark.parametrize(("mix", "cut", "prefetch"), [(3, 5, 2), (8, 45, 0), (3, 13, 4)])
def test_resume_on_the_host_tier_is_exact_mid_buffer(store, mix, cut, prefetch):
    kw = {"mix": mix, "buffer": "host", "batch_prefetch": prefetch}
    with _loader(store) as loader:
        full = _epochs(_stream(loader, **kw), 3)
    with _loader(store) as loader:
        stream = _stream(loader, **kw)
        head: list[torch.Tensor] = []
        while len(head) < cut:
            it = iter(stream)
            head += [b.clone() for b in itertools.islice(it, cut - len(head))]
        state = stream.state_dict()
        device_state = _stream(loader, mix=mix, buffer="device").state_dict()
    assert set(state) == set(device_state)  # the same state on both tiers: a few integers
    with _loader(store) as loader:
        stream = _stream(loader, **kw)
        stream.load_state_dict(state)
        tail = [b.clone() for b in stream]
        while len(head) + len(tail) < len(full):
            tail += [b.clone() for b in stream]
    for a, b in zip(head + tail, full, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_host_state_resumes_on_the_device_tier(store):
    with _loader(store) as loader:
        stream = _stream(loader, buffer="host")
        it = iter(stream)
        head = [b.clone() for b in itertools.islice(it, 7)]
        state = stream.state_dict()
        rest = [b.clone() for b in it]
    with _loader(store) as loader:
        stream = _stream(loader, buffer="device")
        stream.load_state_dict(state)
        tail = [b.clone() for b in stream]
    assert len(head) == 7
    for a, b in zip(rest, tail, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# -- the batch read -----------------------------------------------------------------------


def _reference(x: torch.Tensor, starts: list[int], window: int) -> torch.Tensor:
    return torch.stack([x[s : s + window] for s in starts])


@pytest.mark.parametrize(
    ("dtype", "shape", "target"),
    [
        (torch.float32, (300, 7), None),
        (torch.float16, (300, 3, 5), torch.float32),
        (torch.bfloat16, (300, 4), None),
        (torch.float32, (300, 4), torch.bfloat16),
        (torch.int64, (300,), torch.float32),  # integer fields keep their dtype
        (torch.bool, (300, 2), None),
    ],
)
def test_the_cpu_gather_equals_a_reference_gather(dtype, shape, target):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=g) * 50).to(dtype)
    starts = torch.randint(0, 300 - 9 + 1, (200,), generator=g)
    expected = _reference(x, starts.tolist(), 9)
    if target is not None and dtype.is_floating_point:
        expected = expected.to(target)
    out = torch.empty(expected.shape, dtype=expected.dtype)
    copy_windows(x, out, starts.tolist(), 9)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(cs.gather_windows(x, starts, 9, dtype=target), expected,
                               rtol=0, atol=0)  # fmt: skip


def test_the_cpu_gather_reads_a_strided_tensor_and_fills_out():
    x = torch.randn(400, 6)[:, ::2]  # not contiguous
    starts = torch.tensor([0, 390, 17, 17, 5])
    out = torch.empty(5, 10, 3)
    assert cs.gather_windows(x, starts, 10, out=out) is out
    torch.testing.assert_close(out, _reference(x, starts.tolist(), 10), rtol=0, atol=0)


def test_a_start_out_of_range_is_refused_naming_starts():
    x = torch.zeros(50, 2)
    with pytest.raises(cs.ConfigError, match="starts"):
        cs.gather_windows(x, torch.tensor([0, 46]), 5)
    with pytest.raises(cs.ConfigError, match="starts"):
        cs.gather_windows(x, torch.tensor([-1]), 5)


def test_a_tensor_that_requires_grad_keeps_its_graph():
    x = torch.randn(40, 3, requires_grad=True)
    cs.gather_windows(x, torch.tensor([1, 30]), 4).sum().backward()
    assert x.grad is not None and x.grad.sum() == 2 * 4 * 3


def _kinds_of_thread(names: set[str]) -> set[str]:
    return {n.rsplit("-", 1)[0] for n in names if n.startswith("chunkstream-")}


def test_host_batches_are_read_on_the_loaders_batch_threads_and_stop_with_it(store):
    """One default batch's trip: the loader's executors (readers, batch readers) and the
    consumer's thread; no thread of the stream's own; none left after close()."""
    seen: set[str] = set()
    with _loader(store) as loader:
        stream = _stream(loader, buffer="host", gather_threads=2)
        for batch in stream:
            seen |= {t.name for t in threading.enumerate()}
            del batch
        # (the zarr source's decode pool is the source's, not the batch's)
        kinds = _kinds_of_thread(seen) - {"chunkstream-decode"}
        assert kinds <= {"chunkstream-read", "chunkstream-batch"}, seen
        assert "chunkstream-batch" in _kinds_of_thread(seen)
        assert len([t for t in loader.threads if t.name.startswith("chunkstream-batch")]) == 2
    loaders = ("chunkstream-read", "chunkstream-batch", "chunkstream-transfer")
    assert not [t for t in threading.enumerate() if t.name.startswith(loaders)]


# -- what the user is told, and refusals --------------------------------------------------


def test_buffer_info_says_tier_bytes_share_and_pieces(store):
    with _loader(store, pieces=4) as loader:
        stream = _stream(loader, mix=3, fields=None)
        info = stream.buffer
        assert isinstance(info, BufferInfo)
        assert (info.tier, info.mix, info.pieces) == ("host", 3, 12)
        assert info.nbytes == 3 * 256 * 2 * 4  # three chunks of (256, 2) float32
        assert info.split_share == pytest.approx(3 / loader.chunks_per_pass)
        text = info.describe()
        assert "host tier" in text and "mix=3" in text and "12 pieces" in text
        device = _stream(loader, mix=3, buffer="device").buffer
        assert device.tier == "device" and "buffer='device'" in device.reason


def test_mix_auto_on_the_host_tier_fits_the_budget_up_to_the_whole_split(store):
    with _loader(store) as loader:
        per_chunk = 256 * 2 * 4
        stream = _stream(loader, fields=None, mix="auto", host_memory=3 * per_chunk + 5)
        assert stream.mix == 3 and "host_memory" in stream.buffer.reason
        whole = _stream(loader, fields=None, mix="auto")  # default budget: far more than T
        assert whole.mix == loader.chunks_per_pass and whole.buffer.split_share == 1.0
        assert whole.buffer.note == ""


def test_below_a_tenth_of_the_split_the_note_gives_the_measured_cost():
    assert "~6%" in quality_note(0.02)
    assert "~2-3%" in quality_note(0.08)
    assert quality_note(0.10) == quality_note(0.5) == ""


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"buffer": "gpu"}, "buffer"),
        ({"batch_prefetch": -1}, "batch_prefetch"),
        ({"gather_threads": 0}, "gather_threads"),
        ({"host_memory": 0}, "host_memory"),
        ({"mix": "most"}, "mix"),
        ({"device": "meta"}, "device"),
    ],
)
def test_bad_host_tier_settings_are_refused_by_name(store, kwargs, name):
    with _loader(store) as loader, pytest.raises(cs.ConfigError, match=name):
        _stream(loader, **kwargs)


def test_tier_refusals_name_the_fix():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    with pytest.raises(cs.ConfigError, match="device='cpu'"):
        choose_tier("host", cuda, loader_device=cuda)
    with pytest.raises(cs.ConfigError, match="buffer='host'"):
        choose_tier("device", cuda, loader_device=cpu)
    with pytest.raises(cs.ConfigError, match="device"):
        choose_tier("auto", cpu, loader_device=cuda)
    with pytest.raises(cs.ConfigError, match="'auto', 'host', 'device'"):
        choose_tier("gpu", cuda)
    assert choose_tier("auto", cuda, loader_device=cpu)[0] == "host"
    assert choose_tier("auto", cuda, loader_device=cuda)[0] == "device"


# -- chunkstream plan ---------------------------------------------------------------------


def test_plan_prints_the_buffer_tier_share_pieces_and_the_quality_note(capsys):
    from chunkstream.cli import main

    base = ["plan", "--shape", "196608,128", "--chunk-size", "1024", "--batch-size", "64",
            "--window", "9", "--pieces", "8"]  # fmt: skip
    assert main([*base, "--mix", "4", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "shuffle buffer: host tier, mix=4 chunks" in out and "32 pieces" in out
    assert "2.1% of the split" in out and "~6% worse validation loss" in out
    assert main([*base, "--mix", "auto", "--buffer", "host", "--host-mem", "1GB", "--json"]) == 0
    buffer = json.loads(capsys.readouterr().out)["buffer"]
    assert buffer["tier"] == "host" and buffer["mix"] == 192 and buffer["split_share"] == 1.0
    assert buffer["note"] == "" and "host_memory=1 GB" in buffer["reason"]


def test_the_demo_table_gives_the_buffer_share_of_the_split():
    from chunkstream.cli._demo import _buffer_share

    assert _buffer_share({"mixer": 2 * 10**6, "train_split": 100 * 10**6}) == 0.02
    assert _buffer_share({"mixer": 0, "train_split": 10**6}) == 0.0
    assert "~6%" in quality_note(_buffer_share({"mixer": 2, "train_split": 100}))


def test_the_busy_gather_benchmark_runs_and_reports_each_arm(capsys):
    from benchmarks import gather_busy

    gather_busy.main(["--quick", "--seconds", "0.2", "--rounds", "1"])
    out = capsys.readouterr().out
    for arm in ("before", "device", "host"):
        assert f"| {arm} |" in out
    assert "busy/idle batches/s >= 0.25" in out and "device tier idle batches/s >= 0.9" in out


def test_breaking_out_with_batches_gathered_ahead_gives_their_slots_back(store):
    with _loader(store) as loader:
        stream = _stream(loader, buffer="host", batch_prefetch=3)
        for _ in range(5):
            for k, batch in enumerate(stream):
                del batch
                if k == 2:
                    break  # three batches gathered ahead are abandoned
        whole = [b.clone() for b in stream]
        assert len(whole) == 24
        assert stream._tier.lane._pool.allocated <= 3 + 2 + 2  # the arena's slots, little more


def test_the_default_gather_threads_are_this_ranks_share_of_the_cores(monkeypatch):
    from chunkstream._memory import thread_budget
    from chunkstream.pipeline._lane import default_gather_threads

    cores = thread_budget()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_gather_threads() == max(1, min(4, cores))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))
    assert default_gather_threads() == 1  # more ranks than cores: the caller alone


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_a_gather_in_the_callers_loop_splits_over_an_open_cpu_loaders_readers(monkeypatch, budget):
    """``cs.gather_windows`` on the CPU with a CPU loader open splits a batch's windows over
    the caller and the loader's readers (issue 47: the readers, idle between chunks, are the
    loader's own threads); the batch is bit-exact whoever copied which part (parts a reader
    has not started are copied by the caller), and with the loader closed the caller copies
    it alone. No assertion on which thread copied what."""
    from chunkstream.pipeline import _held

    monkeypatch.setattr(_held, "thread_budget", lambda: budget)
    data = torch.randn(4096, 512)
    starts = torch.randint(0, 4096 - 32 + 1, (96,))
    want = torch.stack([data[s : s + 32] for s in starts.tolist()])
    assert want.nbytes >= _held.SPLIT_FROM
    source = cs.NumpySource({"x": np.zeros((1024, 4), np.float32)})
    with cs.ChunkLoader(source, 256, device="cpu", workers=2) as loader:
        for _ in loader.epoch(2):  # the readers at work beside the gathers too
            assert torch.equal(cs.gather_windows(data, starts, 32), want)
        out = torch.empty_like(want)
        for _ in range(5):
            assert cs.gather_windows(data, starts, 32, out=out) is out
            assert torch.equal(out, want)
    assert loader._executors[0].closed
    assert torch.equal(cs.gather_windows(data, starts, 32), want)  # the caller alone
    assert not [t.name for t in threading.enumerate() if t.name.startswith("chunkstream-read")]


def test_a_failed_part_of_a_split_gather_is_raised_in_the_caller(monkeypatch):
    """A part copied on a reader that raises reaches the caller as that error."""
    from chunkstream.pipeline import _held

    monkeypatch.setattr(_held, "thread_budget", lambda: 2)
    real = _held.copy_windows

    def fails_on_readers(src, out, starts, window):
        if threading.current_thread().name.startswith("chunkstream-read"):
            raise OSError("injected: a part failed on a reader")
        real(src, out, starts, window)

    monkeypatch.setattr(_held, "copy_windows", fails_on_readers)
    data = torch.randn(4096, 512)
    starts = torch.randint(0, 4096 - 32 + 1, (96,))
    source = cs.NumpySource({"x": np.zeros((1024, 4), np.float32)})
    with cs.ChunkLoader(source, 256, device="cpu", workers=1) as loader:
        list(loader.epoch(1))
        for _ in range(20):  # a reader takes a part in some of them (which: not asserted)
            try:
                got = cs.gather_windows(data, starts, 32)
            except OSError as exc:
                assert "injected" in str(exc)
            else:
                assert torch.equal(got, torch.stack([data[s : s + 32] for s in starts.tolist()]))


def test_a_split_gather_copies_the_parts_readers_closed_since_they_were_picked_refuse(
    monkeypatch,
):
    """Readers picked while open but closed before the parts reach them (a loader closed
    from another thread) refuse the parts: the caller copies them, and the batch is whole."""
    import weakref

    from chunkstream._executor import Executor
    from chunkstream.pipeline import _held

    class ClosedAfterPicked(Executor):
        closed = property(lambda self: False)  # open when picked, closed at submit

    readers = ClosedAfterPicked("read", 1)
    readers.close(0.0)
    monkeypatch.setattr(_held, "_LENT", weakref.WeakSet([readers]))
    monkeypatch.setattr(_held, "thread_budget", lambda: 2)
    data = torch.randn(4096, 512)
    starts = torch.randint(0, 4096 - 32 + 1, (96,))
    want = torch.stack([data[s : s + 32] for s in starts.tolist()])
    assert torch.equal(cs.gather_windows(data, starts, 32), want)
