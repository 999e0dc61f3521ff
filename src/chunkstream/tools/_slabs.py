"""``convert``'s unit of work: a slab, one output time chunk of one field.

Each slab is read from IN and written to the output chunk it alone owns, so
concurrent copies never write the same chunk file. :func:`copy_slabs` keeps at
most ``2 * workers`` copies in flight and hands each finished one back in the
calling thread. A slab's digest is a BLAKE2b digest of its values (their bytes
in native byte order, so a big-endian input and its native-order output agree);
a field's checksum is the digest of its slabs' digests in time order.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from .._errors import ConfigError

__all__ = [
    "ERROR_SAMPLE_SLABS",
    "FieldPlan",
    "Slab",
    "combine",
    "copy_slab",
    "copy_slabs",
    "digest",
    "native",
    "rounding_error",
    "slabs_of",
]

ERROR_SAMPLE_SLABS = 4  # slabs per field compared for the rounding error, spread over time


class FieldPlan(NamedTuple):
    """One output field: its name, its source text, the input array and selection,
    the shape of one output timestep, and the output time chunk."""

    name: str
    source: str
    array: Any
    index: tuple
    step_shape: tuple[int, ...]
    t_chunk: int

    @property
    def slabs(self) -> int:
        """Output time chunks of the field."""
        return -(-int(self.array.shape[0]) // self.t_chunk)


class Slab(NamedTuple):
    """Timesteps ``[t0, t1)`` of field ``name``: its ``i``-th output chunk."""

    name: str
    i: int
    t0: int
    t1: int
    array: Any
    index: tuple


def slabs_of(plan: Iterable[FieldPlan]) -> list[Slab]:
    """Every slab of every field, field by field in time order."""
    return [
        Slab(
            f.name,
            i,
            i * f.t_chunk,
            min(int(f.array.shape[0]), (i + 1) * f.t_chunk),
            f.array,
            f.index,
        )
        for f in plan
        for i in range(f.slabs)
    ]


def rounding_error(array: Any, index: tuple, target: Any, t_chunk: int, slabs: int) -> float:
    """The largest ``|IN - OUT|`` over up to ``ERROR_SAMPLE_SLABS`` slabs spread over time."""
    picks = sorted(
        {
            round(i * (slabs - 1) / max(1, ERROR_SAMPLE_SLABS - 1))
            for i in range(min(slabs, ERROR_SAMPLE_SLABS))
        }
    )
    worst = 0.0
    for i in picks:
        t0, t1 = i * t_chunk, min(int(array.shape[0]), (i + 1) * t_chunk)
        exact = np.asarray(array[(slice(t0, t1), *index)], dtype=np.float64)
        stored = np.asarray(target[t0:t1], dtype=np.float64)
        with np.errstate(invalid="ignore"):  # inf - inf where IN already held inf
            diff = np.abs(exact - stored)
        diff[(exact == stored) | (np.isnan(exact) & np.isnan(stored))] = 0.0
        worst = max(worst, float(diff.max(initial=0.0)))
    return worst


def digest(data: np.ndarray) -> str:
    """The digest of ``data``'s values: its bytes in native byte order, so a big-endian
    input and its native-order output agree."""
    native = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("="))
    return hashlib.blake2b(native.data, digest_size=16).hexdigest()


def native(dtype: Any) -> np.dtype:
    """``dtype`` in native byte order: the output is written so, whatever IN's order."""
    return np.dtype(dtype).newbyteorder("=")


def combine(digests: list[str]) -> str:
    """One digest of a field's slab digests, in time order."""
    return hashlib.blake2b("".join(digests).encode(), digest_size=16).hexdigest()


def copy_slab(slab: Slab, targets: dict[str, Any], out_dtype: Any) -> str:
    """Read one slab from IN, write it to its output chunk, return its digest.

    Raises :class:`ConfigError` when a finite value would overflow ``out_dtype``.
    """
    name, _, t0, t1, array, index = slab
    data = np.ascontiguousarray(array[(slice(t0, t1), *index)])
    if out_dtype is not None:
        try:
            with np.errstate(over="raise"):
                data = data.astype(out_dtype)
        except FloatingPointError:  # a finite value would become inf: refuse, not round
            raise ConfigError.bad(
                "dtype",
                out_dtype.name,
                f"a dtype that holds field {name!r}: timesteps [{t0}, {t1}) reach "
                f"{np.nanmax(np.abs(data)):.6g}, beyond {out_dtype.name}'s "
                f"{float(np.finfo(out_dtype).max):.6g}",
                "Convert to float32, or rescale the data first.",
            ) from None
    targets[name][t0:t1] = data
    return digest(data)


def copy_slabs(
    pool: cf.Executor,
    pending: Iterable[Slab],
    copy: Callable[[Slab], str],
    workers: int,
    record: Callable[[Slab, str, int], None],
) -> int:
    """Run ``copy`` on every pending slab, at most ``2 * workers`` in flight; returns how
    many finished.

    ``record(slab, digest, n)`` runs in the calling thread as the ``n``-th one
    finishes; an exception from ``copy`` or ``record`` cancels the copies not
    yet started and propagates.
    """
    written = 0
    queue = iter(pending)
    running: dict[cf.Future, Slab] = {}
    try:
        while True:
            while len(running) < 2 * workers and (slab := next(queue, None)) is not None:
                running[pool.submit(copy, slab)] = slab
            if not running:
                return written
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                slab, value = running.pop(future), future.result()
                written += 1
                record(slab, value, written)
    finally:
        for future in running:
            future.cancel()
