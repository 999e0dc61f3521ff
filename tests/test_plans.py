"""Window plans and epoch arithmetic: property tests against the contracts in plans/."""

from __future__ import annotations

import math
import threading
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import chunkstream.plans as plans
from chunkstream._errors import ConfigError
from chunkstream.plans import (
    EpochPlan,
    RandomPlan,
    SequentialPlan,
    ShuffledPlan,
    WindowPlan,
    calculate_chunk_params,
    make_plan,
    plan_epoch,
    remaining_indices,
)

PLANS = (RandomPlan, ShuffledPlan, SequentialPlan)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def plan_args(draw, cls=None):
    """Valid (cls, kwargs) for a plan, including chunk_size >= T and large aligns."""
    cls = cls or draw(st.sampled_from(PLANS))
    total = draw(st.integers(1, 5000))
    chunk = draw(st.integers(1, total + 3))
    if chunk < total:
        align_max = total - chunk + 1
        if cls is ShuffledPlan:
            divisors = [a for a in range(1, min(chunk, align_max) + 1) if chunk % a == 0]
            align = draw(st.sampled_from(divisors))
        else:
            align = draw(st.integers(1, align_max))
    else:
        align = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**70))
    return cls, dict(total_timesteps=total, chunk_size=chunk, align=align, seed=seed)


def test_public_names():
    assert plans.__all__ == sorted(plans.__all__)
    assert set(plans.__all__) == {
        "EpochPlan",
        "Piece",
        "PiecePlan",
        "RandomPlan",
        "Segment",
        "Segments",
        "SequentialPlan",
        "ShuffledPlan",
        "WindowPlan",
        "calculate_chunk_params",
        "chunk_pieces",
        "make_plan",
        "plan_epoch",
        "remaining_indices",
        "split_segments",
    }


@pytest.mark.parametrize("cls", PLANS)
def test_plans_are_frozen_keyword_only_window_plans(cls):
    plan = cls(total_timesteps=100, chunk_size=10)
    assert isinstance(plan, WindowPlan)
    with pytest.raises(AttributeError):
        plan.seed = 1
    with pytest.raises(TypeError):
        cls(100, 10)


# -- windows ----------------------------------------------------------------------------


@FAST
@given(plan_args(), st.integers(0, 10), st.lists(st.integers(0, 10**6), max_size=30))
def test_bounds_length_alignment_and_vectorised_equals_scalar(args, epoch, indices):
    cls, kw = args
    plan = cls(**kw)
    total, chunk, align = kw["total_timesteps"], kw["chunk_size"], kw["align"]
    vec = plan.windows(epoch, np.asarray(indices, dtype=np.int64))
    assert vec.shape == (len(indices), 2) and vec.dtype == np.int64
    for row, index in zip(vec, indices, strict=True):
        start, stop = plan.window(epoch, index)
        assert (start, stop) == tuple(row)
        assert type(start) is int and type(stop) is int
        assert 0 <= start < stop <= total
        if chunk >= total:
            assert (start, stop) == (0, total)
        elif cls is SequentialPlan:
            assert start % chunk == 0
            assert stop - start == chunk or stop == total
        else:
            assert stop - start == chunk
            assert start % align == 0


@FAST
@given(plan_args(ShuffledPlan), st.integers(0, 5), st.integers(0, 3))
def test_shuffled_pass_uses_every_tile_once(args, epoch, pass_):
    _, kw = args
    plan = ShuffledPlan(**kw)
    total, chunk = kw["total_timesteps"], kw["chunk_size"]
    k = plan.windows_per_pass
    assert k == max(1, total // chunk)
    w = plan.windows(epoch, np.arange(pass_ * k, (pass_ + 1) * k))
    if chunk >= total:
        assert (w == [0, total]).all()
        return
    phase = int(w[:, 0].min())
    assert 0 <= phase <= total - k * chunk
    # the starts are exactly phase + tile * chunk for each tile, once
    assert sorted(w[:, 0].tolist()) == [phase + t * chunk for t in range(k)]
    covered = np.zeros(total, dtype=np.int64)
    for start, stop in w:
        covered[start:stop] += 1
    assert covered.max() == 1 and covered.sum() == k * chunk


@FAST
@given(st.integers(1, 3000), st.integers(1, 3000), st.integers(0, 3))
def test_sequential_covers_the_data_once_per_pass(total, chunk, pass_):
    plan = SequentialPlan(total_timesteps=total, chunk_size=chunk, seed=5)
    n = plan.windows_per_pass
    assert n == math.ceil(total / chunk)
    w = plan.windows(0, np.arange(pass_ * n, (pass_ + 1) * n))
    assert w[0, 0] == 0 and w[-1, 1] == total
    assert (w[1:, 0] == w[:-1, 1]).all()  # contiguous, no gap, no overlap


def test_random_windows_per_pass_is_none():
    assert RandomPlan(total_timesteps=100, chunk_size=10).windows_per_pass is None


@FAST
@given(plan_args(), st.integers(0, 5))
def test_same_seed_same_windows_new_instance(args, epoch):
    cls, kw = args
    idx = np.arange(50)
    assert (cls(**kw).windows(epoch, idx) == cls(**kw).windows(epoch, idx)).all()
    # a pure function: calling in any order, repeatedly, gives the same answers
    plan = cls(**kw)
    forward = [plan.window(epoch, i) for i in range(20)]
    backward = [plan.window(epoch, i) for i in reversed(range(20))][::-1]
    assert forward == backward


@pytest.mark.parametrize("cls", [RandomPlan, ShuffledPlan])
def test_seed_and_epoch_change_the_windows(cls):
    kw = dict(total_timesteps=100_000, chunk_size=100, align=4)
    idx = np.arange(200)
    base = cls(**kw, seed=1).windows(0, idx)
    assert not (base == cls(**kw, seed=2).windows(0, idx)).all()
    assert not (base == cls(**kw, seed=1).windows(1, idx)).all()
    assert not (base == cls(**kw, seed=2**64 + 1).windows(0, idx)).all()  # no truncation


def test_sequential_ignores_seed():
    a = SequentialPlan(total_timesteps=1000, chunk_size=64, seed=1).windows(3, np.arange(40))
    b = SequentialPlan(total_timesteps=1000, chunk_size=64, seed=9).windows(0, np.arange(40))
    assert (a == b).all()


def test_shuffled_draws_every_order_and_phase():
    # T=10, c=3: 3 tiles (6 orders) x 2 phases; each (epoch) pass should reach all 12.
    plan = ShuffledPlan(total_timesteps=10, chunk_size=3, seed=0)
    seen = Counter(tuple(plan.windows(e, np.arange(3))[:, 0].tolist()) for e in range(1200))
    assert len(seen) == 12
    assert min(seen.values()) > 1200 / 12 / 2  # roughly uniform, generous bound


def test_random_starts_cover_the_range():
    plan = RandomPlan(total_timesteps=40, chunk_size=10, align=3)
    starts = set(plan.windows(0, np.arange(2000))[:, 0].tolist())
    assert starts == set(range(0, 31, 3))


def test_large_tile_count_is_a_permutation():
    plan = ShuffledPlan(total_timesteps=200_003, chunk_size=2, seed=7)
    w = plan.windows(4, np.arange(plan.windows_per_pass))
    tiles = (w[:, 0] - w[:, 0].min()) // 2
    assert np.array_equal(np.sort(tiles), np.arange(plan.windows_per_pass))


def test_concurrent_calls_agree():
    plan = ShuffledPlan(total_timesteps=50_000, chunk_size=64, seed=3)
    expected = [plan.window(2, i) for i in range(500)]
    results: list[list[tuple[int, int]]] = []

    def work():
        results.append([plan.window(2, i) for i in range(500)])

    threads = [threading.Thread(target=work, name=f"chunkstream-test-{n}") for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 4 and all(r == expected for r in results)


# -- ranks and resume -----------------------------------------------------------------


@FAST
@given(plan_args(), st.integers(1, 6), st.integers(0, 3), st.integers(0, 20))
def test_rank_window_is_global_index(args, world, epoch, steps):
    cls, kw = args
    plan = cls(**kw)
    seen = []
    for rank in range(world):
        for step in range(steps):
            assert plan.rank_window(epoch, step, rank, world) == plan.window(
                epoch, step * world + rank
            )
            seen.append(step * world + rank)
    # disjoint indices, equal counts, together exactly the first steps * world indices
    assert sorted(seen) == list(range(steps * world))


def test_ranks_disjoint_within_a_shuffled_pass():
    plan = ShuffledPlan(total_timesteps=64 * 12 + 5, chunk_size=64, seed=11)
    world = 4
    per_rank = plan.windows_per_pass // world
    cover = np.zeros(plan.total_timesteps, dtype=np.int64)
    for rank in range(world):
        for step in range(per_rank):
            start, stop = plan.rank_window(0, step, rank, world)
            cover[start:stop] += 1
    assert cover.max() == 1 and cover.sum() == 12 * 64


@FAST
@given(st.integers(0, 300), st.integers(0, 300), st.integers(1, 9))
def test_remaining_indices_split_the_rest(consumed, extra, world):
    total = consumed + extra
    parts = [remaining_indices(consumed, total, r, world) for r in range(world)]
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(consumed, total))
    counts = [len(p) for p in parts]
    assert max(counts) - min(counts) <= 1
    if consumed % world == 0:
        step0 = consumed // world
        assert all(list(p) == [s * world + r for s in range(step0, step0 + len(p))]
                   for r, p in enumerate(parts))  # fmt: skip


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((5, 4, 0, 1), "consumed_global"),
        ((0, 4, 2, 2), "rank"),
        ((0, 4, -1, 2), "rank"),
        ((0, 4, 0, 0), "world_size"),
        ((0, -1, 0, 1), "total_global"),
        ((-1, 4, 0, 1), "consumed_global"),
    ],
)
def test_remaining_indices_errors(args, name):
    with pytest.raises(ConfigError, match=name):
        remaining_indices(*args)


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", PLANS)
@pytest.mark.parametrize(
    ("kw", "name"),
    [
        (dict(total_timesteps=0, chunk_size=1), "total_timesteps"),
        (dict(total_timesteps=10, chunk_size=0), "chunk_size"),
        (dict(total_timesteps=10, chunk_size=2.5), "chunk_size"),
        (dict(total_timesteps=10, chunk_size=2, align=0), "align"),
        (dict(total_timesteps=10, chunk_size=4, align=8), "align"),
        (dict(total_timesteps=10, chunk_size=2, seed=-1), "seed"),
        (dict(total_timesteps=10, chunk_size=2, seed=True), "seed"),
    ],
)
def test_bad_plan_arguments(cls, kw, name):
    with pytest.raises(ConfigError, match=name) as info:
        cls(**kw)
    assert isinstance(info.value, ValueError)


def test_numpy_ints_are_accepted_and_normalised():
    plan = RandomPlan(total_timesteps=np.int64(100), chunk_size=np.int32(10), seed=np.uint8(3))
    assert type(plan.total_timesteps) is int and type(plan.seed) is int
    assert plan.window(np.int64(0), np.int64(4)) == RandomPlan(
        total_timesteps=100, chunk_size=10, seed=3
    ).window(0, 4)


def test_shuffled_needs_chunk_multiple_of_align():
    with pytest.raises(ConfigError, match=r"chunk_size=10.*align=4") as info:
        ShuffledPlan(total_timesteps=100, chunk_size=10, align=4)
    assert "multiple of align" in str(info.value)
    # no constraint when the chunk is the whole data
    assert ShuffledPlan(total_timesteps=10, chunk_size=10, align=4).window(0, 0) == (0, 10)


@pytest.mark.parametrize("cls", PLANS)
def test_bad_call_arguments(cls):
    plan = cls(total_timesteps=100, chunk_size=10)
    for call, name in [
        (lambda: plan.window(-1, 0), "epoch"),
        (lambda: plan.window(0, -1), "index"),
        (lambda: plan.window(0, 2**63), "index"),
        (lambda: plan.windows(0, np.array([0, -3])), "indices"),
        (lambda: plan.windows(0, np.array([0.5])), "indices"),
        (lambda: plan.windows(0, np.zeros((2, 2), dtype=int)), "indices"),
        (lambda: plan.rank_window(0, 0, 2, 2), "rank"),
        (lambda: plan.rank_window(0, 0, 0, 0), "world_size"),
        (lambda: plan.rank_window(0, -1, 0, 1), "step"),
    ]:
        with pytest.raises(ConfigError, match=name):
            call()
    assert plan.windows(0, []).shape == (0, 2)


def test_make_plan():
    for name, cls in [("random", RandomPlan), ("shuffled", ShuffledPlan), ("sequential", SequentialPlan)]:  # fmt: skip
        plan = make_plan(name, total_timesteps=100, chunk_size=10, align=2, seed=4)
        assert plan == cls(total_timesteps=100, chunk_size=10, align=2, seed=4)
    given_plan = ShuffledPlan(total_timesteps=100, chunk_size=10)
    assert make_plan(given_plan, total_timesteps=100, chunk_size=10) is given_plan
    with pytest.raises(ConfigError, match="chunk_size"):
        make_plan(given_plan, total_timesteps=100, chunk_size=20)
    with pytest.raises(ConfigError, match=r"sampling.*'random', 'shuffled', 'sequential'"):
        make_plan("uniform", total_timesteps=100, chunk_size=10)
    with pytest.raises(ConfigError, match="sampling"):
        make_plan(None, total_timesteps=100, chunk_size=10)


# -- epoch arithmetic -----------------------------------------------------------------


def spec(total, chunk, batch, passes):
    """The rule from DESIGN.md, written independently of the implementation."""
    batches_per_epoch = (total // batch) * passes
    if total < chunk:
        return passes, total // batch, batches_per_epoch
    bpc = chunk // batch
    return batches_per_epoch // bpc, bpc, batches_per_epoch


@FAST
@given(st.integers(1, 10**7), st.integers(1, 10**6), st.integers(1, 5000), st.integers(1, 5))
def test_plan_epoch_matches_the_rule(total, chunk, batch, passes):
    assume(batch <= total and (total < chunk or batch <= chunk))
    expected = spec(total, chunk, batch, passes)
    assert calculate_chunk_params(total, chunk, batch, passes) == expected
    plan = plan_epoch(total, chunk, batch, passes)
    assert isinstance(plan, EpochPlan)
    assert (plan.chunks_per_epoch, plan.batches_per_chunk, plan.batches_per_epoch) == expected
    assert all(v > 0 for v in expected)


@FAST
@given(st.integers(1, 10**6), st.integers(1, 10**5), st.integers(1, 500), st.integers(1, 8))
def test_plan_epoch_per_rank(total, chunk, batch, world):
    assume(batch <= total and (total < chunk or batch <= chunk))
    chunks_total = spec(total, chunk, batch, 1)[0]
    if chunks_total < world:
        with pytest.raises(ConfigError, match="world_size"):
            plan_epoch(total, chunk, batch, world_size=world)
        return
    plan = plan_epoch(total, chunk, batch, world_size=world)
    assert plan.chunks_per_epoch == chunks_total // world
    assert plan.global_chunks_per_epoch == plan.chunks_per_epoch * world
    assert chunks_total - world < plan.global_chunks_per_epoch <= chunks_total


def test_epoch_plan_original_numbers_and_summary():
    plan = plan_epoch(total_timesteps=967_680, chunk_size=65_536, batch_size=256)
    assert (plan.chunks_per_epoch, plan.batches_per_chunk, plan.batches_per_epoch) == (
        14,
        256,
        3780,
    )
    assert str(plan) == plan.describe()
    assert "14 chunks/epoch" in str(plan) and "256 batches/chunk" in str(plan)
    # data shorter than a chunk: one chunk (all the data) per pass
    assert calculate_chunk_params(1000, 4096, 100, 3) == (3, 10, 30)
    with pytest.raises(AttributeError):
        plan.chunks_per_epoch = 1


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        ((100, 10, 200), {}, "batch_size"),
        ((100, 10, 20), {}, "chunk_size"),
        ((0, 10, 2), {}, "total_timesteps"),
        ((100, 0, 2), {}, "chunk_size"),
        ((100, 10, 0), {}, "batch_size"),
        ((100, 10, -2), {}, "batch_size"),
        ((100, 10, 2, 0), {}, "passes_per_epoch"),
        ((100, 10, 2.0), {}, "batch_size"),
        ((100, 10, 2), {"world_size": 0}, "world_size"),
        ((100, 50, 10), {"world_size": 3}, "world_size"),
    ],
)
def test_plan_epoch_errors(args, kwargs, name):
    with pytest.raises(ConfigError, match=name) as info:
        plan_epoch(*args, **kwargs)
    assert isinstance(info.value, ValueError)


def test_calculate_chunk_params_names_its_own_parameter():
    with pytest.raises(ValueError, match="data_passes_per_epoch"):
        calculate_chunk_params(100, 10, 2, 0)
    with pytest.raises(ValueError, match="batch_size"):
        calculate_chunk_params(100, 200, 300, 1)


def test_a_held_out_share_too_small_for_the_gap_names_val_fraction():
    from chunkstream.plans import held_out_split

    with pytest.raises(ConfigError, match=r"val_fraction=0\.001.*9-step gap.*Raise val_fraction"):
        held_out_split(1000, 0.001, 10, [(0, 500), (500, 1000)])
    split = held_out_split(1000, 0.1, 10, [(0, 500), (500, 1000)])  # a share that fits
    assert [name for name, *_ in split.val_ranges] and split.train_len < 1000
