"""This process's share of the node: the job's host memory, its CPUs, its ranks on the node.

A training job runs one process per GPU (``torchrun --nproc_per_node=8``, or
Slurm with one task per GPU), all under one memory limit and one set of CPUs.
Every size the library picks by itself (the host tier's buffer, the loader's
arena check, the decode and gather threads, ``convert``'s workers, ``plan``,
the trainer) asks :func:`node_share` for this process's part, so that N ranks
ask for the node once, not N times.

* **memory**: :func:`~chunkstream._memory.job_memory` (the smaller of
  ``MemAvailable`` and the room under the job's cgroup limit, or
  ``CHUNKSTREAM_HOST_MEMORY``), split evenly over the ranks on the node
  (:attr:`NodeShare.host_bytes`). Under a cgroup limit it is the *limit* that is
  split, less what this process already holds (its anonymous resident memory,
  ``RssAnon`` of ``/proc/self/status``), and never more than the room left now:
  ranks that start together each see the others' room still free, and must not
  each count it as theirs;
* **CPUs**: the process's CPU affinity (``sched_getaffinity``: Slurm's
  ``--cpus-per-task``, ``taskset``, a container's cpuset), bounded by a cgroup
  CPU quota where one is set (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us``, rounded up), or ``CHUNKSTREAM_CPUS``;
* **ranks on the node**: ``CHUNKSTREAM_RANKS_PER_NODE``, else torchrun's
  ``LOCAL_WORLD_SIZE``, else Slurm's tasks on this node
  (``SLURM_NTASKS_PER_NODE``, else this node's entry of
  ``SLURM_TASKS_PER_NODE`` such as ``"4(x2),2"``), else the initialised
  process group's ranks on this host, else 1;
* **threads** (:attr:`NodeShare.threads`): the CPUs over the ranks, at least
  one (the CPUs themselves where each rank is a Slurm task bound to its own
  ``SLURM_CPUS_PER_TASK``): the one thread budget of the process, which every source's decode pool
  shares (:func:`~chunkstream.sources` ``decode_pool``) and the host gather
  takes its threads from.

The process group case asks the group's store once per process: each rank
writes its host name under a chunkstream key and waits (at most
:data:`RANKS_WAIT_S`, once) for every rank's; where a rank never asks, the count
stays 1, said in the source.
:func:`node_share` reads a few small files at each call (sizes are picked when
something is built, so the memory figure is the one of that moment); only the
process group's count is kept once known. ``root``/``env``/``affinity`` of
:func:`read_node_share` re-root what is read, so tests run on fake ``/proc``
and ``/sys`` trees.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from .._errors import ConfigError
from .._text import format_bytes
from ._job import JobMemory, _read, cgroup_levels, job_memory

__all__ = [
    "ENV_CPUS",
    "ENV_RANKS",
    "RANKS_WAIT_S",
    "NodeShare",
    "cpu_share",
    "node_share",
    "ranks_on_node",
    "read_node_share",
    "resident_bytes",
    "thread_budget",
]

#: Environment variable that sets the CPUs this process's job may use (an int).
ENV_CPUS = "CHUNKSTREAM_CPUS"
#: Environment variable that sets the number of this job's processes on this node.
ENV_RANKS = "CHUNKSTREAM_RANKS_PER_NODE"
#: How long the process-group count waits for the other ranks' host names.
RANKS_WAIT_S = 10.0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class NodeShare:
    """This process's share of the node (module docs).

    ``memory``: the job's host memory (:class:`JobMemory`); ``cpus``: CPUs the
    process may use, ``cpus_source`` where that figure came from, ``node_cpus``
    the CPUs the machine has online; ``ranks``: this job's processes on the node,
    ``ranks_source`` where that came from.
    """

    memory: JobMemory
    cpus: int
    cpus_source: str
    node_cpus: int
    ranks: int
    ranks_source: str
    #: The CPUs are this process's alone (Slurm binds each task to its
    #: ``--cpus-per-task``), not shared by the ranks on the node.
    own_cpus: bool = False
    #: What this process held when the share was read (its anonymous resident bytes).
    process_bytes: int = 0

    @property
    def limit_binds(self) -> bool:
        """Whether a cgroup limit bounds the job's memory (it is then split, not the room)."""
        return self.memory.limit is not None and self.memory.source.startswith("cgroup")

    @property
    def host_bytes(self) -> int:
        """What this rank may still allocate: under a cgroup limit, the limit over the ranks
        less what this process holds, at most the room left now; else the room over the
        ranks (module docs)."""
        ranks = max(1, self.ranks)
        if self.limit_binds and ranks > 1:
            part = self.memory.limit // ranks - self.process_bytes
            return max(0, min(part, self.memory.available))
        return self.memory.available // ranks

    @property
    def threads(self) -> int:
        """This process's thread budget: its CPUs over the ranks on the node (its CPUs where
        they are its own), at least 1."""
        return max(1, self.cpus if self.own_cpus else self.cpus // max(1, self.ranks))

    def describe(self) -> str:
        """One line, e.g. ``host memory: 1.2 GiB for this rank: 2.4 GiB left under the job's
        limit of 3 GiB, 2 ranks on this node (LOCAL_WORLD_SIZE); 1 CPU of 2 (affinity)``."""
        threads = f"{_plural(self.threads, 'thread')} for this rank"
        return f"host memory: {self.describe_memory()}; {self._cpus_text()}, {threads}"

    def describe_memory(self) -> str:
        """The memory half of :meth:`describe`, e.g. ``1.2 GiB for this rank: 2.4 GiB left
        under the job's limit of 3 GiB, 2 ranks on this node (LOCAL_WORLD_SIZE)``."""
        memory = self.memory.describe().removeprefix("host memory: ")
        if self.ranks == 1:
            return f"{memory}, {self._ranks_text()}"
        if self.limit_binds:
            memory = (
                f"the limit over {self.ranks} ranks, less this process's "
                f"{format_bytes(self.process_bytes, binary=True)}; {memory}"
            )
        return (
            f"{format_bytes(self.host_bytes, binary=True)} for this rank: {memory}, "
            f"{self._ranks_text()}"
        )

    def describe_cpus(self) -> str:
        """The CPU half of :meth:`describe`, e.g. ``1 CPU of 2 (affinity), 2 ranks on this
        node (LOCAL_WORLD_SIZE)`` (the thread count is the caller's to show)."""
        return f"{self._cpus_text()}, {self._ranks_text()}"

    def _ranks_text(self) -> str:
        return f"{_plural(self.ranks, 'rank')} on this node ({self.ranks_source})"

    def _cpus_text(self) -> str:
        return f"{_plural(self.cpus, 'CPU')} of {self.node_cpus} ({self.cpus_source})"


# -- CPUs -------------------------------------------------------------------


def _quota(base: Path) -> tuple[float, str] | None:
    """The tightest CPU quota (in CPUs) of this process's CPU cgroups, and where it is set."""
    best: tuple[float, str] | None = None
    for version, level, where in cgroup_levels(base, "cpu"):
        if version == 2:
            fields = (_read(level / "cpu.max") or "").split()
            quota, period = [*fields, "", ""][:2]
        else:
            quota = (_read(level / "cpu.cfs_quota_us") or "").strip()
            period = (_read(level / "cpu.cfs_period_us") or "").strip()
        try:
            cpus = int(quota) / int(period)
        except (ValueError, ZeroDivisionError):  # "max", "-1", missing: no quota here
            continue
        if cpus > 0 and (best is None or cpus < best[0]):
            best = (cpus, f"cgroup {where} quota")
    return best


def _online_cpus(base: Path) -> int | None:
    """CPUs online (``/sys/devices/system/cpu/online``, e.g. ``0-63``)."""
    text = (_read(base / "sys/devices/system/cpu/online") or "").strip()
    if not text:
        return None
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        try:
            count += int(high or low) - int(low) + 1
        except ValueError:
            return None
    return count


def cpu_share(
    root: str | os.PathLike = "/",
    env: Mapping[str, str] | None = None,
    affinity: int | None = None,
) -> tuple[int, str, int]:
    """``(cpus, source, node_cpus)``: the CPUs this process may use (module docs).

    ``affinity``: the affinity's CPU count (default: ``sched_getaffinity`` of this
    process, the machine's online CPUs where that call is missing).
    """
    base = Path(root)
    environ = os.environ if env is None else env
    node = _online_cpus(base)
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            affinity = node or 1
    node = max(node or affinity, affinity)
    cpus, source = affinity, "affinity"
    quota = _quota(base)
    if quota is not None and math.ceil(quota[0]) < cpus:
        cpus, source = math.ceil(quota[0]), quota[1]
    given = environ.get(ENV_CPUS)
    if given:
        cpus, source = _positive(given, ENV_CPUS, "Set it to the CPUs the job may use."), ENV_CPUS
    return cpus, source, node


# -- ranks on the node -------------------------------------------------------


def _positive(text: str, name: str, fix: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError.bad(name, text, "an int >= 1", f"{fix} Or unset it.")
    return value


_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _slurm_tasks(text: str, node_id: int) -> int | None:
    """This node's entry of ``SLURM_TASKS_PER_NODE`` (``"4(x2),2"``: nodes 0-1 run 4, node 2
    runs 2); ``None`` where it does not parse."""
    seen = 0
    for part in text.split(","):
        match = _TASKS.match(part.strip())
        if match is None:
            return None
        tasks, repeat = int(match[1]), int(match[2] or 1)
        if node_id < seen + repeat:
            return tasks
        seen += repeat
    return None


# By world size: the count once the store told. No lock: two threads racing here both
# ask the store (each rank's key is written with the same value) and store the same count.
_group_known: dict[int, tuple[int, str]] = {}


def _group_ranks() -> tuple[int, str] | None:
    """The initialised process group's ranks on this host, through the group's store."""
    if _group_known:
        return next(iter(_group_known.values()))
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return 1, "process group of 1"
    # torch offers no public handle on the group's store, and a collective could hang a
    # rank whose peers never size anything: the store's wait has a timeout.
    get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get_store is None:
        return None
    try:
        store = get_store()
        store.set(f"chunkstream/host/{rank}", socket.gethostname())
        keys = [f"chunkstream/host/{r}" for r in range(world)]
        store.wait(keys, timedelta(seconds=RANKS_WAIT_S))
        hosts = [store.get(key).decode() for key in keys]
        found = hosts.count(socket.gethostname()), "process group ranks on this host"
    except (RuntimeError, ValueError):  # DistStoreError (a RuntimeError) on a timeout
        # Kept as well: the wait is paid once per process, not at every sizing.
        found = 1, f"process group: the other ranks' hosts not known within {RANKS_WAIT_S:.0f} s"
    _group_known[world] = found
    return found


def ranks_on_node(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """``(ranks, source)``: this job's processes on this node (module docs)."""
    environ = os.environ if env is None else env
    fix = "Set it to the number of this job's processes on this node."
    for name in (ENV_RANKS, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        if environ.get(name):
            return _positive(environ[name], name, fix), name
    tasks = environ.get("SLURM_TASKS_PER_NODE")
    if tasks:
        node_id = environ.get("SLURM_NODEID", "0")
        count = _slurm_tasks(tasks, int(node_id) if node_id.isdigit() else 0)
        if count is not None:
            return count, "SLURM_TASKS_PER_NODE"
    if env is None:
        found = _group_ranks()
        if found is not None:
            return found
    return 1, "one process"


# -- the share ---------------------------------------------------------------


def resident_bytes(root: str | os.PathLike = "/") -> int:
    """This process's anonymous resident bytes (``RssAnon`` of ``/proc/self/status``, 0
    where that is not there): what it holds that the kernel cannot take back."""
    text = _read(Path(root) / "proc/self/status") or ""
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def read_node_share(
    root: str | os.PathLike = "/",
    env: Mapping[str, str] | None = None,
    affinity: int | None = None,
) -> NodeShare:
    """The share read from ``root`` and ``env`` (fake trees in tests; :func:`node_share`)."""
    cpus, cpus_source, node = cpu_share(root, env, affinity)
    ranks, ranks_source = ranks_on_node(env)
    # One Slurm task per rank, each bound to its --cpus-per-task: the affinity is already
    # this rank's (torchrun under one Slurm task shares the task's CPUs: LOCAL_WORLD_SIZE).
    per_task = (os.environ if env is None else env).get("SLURM_CPUS_PER_TASK", "")
    own = ranks_source.startswith("SLURM_") and per_task.isdigit() and cpus <= int(per_task)
    if own:
        cpus_source += ", this Slurm task's own"
    return NodeShare(
        memory=job_memory(root, env),
        cpus=cpus,
        cpus_source=cpus_source,
        node_cpus=node,
        ranks=ranks,
        ranks_source=ranks_source,
        own_cpus=own,
        process_bytes=resident_bytes(root),
    )


#: What the thread budget depends on beside the cgroup files: read at every call (cheap).
_BUDGET_ENV = (
    ENV_CPUS,
    ENV_RANKS,
    "LOCAL_WORLD_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_CPUS_PER_TASK",
)
_budgets: dict[tuple, int] = {}


def _budget_key() -> tuple:
    try:
        affinity = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = frozenset()
    return (*(os.environ.get(name) for name in _BUDGET_ENV), affinity, bool(_group_known))


def thread_budget() -> int:
    """:attr:`NodeShare.threads` of this process, kept per environment and CPU affinity:
    the gather asks at every batch, so the cgroup files are read once per process (a
    quota changed while it runs is not seen), the launcher's variables and the affinity
    at every call."""
    key = _budget_key()
    budget = _budgets.get(key)
    if budget is None:
        budget = _budgets[key] = node_share().threads
    return budget


def node_share() -> NodeShare:
    """This process's share of the node now (module docs): a few small files read at each
    call (a loader asks before it allocates, so memory is as it is then); only the
    process group's count is kept once known."""
    return read_node_share()
