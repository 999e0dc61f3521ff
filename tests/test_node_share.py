"""This process's share of the node: fake cgroup CPU files, the ranks on the node, and real
processes under ``taskset``, ``LOCAL_WORLD_SIZE``, a real cgroup limit and torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import chunkstream as cs
from chunkstream._memory import (
    ENV_CPUS,
    ENV_HOST_MEMORY,
    ENV_RANKS,
    check_arena_fits,
    cpu_share,
    node_share,
    ranks_on_node,
    read_node_share,
)

from . import cgroups
from .cgroups import GIB

WORKER = Path(__file__).with_name("node_worker.py")


def fake_tree(root: Path, cgroup: str, files: dict[str, object], online: str = "0-63") -> Path:
    """``/proc/self/cgroup``, 16 GiB ``MemAvailable``, CPUs online and cgroup files."""
    return cgroups.fake_tree(root, cgroup, files, available=16 * GIB, online=online)


# -- CPUs: affinity, cgroup v1 and v2 quotas, the override --------------------------------


def test_a_v2_cpu_max_bounds_the_affinity_rounded_up(tmp_path):
    root = fake_tree(
        tmp_path,
        "0::/job/step\n",
        {
            "cgroup.controllers": "cpu memory",
            "cpu.max": "max 100000",
            "job/cpu.max": "600000 100000",  # 6 CPUs
            "job/step/cpu.max": "250000 100000",  # 2.5 CPUs: the tightest, rounded up to 3
        },
    )
    assert cpu_share(root, env={}, affinity=64) == (3, "cgroup v2 /job/step quota", 64)
    assert cpu_share(root, env={}, affinity=2) == (2, "affinity", 64)  # taskset -c 0,1
    assert cpu_share(root, env={ENV_CPUS: "5"}, affinity=64)[:2] == (5, ENV_CPUS)
    with pytest.raises(cs.ConfigError, match=ENV_CPUS):
        cpu_share(root, env={ENV_CPUS: "many"}, affinity=64)


def test_a_v2_group_without_a_quota_is_the_affinity(tmp_path):
    root = fake_tree(
        tmp_path, "0::/job\n", {"cgroup.controllers": "cpu", "job/cpu.max": "max 100000"}
    )
    assert cpu_share(root, env={}, affinity=16) == (16, "affinity", 64)


def test_a_v1_cfs_quota_bounds_the_affinity(tmp_path):
    root = fake_tree(
        tmp_path,
        "5:cpu,cpuacct:/slurm/job_7\n4:memory:/slurm/job_7\n",
        {
            "cpu,cpuacct/cpu.cfs_quota_us": -1,  # the root: no quota
            "cpu,cpuacct/cpu.cfs_period_us": 100000,
            "cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us": 400000,
            "cpu,cpuacct/slurm/job_7/cpu.cfs_period_us": 100000,
        },
        online="0-31",
    )
    assert cpu_share(root, env={}, affinity=32) == (4, "cgroup v1 /slurm/job_7 quota", 32)
    # a namespace that hides the path: the mount's root is the job's group
    (root / "proc/self/cgroup").write_text("5:cpu,cpuacct:/\n")
    (root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").write_text("150000\n")
    assert cpu_share(root, env={}, affinity=32) == (2, "cgroup v1 / quota", 32)


def test_missing_cgroup_files_leave_the_affinity(tmp_path):
    root = fake_tree(tmp_path, "garbage\n4:memory:/x\n", {})
    assert cpu_share(root, env={}, affinity=3) == (3, "affinity", 64)


def test_this_machine_reads_without_error():
    share = node_share()
    assert 1 <= share.cpus <= share.node_cpus and share.threads >= 1
    assert share.cpus <= len(os.sched_getaffinity(0))
    assert share.describe().startswith("host memory: ")


# -- ranks on the node -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (1, "one process")),
        ({"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "4"}, (8, "LOCAL_WORLD_SIZE")),
        ({"SLURM_NTASKS_PER_NODE": "4"}, (4, "SLURM_NTASKS_PER_NODE")),
        ({"SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "1"}, (4, "SLURM_TASKS_PER_NODE")),
        ({"SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "2"}, (2, "SLURM_TASKS_PER_NODE")),
        ({"SLURM_TASKS_PER_NODE": "odd"}, (1, "one process")),
        ({ENV_RANKS: "3", "LOCAL_WORLD_SIZE": "8"}, (3, ENV_RANKS)),
    ],
)
def test_the_ranks_on_the_node_come_from_the_launcher(env, expected):
    assert ranks_on_node(env) == expected


def test_a_bad_rank_count_is_refused_by_name():
    with pytest.raises(cs.ConfigError, match="LOCAL_WORLD_SIZE"):
        ranks_on_node({"LOCAL_WORLD_SIZE": "0"})


def test_the_share_splits_memory_and_threads_over_the_ranks_and_says_so(tmp_path):
    root = fake_tree(
        tmp_path,
        "4:memory:/job\n",
        {
            "memory/memory.limit_in_bytes": 2**63 - 4096,
            "memory/job/memory.limit_in_bytes": 3 * GIB,
            "memory/job/memory.usage_in_bytes": 3 * GIB // 5,
        },
        online="0-1",
    )
    (root / "proc/self/status").write_text(f"RssAnon:\t{GIB // 4 // 1024} kB\n")
    share = read_node_share(root, env={"LOCAL_WORLD_SIZE": "2"}, affinity=2)
    # The limit is split over the ranks, less what this process holds: the room left now
    # (2.4 GiB) is not this rank's to halve, the other rank is about to take its part.
    assert share.process_bytes == GIB // 4
    assert share.host_bytes == 3 * GIB // 2 - GIB // 4 and share.threads == 1
    assert share.describe().startswith(
        "host memory: 1.25 GiB for this rank: the limit over 2 ranks, less this process's "
        "256 MiB; 2.4 GiB left under the job's limit of 3 GiB"
    )
    assert "2 ranks on this node (LOCAL_WORLD_SIZE); 2 CPUs of 2 (affinity)" in share.describe()
    # the memory half alone (the demo's memory row) and the CPU half alone (its threads row)
    assert share.describe() == (
        f"host memory: {share.describe_memory()}; 2 CPUs of 2 (affinity), 1 thread for this rank"
    )
    assert "CPU" not in share.describe_memory()
    assert (
        share.describe_cpus() == "2 CPUs of 2 (affinity), 2 ranks on this node (LOCAL_WORLD_SIZE)"
    )
    # the loader's arena is refused against this rank's share, not the whole room
    check_arena_fits(GIB, share)
    with pytest.raises(cs.ConfigError, match=r"do not fit this rank.s share.*2 ranks"):
        check_arena_fits(3 * GIB // 2, share)
    # never more than the room left now (another process of the job took more)
    (root / "sys/fs/cgroup/memory/job/memory.usage_in_bytes").write_text(f"{5 * GIB // 2}\n")
    share = read_node_share(root, env={"LOCAL_WORLD_SIZE": "2"}, affinity=2)
    assert share.host_bytes == GIB // 2


def test_slurm_tasks_bound_to_their_own_cpus_keep_them(tmp_path):
    root = fake_tree(tmp_path, "0::/\n", {}, online="0-63")
    env = {"SLURM_NTASKS_PER_NODE": "8", "SLURM_CPUS_PER_TASK": "8"}
    share = read_node_share(root, env=env, affinity=8)  # srun binds each task to its 8
    assert share.threads == 8 and "this Slurm task's own" in share.describe()
    # torchrun's 8 ranks inside one task of 64 CPUs share them
    env = {"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "1", "SLURM_CPUS_PER_TASK": "64"}
    assert read_node_share(root, env=env, affinity=64).threads == 8


def test_the_loader_and_its_stream_report_the_share(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv(ENV_HOST_MEMORY, str(64 * 2**20))
    src = cs.NumpySource({"x": np.zeros((4096, 64), np.float32)})
    plan = cs.plan_epoch(total_timesteps=4096, chunk_size=256, batch_size=8)
    with cs.ChunkLoader(src, 256, device="cpu", workers=1, prefetch=1) as loader:
        assert loader.share.ranks == 2 and loader.share.host_bytes == 32 * 2**20
        stream = cs.BatchStream(loader, window=4, plan=plan)
        assert "2 ranks on this node (LOCAL_WORLD_SIZE)" in stream.buffer.memory
        # half of what this rank's 32 MiB leave beside the 4-set arena, 64 KiB chunks
        assert stream.mix == min(16, (32 * 2**20 - 4 * 256 * 256) // 2 // (256 * 256))


def test_the_plan_checks_the_job_memory_for_the_ranks_per_node(capsys, monkeypatch):
    from chunkstream.cli import main

    monkeypatch.setenv(ENV_HOST_MEMORY, "24GiB")
    argv = ["plan", "--shape", "967680,13741", "--stim-dims", "1736", "--chunk-size", "65536",
            "--batch-size", "256", "--device", "cuda", "--gpu-mem", "80GB"]  # fmt: skip
    assert main([*argv, "--ranks-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert "8 ranks on this node (--ranks-per-node)" in out
    # 4 pinned slots of 3.9 GB cannot fit 3 GiB: said without --host-mem
    assert "this rank's share of the job's host memory" in out and "does NOT fit" in out
    assert "device tier" in out and "4.06 GB on cuda" in out  # the tier's device is the run's
    assert "on cpu" not in out
    assert main([*argv, "--ranks-per-node", "0"]) != 0


# -- real processes ----------------------------------------------------------------------


def _zarr_store(path: Path) -> Path:
    """16384 x 256 float32 in zstd chunks of 256 x 64: a window spans many chunks."""
    data = np.arange(16384 * 256, dtype=np.float32).reshape(16384, 256)
    zarr.create_array(str(path), data=data, chunks=(256, 64))
    return path


def _run_threads(store: Path, *, prefix: list[str], env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", ENV_CPUS)}
    done = subprocess.run(
        [*prefix, sys.executable, str(WORKER), "threads", str(store)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_process_under_taskset_starts_no_more_threads_than_its_cpu(tmp_path):
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    store = _zarr_store(tmp_path / "x.zarr")
    report = _run_threads(store, prefix=["taskset", "-c", "0"], env={})
    assert report["engine"] == "chunkstream", report
    assert report["threads"] == 1 and "1 CPU of" in report["share"], report
    # the gather's helpers copy the batches (the caller waits): at most the share too
    assert report["decode"] <= 1 and report["gather"] <= 1, report


def test_a_rank_of_two_starts_no_more_threads_than_its_share(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    store = _zarr_store(tmp_path / "x.zarr")
    report = _run_threads(store, prefix=[], env={"LOCAL_WORLD_SIZE": "2"})
    share = max(1, cpus // 2)
    assert report["threads"] == share and "2 ranks on this node" in report["share"], report
    assert 1 <= report["decode"] <= share and report["gather"] <= share, report


def _npy(path: Path, steps: int, width: int) -> Path:
    data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(steps, width))
    for start in range(0, steps, 8192):
        data[start : start + 8192] = np.arange(start, min(steps, start + 8192))[:, None]
    data.flush()
    return path


def _clean_env() -> dict[str, str]:
    drop = ("LOCAL_WORLD_SIZE", ENV_HOST_MEMORY, ENV_CPUS, ENV_RANKS)
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.slow
def test_the_loaders_own_arena_is_counted_once_under_a_job_limit(tmp_path):
    """The issue's false refusal, scaled down: an arena of 6 chunks of 60 MiB (360 MiB) in
    a 768 MiB limit. Measured after the loader allocated, the room was counted less the
    arena a second time and BatchStream refused; now the epoch streams on the host tier."""
    limit = 768 * 2**20
    store = _npy(tmp_path / "x.npy", 8 * 15360, 1024)  # 8 chunks of 15360 x 4 KiB = 60 MiB
    group = cgroups.memory_group(limit)
    try:
        done = subprocess.run(
            [sys.executable, str(WORKER), "refusal", str(group), str(store)],
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    finally:
        cgroups.remove_group(group)
    assert done.returncode == 0, f"exit {done.returncode} (137: killed)\n{done.stderr[-3000:]}"
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert "under the job's limit of 768 MiB" in lines["MEMORY"], lines
    mix, tier = lines["MIX"].split()
    assert tier == "host" and int(mix) >= 1
    done_batches, total = map(int, lines["BATCHES"].split())
    assert done_batches == total and peak <= limit


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("ranks", "limit", "steps"),
    [(2, GIB, 131072), (4, 4 * GIB, 524288)],  # 512 MiB and 2 GiB of float32 x 1024
    ids=["2-ranks-in-1GiB", "4-ranks-in-4GiB"],
)
def test_torchrun_ranks_share_one_limit_and_all_finish_an_epoch(tmp_path, ranks, limit, steps):
    """N ranks in one limit: alone, each would take half the room beside its arena for
    its buffer (N halves overcommit the limit and the kernel kills a rank, as issue 42
    saw with 4 ranks in 4 GiB); together they split it, and every rank finishes its epoch."""
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available")
    from .test_distributed import free_port

    store = _npy(tmp_path / "x.npy", steps, 1024)  # chunks of 32 MiB
    out = tmp_path / "out"
    out.mkdir()
    group = cgroups.memory_group(limit)
    env = {**_clean_env(), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(cs.__file__).parents[1]), str(Path(__file__).parent), env.get("PYTHONPATH", "")]
    )
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(WORKER), "rank", str(store), str(out),
    ]  # fmt: skip
    # The launcher joins the group before it execs torchrun: every rank starts inside it.
    join = f'echo $$ > "{group}/cgroup.procs" && exec "$@"'
    try:
        done = subprocess.run(
            ["sh", "-c", join, "sh", *torchrun],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    finally:
        cgroups.remove_group(group)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    for report in reports:
        assert report["batches"] == report["expected"] > 0, report
        assert f"{ranks} ranks on this node (LOCAL_WORLD_SIZE)" in report["memory"], report
        assert f"under the job's limit of {limit // GIB} GiB" in report["memory"], report
        assert report["group_ranks"] == [ranks, "process group ranks on this host"], report
    assert peak <= limit
