"""Ranks, shares of an epoch, elastic resume (in process), and a real torchrun run (gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import chunkstream as cs
from chunkstream.distributed import epoch_share, resolve_rank

T, CHUNK = 2600, 100  # 26 tiles per pass, so odd splits happen


def make_source() -> cs.NumpySource:
    data = np.arange(T * 3, dtype=np.float32).reshape(T, 3)
    return cs.NumpySource({"x": data})


def loader(world: int, rank: int, seed: int = 5) -> cs.ChunkLoader:
    return cs.ChunkLoader(
        make_source(),
        CHUNK,
        device="cpu",
        workers=2,
        seed=seed,
        options=cs.LoaderOptions(rank=rank, world_size=world),
    )


def windows_of(chunks) -> list[tuple[int, int]]:
    return [(c.start, c.stop) for c in chunks]


def plan_windows(epoch: int, indices) -> list[tuple[int, int]]:
    plan = cs.make_plan("shuffled", total_timesteps=T, chunk_size=CHUNK, seed=5)
    return [plan.window(epoch, i) for i in indices]


# -- helpers ---------------------------------------------------------------------------


def test_resolve_rank_defaults_overrides_and_errors():
    assert resolve_rank() == (0, 1)
    assert resolve_rank(3, 4) == (3, 4)
    with pytest.raises(cs.ConfigError, match="rank=4"):
        resolve_rank(4, 4)
    with pytest.raises(cs.ConfigError, match="world_size=0"):
        resolve_rank(0, 0)


@pytest.mark.parametrize("uneven", ["exact", "pad", "drop"])
@pytest.mark.parametrize(("consumed", "total", "world"), [(0, 26, 2), (4, 26, 3), (6, 25, 4)])
def test_epoch_share_splits_the_remainder(uneven, consumed, total, world):
    shares = [
        epoch_share(
            epoch=0, consumed=consumed, total=total, rank=r, world_size=world, uneven=uneven
        ).indices
        for r in range(world)
    ]
    flat = sorted(i for s in shares for i in s)
    counts = {len(s) for s in shares}
    assert len(flat) == len(set(flat))  # disjoint
    remaining = list(range(consumed, total))
    if uneven == "exact":
        assert flat == remaining and max(counts) - min(counts) <= 1
    else:
        assert len(counts) == 1
        kept = [i for i in flat if i < total]
        assert kept == (remaining if uneven == "pad" else remaining[: len(kept)])
        assert len(flat) - len(remaining) in range(-(world - 1), world)


def test_epoch_share_rejects_an_unknown_policy():
    with pytest.raises(cs.ConfigError, match="uneven"):
        epoch_share(epoch=0, consumed=0, total=4, rank=0, world_size=1, uneven="round")


# -- in-process sharding and elastic resume ----------------------------------------------


def test_ranks_get_disjoint_equal_shares_covering_a_pass():
    n = cs.plan_epoch(T, CHUNK, 10, world_size=2).chunks_per_epoch
    shares = []
    for rank in range(2):
        with loader(2, rank) as ld:
            shares.append(windows_of(ld.epoch(n)))
    assert len(shares[0]) == len(shares[1]) == n == 13
    flat = shares[0] + shares[1]
    assert sorted(flat) == sorted(plan_windows(0, range(26)))
    starts = sorted(s for s, _ in flat)
    assert starts == [starts[0] + k * CHUNK for k in range(26)]  # one pass, no overlap


def run_partial(world: int, n: int, k: int, epoch_before: int = 1):
    """Every rank runs ``epoch_before`` whole epochs and ``k`` chunks of the next; returns
    the windows each rank received in that epoch and rank 0's state."""
    seen, states = [], []
    for rank in range(world):
        with loader(world, rank) as ld:
            for _ in range(epoch_before):
                list(ld.epoch(n))
            it = ld.epoch(n)
            seen.append(windows_of(next(it) for _ in range(k)))
            states.append(ld.state_dict())
    assert all(s == states[0] for s in states)  # every rank would save the same state
    return seen, states[0]


def resume(world: int, state: dict, n: int, uneven: str = "exact"):
    """Every rank of ``world`` resumes from ``state``: (resumed epoch's windows per rank,
    the following epoch's windows per rank)."""
    rest, following = [], []
    for rank in range(world):
        with loader(world, rank) as ld:
            ld.load_state_dict(state, uneven=uneven)
            rest.append(windows_of(ld.epoch(n)))
            following.append(windows_of(ld.epoch(n)))
    return rest, following


def test_elastic_resume_two_ranks_to_one():
    seen, state = run_partial(world=2, n=13, k=5)
    assert state["consumed"] == 10 and state["total"] == 26 and state["world_size"] == 2
    rest, following = resume(1, state, n=26)
    assert rest[0] == plan_windows(1, range(10, 26))  # the remaining windows, in order
    flat = seen[0] + seen[1] + rest[0]
    assert sorted(flat) == sorted(plan_windows(1, range(26)))  # no repeat, no omission
    with loader(1, 0) as fresh:
        list(fresh.epoch(26))
        list(fresh.epoch(26))
        assert following[0] == windows_of(fresh.epoch(26))  # later epochs as a 1-rank run


def test_elastic_resume_one_rank_to_two_with_an_odd_remainder():
    seen, state = run_partial(world=1, n=26, k=7)
    rest, following = resume(2, state, n=13)
    assert [len(r) for r in rest] == [10, 9]  # 19 left: rank 0 gets one more
    flat = seen[0] + rest[0] + rest[1]
    assert len(set(flat)) == 26 and sorted(flat) == sorted(plan_windows(1, range(26)))
    assert sorted(following[0] + following[1]) == sorted(plan_windows(2, range(26)))
    padded, _ = resume(2, state, n=13, uneven="pad")
    assert [len(r) for r in padded] == [10, 10]
    assert set(rest[0] + rest[1]) <= set(padded[0] + padded[1])


def test_elastic_resume_chains_and_state_round_trips():
    _, state = run_partial(world=2, n=13, k=3)  # 6 of 26 delivered
    with loader(3, 0) as ld:
        ld.load_state_dict(state)
        assert ld.state_dict()["consumed"] == 6  # a loaded state is saved as it is
    parts = []
    for rank in range(3):  # resume with 3 ranks, each takes 2 more, then save again
        with loader(3, rank) as ld:
            ld.load_state_dict(state)
            it = ld.epoch(8)
            parts.append(windows_of(next(it) for _ in range(2)))
            again = ld.state_dict()
    assert again["consumed"] == 12 and again["total"] == 26
    rest, _ = resume(2, again, n=13)
    flat = [w for p in parts for w in p] + rest[0] + rest[1]
    assert sorted(flat) == sorted(plan_windows(1, range(6, 26)))


def test_state_from_another_world_size_needs_the_epoch_length():
    with loader(1, 0) as ld, pytest.raises(cs.ConfigError, match="total"):
        ld.load_state_dict({"epoch": 1, "step": 3, "world_size": 2})


# -- torchrun ----------------------------------------------------------------------------


def gloo_available() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_gloo_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nccl_ready() -> str | None:
    """Why the two-rank NCCL run cannot happen here, or None when it can."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return "needs 2 GPUs, one per rank (the lent H200 machine has one: skipped there)"
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return "torch.distributed with the NCCL backend is not available"
    return None


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=pytest.mark.gpu)])
def test_torchrun_two_ranks(tmp_path: Path, backend: str):
    # gloo: ranks on the CPU. nccl: the same run with the trainer on cuda:{LOCAL_RANK}
    # (NCCL fails with "Duplicate GPU detected" if both ranks pick one GPU).
    if backend == "gloo" and not gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    if backend == "nccl" and (why := nccl_ready()) is not None:
        pytest.skip(why)
    total, chunk = 1030, 64  # 16 tiles and a phase
    rng = np.random.default_rng(0)
    data = rng.standard_normal((total, 6)).astype(np.float32)
    store = tmp_path / "x.zarr"
    array = zarr.create_array(store, shape=data.shape, chunks=(50, 6), dtype="float32")
    array[:] = data
    # The elastic state: one process read 5 of epoch 0's 16 windows.
    with cs.ChunkLoader(
        cs.ZarrSource(str(store), {"x": (slice(None),)}), chunk, device="cpu", seed=3
    ) as single:
        it = single.epoch(16)
        [next(it) for _ in range(5)]
        state = single.state_dict()
        plan = single.plan
    remaining = [list(plan.window(0, i)) for i in range(5, 16)]
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "CHUNKSTREAM_DIST_BACKEND": backend}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(cs.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(Path(__file__).with_name("dist_worker.py")),
        str(store), str(out), json.dumps({"state": state, "remaining": remaining}),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish within 120 s:\n{exc.stderr}")
    if done.returncode and "gloo" in done.stderr.lower() and "unsupported" in done.stderr.lower():
        pytest.skip(f"gloo cannot run here: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    # The reference trainer under DDP: 927 training timesteps -> 14 chunks of 64 per epoch,
    # 7 per rank, 8 batches each; the ranks end with the same parameters and losses.
    assert reports[0]["train_batches"] == reports[1]["train_batches"] == [56, 56]
    assert reports[0]["param_norm"] == reports[1]["param_norm"]
    assert reports[0]["val_loss"] == reports[1]["val_loss"]
    assert reports[0]["resumed_epochs"] == reports[1]["resumed_epochs"] == 3
    if reports[0]["events"]:  # tensorboard is installed: one writer, rank 0's
        assert reports[0]["events"] == reports[1]["events"] and len(reports[0]["events"]) == 1
    assert [len(r["resumed"]) for r in reports] == [6, 5]  # 11 left, split 6 + 5
    expected = ["cuda:0", "cuda:1"] if backend == "nccl" else ["cpu", "cpu"]
    assert [r["device"] for r in reports] == expected


def test_running_moments_merge_like_one_stream():
    from chunkstream.train import RunningMoments

    x = torch.randn(300, 5, dtype=torch.float64) * 3 + 1
    parts = [RunningMoments(5), RunningMoments(5)]
    parts[0].update(x[:120])
    parts[1].update(x[120:170])
    parts[1].update(x[170:])
    merged = RunningMoments(5)
    for part in parts:
        merged.merge(part)
    merged.merge(RunningMoments(5))  # an empty rank changes nothing
    assert merged.count == 300
    torch.testing.assert_close(merged.mean, x.mean(0))
    torch.testing.assert_close(merged.var, x.var(0, unbiased=False))
