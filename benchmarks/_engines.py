"""The local decode engines, raced on the same windows into the same buffers (issue 11).

Engines, each reading the two FlyVis fields (``voltage``, ``stimulus``) of the
same random windows into the same caller-given buffers, one window at a time
(each engine parallelises inside a read, on all cores):

* ``chunkstream``: ``ZarrSource`` as shipped (the thread-pool reader of
  ``sources/_fastzarr.py`` where the array suits it, the sharded store
  included; on an array it does not suit, zarr's pipeline, and the results
  say so);
* ``zarrs``: ``ZarrSource(..., engine="zarrs")``, zarr-python with the zarrs
  Rust codec pipeline, through the general path, missing-chunk check kept
  (one existence check per chunk file per read), its own settings at their
  defaults: in a trial on percol-blosc, ``codec_pipeline.chunk_concurrent_minimum``
  1 or 2, ``threading.max_workers`` 2 or 4 and ``codec_pipeline.direct_io``
  gave 0.70 to 1.18 GB/s against 1.15 with the defaults;
* ``zarrs-unchecked``: the same with ``check_missing=False``: the difference
  is what keeping the missing-chunk detection costs zarrs;
* ``tensorstore``: ``TensorStoreSource`` with ``data_copy_concurrency`` at
  the core count, ``file_io_concurrency`` at least 4 and the chunk cache off.
  A cache the size of the chunks one window touches (so that a window's
  fields could share each decoded chunk) measured slower in a trial on
  percol-blosc (1.74 against 2.03 GB/s) and no faster on interleaved-blosc (0.24): it only
  adds copies. A cache holding much of this 2 GB store would measure the
  cache, not the decoder: a real recording (53 GB) is read at random windows;
* ``zarr``: ``ZarrSource(..., engine="zarr")``, zarr-python's default pipeline
  (the floor).

Stores: the benchmark's compressed per-column store, its compressed
interleaved store, the uncompressed per-column store, and a zarr v3 sharded
copy of the compressed per-column data (inner chunks ``(2000, N, 1)``, shards
of 4 time chunks x 4 columns), written once under ``_data/``.

Figures per engine and store: GB/s of decoded window bytes delivered and CPU
seconds per GB (``getrusage(RUSAGE_SELF)``: every thread of the process,
Rust and C++ pools included), each min/median/max over repeats; a repeat
reads ``windows`` windows, other windows in each repeat, the same for every
engine. Engines take turns within each repeat (in a rotating order), so a
change in machine load falls on all of them alike.
"""

from __future__ import annotations

import json
import os
import resource
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

import chunkstream as cs

from ._measure import cores, spread, window_starts
from ._stores import Geometry, StoreSpec, make_store, store_specs, warm

__all__ = ["ENGINES", "engine_decision", "engine_stores", "make_sharded", "run_engines"]

ENGINES = ("chunkstream", "zarrs", "zarrs-unchecked", "tensorstore", "zarr")
STORES = ("percol-blosc", "interleaved-blosc", "percol-raw", "sharded-blosc")
#: How far behind ours a library may be and still take over (the issue's rule).
TOLERANCE = 0.05
_SHARD_STAMP = ".chunkstream-sharded.json"


def engine_stores(geo: Geometry, data_dir: Path) -> list[StoreSpec]:
    """The four stores of the race (the sharded one derived from ``percol-blosc``)."""
    specs = {s.name: s for s in store_specs(geo, data_dir)}
    base = specs["percol-blosc"]
    tag = f"sharded-blosc-zstd-T{geo.timesteps}-N{geo.neurons}-S{geo.stim_dims}"
    sharded = replace(base, name="sharded-blosc", layout="sharded", path=data_dir / tag)
    return [specs["percol-blosc"], specs["interleaved-blosc"], specs["percol-raw"], sharded]


def _shards(chunks: tuple[int, int, int]) -> tuple[int, int, int]:
    return (4 * chunks[0], chunks[1], 4)


def make_sharded(spec: StoreSpec, base: StoreSpec, geo: Geometry) -> dict:
    """Write (or reuse) a sharded zarr v3 copy of ``base``'s timeseries at ``spec``."""
    import zarr

    from chunkstream.tools._codecs import compressors_for

    shards = _shards(spec.chunks)
    args = {"from": str(base.path), "chunks": list(spec.chunks), "shards": list(shards)}
    stamp = spec.path / _SHARD_STAMP
    if not (stamp.is_file() and json.loads(stamp.read_text()) == args):
        src = zarr.open_array(base.array_path, mode="r")
        dst = zarr.create_array(
            spec.array_path, shape=src.shape, dtype=src.dtype, chunks=spec.chunks,
            shards=shards, compressors=compressors_for("blosc-zstd", 3), overwrite=True,
            config={"write_empty_chunks": True},
        )  # fmt: skip
        for t0 in range(0, src.shape[0], shards[0]):  # one shard row at a time: bounded memory
            dst[t0 : t0 + shards[0]] = src[t0 : t0 + shards[0]]
        stamp.write_text(json.dumps(args))
    files = [p for p in spec.array_path.rglob("*") if p.is_file() and p.name != "zarr.json"]
    return {
        "decoded_bytes": int(geo.nbytes),
        "disk_bytes": int(sum(p.stat().st_size for p in files)),
        "chunks": spec.chunks,
        "shards": shards,
    }


def _fields(geo: Geometry) -> dict:
    return {"voltage": (slice(None), 0), "stimulus": (slice(0, geo.stim_dims), 1)}


def _open(engine: str, spec: StoreSpec, geo: Geometry):
    """The source ``engine`` reads ``spec`` with."""
    with warnings.catch_warnings():
        # interleaved chunks hold all four columns: the amplification is the point there
        warnings.simplefilter("ignore", cs._errors.ReadAmplificationWarning)
        if engine == "tensorstore":
            import tensorstore as ts

            n = cores()
            context = ts.Context({
                "data_copy_concurrency": {"limit": n},
                "file_io_concurrency": {"limit": max(n, 4)},
                "cache_pool": {"total_bytes_limit": 0},
            })  # fmt: skip
            return cs.TensorStoreSource(spec.array_path, _fields(geo), context=context)
        if engine == "chunkstream":
            return cs.ZarrSource(spec.array_path, _fields(geo))
        if engine == "zarrs-unchecked":
            return cs.ZarrSource(spec.array_path, _fields(geo), engine="zarrs", check_missing=False)
        return cs.ZarrSource(spec.array_path, _fields(geo), engine=engine)


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)  # all threads of the process
    return use.ru_utime + use.ru_stime


def _race(sources: dict, windows: int, geo: Geometry, repeats: int, out: dict) -> dict:
    """Per engine, GB/s and CPU s/GB of each repeat of ``windows`` windows."""
    gb = windows * geo.window_nbytes / 1e9
    figures = {e: {"gbps": [], "cpu_s_per_gb": []} for e in sources}
    order = list(sources)
    for r in range(repeats):
        starts = window_starts(geo, windows, seed=100 + r)
        for engine in order[r % len(order) :] + order[: r % len(order)]:
            src = sources[engine]
            cpu, wall = _cpu_s(), time.perf_counter()
            for s in starts:
                src.read_into(s, s + geo.chunk_size, out)
            wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
            figures[engine]["gbps"].append(gb / wall)
            figures[engine]["cpu_s_per_gb"].append(cpu / gb)
    return figures


def _store_race(spec: StoreSpec, geo: Geometry, windows: int, repeats: int) -> dict:
    out = {
        "voltage": np.zeros((geo.chunk_size, geo.neurons), np.float32),  # zeros: pages faulted
        "stimulus": np.zeros((geo.chunk_size, geo.stim_dims), np.float32),
    }
    sources = {e: _open(e, spec, geo) for e in ENGINES}
    try:
        res: dict = {"fast_path": sources["chunkstream"].uses_fast_path}
        ref = {n: np.empty_like(a) for n, a in out.items()}
        (check,) = window_starts(geo, 1, seed=11)
        sources["chunkstream"].read_into(check, check + geo.chunk_size, ref)
        matches = {}
        for engine, src in sources.items():  # warm (threads, code paths) and check the data
            src.read_into(check, check + geo.chunk_size, out)
            matches[engine] = all(np.array_equal(ref[n], out[n]) for n in out)
        res["matches"] = matches
        figures = _race(sources, windows, geo, repeats, out)
    finally:
        for src in sources.values():
            src.close()
    res["engines"] = {
        e: {k: spread(v) | {"values": v} for k, v in f.items()} for e, f in figures.items()
    }
    return res


def run_engines(geo: Geometry, *, windows: int, repeats: int, data_dir: Path, log=None) -> dict:
    """The whole race: every store, every engine; a JSON-ready dict."""
    log = log or (lambda msg: None)
    specs = engine_stores(geo, data_dir)
    base = specs[0]
    res: dict = {"windows": windows, "repeats": repeats, "window_nbytes": geo.window_nbytes,
                 "tolerance": TOLERANCE, "stores": {}}  # fmt: skip
    for spec in specs:
        log(f"engines: store {spec.name}: writing or reusing {spec.path.name}")
        if spec.name == "sharded-blosc":
            make_store(base, geo)
            info = make_sharded(spec, base, geo)
        else:
            info = make_store(spec, geo)
        res["stores"][spec.name] = {"store": info | {"codec": spec.codec}}
    for spec in specs:
        r = res["stores"][spec.name]
        r["warm_s"] = _warm_array(spec)
        r["load_1min"] = os.getloadavg()[0]
        log(f"engines: {spec.name}: {', '.join(ENGINES)}")
        r.update(_store_race(spec, geo, windows, repeats))
    res["decision"] = engine_decision(res)
    return res


def _warm_array(spec: StoreSpec) -> float:
    if spec.name != "sharded-blosc":
        return warm(spec)
    begin = time.perf_counter()
    for p in spec.array_path.rglob("*"):
        if p.is_file():
            p.read_bytes()
    return time.perf_counter() - begin


def engine_decision(res: dict) -> dict:
    """What the issue's rule says for these figures.

    A library takes over where its median GB/s is within ``TOLERANCE`` of ours,
    or faster, on every store; ``ratios`` holds each library's median over ours
    per store (on a store our reader does not suit, "ours" is zarr's pipeline).
    """
    ratios: dict = {}
    for engine in ("zarrs", "tensorstore", "zarr"):
        ratios[engine] = {
            name: r["engines"][engine]["gbps"]["median"] / r["engines"]["chunkstream"]["gbps"]["median"]
            for name, r in res["stores"].items()
        }  # fmt: skip
    adopt = [e for e, per in ratios.items() if all(v >= 1 - TOLERANCE for v in per.values())]
    return {"ratios": ratios, "qualifies": adopt}
