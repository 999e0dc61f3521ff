"""The reference trainer on recordings of different widths counts only real neurons (issue 49)."""

from __future__ import annotations

import numpy as np
import torch

import chunkstream as cs
from chunkstream.train import TrainConfig, Trainer
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
    base = dict(chunk_size=300, batch_size=8, epochs=1, hidden_dim=16, latent_dim=8,
                device="cpu", progress=False, tensorboard=False, workers=1, seed=3,
                data_field="data", stim_field=None, time_units=2, evolve_multiple_steps=3)  # fmt: skip
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
