"""The trainer and ``chunkstream demo`` on several runs: validation per recording and on
runs held out entirely (issue 44)."""

from __future__ import annotations

import numpy as np
import pytest

import chunkstream as cs
from chunkstream.cli import main
from chunkstream.tools import ensure_synthetic
from chunkstream.train import TrainConfig, Trainer


def _run(root, name, timesteps, seed):
    ensure_synthetic(
        root / name,
        timesteps=timesteps,
        neurons=16,
        stim_dims=8,
        chunks=(64, 8, 1),
        seed=seed,
        progress=False,
    )
    return str(root / name)


@pytest.mark.slow
def test_demo_trains_on_several_runs_and_validates_each_and_held_out_runs(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = [_run(tmp_path, f"run{i}", t, i) for i, t in enumerate((768, 1024, 512))]
    held = _run(tmp_path, "held", 384, 9)
    out = tmp_path / "demo"
    argv = [
        "demo",
        "--data",
        *runs,
        "--val-data",
        held,
        "--out",
        str(out),
        "--epochs",
        "2",
        "--chunk-size",
        "256",
        "--batch-size",
        "64",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for name in ("run0", "run1", "run2"):
        assert f"{name}/val" in text and f"held-out end of {name!r}" in text
    assert "held" in text and "held-out run (--val-data), whole" in text
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"val/run0/val", "val/run1/val", "val/run2/val", "val/held"} <= tags
    assert [e.step for e in acc.Scalars("val/held")] == [0, 1]


def test_demo_refuses_a_run_both_trained_on_and_held_out(tmp_path, capsys):
    run = _run(tmp_path, "run0", 1024, 0)
    assert main(["demo", "--data", run, "--val-data", run, "--out", str(tmp_path / "o")]) != 0
    assert "name a run twice" in capsys.readouterr().err
    assert main(["demo", "--val-data", run, "--out", str(tmp_path / "o")]) != 0
    assert "--val-data" in capsys.readouterr().err


def test_trainer_holds_out_each_recording_and_whole_runs():
    rng = np.random.default_rng(0)

    def source(t):
        return cs.NumpySource(
            {
                "voltage": rng.standard_normal((t, 6), dtype=np.float32),
                "stimulus": rng.standard_normal((t, 2), dtype=np.float32),
            }
        )

    recs = cs.Recordings([source(900), source(1500)], names=["a", "b"])
    config = TrainConfig(
        epochs=1,
        device="cpu",
        progress=False,
        tensorboard=False,
        chunk_size=256,
        hidden_dim=8,
        latent_dim=4,
        workers=1,
        val_data={"held": source(400)},
    )
    trainer = Trainer(recs, config)
    assert [p[0] for p in trainer.val_parts] == ["a/val", "b/val", "held"]
    assert trainer.train_segments.names == ("a/train", "b/train")
    result = trainer.fit()
    assert set(result.val_segments) == {"a/val", "b/val", "held"}
    assert config.to_dict()["val_data"] == ["held"]
    # Only held-out runs: no tail of the training runs.
    only = TrainConfig(**{**config.to_dict(), "val_data": {"held": source(400)}, "val_fraction": 0})
    trainer = Trainer(recs, only)
    assert [p[0] for p in trainer.val_parts] == ["held"]
    with pytest.raises(cs.ConfigError, match="val_fraction"):
        TrainConfig(val_fraction=0)
    narrow = cs.NumpySource(
        {"voltage": np.zeros((400, 5), np.float32), "stimulus": np.zeros((400, 2), np.float32)}
    )
    with pytest.raises(cs.ConfigError, match=r"val_data.*'voltage'.*\(6,\)"):
        Trainer(recs, TrainConfig(**{**only.to_dict(), "val_data": {"n": narrow}}))
