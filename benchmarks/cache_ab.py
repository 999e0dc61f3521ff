"""Warm reads through the node-local cache on this tree and on an older commit, in one run.

    python -m benchmarks.cache_ab --against main               # 6 rounds
    python -m benchmarks.cache_ab --against main --rounds 4 --steps 16384

Issue 50 binds every cache entry to its key (a longer trailer, checked on each hit) and
checks each entry file's owner as it is read; a warm read must not get slower for it.
A zstd float32 zarr array (format 3, chunks of 1,024 x 256: 1 MiB each) is served by a
local HTTP server (``benchmarks._cache.throttled_server``, no throttle: the warm epochs
make no chunk request). Each tree gets its own cache folder, filled once by an untimed
epoch (the two formats differ). Then round ``r`` runs both trees, the order alternating,
each in a fresh process with ``chunkstream`` imported from that tree's ``src/`` (the
other commit's exported with ``git archive``): ``--epochs`` warm ``ChunkLoader`` epochs
(CPU, 2 readers, sequential windows of 8 chunks), its figure the best epoch's GB/s.
Reported: each round's figures, their ratio (this tree / the other), and the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHUNK, WIDTH, WINDOW_CHUNKS = 1024, 256, 8


def _child(url: str, cache: str, epochs: int) -> None:
    import chunkstream as cs

    window = CHUNK * WINDOW_CHUNKS
    with cs.ZarrSource(url, cache=cache) as source:
        n = len(source) // window
        best = 0.0
        for _ in range(epochs):
            with cs.ChunkLoader(
                source, window, device="cpu", workers=2, sampling="sequential"
            ) as loader:
                began = time.perf_counter()
                for _chunk in loader.epoch(n):
                    pass
                took = time.perf_counter() - began
            best = max(best, n * window * WIDTH * 4 / took / 1e9)
        counters = source.cache.counters.as_dict()
        warned = list(getattr(source.cache, "warnings", []))
        hit_ms = _hit_path(source.cache, Path(cache))
    print(json.dumps({"gbps": best, "hit_ms": hit_ms, **counters, "warnings": warned}))


def _hit_path(cache, folder: Path, passes: int = 9) -> float:
    """The hit path alone (``NodeCache.read``: open, lock, read, check): the sum over the
    entries of each one's fastest of ``passes`` reads, in ms (the fastest is the least
    disturbed by the machine's load)."""
    names = sorted(p.name for p in (folder / "entries").rglob("*") if p.is_file())
    fastest = dict.fromkeys(names, float("inf"))
    for _ in range(passes):
        for name in names:
            began = time.perf_counter()
            cache.read(name)
            fastest[name] = min(fastest[name], time.perf_counter() - began)
    return sum(fastest.values()) * 1e3


def _run(tree_src: Path, url: str, cache: Path, epochs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree_src}:{ROOT}"}
    command = [sys.executable, "-m", "benchmarks.cache_ab", "--child", url, str(cache), str(epochs)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, metavar=("URL", "CACHE", "EPOCHS"))
    parser.add_argument("--against", default="main")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32768, help="timesteps (x 256 float32)")
    args = parser.parse_args()
    if args.child:
        url, cache, epochs = args.child
        _child(url, cache, int(epochs))
        return
    import numpy as np
    import zarr

    from benchmarks._cache import throttled_server

    with tempfile.TemporaryDirectory(prefix="cache-ab-") as tmp:
        work = Path(tmp)
        other = work / "other"
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.against, "src"],
            capture_output=True,
            check=True,
        ).stdout
        (work / "src.tar").write_bytes(archive)
        with tarfile.open(work / "src.tar") as tar:
            tar.extractall(other, filter="data")
        data = np.random.default_rng(0).standard_normal((args.steps, WIDTH)).astype(np.float32)
        data = np.round(data, 2)  # compressible, as recordings are
        store = work / "store"
        zarr.create_array(
            store / "x.zarr",
            shape=data.shape,
            chunks=(CHUNK, WIDTH),
            dtype="f4",
            compressors=zarr.codecs.ZstdCodec(level=3),
        )[:] = data
        trees = {"this": ROOT / "src", args.against: other / "src"}
        with throttled_server(store, 0.0, 1e6) as server:
            url = f"{server}/x.zarr"
            for name, src in trees.items():  # fill each tree's cache, untimed
                filled = _run(src, url, work / f"cache-{name}", 1)
                assert filled["misses"] > 0 and not filled["warnings"], filled
            ratios, hits = [], []
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                got = {n: _run(trees[n], url, work / f"cache-{n}", args.epochs) for n in order}
                for n, res in got.items():
                    assert res["misses"] == 0 and not res["warnings"], (n, res)
                this, that = got["this"], got[args.against]
                ratio = this["gbps"] / that["gbps"]
                ratios.append(ratio)
                hits.append(that["hit_ms"] / this["hit_ms"])
                print(
                    f"round {r + 1} ({' then '.join(order)}): this {this['gbps']:.3f} "
                    f"GB/s, {args.against} {that['gbps']:.3f} GB/s, ratio {ratio:.3f}; "
                    f"hit path {this['hit_ms']:.2f} ms vs {that['hit_ms']:.2f} ms, "
                    f"speed ratio {hits[-1]:.3f}",
                    flush=True,
                )
    for what, figures in (("warm epochs' GB/s", ratios), ("hit path's speed", hits)):
        print(
            f"this / {args.against}, {what}: median {statistics.median(figures):.3f} "
            f"(range {min(figures):.3f}-{max(figures):.3f}) over {len(figures)} rounds"
        )


if __name__ == "__main__":
    main()
