"""The host tier on CUDA: pinned batch slots, the transfer stream, events (needs a GPU)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import chunkstream as cs
from tests.faults import ArraySource, make_arrays
from tests.flat import loader_from, stream_from

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("always:chunkstream. cudaHostRegister:RuntimeWarning"),
]

WINDOW = 9


def _loader(arrays, **kwargs):
    options = {"device": "cpu", "workers": 2, "seed": 5, "pieces": 4, "window": WINDOW}
    return loader_from(ArraySource(arrays), 512, **{**options, **kwargs})


def _stream(loader, **kwargs):
    options = {"window": WINDOW, "batch_size": 32, "batches_per_chunk": 6, "chunks_per_epoch": 5,
               "mix": 3}  # fmt: skip
    return stream_from(loader, **{**options, **kwargs})


def _cpu(batch):
    if isinstance(batch, dict):
        return {k: v.cpu() for k, v in batch.items()}
    return batch.cpu()


def _assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_cuda_host_tier_batches_equal_the_cpu_ones_for_the_same_seed(dtype):
    arrays = make_arrays(6000, neurons=64)
    with _loader(arrays) as loader:
        cpu = _stream(loader, dtype=dtype)  # one stream: its buffer is kept across epochs
        expected = [_cpu(b) for _ in range(2) for b in cpu]
    with _loader(arrays) as loader:
        stream = _stream(loader, device="cuda", dtype=dtype, batch_prefetch=3)
        assert stream.buffer.tier == "host"
        got = []
        for _ in range(2):
            for batch in stream:
                assert all(t.is_cuda for t in batch.values())
                got.append(_cpu(batch))
        assert stream._tier.lane._pool.registered  # the batch sets are one registered arena
    assert len(got) == len(expected) == 2 * 30
    for a, b in zip(got, expected, strict=True):
        _assert_same(a, b)


def test_a_slot_is_refilled_only_after_its_copy_finished():
    """Two slots, a consumer stream kept busy: every batch still holds its own windows."""
    arrays = make_arrays(6000, neurons=256)
    with _loader(arrays) as loader:
        expected = [_cpu(b) for b in _stream(loader, fields="voltage", mix=2)]
    busy = torch.randn(2048, 2048, device="cuda")
    with _loader(arrays) as loader:
        stream = _stream(loader, fields="voltage", mix=2, device="cuda", batch_prefetch=0)
        got = []
        for batch in stream:
            for _ in range(4):
                busy = busy @ busy / busy.norm()  # the consumer's stream runs behind
            got.append(batch.clone())
        got = [g.cpu() for g in got]
    for a, b in zip(got, expected, strict=True):
        _assert_same(a, b)


def test_the_device_holds_only_the_batches_in_flight():
    arrays = make_arrays(16000, neurons=512)
    with cs.ChunkLoader(ArraySource(arrays), 2048, device="cpu", workers=2, seed=5, options=cs.LoaderOptions(pieces=4, window=WINDOW)) as loader:  # fmt: skip
        stream = _stream(loader, fields="voltage", mix=4, device="cuda", batch_size=8,
                         batch_prefetch=2)  # fmt: skip
        batch_bytes = 8 * WINDOW * 512 * 4  # 147 kB; one chunk is 4 MiB
        for batch in itertools.islice(iter(stream), 3):
            del batch  # warm up: the allocator's blocks exist
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for batch in stream:
            del batch
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    # batch_prefetch + 1 ahead, the one yielded, frees deferred behind the consumer's
    # stream: a few batches, far below the buffer's 16 MiB or even one chunk.
    assert peak <= (2 + 4) * batch_bytes + (1 << 20), (peak, batch_bytes)


def test_resume_on_the_cuda_host_tier_is_exact():
    arrays = make_arrays(6000, neurons=32)
    with _loader(arrays) as loader:
        uninterrupted = _stream(loader, device="cuda")  # one stream over both epochs
        full = [_cpu(b) for _ in range(2) for b in uninterrupted]
    with _loader(arrays) as loader:
        stream = _stream(loader, device="cuda")
        it = iter(stream)
        head = [_cpu(b) for b in itertools.islice(it, 11)]
        state = stream.state_dict()
    with _loader(arrays) as loader:
        stream = _stream(loader, device="cuda")
        stream.load_state_dict(state)
        tail = [_cpu(b) for b in stream] + [_cpu(b) for b in stream]
    for a, b in zip(head + tail, full, strict=True):
        _assert_same(a, b)


def test_the_host_tier_needs_a_cpu_loader():
    arrays = make_arrays(3000, neurons=8)
    with _loader(arrays, device="cuda") as loader:
        with pytest.raises(cs.ConfigError, match="device='cpu'"):
            _stream(loader, buffer="host")
        assert _stream(loader).buffer.tier == "device"
        batch = next(iter(_stream(loader, fields="voltage")))
        assert batch.is_cuda
        np.testing.assert_equal(batch.shape, (32, WINDOW, 8))


def test_breaking_out_on_cuda_gives_the_pinned_slots_back():
    arrays = make_arrays(6000, neurons=64)
    with _loader(arrays) as loader:
        expected = [_cpu(b) for b in _stream(loader, fields="voltage")]
    with _loader(arrays) as loader:
        stream = _stream(loader, fields="voltage", device="cuda", batch_prefetch=3)
        start = stream.state_dict()
        for _ in range(4):
            for k, batch in enumerate(stream):
                del batch
                if k == 1:
                    break  # batches gathered and copied ahead are abandoned
        stream.load_state_dict(start)  # back to the first epoch's start, for the comparison
        got = [b.cpu() for b in stream]
    for a, b in zip(got, expected, strict=True):
        _assert_same(a, b)
