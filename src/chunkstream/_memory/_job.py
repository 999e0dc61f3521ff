"""Host memory as the job sees it: the smaller of ``MemAvailable`` and the room under its cgroup.

Cluster schedulers (Slurm, Kubernetes, systemd) cap a job with a cgroup; the
kernel kills the job when it passes the cap, however much memory the machine
has free. So everything the library sizes from host memory (the host tier's
shuffle buffer, ``chunkstream plan``, the trainer) asks :func:`job_memory`,
which takes the smallest of:

* ``MemAvailable`` of ``/proc/meminfo`` (the machine's; physical memory where
  that file is missing);
* for every memory cgroup the process is in (``/proc/self/cgroup``: the v1
  ``memory`` controller under ``/sys/fs/cgroup/memory``, the v2 unified tree
  under ``/sys/fs/cgroup``) and each of its ancestors, the limit less what the
  group uses: v2 ``memory.max`` minus ``memory.current``, v1
  ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``, the usage less
  the reclaimable ``inactive_file`` page cache of ``memory.stat`` (the
  "working set" the kernel would not give back before killing). ``max`` or a
  value of 2**60 or more means no limit; a file that is missing or unreadable
  counts as no limit at that level;
* ``CHUNKSTREAM_HOST_MEMORY`` (bytes, or with a unit: ``"3GiB"``, ``"512MB"``)
  when set: a cap for runs that must behave as if the job had less memory
  (the quality race caps the buffer this way).

A container whose cgroup namespace hides its path (``/proc/self/cgroup`` says
``/`` or names a directory that is not there) reads the mount's root, which is
then its own group. ``root`` re-roots every path read, so tests run on fake
``/proc`` and ``/sys`` trees.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError
from .._text import format_bytes

__all__ = ["ENV_HOST_MEMORY", "JobMemory", "job_memory", "parse_bytes", "parse_memory"]

#: Environment variable that caps the host memory the library sizes from (bytes or "3GiB").
ENV_HOST_MEMORY = "CHUNKSTREAM_HOST_MEMORY"
_UNLIMITED = 1 << 60  # cgroup v1 writes 2**63 rounded down to a page for "no limit"
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@dataclass(frozen=True)
class JobMemory:
    """Host memory the job may still use, and what bounds it.

    ``available``: bytes (the smallest of the bounds in the module docs);
    ``limit``: the binding cap in bytes where one binds (a cgroup's limit or
    the environment's cap), else ``None`` (the machine's ``MemAvailable``
    binds); ``source``: where ``available`` came from (``"MemAvailable"``,
    ``"cgroup v1 /path"``, ``"cgroup v2 /path"``, :data:`ENV_HOST_MEMORY`);
    ``machine``: the machine's ``MemAvailable``.
    """

    available: int
    limit: int | None
    source: str
    machine: int

    def describe(self) -> str:
        """One line, e.g. ``host memory: 2.6 GiB left under the job's limit of 3 GiB (...)``."""
        available = format_bytes(self.available, binary=True)
        if self.source == ENV_HOST_MEMORY:
            return f"host memory: {available}, capped by {ENV_HOST_MEMORY}"
        if self.limit is None:
            return f"host memory: {available} available (MemAvailable)"
        return (
            f"host memory: {available} left under the job's limit of "
            f"{format_bytes(self.limit, binary=True)} ({self.source}; the machine has "
            f"{format_bytes(self.machine, binary=True)} available)"
        )


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_UNITS_FIX = "Units: B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)."


def parse_bytes(text: str | int, name: str = "size", fix: str = _UNITS_FIX) -> int:
    """``"8GB"`` -> 8e9, ``"512MiB"`` -> 512 * 2**20, ``"1000"`` -> 1000 bytes; a
    :class:`ConfigError` naming ``name`` (with ``fix``) for anything else or a size <= 0."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        unit = match[2].lower() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigError.bad(name, text, "a size such as 8GB, 512MiB or 1000000 (bytes)", fix)
        value = int(float(match[1]) * _UNITS[unit])
    if value <= 0:
        raise ConfigError.bad(name, text, "a positive size", fix)
    return value


def parse_memory(text: str, name: str = ENV_HOST_MEMORY) -> int:
    """Bytes from ``"3221225472"``, ``"3GiB"`` or ``"512 MB"``; :class:`ConfigError` naming ``name``."""
    return parse_bytes(
        text, name, f"Set {name} to the host memory the job may use, or unset it. {_UNITS_FIX}"
    )


def job_memory(root: str | os.PathLike = "/", env: Mapping[str, str] | None = None) -> JobMemory:
    """The host memory the job may use now (module docs); reads a few small files."""
    base = Path(root)
    machine = _meminfo(base)
    best = JobMemory(available=machine, limit=None, source="MemAvailable", machine=machine)
    for limit, room, where in _rooms(base):
        if room < best.available:
            best = JobMemory(available=room, limit=limit, source=f"cgroup {where}", machine=machine)
    cap = (os.environ if env is None else env).get(ENV_HOST_MEMORY)
    if cap:
        capped = parse_memory(cap)
        if capped < best.available:
            best = JobMemory(
                available=capped, limit=capped, source=ENV_HOST_MEMORY, machine=machine
            )
    return best


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _meminfo(base: Path) -> int:
    text = _read(base / "proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    if base == Path("/"):
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return _UNLIMITED  # a fake tree without meminfo: only its cgroups bound


def _groups(base: Path, controller: str) -> list[tuple[int, str]]:
    """``(version, path)`` of each cgroup of ``controller`` in ``/proc/self/cgroup``."""
    found = []
    for line in (_read(base / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            found.append((2, path))
        elif controller in controllers.split(","):
            found.append((1, path))
    return found


# The file that marks a v1 hierarchy's mount, per controller.
_V1_MARKERS = {"memory": "memory.limit_in_bytes", "cpu": "cpu.cfs_quota_us"}


def _mount(base: Path, version: int, controller: str) -> Path | None:
    """The hierarchy's mount: v1 ``controller`` (or a co-mounted ``a,b``), v2 unified."""
    cgroup = base / "sys/fs/cgroup"
    if version == 1:
        candidates = [cgroup / controller]
        if cgroup.is_dir():
            candidates += sorted(
                p for p in cgroup.iterdir() if controller in p.name.split(",") and p.is_dir()
            )
        marker = _V1_MARKERS[controller]
    else:
        candidates = [cgroup, cgroup / "unified"]
        marker = "cgroup.controllers"
    for path in candidates:
        if (path / marker).is_file():
            return path
    return None


def cgroup_levels(base: Path, controller: str) -> list[tuple[int, Path, str]]:
    """``(version, folder, where)`` of every level of this process's ``controller`` cgroups.

    From each group up to its mount's root (every level may set a limit; the tightest
    binds); ``where`` names the level (``"v1 /job/step"``). A group not found under
    the mount is a cgroup namespace, whose root is the job's own group.
    """
    levels = []
    for version, group in _groups(base, controller):
        mount = _mount(base, version, controller)
        if mount is None:
            continue
        parts = [p for p in group.strip("/").split("/") if p]
        if not mount.joinpath(*parts).is_dir():
            parts = []
        for depth in range(len(parts), -1, -1):
            where = f"v{version} /{'/'.join(parts[:depth])}"
            levels.append((version, mount.joinpath(*parts[:depth]), where))
    return levels


def _rooms(base: Path) -> list[tuple[int, int, str]]:
    """``(limit, room, where)`` at every level of this process's memory cgroups that sets one."""
    found = []
    for version, level, where in cgroup_levels(base, "memory"):
        limit_file, usage_file, stat_key = (
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            if version == 1
            else ("memory.max", "memory.current", "inactive_file")
        )
        limit = _number(_read(level / limit_file))
        usage = _number(_read(level / usage_file))
        if limit is None or limit >= _UNLIMITED or usage is None:
            continue
        cache = _stat(_read(level / "memory.stat"), stat_key)
        room = max(0, limit - max(0, usage - cache))
        found.append((limit, room, where))
    return found


def _number(text: str | None) -> int | None:
    if text is None or text.strip() in ("", "max"):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _stat(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _number(value) or 0
    return 0
