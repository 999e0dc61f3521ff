"""The epoch cursor: which windows each epoch() yields, and the state, with no threads."""

from __future__ import annotations

import pytest

import chunkstream as cs
from chunkstream.plans import EpochCursor


def _windows(span):
    """Each chunk's window (one piece per chunk under a window plan)."""
    assert all(len(pieces) == 1 for pieces in span.windows)
    return [(pieces[0].start, pieces[0].stop) for pieces in span.windows]


def _cursor(rank=0, world_size=1, kind="shuffled"):
    plan = cs.plans.make_plan(kind, total_timesteps=1000, chunk_size=100, align=1, seed=4)
    return EpochCursor(plan, rank=rank, world_size=world_size), plan


def test_epochs_follow_the_plan_and_advance():
    cursor, plan = _cursor()
    for epoch in range(3):
        span = cursor.begin(None)
        assert span.epoch == epoch and (span.first, span.stop) == (0, 10)
        assert _windows(span) == [plan.window(epoch, i) for i in range(10)]
    assert cursor.epoch == 3


def test_ranks_split_each_epoch_without_overlap():
    spans = [_cursor(rank, 3)[0].begin(9) for rank in range(3)]
    indices = sorted(i for span in spans for i in span.share.indices)
    assert indices == list(range(27)) and all(len(s.windows) == 9 for s in spans)
    assert _cursor(0, 3)[0].chunks_per_pass == 3  # a pass of 10 windows over 3 ranks
    assert _cursor(kind="random")[0].chunks_per_pass is None


def test_at_skips_steps_and_the_state_resumes_them():
    cursor, plan = _cursor()
    span = cursor.begin(6, at=2)
    assert (span.first, span.stop) == (2, 6)
    assert _windows(span) == [plan.window(0, i) for i in range(2, 6)]
    span.received = 4
    state = cursor.state_dict()
    assert state == {"epoch": 0, "step": 4, "num_chunks": 6, "seed": 4, "world_size": 1,
                     "consumed": 4, "total": 6}  # fmt: skip
    other, _ = _cursor()
    other.load_state(state)
    resumed = other.begin(6)
    assert resumed.windows == span.windows[2:] and resumed.first == 4
    span.received = 6  # finished: the state points at the next epoch
    assert cursor.state_dict()["epoch"] == 1 and cursor.state_dict()["step"] == 0


def test_a_new_epoch_drops_the_previous_span():
    cursor, _ = _cursor()
    first = cursor.begin(5)
    second = cursor.begin(5)
    assert first.dropped and not second.dropped and cursor.active is second


@pytest.mark.parametrize(("num_chunks", "at", "name"), [(-1, 0, "num_chunks"), (3, 4, "at"),
                                                       (3, -1, "at"), (3, True, "at")])  # fmt: skip
def test_bad_lengths_and_steps_are_refused_by_name(num_chunks, at, name):
    cursor, _ = _cursor()
    with pytest.raises(cs.ConfigError, match=rf"^{name}="):
        cursor.begin(num_chunks, at)
    assert cursor.epoch == 0 and cursor.active is None  # nothing moved
