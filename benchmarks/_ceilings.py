"""The machine's ceilings for the same bytes chunkstream delivers.

* :func:`memcpy_gbps`: one window's bytes copied between two reused buffers,
  split over all cores (numpy's copy releases the GIL).
* :class:`PageCacheReader`: for an uncompressed store, the byte ranges of every
  chunk file the window needs, ``preadv``-ed from the page cache into one reused
  buffer on a pool of ``cores`` threads (no decoding, no scatter: the floor of
  any reader of those files).
* :class:`ThreadPoolReader`: the plain thread-pool reader of DESIGN "What fast
  means": every zarr chunk the window needs, mapped with ``mmap`` and decoded
  with numcodecs on ``cores`` threads straight into a reused output buffer
  wherever the chunk lies whole inside it (else into a per-thread scratch
  buffer, then the needed block copied out).

All figures are GB/s of the *delivered* window (decoded bytes of the fields
used), so every ratio in BENCHMARKS.md is a ratio of times for the same window.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np
import zarr

__all__ = [
    "FieldDef",
    "PageCacheReader",
    "ThreadPoolReader",
    "decode_scaling",
    "flyvis_fields",
    "memcpy_gbps",
]


@dataclass(frozen=True)
class FieldDef:
    """A FlyVis field: neurons ``[0, neurons)`` of last-axis column ``column``."""

    name: str
    column: int
    neurons: int


def flyvis_fields(neurons: int, stim_dims: int) -> list[FieldDef]:
    return [FieldDef("voltage", 0, neurons), FieldDef("stimulus", 1, stim_dims)]


def memcpy_gbps(nbytes: int, repeats: int, cores: int) -> list[float]:
    """GB/s of copying ``nbytes`` between two reused buffers on ``cores`` threads."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), cores)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts if p.size]
    out = []
    with ThreadPoolExecutor(cores) as pool:
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            list(pool.map(lambda b: np.copyto(dst[b[0] : b[1]], src[b[0] : b[1]]), bounds))
            out.append(nbytes / (time.perf_counter() - begin) / 1e9)
    return out[1:]  # the first pass faults the pages in


class _Plan:
    """Which chunk files a window needs and where each lands in the output."""

    def __init__(self, array_path: Path, fields: list[FieldDef]) -> None:
        arr = zarr.open_array(array_path, mode="r")
        self.meta = arr.metadata
        self.root = Path(array_path)
        self.chunks = tuple(arr.chunks)
        self.shape = tuple(arr.shape)
        self.fields = fields
        self.codec = _codec(arr)

    def key(self, coords: tuple[int, int, int]) -> Path:
        return self.root / self.meta.encode_chunk_key(coords)

    def tasks(self, start: int, stop: int) -> list[tuple[tuple[int, int, int], list[tuple]]]:
        """``[(coords, [(field, rows_in_chunk, rows_in_out, column_in_chunk, whole)])]``."""
        ct, cn, cc = self.chunks
        if cn != self.shape[1]:
            raise ValueError("the benchmark stores keep the neuron axis whole in a chunk")
        out: dict[tuple[int, int, int], list[tuple]] = {}
        for f in self.fields:
            for i in range(start // ct, (stop - 1) // ct + 1):
                o = i * ct
                lo, hi = max(start, o), min(stop, o + ct)
                whole = lo == o and hi == o + ct and cc == 1 and f.neurons == cn
                coords = (i, 0, f.column // cc)
                out.setdefault(coords, []).append(
                    (f, (lo - o, hi - o), (lo - start, hi - start), f.column % cc, whole)
                )
        return list(out.items())


def _codec(arr: zarr.Array) -> numcodecs.abc.Codec | None:
    comps = arr.compressors
    if not comps:
        return None
    return numcodecs.Blosc()  # the benchmark stores use blosc; its frame carries the rest


class ThreadPoolReader:
    """mmap + numcodecs decode of every chunk a window needs, on ``cores`` threads."""

    def __init__(self, array_path: Path, fields: list[FieldDef], rows: int, cores: int) -> None:
        self.plan = _Plan(array_path, fields)
        self.out = {f.name: np.empty((rows, f.neurons), np.float32) for f in fields}
        self.pool = ThreadPoolExecutor(cores, thread_name_prefix="ceiling-decode")
        self._local = threading.local()
        self._chunk_nbytes = int(np.prod(self.plan.chunks)) * 4

    def _scratch(self) -> np.ndarray:
        s = getattr(self._local, "scratch", None)
        if s is None:
            s = self._local.scratch = np.empty(self._chunk_nbytes, np.uint8)
        return s

    def _decode(self, path: Path, target: np.ndarray) -> None:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            codec = self.plan.codec
            if codec is None:
                target[:] = np.frombuffer(m, np.uint8)
            else:
                codec.decode(m, out=target)

    def _task(self, coords: tuple[int, int, int], targets: list[tuple]) -> None:
        ct, cn, cc = self.plan.chunks
        path = self.plan.key(coords)
        if len(targets) == 1 and targets[0][4]:
            f, _, (a, b), _, _ = targets[0]
            self._decode(path, self.out[f.name][a:b].reshape(-1).view(np.uint8))
            return
        scratch = self._scratch()
        self._decode(path, scratch)
        block = scratch.view(np.float32).reshape(ct, cn, cc)
        for f, (r0, r1), (a, b), col, _ in targets:
            self.out[f.name][a:b] = block[r0:r1, : f.neurons, col]

    def read(self, start: int, stop: int) -> None:
        list(self.pool.map(lambda t: self._task(*t), self.plan.tasks(start, stop)))

    def close(self) -> None:
        self.pool.shutdown()


class PageCacheReader:
    """``preadv`` of the byte ranges of the chunk files a window needs (uncompressed stores)."""

    def __init__(self, array_path: Path, fields: list[FieldDef], rows: int, cores: int) -> None:
        self.plan = _Plan(array_path, fields)
        if self.plan.codec is not None:
            raise ValueError("a page-cache read is the ceiling of uncompressed stores only")
        ct, cn, cc = self.plan.chunks
        self.row_bytes = cn * cc * 4
        # at most one chunk more than the window per distinct column chunk
        ncols = len({f.column // cc for f in fields})
        self.buf = np.empty((rows + 2 * ct) * self.row_bytes * ncols, np.uint8)
        self.pool = ThreadPoolExecutor(cores, thread_name_prefix="ceiling-read")

    def read(self, start: int, stop: int) -> int:
        """Reads the window's bytes; returns how many bytes were read."""
        jobs, offset = [], 0
        for coords, targets in self.plan.tasks(start, stop):
            r0, r1 = targets[0][1]
            n = (r1 - r0) * self.row_bytes
            jobs.append((self.plan.key(coords), r0 * self.row_bytes, offset, n))
            offset += n

        def run(job: tuple[Path, int, int, int]) -> None:
            path, file_off, buf_off, n = job
            fd = os.open(path, os.O_RDONLY)
            try:
                view = memoryview(self.buf)[buf_off : buf_off + n]
                got = 0
                while got < n:
                    k = os.preadv(fd, [view[got:]], file_off + got)
                    if k == 0:
                        raise OSError(f"{path} is shorter than expected")
                    got += k
            finally:
                os.close(fd)

        list(self.pool.map(run, jobs))
        return offset

    def close(self) -> None:
        self.pool.shutdown()


def decode_scaling(array_path: Path, threads: list[int], files: int = 16, repeats: int = 3) -> dict:
    """GB/s of numcodecs decoding ``files`` chunk files held in memory, on k threads.

    No chunkstream, no file system: this is how far the machine itself lets
    decoding scale with threads, the physical limit of the scaling target."""
    plan = _Plan(Path(array_path), [])
    paths = sorted(p for p in Path(array_path).rglob("*") if p.is_file() and p.name != "zarr.json")
    blobs = [p.read_bytes() for p in paths[:files]]
    nbytes = int(np.prod(plan.chunks)) * 4
    codec = plan.codec
    out: dict = {}
    for k in threads:
        targets = [np.empty(nbytes, np.uint8) for _ in blobs]

        def run(i: int, targets=targets) -> None:
            if codec is None:
                targets[i][:] = np.frombuffer(blobs[i], np.uint8)
            else:
                codec.decode(blobs[i], out=targets[i])

        rates = []
        with ThreadPoolExecutor(k) as pool:
            for _ in range(repeats + 1):
                begin = time.perf_counter()
                list(pool.map(run, range(len(blobs))))
                rates.append(len(blobs) * nbytes / (time.perf_counter() - begin) / 1e9)
        out[f"t{k}"] = rates[1:]
    return out
