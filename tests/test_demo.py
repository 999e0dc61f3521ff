"""``chunkstream demo`` end to end at a small size: it learns, and its outputs exist and parse."""

from __future__ import annotations

import json

import pytest

from chunkstream.cli import main

SMALL = ["--timesteps", "4096", "--neurons", "32", "--stim-dims", "8", "--chunk-size", "512",
         "--epochs", "3", "--no-progress", "--json"]  # fmt: skip


def test_demo_trains_and_writes_its_outputs(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), *SMALL]) == 0
    text = capsys.readouterr().out
    for line in ("epoch 1/3", "epoch 3/3", "validation loss, model", "stall fraction",
                 "chunks/s", "GB/s delivered", "whole training split"):  # fmt: skip
        assert line in text
    # the job's memory and this rank's CPUs each said once, in their own rows
    memory_row = next(row for row in text.splitlines() if "host memory (job)" in row)
    threads_row = next(row for row in text.splitlines() if "threads (this rank)" in row)
    assert "rank" in memory_row and "CPU" not in memory_row and "CPU" in threads_row
    result = json.loads((out / "result.json").read_text())
    assert result["val_loss"] < 0.7 * result["baseline_val"]
    assert result["memory"]["loader_host"] < result["memory"]["train_split"]
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace.json").read_text())
    assert any(e["name"] == "chunkstream.read" for e in trace["traceEvents"])
    assert (out / "checkpoint.pt").is_file()
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"val/loss", "val/constant_baseline", "train/recon", "latency/stall_fraction"} <= set(
        scalars
    )
    assert [e.step for e in acc.Scalars("val/loss")] == [0, 1, 2]
    val = acc.Scalars("val/loss")[-1].value
    assert val < acc.Scalars("val/constant_baseline")[-1].value

    # A second run reuses the cached dataset and, resumed, has nothing left to train.
    stamp = (out / "data" / ".chunkstream-synth.json").stat().st_mtime_ns
    assert main(["demo", "--out", str(out), "--resume", *SMALL]) == 0
    assert (out / "data" / ".chunkstream-synth.json").stat().st_mtime_ns == stamp
    assert "epoch 1/3" not in capsys.readouterr().out


def test_demo_rejects_a_missing_data_dir(tmp_path, capsys):
    assert main(["demo", "--data", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "timeseries.zarr" in capsys.readouterr().err


def test_demo_trains_on_segments_with_pieces_and_reports_each(tmp_path, capsys):
    segments = tmp_path / "conditions.csv"
    segments.write_text("start,stop,name\n0,1500,calm\n1500,4096,storm\n")
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), *SMALL, "--epochs", "2", "--pieces", "4",
            "--segments", str(segments), "--buffer", "device"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "4 pieces/chunk" in text and "device tier" in text  # --buffer reached the stream
    assert json.loads((out / "result.json").read_text())["buffer"] == "device"
    assert "calm/val" in text and "storm/val" in text


def test_the_table_says_when_the_model_loses_to_the_constant_baseline():
    from types import SimpleNamespace

    from chunkstream.cli._demo import versus_constant

    lost = SimpleNamespace(val_loss=0.00212, baseline_val=0.00146)
    assert versus_constant(lost) == (
        "1.45x higher than constant: the model has not beaten the constant baseline"
    )
    won = SimpleNamespace(val_loss=0.011, baseline_val=0.0616)
    assert versus_constant(won) == "5.6x lower than constant"
