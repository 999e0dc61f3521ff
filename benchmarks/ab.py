"""One arm of the gather benchmark on this tree and on an older commit, alternated in one run.

    python -m benchmarks.ab --against 19e07c6                  # host tier, 8 rounds of 5 s
    python -m benchmarks.ab --against 19e07c6 --arm device --rounds 4 --seconds 3
    python -m benchmarks.ab --against 2f6cf81 --arm first   # a fresh loader's first epoch
    python -m benchmarks.ab --against 2f6cf81 --arm demo --rounds 4   # the demo's trainer
    python -m benchmarks.ab --against 3a9821f --geometry zap --rounds 4  # 32 x 100 x 71,721

Issue 37 asks the host tier to keep >= 0.95x its batches/s from before the change,
"one run, same machine". On a shared machine two runs minutes apart differ by more
than 5%, so this runs both trees in the same run, taking turns: round ``r`` measures
this tree and the other one (the order alternating each round), each in a fresh
process with ``chunkstream`` imported from that tree's ``src/`` (the other commit's
``src/`` exported with ``git archive``), over the same data and the same harness
(:func:`benchmarks.gather_busy.measure`, idle: no burners). The ``first`` arm
times fresh loaders instead: a ``ChunkLoader`` and a ``BatchStream`` with its
defaults (the host tier, ``mix="auto"``) built, and their first epoch taken,
again and again for ``--seconds``: batches/s from construction to the epoch's
last batch. Reported: each round's two figures and their ratio, and the median
of the per-round ratios with its range.

The ``demo`` arm times ``chunkstream demo``'s training on the CPU instead (issue 43:
the trainer on ``BatchStream`` keeps >= 0.95x the demo's batches/s): the reference
trainer with the demo's configuration (chunk 1,024, batches of 32, defaults
otherwise) on the demo's synthetic dataset (written once under
``benchmarks/_data/ab-demo``; 24,576 timesteps, ``--quick`` 8,192), for 2 epochs
(the warm-up's and one rollout's); batches/s is every batch over the epochs'
seconds (their validation included, the same in both trees). ``--seconds`` does
not apply to it.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _export(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` unpacked under ``into``; its path."""
    archive = subprocess.run(
        ["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")
    return into / "src"


def _demo_child(quick: bool) -> None:
    """The demo's training on the CPU with this process's ``chunkstream``: batches/s."""
    import chunkstream
    from chunkstream.cli._demo import DEFAULTS, TIME_CHUNK, _open
    from chunkstream.tools import ensure_synthetic
    from chunkstream.train import TrainConfig, Trainer

    timesteps = 8192 if quick else DEFAULTS["timesteps"]
    data = ROOT / "benchmarks" / "_data" / "ab-demo" / f"T{timesteps}"
    stim = DEFAULTS["stim_dims"]
    ensure_synthetic(data, timesteps=timesteps, neurons=DEFAULTS["neurons"], stim_dims=stim,
                     seed=0, progress=False, chunks=(TIME_CHUNK, stim, 1))  # fmt: skip
    config = TrainConfig(chunk_size=1024, batch_size=32, epochs=2, device="cpu", seed=0,
                         progress=False, tensorboard=False)  # fmt: skip
    source = _open(data, None)
    try:
        result = Trainer(source, config).fit()
    finally:
        source.close()
    batches = sum(r.batches for r in result.history)
    seconds = sum(r.seconds for r in result.history)
    out = {"batches_s": batches / seconds, "batches": batches, "val_loss": result.val_loss}
    print(json.dumps({**out, "module": chunkstream.__file__}), flush=True)


# --geometry: (timesteps, width, chunk_size, batch, window); ``race`` is --quick-able.
GEOMETRIES = {
    "race": (65536, 1024, 16384, 256, 64),  # 256 x 64 x 1,024 float32 batches (64 MiB)
    "zap": (2048, 71721, 1024, 32, 100),  # ZAPBench-like: 32 x 100 x 71,721 (918 MB)
}


def _child(arm: str, seconds: float, quick: bool, geometry: str = "race") -> None:
    if arm == "demo":
        _demo_child(quick)
        return
    import numpy as np

    import chunkstream
    from benchmarks import gather_busy
    from benchmarks.gather_busy import measure

    t, n, chunk, gather_busy.BATCH, gather_busy.WINDOW = GEOMETRIES[geometry]
    if quick and geometry == "race":
        t, n, chunk = 16384, 256, 4096
    data = np.random.default_rng(0).standard_normal((t, n), dtype=np.float32)
    if arm == "first":
        out = _first_epochs(data, chunk, seconds)
        print(json.dumps({**out, "module": chunkstream.__file__}), flush=True)
        return
    out = measure(
        data,
        chunk,
        arm,
        seconds,
        gather_threads=None,
        **({"batch_prefetch": 2} if arm == "host" else {}),
    )
    print(json.dumps({**out, "module": chunkstream.__file__}), flush=True)


def _first_epochs(data, chunk: int, seconds: float) -> dict:
    """Fresh loaders' first epochs (module docs), batches/s over all of them."""
    import time

    import chunkstream as cs

    batches, spent, t0 = 0, 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or batches == 0:
        begin = time.perf_counter()
        with cs.ChunkLoader(cs.NumpySource({"x": data}), chunk, device="cpu", seed=0) as loader:
            stream = cs.BatchStream(loader, window=64, batch_size=256,
                                    batches_per_chunk=chunk // 256, fields="x")  # fmt: skip
            for batch in stream:
                batches += 1
                del batch
        spent += time.perf_counter() - begin
    return {"batches_s": batches / spent}


def _run(src: Path, arm: str, seconds: float, quick: bool, geometry: str = "race") -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.ab",
        "--child",
        arm,
        "--seconds",
        str(seconds),
        "--geometry",
        geometry,
    ]
    done = subprocess.run(
        cmd + (["--quick"] if quick else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{src}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    out = json.loads(lines[-1])
    # Figures printed, then a failed exit (before 0fd2131 a gather helper could abort
    # the interpreter's exit): the figures stand, the exit status is reported.
    out["exit"] = done.returncode
    assert Path(out["module"]).resolve().is_relative_to(src.resolve()), (out, src)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="the older commit (any git revision)")
    ap.add_argument("--arm", default="host", choices=["host", "device", "before", "first", "demo"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="per arm and tree")
    ap.add_argument("--quick", action="store_true", help="16,384 x 256, chunk 4,096")
    ap.add_argument(
        "--geometry",
        default="race",
        choices=list(GEOMETRIES),
        help="host/device arms: race (256 x 64 x 1,024) or zap (32 x 100 x 71,721)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.seconds, args.quick, args.geometry)
        return 0
    if not args.against:
        ap.error("--against REV is required (e.g. --against 19e07c6)")
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="chunkstream-ab-") as tmp:
        trees = {"this tree": ROOT / "src", args.against: _export(args.against, Path(tmp))}
        print(
            f"arm {args.arm} ({args.geometry}), idle, {args.seconds:g} s per run, {args.rounds} rounds; "
            f"this tree (HEAD {head}, with any uncommitted change) vs {args.against}; "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        ratios, figures = [], {name: [] for name in trees}
        failed_exits = dict.fromkeys(trees, 0)
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            got = {
                name: _run(trees[name], args.arm, args.seconds, args.quick, args.geometry)
                for name in order
            }
            for name in trees:
                figures[name].append(got[name]["batches_s"])
                failed_exits[name] += got[name]["exit"] != 0
            a, b = got["this tree"]["batches_s"], got[args.against]["batches_s"]
            ratios.append(a / b)
            cpu = "".join(
                f"; {name} {got[name]['cpu_ms']:.1f} CPU ms/batch"
                for name in trees
                if "cpu_ms" in got[name]
            )
            print(
                f"  round {r} ({' first, '.join(order)} second): this tree {a:7.1f}, "
                f"{args.against} {b:7.1f} batches/s: {a / b:.3f}x{cpu}; "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    med = statistics.median(ratios)
    print("\n| tree | median batches/s | range |\n|---|---|---|")
    for name, values in figures.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f}-{max(values):.1f} |")
    print(
        "\nexits that failed after the figures were printed: "
        + ", ".join(f"{name} {n} of {args.rounds}" for name, n in failed_exits.items())
    )
    print(
        f"\nthis tree / {args.against}: median {med:.3f}x over {len(ratios)} rounds "
        f"(range {min(ratios):.3f}-{max(ratios):.3f})"
    )
    ok = med >= 0.95
    print(f"{'met ' if ok else 'MISS'}  {args.arm} batches/s >= 0.95x {args.against}: {med:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
