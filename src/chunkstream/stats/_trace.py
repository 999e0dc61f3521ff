"""The loader's work as a Chrome/Perfetto trace, and ranges the torch profiler can see.

:func:`chrome_trace` turns the per-chunk records of a
:class:`~chunkstream.LatencyStats` into Chrome trace-event JSON (open it in
https://ui.perfetto.dev or ``chrome://tracing``), without needing the profiler:
one complete event (``"ph": "X"``) per chunk and stage, named as the profiler
ranges are, on one track per thread that did the work:

* ``chunkstream.read``: the source read, on the reader thread's track;
* ``chunkstream.copy``: the host-to-device copy (CUDA, once its events have
  completed), on the transfer thread's track, placed on the host clock at the
  moment the copy was issued;
* ``chunkstream.wait``: the consumer blocked waiting for the chunk, on the
  ``consumer`` track.

Each event's ``args`` hold the window (``start``, ``stop``), ``epoch``, ``index``
and ``bytes``. Records made without a thread name (``read_thread`` ``None``) are
packed onto ``reader <k>`` tracks so that no two spans of one track overlap.

:func:`profiled` is the range the pipeline threads open around their work; it
costs one attribute lookup while no profiler runs. A ``torch.profiler.profile``
records ranges of threads other than its own only with
``experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True)``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch.autograd.profiler as _autograd_profiler

__all__ = ["COPY", "READ", "WAIT", "chrome_trace", "profiled", "write_trace"]

READ, COPY, WAIT = "chunkstream.read", "chunkstream.copy", "chunkstream.wait"
_NULL = contextlib.nullcontext()


def profiled(name: str, window: tuple[int, int] | None = None) -> contextlib.AbstractContextManager:
    """A ``torch.profiler.record_function`` range ``"<name> [start, stop)"`` while a profiler
    runs; otherwise a shared no-op context (no allocation, no call into torch).

    ``torch.autograd.profiler._is_profiler_enabled`` is torch's process-wide flag for
    such fast checks (set by every profiler on start); where a torch lacks it, the
    range is always opened.
    """
    if not getattr(_autograd_profiler, "_is_profiler_enabled", True):
        return _NULL
    label = name if window is None else f"{name} [{window[0]}, {window[1]})"
    return _autograd_profiler.record_function(label)


def _pack(spans: list[tuple[float, float, int]]) -> dict[int, int]:
    """Lane per span (by position) such that spans in one lane do not overlap."""
    ends: list[float] = []
    lanes: dict[int, int] = {}
    for begin, end, position in sorted(spans):
        lane = next((k for k, last in enumerate(ends) if last <= begin), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        lanes[position] = lane
    return lanes


def chrome_trace(records: Iterable[Any]) -> dict[str, Any]:
    """Chrome trace-event JSON (a dict with ``traceEvents``) of ``ChunkRecord``s (module docs)."""
    records = list(records)
    pid = os.getpid()
    spans: list[tuple[str, str, float, float, Any]] = []  # (stage, track, begin, end, record)
    unnamed = [(r.read_begin, r.read_end, i) for i, r in enumerate(records) if not r.read_thread]
    lanes = _pack(unnamed)
    for i, r in enumerate(records):
        reader = r.read_thread or f"reader {lanes[i]}"
        spans.append((READ, reader, r.read_begin, r.read_end, r))
        if r.transfer_begin is not None and r.transfer_end is not None:
            spans.append(
                (COPY, r.transfer_thread or "transfer", r.transfer_begin, r.transfer_end, r)
            )
        spans.append((WAIT, "consumer", r.received - r.wait_s, r.received, r))
    origin = min((begin for _, _, begin, _, _ in spans), default=0.0)
    # The consumer first, then the readers and the transfer thread, each in name order.
    order = {"consumer": (0, "")}
    for stage, track, *_ in spans:
        order.setdefault(track, (1 if stage == READ else 2, track))
    tids = {track: tid for tid, track in enumerate(sorted(order, key=order.__getitem__))}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "chunkstream"}}
    ]
    for track, tid in tids.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}}
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    for stage, track, begin, end, r in spans:
        events.append(
            {
                "name": stage,
                "cat": "chunkstream",
                "ph": "X",
                "pid": pid,
                "tid": tids[track],
                "ts": (begin - origin) * 1e6,
                "dur": max(0.0, end - begin) * 1e6,
                "args": {
                    "start": r.start,
                    "stop": r.stop,
                    "epoch": r.epoch,
                    "index": r.index,
                    "bytes": r.nbytes,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(records: Iterable[Any], path: str | os.PathLike) -> Path:
    """Write :func:`chrome_trace` of ``records`` to ``path`` (parents created); return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(records)))
    return path
