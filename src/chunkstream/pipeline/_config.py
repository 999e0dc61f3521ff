"""The loader's resolved settings (internal, read-only); the device the loader runs on."""

from __future__ import annotations

from dataclasses import dataclass

from .._device import resolve_device
from .._errors import ConfigError, check_int
from .._memory import LOOP_HELD, arena_bytes, budget_depths, thread_budget
from ..sources import Source, check_source, window_nbytes

__all__ = ["DEFAULT_WORKERS", "ResolvedSettings", "default_workers", "resolve_device"]

#: Reader workers a loader runs when its share of the node allows (``workers=None``).
DEFAULT_WORKERS = 2


def default_workers() -> int:
    """The reader workers of ``ChunkLoader(workers=None)``: :data:`DEFAULT_WORKERS`, fewer
    where this process's thread budget (its CPUs over the job's ranks on the node,
    :func:`chunkstream._memory.thread_budget`) is smaller, at least 1."""
    return max(1, min(DEFAULT_WORKERS, thread_budget()))


@dataclass(frozen=True, kw_only=True)
class ResolvedSettings:
    """The loader's resolved settings: the depths and sizes a :class:`~chunkstream.ChunkLoader`
    runs with, read-only (``loader.config``).

    Internal, not a settings type users build: a loader is configured by its keywords
    and one :class:`~chunkstream.LoaderOptions`; this is what those resolve to, the
    depths derived from any byte budget. It was public as ``cs.LoaderConfig`` until
    0.1 (still found, with a ``FutureWarning``, until 0.3), and
    ``ChunkLoader(source, config=...)`` still takes one until then, with a
    ``FutureWarning`` naming the keywords and options that replace it.

    Memory bounds (``chunk_bytes``: one window of every field): on CUDA pinned host
    bytes = ``host_slots * chunk_bytes``, fixed at start, and loader device bytes =
    ``gpu_prefetch * chunk_bytes`` plus the chunks the user holds (``gpu_prefetch + 1``
    for a loop that drops each chunk before asking for the next, one more for a plain
    ``for`` loop); on the CPU the pipeline holds at most ``(prefetch + workers) *
    chunk_bytes`` plus the user's chunks.
    """

    chunk_size: int
    prefetch: int = 2
    gpu_prefetch: int = 1
    workers: int = 2
    host_slots: int | None = None  # CUDA only; defaults to prefetch + workers
    stall_timeout: float | None = 300.0
    close_timeout: float = 5.0
    check_finite: bool = False
    read_retries: int = 2

    def __post_init__(self) -> None:
        check_int("chunk_size", self.chunk_size, fix="Pass the number of timesteps per chunk.")
        check_int("prefetch", self.prefetch, fix="Use 1 or more chunks read ahead (2 is typical).")
        check_int("gpu_prefetch", self.gpu_prefetch, fix="Use 1 or more chunks kept on the device.")
        check_int("workers", self.workers, fix="Use 1 or more reader threads.")
        if self.host_slots is not None:
            check_int(
                "host_slots",
                self.host_slots,
                fix="Use at least one pinned slot per reader worker (or leave it None).",
            )
        check_int("read_retries", self.read_retries, 0, "Use 0 to fail on the first error.")
        if not isinstance(self.check_finite, bool):  # a string such as "no" would be truthy
            raise ConfigError.bad(
                "check_finite", self.check_finite, "True or False", "Pass a bool."
            )
        value = self.stall_timeout
        if value is not None and (not isinstance(value, int | float) or value <= 0):
            raise ConfigError.bad(
                "stall_timeout", value, "a number of seconds > 0, or None to disable"
            )
        if not isinstance(self.close_timeout, int | float) or self.close_timeout <= 0:
            raise ConfigError.bad("close_timeout", self.close_timeout, "a number of seconds > 0")

    @property
    def reader_capacity(self) -> int:
        """Chunks the readers may hold at once (being read or waiting)."""
        return self.prefetch + self.workers

    @property
    def slots(self) -> int:
        return self.host_slots if self.host_slots is not None else self.reader_capacity

    def host_sets(self, on_cuda: bool) -> int:
        """Buffer sets in the host arena: the pinned slots on CUDA; on the CPU the
        pipeline's ``prefetch + workers`` and two a loop holds (``streaming_bytes``)."""
        return self.slots if on_cuda else self.reader_capacity + LOOP_HELD

    def arena_bytes(self, chunk_bytes: int, on_cuda: bool) -> int:
        """Bytes of the host arena the loader allocates (:func:`chunkstream._memory.arena_bytes`)."""
        return arena_bytes(
            chunk_bytes,
            on_cuda=on_cuda,
            prefetch=self.prefetch,
            workers=self.workers,
            host_slots=self.host_slots,
        )

    @classmethod
    def for_source(
        cls,
        source: Source,
        chunk_size: int,
        *,
        on_cuda: bool,
        prefetch: int | None = None,
        gpu_prefetch: int | None = None,
        workers: int = 2,
        host_slots: int | None = None,
        host_memory: int | None = None,
        device_memory: int | None = None,
        **rest: object,
    ) -> tuple[ResolvedSettings, int]:
        """Validate a loader's settings for ``source``; derive depths from byte budgets.

        Returns ``(config, rows)``: the rows of one window (``chunk_size``, clamped to
        the source's length). Raises :class:`ConfigError` naming the parameter at fault.
        """
        total = len(check_source(source))
        probe = (
            chunk_size if isinstance(chunk_size, int) and not isinstance(chunk_size, bool) else 0
        )
        rows = min(probe, total) if probe > 0 else 1
        check_int("workers", workers, fix="Use 1 or more reader threads.")  # the budget needs it
        fit: dict[str, int] = {}
        if host_memory is not None or device_memory is not None:
            if source.fields is None:
                name, value = (
                    ("host_memory", host_memory)
                    if host_memory is not None
                    else ("device_memory", device_memory)
                )
                raise ConfigError.bad(
                    name,
                    value,
                    "a source whose fields are known (this one learns them at its first read)",
                    "Pass the field specs to the source, or set prefetch and host_slots instead.",
                )
            fit = budget_depths(
                chunk_bytes=window_nbytes(source.fields, rows),
                workers=workers,
                host_memory=host_memory,
                device_memory=device_memory,
                on_cuda=on_cuda,
            )
        config = ResolvedSettings(
            chunk_size=chunk_size,
            workers=workers,
            prefetch=fit.get("prefetch", 2) if prefetch is None else prefetch,
            gpu_prefetch=fit.get("gpu_prefetch", 1) if gpu_prefetch is None else gpu_prefetch,
            host_slots=fit.get("host_slots") if host_slots is None else host_slots,
            **rest,  # type: ignore[arg-type]
        )
        if on_cuda and config.slots < config.workers:
            raise ConfigError.bad(
                "host_slots",
                config.slots,
                f"at least workers={workers} pinned slots",
                "Raise host_slots (or host_memory), or use fewer workers.",
            )
        return config, rows
