"""Host memory as the job sees it: MemAvailable, cgroup v1 and v2 limits, the environment's cap."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from chunkstream import ConfigError
from chunkstream._memory import (
    ENV_HOST_MEMORY,
    check_arena_fits,
    job_memory,
    parse_memory,
    read_node_share,
)
from chunkstream._memory._defaults import host_fit

from . import cgroups

GIB = 2**30
AVAILABLE = 21 * GIB
UNLIMITED_V1 = 9223372036854771712


def fake_tree(root: Path, cgroup: str, files: dict[str, object]) -> Path:
    """``/proc/meminfo`` (21 GiB available), ``/proc/self/cgroup`` and cgroup files."""
    return cgroups.fake_tree(root, cgroup, files, available=AVAILABLE)


def test_no_cgroup_limit_is_memavailable(tmp_path):
    root = fake_tree(
        tmp_path,
        "4:memory:/job\n0::/\n",
        {
            "memory/memory.limit_in_bytes": UNLIMITED_V1,
            "memory/memory.usage_in_bytes": 5 * GIB,
            "memory/job/memory.limit_in_bytes": UNLIMITED_V1,
            "memory/job/memory.usage_in_bytes": GIB,
        },
    )
    mem = job_memory(root, env={})
    assert (mem.available, mem.limit, mem.source) == (AVAILABLE, None, "MemAvailable")
    assert mem.describe() == "host memory: 21 GiB available (MemAvailable)"


def test_cgroup_v1_room_under_the_jobs_limit(tmp_path):
    root = fake_tree(
        tmp_path,
        "9:cpu,cpuacct:/job\n4:memory:/slurm/job_7\n",
        {
            "memory/memory.limit_in_bytes": UNLIMITED_V1,
            "memory/memory.usage_in_bytes": 30 * GIB,
            "memory/slurm/memory.limit_in_bytes": UNLIMITED_V1,
            "memory/slurm/memory.usage_in_bytes": GIB,
            "memory/slurm/job_7/memory.limit_in_bytes": 3 * GIB,
            "memory/slurm/job_7/memory.usage_in_bytes": GIB,
            # reclaimable page cache is not counted against the room
            "memory/slurm/job_7/memory.stat": "cache 1\ntotal_inactive_file 536870912\n",
        },
    )
    mem = job_memory(root, env={})
    assert mem.available == 3 * GIB - GIB // 2 and mem.limit == 3 * GIB
    assert mem.source == "cgroup v1 /slurm/job_7"
    assert mem.describe().startswith("host memory: 2.5 GiB left under the job's limit of 3 GiB")


def test_nested_limits_take_the_smallest_room(tmp_path):
    # v2: the parent's limit leaves less room than the job's own
    root = fake_tree(
        tmp_path,
        "0::/user.slice/job\n",
        {
            "cgroup.controllers": "cpu memory",
            "user.slice/memory.max": 4 * GIB,
            "user.slice/memory.current": 3 * GIB,
            "user.slice/job/memory.max": 8 * GIB,
            "user.slice/job/memory.current": GIB,
            "user.slice/job/memory.stat": "anon 1\ninactive_file 0\n",
        },
    )
    mem = job_memory(root, env={})
    assert mem.available == GIB and mem.limit == 4 * GIB
    assert mem.source == "cgroup v2 /user.slice"


def test_cgroup_v2_max_means_no_limit_and_missing_files_count_as_none(tmp_path):
    root = fake_tree(
        tmp_path,
        "0::/job\n",
        {
            "cgroup.controllers": "memory",
            "job/memory.max": "max",
            "job/memory.current": GIB,
            "job/sub/memory.max": GIB,  # not the job's group: never read
        },
    )
    assert job_memory(root, env={}).source == "MemAvailable"
    empty = tmp_path / "empty"
    (empty / "proc").mkdir(parents=True)
    (empty / "proc/meminfo").write_text(f"MemAvailable: {GIB // 1024} kB\n")
    assert job_memory(empty, env={}).available == GIB  # no /proc/self/cgroup, no /sys


def test_a_cgroup_namespace_reads_the_mounts_root(tmp_path):
    # inside a container /proc/self/cgroup says "/", or names a path the mount does not have
    for i, path in enumerate(("/", "/kubepods/pod1/abc")):
        root = fake_tree(
            tmp_path / str(i),
            f"0::{path}\n",
            {"cgroup.controllers": "memory", "memory.max": 2 * GIB, "memory.current": GIB},
        )
        mem = job_memory(root, env={})
        assert (mem.available, mem.limit, mem.source) == (GIB, 2 * GIB, "cgroup v2 /")


def test_the_environment_caps_and_a_bad_value_is_refused(tmp_path):
    root = fake_tree(tmp_path, "0::/\n", {})
    mem = job_memory(root, env={ENV_HOST_MEMORY: "3GiB"})
    assert (mem.available, mem.source) == (3 * GIB, ENV_HOST_MEMORY)
    assert "capped by CHUNKSTREAM_HOST_MEMORY" in mem.describe()
    assert job_memory(root, env={ENV_HOST_MEMORY: "100GB"}).source == "MemAvailable"
    assert parse_memory("512 MB") == 512 * 10**6 and parse_memory("1073741824") == GIB
    for bad in ("lots", "-1", "0", "3 parsecs"):
        with pytest.raises(ConfigError, match=ENV_HOST_MEMORY):
            job_memory(root, env={ENV_HOST_MEMORY: bad})


def test_this_machine_reads_without_error():
    mem = job_memory()
    assert 0 <= mem.available <= mem.machine and mem.describe().startswith("host memory: ")


def test_a_loader_that_does_not_fit_the_jobs_memory_is_refused_before_allocating(tmp_path):
    root = fake_tree(
        tmp_path,
        "4:memory:/job\n",
        {
            "memory/memory.limit_in_bytes": UNLIMITED_V1,
            "memory/job/memory.limit_in_bytes": GIB,
            "memory/job/memory.usage_in_bytes": GIB // 2,
        },
    )
    share = read_node_share(root, env={}, affinity=2)
    with pytest.raises(ConfigError, match=r"left under the job.s limit of 1 GiB.*Lower chunk_size"):
        check_arena_fits(GIB, share)
    check_arena_fits(10**8, share)
    fit, _, line = host_fit(chunk_nbytes=10**7, pass_chunks=50, loader_nbytes=10**8, share=share)
    # half of what the 0.5 GiB room leaves beside the loader's 0.1 GB, in 10 MB chunks
    assert fit == (GIB // 2 - 10**8) // 2 // 10**7 and "left under the job's limit" in line


# -- a real cgroup: mix="auto" inside a limit smaller than the store ----------------------

CHILD = textwrap.dedent(
    """
    import os, sys
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:  # join the cgroup first
        f.write(str(os.getpid()))
    import numpy as np
    import chunkstream as cs

    data = np.load(sys.argv[2], mmap_mode="r")
    src = cs.NumpySource({"x": data})
    plan = cs.plan_epoch(total_timesteps=len(src), chunk_size=4096, batch_size=32)
    with cs.ChunkLoader(src, 4096, device="cpu", sampling="shuffled", seed=0) as loader:
        stream = cs.BatchStream(loader, window=16, plan=plan, mix="auto", buffer="host")
        print("MEMORY", stream.buffer.memory, flush=True)
        print("MIX", stream.mix, plan.chunks_per_epoch, flush=True)
        n = sum(1 for _ in stream)
    print("BATCHES", n, len(stream), flush=True)
    """
)


def test_mix_auto_inside_a_cgroup_limit_smaller_than_the_store_runs_an_epoch(tmp_path):
    limit = 768 * 2**20
    store = tmp_path / "store.npy"  # 1.2 GB: larger than the limit
    data = np.lib.format.open_memmap(store, mode="w+", dtype=np.float32, shape=(300_000, 1000))
    for start in range(0, len(data), 50_000):
        data[start : start + 50_000] = np.arange(start, start + 50_000)[:, None]
    data.flush()
    del data
    group = cgroups.memory_group(limit)
    try:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        proc = subprocess.run(
            [sys.executable, str(script), str(group), str(store)],
            capture_output=True,
            text=True,
            timeout=600,
            env={k: v for k, v in os.environ.items() if k != ENV_HOST_MEMORY},
        )
    finally:
        cgroups.remove_group(group)
    assert proc.returncode == 0, f"exit {proc.returncode} (137: killed)\n{proc.stderr[-3000:]}"
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert "under the job's limit of 768 MiB" in lines["MEMORY"]
    mix, chunks = map(int, lines["MIX"].split())
    assert 1 <= mix < chunks  # sized from the limit, not from the machine's 20+ GiB
    done, total = map(int, lines["BATCHES"].split())
    assert done == total
