"""The examples run: Lightning on a BatchStream resumes exactly; the ZAPBench-like one trains.

examples/lightning_train.py: each run is a fresh process (``python -W error``, so a new
warning fails the test): one uninterrupted run of 2 epochs; one killed with ``os._exit`` at
step 60 (checkpoints every 25 steps, so the last one is at step 50, mid-chunk in epoch 0);
its resume, killed again at step 130; and a second resume from step 125 (mid-chunk in epoch
1). Every step writes a checksum of its batch: after each resume the steps must be those of
the uninterrupted run from the checkpoint's step on, with the same batches.
examples/zapbench_like.py runs once, small, and its resident and streamed runs must report
the same losses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning  # noqa: F401  (the test extra; fail here, not in a subprocess, if missing)
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning_train.py"
STEPS = 192  # 2 epochs x (24 chunks x 4 batches): the demo store's 24,576 steps / 256


def run(tmp: Path, out: str, record: str, *extra: str, data: Path | None = None) -> int:
    argv = [sys.executable, "-W", "error", str(EXAMPLE), "--out", str(tmp / out), "--quiet",
            "--record", str(tmp / record), *extra]  # fmt: skip
    if data is not None:
        argv += ["--data", str(data)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode in (0, 17), done.stdout + done.stderr
    return done.returncode


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    assert run(tmp, "a", "a.jsonl") == 0  # writes the demo store under a/data
    return tmp, tmp / "a" / "data", lines(tmp / "a.jsonl")


def test_lightning_trains_two_epochs_of_the_stream(uninterrupted):
    _, _, records = uninterrupted
    assert [r["step"] for r in records] == list(range(STEPS))
    assert [r["epoch"] for r in records] == [0] * (STEPS // 2) + [1] * (STEPS // 2)
    assert len({r["batch"] for r in records}) == STEPS  # every batch a different draw
    assert records[-1]["loss"] < records[0]["loss"]


def test_a_killed_run_resumes_with_the_batches_of_the_uninterrupted_run(uninterrupted):
    tmp, data, reference = uninterrupted
    by_step = {r["step"]: r for r in reference}
    assert run(tmp, "b", "b.jsonl", "--die-at-step", "60", data=data) == 17
    killed = lines(tmp / "b.jsonl")
    # training_step sees global_step 0..59; the kill comes once step 60 is done counting
    assert [r["step"] for r in killed] == list(range(60))
    assert all(r["batch"] == by_step[r["step"]]["batch"] for r in killed)

    assert run(tmp, "b", "c.jsonl", "--resume", "--die-at-step", "130", data=data) == 17
    resumed = lines(tmp / "c.jsonl")
    # From the last checkpoint (step 50), the same steps with the same batches.
    assert [r["step"] for r in resumed] == list(range(50, 130))
    assert [r["batch"] for r in resumed] == [by_step[s]["batch"] for s in range(50, 130)]

    assert run(tmp, "b", "d.jsonl", "--resume", data=data) == 0
    again = lines(tmp / "d.jsonl")
    assert [r["step"] for r in again] == list(range(125, STEPS))
    assert [r["batch"] for r in again] == [by_step[s]["batch"] for s in range(125, STEPS)]
    assert [r["epoch"] for r in again] == [1] * len(again)
    # The model and optimizer resume too: the losses agree (to float noise of CPU threads).
    for r in resumed + again:
        assert r["loss"] == pytest.approx(by_step[r["step"]]["loss"], rel=1e-4)


ZAPBENCH = EXAMPLE.parent / "zapbench_like.py"
CONDITIONS = ["gain", "dots", "flash", "taxis", "turning", "position", "open_loop", "rotation",
              "dark"]  # fmt: skip


def test_zapbench_like_trains_resident_and_streamed_to_equal_losses(tmp_path):
    """examples/zapbench_like.py at a small size: both modes, every condition, equal losses."""
    pytest.importorskip("tensorstore")
    data, figures = tmp_path / "data", tmp_path / "runs.json"
    argv = [sys.executable, "-W", "error", str(ZAPBENCH), "--out", str(data), "--timesteps",
            "2000", "--neurons", "64", "--epochs", "2", "--device", "cpu", "--json", str(figures)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    # the stores are what the example says: float16 zarr v3 with dead frames, a zarr v2 mask
    meta = json.loads((data / "traces.zarr" / "zarr.json").read_text())
    assert meta["data_type"] == "float16" and meta["shape"] == [2000 + 2 * 16, 64]
    assert (data / "mask.zarr" / ".zarray").is_file()
    runs = json.loads(figures.read_text())
    assert {name: r["mode"] for name, r in runs.items()} == {
        "resident": "resident", "streaming": "streaming"}  # fmt: skip
    for run in runs.values():
        assert len(run["train"]) == 2 and run["train"][1] < run["train"][0]  # it learns
        assert run["bytes"] > 0 and run["gb_per_s"] > 0
        for split in ("val", "test"):  # every condition, in order
            assert list(run[split]) == [f"{c}/{split}" for c in CONDITIONS]
            assert all(0 < v < float("inf") for v in run[split].values())
    res, streamed = runs["resident"], runs["streaming"]
    assert res["train"] == pytest.approx(streamed["train"], rel=1e-6)
    for split in ("val", "test"):
        assert res[split] == pytest.approx(streamed[split], rel=1e-6)
    out = done.stdout
    assert "resident and streamed losses equal: yes" in out
    rows = [r for r in map(str.split, out.splitlines()) if r and r[0] in CONDITIONS]
    assert [(r[0], r[1]) for r in rows] == [(c, s) for s in ("val", "test") for c in CONDITIONS]
    assert all(r[2] == r[3] for r in rows)  # the printed resident and streamed losses agree


def test_the_migration_example_trains_both_loops_the_same_steps(tmp_path):
    # examples/migrate_compat.py: the merged script's loop on compat, then BatchStream with
    # its defaults; the same model and steps, validation per epoch for each
    example = EXAMPLE.parent / "migrate_compat.py"
    argv = [sys.executable, "-W", "error", str(example), "--out", str(tmp_path),
            "--timesteps", "8192", "--neurons", "16", "--stim-dims", "4", "--epochs", "2"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["loop"], r["epoch"]) for r in records] == [
        ("compat", 0), ("compat", 1), ("batchstream", 0), ("batchstream", 1)]  # fmt: skip
    assert len({r["steps"] for r in records}) == 1  # equal steps per epoch
    assert all(r["val_loss"] > 0 for r in records)
    assert "100.0% of the split" in records[-1]["buffer"]  # the defaults hold the whole split


STAGGERED = Path(__file__).resolve().parents[1] / "examples" / "staggered_latents.py"


def test_staggered_latents_trains_validates_and_resumes_to_the_same_latents():
    """examples/staggered_latents.py (issue 49): a latent bank indexed by (recording,
    start // time_units) trains on BatchStream's defaults, validates on a held-out run,
    and a mid-epoch resume gives the same latent indices (asserted inside the example)."""
    argv = [sys.executable, "-W", "error", str(STAGGERED)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["train"][-1] < report["train"][0]
    assert report["val"] < report["val_baseline"]
    assert report["resumed_batches"] > 0
