"""The benchmark runner: every figure of BENCHMARKS.md, measured in one run.

    python -m benchmarks.run --quick          # a few minutes
    python -m benchmarks.run                  # the full run (<= 30 min on 2 cores)
    python -m benchmarks.run --device cuda    # the GPU mode (benchmarks/gpu.sh)
    python -m benchmarks.run --only engines   # only the decode-engine race (results/engines.json)
    python -m benchmarks.run --only remote    # only the remote-store race (results/remote.json)
    python -m benchmarks.run --only dtype     # only float16 vs float32 storage (results/dtype.json)
    python -m benchmarks.run --only quality   # only the quality race (results/quality.json)
    python -m benchmarks.run --only quality-scale  # the quality race at scale: the buffer's
                                                   # share of the split (results/quality-scale.json)
    python -m benchmarks.run --only first-epoch  # a new loader's first epoch vs its steady state
    python -m benchmarks.run --only resident  # resident mode vs streaming epoch times
    python -m benchmarks.run --only cache     # the node-local cache against a throttled HTTP
                                              # server and local disk (results/cache.json)

Writes ``benchmarks/results/<mode>.json`` and rewrites BENCHMARKS.md from every
results file present. Stores are written once by ``synth`` under
``benchmarks/_data/`` (git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import _measure as m
from . import _overlap
from ._engines import run_engines
from ._first_epoch import first_epoch
from ._quality import QualityReps, quality_targets, run_quality
from ._quality_scale import (
    ScaleReps,
    first_scale_results,
    plot_quality_scale,
    quality_scale_targets,
    run_quality_scale,
)
from ._remote import RemoteGeometry, run_remote
from ._report import RESULTS_DIR, first_epoch_targets, targets, write_markdown
from ._stores import DATA_DIR, Geometry, make_store, store_specs, warm

__all__ = ["Reps", "machine", "main", "run_cpu"]


@dataclass(frozen=True, kw_only=True)
class Reps:
    """How much of each measurement a mode runs."""

    ceiling_windows: int
    chunks: int  # per delivered-rate run
    runs: int
    job_chunks: int
    dl_batches: int
    overlap_chunks: int
    abandon: int
    overlap_repeats: int = 3  # runs per consumer speed; the median run is kept (reads drift)
    first_epoch_chunks: int = 24  # chunks timed per epoch of a new loader (and the next one)
    first_epoch_runs: int = 3
    rss_epochs: int = 200
    engine_windows: int = 6  # windows per repeat of the decode-engine race
    engine_repeats: int = 5
    remote: str = "full"  # the remote-store race's RemoteGeometry: "full", "quick" or "tiny"
    quality: str = "full"  # the quality race's QualityReps: "full", "quick" or "smoke"
    dl_workers: tuple[int, ...] = (0, 2)
    job_stores: tuple[str, ...] = (
        "percol-blosc",
        "percol-raw",
        "interleaved-blosc",
        "interleaved-raw",
    )

    @staticmethod
    def quick() -> Reps:
        return Reps(ceiling_windows=5, chunks=6, runs=3, job_chunks=2, dl_batches=2,
                    overlap_chunks=24, abandon=10, job_stores=("percol-blosc", "percol-raw"),
                    engine_windows=4, engine_repeats=3, remote="quick", quality="quick",
                    first_epoch_chunks=12, first_epoch_runs=7)  # fmt: skip

    @staticmethod
    def full() -> Reps:
        return Reps(ceiling_windows=15, chunks=10, runs=5, job_chunks=4, dl_batches=5,
                    overlap_chunks=32, abandon=30)  # fmt: skip

    @staticmethod
    def smoke() -> Reps:
        return Reps(ceiling_windows=2, chunks=3, runs=1, job_chunks=1, dl_batches=1,
                    overlap_chunks=3, abandon=2, rss_epochs=22, dl_workers=(0,),
                    job_stores=("percol-blosc",), engine_windows=2, engine_repeats=1,
                    remote="tiny", quality="smoke", first_epoch_chunks=3,
                    first_epoch_runs=1, overlap_repeats=1)  # fmt: skip


def machine() -> dict:
    import numcodecs
    import numpy
    import psutil
    import torch
    import zarr

    import chunkstream

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import tensorstore

        ts_version = getattr(tensorstore, "__version__", None) or _dist_version("tensorstore")
    except ImportError:
        ts_version = None
    disk = subprocess.run(["df", "-h", str(DATA_DIR.parent)], capture_output=True, text=True).stdout
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=DATA_DIR.parent).stdout.strip()  # fmt: skip
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": m.cores(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "disk": disk.strip().splitlines()[-1] if disk else "",
        "load_1min_before": os.getloadavg()[0],
        "python": platform.python_version(),
        "versions": {
            "chunkstream": chunkstream.__version__,
            "torch": torch.__version__,
            "zarr": zarr.__version__,
            "numcodecs": numcodecs.__version__,
            "numpy": numpy.__version__,
            "tensorstore": ts_version,
            "zarrs": _dist_version("zarrs"),
        },
        "commit": commit,
    }


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_cpu(geo: Geometry, reps: Reps, *, data_dir: Path = DATA_DIR) -> dict:
    """Every CPU measurement on the four stores; returns the results dict."""
    cores = m.cores()
    res: dict = {"geometry": asdict(geo), "reps": asdict(reps), "stores": {}}
    specs = store_specs(geo, data_dir)
    for spec in specs:
        _log(f"store {spec.name}: writing or reusing {spec.path.name}")
        res["stores"][spec.name] = {"store": make_store(spec, geo) | {"codec": spec.codec}}
    for spec in specs:
        r = res["stores"][spec.name]
        r["warm_s"] = warm(spec)
        _log(f"{spec.name}: ceilings")
        r["ceilings"] = m.ceilings(spec, geo, reps.ceiling_windows, cores)
        _log(f"{spec.name}: chunkstream, workers 1..{cores}")
        r["chunkstream"] = m.chunkstream_rates(
            spec, geo, workers=list(range(1, cores + 1)), chunks=reps.chunks, runs=reps.runs
        )
        _log(f"{spec.name}: the original approach")
        r["original"] = m.original_rates(spec, geo, chunks=reps.chunks, runs=reps.runs)
        if spec.name in reps.job_stores:
            _log(f"{spec.name}: the whole job")
            r["whole_job"] = m.whole_job(spec, geo, chunks=reps.job_chunks, runs=reps.runs)
            _log(f"{spec.name}: torch DataLoader peers")
            r["dataloader"] = m.dataloader_rates(
                spec, geo, batches=reps.dl_batches, workers=reps.dl_workers
            )
    spec = next(s for s in specs if s.name == "percol-blosc")
    warm(spec)
    _log("overlap, stall, abandon, RSS (percol-blosc)")
    res["overlap"] = run_overlap(spec, geo, reps)
    res["first_epoch"] = run_first_epoch(geo, reps, data_dir)
    res["engines"] = engines(geo, reps, data_dir)
    res["remote"] = remote(reps, data_dir)
    res["quality"] = quality(reps, data_dir)
    return res


def quality(reps: Reps, data_dir: Path = DATA_DIR) -> dict:
    """The quality race (benchmarks/_quality.py) at ``reps``' size."""
    _log(f"quality race: contiguous vs pieced chunks vs i.i.d. ({reps.quality})")
    res = run_quality(getattr(QualityReps, reps.quality)(), data_dir=data_dir, log=_log)
    res["targets"] = quality_targets(res)
    return res


def quality_scale(
    reps: ScaleReps, data_dir: Path = DATA_DIR, arms: tuple[str, ...] | None = None
) -> dict:
    """The quality race at scale (benchmarks/_quality_scale.py); the results so far are
    written to ``_data/quality-scale.partial.json`` after every seed."""
    _log(f"quality at scale: the buffer's share of the split vs i.i.d. ({reps})")
    partial = data_dir / "quality-scale.partial.json"

    def progress(res: dict) -> None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(res, indent=1, default=str) + "\n")

    res = run_quality_scale(reps, data_dir=data_dir, log=_log, progress=progress, arms=arms)
    res["targets"] = quality_scale_targets(res)
    return res


def run_first_epoch(geo: Geometry, reps: Reps, data_dir: Path = DATA_DIR) -> dict:
    """A new loader's first epoch vs its steady state, on the compressed per-column store."""
    spec = next(s for s in store_specs(geo, data_dir) if s.name == "percol-blosc")
    make_store(spec, geo)
    warm(spec)
    _log("first epoch vs steady state, time to the first chunk (percol-blosc)")
    return first_epoch(spec, geo, chunks=reps.first_epoch_chunks, runs=reps.first_epoch_runs)


def remote(reps: Reps, data_dir: Path = DATA_DIR) -> dict:
    """The remote-store race (benchmarks/_remote.py) at ``reps``' size."""
    _log(f"remote stores: obstore vs fsspec + RetryingStore ({reps.remote} geometry)")
    return run_remote(getattr(RemoteGeometry, reps.remote)(), data_dir)


def engines(geo: Geometry, reps: Reps, data_dir: Path = DATA_DIR) -> dict:
    """The decode-engine race (benchmarks/_engines.py) at ``reps``' size."""
    return run_engines(geo, windows=reps.engine_windows, repeats=reps.engine_repeats,
                       data_dir=data_dir, log=_log)  # fmt: skip


def run_overlap(spec, geo: Geometry, reps: Reps) -> dict:
    import chunkstream as cs

    out: dict = {}
    src = m.open_source(spec, geo)
    with cs.ChunkLoader(src, geo.chunk_size, device="cpu", sampling="random", seed=5) as loader:
        _overlap.read_interval(loader, 3)  # warm
        # The read interval just before and just after each run, averaged: on a shared
        # machine it drifts, and a bound from one side only moves with the drift.
        before = _overlap.read_interval(loader, reps.overlap_chunks)
        out["read"] = before
        for factor in (1.0, 0.5, 1.25):
            runs = []
            for _ in range(reps.overlap_repeats):
                read_s = before["interval_s"]
                run = _overlap.epoch_with_sleep(loader, reps.overlap_chunks, factor * read_s)
                after = _overlap.read_interval(loader, reps.overlap_chunks)
                runs.append(_overlap.against_bound(run, before, after))
                before = after
            runs.sort(key=lambda r: r["ratio"])
            median = runs[len(runs) // 2]
            out[f"train_{factor}x"] = median | {"ratios": [r["ratio"] for r in runs]}
        out["abandon"] = _overlap.abandon_cost(loader, reps.abandon)
        out["rss"] = _overlap.rss_over_epochs(loader, reps.rss_epochs)
    src.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few minutes instead of the full run")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: the GPU mode")
    p.add_argument(
        "--tiny", action="store_true", help="a few-MB store (a smoke run, figures meaningless)"
    )
    p.add_argument("--no-markdown", action="store_true", help="do not rewrite BENCHMARKS.md")
    p.add_argument(
        "--only",
        choices=("engines", "remote", "dtype", "quality", "quality-scale", "first-epoch",
                 "resident", "cache"),
        help="engines: only the decode-engine race (CPU); remote: only the remote-store race; "
             "dtype: only float16 vs float32 storage; quality: only the quality race "
             "(batch correlation); quality-scale: the quality race at scale (the buffer's share of "
             "the split); first-epoch: only a new loader's first epoch against its "
             "steady state; resident: resident mode against streaming; cache: the node-local "
             "cache (epoch 1 and 2) against no cache and local disk over a throttled server",
    )  # fmt: skip
    p.add_argument(
        "--preset", choices=("full", "shared", "quick", "smoke"), default=None,
        help="quality-scale only: the race's size (benchmarks/_quality_scale.ScaleReps; "
             "default: full, quick with --quick, smoke with --tiny); shared: the full split "
             "with 2 epochs and a smaller model, what 2 shared cores finish in an hour",
    )  # fmt: skip
    p.add_argument(
        "--arms", nargs="+", default=None,
        help="quality-scale only: run only these arms (and iid), e.g. --arms defaults "
             "'defaults, 25%% cap'",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.arms is not None and args.only != "quality-scale":
        p.error("--arms: only with --only quality-scale")
    if args.preset is not None and args.only != "quality-scale":
        p.error(f"--preset {args.preset}: only with --only quality-scale")
    mode = "cuda" if args.device == "cuda" else ("quick" if args.quick else "full")
    if args.only is not None:  # one race alone: its own results file, quick or not
        mode = f"{args.only}-quick" if args.quick else args.only
    if args.preset not in (None, "full"):
        mode = f"{args.only}-{args.preset}"
    geo = Geometry.tiny() if args.tiny else Geometry.full()
    info = machine()
    begin = time.perf_counter()
    if args.device == "cuda":
        from ._gpu import run_gpu

        results = run_gpu(geo, quick=args.quick)
    elif args.only == "engines":
        reps = Reps.smoke() if args.tiny else (Reps.quick() if args.quick else Reps.full())
        results = {"geometry": asdict(geo), "engines": engines(geo, reps)}
    elif args.only == "remote":
        reps = Reps.smoke() if args.tiny else (Reps.quick() if args.quick else Reps.full())
        results = {"remote": remote(reps)}
    elif args.only == "dtype":
        from ._dtype import run_dtype

        results = {"dtype": run_dtype(quick=args.quick or args.tiny)}
    elif args.only == "quality":
        reps = Reps.smoke() if args.tiny else (Reps.quick() if args.quick else Reps.full())
        results = {"quality": quality(reps)}
    elif args.only == "quality-scale":
        preset = args.preset or ("smoke" if args.tiny else ("quick" if args.quick else "full"))
        scale = getattr(ScaleReps, preset)()
        arms = None if args.arms is None else tuple(args.arms)
        results = {"quality_scale": quality_scale(scale, arms=arms)}
    elif args.only == "resident":
        from ._resident import run_resident

        results = {"resident": run_resident(geo, quick=args.quick or args.tiny)}
    elif args.only == "cache":
        from ._cache import CacheGeometry, run_cache

        cache_geo = CacheGeometry.tiny() if args.tiny else CacheGeometry.full()
        if args.quick and not args.tiny:
            cache_geo = replace(cache_geo, runs=1)
        _log(f"node-local cache: {cache_geo}")
        results = {"cache": run_cache(cache_geo, DATA_DIR)}
    elif args.only == "first-epoch":
        reps = Reps.smoke() if args.tiny else (Reps.quick() if args.quick else Reps.full())
        results = {"geometry": asdict(geo), "first_epoch": run_first_epoch(geo, reps)}
    else:
        reps = Reps.smoke() if args.tiny else (Reps.quick() if args.quick else Reps.full())
        results = run_cpu(geo, reps)
    results["machine"] = info
    results["mode"] = mode
    results["command"] = "python -m benchmarks.run " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    results["seconds"] = time.perf_counter() - begin
    results["load_1min_after"] = os.getloadavg()[0]
    if args.only == "quality":
        results["targets"] = results["quality"]["targets"]
    elif args.only == "quality-scale":
        results["targets"] = results["quality_scale"]["targets"]
    elif args.only == "first-epoch":
        results["targets"] = first_epoch_targets(results["first_epoch"])
    elif args.only == "cache":
        results["targets"] = results["cache"]["targets"]
    else:
        quality_met = results.get("quality", {}).get("targets", [])
        results["targets"] = [] if args.only else targets(results) + quality_met
    name = f"{mode}-tiny" if args.tiny else mode
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    _log(f"wrote {path}")
    if args.only == "quality-scale" and not args.tiny:  # the run BENCHMARKS.md shows
        _log(f"wrote {plot_quality_scale(first_scale_results(RESULTS_DIR)['quality_scale'])}")
    for t in results["targets"]:
        _log(f"{'MET ' if t['met'] else 'MISS'} {t['what']}: {t['figure']} (target {t['target']})")
    if not args.no_markdown and not args.tiny:
        write_markdown()
        _log("updated BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
