"""The CUDA path: pinned slots, the transfer stream, events and memory bounds (needs a GPU)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from tests.faults import ArraySource, make_arrays, wait_for_no_threads

pytestmark = [
    pytest.mark.gpu,
    # A failed cudaHostRegister falls back to torch's pinned memory with a warning; shown,
    # not raised, so the other tests still run (test_pinned_arena_* then fails on it).
    pytest.mark.filterwarnings("always:chunkstream. cudaHostRegister:RuntimeWarning"),
]


def test_device_chunks_equal_the_stored_bytes():
    arrays = make_arrays(4000, neurons=256)
    with cs.ChunkLoader(ArraySource(arrays), 500, device="cuda", workers=2, seed=1) as loader:
        for _ in range(3):
            for chunk in loader.epoch(8):
                assert chunk["voltage"].is_cuda
                # The current stream already waits for the copy: no explicit sync needed
                # for kernels; .cpu() synchronises with the current stream.
                np.testing.assert_array_equal(
                    chunk["voltage"].cpu().numpy(), arrays["voltage"][chunk.start : chunk.stop]
                )


def test_pieced_chunks_on_the_device_hold_the_slices_their_pieces_name():
    arrays = make_arrays(4000, neurons=64)
    segments = [(0, 1500), (1600, 4000)]
    with cs.ChunkLoader(ArraySource(arrays), 512, device="cuda", seed=3, options=cs.LoaderOptions(pieces=8, segments=segments, window=9)) as loader:  # fmt: skip
        for chunk in loader.epoch(6):
            x = chunk["voltage"].cpu().numpy()
            for p in chunk.pieces:
                np.testing.assert_array_equal(
                    x[p.offset : p.offset + p.length], arrays["voltage"][p.start : p.stop]
                )
            starts = cs.sample_windows(chunk, batch_size=64, window=9)
            assert starts.is_cuda  # the start table lives on the device: no host copy per batch
            batch = cs.gather_windows(chunk["voltage"], starts, 9).cpu().numpy()
            for s, w in zip(starts.tolist(), batch, strict=True):
                p = next(p for p in chunk.pieces if p.offset <= s < p.offset + p.length)
                assert s + 9 <= p.offset + p.length
                t = p.start + s - p.offset
                np.testing.assert_array_equal(w, arrays["voltage"][t : t + 9])


def _loader_peak(loader, *, drop: bool, epochs: int = 3, n: int = 10) -> int:
    """The allocator's true peak over ``epochs`` epochs, above what was allocated before."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    peak = 0
    for _ in range(epochs):
        torch.cuda.reset_peak_memory_stats()
        for chunk in loader.epoch(n):
            time.sleep(0.01)  # let the transfer stage run ahead as far as it may
            if drop:
                del chunk  # as the trainer does: nothing held while next() runs
        torch.cuda.synchronize()
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
    return peak


def test_pinned_pool_is_fixed_and_device_memory_bounded():
    arrays = make_arrays(20000, neurons=512)
    with cs.ChunkLoader(
        ArraySource(arrays), 2000, device="cuda", prefetch=2, gpu_prefetch=1, workers=2
    ) as loader:
        pinned = loader.pinned_bytes
        requested = loader.config.slots * loader.chunk_bytes
        # The true arena size: the slots, each field aligned to 256 B, one page rounding.
        assert requested <= pinned <= requested + 2 * 256 * loader.config.slots + 4096
        gp = loader.config.gpu_prefetch
        # A chunk's device bytes: each field's tensor as the caching allocator holds it
        # (rounded up to 512 B), so the bound is exact rather than loose.
        cb = sum(-(-(2000 * a[0].nbytes) // 512) * 512 for a in arrays.values())
        assert 0 <= cb - loader.chunk_bytes < 512 * len(arrays)
        # The documented bounds (README "Memory bounds"): gpu_prefetch + 1 chunks for a
        # loop that drops each chunk before asking for the next ...
        assert _loader_peak(loader, drop=True) <= (gp + 1) * cb
        # ... and one more for a plain for loop, which holds the previous chunk in next().
        assert _loader_peak(loader, drop=False) <= (gp + 2) * cb
        assert loader.pinned_bytes == pinned  # fixed for the loader's life


def test_transfer_time_is_measured_with_events():
    arrays = make_arrays(8000, neurons=512)
    with cs.ChunkLoader(ArraySource(arrays), 1000, device="cuda") as loader:
        for _ in loader.epoch(6):
            pass
        torch.cuda.synchronize()
        summary = loader.stats.summary()
    assert summary["transfer_mean_ms"] > 0


def test_error_during_the_copy_reaches_the_consumer(monkeypatch):
    arrays = make_arrays(4000)
    with cs.ChunkLoader(ArraySource(arrays), 500, device="cuda") as loader:
        original = torch.Tensor.copy_

        def failing_copy(self, *args, **kwargs):
            if self.is_cuda:
                raise RuntimeError("injected copy failure")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "copy_", failing_copy)
        with pytest.raises(cs.ChunkLoadError, match="copying window") as info:
            list(loader.epoch(4))
        assert "injected copy failure" in str(info.value.__cause__)


# -- issue 13: the CUDA review's defects, each caught on a real device -------------------------


def _cycles_per_ms() -> float:
    """GPU clock cycles per ms of ``torch.cuda._sleep``, measured with events."""
    torch.cuda._sleep(1_000_000)  # warm-up
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / begin.elapsed_time(end)


@pytest.fixture
def slow_copies(monkeypatch):
    """Every host-to-device ``copy_`` first spins the current stream for ``delay_ms``.

    The copy itself still starts only after the spin, on the device, so a consumer
    that did not wait for it, or a reader that refilled its slot early, reads or
    writes memory under a copy that has not happened yet. ``host_s`` collects the
    host time each real copy call took (a blocking copy takes the spin's time).
    """
    original = torch.Tensor.copy_
    cycles = {"per_ms": _cycles_per_ms()}
    state = {"delay_ms": 20.0, "host_s": [], "pinned": []}

    def copy(self, src, non_blocking=False):
        if self.is_cuda and not src.is_cuda:
            state["pinned"].append(src.is_pinned())
            torch.cuda._sleep(int(cycles["per_ms"] * state["delay_ms"]))
            begin = time.perf_counter()
            out = original(self, src, non_blocking)
            state["host_s"].append(time.perf_counter() - begin)
            return out
        return original(self, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    return state


def _expected_sums(arrays, windows, name="voltage"):
    return np.array([arrays[name][a:b].astype(np.float64).sum() for a, b in windows])


@pytest.mark.parametrize("rep", range(3))
def test_slots_are_reused_only_after_their_copy_under_a_slowed_copy(slow_copies, rep):
    # Two slots for two readers, each copy delayed 20 ms on the device: readers wait for
    # slots all the time; one handed out before its copy finished gets overwritten by the
    # next window, and the device-side checksums then disagree with the stored bytes.
    # Three times (different seeds): before reads took slots in window order, one run in
    # four hung here on an H200 (a later read held the slot an earlier one waited for).
    arrays = make_arrays(12000, neurons=256, seed=3)
    sums, windows = [], []
    with cs.ChunkLoader(
        ArraySource(arrays),
        500,
        device="cuda",
        workers=2,
        gpu_prefetch=2,
        seed=4 + rep,
        options=cs.LoaderOptions(host_slots=2),
    ) as loader:
        for _ in range(2):
            for chunk in loader.epoch(12):
                sums.append(chunk["voltage"].double().sum())  # on the device, no sync
                windows.append((chunk.start, chunk.stop))
                del chunk
        got = torch.stack(sums).cpu().numpy()
    np.testing.assert_allclose(got, _expected_sums(arrays, windows), rtol=1e-10, atol=1e-8)
    assert all(slow_copies["pinned"])


def test_chunks_consumed_on_a_non_default_stream(slow_copies):
    arrays = make_arrays(8000, neurons=256, seed=5)
    side = torch.cuda.Stream()
    with cs.ChunkLoader(ArraySource(arrays), 500, device="cuda", seed=6) as loader:
        # (a) received inside the side stream's context: it is the current stream.
        inside, windows = [], []
        with torch.cuda.stream(side):
            for chunk in loader.epoch(8):
                inside.append(chunk["voltage"].double().sum())
                windows.append((chunk.start, chunk.stop))
        side.synchronize()
        got = torch.stack(inside).cpu().numpy()
        np.testing.assert_allclose(got, _expected_sums(arrays, windows), rtol=1e-10, atol=1e-8)
        # (b) received on the default stream, used on the side stream after use_on().
        outside, windows = [], []
        for chunk in loader.epoch(8):
            assert chunk.use_on(side) is chunk
            with torch.cuda.stream(side):
                outside.append(chunk["voltage"].double().sum())
            windows.append((chunk.start, chunk.stop))
            del chunk  # freed while side may still read it: record_stream keeps it
        side.synchronize()
        got = torch.stack(outside).cpu().numpy()
        np.testing.assert_allclose(got, _expected_sums(arrays, windows), rtol=1e-10, atol=1e-8)


def test_slots_are_pinned_and_copies_never_block_the_host(slow_copies):
    arrays = make_arrays(8000, neurons=256)
    slow_copies["delay_ms"] = 50.0
    with cs.ChunkLoader(ArraySource(arrays), 1000, device="cuda") as loader:
        slots = list(loader._pool._free)
        assert slots and all(t.is_pinned() for b in slots for t in b.tensors.values())
        for _ in loader.epoch(6):
            pass
        torch.cuda.synchronize()
    # Each copy was issued behind a 50 ms spin on the transfer stream: from pinned memory
    # cudaMemcpyAsync returns at once; from pageable memory it would wait for the stream.
    assert slow_copies["host_s"] and max(slow_copies["host_s"]) < 0.025, slow_copies["host_s"]
    # The method can see blocking: the same copy from pageable memory waits for the spin.
    slow_copies["host_s"].clear()
    dev = torch.empty(1 << 20, device="cuda")
    dev.copy_(torch.ones(1 << 20), non_blocking=True)
    torch.cuda.synchronize()
    assert slow_copies["host_s"][0] > 0.025, slow_copies["host_s"]


def test_a_copy_that_fails_part_way_returns_its_slot_behind_an_event():
    from chunkstream._memory import PinnedSlotPool
    from chunkstream.pipeline._jobs import _release_after_failed_copy
    from chunkstream.sources._base import FieldSpec

    pool = PinnedSlotPool({"x": FieldSpec((1024,), np.dtype("float32"))}, 256, slots=1,
                          device=torch.device("cuda", torch.cuda.current_device()))  # fmt: skip
    stream = torch.cuda.Stream()
    slot = pool.acquire()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(_cycles_per_ms() * 100))  # the "queued copy" still reading
        torch.empty(256, 1024, device="cuda").copy_(slot.tensors["x"], non_blocking=True)
    _release_after_failed_copy(pool, slot, stream)
    assert not pool._free and len(pool._pending) == 1
    assert not pool._pending[0][0].query()  # not reusable while the copy may still read it
    stream.synchronize()
    assert pool.acquire() is slot
    pool.release(slot)
    assert pool.close() is True


def _host_cache_bytes() -> int:
    """What torch's caching host allocator owns (2.13 names it allocated_bytes; older
    releases reserved_bytes for the same segment total)."""
    stats = torch.cuda.host_memory_stats()
    for key in ("reserved_bytes.current", "allocated_bytes.current"):
        if key in stats:
            return int(stats[key])
    return 0


def test_pinned_arena_is_exact_and_released_at_close():
    torch.empty(1, device="cuda")  # host_memory_stats() is empty before CUDA is initialised
    # The review's claim, checked: torch's pinned allocations round up to a power of two
    # and stay cached after they are freed.
    before = _host_cache_bytes()
    probe = torch.empty((1 << 20) + 1, dtype=torch.uint8, pin_memory=True)
    assert _host_cache_bytes() - before == 2 << 20
    del probe
    assert _host_cache_bytes() - before == 2 << 20  # kept after the tensor died
    getattr(torch._C, "_host_emptyCache", lambda: None)()
    # The loader's arena bypasses that allocator: registered, exact, unpinned at close.
    arrays = make_arrays(20000, neurons=300)  # chunk bytes far from a power of two
    before = _host_cache_bytes()
    loader = cs.ChunkLoader(ArraySource(arrays), 1500, device="cuda", workers=2)
    assert loader._pool.registered
    requested = loader.config.slots * loader.chunk_bytes
    assert requested <= loader.pinned_bytes <= requested + 2 * 256 * loader.config.slots + 4096
    assert _host_cache_bytes() == before  # nothing pinned through torch
    view = next(iter(loader._pool._free)).arrays["voltage"]
    assert torch.from_numpy(view).is_pinned()
    for _ in loader.epoch(5):
        pass
    loader.close()
    assert not torch.from_numpy(view).is_pinned()  # unregistered: pageable memory again
    assert _host_cache_bytes() == before and loader.pinned_bytes == 0


def test_a_loader_collected_unclosed_warns_stops_its_threads_and_unpins():
    import gc

    # weakref.finalize runs the one shutdown: executors stopped, copies waited for, the
    # arena unregistered on its one-call pin thread (from the collector's thread here).
    loader = cs.ChunkLoader(ArraySource(make_arrays(8000, neurons=128)), 500, device="cuda")
    view = next(iter(loader._pool._free)).arrays["voltage"]
    assert torch.from_numpy(view).is_pinned()
    next(iter(loader.epoch(8)))  # reads and copies still in flight when it is dropped
    with pytest.warns(ResourceWarning, match="not closed"):
        del loader
        gc.collect()
    assert wait_for_no_threads(10.0) == []  # the finalizer stopped every thread
    assert not torch.from_numpy(view).is_pinned()  # unregistered: pageable memory again


def test_close_before_a_copy_finished_keeps_the_arena_pinned_and_warns():
    from chunkstream._memory import PinnedSlotPool
    from chunkstream.sources._base import FieldSpec

    cycles = _cycles_per_ms()
    pool = PinnedSlotPool({"x": FieldSpec((1024,), np.dtype("float32"))}, 256, slots=1,
                          device=torch.device("cuda", torch.cuda.current_device()))  # fmt: skip
    stream = torch.cuda.Stream()
    slot = pool.acquire()
    view = slot.arrays["x"]
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(cycles * 300))  # the copy starts 300 ms from now
        torch.empty(256, 1024, device="cuda").copy_(slot.tensors["x"], non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    pool.release(slot, after=done)
    with pytest.warns(RuntimeWarning, match="had not finished by close's deadline"):
        assert pool.close(timeout=0.05) is False
    assert not done.query() and torch.from_numpy(view).is_pinned()  # never unpinned under it
    assert pool.nbytes > 0  # still held, and said so
    stream.synchronize()


def test_moments_merge_in_bounded_blocks_on_the_device():
    from chunkstream.train import RunningMoments

    x = torch.randn(16384, 1024, device="cuda") * 3 + 1  # 64 MiB of float32
    moments = RunningMoments(1024, "cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    moments.update(x)
    torch.cuda.synchronize()
    temporaries = torch.cuda.max_memory_allocated() - before
    # A whole-chunk float64 copy plus its squared deviations would be 4x the chunk (256 MiB);
    # one block's float64 copy, worked in place, plus the reductions' own (3.0 blocks on
    # an H200 with torch 2.11; an out-of-place update measured 4.0).
    assert temporaries <= 3 * RunningMoments.block_bytes + (1 << 20), temporaries
    reference = x.double().cpu()
    torch.testing.assert_close(moments.mean.cpu(), reference.mean(0))
    torch.testing.assert_close(moments.var.cpu(), reference.var(0, unbiased=False))


def test_neighbour_union_uploads_once_and_syncs_once():
    import warnings

    from chunkstream.compat import _augment

    rng = np.random.default_rng(0)
    degree = rng.integers(0, 6, 500)
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    indices = rng.integers(0, 500, int(indptr[-1])).astype(np.int64)
    selected = torch.randperm(500, device="cuda")[:20]
    first = _augment.neighbour_union(selected, indices, indptr)
    uploads = _augment.uploads
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = _augment.neighbour_union(selected, indices, indptr)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]  # the union's size (nonzero)
    assert _augment.uploads == uploads  # the CSR stayed on the device
    sel = selected.cpu().numpy()
    neighbours = [indices[indptr[i] : indptr[i + 1]] for i in sel]
    expected = np.unique(np.concatenate([sel, *neighbours]))
    np.testing.assert_array_equal(again.cpu().numpy(), expected)
    assert torch.equal(first, again)


def _flyvis_like(timesteps=6000, neurons=48, stim=6, seed=0) -> cs.NumpySource:
    rng = np.random.default_rng(seed)
    t = np.arange(timesteps, dtype=np.float32)[:, None]
    voltage = np.sin(t / 50 + rng.uniform(0, 6, neurons)).astype(np.float32)
    voltage += 0.05 * rng.standard_normal((timesteps, neurons), dtype=np.float32)
    return cs.NumpySource({
        "voltage": voltage, "stimulus": rng.standard_normal((timesteps, stim), dtype=np.float32),
    })  # fmt: skip


def test_training_loop_makes_no_host_sync_also_after_resume(tmp_path):
    from chunkstream.train import TrainConfig, Trainer

    source = _flyvis_like()
    config = TrainConfig(chunk_size=512, batch_size=32, epochs=2, warmup_epochs=1,
                         hidden_dim=64, latent_dim=16, device="cuda", progress=False,
                         tensorboard=False, workers=2, seed=2, time_every=2)  # fmt: skip
    counts: dict[int, int] = {}

    def strict_between_chunks(trainer, batch):
        # Every batch after an epoch's first chunk runs under "error" until the epoch's
        # last batch is done: validation and checkpoints at the epoch's end may sync.
        epoch = len(trainer.history)
        n = counts[epoch] = counts.get(epoch, 0) + 1
        strict = trainer.plan.batches_per_chunk <= n < trainer.stream.batches_per_epoch
        torch.cuda.set_sync_debug_mode("error" if strict else "default")

    try:
        first = Trainer(source, config, out_dir=tmp_path, on_batch=strict_between_chunks)
        assert first.plan.chunks_per_epoch >= 3
        first.fit()
        resumed = Trainer(source, TrainConfig(**{**config.to_dict(), "epochs": 4}),
                          out_dir=tmp_path, on_batch=strict_between_chunks)  # fmt: skip
        result = resumed.fit(resume=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    per_epoch = first.plan.chunks_per_epoch * first.plan.batches_per_chunk
    assert len(result.history) == 4 and counts == dict.fromkeys(range(4), per_epoch)
    # Loaded to the CPU: Adam's step counters stay on the host, as in a fresh run.
    steps = [state["step"] for state in resumed.optimizer.state.values()]
    assert steps and all(s.device.type == "cpu" for s in steps)


@pytest.mark.parametrize("tier", ["host", "device"])
def test_demo_on_cuda_with_each_tier(tier, tmp_path, capsys, monkeypatch):
    """``chunkstream demo --device cuda --buffer TIER``: it trains, and its batches take
    the stream's path: on the host tier each one copied from a pinned slot by the
    loader's asynchronous copy, never ``.to(device)`` from pageable memory; on the device
    tier gathered on the device from the loader's chunks."""
    import json

    from chunkstream.cli import main

    copies: list[tuple[bool, bool, tuple]] = []  # (pinned, non_blocking, shape) to the GPU
    moved: list[tuple] = []  # shapes of CPU tensors moved by .to() to the GPU
    copy_, to = torch.Tensor.copy_, torch.Tensor.to

    def spy_copy(self, src, non_blocking=False):
        if self.is_cuda and not src.is_cuda:
            copies.append((src.is_pinned(), non_blocking, tuple(src.shape)))
        return copy_(self, src, non_blocking)

    def spy_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if not self.is_cuda and out.is_cuda:
            moved.append(tuple(self.shape))
        return out

    monkeypatch.setattr(torch.Tensor, "copy_", spy_copy)
    monkeypatch.setattr(torch.Tensor, "to", spy_to)
    out = tmp_path / "demo"
    argv = ["demo", "--device", "cuda", "--buffer", tier, "--out", str(out), "--timesteps",
            "4096", "--neurons", "32", "--stim-dims", "8", "--chunk-size", "512", "--epochs",
            "2", "--no-progress", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert f"{tier} tier" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert result["device"].startswith("cuda") and result["buffer"] == tier
    assert result["val_loss"] < result["baseline_val"]
    window = 5  # TrainConfig's default rollout: 4 steps of 1
    batch_copies = [c for c in copies if c[2][:2] == (32, window)]
    assert not [shape for shape in moved if shape[:2] == (32, window)]
    if tier == "host":
        assert result["memory"]["loader_device"] == 0  # the loader reads to host memory
        # the data and the stimulus of every batch, each through a pinned slot
        assert len(batch_copies) == 2 * result["batches"]
        assert all(pinned and non_blocking for pinned, non_blocking, _ in batch_copies)
    else:
        assert result["memory"]["loader_device"] > 0
        assert not batch_copies  # batches are gathered on the device


def _two_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


_CUDA1_SCRIPT = r"""
import sys, numpy as np, torch, chunkstream as cs
from chunkstream.train import TrainConfig, Trainer
rng = np.random.default_rng(0)
src = cs.NumpySource({"voltage": rng.standard_normal((6000, 32), dtype=np.float32),
                      "stimulus": rng.standard_normal((6000, 4), dtype=np.float32)})
with cs.ChunkLoader(src, 500, device="cuda:1", workers=2, seed=1) as loader:
    timer = loader.stats.batch_timer(loader.device, every=1)
    for _ in range(2):
        for chunk in loader.epoch(6):
            with timer.batch() as b:
                y = chunk["voltage"] * 2
                b.mark("forward")
            chunk.use_on(torch.cuda.Stream(device="cuda:1"))
    torch.cuda.synchronize("cuda:1")
    loader.stats.summary()
Trainer(src, TrainConfig(chunk_size=512, batch_size=16, epochs=1, hidden_dim=16, latent_dim=8,
                         device="cuda:1", progress=False, tensorboard=False)).fit()
has = getattr(torch._C, "_cuda_hasPrimaryContext", None)
print("context-on-0", has(0) if has is not None else "unknown", has(1) if has else "")
"""


@pytest.mark.skipif(not _two_gpus(), reason="needs 2 GPUs (the lent H200 machine has one)")
def test_cuda_1_creates_no_context_on_gpu_0():
    import os
    import subprocess
    import sys
    from pathlib import Path

    # A fresh process: this one may already hold a context on GPU 0 from other tests.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(cs.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _CUDA1_SCRIPT], capture_output=True,
                          text=True, timeout=240, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "context-on-0 False True" in done.stdout, done.stdout + done.stderr[-2000:]


_STICKY_SCRIPT = r"""
import warnings, numpy as np, torch, chunkstream as cs
src = cs.NumpySource({"x": np.ones((8000, 256), dtype=np.float32)})
loader = cs.ChunkLoader(src, 500, device="cuda", workers=2,
                        options=cs.LoaderOptions(stall_timeout=30))
chunks = iter(loader.epoch(16))
next(chunks)
bad = torch.zeros(4, device="cuda")
bad[torch.tensor([1 << 20], device="cuda")] = 1.0  # a device-side assert: a sticky error
try:
    torch.cuda.synchronize()
except RuntimeError:
    pass
try:
    for _ in chunks:
        pass
    print("outcome", "no-error")
except cs.ChunkLoadError:
    print("outcome", "ChunkLoadError")
except RuntimeError as exc:  # the consumer's own wait_event on the broken context
    print("outcome", "RuntimeError", str(exc)[:80].replace(chr(10), " "))
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    for _ in range(2):
        loader.close()  # must not raise, also the second time
print("closed", loader.closed, "pinned-kept", bool(loader._pool._kept), flush=True)
import os
os._exit(0)  # what exit-time destructors do on a broken context is not under test
"""


def test_close_after_a_sticky_cuda_error_does_not_raise():
    import os
    import subprocess
    import sys
    from pathlib import Path

    # A fresh process: a sticky error breaks the CUDA context for the rest of the process.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(cs.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _STICKY_SCRIPT], capture_output=True,
                          text=True, timeout=240, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "outcome " in done.stdout and "closed True" in done.stdout, done.stdout


def test_a_source_that_learns_its_fields_pins_its_arena_after_the_first_read():
    arrays = make_arrays(2000, neurons=64)
    calls = []

    def load_fn(start, stop):
        calls.append((start, stop))
        return arrays["voltage"][start:stop], arrays["stimulus"][start:stop]

    source = cs.CallableSource(load_fn, 2000, specs="first")
    with cs.ChunkLoader(source, 250, device="cuda", workers=1, seed=2) as loader:
        assert loader.pinned_bytes == 0 and calls == []  # nothing allocated before a read
        for chunk in loader.epoch(4):
            assert chunk["data"].is_cuda
            np.testing.assert_array_equal(chunk["data"].cpu().numpy(),
                                          arrays["voltage"][chunk.start : chunk.stop])  # fmt: skip
        assert loader.pinned_bytes >= loader.config.slots * loader.chunk_bytes
        pool = loader._pool  # made by the first epoch's learning job, registered on this device
        assert pool.registered and pool.device == loader.device
        view = pool._free[0].arrays["data"] if pool._free else pool._pending[0][1].arrays["data"]
        assert torch.from_numpy(view).is_pinned()
    assert len(calls) == 4
    assert loader.pinned_bytes == 0 and not torch.from_numpy(view).is_pinned()  # unpinned
