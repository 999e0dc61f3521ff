"""The reference trainer: streaming moments, loss meters, the model, training and resume."""

from __future__ import annotations

import pytest
import torch

from chunkstream import ConfigError
from chunkstream.sources import NumpySource, ZarrSource, decode_scratch_nbytes
from chunkstream.tools import write_synthetic
from chunkstream.train import (
    PIECES_AUTO,
    LatentDynamics,
    LossMeter,
    RunningMoments,
    TimeSlice,
    TrainConfig,
    Trainer,
)


@pytest.fixture(scope="module")
def flyvis_source(tmp_path_factory):
    out = tmp_path_factory.mktemp("flyvis")
    write_synthetic(
        out, timesteps=3000, neurons=24, stim_dims=6, chunks=(256, 6, 1), progress=False
    )
    source = ZarrSource(
        str(out / "timeseries.zarr"),
        fields={"voltage": (slice(None), 0), "stimulus": (slice(0, 6), 1)},
    )
    yield source
    source.close()


def _config(**kwargs) -> TrainConfig:
    base = dict(chunk_size=512, batch_size=16, epochs=3, hidden_dim=64, latent_dim=16,
                device="cpu", progress=False, tensorboard=False, workers=1, seed=5)  # fmt: skip
    return TrainConfig(**{**base, **kwargs})


def test_running_moments_match_the_whole_data():
    x = torch.randn(1000, 7, dtype=torch.float64) * torch.arange(1, 8) + 3
    moments = RunningMoments(7)
    for part in x.split([1, 300, 0, 99, 600]):
        moments.update(part)
    assert moments.count == 1000
    torch.testing.assert_close(moments.mean, x.mean(0))
    torch.testing.assert_close(moments.var, x.var(0, unbiased=False))
    assert moments.constant_loss() == pytest.approx(float(((x - x.mean(0)) ** 2).mean()))
    restored = RunningMoments(7)
    restored.load_state_dict(moments.state_dict())
    torch.testing.assert_close(restored.mean, moments.mean)
    assert RunningMoments(3).constant_loss() == 0.0  # empty: no division by zero


def test_loss_meter_means_are_safe_when_empty():
    meter = LossMeter()
    assert meter.mean("rollout") == 0.0 and meter.means() == {}
    meter.add("recon", torch.tensor(1.0))
    meter.add("recon", torch.tensor(3.0))
    assert meter.mean("recon") == 2.0 and meter.count("recon") == 2
    assert meter.means() == {"recon": 2.0}


def test_model_rollout_shapes():
    model = LatentDynamics(10, 3, latent_dim=4, hidden_dim=8)
    x0, stim = torch.randn(5, 10), torch.randn(5, 7, 3)
    assert model.rollout(x0, stim, steps=3, time_units=2).shape == (5, 3, 10)
    assert model.reconstruct(torch.randn(5, 7, 10)).shape == (5, 7, 10)


def test_config_validation():
    with pytest.raises(ConfigError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="val_fraction"):
        TrainConfig(val_fraction=1.5)
    with pytest.raises(ConfigError, match=r"buffer='gpu'.*'auto', 'host' or 'device'"):
        TrainConfig(buffer="gpu")
    assert TrainConfig(time_units=2, evolve_multiple_steps=3).window == 7
    with pytest.raises(TypeError):
        TrainConfig(64)  # keyword-only


def test_time_slice_offsets_reads(flyvis_source):
    import numpy as np

    part = TimeSlice(flyvis_source, 100, 400)
    assert len(part) == 300
    out = {n: np.empty((10, *s.shape), s.dtype) for n, s in part.fields.items()}
    part.read_into(5, 15, out)
    full = {n: np.empty((10, *s.shape), s.dtype) for n, s in part.fields.items()}
    flyvis_source.read_into(105, 115, full)
    assert all(np.array_equal(out[n], full[n]) for n in out)


def test_trainer_beats_the_constant_baseline(flyvis_source, tmp_path):
    pytest.importorskip("tensorboard")
    trainer = Trainer(flyvis_source, _config(tensorboard=True), out_dir=tmp_path)
    result = trainer.fit()
    assert len(result.history) == 3
    assert "rollout" not in result.history[0].losses  # warm-up: reconstruction only
    assert {"recon", "rollout", "loss"} <= set(result.history[-1].losses)
    assert result.val_loss < 0.7 * result.baseline_val
    assert result.baseline_train > 0
    assert result.latency["num_chunks"] == sum(r.chunks for r in result.history)
    assert result.memory["train_split"] == trainer.train_len * (24 + 6) * 4
    assert (tmp_path / "checkpoint.pt").is_file()
    assert any((tmp_path / "tensorboard").iterdir())


def _fingerprints(seen: list):
    """An ``on_batch`` that records each batch's (epoch, sum): which batch, in which order."""

    def record(trainer, batch):
        seen.append((len(trainer.history), float(batch["voltage"].double().sum())))

    return record


class Killed(Exception):
    pass


def _killed_then_resumed(source, run, config, kill_at: int):
    """The batches a run killed after ``kill_at`` batches trained, and those its resumed
    run (from the last checkpoint) trained, and the resumed result."""
    seen: list = []
    record = _fingerprints(seen)

    def kill(trainer, batch):
        record(trainer, batch)
        if len(seen) == kill_at:
            raise Killed

    with pytest.raises(Killed):
        Trainer(source, config, out_dir=run, on_batch=kill).fit()
    again: list = []
    resumed = Trainer(source, config, out_dir=run, on_batch=_fingerprints(again)).fit(resume=True)
    return seen, again, resumed


# 5 chunks per epoch of 32 batches each (160 per epoch). mix=3: the checkpoints fall
# mid-buffer, and the resumed stream re-reads the held chunks, across the end of epoch 0
# (the buffer is kept across epochs); every=0: from the checkpoint at epoch 0's end;
# mix=7 holds more than an epoch, so the re-read spans two. A kill mid-chunk resumes
# from the last chunk's end the trainer saw the epoch go on after.
@pytest.mark.parametrize(
    ("mix", "kill_at", "every", "checkpointed"),
    [
        (1, 6 * 32 + 5, 1, 192),
        (3, 6 * 32 + 5, 1, 192),
        (3, 7 * 32, 0, 160),
        (7, 8 * 32 + 3, 1, 256),
    ],
)
def test_resume_continues_with_the_same_batches(
    flyvis_source, tmp_path, mix, kill_at, every, checkpointed
):
    full_seen: list = []
    trainer = Trainer(flyvis_source, _config(mix=mix), out_dir=tmp_path / "full",
                      on_batch=_fingerprints(full_seen))  # fmt: skip
    full = trainer.fit()
    assert trainer.stream is None  # the held chunks are released when fit() returns
    assert len(full_seen) == 3 * 160
    config = _config(checkpoint_every=every, mix=mix)
    seen, again, resumed = _killed_then_resumed(flyvis_source, tmp_path / "k", config, kill_at)
    assert seen == full_seen[:kill_at]  # the same batches in the same order
    assert len(full_seen) - len(again) == checkpointed
    assert again == full_seen[checkpointed:]  # the rest, exactly, after the checkpoint
    assert [r.epoch for r in resumed.history] == [0, 1, 2]
    # the same batches after the same model state: the same model at the end
    assert resumed.val_loss == pytest.approx(full.val_loss, rel=1e-4)


@pytest.mark.parametrize("mix", [1, 3])
def test_a_kill_after_an_epochs_last_chunk_keeps_that_epochs_record(flyvis_source, tmp_path, mix):
    # A checkpoint after every chunk: the kill comes right after epoch 0's last batch,
    # before its validation. The resumed run must still record epoch 0.
    full_seen: list = []
    full = Trainer(flyvis_source, _config(mix=mix), out_dir=tmp_path / "full",
                   on_batch=_fingerprints(full_seen)).fit()  # fmt: skip
    config = _config(checkpoint_every=1, mix=mix)
    seen, again, resumed = _killed_then_resumed(flyvis_source, tmp_path / "k", config, 160)
    assert [r.epoch for r in resumed.history] == [0, 1, 2]
    # The last chunk's training was not checkpointed: it is streamed and trained again.
    assert seen[:128] + again == full_seen
    assert resumed.val_loss == pytest.approx(full.val_loss, rel=1e-4)


def test_batch_seeds_are_a_hash_of_epoch_and_chunk_not_a_sum():
    # The trainer's batches are the stream's: seeded by a hash of (seed, epoch, chunk,
    # batch, rank). The old trainer's linear seed gave (epoch=1, index=0) and
    # (epoch=0, index=65537) one seed.
    from chunkstream.plans import hash_words, seed_key

    key = seed_key(0)
    assert hash_words(key, 1, 1, 0, 0, 0) != hash_words(key, 1, 0, 65537, 0, 0)


def test_the_trainer_draws_and_moves_no_batch_itself():
    # train/ keeps the model, the loss, validation and reporting; batches come from a
    # BatchStream (its draws, gathers and pinned copies), never from a loop of its own.
    from pathlib import Path

    import chunkstream.train

    folder = Path(chunkstream.train.__file__).parent
    text = {p.name: p.read_text() for p in folder.glob("*.py")}
    assert "_batches.py" not in text
    for name, body in text.items():
        for banned in ("ChunkMixer", ".gather(", ".to(self.device", "batch_seed"):
            assert banned not in body, (name, banned)
    assert "BatchStream(" in text["_trainer.py"]
    # no private module of another package
    assert "from ..consumer._" not in text["_trainer.py"]


def test_segments_hold_out_each_conditions_end_and_report_validation_per_segment(flyvis_source):
    segments = [(0, 900, "cond0"), (900, 2100, "cond1"), (2100, 3000, "cond2")]
    config = _config(segments=segments, pieces=8, epochs=2, batches_per_epoch=20,
                     chunk_size=256, val_fraction=0.2)  # fmt: skip
    trainer = Trainer(flyvis_source, config)
    assert trainer.pieces == 8
    result = trainer.fit()
    assert sorted(result.val_segments) == ["cond0/val", "cond1/val", "cond2/val"]
    assert all(v > 0 for v in result.val_segments.values())
    assert [r.batches for r in result.history] == [20, 20]
    train, plan = trainer.train_segments, trainer.loader.plan
    assert plan.segments == train
    seen = [p for e in range(2) for i in range(result.history[e].chunks) for p in plan.chunk(e, i)]
    assert seen
    for piece in seen:  # every streamed piece inside one training range, never held-out data
        seg = train[piece.segment]
        assert seg.start <= piece.start < piece.stop <= seg.stop and seg.name.endswith("/train")
    # validation is the mean over every held-out window: the per-segment losses bracket it
    assert min(result.val_segments.values()) <= result.val_loss <= max(result.val_segments.values())


def test_mix_auto_is_the_defaults_policy_sized_from_the_jobs_host_memory(
    flyvis_source, monkeypatch
):
    # on the CPU the buffer is host memory: with room, the whole pass over the split
    trainer = Trainer(flyvis_source, _config(epochs=1))
    chunks = trainer.plan.chunks_per_epoch
    assert TrainConfig().mix == "auto" and trainer.mix == chunks
    assert trainer.buffer.tier == "host" and trainer.buffer.split_share == 1.0
    assert trainer.buffer.memory.startswith("host memory: ")
    result = trainer.fit()
    assert result.memory["mixer"] == chunks * 512 * (24 + 6) * 4
    assert result.buffer is trainer.buffer
    # the job's memory capped: half of what it leaves beside the loader's arena (counted
    # once) and the stream's batch sets, in whole chunks
    chunk = 512 * (24 + 6) * 4
    scratch = decode_scratch_nbytes(flyvis_source)  # the fast path's per-thread chunk
    # the lane's sets on the CPU: 2 read ahead, 1 received, 1 held; each one batch of windows
    sets = 4 * trainer.config.batch_size * trainer.config.window * (24 + 6) * 4
    beside = trainer._loader_nbytes() + sets + scratch
    assert dict(trainer.buffer.terms)["the batch sets"] == sets
    assert dict(trainer.buffer.terms)["decode scratch"] == scratch > 0
    monkeypatch.setenv("CHUNKSTREAM_HOST_MEMORY", str(beside + 4 * chunk))
    capped = Trainer(flyvis_source, _config(epochs=1))
    assert capped.mix == 2 and "CHUNKSTREAM_HOST_MEMORY" in capped.buffer.memory
    # an int is kept; more chunks than a pass holds too, and the buffer says so
    assert Trainer(flyvis_source, _config(mix=2, epochs=1)).mix == 2
    many = Trainer(flyvis_source, _config(mix=99, epochs=1))
    assert many.mix == 99 and "more than the" in many.buffer.reason
    tiny = Trainer(flyvis_source, _config(mix=1, epochs=1)).fit()
    assert tiny.memory["mixer"] == 0


def test_pieces_auto_keeps_every_piece_a_whole_stored_chunk_and_an_int_is_kept(flyvis_source):
    # the fixture's zarr store has 256-step time chunks: 512-step chunks in 2 pieces
    assert TrainConfig().pieces == "auto" and PIECES_AUTO == 128
    trainer = Trainer(flyvis_source, _config(epochs=1, mix=1))
    assert trainer.pieces == 2
    trained = Trainer(flyvis_source, _config(epochs=1, mix=1))
    trained.fit()
    plan = trained.loader.plan
    seen = [p for i in range(trained.history[0].chunks) for p in plan.chunk(0, i)]
    assert seen and all(p.start % 256 == 0 and p.stop - p.start == 256 for p in seen)
    assert Trainer(flyvis_source, _config(pieces=8)).pieces == 8  # asked for: kept
    # a source without a stored grid (in memory): 128 pieces, fewer when a piece of
    # 512 // 128 = 4 steps would not hold the window of 5
    data = {"voltage": torch.randn(3000, 24).numpy(), "stimulus": torch.randn(3000, 6).numpy()}
    memory = NumpySource(data)
    assert Trainer(memory, _config()).pieces == 64
    assert Trainer(memory, _config(chunk_size=1024)).pieces == 128
    # a stored chunk that does not divide the piece: pieces of at least one, unaligned
    odd = Trainer(flyvis_source, _config(chunk_size=600, epochs=1, mix=1))
    assert odd.pieces == 2 and odd._align == 1
    odd.fit()


def test_a_source_that_learns_its_fields_later_is_refused_with_the_fix():
    import numpy as np

    from chunkstream.sources import CallableSource

    calls = []

    def load_fn(start, stop):
        calls.append((start, stop))
        return np.zeros((stop - start, 4), np.float32), np.zeros((stop - start, 2), np.float32)

    source = CallableSource(load_fn, 5000, specs="first")
    with pytest.raises(ConfigError, match=r"source='CallableSource'.*fields are known.*specs"):
        Trainer(source, TrainConfig(device="cpu", epochs=1, progress=False, tensorboard=False))
    assert calls == []
