"""Timing forward, backward and step of sampled batches, correctly on a GPU.

CUDA kernels run asynchronously: a host clock read around ``model(x)`` measures
the launch, not the work. So on CUDA every mark is a ``torch.cuda.Event``
recorded on the current stream *of the timer's device* (``cuda:k``, resolved
when the timer is made: the thread's current device may be another GPU, whose
idle stream would time nothing and gain a context), and the stats read
``elapsed_time`` only after every event of the batch has completed
(``LatencyStats.resolve_pending``, which polls with ``query()`` and never
blocks). On CPU (and other synchronous devices) the marks read
``time.perf_counter``.

Only every ``every``-th batch is timed, so the events cost nothing measurable.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from .._device import resolve_device
from .._errors import ConfigError, check_int

__all__ = ["BatchTimer"]


class BatchSink(Protocol):
    """Where timed batches go (a :class:`~chunkstream.LatencyStats`)."""

    def record_batch(
        self, forward_s: float, backward_s: float, step_s: float, begin: float = 0.0
    ) -> None: ...

    def record_batch_events(self, begin: float, events: tuple) -> None: ...


_PHASES = ("forward", "backward")


class _NullBatch:
    """The batch is not sampled: marks do nothing."""

    __slots__ = ()

    def mark(self, phase: str) -> None:
        del phase

    def __enter__(self) -> _NullBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _NullBatch()


class _TimedBatch:
    """One sampled batch: ``mark("forward")``, ``mark("backward")``; leaving the block is "step"."""

    __slots__ = ("_begin", "_device", "_marks", "_stats")

    def __init__(self, stats: BatchSink, device: torch.device | None) -> None:
        self._stats = stats
        self._device = device  # a CUDA device with its index, or None (host clock)
        self._marks: dict[str, Any] = {}
        self._begin = 0.0

    def _now(self) -> Any:
        if self._device is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self._device))
            return event
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        """The phase ``"forward"`` or ``"backward"`` ends here."""
        if phase not in _PHASES:
            raise ConfigError.bad("phase", phase, f"one of {_PHASES} (leaving the block is 'step')")
        self._marks[phase] = self._now()

    def __enter__(self) -> _TimedBatch:
        self._begin = time.perf_counter()
        self._marks = {"start": self._now()}
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            return  # a failed batch is not a measurement
        end = self._now()
        marks = self._marks
        start = marks["start"]
        # A phase never marked has length 0: it ends where the previous one did.
        fwd = marks.get("forward", start)
        bwd = marks.get("backward", fwd)
        if self._device is not None:
            self._stats.record_batch_events(self._begin, (start, fwd, bwd, end))
        else:
            self._stats.record_batch(fwd - start, bwd - fwd, end - bwd, begin=self._begin)


class BatchTimer:
    """Times every ``every``-th batch into a :class:`~chunkstream.LatencyStats` (see module docs)."""

    def __init__(
        self, stats: BatchSink, device: str | torch.device | None = "cpu", *, every: int = 1
    ) -> None:
        check_int("every", every, fix="Pass every=1 to time each batch.")
        #: The device whose current stream the marks are recorded on (index resolved).
        self.device = resolve_device(device if device is not None else "cpu")
        self.cuda = self.device.type == "cuda"
        self.every = every
        self.count = 0
        self._stats = stats

    def batch(self) -> _TimedBatch | _NullBatch:
        """A context manager for one batch; timed when this is a sampled batch."""
        sampled = self.count % self.every == 0
        self.count += 1
        return _TimedBatch(self._stats, self.device if self.cuda else None) if sampled else _NULL
