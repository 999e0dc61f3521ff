"""Every byte a rank allocates is counted once: ranks in one real memory cgroup finish.

Issue 47's case: torchrun ranks (gloo, CPU) in one v1 memory cgroup, each streaming
the defaults (``ChunkLoader(src, chunk_size=4096, device="cpu")`` and
``BatchStream(loader, window=64, plan=plan)``) over a zarr v3 store of float32 with
4,096 columns in chunks of 4,096 x 4,096 (64 MiB, zstd). Before, each rank counted the
room the others were about to take and left a third of what it allocated uncounted
(4 ranks in 4 GiB: two killed by the kernel). The store is 32 chunks (2 GiB): each
rank's buffer is still bound by memory, not by its share of the split.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from zarr.codecs import ZstdCodec

import chunkstream as cs
from chunkstream._memory import ENV_CPUS, ENV_HOST_MEMORY, ENV_RANKS

from . import cgroups
from .cgroups import GIB

WORKER = Path(__file__).with_name("rank_memory_worker.py")
ROWS, COLUMNS = 4096, 4096  # one stored chunk: 64 MiB of float32


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """32 chunks of 64 MiB; random bytes (zstd keeps them about as large), each chunk its own."""
    path = tmp_path_factory.mktemp("rank-memory") / "x.zarr"
    arr = zarr.create_array(
        path,
        shape=(32 * ROWS, COLUMNS),
        chunks=(ROWS, COLUMNS),
        dtype="float32",
        compressors=ZstdCodec(level=1),
    )
    block = np.random.default_rng(0).standard_normal((ROWS, COLUMNS), dtype=np.float32)
    for k in range(32):
        block[0, 0] = k
        arr[k * ROWS : (k + 1) * ROWS] = block
    return path


def _env() -> dict[str, str]:
    drop = ("LOCAL_WORLD_SIZE", ENV_HOST_MEMORY, ENV_CPUS, ENV_RANKS)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(cs.__file__).parents[1]), str(Path(__file__).parent), env.get("PYTHONPATH", "")]
    )
    return env


def _run(group: Path, command: list[str]) -> tuple[subprocess.CompletedProcess, int, int]:
    """``command`` inside ``group`` (the shell joins it, then execs); its result, the
    group's peak usage and how many processes the kernel killed there."""
    join = f'echo $$ > "{group}/cgroup.procs" && exec "$@"'
    try:
        done = subprocess.run(
            ["sh", "-c", join, "sh", *command],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        oom = (group / "memory.oom_control").read_text().split()
        kills = int(oom[oom.index("oom_kill") + 1]) if "oom_kill" in oom else 0
    finally:
        cgroups.remove_group(group)
    return done, peak, kills


def _reports(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("ranks", "limit"), [(4, 4 * GIB), (2, 3 * GIB)], ids=["4-ranks-in-4GiB", "2-ranks-in-3GiB"]
)
def test_ranks_in_one_limit_with_64_mib_chunks_all_finish(tmp_path, store, ranks, limit):
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available")
    from .test_distributed import free_port

    group = cgroups.memory_group(limit)
    out = tmp_path / "out"
    out.mkdir()
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={ranks}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(WORKER),
        "rank",
        str(store),
        str(out),
    ]
    done, peak, kills = _run(group, torchrun)
    assert done.returncode == 0 and kills == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    assert peak <= limit
    for report in _reports(out, ranks):
        assert report["batches"] == report["expected"] > 0, report
        terms = dict(report["terms"])
        # every term is said, and what the library allocates fits the rank's part
        for what in ("this process when it sized", "the loader's arena", "the shuffle buffer"):
            assert what in terms and what in report["describe"], report
        assert terms["left for the model, the heap and the page cache"] > 0, report


@pytest.mark.slow
def test_one_process_in_3_gib_is_not_refused(tmp_path, store):
    group = cgroups.memory_group(3 * GIB)
    out = tmp_path / "out"
    out.mkdir()
    done, _, kills = _run(
        group, [sys.executable, str(WORKER), "alone", str(group), str(store), str(out)]
    )
    assert done.returncode == 0 and kills == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    (report,) = _reports(out, 1)
    assert report["batches"] == report["expected"] > 0 and report["mix"] > 1, report
