"""A decode stuck on a read that never returns does not hang the process's exit.

The chunk files from the second window on are FIFOs that nobody writes: opening one
blocks for ever, as a read on a dead network mount does. Every thread in the read path
is a daemon :class:`~chunkstream._executor.Executor` thread, so the process exits
within the loader's close timeout, with ``close()`` and without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

import chunkstream as cs

WORKER = Path(__file__).with_name("hung_worker.py")
CLOSE_TIMEOUT = 5.0  # the loader's default close_timeout
SLACK = 10.0  # interpreter teardown on a busy machine


def _store_with_fifos(path: Path) -> Path:
    """8,192 x 16 float32 in chunks of 1,024 rows; the files of rows >= 2,048 are FIFOs."""
    arr = zarr.create_array(
        path, shape=(8192, 16), chunks=(1024, 16), dtype="float32", compressors=ZstdCodec()
    )
    arr[:] = np.arange(8192 * 16, dtype=np.float32).reshape(8192, 16)
    for row in range(2, 8):
        chunk = path / "c" / str(row) / "0"
        chunk.unlink()
        os.mkfifo(chunk)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize("close", ["close", "no-close"])
def test_a_decode_hung_on_a_read_does_not_hang_the_exit(tmp_path, close):
    store = _store_with_fifos(tmp_path / "hung.zarr")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(cs.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    child = subprocess.Popen(
        [sys.executable, str(WORKER), str(store), close],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the process did not exit within 120 s\n{out}\n{err[-3000:]}")
    ended = time.time()
    assert child.returncode == 0, err[-3000:]
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert lines["STUCK"] == "True", out  # the read really hung in a decode thread
    assert ended - float(lines["EXITING"]) < CLOSE_TIMEOUT + SLACK, (out, err[-3000:])
