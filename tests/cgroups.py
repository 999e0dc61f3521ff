"""Cgroups for the tests: fake ``/proc`` and ``/sys`` trees, and real v1 memory groups.

A real group is made under this process's own v1 memory cgroup (root only), given a
limit, and removed by :func:`remove_group`; where one cannot be made the test skips
with the reason.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

GIB = 2**30


def fake_tree(
    root: Path,
    cgroup: str,
    files: dict[str, object],
    *,
    available: int,
    online: str | None = None,
) -> Path:
    """``/proc/meminfo`` (``available`` bytes available), ``/proc/self/cgroup``, the
    CPUs ``online`` (``"0-63"``) where given, and cgroup files under ``sys/fs/cgroup``."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(
        f"MemTotal: {64 * GIB // 1024} kB\nMemFree: 1 kB\nMemAvailable: {available // 1024} kB\n"
    )
    (root / "proc/self/cgroup").write_text(cgroup)
    if online is not None:
        (root / "sys/devices/system/cpu").mkdir(parents=True)
        (root / "sys/devices/system/cpu/online").write_text(online + "\n")
    for name, value in files.items():
        path = root / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return root


def _own_v1_group() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            group = Path("/sys/fs/cgroup/memory") / path.strip("/")
            return group if group.is_dir() else Path("/sys/fs/cgroup/memory")
    return None


def memory_group(limit: int) -> Path:
    """A fresh v1 memory cgroup of ``limit`` bytes (skips where one cannot be made)."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    parent = _own_v1_group() if Path("/proc/self/cgroup").is_file() else None
    if parent is None or not (parent / "memory.limit_in_bytes").is_file():
        pytest.skip("no cgroup v1 memory controller to make a child group in")
    group = parent / f"chunkstream-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    return group


def remove_group(group: Path) -> None:
    """Remove the (empty: its processes have exited) cgroup; its page-cache charge is
    moved to the parent by ``force_empty`` where rmdir refuses."""
    try:
        group.rmdir()
    except OSError:
        (group / "memory.force_empty").write_text("0")
        group.rmdir()
