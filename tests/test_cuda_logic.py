"""The CUDA review's fixes (issue 13) whose logic needs no GPU: checked here on the CPU.

The GPU halves (copies, streams, pinned memory, host syncs) are in test_gpu.py.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream import ChunkLoadError, ConfigError
from chunkstream._executor import Executor
from chunkstream.pipeline import ResolvedSettings, resolve_device
from chunkstream.stats._latency import LatencyStats, _completed
from chunkstream.train import RunningMoments, TrainConfig, Trainer
from chunkstream.train._trainer import _progress, trainer_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as a two-GPU machine whose current device is 1 (no CUDA is touched)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


# -- 1. device index resolved at construction; stage threads bind it; errors wrapped --------


def test_bare_cuda_is_resolved_to_the_current_index(fake_cuda):
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device(None) == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"device='cuda:2'.*\[0, 2\).*CUDA_VISIBLE_DEVICES"):
        resolve_device("cuda:2")
    assert resolve_device("cpu") == torch.device("cpu")


def test_batch_timer_gets_the_device_index(fake_cuda):
    stats = LatencyStats()
    assert stats.batch_timer("cuda").device == torch.device("cuda", 1)
    assert stats.batch_timer("cuda:0").device == torch.device("cuda", 0)
    assert stats.batch_timer("cpu").device == torch.device("cpu")


def test_thread_init_runs_in_every_worker_and_its_failure_outlives_every_epoch():
    names = []
    executor = Executor("probe", 3, init=lambda: names.append(threading.current_thread().name))
    try:
        futures = [executor.submit(lambda k=k: k * k) for k in range(4)]
        assert [f.result(timeout=5) for f in futures] == [0, 1, 4, 9]
        assert sorted(names) == [f"chunkstream-probe-{k}" for k in range(3)]
        assert executor.completed == 4
    finally:
        assert executor.close(time.monotonic() + 5) == []

    def broken():
        raise ChunkLoadError("setting the CUDA device cuda:1 failed")

    executor = Executor("probe", 1, init=broken)
    try:
        for _ in range(2):  # later work, in any epoch, does not hide the dead worker
            with pytest.raises(ChunkLoadError, match="cuda:1"):
                executor.submit(lambda: 1).result(timeout=5)
    finally:
        executor.close(time.monotonic() + 5)


def test_every_loader_thread_binds_the_device_and_a_failed_bind_reaches_the_consumer(
    monkeypatch,
):
    bound: list[tuple[str, object]] = []
    _fake_cuda_loader(monkeypatch, [])
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: bound.append((threading.current_thread().name, d)))  # fmt: skip
    loader = cs.ChunkLoader(_source(), 100, device="cuda", workers=2)
    loader.close()
    names = sorted(name for name, _ in bound if name.startswith("chunkstream-"))
    # (The arena's cudaHostRegister thread binds it too: see the pin helper's tests.)
    assert names == ["chunkstream-read-0", "chunkstream-read-1", "chunkstream-transfer-0"]
    assert {d for name, d in bound if name in names} == {torch.device("cuda", 1)}

    def refuse(device):
        raise RuntimeError("CUDA error: invalid device ordinal")

    monkeypatch.setattr(torch.cuda, "set_device", refuse)
    loader = cs.ChunkLoader(_source(), 100, device="cuda", workers=1)
    with pytest.raises(ChunkLoadError, match=r"setting the CUDA device cuda:1 in thread"):
        next(iter(loader.epoch(3)))
    assert loader.closed  # the pipeline shut down, as after any worker error


def test_errors_from_acquire_reach_the_consumer_as_chunk_load_errors():
    from chunkstream.pipeline._jobs import read_job
    from chunkstream.plans import Piece
    from chunkstream.stats import Trip

    class BrokenPool:
        def acquire(self, cancelled=None):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    pool = Future()
    pool.set_result(BrokenPool())
    with pytest.raises(ChunkLoadError, match=r"free host buffer for window \[10, 20\)") as info:
        read_job((Piece(0, 10, 20),), lambda: False, Trip(), source=None, pool=pool,
                 check_finite=False, retries=0)  # fmt: skip
    assert info.value.window == (10, 20)
    assert "illegal memory access" in str(info.value.__cause__)


def test_a_failed_copy_without_a_working_stream_retires_its_slot():
    from chunkstream.pipeline._jobs import _release_after_failed_copy

    class Pool:
        def __init__(self):
            self.released, self.fenced = [], []

        def release(self, buffers, after=None):
            (self.released if after is None else self.fenced).append(buffers)

    pool = Pool()
    _release_after_failed_copy(pool, "slot", None)  # a synchronous device: free at once
    assert pool.released == ["slot"]
    _release_after_failed_copy(pool, "slot", object())  # no event can be recorded
    assert pool.released == ["slot"] and pool.fenced == []  # kept out of the pool


def test_pinned_arena_layout_is_exact_aligned_and_disjoint(monkeypatch):
    from chunkstream._memory import _arena
    from chunkstream.sources._base import FieldSpec

    calls = []
    monkeypatch.setattr(_arena, "_register", lambda device, ptr, n: calls.append(n))  # None: ok
    fields = {"a": FieldSpec((13,), np.dtype("float32")), "b": FieldSpec((3, 2), np.dtype("int16"))}
    pool = _arena.PinnedSlotPool(fields, 37, slots=3, device=torch.device("cuda", 1))
    per_slot = 37 * 13 * 4 + 37 * 6 * 2
    assert pool.registered and calls == [pool.nbytes]
    assert per_slot * 3 <= pool.requested_nbytes <= per_slot * 3 + 2 * 3 * 256
    assert pool.nbytes % _arena._PAGE == 0 and pool.nbytes - pool.requested_nbytes < 4096
    spans = []
    for buffers in pool._free:
        for name, array in buffers.arrays.items():
            assert array.shape == (37, *fields[name].shape) and array.dtype == fields[name].dtype
            assert array.ctypes.data % 256 == 0
            assert buffers.tensors[name].data_ptr() == array.ctypes.data  # the same memory
            spans.append((array.ctypes.data, array.ctypes.data + array.nbytes))
    spans.sort()
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert _arena._power_of_two_ceil(3 * per_slot) == 8192  # what pin_memory would take


# -- 2, 3. the trainer: one GPU per rank; checkpoints loaded to the CPU --------------------


def test_ranks_bind_cuda_local_rank(fake_cuda):
    env = {"LOCAL_RANK": "0"}
    assert trainer_device("cuda", distributed=True, env=env) == torch.device("cuda", 0)
    assert trainer_device(None, distributed=True, env={"LOCAL_RANK": "1"}) == torch.device(
        "cuda", 1
    )
    # An explicit index is the user's choice; outside DDP the current device is used.
    assert trainer_device("cuda:0", distributed=True, env={"LOCAL_RANK": "1"}).index == 0
    assert trainer_device("cuda", distributed=False, env=env) == torch.device("cuda", 1)
    assert trainer_device("cuda", distributed=True, env={}) == torch.device("cuda", 1)
    assert trainer_device("cpu", distributed=True, env=env) == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=2.*nproc_per_node"):
        trainer_device("cuda", distributed=True, env={"LOCAL_RANK": "2"})


def _source(timesteps=1500, neurons=8, stim=3):
    rng = np.random.default_rng(1)
    return cs.NumpySource({
        "voltage": rng.standard_normal((timesteps, neurons), dtype=np.float32),
        "stimulus": rng.standard_normal((timesteps, stim), dtype=np.float32),
    })  # fmt: skip


def _config(**kw) -> TrainConfig:
    base = dict(chunk_size=256, batch_size=16, epochs=2, hidden_dim=16, latent_dim=8,
                device="cpu", progress=False, tensorboard=False, workers=1, seed=3)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_resume_loads_the_checkpoint_to_the_cpu(tmp_path, monkeypatch):
    Trainer(_source(), _config(epochs=1), out_dir=tmp_path).fit()
    seen = []
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    resumed = Trainer(_source(), _config(epochs=2), out_dir=tmp_path)
    assert len(resumed.fit(resume=True).history) == 2
    assert seen == ["cpu"]
    assert all(s["step"].device.type == "cpu" for s in resumed.optimizer.state.values())


# -- 5. the epoch-0 moments: row blocks, equal to the whole-chunk float64 result ------------


def test_moments_merge_in_row_blocks_equal_to_the_whole_float64_result(monkeypatch):
    x = torch.randn(1000, 7) * 5 + 3
    monkeypatch.setattr(RunningMoments, "block_bytes", 8 * 7 * 64)  # 64 rows per block
    blocks = []
    real = RunningMoments._merge_rows

    def spy(self, rows, mask=None):
        blocks.append(int(rows.shape[0]))
        real(self, rows, mask)

    monkeypatch.setattr(RunningMoments, "_merge_rows", spy)
    moments = RunningMoments(7)
    moments.update(x[:600])
    moments.update(x[600:])
    assert max(blocks) == 64 and sum(blocks) == 1000  # the float64 copy is one block at most
    reference = x.double()
    torch.testing.assert_close(moments.mean, reference.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        moments.var, reference.var(0, unbiased=False), rtol=1e-12, atol=1e-12
    )
    assert moments.count == 1000
    # The users' width: 305 rows (32 MiB of float64) per block of a 65,536-row chunk.
    monkeypatch.undo()
    assert RunningMoments(13741).block_rows() == (32 << 20) // (8 * 13741) == 305


# -- 6. host syncs: no loss text for a bar nobody sees; the CSR uploaded once ---------------


def test_no_loss_text_is_computed_while_the_bar_is_off(monkeypatch):
    from chunkstream.train import _metrics

    calls = []
    real = _metrics.LossMeter.mean
    monkeypatch.setattr(_metrics.LossMeter, "mean", lambda self, name: calls.append(name) or
                        real(self, name))  # fmt: skip
    # progress=True, but stderr is not a terminal under pytest: tqdm's bar is disabled.
    assert _progress(3, "epoch 0", True) is None
    result = Trainer(_source(), _config(progress=True)).fit()
    # Only the epoch summaries read the means (one read per component), no chunk does.
    assert len(calls) == sum(len(r.losses) for r in result.history)
    assert sum(r.chunks for r in result.history) > len(calls) // 2


def test_the_csr_is_uploaded_once_per_array():
    from chunkstream.compat import _augment

    indptr = np.array([0, 2, 3, 3, 5])
    indices = np.array([1, 2, 0, 3, 6])  # a column beyond the rows: the union holds it
    before = _augment.uploads
    for _ in range(5):
        got = _augment.neighbour_union(torch.tensor([3, 0]), indices, indptr)
        assert got.tolist() == [0, 1, 2, 3, 6]
    assert _augment.uploads == before + 1
    other = indices.copy()
    _augment.neighbour_union(torch.tensor([1]), other, indptr)
    assert _augment.uploads == before + 2  # another array: its own upload
    _augment.neighbour_union(torch.tensor([1]), list(indices), list(indptr))  # not cacheable
    _augment.neighbour_union(torch.tensor([1]), list(indices), list(indptr))
    assert _augment.uploads == before + 4


# -- 7. events: every one queried; bounds worded the same everywhere ------------------------


class _Event:
    def __init__(self, done: bool, t: float = 0.0):
        self.done, self.t = done, t

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


def test_batch_events_resolve_only_when_every_one_completed():
    stats = LatencyStats()
    # The last event completed but an earlier one, on another stream, has not.
    events = (_Event(True, 0.0), _Event(False, 1.0), _Event(True, 2.0), _Event(True, 3.0))
    assert not _completed(events)
    stats.record_batch_events(0.0, events)
    stats.resolve_pending()
    assert stats.pending_batches == 1 and not stats.batches
    events[1].done = True
    stats.resolve_pending()
    assert stats.pending_batches == 0
    assert [round(v, 6) for v in vars(stats.batches[0]).values()][:3] == [1.0, 1.0, 1.0]


def test_device_bounds_are_worded_alike_everywhere():
    from chunkstream.tools import _plan

    readme = (ROOT / "README.md").read_text()
    guarantees = (ROOT / "docs/_guarantees.md").read_text()
    tuning = (ROOT / "docs/guide/tuning.md").read_text()
    phrase = "`gpu_prefetch + 1` chunks for a loop that drops each chunk before asking"
    assert phrase in readme.replace("\n  ", " ") and phrase in guarantees.replace("\n  ", " ")
    assert "del chunk" in tuning and "one chunk more" in tuning
    for doc in (_plan.__doc__, ResolvedSettings.__doc__):
        flat = " ".join(doc.split())
        assert "gpu_prefetch + 1" in flat and "drops each chunk" in flat, flat
    # What plan and the trainer report, and what the GPU test asserts, agree with that.
    cb = 10
    assert _plan._streaming_bytes(cb, on_cuda=True, prefetch=2, gpu_prefetch=1, workers=2,
                                  host_slots=4, val_bytes=0)[0] == 2 * cb  # fmt: skip
    gpu_tests = (ROOT / "tests/test_gpu.py").read_text()
    assert "<= (gp + 1) * cb" in gpu_tests and "<= (gp + 2) * cb" in gpu_tests
    trainer = (ROOT / "src/chunkstream/train/_trainer.py").read_text()
    assert '"loader_device": (cfg.gpu_prefetch + 1) * chunk_bytes' in trainer
    # The trainer holds no chunk: its BatchStream drops each one before asking for the next.
    stream = (ROOT / "src/chunkstream/consumer/_batches.py").read_text()
    assert "            del event  # let the loader reuse its buffer" in stream
    assert "del chunk" not in trainer and "ChunkMixer" not in trainer


# -- 8. consuming on another stream: use_on is documented, and a no-op on the CPU ----------


def test_use_on_is_documented_and_does_nothing_on_the_cpu():
    chunk = cs.Chunk({"x": torch.zeros(4, 2)}, start=0, stop=4, epoch=0, index=0)
    assert chunk.use_on() is chunk and chunk.use_on(object()) is chunk
    doc = " ".join(cs.Chunk.__doc__.split())
    assert "use_on" in doc and "wait_stream" in doc and "record_stream" in doc
    assert "## Consuming on another CUDA stream" in (ROOT / "docs/guide/tuning.md").read_text()


# -- 9. CHUNKSTREAM_REQUIRE_GPU=1 turns a GPU skip into a failure ------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the switch where CUDA is absent")
def test_require_gpu_turns_the_skip_into_a_failure():
    test = "tests/test_gpu.py::test_device_chunks_equal_the_stored_bytes"
    env = {k: v for k, v in os.environ.items() if k != "CHUNKSTREAM_REQUIRE_GPU"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    skipped = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    failed = subprocess.run(command, cwd=ROOT, env={**env, "CHUNKSTREAM_REQUIRE_GPU": "1"},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert failed.returncode != 0, failed.stdout
    assert "CHUNKSTREAM_REQUIRE_GPU=1 but" in failed.stdout and "1 error" in failed.stdout


# -- 10. shutdown after a CUDA error; the pinned arena's CUDA calls; LOCAL_RANK -------------


class _BrokenEvent:
    """An event whose query() fails, as torch's does after a sticky CUDA error."""

    def query(self):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _fake_pool(monkeypatch, unregistered):
    from chunkstream._memory import _arena
    from chunkstream.sources._base import FieldSpec

    monkeypatch.setattr(_arena, "_register", lambda device, ptr, n: None)
    monkeypatch.setattr(
        _arena, "_unregister", lambda device, ptr, timeout: unregistered.append(ptr)
    )
    fields = {"x": FieldSpec((16,), np.dtype("float32"))}
    return _arena.PinnedSlotPool(fields, 32, slots=2, device=torch.device("cuda", 1))


@pytest.mark.parametrize("broken", ["query", "device"])
def test_pool_close_after_a_cuda_error_keeps_the_arena_and_stays_idempotent(monkeypatch, broken):
    import contextlib

    unregistered = []
    pool = _fake_pool(monkeypatch, unregistered)
    mapping = pool._mmap
    slot = pool.acquire()
    pool.release(slot, after=_BrokenEvent())
    if broken == "query":
        monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    # else: this CPU build's torch.cuda.device(...) itself raises on entry
    with pytest.warns(RuntimeWarning, match=r"stays pinned.*checking that its copies finished"):
        assert pool.close() is False
    assert unregistered == []  # copies not proven finished: never unpinned under a DMA
    assert any(mapping is kept[1] for kept in pool._kept)  # nor unmapped
    assert pool.close() is False and unregistered == []  # the second call: the same answer


class _CopyEvent:
    """A copy's done event that completes when the test says: ``synchronize()`` blocks
    (as a blocking-sync CUDA event's does) until then, counting its callers."""

    def __init__(self):
        self.finished = threading.Event()
        self.waiters = 0

    def query(self) -> bool:
        return self.finished.is_set()

    def synchronize(self) -> None:
        self.waiters += 1
        assert self.finished.wait(30), "a copy that never ends"


def test_a_slot_in_flight_is_waited_for_by_its_event_not_polled(monkeypatch):
    pool = _fake_pool(monkeypatch, [])
    first, second = pool.acquire(), pool.acquire()
    events = [_CopyEvent(), _CopyEvent()]
    pool.release(first, after=events[0])
    pool.release(second, after=events[1])
    got = []
    taker = threading.Thread(target=lambda: got.append(pool.acquire()))
    taker.start()
    deadline = time.monotonic() + 10
    while events[0].waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert events[0].waiters == 1 and events[1].waiters == 0  # the oldest copy, in the driver
    time.sleep(0.05)
    assert taker.is_alive() and not got  # its copy runs: the slot is not handed out
    events[0].finished.set()
    taker.join(10)
    assert got == [first]  # copies end in order: the oldest slot comes back first
    assert len(pool._pending) == 1 and pool._pending[0][1] is second


def test_close_waits_for_the_copy_an_acquirer_is_waiting_for(monkeypatch):
    unregistered = []
    pool = _fake_pool(monkeypatch, unregistered)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    first, second = pool.acquire(), pool.acquire()
    event = _CopyEvent()
    pool.release(first, after=_DoneEvent())
    pool.release(second, after=event)
    assert pool.acquire() is first  # the done one
    errors = []

    def take():
        try:
            pool.acquire()
        except RuntimeError as exc:
            errors.append(exc)

    taker = threading.Thread(target=take)
    taker.start()
    deadline = time.monotonic() + 10
    while event.waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    # The event is still queued while it is waited for: close must not unpin under it.
    with pytest.warns(RuntimeWarning, match=r"stays pinned.*had not finished"):
        assert pool.close(timeout=0.2) is False
    assert unregistered == []
    event.finished.set()
    taker.join(10)
    assert [str(e) for e in errors] == ["pinned slot pool is closed"]


def test_pool_close_unregisters_in_a_helper_thread_and_warns_on_failure(monkeypatch):
    from chunkstream._memory import _arena

    unregistered = []
    pool = _fake_pool(monkeypatch, unregistered)
    assert pool.close() is True and unregistered and not pool._kept
    # A failed unregister: warned, and the mapping is kept (it may still be registered).
    pool = _fake_pool(monkeypatch, [])
    monkeypatch.setattr(_arena, "_unregister", lambda device, ptr, timeout: "cudaError 1")
    with pytest.warns(RuntimeWarning, match=r"cudaHostUnregister failed \(cudaError 1\)"):
        assert pool.close() is False
    assert pool._kept
    # The real helper: the call runs on its own one-call thread, bound to the device.
    seen = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.setdefault("device", d))

    class Cudart:
        def cudaHostUnregister(self, ptr):
            seen["thread"] = threading.current_thread().name
            return 1

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    call = lambda: torch.cuda.cudart().cudaHostUnregister(8)  # noqa: E731
    device = torch.device("cuda", 1)
    assert _arena._cuda_call(device, call, "cudaHostUnregister", 5.0) == "cudaError 1"
    assert seen == {"device": device, "thread": "chunkstream-pin-0"}
    assert not [t for t in threading.enumerate() if t.name == "chunkstream-pin-0"]  # ended


def test_the_pin_helper_waits_with_a_deadline_and_keeps_the_exception_text(monkeypatch):
    from chunkstream._memory import _arena

    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    device = torch.device("cuda", 0)
    release = threading.Event()
    try:
        error = _arena._cuda_call(device, lambda: release.wait(30) and 0, "cudaHostRegister", 0.2)
        assert error is not None and "did not return within" in error
    finally:
        release.set()

    def broken():
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    error = _arena._cuda_call(device, broken, "cudaHostRegister", 5.0)
    assert error == "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"
    assert _arena._cuda_call(device, lambda: 0, "cudaHostRegister", 5.0) is None

    def unbound():
        raise RuntimeError("CUDA error: invalid device ordinal")

    monkeypatch.setattr(torch.cuda, "set_device", lambda d: unbound())
    error = _arena._cuda_call(device, lambda: 0, "cudaHostRegister", 5.0)
    assert error is not None and "setting the CUDA device cuda:0 in thread" in error  # the bind
    assert "invalid device ordinal" in error


def _device_guard(inside: list):
    """A ``torch.cuda.device`` stand-in that keeps the stack of devices entered in ``inside``."""

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            inside.append(self.device)

        def __exit__(self, *exc):
            inside.pop()

    return Device


def test_the_fallback_pin_runs_under_the_pool_device_and_names_the_error(monkeypatch):
    from chunkstream._memory import _arena
    from chunkstream.sources._base import FieldSpec

    inside: list[object] = []
    pinned_under: list[object] = []

    Device = _device_guard(inside)

    real_empty = torch.empty

    def empty(*shape, pin_memory=False, **kw):
        if pin_memory:
            pinned_under.append(inside[-1] if inside else None)
        return real_empty(*shape, **kw)

    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(_arena, "_register",
                        lambda device, ptr, n: "RuntimeError: out of pinnable memory")  # fmt: skip
    fields = {"x": FieldSpec((16,), np.dtype("float32"))}
    with pytest.warns(RuntimeWarning, match=r"failed \(RuntimeError: out of pinnable memory\)"):
        pool = _arena.PinnedSlotPool(fields, 32, slots=2, device=torch.device("cuda", 1))
    assert not pool.registered and pinned_under == [torch.device("cuda", 1)]
    assert pool.close(unpin=False) is False


def _fake_cuda_loader(monkeypatch, unregistered):
    """ChunkLoader's CUDA path on this CPU build: no CUDA call reaches torch."""
    from chunkstream._memory import _arena

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(_arena, "_register", lambda device, ptr, n: None)
    monkeypatch.setattr(
        _arena, "_unregister", lambda device, ptr, timeout: unregistered.append(ptr)
    )


@pytest.mark.parametrize("failing", ["read", "transfer"])
def test_a_failed_construction_closes_the_pinned_pool(monkeypatch, failing):
    from chunkstream.pipeline import _loader

    unregistered: list[int] = []
    _fake_cuda_loader(monkeypatch, unregistered)
    pools, executors = [], []
    real_pool, real_executor = _loader.PinnedSlotPool, _loader.Executor

    class Pool(real_pool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append((self, self._ptr))

    def executor(name, *args, **kwargs):
        if name == failing:
            raise RuntimeError("can't start new thread")
        executors.append(real_executor(name, *args, **kwargs))
        return executors[-1]

    monkeypatch.setattr(_loader, "PinnedSlotPool", Pool)
    monkeypatch.setattr(_loader, "Executor", executor)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        cs.ChunkLoader(_source(), 100, device="cuda", workers=2)
    ((pool, ptr),) = pools
    assert pool._released is True and unregistered == [ptr] and not pool._kept
    assert all(not t.is_alive() for e in executors for t in e.threads)


def test_a_failure_reaches_the_consumer_as_chunk_load_error_even_if_closing_fails(monkeypatch):
    closed = []
    source = _source()
    monkeypatch.setattr(source, "close", lambda: closed.append(True))
    real_read = source.read_into

    def read_into(start, stop, out):
        if start >= 100:  # the first window reads, the second fails
            raise PermissionError("injected")
        real_read(start, stop, out)

    monkeypatch.setattr(source, "read_into", read_into)
    loader = cs.ChunkLoader(source, 100, device="cpu", workers=1, sampling="sequential", options=cs.LoaderOptions(close_source=True))  # fmt: skip

    def broken_close(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(loader._pool, "close", broken_close)
    with pytest.raises(ChunkLoadError, match="injected") as info:
        list(loader.epoch(5))
    assert any("closing the loader after this error also failed" in n
               for n in getattr(info.value, "__notes__", []))  # fmt: skip
    assert closed == [True] and loader.closed  # the steps after the failing one still ran
    assert all(not t.is_alive() for t in loader.threads)
    loader.close()  # idempotent


def test_bare_cuda_under_torchrun_on_another_gpu_warns(fake_cuda, monkeypatch):
    from chunkstream.distributed import warn_if_not_local_rank

    cuda1 = torch.device("cuda", 1)
    torchrun = {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    for requested in ("cuda", None, torch.device("cuda")):
        with pytest.warns(RuntimeWarning, match=r"LOCAL_RANK=0.*cuda:\{local_rank\}.*set_device"):
            warn_if_not_local_rank(requested, cuda1, torchrun)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_not_local_rank("cuda", cuda1, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"})  # its GPU
        warn_if_not_local_rank("cuda:1", cuda1, torchrun)  # an explicit index is kept
        warn_if_not_local_rank("cuda", cuda1, {"LOCAL_RANK": "0", "WORLD_SIZE": "1"})
        warn_if_not_local_rank("cuda", cuda1, {})  # not under torchrun
        warn_if_not_local_rank("cpu", torch.device("cpu"), torchrun)
    # ChunkLoader itself warns, and says so in its docstring and in the scaling guide.
    unregistered: list[int] = []
    _fake_cuda_loader(monkeypatch, unregistered)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(RuntimeWarning, match="LOCAL_RANK=0"):
        loader = cs.ChunkLoader(_source(), 100, device="cuda", workers=1)
    assert loader.device == cuda1
    loader.close()
    assert "LOCAL_RANK" in " ".join(cs.ChunkLoader.__doc__.split())
    assert 'device=f"cuda:{local_rank}"' in (ROOT / "docs/_scaling.md").read_text()


# -- 11. the lazy pinned arena, the CUDA path's slot ownership, compat's depths on CUDA -----
#
# The loader's CUDA path end to end on this CPU build: the transfer stage's copies are host
# clones (_copy replaced) whose events have completed at once, so a slot is free again right
# after its copy is issued, the earliest a real copy frees it. What is checked is ownership
# and ordering (who makes, returns and unpins a slot, and when), not CUDA itself.


class _DoneEvent:
    """A CUDA event stand-in whose work has completed."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


def _fake_cuda_copies(monkeypatch, unregistered):
    from chunkstream.pipeline import _jobs

    _fake_cuda_loader(monkeypatch, unregistered)

    def copy(loaded, pool, device, stream):
        rows = _jobs.chunk_rows(loaded.pieces)
        tensors = {name: t[:rows].clone() for name, t in loaded.buffers.tensors.items()}
        return _jobs.Delivery(loaded.pieces, tensors, (_DoneEvent(), _DoneEvent()))

    class Stream:
        def wait_event(self, event):
            assert isinstance(event, _DoneEvent)  # the copy's own event, not a fresh one

    monkeypatch.setattr(_jobs, "_copy", copy)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())


def _learning_source(T=2000, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((T, 5), dtype=np.float32)
    stim = rng.standard_normal((T, 2), dtype=np.float32)
    calls: list[tuple[int, int]] = []
    lock = threading.Lock()

    def load_fn(start, stop):
        with lock:
            calls.append((start, stop))
        return data[start:stop], stim[start:stop]

    return cs.CallableSource(load_fn, T, specs="first"), data, calls


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_learned_pinned_arena_is_pinned_by_a_reader_and_every_slot_comes_back(monkeypatch):
    from chunkstream._memory import _arena

    unregistered: list[int] = []
    _fake_cuda_copies(monkeypatch, unregistered)
    pinned: list[tuple[str, object]] = []
    pin_s = 0.6

    def register(device, ptr, nbytes):  # slow, as pinning gigabytes is
        pinned.append((threading.current_thread().name, device))
        time.sleep(pin_s)

    monkeypatch.setattr(_arena, "_register", register)
    source, data, calls = _learning_source()
    loader = cs.ChunkLoader(source, 200, device="cuda", workers=2, seed=1)
    assert loader.pinned_bytes == 0 and loader._pool is None  # nothing before a read
    for chunk in loader.epoch(6):
        np.testing.assert_array_equal(chunk["data"].numpy(), data[chunk.start : chunk.stop])
    pool = loader._pool
    # Made once, by the first epoch's learning job on a reader, for the loader's device.
    assert len(pinned) == 1 and pinned[0][0].startswith("chunkstream-read-")
    assert pinned[0][1] == pool.device == torch.device("cuda", 1)
    assert len(calls) == 6  # the learning read served the first window: no read twice
    assert loader.pinned_bytes == pool.nbytes >= loader.config.slots * loader.chunk_bytes
    # The copies gave every slot back to the real pool, behind their events.
    _wait_for(lambda: len(pool._free) + len(pool._pending) == loader.config.slots)
    assert pool._pending and all(isinstance(e, _DoneEvent) for e, _ in pool._pending)
    # Pinning the arena is not reading: the first chunk's wait shows it, its read does not.
    first = loader.stats.chunks[0]
    assert first.wait_s > pin_s / 2 > first.read_s, (first.wait_s, first.read_s)
    ptr = pool._ptr
    loader.close()
    assert pool._released is True and unregistered == [ptr] and loader.pinned_bytes == 0


def test_close_while_a_reader_pins_the_learned_arena_unpins_it_once_made(monkeypatch):
    from chunkstream._memory import _arena

    unregistered: list[int] = []
    _fake_cuda_copies(monkeypatch, unregistered)
    entered, release = threading.Event(), threading.Event()

    def register(device, ptr, nbytes):  # a pin still running when close() comes
        entered.set()
        release.wait(30)

    monkeypatch.setattr(_arena, "_register", register)
    source, _, _ = _learning_source()
    loader = cs.ChunkLoader(
        source, 200, device="cuda", workers=2, seed=1, options=cs.LoaderOptions(close_timeout=0.3)
    )
    chunks = loader.epoch(6)
    try:
        assert entered.wait(10)
        with pytest.warns(RuntimeWarning, match="did not stop"):
            loader.close()  # the pool is not made yet: close() cannot reach it
        assert loader._pool is None and loader.pinned_bytes == 0
    finally:
        release.set()
    # The job that made it sees the close and closes it itself: nothing stays pinned.
    _wait_for(lambda: all(not t.is_alive() for t in loader.threads))
    pool = loader._pool
    assert pool is not None and pool._released is True and len(unregistered) == 1
    assert loader.pinned_bytes == 0 and not pool._kept
    with pytest.raises(cs.LoaderClosedError):
        next(chunks)


def test_a_failed_pinned_allocation_reaches_the_consumer_once(monkeypatch):
    from chunkstream.pipeline import _loader

    _fake_cuda_copies(monkeypatch, [])
    made = []

    class NoPinnedMemory(_loader.PinnedSlotPool):
        def __init__(self, *args, **kwargs):
            made.append(threading.current_thread().name)
            raise RuntimeError("CUDA error: out of memory (cudaHostRegister and pin_memory)")

    monkeypatch.setattr(_loader, "PinnedSlotPool", NoPinnedMemory)
    source, _, calls = _learning_source()
    loader = cs.ChunkLoader(source, 200, device="cuda", workers=2, sampling="sequential")
    with pytest.raises(ChunkLoadError, match=r"allocating the host buffers failed: Runtime"
                                             r"Error: CUDA error: out of memory") as info:  # fmt: skip
        list(loader.epoch(6))
    assert info.value.window == (0, 200) and loader.closed and loader.pinned_bytes == 0
    assert len(made) == 1 and made[0].startswith("chunkstream-read-")  # once, in a reader
    assert all(not t.is_alive() for t in loader.threads)
    assert len(calls) <= 2  # each reader learned at most its own first window


def test_pool_close_warns_when_copies_outlive_its_deadline(monkeypatch):
    unregistered: list[int] = []
    pool = _fake_pool(monkeypatch, unregistered)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    mapping, nbytes = pool._mmap, pool.nbytes
    slot = pool.acquire()
    pool.release(slot, after=_Event(False))  # its copy never finishes within the deadline
    with pytest.warns(RuntimeWarning, match=r"stays pinned.*had not finished by close's deadline"):
        assert pool.close(timeout=0.05) is False
    assert unregistered == [] and any(mapping is kept[1] for kept in pool._kept)
    assert pool.nbytes == nbytes  # still pinned, and said so
    # Kept until the process exits, also once the loader and its pool are collected.
    from chunkstream._memory import _arena

    collected, kept = weakref.ref(pool), pool._kept
    del pool, slot
    gc.collect()
    assert collected() is None and kept and any(k is kept[0] for k in _arena._KEPT)
    held = len(_arena._KEPT)
    pool = _fake_pool(monkeypatch, unregistered)  # copies done: released, nothing held
    pool.release(pool.acquire(), after=_Event(True))
    assert pool.close(timeout=0.05) is True and pool.nbytes == 0 and len(unregistered) == 1
    assert len(_arena._KEPT) == held  # a released arena is not kept


def test_the_fallback_arena_is_freed_under_the_pool_device(monkeypatch):
    from chunkstream._memory import _arena
    from chunkstream.sources._base import FieldSpec

    inside: list[object] = []
    seen: dict[str, object] = {}

    Device = _device_guard(inside)

    real_empty = torch.empty
    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch, "empty", lambda *s, pin_memory=False, **kw: real_empty(*s, **kw))
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: seen.setdefault("synchronized", inside[-1]))  # fmt: skip
    monkeypatch.setattr(torch._C, "_host_emptyCache",
                        lambda: seen.setdefault("emptied", inside[-1] if inside else None),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(_arena, "_register", lambda device, ptr, n: "cudaError 1")
    fields = {"x": FieldSpec((16,), np.dtype("float32"))}
    with pytest.warns(RuntimeWarning, match=r"failed \(cudaError 1\)"):
        pool = _arena.PinnedSlotPool(fields, 32, slots=2, device=torch.device("cuda", 1))
    assert pool.close() is True and pool.nbytes == 0
    # cudaFreeHost and the allocator's event queries need a context: the pool's GPU's.
    assert seen == {"synchronized": torch.device("cuda", 1), "emptied": torch.device("cuda", 1)}

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch._C, "_host_emptyCache", broken, raising=False)
    with pytest.warns(RuntimeWarning, match=r"failed \(cudaError 1\)"):
        pool = _arena.PinnedSlotPool(fields, 32, slots=2, device=torch.device("cuda", 1))
    with pytest.warns(RuntimeWarning, match=r"stays pinned.*freeing it on cuda:1 failed"):
        assert pool.close() is False  # warned, never raised


# Compat on CUDA: the original, abandoned after d of n chunks, had called load_fn for
# min(n, d + depth) draws (depth: prefetch + 1 for RandomChunkLoader, prefetch +
# gpu_prefetch + 2 for PipelineChunkLoader), and the next epoch draws on from there; so
# reads plus copies in flight must never run past that, or a draw is read twice.
@pytest.mark.parametrize(
    ("pipeline", "prefetch", "gpu_prefetch"),
    [(False, p, 1) for p in (1, 2, 3)] + [(True, p, g) for p in (1, 2, 3) for g in (1, 2, 3)],
)
def test_compat_on_cuda_reads_only_the_draws_an_abandoned_epoch_consumed(
    monkeypatch, pipeline, prefetch, gpu_prefetch
):
    import random

    from chunkstream.compat import PipelineChunkLoader, RandomChunkLoader

    _fake_cuda_copies(monkeypatch, [])
    T, C = 100_000, 50
    data = np.arange(T, dtype=np.float32)[:, None].repeat(2, 1)  # row t holds t
    calls: list[tuple[int, int]] = []

    def load_fn(start, end):
        calls.append((start, end))
        return data[start:end], data[start:end, :1]

    if pipeline:
        loader = PipelineChunkLoader(load_fn, T, C, device="cuda", prefetch=prefetch, seed=7,
                                     gpu_prefetch=gpu_prefetch)  # fmt: skip
        depth = prefetch + gpu_prefetch + 2
    else:
        loader = RandomChunkLoader(load_fn, T, C, device="cuda", prefetch=prefetch, seed=7)
        depth = prefetch + 1
    # How far chunkstream reads ahead once its slots are free (copies done at once): its
    # reads and copies in flight; the pipeline loader's copy stage holds no extra chunk
    # as the original's transfer thread did, so one draw of its depth is never read.
    ahead = depth - 1 if pipeline else depth
    rng = random.Random(7)
    consumed: list[tuple[int, int]] = []  # the original's draws, epoch by epoch
    with loader:
        for num_chunks, take in [(6, 1), (12, 2), (5, 0), (4, None), (20, 3)]:
            before = len(calls)
            loader.start_epoch(num_chunks)
            count = num_chunks if take is None else min(num_chunks, take + depth)
            draws = [rng.randint(0, T - C) for _ in range(count)]
            consumed += [(s, s + C) for s in draws]
            for start in draws[: num_chunks if take is None else take]:
                out = loader.get_next_chunk()
                assert out[-2] is not None and int(out[-2][0, 0]) == start  # the original's
            if take is not None:  # the pipeline runs ahead as far as it may, and no further
                _wait_for(lambda n=num_chunks, d=take, b=before:
                          len(calls) - b >= min(n, d + ahead))  # fmt: skip
                time.sleep(0.05)
                assert len(calls) - before == min(num_chunks, take + ahead) <= count
    # Each call is one of the original's draws, in draw order, none twice.
    rest = iter(consumed)
    assert all(call in rest for call in calls), (calls, consumed)
