"""Resident mode: the rows a plan can reach, read once and kept on the loader's device.

At the first ``epoch()`` the readers read rows ``[lo, hi)`` (the whole source,
or the segments' hull) with the streaming read path into one tensor per field on
the device; then every chunk is served from them, a one-piece chunk as a view, a
pieced chunk as a gather into fresh tensors. Plans, cursor, chunks and
``state_dict`` are the streaming ones, so both modes deliver the same chunks.

CUDA ordering: the tensors are allocated by the thread of the first ``epoch()``,
which waits for its current stream first; the readers copy from pageable memory
and the device is synchronized before any chunk is served, and the tensors are
never written again. A gather runs on the transfer stream between two events;
the consumer's stream waits on the second and ``record_stream`` covers it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np
import torch

from .._errors import ConfigError
from .._executor import Executor
from .._memory import resident_decision
from ..plans import Piece, Plan
from ..sources import FieldSpec, Source, read_window, window_nbytes
from ..stats import COPY, Trip, profiled
from ._jobs import Delivery, on_stream

__all__ = ["ResidentStore", "make_resident", "resident_rows"]

_log = logging.getLogger("chunkstream.pipeline")


def resident_rows(plan: Plan, total: int) -> tuple[int, int]:
    """``[lo, hi)``: the timesteps the plan can reach (the segments' hull, else all)."""
    segments = plan.segments
    if not segments:
        return 0, total
    return min(s.start for s in segments), min(total, max(s.stop for s in segments))


def make_resident(
    plan: Plan,
    source: Source,
    device: torch.device,
    stream: Any,
    resident: object,
    host_memory: int | None,
    device_memory: int | None,
) -> tuple[ResidentStore | None, str]:
    """A loader's resident store (``None``: it streams) and the reason, logged once."""
    lo, hi = resident_rows(plan, len(source))
    if resident is False:  # decided without the fields, which a source may learn later
        return None, resident_decision(
            False,
            device=device,
            nbytes=0,
            rows=hi - lo,
            device_memory=device_memory,
            host_memory=host_memory,
        )[1]
    if source.fields is None and resident == "auto":
        return None, "streaming: the source learns its fields' sizes at its first read"
    if source.fields is None:
        raise ConfigError.bad(
            "resident",
            resident,
            "False or 'auto' for a source whose fields are learned at its first read",
            "Pass the field specs to the source.",
        )
    nbytes = window_nbytes(source.fields, hi - lo)
    on, why = resident_decision(
        resident,
        device=device,
        nbytes=nbytes,
        rows=hi - lo,
        device_memory=device_memory,
        host_memory=host_memory,
    )
    _log.info("chunkstream: %s", why)
    return (ResidentStore(source.fields, lo, hi, device, stream) if on else None), why


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


class ResidentStore:
    """Rows ``[lo, hi)`` of every field on ``device``, read once by :meth:`load`."""

    def __init__(
        self, fields: Mapping[str, FieldSpec], lo: int, hi: int, device: torch.device, stream: Any
    ) -> None:
        self.lo, self.hi, self.device, self._stream = lo, hi, device, stream
        self._fields = dict(fields)
        self.tensors: dict[str, torch.Tensor] = {}  # allocated by load()
        self.loaded = False

    def start(self, source: Source, readers: Executor, rows: int, config: Any) -> list[Future]:
        """Allocate the tensors and submit the reads of every row, ``rows`` timesteps per
        call, on ``readers``; each future's error is a :class:`~chunkstream.ChunkLoadError`
        naming its window. Call :meth:`finish` once they all succeeded."""
        self.tensors = {
            name: torch.empty(
                (self.hi - self.lo, *spec.shape), dtype=_torch_dtype(spec.dtype), device=self.device
            )
            for name, spec in self._fields.items()
        }
        if self.device.type == "cuda":
            # The blocks come from this thread's current stream, whose queued work may
            # still use them; the readers write on their own streams, so wait for it.
            torch.cuda.current_stream(self.device).synchronize()
        fill = partial(
            self._fill, source, check_finite=config.check_finite, retries=config.read_retries
        )
        return [
            readers.submit(fill, a, min(a + rows, self.hi), what=f"resident [{a}, ...)")
            for a in range(self.lo, self.hi, rows)
        ]

    def finish(self) -> None:
        """After every read of :meth:`start` succeeded: the tensors are complete."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # every reader's copies, on any stream
            for tensor in self.tensors.values():
                # Gathers read these on the transfer stream: when the data is freed, the
                # allocator must wait for them before handing the blocks out again.
                tensor.record_stream(self._stream)
        self.loaded = True

    def _fill(
        self, source: Source, start: int, stop: int, *, check_finite: bool, retries: int
    ) -> None:
        rows = {name: t[start - self.lo : stop - self.lo] for name, t in self.tensors.items()}
        on_cpu = self.device.type == "cpu"
        # On the CPU the rows are read in place (a leading-axis slice is C-contiguous).
        out = {
            name: (t.numpy() if on_cpu else np.empty(tuple(t.shape), self._fields[name].dtype))
            for name, t in rows.items()
        }
        read_window(
            source, (Piece(0, start, stop),), out, check_finite=check_finite, retries=retries
        )
        if not on_cpu:
            for name, t in rows.items():
                t.copy_(torch.from_numpy(out[name]))

    def serve(self, pieces: tuple[Piece, ...], dropped: Callable[[], bool], trip: Trip) -> Delivery:
        """A chunk's tensors: a view of the resident rows for one piece, a gather for more
        (stamped on ``trip`` as its read, and on the device as its transfer)."""
        begin, lo = time.perf_counter(), self.lo
        first = pieces[0]
        if len(pieces) == 1:
            tensors = {n: t[first.start - lo : first.stop - lo] for n, t in self.tensors.items()}
            trip.read_done(begin)
            return Delivery(pieces, tensors)
        with profiled(COPY, (first.start, first.stop)):
            delivery = self._gather(pieces)
        trip.read_done(begin)
        if delivery.events is not None:
            trip.transfer_issued(at=begin)
        return delivery

    def _gather(self, pieces: tuple[Piece, ...]) -> Delivery:
        lo, stream, events = self.lo, self._stream, None

        def gather() -> dict[str, torch.Tensor]:
            return {
                name: torch.cat([t[p.start - lo : p.stop - lo] for p in pieces])
                for name, t in self.tensors.items()
            }

        if stream is None:
            tensors = gather()
        else:  # on the transfer stream, between two events
            tensors, events = on_stream(stream, gather)
        return Delivery(pieces, tensors, events)
