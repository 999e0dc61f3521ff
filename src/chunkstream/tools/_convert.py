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
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._errors import ConfigError, CorruptChunkError
from ..sources import check_lengths
from ._codecs import compressors_for
from ._fieldspec import format_index, parse_fields, selected_shape
from ._stores import is_remote, open_arrays, resolve_field

__all__ = ["OUT_DTYPES", "ConvertReport", "FieldResult", "convert_store", "flyvis_fields"]

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
            "column", column, "a dynamic column id (3, 4, 7 or 8)",
            "Static columns (0-2, 5, 6) are in metadata.zarr: read it directly.",
        )  # fmt: skip
    if name not in _FLYVIS_COLUMNS:
        raise ConfigError.bad("column", column, f"one of {sorted(_FLYVIS_COLUMNS)} or 3, 4, 7, 8")
    if not isinstance(stim_dims, int) or stim_dims < 1:
        raise ConfigError.bad("stim_dims", stim_dims, "an int >= 1")
    stim = f"stimulus=timeseries[0:{stim_dims},1]"
    if name == "stimulus":
        return [stim]
    return [f"{name}=timeseries[:,{_FLYVIS_COLUMNS[name]}]", stim]


# Output dtypes ``dtype=`` accepts: storage precisions a loader streams as they are.
OUT_DTYPES = ("float16", "float32", "float64")
_ERROR_SAMPLE_SLABS = 4  # slabs per field compared for the rounding error, spread over time


def _rounding_error(array: Any, index: tuple, target: Any, t_chunk: int, slabs: int) -> float:
    """The largest ``|IN - OUT|`` over up to ``_ERROR_SAMPLE_SLABS`` slabs spread over time."""
    picks = sorted({round(i * (slabs - 1) / max(1, _ERROR_SAMPLE_SLABS - 1))
                    for i in range(min(slabs, _ERROR_SAMPLE_SLABS))})  # fmt: skip
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


def _digest(data: np.ndarray) -> str:
    """The digest of ``data``'s values: its bytes in native byte order, so a big-endian
    input and its native-order output agree."""
    native = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("="))
    return hashlib.blake2b(native.data, digest_size=16).hexdigest()


def _native(dtype: Any) -> np.dtype:
    """``dtype`` in native byte order: the output is written so, whatever IN's order."""
    return np.dtype(dtype).newbyteorder("=")


def _combine(digests: list[str]) -> str:
    return hashlib.blake2b("".join(digests).encode(), digest_size=16).hexdigest()


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


class _FieldPlan(NamedTuple):
    """One output field: its name, its source text, the input array and selection,
    the shape of one output timestep, and the output time chunk."""

    name: str
    source: str
    array: Any
    index: tuple
    step_shape: tuple[int, ...]
    t_chunk: int


def _check_workers(chunk_mb: float, workers: int | None) -> int:
    """The worker count (``workers`` or its default) once ``chunk_mb`` and ``workers`` are
    valid; raises :class:`ConfigError` naming a bad one."""
    if not chunk_mb > 0:
        raise ConfigError.bad("chunk_mb", chunk_mb, "a positive number of MiB, e.g. 32")
    workers = min(4, os.cpu_count() or 1) if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError.bad("workers", workers, "an int >= 1")
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
            "dtype", dtype, f"None or one of {', '.join(OUT_DTYPES)}",
            "Pass --dtype float16 for a half-precision copy.",
        )  # fmt: skip
    return out_dtype


def _plan_fields(
    source: str | os.PathLike, fields: Iterable[str] | Mapping[str, Any], chunk_mb: float
) -> list[_FieldPlan]:
    """Each requested field resolved in ``source``, with a time chunk of ~``chunk_mb`` MiB.

    Raises :class:`ConfigError` when no field is named or their time lengths differ.
    """
    arrays = open_arrays(source)
    requests = parse_fields(fields)
    if not requests:
        raise ConfigError.bad("fields", fields, "at least one NAME=INDEX", "Pass --fields.")
    resolved = [resolve_field(req, arrays) for req in requests]
    check_lengths({r.name: int(a.shape[0]) for r, (_, a, _) in zip(requests, resolved, strict=True)},
                  str(source))  # fmt: skip
    plan = []
    for req, (name, array, index) in zip(requests, resolved, strict=True):
        step_shape = selected_shape(index, tuple(array.shape[1:]))
        step_bytes = max(1, int(np.prod(step_shape, dtype=np.int64)) * array.dtype.itemsize)
        total = int(array.shape[0])
        t_chunk = int(min(max(1, total), max(1, chunk_mb * 2**20 // step_bytes)))
        plan.append(_FieldPlan(req.name, f"{name}[{format_index(index)}]", array, index,
                               step_shape, t_chunk))  # fmt: skip
    return plan


def _create_out(
    out: Path, plan: list[_FieldPlan], args: dict[str, Any], compressors: Any, out_dtype: Any
) -> None:
    """Create the output group, one empty array per field, and the progress file."""
    import zarr

    group = zarr.open_group(str(out), mode="w", zarr_format=args["zarr_format"])
    group.attrs["chunkstream"] = {"layout": "per-field", "source": args["source"],
                                  "fields": args["fields"]}  # fmt: skip
    for f in plan:
        group.create_array(
            f.name, shape=(int(f.array.shape[0]), *f.step_shape),
            dtype=out_dtype or _native(f.array.dtype), chunks=(f.t_chunk, *f.step_shape),
            compressors=compressors, fill_value=0,
            config={"write_empty_chunks": True},
        )  # fmt: skip


def _copy_slab(slab: tuple, targets: dict[str, Any], out_dtype: Any) -> str:
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
                "dtype", out_dtype.name,
                f"a dtype that holds field {name!r}: timesteps [{t0}, {t1}) reach "
                f"{np.nanmax(np.abs(data)):.6g}, beyond {out_dtype.name}'s "
                f"{float(np.finfo(out_dtype).max):.6g}",
                "Convert to float32, or rescale the data first.",
            ) from None
    targets[name][t0:t1] = data
    return _digest(data)


def _copy_pending(
    pool: cf.ThreadPoolExecutor, pending: list[tuple], copy: Callable[[tuple], str],
    state: dict[str, Any], progress_path: Path, bar: Any, on_slab: Callable[[int], None] | None,
    workers: int,
) -> int:  # fmt: skip
    """Copy ``pending`` slabs, at most ``2 * workers`` in flight, recording each finished
    one in ``state`` and the progress file; returns how many were written."""
    written = 0
    queue = iter(pending)
    running: dict[cf.Future, tuple] = {}
    try:
        while True:
            while len(running) < 2 * workers and (slab := next(queue, None)) is not None:
                running[pool.submit(copy, slab)] = slab
            if not running:
                break
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                name, i, *_ = running.pop(future)
                state["done"][name][str(i)] = future.result()
                _save_progress(progress_path, state)
                written += 1
                bar.update(1)
                if on_slab is not None:
                    on_slab(written)
    finally:
        for future in running:
            future.cancel()
    return written


def _field_result(
    f: _FieldPlan, state: dict[str, Any], outs: list[str] | None, out: Path, target: Any,
    out_dtype: Any,
) -> FieldResult:  # fmt: skip
    """``f``'s report; raises ``CorruptChunkError`` when its read-back digests ``outs``
    disagree with the input's."""
    done = state["done"]
    n = -(-int(f.array.shape[0]) // f.t_chunk)
    if done is not None:
        ins = [done[f.name][str(i)] for i in range(n)]
        checksum_in = _combine(ins)
    else:
        ins, checksum_in = None, state["checksums"][f.name]
    checksum_out = _combine(outs) if outs is not None else None
    if outs is not None and checksum_out != checksum_in:
        bad = next((i for i in range(n) if ins and ins[i] != outs[i]), None)
        where = "" if bad is None else (
            f" slab {bad} (timesteps {bad * f.t_chunk}..{min(int(f.array.shape[0]), (bad + 1) * f.t_chunk)})"
        )  # fmt: skip
        raise CorruptChunkError(
            f"verification failed: field {f.name!r}{where} in {str(out)!r} differs from the "
            "input: delete OUT and convert again (and check the disk)."
        )
    return FieldResult(
        name=f.name, source=f.source, shape=(int(f.array.shape[0]), *f.step_shape),
        chunks=(f.t_chunk, *f.step_shape), dtype=str(out_dtype or _native(f.array.dtype)),
        slabs=n, checksum_in=checksum_in, checksum_out=checksum_out,
        max_abs_error=None if out_dtype is None else _rounding_error(
            f.array, f.index, target, f.t_chunk, n),
    )  # fmt: skip


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
    ``workers`` defaults to ``min(4, cpu_count)``. ``on_slab(n)`` is called in
    the calling thread after the n-th slab of this run is recorded (a progress
    hook; an exception from it stops the run, leaving it resumable). ``dtype``
    is the output dtype (one of :data:`OUT_DTYPES`; ``None`` keeps each field's).
    Raises ``CorruptChunkError`` when verification fails.
    """
    import zarr
    from tqdm.auto import tqdm

    begin = time.perf_counter()
    workers = _check_workers(chunk_mb, workers)
    compressors = compressors_for(codec, zarr_format)
    out_dtype = _out_dtype(dtype)
    if is_remote(out):
        raise ConfigError.bad("out", str(out), "a local directory (progress is kept on disk)")
    plan = _plan_fields(source, fields, chunk_mb)
    out = Path(out).absolute()
    src_text = str(source) if is_remote(source) else str(Path(source).absolute())
    if not is_remote(source) and (out == Path(src_text) or Path(src_text) in out.parents):
        raise ConfigError(
            f"out={str(out)!r} lies inside the input {src_text!r}: choose an OUT outside it."
        )
    args = {
        "source": src_text, "fields": {f.name: f.source for f in plan}, "chunk_mb": float(chunk_mb),
        "codec": codec, "zarr_format": zarr_format,
    }  # fmt: skip
    if out_dtype is not None:  # only when given, so earlier conversions still resume
        args["dtype"] = out_dtype.name
    saved = _prepare_out(out, args, overwrite)
    state = saved or {"args": args, "done": {f.name: {} for f in plan}}
    if saved is None:
        _create_out(out, plan, args, compressors, out_dtype)
        _save_progress(out / PROGRESS, state)
    group = zarr.open_group(str(out), mode="r+")
    targets = {f.name: group[f.name] for f in plan}
    slabs = [
        (f.name, i, i * f.t_chunk, min(int(f.array.shape[0]), (i + 1) * f.t_chunk), f.array,
         f.index)
        for f in plan
        for i in range(-(-int(f.array.shape[0]) // f.t_chunk))
    ]  # fmt: skip
    done = state["done"]
    pending = [s for s in slabs if done is not None and str(s[1]) not in done[s[0]]]
    copy = functools.partial(_copy_slab, targets=targets, out_dtype=out_dtype)
    with (
        cf.ThreadPoolExecutor(workers, thread_name_prefix="chunkstream-convert") as pool,
        tqdm(total=len(slabs), initial=len(slabs) - len(pending), unit="slab", desc="convert",
             disable=None if progress else True) as bar,
    ):  # fmt: skip
        written = _copy_pending(pool, pending, copy, state, out / PROGRESS, bar, on_slab, workers)
        checks: dict[tuple[str, int], cf.Future] = {}
        if verify:
            # Streamed: each task reads one output slab back and keeps only its digest.
            for name, i, t0, t1, *_ in slabs:
                checks[(name, i)] = pool.submit(lambda n=name, a=t0, b=t1: _digest(targets[n][a:b]))
    results = []
    for f in plan:
        n = -(-int(f.array.shape[0]) // f.t_chunk)
        outs = [checks[(f.name, i)].result() for i in range(n)] if verify else None
        results.append(_field_result(f, state, outs, out, targets[f.name], out_dtype))
    ok = verify
    if ok and done is not None:
        meta = dict(group.attrs["chunkstream"])
        meta.update(args=args, checksums={r.name: r.checksum_in for r in results})
        group.attrs["chunkstream"] = meta
        (out / PROGRESS).unlink()
    stored = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    decoded = sum(
        int(np.prod(r.shape, dtype=np.int64)) * np.dtype(r.dtype).itemsize for r in results
    )
    return ConvertReport(
        source=src_text, out=str(out), codec=codec, fields=results, slabs_written=written,
        slabs_skipped=len(slabs) - len(pending), decoded_bytes=decoded, stored_bytes=stored,
        verified=ok, seconds=time.perf_counter() - begin,
    )  # fmt: skip
