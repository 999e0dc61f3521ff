"""``LoaderOptions``: a :class:`~chunkstream.ChunkLoader`'s less common settings, as data.

As Grain's ``ReadOptions``: the loader takes its common settings as keywords
(``chunk_size``, ``device``, ``prefetch``, ``gpu_prefetch``, ``workers``,
``sampling``, ``align``, ``seed``) and everything else in one frozen,
keyword-only object, so its signature stays short and a set of options can be
kept, compared and passed on (``dataclasses.replace`` changes one).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from .._errors import ConfigError
from .._options import MOVED_REMOVED_IN
from ..stats import LatencyStats
from ._config import ResolvedSettings, default_workers

if TYPE_CHECKING:
    from ..plans import Segments

__all__ = ["LoaderOptions", "loader_settings"]


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """The less common settings of a :class:`~chunkstream.ChunkLoader` (``options=``).

    Every field has a row in docs/parameters.md, where its accepted values are
    listed; a bad value is refused when the loader is built, naming the field.

    * ``host_slots``, ``host_memory``, ``device_memory``: pinned slots (CUDA;
      default ``prefetch + workers``); byte budgets that set the depths the
      loader was not given to the largest that fit.
    * ``resident``: ``True`` reads the reachable timesteps once and serves chunks
      from the device as views or gathers; ``"auto"`` does so when they fit.
    * ``pieces``, ``segments``, ``window``: chunks of ``pieces`` pieces from
      independent places; the ``(start, stop[, name])`` stretches every chunk,
      piece and window stays in; the batch window each piece must hold.
    * ``rank``, ``world_size``: this process's share of every epoch (defaults from
      torch.distributed when initialised, else 0 and 1).
    * ``stall_timeout``, ``close_timeout``, ``check_finite``, ``read_retries``:
      the stall watchdog (``None``: never), how long ``close()`` waits for its
      threads, a check for NaN/Inf, retries of a transient read error.
    * ``stats``: a :class:`~chunkstream.LatencyStats` to record into (shared
      between loaders), or ``None`` for a new one.
    * ``close_source``: whether ``close()`` also closes the source.
    """

    host_slots: int | None = None
    host_memory: int | None = None
    device_memory: int | None = None
    resident: bool | str = False
    pieces: int = 1
    segments: Segments | str | object | None = None
    window: int | None = None
    rank: int | None = None
    world_size: int | None = None
    stall_timeout: float | None = 300.0
    close_timeout: float = 5.0
    check_finite: bool = False
    read_retries: int = 2
    stats: LatencyStats | None = None
    close_source: bool = False

    def __post_init__(self) -> None:
        # The other fields are checked where they are used, once, when the loader is built.
        if not isinstance(self.close_source, bool):
            raise ConfigError.bad(
                "close_source", self.close_source, "True or False", "Pass a bool."
            )
        if self.stats is not None and not isinstance(self.stats, LatencyStats):
            raise ConfigError.bad(
                "stats",
                type(self.stats).__name__,
                "a cs.LatencyStats or None",
                "Pass stats=None to let the loader make one, or share one cs.LatencyStats().",
            )


# The options the loader's resolved settings (ResolvedSettings, once cs.LoaderConfig) also hold: with the
# deprecated config=, they come from it.
_IN_CONFIG = (
    "host_slots",
    "host_memory",
    "device_memory",
    "stall_timeout",
    "close_timeout",
    "check_finite",
    "read_retries",
)


def loader_settings(
    chunk_size: object,
    *,
    prefetch: int | None,
    gpu_prefetch: int | None,
    workers: int | None,
    options: LoaderOptions,
    config: ResolvedSettings | None,
) -> dict[str, object]:
    """The keywords of :meth:`ResolvedSettings.for_source`: from the loader's own keywords and
    ``options``, or, with ``config`` (deprecated until :data:`MOVED_REMOVED_IN`: it warns
    with a ``FutureWarning`` once it is accepted), from that config alone (a keyword or an
    option that would set one of its values again is refused, naming both)."""
    if config is None:
        return dict(
            chunk_size=chunk_size,
            prefetch=prefetch,
            gpu_prefetch=gpu_prefetch,
            workers=default_workers() if workers is None else workers,
            **{name: getattr(options, name) for name in _IN_CONFIG},
        )
    if not isinstance(config, ResolvedSettings):
        raise ConfigError.bad(
            "config",
            type(config).__name__,
            "another loader's .config, or None",
            "Leave config out: pass chunk_size, prefetch, gpu_prefetch, workers and "
            "options=cs.LoaderOptions(...) instead (config= is deprecated).",
        )
    given = {
        name: value
        for name, value in (
            ("chunk_size", chunk_size),
            ("prefetch", prefetch),
            ("gpu_prefetch", gpu_prefetch),
            ("workers", workers),
        )
        if value is not None and not (name == "chunk_size" and value == config.chunk_size)
    }
    defaults = LoaderOptions()
    given |= {
        f"options.{name}": getattr(options, name)
        for name in _IN_CONFIG
        if getattr(options, name) != getattr(defaults, name)
    }
    if given:
        name, value = next(iter(given.items()))
        field = name.removeprefix("options.")
        if not hasattr(config, field):  # a byte budget: the config's depths are chosen
            raise ConfigError.bad(
                name,
                value,
                "no byte budget with config= (its depths are already chosen)",
                "Set prefetch, gpu_prefetch and host_slots in the config, or leave "
                "config out (deprecated): pass the keywords and options=cs.LoaderOptions(...).",
            )
        raise ConfigError.bad(
            name,
            value,
            f"no second value with config= (its {field} is {getattr(config, field)!r})",
            f"Set {field} in the config (dataclasses.replace(config, {field}=...)), "
            "or leave config out (deprecated): pass the keywords and "
            "options=cs.LoaderOptions(...).",
        )
    warnings.warn(
        f"ChunkLoader(config=...) is deprecated and will be removed in {MOVED_REMOVED_IN}; "
        "pass the keywords and options=cs.LoaderOptions(...), e.g. "
        "cs.ChunkLoader(src, chunk_size=c.chunk_size, prefetch=c.prefetch, "
        "gpu_prefetch=c.gpu_prefetch, workers=c.workers, options=other.options) "
        "for another loader's settings",
        FutureWarning,
        stacklevel=3,
    )
    return {f.name: getattr(config, f.name) for f in fields(config)}
