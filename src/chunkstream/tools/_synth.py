"""Synthetic datasets with learnable dynamics, written in bounded-memory slabs.

The signals come from a sparse random recurrent rate network driven by a smooth
stimulus, so they are neither white noise nor constant and compress like real
recordings::

    v[t+1] = (1 - a) * v[t] + a * tanh(W v[t] + g * s[t] + b + noise)
    c[t+1] = c[t] + ac * (v[t+1] - c[t])          (calcium: low-passed voltage)
    f[t]   = sigmoid(4 c[t]) + 0.02 * noise        (fluorescence)

With ``regimes=K > 1`` the recording is cut into ``K`` equal blocks of
consecutive timesteps, each with its own stimulus (frequencies, phases,
amplitudes) and its own per-neuron bias: experimental conditions that change
over time, so that neighbouring windows resemble each other more than distant
ones. The blocks are written to ``<out>/regimes.csv`` (``start,stop,name``,
readable by :meth:`chunkstream.Segments.read`).

``W`` is an ``N x N`` CSR matrix with a fixed fan-in ``K = clip(3% of N, 4, 32)``
and Gaussian weights of scale ``0.9 / sqrt(K)``, so its spectral radius is about
0.9 (< 1, stable). ``s`` (``stim_dims`` channels, fed to the first ``stim_dims``
neurons) is a sum of low-frequency sinusoids plus decaying noise bursts.

Why the full network and not a latent one projected to N: with a fixed fan-in
a step is one gather of ``N * K`` floats (linear in N), and the saved
connectivity is exactly the one that made the data (the compat augmentation
helper zeroes CSR neighbours). Only the time recurrence runs step by step;
noise, stimulus and fluorescence are vectorised per slab.

Layouts (the FlyVis layout as :mod:`chunkstream.flyvis` describes it):

* ``flyvis``: ``<out>/timeseries.zarr`` ``(T, N, 4)`` with columns VOLTAGE,
  STIMULUS (zero beyond ``stim_dims``), CALCIUM, FLUORESCENCE, and
  ``<out>/metadata.zarr`` ``(N, 5)``: INDEX, XPOS, YPOS, GROUP_TYPE, TYPE.
* ``arrays``: ``<out>/voltage.zarr`` ``(T, N)`` and ``<out>/stimulus.zarr``
  ``(T, stim_dims)``.

Both also get ``<out>/connectivity.npz`` (``indices``, ``indptr``, ``data``).
Output is a pure function of the arguments (the seed included).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError, check_int
from .._progress import progress_bar
from ._codecs import compressors_for

__all__ = [
    "SynthInfo",
    "default_chunks",
    "ensure_synthetic",
    "regime_bounds",
    "write_synthetic",
]

log = logging.getLogger(__name__)

LAYOUTS = ("flyvis", "arrays")
_log = logging.getLogger(__name__)
STAMP = ".chunkstream-synth.json"
_SLAB_BYTES = 64 * 2**20  # upper bound on the slab held in memory
_CHUNK_BYTES = 8 * 2**20  # default decoded bytes per zarr chunk


@dataclass(frozen=True, kw_only=True)
class SynthInfo:
    """What :func:`write_synthetic` wrote: ``arrays`` maps each array name to its
    path, ``shapes`` to its shape; ``nbytes`` is the decoded size of the dynamic
    data, ``seconds`` the time it took to write."""

    out: str
    layout: str
    timesteps: int
    neurons: int
    stim_dims: int
    dtype: str
    zarr_format: int
    codec: str
    chunks: tuple[int, ...]
    seed: int
    arrays: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    nbytes: int
    seconds: float
    regimes: int = 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def default_chunks(layout: str, timesteps: int, neurons: int, itemsize: int = 4) -> tuple:
    """About 8 MiB per chunk along time, the non-time axes whole."""
    cols = 4 if layout == "flyvis" else 1
    t = max(1, min(timesteps, _CHUNK_BYTES // (neurons * cols * itemsize)))
    return (t, neurons, 4) if layout == "flyvis" else (t, neurons)


def regime_bounds(timesteps: int, regimes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each regime block: timestep ``t`` is in block ``t * K // T``."""
    edges = [-(-r * timesteps // regimes) for r in range(regimes + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _validate(layout, timesteps, neurons, stim_dims, dtype, chunks) -> tuple[np.dtype, tuple]:
    if layout not in LAYOUTS:
        raise ConfigError.bad("layout", layout, "'flyvis' or 'arrays'")
    check_int("timesteps", timesteps)
    check_int("neurons", neurons)
    check_int(
        "stim_dims", stim_dims, 0, maximum=neurons, expected=f"an integer in [0, neurons={neurons}]"
    )
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ConfigError.bad("dtype", dtype, "a float dtype such as float32") from None
    if dt.kind != "f":
        raise ConfigError.bad("dtype", dtype, "a float dtype (float16, float32, float64)")
    if chunks is None:
        chunks = default_chunks(layout, timesteps, neurons, dt.itemsize)
    chunks = tuple(int(c) for c in chunks)
    rank = 3 if layout == "flyvis" else 2
    if len(chunks) != rank or min(chunks) < 1:
        example = "(t, n, c)" if rank == 3 else "(t, n)"
        raise ConfigError.bad("chunks", chunks, f"{rank} positive ints {example} for {layout}")
    return dt, chunks


class _Network:
    """The recurrent network and stimulus generator (module docs); state lives here."""

    def __init__(
        self, neurons: int, stim_dims: int, seed: int, regimes: int = 1, timesteps: int = 1
    ) -> None:
        rng = np.random.default_rng(seed)
        self.n, self.stim_dims, self.seed = neurons, stim_dims, seed
        k = int(np.clip(round(0.03 * neurons), 4, 32)) if neurons > 1 else 0
        k = min(k, neurons - 1)
        # Fixed fan-in without self-connections: row i draws k of the other neurons.
        idx = np.empty((neurons, k), dtype=np.int32)
        for i in range(neurons):
            pick = rng.choice(neurons - 1, size=k, replace=False) if k else []
            idx[i] = np.sort(np.where(np.asarray(pick) >= i, np.asarray(pick) + 1, pick))
        self.idx = idx
        self.w = (rng.standard_normal((neurons, k)) * (0.9 / np.sqrt(max(k, 1)))).astype(np.float32)
        self.leak = rng.uniform(0.05, 0.3, neurons).astype(np.float32)
        self.bias = rng.normal(0.0, 0.1, neurons).astype(np.float32)
        self.gain = rng.uniform(0.5, 1.5, stim_dims).astype(np.float32)
        n_sin = 3
        self.freq = rng.uniform(1 / 2000, 1 / 50, (n_sin, stim_dims))
        self.phase = rng.uniform(0, 2 * np.pi, (n_sin, stim_dims))
        self.amp = rng.uniform(0.2, 0.6, (n_sin, stim_dims))
        self.v = rng.normal(0.0, 0.1, neurons).astype(np.float32)
        self.c = self.v.copy()
        # Regimes draw from their own generators, so regimes=1 writes what it always wrote.
        self.regimes, self.timesteps = regimes, timesteps
        gens = [np.random.default_rng([seed, 1 << 21, r]) for r in range(regimes)]
        self.r_freq = np.stack([g.uniform(1 / 2000, 1 / 50, (n_sin, stim_dims)) for g in gens])
        self.r_phase = np.stack([g.uniform(0, 2 * np.pi, (n_sin, stim_dims)) for g in gens])
        self.r_amp = np.stack([g.uniform(0.1, 0.9, (n_sin, stim_dims)) for g in gens])
        self.r_bias = np.stack([g.normal(0.0, 0.4, neurons) for g in gens]).astype(np.float32)

    def _regime(self, t0: int, t1: int) -> np.ndarray:
        return np.arange(t0, t1) * self.regimes // self.timesteps

    def csr(self) -> dict[str, np.ndarray]:
        """``W`` as CSR: row ``i`` holds neuron ``i``'s inputs (equal row lengths)."""
        n, k = self.idx.shape
        return {
            "indices": self.idx.reshape(-1).astype(np.int64),
            "indptr": np.arange(n + 1, dtype=np.int64) * k,
            "data": self.w.reshape(-1),
        }

    def stimulus(self, t0: int, t1: int, rng: np.random.Generator) -> np.ndarray:
        t = np.arange(t0, t1, dtype=np.float64)[:, None, None]
        if self.regimes > 1:
            r = self._regime(t0, t1)
            wave = self.r_amp[r] * np.sin(2 * np.pi * self.r_freq[r] * t + self.r_phase[r])
            s = wave.sum(axis=1)
        else:
            s = (self.amp * np.sin(2 * np.pi * self.freq * t + self.phase)).sum(axis=1)
        # Noise bursts: rare onsets with a 20-step exponential envelope.
        onsets = (rng.random(t1 - t0) < 1 / 400).astype(np.float64)
        envelope = np.convolve(onsets, np.exp(-np.arange(100) / 20.0))[: t1 - t0]
        s += envelope[:, None] * rng.standard_normal(s.shape) * 0.5
        return s.astype(np.float32)

    def run(self, t0: int, t1: int) -> tuple[np.ndarray, ...]:
        """Simulate ``[t0, t1)``: (voltage, stimulus, calcium, fluorescence)."""
        rng = np.random.default_rng([self.seed, t0])
        steps = t1 - t0
        stim = self.stimulus(t0, t1, rng)
        drive = rng.standard_normal((steps, self.n), dtype=np.float32) * 0.3
        drive += self.bias
        if self.regimes > 1:
            drive += self.r_bias[self._regime(t0, t1)]
        drive[:, : self.stim_dims] += stim * self.gain
        volt = np.empty((steps, self.n), dtype=np.float32)
        calc = np.empty_like(volt)
        v, c, a, w, idx = self.v, self.c, self.leak, self.w, self.idx
        for i in range(steps):
            rec = (w * v[idx]).sum(axis=1) if idx.shape[1] else 0.0
            v = (1 - a) * v + a * np.tanh(rec + drive[i])
            c = c + 0.05 * (v - c)
            volt[i], calc[i] = v, c
        self.v, self.c = v, c
        fluo = 1 / (1 + np.exp(-4 * calc)) + rng.standard_normal(calc.shape, np.float32) * 0.02
        return volt, stim, calc, fluo.astype(np.float32)


def _metadata(neurons: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 1 << 20])
    radius = np.sqrt(rng.random(neurons)) * 20
    angle = rng.random(neurons) * 2 * np.pi
    cols = [
        np.arange(neurons),
        radius * np.cos(angle),
        radius * np.sin(angle),
        rng.integers(0, 4, neurons),
        rng.integers(0, 65, neurons),
    ]
    return np.stack(cols, axis=1).astype(np.float32)


def _prepare_out(out: Path, names: tuple[str, ...], overwrite: bool) -> None:
    """Make ``out`` ready to write ``names``; raises :class:`ConfigError` when ``out`` is
    a file, or already holds one of them and ``overwrite`` is False."""
    if out.exists() and not out.is_dir():
        raise ConfigError.bad("out", str(out), "a directory", "Choose another path.")
    existing = [n for n in names if (out / f"{n}.zarr").exists()]
    if existing and not overwrite:
        raise ConfigError(
            f"out={str(out)!r} already holds {existing[0]}.zarr: delete it or pass "
            "overwrite=True (--overwrite)."
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)


def _create_arrays(
    out: Path,
    layout: str,
    timesteps: int,
    neurons: int,
    stim_dims: int,
    dt: np.dtype,
    chunks: tuple,
    compressors: Any,
    zarr_format: int,
    seed: int,
) -> tuple[dict[str, tuple[int, ...]], dict[str, Any], int]:
    """``(shapes, {name: zarr array}, bytes per timestep)`` of the layout's new arrays;
    the flyvis metadata is written here, the dynamic arrays are left to fill."""
    import zarr

    def create(name: str, shape: tuple[int, ...], chunk: tuple[int, ...]):
        path = out / f"{name}.zarr"
        if path.exists():
            shutil.rmtree(path)
        if all(shape) and any(c > s for c, s in zip(chunk, shape, strict=True)):
            cut = tuple(min(c, s) for c, s in zip(chunk, shape, strict=True))
            _log.warning(
                "%s: chunks %s are larger than the array's shape %s: cut to %s",
                name,
                chunk,
                shape,
                cut,
            )
            chunk = cut
        return zarr.create_array(
            str(path),
            shape=shape,
            chunks=chunk,
            dtype=dt,
            compressors=compressors,
            zarr_format=zarr_format,
            fill_value=0.0,
            config={"write_empty_chunks": True},
        )

    if layout == "flyvis":
        shapes = {"timeseries": (timesteps, neurons, 4), "metadata": (neurons, 5)}
        arrays = {"timeseries": create("timeseries", shapes["timeseries"], chunks)}
        create("metadata", shapes["metadata"], (neurons, 5))[:] = _metadata(neurons, seed)
        return shapes, arrays, neurons * 4 * dt.itemsize
    shapes = {"voltage": (timesteps, neurons), "stimulus": (timesteps, stim_dims)}
    arrays = {
        "voltage": create("voltage", shapes["voltage"], chunks),
        "stimulus": create("stimulus", shapes["stimulus"], (chunks[0], max(1, chunks[1]))),
    }
    return shapes, arrays, (neurons + stim_dims) * dt.itemsize


def _write_slab(
    arrays: dict[str, Any],
    t0: int,
    t1: int,
    parts: tuple[np.ndarray, ...],
    dt: np.dtype,
    stim_dims: int,
) -> None:
    """Write the simulated ``(voltage, stimulus, calcium, fluorescence)`` of ``[t0, t1)``."""
    volt, stim, calc, fluo = parts
    if "timeseries" in arrays:
        block = np.zeros((t1 - t0, volt.shape[1], 4), dtype=dt)
        block[:, :, 0], block[:, :, 2], block[:, :, 3] = volt, calc, fluo
        block[:, :stim_dims, 1] = stim
        arrays["timeseries"][t0:t1] = block
        return
    arrays["voltage"][t0:t1] = volt.astype(dt, copy=False)
    if stim_dims:
        arrays["stimulus"][t0:t1] = stim.astype(dt, copy=False)


def _write_regimes(out: Path, timesteps: int, regimes: int) -> None:
    """``<out>/regimes.csv`` with each regime block (removed when ``regimes`` is 1)."""
    (out / "regimes.csv").unlink(missing_ok=True)
    if regimes > 1:
        rows = [f"{a},{b},regime{r}" for r, (a, b) in enumerate(regime_bounds(timesteps, regimes))]
        (out / "regimes.csv").write_text("start,stop,name\n" + "\n".join(rows) + "\n")


def write_synthetic(
    out: str | os.PathLike,
    *,
    layout: str = "flyvis",
    timesteps: int = 4096,
    neurons: int = 512,
    stim_dims: int = 64,
    dtype: str = "float32",
    zarr_format: int = 3,
    codec: str = "none",
    chunks: tuple[int, ...] | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    regimes: int = 1,
) -> SynthInfo:
    """Write a synthetic dataset under directory ``out`` (see module docs).

    Memory stays below one slab (~64 MiB, a whole number of time chunks) plus the
    network. ``chunks`` defaults to :func:`default_chunks`. An existing dataset at
    ``out`` is an error unless ``overwrite``. The progress bar (tqdm) shows only
    on a terminal, and never when ``progress`` is False. ``regimes`` > 1 cuts
    the recording into that many stimulus regimes (module docs).
    """
    dt, chunks = _validate(layout, timesteps, neurons, stim_dims, dtype, chunks)
    check_int(
        "regimes",
        regimes,
        1,
        "Use 1 for no regimes.",
        maximum=timesteps,
        expected=f"an integer in [1, timesteps={timesteps}]",
    )
    # Checked here, before anything is written: numpy's own refusal came after the arrays.
    check_int("seed", seed, 0, "Pass a seed >= 0.")
    compressors = compressors_for(codec, zarr_format)
    out = Path(out)
    names = ("timeseries", "metadata") if layout == "flyvis" else ("voltage", "stimulus")
    _prepare_out(out, names, overwrite)
    begin = time.perf_counter()
    shapes, arrays, step_bytes = _create_arrays(
        out, layout, timesteps, neurons, stim_dims, dt, chunks, compressors, zarr_format, seed
    )
    t_chunk = next(iter(arrays.values())).chunks[0]
    # A slab is a whole number of time chunks so each write fills chunks exactly once.
    slab = t_chunk * max(1, _SLAB_BYTES // max(1, step_bytes * t_chunk))
    net = _Network(neurons, stim_dims, seed, regimes=regimes, timesteps=timesteps)
    np.savez(out / "connectivity.npz", **net.csr())
    _write_regimes(out, timesteps, regimes)
    with progress_bar(desc="synth", unit="step", total=timesteps, enabled=progress) as bar:
        for t0 in range(0, timesteps, slab):
            t1 = min(timesteps, t0 + slab)
            _write_slab(arrays, t0, t1, net.run(t0, t1), dt, stim_dims)
            bar.update(t1 - t0)
    info = SynthInfo(
        out=str(out),
        layout=layout,
        timesteps=timesteps,
        neurons=neurons,
        stim_dims=stim_dims,
        dtype=dt.name,
        zarr_format=zarr_format,
        codec=codec,
        chunks=chunks,
        seed=seed,
        arrays={n: str(out / f"{n}.zarr") for n in names},
        shapes=shapes,
        nbytes=int(timesteps * step_bytes),
        seconds=time.perf_counter() - begin,
        regimes=regimes,
    )
    log.info("synth wrote %s (%.1f MB) in %.1f s", out, info.nbytes / 1e6, info.seconds)
    return info


def _stamp_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    args = {
        "layout": "flyvis",
        "timesteps": 4096,
        "neurons": 512,
        "stim_dims": 64,
        "dtype": "float32",
        "zarr_format": 3,
        "codec": "none",
        "chunks": None,
        "seed": 0,
        "regimes": 1,
    }
    unknown = set(kwargs) - set(args) - {"progress"}
    if unknown:
        raise ConfigError.bad("ensure_synthetic kwargs", sorted(unknown), f"any of {sorted(args)}")
    args.update({k: v for k, v in kwargs.items() if k != "progress"})
    if args["regimes"] == 1:
        del args["regimes"]  # stamps written before regimes existed stay valid
    if args["chunks"] is not None:
        args["chunks"] = [int(c) for c in args["chunks"]]
    args["dtype"] = np.dtype(args["dtype"]).name
    return args


def ensure_synthetic(out: str | os.PathLike, **kwargs: Any) -> SynthInfo:
    """Write the dataset once; later calls with the same arguments return at once.

    A stamp ``<out>/.chunkstream-synth.json`` written after a complete write
    records the arguments; a missing or different stamp rewrites the dataset.
    """
    out = Path(out)
    args = _stamp_args(kwargs)
    stamp = out / STAMP
    if stamp.is_file():
        saved = json.loads(stamp.read_text())
        if saved.get("args") == args:
            info = saved["info"]
            info["chunks"] = tuple(info["chunks"])
            info["shapes"] = {k: tuple(v) for k, v in info["shapes"].items()}
            return SynthInfo(**info)
    call = dict(args, chunks=None if args["chunks"] is None else tuple(args["chunks"]))
    call.setdefault("regimes", 1)
    info = write_synthetic(out, overwrite=True, progress=kwargs.get("progress", True), **call)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"args": args, "info": info.to_dict()}, indent=1))
    os.replace(tmp, stamp)
    return info
