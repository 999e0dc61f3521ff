"""Remote against local throughput: the same windows streamed from a URL and from a copy;
and a URL through its node-local cache, epoch 1 (cold) against epoch 2 (warm)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._progress import progress_bar
from ..pipeline import ChunkLoader
from ..sources import ZarrSource

__all__ = ["CacheEpochsReport", "ThroughputReport", "cache_epochs", "compare_throughput"]


@dataclass(frozen=True, kw_only=True)
class ThroughputReport:
    """Decoded GB/s of the same windows read from a URL and from a local copy."""

    url: str
    local: str
    windows: int
    nbytes: int
    remote_s: float
    local_s: float

    @property
    def remote_gbps(self) -> float:
        return self.nbytes / self.remote_s / 1e9

    @property
    def local_gbps(self) -> float:
        return self.nbytes / self.local_s / 1e9

    @property
    def ratio(self) -> float:
        """Remote throughput over local (1.0: the network costs nothing)."""
        return self.local_s / self.remote_s

    def to_dict(self) -> dict[str, Any]:
        """The fields and the derived GB/s and ratio, for JSON."""
        out = asdict(self)
        out.update(remote_gbps=self.remote_gbps, local_gbps=self.local_gbps, ratio=self.ratio)
        return out


def timed_epoch(
    source: ZarrSource,
    chunk_size: int,
    windows: int,
    *,
    workers: int,
    seed: int,
    desc: str = "epoch",
    progress: bool = False,
) -> tuple[float, int]:
    """``(seconds, bytes)`` of one epoch of ``windows`` windows of ``source`` through a new
    CPU :class:`ChunkLoader` (the same ``seed``: the same windows in the same order),
    counted on a progress bar named ``desc`` where ``progress``."""
    with (
        ChunkLoader(source, chunk_size, device="cpu", workers=workers, seed=seed) as loader,
        progress_bar(desc=desc, unit="window", total=windows, enabled=progress) as bar,
    ):
        begin, nbytes = time.perf_counter(), 0
        for chunk in loader.epoch(windows):
            nbytes += sum(t.numel() * t.element_size() for t in chunk.values())
            bar.update(1)
        return time.perf_counter() - begin, nbytes


def compare_throughput(
    url: str,
    local: str | Path,
    *,
    fields: Mapping[str, Any] | None = None,
    array: str | None = None,
    chunk_size: int,
    windows: int = 8,
    workers: int = 4,
    seed: int = 0,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> ThroughputReport:
    """Stream the same ``windows`` shuffled windows through a CPU :class:`ChunkLoader`
    from ``url`` and from ``local`` (a copy of the same array), timing each.

    The local copy is read first, so it runs on a warm page cache only if it
    was read before; run it twice for a cached baseline. Both sources are
    closed before returning. ``progress``: a bar per copy (``local``, ``remote``).
    """

    def run(path: str | Path, options: Mapping[str, Any] | None, desc: str) -> tuple[float, int]:
        with ZarrSource(path, fields, array=array, storage_options=options) as source:
            return timed_epoch(
                source,
                chunk_size,
                windows,
                workers=workers,
                seed=seed,
                desc=desc,
                progress=progress,
            )

    local_s, nbytes = run(local, None, "local")
    remote_s, remote_bytes = run(url, storage_options, "remote")
    if remote_bytes != nbytes:
        raise ConfigError.bad(
            "local",
            str(local),
            f"a copy of {url!r} (it read {nbytes} bytes, the URL {remote_bytes})",
        )
    return ThroughputReport(
        url=url,
        local=str(local),
        windows=windows,
        nbytes=nbytes,
        remote_s=remote_s,
        local_s=local_s,
    )


@dataclass(frozen=True, kw_only=True)
class CacheEpochsReport:
    """The same windows of a URL streamed twice through the cache in ``cache``: seconds,
    and the cache's hits, misses and bytes fetched, per epoch; ``warnings``, the cache's
    own (a folder it does not trust, a full disk, dropped entries)."""

    url: str
    cache: str
    windows: int
    nbytes: int
    epoch_s: tuple[float, float]
    hits: tuple[int, int]
    misses: tuple[int, int]
    fetched_bytes: tuple[int, int]
    warnings: tuple[str, ...] = ()

    @property
    def gbps(self) -> tuple[float, float]:
        return (self.nbytes / self.epoch_s[0] / 1e9, self.nbytes / self.epoch_s[1] / 1e9)

    @property
    def speedup(self) -> float:
        """Epoch 2's throughput over epoch 1's."""
        return self.epoch_s[0] / self.epoch_s[1]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(gbps=self.gbps, speedup=self.speedup)
        return out


def cache_epochs(
    url: str,
    cache: str | Path,
    *,
    fields: Mapping[str, Any] | None = None,
    array: str | None = None,
    chunk_size: int,
    windows: int = 8,
    workers: int = 4,
    seed: int = 0,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> CacheEpochsReport:
    """Stream the same ``windows`` windows of ``url`` twice through a CPU
    :class:`ChunkLoader` over one ``ZarrSource(url, cache=cache)``: epoch 1 fills the
    cache (or finds it filled by an earlier run), epoch 2 reads it. ``progress``: a bar
    per epoch."""
    seconds, hits, misses, fetched, nbytes = [], [], [], [], 0
    with ZarrSource(
        url, fields, array=array, storage_options=storage_options, cache=cache
    ) as source:
        counters = source.cache.counters
        for epoch in (1, 2):
            before = counters.snapshot()
            # a new loader with the same seed: the same windows in the same order
            took, nbytes = timed_epoch(
                source,
                chunk_size,
                windows,
                workers=workers,
                seed=seed,
                desc=f"cache epoch {epoch}",
                progress=progress,
            )
            seconds.append(took)
            hits.append(counters.hits - before.hits)
            misses.append(counters.misses - before.misses)
            fetched.append(counters.fetched_bytes - before.fetched_bytes)
        said = tuple(source.cache.warnings)
    return CacheEpochsReport(
        url=url,
        cache=str(cache),
        windows=windows,
        nbytes=nbytes,
        epoch_s=(seconds[0], seconds[1]),
        hits=(hits[0], hits[1]),
        misses=(misses[0], misses[1]),
        fetched_bytes=(fetched[0], fetched[1]),
        warnings=said,
    )
