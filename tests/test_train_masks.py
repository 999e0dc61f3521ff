"""The reference trainer on recordings of different widths counts only real neurons (issue 49)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import chunkstream as cs
import chunkstream.train
from chunkstream.consumer import gather_windows
from chunkstream.train import TrainConfig, Trainer
from chunkstream.train._heldout import evaluate
from chunkstream.train._metrics import masked_mse
from tests.stores import make_array, random_data


def _recordings(tmp_path):
    wide = make_array(tmp_path / "wide.zarr", random_data((1200, 8), seed=1), chunks=(100, 8))
    narrow = make_array(tmp_path / "narrow.zarr", random_data((900, 6), seed=2), chunks=(100, 6))
    recs = cs.Recordings(
        [cs.ZarrSource(str(tmp_path / "wide.zarr")), cs.ZarrSource(str(tmp_path / "narrow.zarr"))]
    )
    return recs, wide, narrow


def _config(**kw):
    base = dict(
        chunk_size=300,
        batch_size=8,
        epochs=1,
        hidden_dim=16,
        latent_dim=8,
        device="cpu",
        progress=False,
        tensorboard=False,
        workers=1,
        seed=3,
        data_field="data",
        stim_field=None,
        time_units=2,
        evolve_multiple_steps=3,
    )
    return TrainConfig(**{**base, **kw})


def test_masked_mse_ignores_padded_values():
    pred, target = torch.randn(4, 5, 8), torch.randn(4, 5, 8)
    mask = torch.ones(4, 5, 8, dtype=torch.bool)
    mask[2:, :, 6:] = False
    target[2:, :, 6:] = 0.0  # zero padding
    real = torch.cat(
        [((pred - target) ** 2)[:2].reshape(-1), ((pred - target) ** 2)[2:, :, :6].reshape(-1)]
    )
    torch.testing.assert_close(masked_mse(pred, target, mask), real.mean())
    assert not torch.isclose(torch.nn.functional.mse_loss(pred, target), real.mean())


def test_the_loss_on_padded_recordings_equals_the_loss_on_unpadded_ones(tmp_path):
    recs, _, narrow = _recordings(tmp_path)
    trainer = Trainer(recs, _config())
    assert trainer.mask_field == "data_mask"
    model = trainer.model
    with torch.no_grad():  # a decoder that predicts something at the padded neurons too
        model.decoder.bias.fill_(0.5)
    starts = [0, 37, 200, 511]
    # The narrow recording's windows, padded as the stream gives them (8 neurons, 2 zeros).
    w = trainer.config.window
    x6 = torch.from_numpy(np.stack([narrow[s : s + w] for s in starts]))
    x8 = torch.nn.functional.pad(x6, (0, 2))
    mask = torch.zeros_like(x8, dtype=torch.bool)
    mask[..., :6] = True
    with torch.no_grad():
        padded = trainer._losses(x8, None, False, mask)
        # Unpadded: the same model's outputs, scored on the 6 neurons the recording has.
        recon_x, pred = model(x8, None, 3, 2)
        step = slice(2, None, 2)
        recon = ((recon_x[..., :6] - x6) ** 2).mean()
        rollout = ((pred[..., :6] - x6[:, step]) ** 2).mean()
        unmasked = trainer._losses(x8, None, False, None)
    torch.testing.assert_close(padded["recon"], recon)
    torch.testing.assert_close(padded["rollout"], rollout)
    torch.testing.assert_close(padded["loss"], rollout + trainer.config.recon_weight * recon)
    assert not torch.isclose(unmasked["loss"], padded["loss"])  # zero padding would change it


def test_a_trainer_on_padded_recordings_trains_and_validates(tmp_path):
    recs, _, _ = _recordings(tmp_path)
    seen = []
    trainer = Trainer(recs, _config(), on_batch=lambda t, b: seen.append(set(b)))
    result = trainer.fit()
    assert seen and all(keys == {"data", "data_mask", "start", "recording"} for keys in seen)
    assert np.isfinite(result.val_loss) and np.isfinite(result.baseline_val)
    recs.close()


# -- the baseline's moments and the validation metrics count only real neurons -----------


def _unpadded_moments(rows_of: list[np.ndarray], neurons: int) -> tuple[np.ndarray, np.ndarray]:
    """Per neuron, the mean and population variance over the recordings that have it."""
    mean, var = np.zeros(neurons), np.zeros(neurons)
    for n in range(neurons):
        values = np.concatenate([r[:, n] for r in rows_of if r.shape[1] > n]).astype(np.float64)
        mean[n], var[n] = values.mean(), values.var()
    return mean, var


def test_masked_moments_equal_those_of_the_unpadded_recordings():
    rng = np.random.default_rng(0)
    wide, narrow = rng.normal(2.0, 1.5, (300, 8)), rng.normal(-1.0, 0.5, (200, 6))
    padded = np.concatenate([wide, np.pad(narrow, ((0, 0), (0, 2)))])
    mask = np.concatenate(
        [np.ones((300, 8), bool), np.pad(np.ones((200, 6), bool), ((0, 0), (0, 2)))]
    )
    moments = chunkstream.train.RunningMoments(8)
    for part, m in zip(np.array_split(padded, 7), np.array_split(mask, 7), strict=True):
        moments.update(torch.from_numpy(part), torch.from_numpy(m))  # blocks across the border
    mean, var = _unpadded_moments([wide, narrow], 8)
    np.testing.assert_allclose(moments.mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(moments.var.numpy(), var, rtol=1e-12)
    assert moments.counts.tolist() == [500.0] * 6 + [300.0] * 2 and moments.count == 500
    real = np.concatenate([(wide - mean) ** 2, (narrow - mean[:6]) ** 2], axis=None)
    assert moments.constant_loss() == pytest.approx(real.mean(), rel=1e-12)
    # The zero padding would change the baseline: the unmasked moments of the same rows.
    plain = chunkstream.train.RunningMoments(8)
    plain.update(torch.from_numpy(padded))
    assert not np.allclose(plain.mean.numpy()[6:], mean[6:])
    # Merging and restoring keep the per-neuron counts.
    halves = [chunkstream.train.RunningMoments(8) for _ in range(2)]
    halves[0].update(torch.from_numpy(padded[:250]), torch.from_numpy(mask[:250]))
    halves[1].update(torch.from_numpy(padded[250:]), torch.from_numpy(mask[250:]))
    halves[0].merge(halves[1])
    restored = chunkstream.train.RunningMoments(8)
    restored.load_state_dict(halves[0].state_dict())
    torch.testing.assert_close(restored.mean, moments.mean)
    torch.testing.assert_close(restored.m2, moments.m2)
    torch.testing.assert_close(restored.counts, moments.counts)


def test_a_state_without_per_neuron_counts_reads_as_every_row_counted():
    x = torch.randn(40, 3, dtype=torch.float64)
    moments = chunkstream.train.RunningMoments(3)
    moments.update(x)
    old = {k: v for k, v in moments.state_dict().items() if k != "counts"}
    restored = chunkstream.train.RunningMoments(3)
    restored.load_state_dict(old)
    assert restored.counts.tolist() == [40.0] * 3
    assert restored.constant_loss() == pytest.approx(moments.constant_loss())


def test_the_trainer_baseline_counts_the_unpadded_values_and_refuses_an_old_checkpoint(tmp_path):
    recs, wide, narrow = _recordings(tmp_path)
    arrays = [wide[:], narrow[:]]
    windows: list[list[np.ndarray]] = [[], []]

    def record(trainer, batch):  # each window read from its own unpadded recording
        w = trainer.config.window
        for s, r in zip(batch["start"].tolist(), batch["recording"].tolist(), strict=True):
            windows[r].append(arrays[r][s : s + w])

    trainer = Trainer(recs, _config(), out_dir=tmp_path / "run", on_batch=record)
    result = trainer.fit()
    mean, var = _unpadded_moments([np.concatenate(w) for w in windows], 8)
    np.testing.assert_allclose(trainer.moments.mean.cpu().numpy(), mean, rtol=1e-9)
    np.testing.assert_allclose(trainer.moments.var.cpu().numpy(), var, rtol=1e-9)
    real = np.concatenate(
        [
            ((np.concatenate(w) - mean[: a.shape[1]]) ** 2).ravel()
            for w, a in zip(windows, arrays, strict=True)
        ]
    )
    assert result.baseline_train == pytest.approx(real.mean(), rel=1e-9)
    # A checkpoint whose moments counted the padding (no per-neuron counts) is refused.
    path = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    del state["moments"]["counts"]
    torch.save(state, path)
    with pytest.raises(cs.ConfigError, match=r"per-neuron counts(.|\n)*start afresh"):
        Trainer(recs, _config(), out_dir=tmp_path / "run").fit(resume=True)
    recs.close()


def test_validation_metrics_on_padded_windows_equal_those_on_the_unpadded_ones(tmp_path):
    recs, _, narrow = _recordings(tmp_path)
    trainer = Trainer(recs, _config())
    c = trainer.config
    with torch.no_grad():  # a decoder that predicts something at the padded neurons too
        trainer.model.decoder.bias.fill_(0.5)
    x6 = torch.from_numpy(narrow[:400])
    part = {
        "data": torch.nn.functional.pad(x6, (0, 2)),
        "data_mask": torch.zeros(400, 8, dtype=torch.bool),
    }
    part["data_mask"][:, :6] = True
    starts = torch.arange(0, 400 - c.window + 1, 7)
    mean = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)  # nonzero at the padded neurons
    total, base, count = evaluate(
        trainer.model, [("narrow", part, starts)], mean, c, 8, "data_mask"
    )[0]
    # Unpadded: the model's rollout (fed the windows as the stream gives them) and the
    # baseline, scored on the 6 neurons the recording has.
    with torch.no_grad():
        x8 = gather_windows(part["data"], starts, c.window)
        pred = trainer.model.rollout(x8[:, 0], None, c.evolve_multiple_steps, c.time_units)
        target = gather_windows(x6, starts, c.window)[:, c.time_units :: c.time_units]
    want = ((pred[..., :6] - target) ** 2).double()
    assert count == target.numel()
    assert total / count == pytest.approx(float(want.mean()), rel=1e-6)
    assert base / count == pytest.approx(
        float(((target.double() - mean[:6]) ** 2).mean()),
        rel=1e-6,  # the mean in float32
    )
    unmasked = evaluate(trainer.model, [("narrow", part, starts)], mean, c, 8)[0]
    assert unmasked[1] / unmasked[2] != pytest.approx(float(base / count))  # padding would count
    recs.close()
