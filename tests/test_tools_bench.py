"""``chunkstream bench``: the prefetch diagnosis on tiny real zarr stores, through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from chunkstream.cli import main
from chunkstream.tools import open_bench_source, run_bench


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "x.zarr"
    arr = zarr.create_array(str(path), shape=(2048, 32), chunks=(128, 32), dtype="float32",
                            compressors=None)  # fmt: skip
    arr[:] = np.random.default_rng(0).random((2048, 32), dtype=np.float32)
    return path


@pytest.fixture
def slow_store(tmp_path):
    """Reads that cost milliseconds (zstd-compressed noise), so with no training every chunk
    waits on its read whatever the machine: an uncompressed 128 kB read can finish within the
    consumer's own per-chunk overhead and look like keeping up."""
    path = tmp_path / "slow.zarr"
    arr = zarr.create_array(str(path), shape=(16384, 64), chunks=(256, 64), dtype="float32",
                            compressors=zarr.codecs.ZstdCodec(level=9))  # fmt: skip
    arr[:] = np.random.default_rng(0).random((16384, 64), dtype=np.float32)
    return path


def _bench(capsys, *argv):
    rc = main(["bench", *argv, "--device", "cpu", "--no-progress", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def test_json_has_the_figures(store, capsys, tmp_path):
    out = _bench(capsys, str(store), "--chunk-size", "256", "--chunks", "4", "--prefetch", "1,2",
                 "--workers", "1", "--train-ms", "5", "--plot", str(tmp_path / "t.png"))  # fmt: skip
    assert [(s["prefetch"], s["workers"]) for s in out["settings"]] == [(1, 1), (2, 1)]
    assert out["chunk_bytes"] == 256 * 32 * 4 and out["num_chunks"] == 4
    for s in out["settings"]:
        for key in ("wait_mean_s", "wait_max_s", "queue_empty", "queue_full", "epoch_s",
                    "ideal_s", "overlap", "keeping_up", "verdict", "read_mean_s"):  # fmt: skip
            assert key in s
        assert len(s["chunks"]) == 4
        first = s["chunks"][0]
        assert first["queue_depth"] >= 0 and first["read_s"] > 0 and first["train_s"] > 0
        assert s["ideal_s"] > 0 and s["epoch_s"] >= s["wait_mean_s"]
    png = tmp_path / "t.png"
    assert out["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_verdict_flips_between_slow_and_fast_consumer(store, slow_store):
    source = open_bench_source(store)
    try:
        # Training 200 ms per 32 kB chunk: reading is orders of magnitude faster.
        slow = run_bench(source, chunk_size=256, prefetch=(2,), workers=(1,), num_chunks=4,
                         train_ms=200, device="cpu")  # fmt: skip
    finally:
        source.close()
    source = open_bench_source(slow_store)
    try:
        # No training at all: every chunk waits on its 1 MB zstd decode.
        fast = run_bench(source, chunk_size=4096, prefetch=(1,), workers=(1,), num_chunks=6,
                         train_ms=0, device="cpu")  # fmt: skip
    finally:
        source.close()
    (s,) = slow.settings
    assert s.keeping_up and s.bottleneck in ("none", "startup") and "keeping up" in s.verdict
    assert s.queue_empty == 0
    assert "use prefetch=2 workers=1" in slow.recommendation
    (f,) = fast.settings
    assert not f.keeping_up and f.bottleneck == "read"
    assert "NOT keeping up" in f.verdict and "--workers 2" in f.verdict
    assert "no setting keeps up" in fast.recommendation


def test_text_output_and_matmul(store, capsys):
    rc = main(["bench", str(store), "--chunk-size", "256", "--chunks", "3", "--prefetch", "1",
               "--workers", "1,2", "--train", "matmul", "--train-steps", "1", "--device", "cpu",
               "--no-progress"])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0 and "recommendation:" in text and "matmul" in text
    assert "prefetch=1 workers=2:" in text


@pytest.mark.parametrize(("argv", "words"), [
    (["--chunks", "1"], "--chunks"),
    (["--prefetch", "0"], "--prefetch"),
    (["--plot", "x.png", "--plot-setting", "9,9"], "--plot-setting"),
])  # fmt: skip
def test_bad_arguments_exit_2(store, capsys, argv, words):
    assert main(["bench", str(store), "--device", "cpu", "--no-progress", "--chunk-size", "64",
                 "--train-ms", "0", "--prefetch", "1", "--workers", "1", *argv]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_missing_store_exits_2(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nope.zarr"), "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
