"""``bench``'s figures and verdict for one setting, and its recommendation over all.

:func:`summarise` turns the per-chunk records of one (prefetch, workers)
setting into a :class:`SettingResult`: waits, queue depths, mean read, copy and
training times, the ideal pipeline bound (docs/guide/tuning.md)::

    ideal = first_read + n * max(read / workers, transfer, train)

(``first_read`` is the first chunk's read plus copy; ``read`` the mean read
time, divided by the workers that read in parallel) and a verdict. A setting **keeps up** when, after the first chunk, the consumer
waited at most :data:`KEEP_UP_STALL` of the epoch. Otherwise the bottleneck is
named with its fix: ``transfer`` (the host-to-device copy is slower than
training), ``read`` (reads are slower on average: more workers, a rechunked
store, a faster codec), ``bursts`` (only some reads are slower: deeper
prefetch); a setting that keeps up but whose first read is over a quarter of
the epoch is marked ``startup`` (a smaller chunk fills the pipeline sooner).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from ..stats import LatencyStats

__all__ = [
    "KEEP_UP_STALL",
    "BenchChunk",
    "SettingResult",
    "recommend",
    "summarise",
    "versus_bound",
]

KEEP_UP_STALL = 0.10  # waiting at most this fraction of the epoch counts as keeping up
_MS = 1e3


@dataclass(frozen=True, kw_only=True)
class BenchChunk:
    """One chunk of one setting; times in seconds, clocks relative to the epoch's start."""

    index: int
    start: int
    queue_depth: int
    wait_s: float
    read_s: float
    transfer_s: float | None
    train_s: float
    read_begin: float
    read_end: float
    transfer_begin: float | None
    received: float
    train_end: float


@dataclass(kw_only=True)
class SettingResult:
    """The figures of one (prefetch, workers) setting."""

    prefetch: int
    workers: int
    gpu_prefetch: int
    capacity: int  # queue depth counted as full
    epoch_s: float
    ideal_s: float
    overlap: float  # epoch_s / ideal_s (1.0 is perfect overlap)
    first_read_s: float
    wait_mean_s: float
    wait_max_s: float
    wait_after_first_mean_s: float
    stall_fraction: float  # wait after the first chunk / epoch time after it
    queue_empty: int  # chunks after the first where the consumer found no chunk ready
    queue_full: int
    read_mean_s: float
    read_max_s: float
    transfer_mean_s: float | None
    train_mean_s: float
    keeping_up: bool
    bottleneck: str  # "none", "read", "transfer", "bursts", "startup"
    verdict: str
    chunks: list[BenchChunk] = field(default_factory=list)
    stats: LatencyStats | None = field(default=None, repr=False)  # the loader's records

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stats"}
        out["chunks"] = [asdict(c) for c in self.chunks]
        return out

    @property
    def label(self) -> str:
        return f"prefetch={self.prefetch} workers={self.workers}"


def summarise(
    prefetch: int,
    workers: int,
    gpu_prefetch: int,
    capacity: int,
    epoch_s: float,
    chunks: list[BenchChunk],
    amplification: float,
    compressed: bool,
) -> SettingResult:
    """The figures and verdict of one setting from its ``chunks`` (at least one).

    ``capacity`` is the queue depth counted as full; ``amplification`` (bytes
    decoded per byte used) and ``compressed`` choose the fixes a slow read gets.
    """
    n = len(chunks)
    reads = [c.read_s for c in chunks]
    transfers = [c.transfer_s for c in chunks if c.transfer_s is not None]
    waits = [c.wait_s for c in chunks]
    read_mean = sum(reads) / n
    transfer_mean = sum(transfers) / len(transfers) if transfers else None
    train_mean = sum(c.train_s for c in chunks) / n
    first_read = chunks[0].read_s + (chunks[0].transfer_s or 0.0)
    ideal = first_read + n * max(read_mean / workers, transfer_mean or 0.0, train_mean)
    after = waits[1:]
    busy_after = epoch_s - waits[0]
    stall = sum(after) / busy_after if after and busy_after > 0 else 0.0
    empty = sum(1 for c in chunks[1:] if c.queue_depth == 0)
    keeping_up = stall <= KEEP_UP_STALL
    mean_after = sum(after) / max(1, len(after))
    if keeping_up:
        bottleneck, verdict = _keeping_up(stall, mean_after, waits[0], epoch_s, ideal)
    else:
        head = (
            f"NOT keeping up: the consumer waited {stall:.0%} of the time after the first "
            f"chunk (mean {mean_after * _MS:.1f} ms, max "
            f"{max(after, default=0.0) * _MS:.1f} ms; queue empty {empty}/{n - 1} times)."
        )
        bottleneck, fix = _slow_fix(
            prefetch,
            workers,
            read_mean,
            max(reads),
            transfer_mean,
            train_mean,
            amplification,
            compressed,
        )
        verdict = f"{head} {fix}"
    return SettingResult(
        prefetch=prefetch,
        workers=workers,
        gpu_prefetch=gpu_prefetch,
        capacity=capacity,
        epoch_s=epoch_s,
        ideal_s=ideal,
        overlap=epoch_s / ideal if ideal > 0 else 0.0,
        first_read_s=first_read,
        wait_mean_s=sum(waits) / n,
        wait_max_s=max(waits),
        wait_after_first_mean_s=mean_after,
        stall_fraction=stall,
        queue_empty=empty,
        queue_full=sum(1 for c in chunks[1:] if c.queue_depth >= capacity),
        read_mean_s=read_mean,
        read_max_s=max(reads),
        transfer_mean_s=transfer_mean,
        train_mean_s=train_mean,
        keeping_up=keeping_up,
        bottleneck=bottleneck,
        verdict=verdict,
        chunks=chunks,
    )


def versus_bound(epoch_s: float, ideal: float) -> str:
    """The epoch time against the ideal bound, worded for what happened: the bound is
    built from mean times, so a run can come in under it, and is not then "0.9x" a floor."""
    if ideal <= 0:
        return "no ideal bound (no time measured)"
    ratio = epoch_s / ideal
    if ratio >= 1:
        return f"epoch {ratio:.2f}x the ideal bound"
    return (
        f"epoch {(1 - ratio):.0%} under the ideal bound's estimate (the bound adds mean "
        "read, copy and train times, and this run's overlapped better): as fast as it gets"
    )


def _keeping_up(
    stall: float, mean_after: float, first_wait: float, epoch_s: float, ideal: float
) -> tuple[str, str]:
    """``(bottleneck, verdict)`` of a setting that keeps up: ``none``, or ``startup``."""
    verdict = (
        f"keeping up: after the first chunk the consumer waited {stall:.0%} of the time "
        f"(mean {mean_after * _MS:.1f} ms per chunk); {versus_bound(epoch_s, ideal)}."
    )
    if first_wait <= 0.25 * epoch_s:
        return "none", verdict
    return "startup", verdict + (
        f" The first read ({first_wait:.2f} s) is {first_wait / epoch_s:.0%} of the epoch: "
        "use a smaller chunk_size (or more chunks per epoch) so the pipeline fills sooner."
    )


def _slow_fix(
    prefetch: int,
    workers: int,
    read_mean: float,
    read_max: float,
    transfer_mean: float | None,
    train_mean: float,
    amplification: float,
    compressed: bool,
) -> tuple[str, str]:
    """``(bottleneck, fix)`` of a setting that does not keep up."""
    per_chunk_read = read_mean / workers
    if transfer_mean is not None and transfer_mean >= max(per_chunk_read, 0.9 * train_mean):
        return "transfer", (
            f"The host-to-device copy ({transfer_mean * _MS:.1f} ms per chunk) is slower "
            f"than training ({train_mean * _MS:.1f} ms): move fewer bytes (fewer fields, "
            "float16) or train more per chunk; more workers or prefetch will not help."
        )
    if per_chunk_read >= 0.9 * train_mean:
        fixes = [f"more workers (--workers {workers * 2})"]
        if amplification > 1.5:
            fixes.append(
                f"rechunk with `chunkstream convert` (reads decode {amplification:.1f}x "
                "the bytes they use)"
            )
        if compressed:
            fixes.append("a faster codec (lz4) or none")
        return "read", (
            f"Reading a chunk takes {read_mean * _MS:.1f} ms in each of {workers} "
            f"worker(s) against {train_mean * _MS:.1f} ms of training: the reader is "
            f"slower on average, so deeper prefetch only delays the stall. Try "
            + ", ".join(fixes)
            + "."
        )
    return "bursts", (
        f"Reads are fast enough on average ({read_mean * _MS:.1f} ms) but some take "
        f"{read_max * _MS:.1f} ms against {train_mean * _MS:.1f} ms of training: use a "
        f"deeper prefetch (--prefetch {prefetch * 2}) to ride them out."
    )


def recommend(settings: list[SettingResult]) -> str:
    """The smallest setting that keeps up, or the best of those that do not, with its fix."""
    good = [s for s in settings if s.keeping_up]
    if good:
        best = min(good, key=lambda s: (s.prefetch + s.workers, s.epoch_s))
        return (
            f"use {best.label}: the smallest setting that keeps up "
            f"({len(good)}/{len(settings)} settings keep up)."
        )
    best = min(settings, key=lambda s: s.stall_fraction)
    return f"no setting keeps up; the best was {best.label}. {best.verdict}"
