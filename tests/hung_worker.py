"""A child process for tests/test_hung_read.py: a decode stuck on a read that never returns.

``python hung_worker.py STORE CLOSE``: a loader over the zarr array at ``STORE`` (whose
chunk files from the second window on are FIFOs nobody writes, so opening one blocks
for ever) takes its first chunk, waits until a decode thread is inside the blocked
open, prints ``EXITING <time>``, calls ``loader.close()`` when ``CLOSE`` is ``"close"``,
and ``sys.exit(0)``.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings


def _stuck_in_read() -> bool:
    """Whether a ``chunkstream-decode-*`` thread is inside the fast reader's file open."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if not thread.name.startswith("chunkstream-decode-"):
            continue
        frame = frames.get(thread.ident)
        while frame is not None:
            if frame.f_code.co_name == "_raw":
                return True
            frame = frame.f_back
    return False


def main(store: str, close: str) -> None:
    import chunkstream as cs

    src = cs.ZarrSource(store, check_missing=False)
    loader = cs.ChunkLoader(src, 2048, device="cpu", sampling="sequential", workers=1)
    chunks = loader.epoch(4)
    next(chunks)
    end = time.monotonic() + 60
    while not _stuck_in_read() and time.monotonic() < end:
        time.sleep(0.05)
    print("STUCK", _stuck_in_read(), flush=True)
    print("EXITING", time.time(), flush=True)
    if close == "close":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "threads did not stop": expected here
            loader.close()
    sys.exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
