"""One thread copying a batch's windows against one block of the same bytes (issue 47).

    python -m benchmarks.window_copy [--neurons 71721 --window 100 --batch 32]
    GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x100000 python -m benchmarks.window_copy

At the ZAPBench-like geometry a batch is 32 windows of 100 x 71,721 float32 (28.7 MB
each). Prints GB/s for: the whole batch as one block (``dst[:] = src``), the windows
one ``np.copyto`` each from random rows, and the same from rows whose byte offsets are
multiples of 64, and with the batch lane's own loop (``np.positive`` over the bytes
as unsigned ints, a ufunc loop with ordinary stores). glibc chooses streaming (non-temporal) stores only above a threshold
derived from the L3 size it sees, so on a machine reporting a large L3 the windows go
through the cache and the block does not; the second command lowers the threshold.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _rate(nbytes: int, fn, repeat: int) -> float:
    fn()  # the pages faulted in
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return repeat * nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=4096)
    ap.add_argument("--neurons", type=int, default=71_721)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    src = np.random.default_rng(0).random((a.frames, a.neurons), dtype=np.float32)
    dst = np.zeros((a.batch, a.window, a.neurons), np.float32)
    nbytes = dst.nbytes
    rng = np.random.default_rng(1)
    anywhere = rng.integers(0, a.frames - a.window, a.batch)
    step = 64 // np.gcd(64, a.neurons * 4)  # rows whose byte offset is a multiple of 64
    aligned = rng.integers(0, (a.frames - a.window) // step, a.batch) * step

    def windows(starts):
        def run() -> None:
            for b, s in enumerate(starts):
                np.copyto(dst[b], src[s : s + a.window])

        return run

    bits_src, bits_dst = src.view(np.uint32), dst.view(np.uint32)

    def ufunc() -> None:  # the batch lane's loop for same-dtype windows (pipeline/_held.py)
        for b, s in enumerate(anywhere):
            np.positive(bits_src[s : s + a.window], out=bits_dst[b])

    flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)

    def block() -> None:
        flat_dst[:] = flat_src[: flat_dst.size]

    print(f"batch {a.batch} x {a.window} x {a.neurons} float32 ({nbytes / 1e6:.0f} MB), 1 thread")
    print(f"  one block          {_rate(nbytes, block, a.repeat):6.2f} GB/s")
    print(f"  windows, any row   {_rate(nbytes, windows(anywhere), a.repeat):6.2f} GB/s")
    print(f"  windows, 64-B rows {_rate(nbytes, windows(aligned), a.repeat):6.2f} GB/s")
    print(f"  windows, ufunc     {_rate(nbytes, ufunc, a.repeat):6.2f} GB/s (np.positive, uint32)")


if __name__ == "__main__":
    main()
