"""cs.BatchStream: device batches per epoch, deterministic, resumable to the batch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import chunkstream as cs
from tests.flat import loader_from, stream_from

T, WINDOW = 2000, 16


def source():
    t = np.arange(T, dtype=np.float32)
    return cs.NumpySource({"x": np.stack([t, -t], axis=1), "s": (2 * t)[:, None].repeat(3, axis=1)})


def loader(**kwargs):
    options = {"device": "cpu", "workers": 2, "prefetch": 2, "sampling": "shuffled", "seed": 4}
    return loader_from(source(), 200, **{**options, **kwargs})


def stream(ld, **kwargs):
    # mix=1: these tests pin the within-chunk draws (the default mixes; tests/test_defaults.py)
    options = {
        "window": WINDOW,
        "batch_size": 8,
        "batches_per_chunk": 5,
        "chunks_per_epoch": 6,
        "mix": 1,
    }
    return stream_from(ld, **{**options, **kwargs})


def digest(batch) -> tuple:
    """What identifies a batch: its window starts (the data is the time index)."""
    x = batch["x"] if isinstance(batch, dict) else batch
    return tuple(int(v) for v in x[:, 0, 0].tolist())


def test_batches_are_windows_of_the_source_in_the_requested_shape():
    with loader() as ld:
        batches = list(stream(ld))
        assert len(batches) == 30 == len(stream(ld))
        for batch in batches:
            assert set(batch) == {"x", "s", "start"}  # the fields and each window's start
            x, s = batch["x"], batch["s"]
            assert torch.equal(batch["start"], x[:, 0, 0].long())
            assert x.shape == (8, WINDOW, 2) and s.shape == (8, WINDOW, 3)
            starts = x[:, 0, 0]
            # every sample is a contiguous window of the stored data, inside [0, T - WINDOW]
            expected = starts[:, None] + torch.arange(WINDOW, dtype=torch.float32)
            torch.testing.assert_close(x[:, :, 0], expected)
            torch.testing.assert_close(x[:, :, 1], -expected)
            torch.testing.assert_close(s, 2 * expected[:, :, None].expand(-1, -1, 3))
            assert int(starts.min()) >= 0 and int(starts.max()) <= T - WINDOW
        single = next(iter(stream(ld, fields="x")))
        assert isinstance(single, torch.Tensor) and single.shape == (8, WINDOW, 2)
        chosen = next(iter(stream(ld, fields=["s"])))
        assert set(chosen) == {"s", "start"}


def test_samples_of_a_batch_come_from_one_chunk_in_plan_order():
    with loader(workers=1) as ld:
        windows = [ld.plan.window(0, i) for i in range(6)]
    with loader() as ld:
        batches = list(stream(ld))
    for b, batch in enumerate(batches):
        start, stop = windows[b // 5]
        starts = batch["x"][:, 0, 0]
        assert start <= int(starts.min()) and int(starts.max()) <= stop - WINDOW


def test_len_is_every_epoch_and_a_plan_fills_the_counts():
    plan = cs.plan_epoch(T, chunk_size=200, batch_size=50)  # 10 chunks x 4 batches
    with loader() as ld:
        s = cs.BatchStream(ld, window=WINDOW, plan=plan)
        assert (s.batch_size, s.batches_per_chunk, s.chunks_per_epoch) == (50, 4, 10)
        assert len(s) == 40 == plan.batches_per_epoch
        for _epoch in range(2):
            assert sum(1 for _ in s) == 40
        # an explicit count wins over the plan's: chunks, or batches per chunk
        assert (
            len(
                cs.BatchStream(
                    ld, window=WINDOW, plan=plan, options=cs.StreamOptions(chunks_per_epoch=3)
                )
            )
            == 12
        )
        assert len(cs.BatchStream(ld, window=WINDOW, plan=plan, batches_per_chunk=1)) == 40
        # without a count, one pass of the shuffled plan
        one_pass = cs.BatchStream(ld, window=WINDOW, batch_size=4, batches_per_chunk=2)
        assert one_pass.chunks_per_epoch == 10


def test_an_epoch_is_the_plans_batch_count_the_last_chunk_feeding_the_rest():
    # T=2000, chunk 300, batch 40: 50 batches per pass, 7 per chunk -> 7 chunks (the
    # chunk loop's 49 batches) and one more chunk for the 50th
    plan = cs.plan_epoch(T, chunk_size=300, batch_size=40)
    assert (plan.batches_per_epoch, plan.chunks_per_epoch, plan.batches_per_chunk) == (50, 7, 7)
    with cs.ChunkLoader(source(), 300, device="cpu", sampling="shuffled", seed=4) as ld:
        s = cs.BatchStream(ld, window=WINDOW, plan=plan, mix=1)  # draws within each chunk
        assert (len(s), s.chunks_per_epoch) == (50, 8)
        batches = list(s)
        assert len(batches) == 50 and len(list(s)) == 50  # every epoch
        windows = [ld.plan.window(0, i) for i in range(8)]
        for b, batch in enumerate(batches):  # 7 from each chunk, the 8th chunk feeds one
            start, stop = windows[b // 7]
            starts = batch["x"][:, 0, 0]
            assert start <= int(starts.min()) and int(starts.max()) <= stop - WINDOW
        # resume inside the short last chunk's epoch tail: the rest is unchanged
        reference = [digest(b) for b in batches]
    with cs.ChunkLoader(source(), 300, device="cpu", sampling="shuffled", seed=4) as ld:
        s = cs.BatchStream(ld, window=WINDOW, plan=plan, mix=1)
        it = iter(s)  # held, as by a trainer mid-epoch
        seen = [digest(b) for b in itertools.islice(it, 45)]
        state = s.state_dict()
    with cs.ChunkLoader(source(), 300, device="cpu", sampling="shuffled", seed=4) as ld:
        s = cs.BatchStream(ld, window=WINDOW, plan=plan, mix=1)
        s.load_state_dict(state)
        assert seen + [digest(b) for b in s] == reference


def test_same_seed_same_batches_whatever_the_worker_count():
    runs = []
    for workers in (1, 3):
        with loader(workers=workers) as ld:
            s = stream(ld)
            runs.append([digest(b) for _ in range(2) for b in s])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == len(runs[0])  # no two batches alike: the seeds differ
    with loader() as ld:
        other = [digest(b) for b in stream(ld, seed=99)]
    assert other != runs[0][:30]


def _reference(epochs=2):
    with loader() as ld:
        s = stream(ld)
        return [digest(b) for _ in range(epochs) for b in s]


@pytest.mark.parametrize("cut", [0, 1, 3, 5, 12, 29, 30, 31, 44, 59])
def test_resume_yields_exactly_the_remaining_batches(cut):
    # cut batches are trained, the state saved inside the loop, the process "dies"; a fresh
    # loader and stream resume and must yield what the uninterrupted run yielded after it.
    reference = _reference()
    with loader() as ld:
        s = stream(ld)
        seen = []
        epochs = iter(range(2))
        state = s.state_dict()
        while len(seen) < cut:
            next(epochs)
            for batch in s:
                seen.append(digest(batch))
                if len(seen) == cut:
                    state = s.state_dict()  # a checkpoint callback, then the crash
                    break
    assert seen == reference[:cut]
    assert set(state) == {"loader", "batch", "refill", "batches_per_chunk", "seed", "align"}
    assert all(isinstance(v, int) for v in state["loader"].values())
    with loader() as ld:
        s = stream(ld)
        it = iter(s)  # Lightning calls iter() before it loads the state: still exact
        s.load_state_dict(state)
        rest = [digest(b) for b in it]
        while len(seen) + len(rest) < len(reference):
            rest += [digest(b) for b in s]
    assert rest == reference[cut:]


def test_resume_state_after_a_resume_is_exact_too():
    reference = _reference()
    states = []
    with loader() as ld:
        s = stream(ld)
        it = iter(s)  # held: the epoch is not over (a closed one would be, see below)
        for batch in itertools.islice(it, 7):
            del batch
        states.append(s.state_dict())
    with loader() as ld:
        s = stream(ld)
        s.load_state_dict(states[0])
        assert s.state_dict()["batch"] == 2  # nothing drawn yet: still the loaded position
        it = iter(s)
        got = [digest(b) for b in itertools.islice(it, 4)]
        states.append(s.state_dict())
    assert got == reference[7:11]
    with loader() as ld:
        s = stream(ld)
        s.load_state_dict(states[1])
        assert next(digest(b) for b in s) == reference[11]


def test_iterating_again_mid_epoch_starts_the_next_epoch():
    reference = _reference()
    with loader() as ld:
        s = stream(ld)
        first = iter(s)
        head = [digest(next(first)) for _ in range(3)]
        second = [digest(b) for b in s]  # epoch 1, whole
        assert next(first, None) is None  # the abandoned iteration ends
    assert head == reference[:3]
    assert len(second) == 30 and second != reference[:30]


def test_bad_state_is_refused():
    with loader() as ld:
        s = stream(ld)
        good = s.state_dict()
        with pytest.raises(cs.ConfigError, match="'batch' in"):
            s.load_state_dict({**good, "batch": 5})
        with pytest.raises(cs.ConfigError, match="batches_per_chunk=5"):
            s.load_state_dict({**good, "batches_per_chunk": 3})
        with pytest.raises(cs.ConfigError, match="state_dict"):
            s.load_state_dict({})
        with pytest.warns(UserWarning, match="seed=1"):
            s.load_state_dict({**good, "seed": 1})


@pytest.mark.parametrize("cut", [3, 5, 12])  # mid-chunk, at a chunk's end, mid-epoch
@pytest.mark.parametrize("how", ["break", "close"])
def test_an_epoch_ended_early_resumes_where_the_live_run_goes_on(cut, how):
    # After a break (the loop's iterator is collected, so closed) the live stream's next
    # iter() starts epoch 1; a state saved then must resume there, not inside epoch 0.
    with loader() as ld:
        s = stream(ld)
        if how == "break":
            for i, _batch in enumerate(s):
                if i + 1 == cut:
                    break
        else:
            it = iter(s)
            for _ in range(cut):
                next(it)
            it.close()
        state = s.state_dict()
        live = [digest(b) for b in s]  # the uninterrupted run's next epoch
    assert state["batch"] == 0 and state["loader"]["epoch"] == 1
    assert state["loader"]["step"] == 0
    with loader() as ld:
        s = stream(ld)
        s.load_state_dict(state)
        resumed = [digest(b) for b in s]
    assert len(live) == 30 and resumed == live


def test_a_held_iterator_mid_epoch_still_resumes_inside_the_epoch():
    # Lightning keeps the epoch's iterator until the next iter(): not closed, so the state
    # is mid-epoch (the docstring's advice: batches_per_epoch= the trainer's limit).
    reference = _reference()
    with loader() as ld:
        s = stream(ld)
        it = iter(s)
        head = [digest(next(it)) for _ in range(7)]
        state = s.state_dict()
    assert state["batch"] == 2 and head == reference[:7]
    with loader() as ld:
        s = stream(ld)
        s.load_state_dict(state)
        assert next(digest(b) for b in s) == reference[7]


def test_a_source_that_learns_its_fields_at_the_first_read_gives_the_same_batches():
    t = np.arange(T, dtype=np.float32)  # the data of source()
    arrays = {"x": np.stack([t, -t], axis=1), "s": (2 * t)[:, None].repeat(3, axis=1)}
    calls = []

    def load_fn(start, stop):
        calls.append((start, stop))
        return arrays["x"][start:stop], arrays["s"][start:stop]

    learning = cs.CallableSource(load_fn, T, names=("x", "s"), specs="first")
    options = {"device": "cpu", "workers": 2, "prefetch": 2, "sampling": "shuffled", "seed": 4}
    with loader_from(learning, 200, **options) as lazy, loader() as known:
        got, want = list(stream(lazy)), list(stream(known))
        assert calls and len(got) == len(want) == 30
        for a, b in zip(got, want, strict=True):
            assert set(a) == {"x", "s", "start"}
            torch.testing.assert_close(a["start"], b["start"], rtol=0, atol=0)
            torch.testing.assert_close(a["x"], b["x"], rtol=0, atol=0)
            torch.testing.assert_close(a["s"], b["s"], rtol=0, atol=0)
