"""``chunkstream plan``: epoch arithmetic, memory figures and the budget search, on real stores."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import zarr

from chunkstream import ConfigError
from chunkstream.cli import main
from chunkstream.tools import (
    fit_budget,
    layout_from_shape,
    layout_from_store,
    parse_bytes,
    plan_memory,
)


def _plan(capsys, *argv):
    rc = main(["plan", *argv, "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def _flyvis(tmp_path, T=300, N=20):
    run = tmp_path / "run"
    arr = zarr.create_array(str(run / "timeseries.zarr"), shape=(T, N, 4), chunks=(50, N, 1),
                            dtype="float32", compressors=None)  # fmt: skip
    arr[:] = np.random.default_rng(0).random((T, N, 4), dtype=np.float32)
    return run


def test_users_shape_full_vs_streaming(capsys):
    out = _plan(capsys, "--shape", "967680,13741", "--stim-dims", "1736",
                "--chunk-size", "65536", "--batch-size", "256")  # fmt: skip
    step = (13741 + 1736) * 4
    assert out["step_bytes"] == step
    assert out["full"]["device_bytes"] == 967680 * step  # ~60 GB
    assert 59e9 < out["full"]["device_bytes"] < 61e9
    chunk = 65536 * step
    assert out["chunk_bytes"] == chunk
    assert out["streaming"]["device_bytes"] == 2 * chunk  # gpu_prefetch 1 + the held chunk, ~8 GB
    assert 7.9e9 < out["streaming"]["device_bytes"] < 8.3e9
    assert out["streaming"]["pinned_bytes"] == (2 + 2) * chunk
    assert out["epoch"]["batches_per_chunk"] == 65536 // 256
    assert out["epoch"]["batches_per_epoch"] == 967680 // 256
    assert out["epoch"]["chunks_per_epoch"] == (967680 // 256) // (65536 // 256)
    assert out["saving"] == pytest.approx(1 - 2 * 65536 / 967680)

    assert main(["plan", "--shape", "967680,13741", "--stim-dims", "1736",
                 "--chunk-size", "65536", "--batch-size", "256"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "59.9 GB" in text and "8.11 GB" in text and "less device memory" in text


def test_store_flyvis_fields_and_validation(tmp_path, capsys):
    run = _flyvis(tmp_path)
    out = _plan(capsys, str(run), "--flyvis", "--stim-dims", "5", "--chunk-size", "64",
                "--batch-size", "8", "--window", "4", "--val-fraction", "0.1", "--workers", "1",
                "--prefetch", "3", "--gpu-prefetch", "2", "--world-size", "2")  # fmt: skip
    step = (20 + 5) * 4
    assert out["fields"] == {"voltage": [[20], "float32"], "stimulus": [[5], "float32"]}
    assert out["val_timesteps"] == 30 and out["train_timesteps"] == 270
    assert out["streaming"]["device_bytes"] == 3 * 64 * step + 30 * step
    assert out["streaming"]["pinned_bytes"] == 4 * 64 * step
    assert out["streaming"]["host_bytes"] > 0  # decode scratch is known for a store
    assert out["epoch"]["chunks_per_epoch"] == ((270 // 8) // (64 // 8)) // 2
    # the same via --fields on the array, and the same through the library
    same = _plan(capsys, str(run / "timeseries.zarr"), "--fields", "voltage=:,0",
                 "stimulus=0:5,1", "--chunk-size", "64", "--batch-size", "8")  # fmt: skip
    assert same["step_bytes"] == step
    layout = layout_from_store(run, flyvis=True, stim_dims=5)
    assert layout.total_timesteps == 300 and layout.step_nbytes == step


@pytest.mark.parametrize(("gpu", "host", "workers"), [("8GB", None, 2), ("4GB", "20GB", 1),
                                                       (None, "9GiB", 2), ("1.5GB", "2GB", 3)])  # fmt: skip
def test_budget_search_fits_and_is_maximal(gpu, host, workers):
    layout = layout_from_shape((967680, 13741), stim_dims=1736)
    gpu_b = None if gpu is None else parse_bytes(gpu)
    host_b = None if host is None else parse_bytes(host)
    fit = fit_budget(layout, chunk_size=65536, batch_size=256, window=64, workers=workers,
                     gpu_mem=gpu_b, host_mem=host_b, val_fraction=0.01)  # fmt: skip
    cs = fit.chunk_size
    assert cs >= 256 and cs & (cs - 1) == 0  # a power of two, at least the batch

    def fits(chunk, prefetch, gpu_prefetch):
        report = plan_memory(layout, chunk_size=chunk, batch_size=256, window=64,
                             workers=workers, prefetch=prefetch, gpu_prefetch=gpu_prefetch,
                             val_fraction=0.01)  # fmt: skip
        s = report.streaming
        return (gpu_b is None or s.device_bytes <= gpu_b) and (
            host_b is None or s.pinned_bytes <= host_b
        )

    assert fits(cs, 2, 1)  # the requested depths
    assert not fits(2 * cs, 2, 1)  # doubling does not
    assert fits(cs, fit.prefetch, fit.gpu_prefetch)
    if host_b is not None:
        assert not fits(cs, fit.prefetch + 1, fit.gpu_prefetch)
    if gpu_b is not None:
        assert not fits(cs, fit.prefetch, fit.gpu_prefetch + 1)


def test_budget_in_cli_reports_requested_fit(capsys):
    out = _plan(capsys, "--shape", "967680,13741", "--stim-dims", "1736", "--chunk-size",
                "65536", "--batch-size", "256", "--gpu-mem", "8GB")  # fmt: skip
    assert out["budget"]["requested_fits"] is False  # 8.11 GB > 8 GB
    assert out["budget"]["chunk_size"] == 32768 and out["budget"]["limited_by"] == "--gpu-mem"
    out = _plan(capsys, "--shape", "967680,13741", "--chunk-size", "65536",
                "--batch-size", "256", "--gpu-mem", "64GB")  # fmt: skip
    assert out["budget"]["requested_fits"] is True


def test_parse_bytes():
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("1.5 kB") == 1500 and parse_bytes("1000") == 1000
    for bad in ("8 parsecs", "-1GB", "0"):
        with pytest.raises(ConfigError):
            parse_bytes(bad)


@pytest.mark.parametrize(("argv", "words"), [
    (["--chunk-size", "64", "--batch-size", "8", "--window", "100"], "--window=100"),
    (["--chunk-size", "64", "--batch-size", "5000"], "--batch-size=5000"),
    (["--chunk-size", "64", "--batch-size", "8", "--gpu-mem", "100B"], "--gpu-mem"),
    (["--chunk-size", "64", "--batch-size", "8", "--host-mem", "lots"], "--host-mem"),
    (["--chunk-size", "0", "--batch-size", "8"], "--chunk-size 0 is invalid"),
    (["--chunk-size", "64", "--batch-size", "8", "--val-fraction", "1.5"], "--val-fraction"),
])  # fmt: skip
def test_refusals_exit_2_with_one_line(capsys, argv, words):
    assert main(["plan", "--shape", "1000,10", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


def test_store_errors_exit_2(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "nope"), "--chunk-size", "8", "--batch-size", "2"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plan", "--chunk-size", "8", "--batch-size", "2"]) == 2
    assert "--shape" in capsys.readouterr().err
    run = _flyvis(tmp_path)
    assert main(["plan", str(run), "--flyvis", "--column", "xpos", "--chunk-size", "8",
                 "--batch-size", "2"]) == 2  # fmt: skip
    assert "--column" in capsys.readouterr().err


def test_pieces_and_segments_print_valid_starts_chunks_and_read_amplification(tmp_path, capsys):
    segments = tmp_path / "conditions.csv"
    segments.write_text("start,stop,name\n0,10000,calm\n10000,24576,storm\n")
    argv = ["plan", "--shape", "24576,128", "--chunk-size", "1024", "--batch-size", "32",
            "--window", "5", "--pieces", "4", "--segments", str(segments), "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "pieces: 4 x 256 timesteps per chunk" in text
    assert re.search(r"calm\s+9745 valid piece starts", text)  # 10000 - 256 + 1
    assert re.search(r"storm\s+14321 valid piece starts", text)
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["pieces"]
    assert report["chunks_per_epoch"] == 24 and report["chunks_per_pass"] == 24
    assert report["read_amplification"] == 1.0


def test_plan_says_which_mode_resident_auto_gets_and_why(tmp_path, capsys, monkeypatch):
    """The plan's verdict is the loader's: a real loader on a real store decides the same."""
    import chunkstream as cs

    data = np.random.default_rng(0).random((400, 16), dtype=np.float32)
    zarr.create_array(str(tmp_path / "a.zarr"), data=data, chunks=(50, 16))
    needed = 400 * 16 * 4
    for host_mem, mode in ((4 * needed, "resident"), (needed * 3 // 4, "streaming")):
        out = _plan(capsys, str(tmp_path / "a.zarr"), "--chunk-size", "50",
                    "--batch-size", "4", "--device", "cpu", "--host-mem", str(host_mem))  # fmt: skip
        assert out["mode"].startswith(f"{mode}: 400 timesteps"), out["mode"]
        source = cs.ZarrSource(tmp_path / "a.zarr")
        with cs.ChunkLoader(
            source,
            50,
            device="cpu",
            options=cs.LoaderOptions(host_memory=host_mem, resident="auto"),
        ) as ld:
            assert ld.mode == mode and ld.mode_reason == out["mode"]
    # without --host-mem, this rank's share of the job's memory decides, as in the loader
    monkeypatch.setenv("CHUNKSTREAM_HOST_MEMORY", str(needed * 3 // 4))
    out = _plan(capsys, str(tmp_path / "a.zarr"), "--chunk-size", "50", "--batch-size", "4",
                "--device", "cpu")  # fmt: skip
    assert out["mode"].startswith("streaming: 400 timesteps") and "this rank's" in out["mode"]
    with cs.ChunkLoader(cs.ZarrSource(tmp_path / "a.zarr"), 50, device="cpu", workers=1,
                        prefetch=1, options=cs.LoaderOptions(resident="auto")) as ld:  # fmt: skip
        assert ld.mode == "streaming" and ld.mode_reason == out["mode"]


def test_plan_holds_out_what_the_trainer_holds_out(tmp_path, capsys):
    """T * val_fraction = 300.7: the plan's figures are the ones a real Trainer uses."""
    from chunkstream.sources import ZarrSource
    from chunkstream.tools import write_synthetic
    from chunkstream.train import TrainConfig, Trainer

    write_synthetic(tmp_path / "run", timesteps=3007, neurons=24, stim_dims=6,
                    chunks=(256, 6, 1), progress=False)  # fmt: skip
    segments = tmp_path / "conditions.csv"
    segments.write_text("start,stop,name\n0,1203,calm\n1203,3007,storm\n")
    config = dict(chunk_size=512, batch_size=16, val_fraction=0.1, device="cpu", pieces=4,
                  progress=False, tensorboard=False, workers=1, mix=1)  # fmt: skip
    argv = [str(tmp_path / "run"), "--flyvis", "--stim-dims", "6", "--chunk-size", "512",
            "--batch-size", "16", "--val-fraction", "0.1", "--device", "cpu", "--pieces", "4",
            "--window", str(TrainConfig(**config).window)]  # fmt: skip
    with ZarrSource(str(tmp_path / "run" / "timeseries.zarr"),
                    fields={"voltage": (slice(None), 0), "stimulus": (slice(0, 6), 1)}) as src:  # fmt: skip
        trainer = Trainer(src, TrainConfig(**config))
        out = _plan(capsys, *argv)
        assert out["train_timesteps"] == trainer.train_len == 3007 - 300
        assert out["val_timesteps"] == 300
        for key in ("chunks_per_epoch", "batches_per_chunk", "batches_per_epoch"):
            assert out["epoch"][key] == getattr(trainer.plan, key), key
        assert out["pieces"]["chunks_per_epoch"] == trainer.plan.chunks_per_epoch
        assert out["pieces"]["timesteps"] == trainer.train_len
        # With segments the last tenth of each is held out, as the trainer does.
        with_segments = Trainer(src, TrainConfig(**config, segments=str(segments)))
        out = _plan(capsys, *argv, "--segments", str(segments))
        assert out["train_timesteps"] == with_segments.train_len < 3007 - 300
        # the held-out ranges the trainer keeps on the device, timesteps of each
        held = sum(len(fields["voltage"]) for _, fields, _ in with_segments.val_parts)
        assert out["val_timesteps"] == held and len(with_segments.val_parts) == 2
        for key in ("chunks_per_epoch", "batches_per_chunk", "batches_per_epoch"):
            assert out["epoch"][key] == getattr(with_segments.plan, key), key
        assert out["pieces"]["timesteps"] == with_segments.train_len
        assert out["pieces"]["chunks_per_epoch"] == with_segments.plan.chunks_per_epoch
        assert set(out["pieces"]["valid_starts"]) == {"calm/train", "storm/train"}
