"""``convert``: rewrite a store into one time-chunked array per field.

The output ``OUT`` is a zarr group holding one array per field (``OUT/<field>``,
readable by ``ZarrSource("OUT/voltage")``), chunked along time only (a time
chunk of about ``chunk_mb`` MiB, the other axes whole), with the chosen codec.
Its attributes record the source and the fields under ``"chunkstream"``.

How it runs:

* **Slabs.** The work is a list of slabs, one output chunk of one field each.
  Every slab is read from IN and written to the output chunk it alone owns, so
  workers (a thread pool) never write the same chunk file.
* **Bounded memory.** At most ``2 * workers`` slabs are in flight, each about
  ``chunk_mb`` MiB (plus the input chunks zarr decodes to fill it).
* **Resumable.** While it runs, ``OUT/.chunkstream-convert.json`` records the
  arguments and every slab finished (with the BLAKE2b digest of the values read
  from IN: their bytes in native byte order), rewritten atomically after each
  slab. A rerun with the same arguments skips finished slabs; an existing OUT
  made with other arguments is an error unless ``overwrite``.
* **Verified.** At the end every output slab is read back and its digest must
  equal the one taken from IN; each field's checksum is the digest of its
  slabs' digests in time order, reported for IN and OUT. On success the
  checksums and arguments move to the group attributes and the progress file is
  removed (zarr warns about unknown files in a group); rerunning a finished
  conversion only re-verifies OUT against those checksums.
* **Native byte order.** OUT is written in native byte order whatever IN's
  (a big-endian v2 ``'>f4'`` input becomes ``float32``); the digests compare
  values, so such a conversion verifies.
* **IN is never written**: it is opened read-only, and OUT may not lie inside it.
* **Storage dtype.** ``dtype`` (e.g. ``float16``) writes every field in that
  dtype; the digests are then taken of the converted slabs, so verification
  checks OUT against the converted input, and each field reports the largest
  absolute rounding error over a sample of slabs (``max_abs_error``). A finite
  value beyond the new dtype's range stops the run with a ``ConfigError``.

An interleaved input is decoded once per field that reads it (slabs are per
field); converting is a one-off, and this keeps slab ownership trivial.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError, CorruptChunkError, check_int
from .._memory import thread_budget
from .._progress import progress_bar
from ..sources import check_lengths
from ._codecs import OUT_DTYPES, compressors_for
from ._fieldspec import format_index, parse_fields, selected_shape
from ._slabs import (
    FieldPlan,
    Slab,
    combine,
    copy_slab,
    copy_slabs,
    digest,
    native,
    rounding_error,
    slabs_of,
)
from ._stores import is_remote, open_arrays, resolve_field

__all__ = ["OUT_DTYPES", "ConvertReport", "FieldResult", "convert_store", "flyvis_fields"]

_log = logging.getLogger(__name__)
PROGRESS = ".chunkstream-convert.json"
_FLYVIS_COLUMNS = {"voltage": 0, "stimulus": 1, "calcium": 2, "fluorescence": 3}
_FLYVIS_IDS = {3: "voltage", 4: "stimulus", 7: "calcium", 8: "fluorescence"}


@dataclass(frozen=True, kw_only=True)
class FieldResult:
    """One converted field: where it came from, its output layout and checksums."""

    name: str
    source: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    slabs: int
    checksum_in: str
    checksum_out: str | None
    max_abs_error: float | None = None  # with ``dtype``: over the sampled slabs


@dataclass(frozen=True, kw_only=True)
class ConvertReport:
    """What :func:`convert_store` did; ``verified`` is True when every field's
    output checksum equals its input checksum."""

    source: str
    out: str
    codec: str
    fields: list[FieldResult]
    slabs_written: int
    slabs_skipped: int
    decoded_bytes: int
    stored_bytes: int
    verified: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def flyvis_fields(column: str | int = "voltage", stim_dims: int = 1736) -> list[str]:
    """The ``--fields`` of the FlyVis layout: ``column`` and the stimulus.

    ``column`` is a dynamic column name or its id (3, 4, 7, 8); the stimulus is
    column STIMULUS limited to its first ``stim_dims`` neurons.
    """
    name = _FLYVIS_IDS.get(column, column) if isinstance(column, int) else str(column).lower()
    if isinstance(column, int) and column not in _FLYVIS_IDS:
        raise ConfigError.bad(
            "column",
            column,
            "a dynamic column id (3, 4, 7 or 8)",
            "Static columns (0-2, 5, 6) are in metadata.zarr: read it directly.",
        )
    if name not in _FLYVIS_COLUMNS:
        raise ConfigError.bad("column", column, f"one of {sorted(_FLYVIS_COLUMNS)} or 3, 4, 7, 8")
    check_int("stim_dims", stim_dims)
    stim = f"stimulus=timeseries[0:{stim_dims},1]"
    if name == "stimulus":
        return [stim]
    return [f"{name}=timeseries[:,{_FLYVIS_COLUMNS[name]}]", stim]


def _save_progress(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _prepare_out(out: Path, args: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """Return the saved progress to resume from, or None to start afresh."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise ConfigError(f"out={str(out)!r} exists and is not a directory: choose another path.")
    progress = out / PROGRESS
    if overwrite:
        shutil.rmtree(out)
        return None
    saved = None
    if progress.is_file():
        saved = json.loads(progress.read_text())
    elif (out / "zarr.json").is_file() or (out / ".zattrs").is_file():
        import zarr

        meta = dict(zarr.open_group(str(out), mode="r").attrs).get("chunkstream", {})
        if "checksums" in meta:
            saved = {"args": meta.get("args"), "done": None, "checksums": meta["checksums"]}
    if saved is not None:
        if saved.get("args") == args:
            return saved
        raise ConfigError(
            f"out={str(out)!r} holds a conversion made with other arguments "
            f"({saved.get('args')}): delete it or pass --overwrite."
        )
    if any(out.iterdir()):
        raise ConfigError(
            f"out={str(out)!r} already exists and is not a chunkstream conversion: "
            "delete it or pass --overwrite."
        )
    return None


def _check_workers(chunk_mb: float, workers: int | None) -> int:
    """The worker count (``workers`` or its default) once ``chunk_mb`` and ``workers`` are
    valid; raises :class:`ConfigError` naming a bad one."""
    if not chunk_mb > 0:
        raise ConfigError.bad("chunk_mb", chunk_mb, "a positive number of MiB, e.g. 32")
    workers = min(4, thread_budget()) if workers is None else workers
    check_int("workers", workers)
    return workers


def _out_dtype(dtype: str | None) -> np.dtype | None:
    """``dtype`` as a numpy dtype of :data:`OUT_DTYPES`, or ``None`` (keep each field's)."""
    if dtype is None:
        return None
    try:
        out_dtype = np.dtype(dtype)
    except TypeError:
        out_dtype = None
    if out_dtype is None or out_dtype.name not in OUT_DTYPES:
        raise ConfigError.bad(
            "dtype",
            dtype,
            f"None or one of {', '.join(OUT_DTYPES)}",
            "Pass --dtype float16 for a half-precision copy.",
        )
    return out_dtype


def _plan_fields(
    source: str | os.PathLike,
    fields: Iterable[str] | Mapping[str, Any],
    chunk_mb: float,
    out_dtype: np.dtype | None = None,
) -> list[FieldPlan]:
    """Each requested field resolved in ``source``, with a time chunk of ~``chunk_mb`` MiB
    as written (in ``out_dtype`` when given).

    Raises :class:`ConfigError` when no field is named or their time lengths differ.
    """
    arrays = open_arrays(source)
    requests = parse_fields(fields)
    if not requests:
        raise ConfigError.bad("fields", fields, "at least one NAME=INDEX", "Pass --fields.")
    resolved = [resolve_field(req, arrays) for req in requests]
    check_lengths(
        {r.name: int(a.shape[0]) for r, (_, a, _) in zip(requests, resolved, strict=True)},
        str(source),
    )
    plan = []
    for req, (name, array, index) in zip(requests, resolved, strict=True):
        step_shape = selected_shape(index, tuple(array.shape[1:]))
        itemsize = (out_dtype or array.dtype).itemsize
        step_bytes = max(1, int(np.prod(step_shape, dtype=np.int64)) * itemsize)
        total = int(array.shape[0])
        wanted = int(max(1, chunk_mb * 2**20 // step_bytes))
        t_chunk = min(max(1, total), wanted)
        if wanted > total:  # said, not cut in silence: the field is shorter than one chunk
            _log.info(
                "%s: a time chunk of chunk_mb=%s MiB is %d timesteps, more than the field's "
                "%d: one chunk holds the whole field",
                req.name,
                chunk_mb,
                wanted,
                total,
            )
        plan.append(
            FieldPlan(req.name, f"{name}[{format_index(index)}]", array, index, step_shape, t_chunk)
        )
    return plan


def _create_out(
    out: Path, plan: list[FieldPlan], args: dict[str, Any], compressors: Any, out_dtype: Any
) -> None:
    """Create the output group, one empty array per field, and the progress file."""
    import zarr

    group = zarr.open_group(str(out), mode="w", zarr_format=args["zarr_format"])
    group.attrs["chunkstream"] = {
        "layout": "per-field",
        "source": args["source"],
        "fields": args["fields"],
    }
    for f in plan:
        group.create_array(
            f.name,
            shape=(int(f.array.shape[0]), *f.step_shape),
            dtype=out_dtype or native(f.array.dtype),
            chunks=(f.t_chunk, *f.step_shape),
            compressors=compressors,
            fill_value=0,
            config={"write_empty_chunks": True},
        )


def _check_out(source: str | os.PathLike, out: str | os.PathLike) -> tuple[Path, str]:
    """``(absolute OUT, the input as recorded)``; raises :class:`ConfigError` when OUT
    lies inside the input."""
    out = Path(out).absolute()
    src_text = str(source) if is_remote(source) else str(Path(source).absolute())
    if not is_remote(source) and (out == Path(src_text) or Path(src_text) in out.parents):
        raise ConfigError(
            f"out={str(out)!r} lies inside the input {src_text!r}: choose an OUT outside it."
        )
    return out, src_text


def _field_result(
    f: FieldPlan,
    state: dict[str, Any],
    outs: list[str] | None,
    out: Path,
    target: Any,
    out_dtype: Any,
) -> FieldResult:
    """``f``'s report; raises ``CorruptChunkError`` when its read-back digests ``outs``
    disagree with the input's."""
    done, n = state["done"], f.slabs
    if done is not None:
        ins = [done[f.name][str(i)] for i in range(n)]
        checksum_in = combine(ins)
    else:
        ins, checksum_in = None, state["checksums"][f.name]
    checksum_out = combine(outs) if outs is not None else None
    if outs is not None and checksum_out != checksum_in:
        bad = next((i for i in range(n) if ins and ins[i] != outs[i]), None)
        where = (
            ""
            if bad is None
            else (
                f" slab {bad} (timesteps {bad * f.t_chunk}..{min(int(f.array.shape[0]), (bad + 1) * f.t_chunk)})"
            )
        )
        raise CorruptChunkError(
            f"verification failed: field {f.name!r}{where} in {str(out)!r} differs from the "
            "input: delete OUT and convert again (and check the disk)."
        )
    return FieldResult(
        name=f.name,
        source=f.source,
        shape=(int(f.array.shape[0]), *f.step_shape),
        chunks=(f.t_chunk, *f.step_shape),
        dtype=str(out_dtype or native(f.array.dtype)),
        slabs=n,
        checksum_in=checksum_in,
        checksum_out=checksum_out,
        max_abs_error=None
        if out_dtype is None
        else rounding_error(f.array, f.index, target, f.t_chunk, n),
    )


def _run_args(
    src_text: str,
    plan: list[FieldPlan],
    *,
    chunk_mb: float,
    codec: str,
    zarr_format: int,
    out_dtype: Any,
) -> dict[str, Any]:
    """The arguments a conversion is recorded and resumed by."""
    args = {
        "source": src_text,
        "fields": {f.name: f.source for f in plan},
        "chunk_mb": float(chunk_mb),
        "codec": codec,
        "zarr_format": zarr_format,
    }
    if out_dtype is not None:  # only when given, so earlier conversions still resume
        args["dtype"] = out_dtype.name
    return args


def _finish(out: Path, group: Any, args: dict[str, Any], results: list[FieldResult]) -> None:
    """Move the arguments and checksums of a verified conversion to the group attributes
    and remove the progress file."""
    meta = dict(group.attrs["chunkstream"])
    meta.update(args=args, checksums={r.name: r.checksum_in for r in results})
    group.attrs["chunkstream"] = meta
    (out / PROGRESS).unlink()


def convert_store(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    fields: Iterable[str] | Mapping[str, Any],
    chunk_mb: float = 32.0,
    codec: str = "blosc-zstd",
    workers: int | None = None,
    zarr_format: int = 3,
    overwrite: bool = False,
    verify: bool = True,
    progress: bool = True,
    on_slab: Callable[[int], None] | None = None,
    dtype: str | None = None,
) -> ConvertReport:
    """Convert ``source`` to one array per field under ``out`` (see module docs).

    ``fields`` are CLI strings or a mapping as for ``inspect_store``;
    ``workers`` defaults to ``min(4, threads)``, the process's thread budget
    (:func:`chunkstream._memory.node_share`: its CPUs over the job's ranks on the node). ``on_slab(n)`` is called in
    the calling thread after the n-th slab of this run is recorded (a progress
    hook; an exception from it stops the run, leaving it resumable). ``dtype``
    is the output dtype (one of :data:`OUT_DTYPES`; ``None`` keeps each field's).
    Raises ``CorruptChunkError`` when verification fails.
    """
    import zarr

    begin = time.perf_counter()
    workers = _check_workers(chunk_mb, workers)
    compressors = compressors_for(codec, zarr_format)
    out_dtype = _out_dtype(dtype)
    if is_remote(out):
        raise ConfigError.bad("out", str(out), "a local directory (progress is kept on disk)")
    plan = _plan_fields(source, fields, chunk_mb, out_dtype)
    out, src_text = _check_out(source, out)
    args = _run_args(
        src_text, plan, chunk_mb=chunk_mb, codec=codec, zarr_format=zarr_format, out_dtype=out_dtype
    )
    saved = _prepare_out(out, args, overwrite)
    state = saved or {"args": args, "done": {f.name: {} for f in plan}}
    if saved is None:
        _create_out(out, plan, args, compressors, out_dtype)
        _save_progress(out / PROGRESS, state)
    group = zarr.open_group(str(out), mode="r+")
    targets = {f.name: group[f.name] for f in plan}
    slabs, done = slabs_of(plan), state["done"]
    pending = [s for s in slabs if done is not None and str(s.i) not in done[s.name]]

    def record(slab: Slab, digest: str, n: int) -> None:
        state["done"][slab.name][str(slab.i)] = digest
        _save_progress(out / PROGRESS, state)
        bar.update(1)
        if on_slab is not None:
            on_slab(n)

    checks: dict[tuple[str, int], cf.Future] = {}
    with cf.ThreadPoolExecutor(workers, thread_name_prefix="chunkstream-convert") as pool:
        with progress_bar(
            desc="convert",
            unit="slab",
            total=len(slabs),
            initial=len(slabs) - len(pending),
            enabled=progress,
        ) as bar:
            copy = functools.partial(copy_slab, targets=targets, out_dtype=out_dtype)
            written = copy_slabs(pool, pending, copy, workers, record)
        if verify:
            # Streamed: each task reads one output slab back and keeps only its digest.
            with progress_bar(
                desc="verify", unit="slab", total=len(slabs), enabled=progress
            ) as checked:
                checks = {
                    (s.name, s.i): pool.submit(lambda s=s: digest(targets[s.name][s.t0 : s.t1]))
                    for s in slabs
                }
                for future in checks.values():  # in order: the bar moves as reads end
                    future.result()
                    checked.update(1)
    results = [
        _field_result(
            f,
            state,
            [checks[(f.name, i)].result() for i in range(f.slabs)] if verify else None,
            out,
            targets[f.name],
            out_dtype,
        )
        for f in plan
    ]
    if verify and done is not None:
        _finish(out, group, args, results)
    stored = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    decoded = sum(
        int(np.prod(r.shape, dtype=np.int64)) * np.dtype(r.dtype).itemsize for r in results
    )
    return ConvertReport(
        source=src_text,
        out=str(out),
        codec=codec,
        fields=results,
        slabs_written=written,
        slabs_skipped=len(slabs) - len(pending),
        decoded_bytes=decoded,
        stored_bytes=stored,
        verified=verify,
        seconds=time.perf_counter() - begin,
    )
