"""write_synthetic / ensure_synthetic on real zarr stores in tmp_path."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from chunkstream import ConfigError
from chunkstream.tools import ensure_synthetic, inspect_store, write_synthetic

SMALL = dict(timesteps=300, neurons=40, stim_dims=8, progress=False)


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("codec", ["none", "blosc-zstd", "blosc-lz4", "zstd"])
def test_flyvis_layout_shape_dtype_chunks_codec(tmp_path, zarr_format, codec):
    info = write_synthetic(
        tmp_path / "run", zarr_format=zarr_format, codec=codec, chunks=(64, 40, 4), **SMALL
    )
    ts = zarr.open_array(str(tmp_path / "run" / "timeseries.zarr"), mode="r")
    meta = zarr.open_array(str(tmp_path / "run" / "metadata.zarr"), mode="r")
    assert ts.shape == (300, 40, 4) and ts.dtype == np.float32 and ts.chunks == (64, 40, 4)
    assert meta.shape == (40, 5)
    assert ts.metadata.zarr_format == zarr_format
    names = inspect_store(tmp_path / "run").arrays[1].codecs
    if codec == "none":
        assert not any("blosc" in n or "zstd" in n for n in names)
    else:
        assert any(codec.split("-")[-1] in n for n in names)
    assert info.shapes["timeseries"] == (300, 40, 4)
    np.testing.assert_array_equal(meta[:, 0], np.arange(40))
    data = ts[:]
    assert np.isfinite(data).all()
    # Stimulus column is zero beyond stim_dims; the voltage is not constant.
    assert not data[:, 8:, 1].any() and data[:, :8, 1].std() > 0
    assert data[:, :, 0].std() > 0.01


def test_deterministic_for_a_seed(tmp_path):
    a = write_synthetic(tmp_path / "a", seed=3, **SMALL)
    b = write_synthetic(tmp_path / "b", seed=3, **SMALL)
    c = write_synthetic(tmp_path / "c", seed=4, **SMALL)
    read = [zarr.open_array(i.arrays["timeseries"], mode="r")[:] for i in (a, b, c)]
    np.testing.assert_array_equal(read[0], read[1])
    assert not np.array_equal(read[0], read[2])


def test_voltage_is_not_white_noise_and_compresses(tmp_path):
    kw = dict(SMALL, timesteps=2000, neurons=64)
    raw = write_synthetic(tmp_path / "raw", codec="none", **kw)
    packed = write_synthetic(tmp_path / "packed", codec="blosc-zstd", **kw)
    v = zarr.open_array(raw.arrays["timeseries"], mode="r")[:, :, 0]
    x = v - v.mean(axis=0)
    lag1 = float((x[1:] * x[:-1]).sum() / (x * x).sum())
    assert lag1 > 0.5
    sizes = [inspect_store(p).arrays[1].stored_bytes for p in (raw.out, packed.out)]
    assert sizes[0] / sizes[1] > 1.0


def test_connectivity_is_csr(tmp_path):
    write_synthetic(tmp_path / "run", **SMALL)
    csr = np.load(tmp_path / "run" / "connectivity.npz")
    indptr, indices = csr["indptr"], csr["indices"]
    assert indptr.shape == (41,) and indptr[-1] == indices.size == csr["data"].size
    assert indices.min() >= 0 and indices.max() < 40
    rows = np.repeat(np.arange(40), np.diff(indptr))
    assert not (rows == indices).any()  # no self-connections


def test_arrays_layout(tmp_path):
    info = write_synthetic(tmp_path / "run", layout="arrays", chunks=(50, 40), **SMALL)
    volt = zarr.open_array(info.arrays["voltage"], mode="r")
    stim = zarr.open_array(info.arrays["stimulus"], mode="r")
    assert volt.shape == (300, 40) and volt.chunks == (50, 40)
    assert stim.shape == (300, 8) and stim.chunks == (50, 8)


def test_slabs_cover_every_timestep(tmp_path, monkeypatch):
    # A tiny slab budget forces many slabs; no chunk may be left at the fill value.
    import chunkstream.tools._synth as synth_mod

    monkeypatch.setattr(synth_mod, "_SLAB_BYTES", 1)
    info = write_synthetic(tmp_path / "run", chunks=(7, 40, 4), **SMALL)
    volt = zarr.open_array(info.arrays["timeseries"], mode="r")[:, :, 0]
    assert (np.abs(volt).sum(axis=1) > 0).all()


def test_ensure_synthetic_caches(tmp_path):
    out = tmp_path / "run"
    first = ensure_synthetic(out, **SMALL)
    stamp = (out / "timeseries.zarr" / "zarr.json").stat().st_mtime_ns
    again = ensure_synthetic(out, **SMALL)
    assert again == first
    assert (out / "timeseries.zarr" / "zarr.json").stat().st_mtime_ns == stamp
    other = ensure_synthetic(out, **dict(SMALL, seed=9))
    assert other.seed == 9


@pytest.mark.parametrize(
    "kwargs",
    [dict(layout="cube"), dict(timesteps=0), dict(stim_dims=99), dict(dtype="int32"),
     dict(chunks=(10, 40)), dict(codec="gzip"), dict(zarr_format=4)],
)  # fmt: skip
def test_bad_arguments_raise_config_error(tmp_path, kwargs):
    args = dict(SMALL, **kwargs)
    with pytest.raises(ConfigError):
        write_synthetic(tmp_path / "run", **args)


def test_existing_dataset_needs_overwrite(tmp_path):
    write_synthetic(tmp_path / "run", **SMALL)
    with pytest.raises(ConfigError, match="overwrite"):
        write_synthetic(tmp_path / "run", **SMALL)
    write_synthetic(tmp_path / "run", overwrite=True, **SMALL)


def test_regimes_write_blocks_with_their_own_statistics_and_a_segments_file(tmp_path):
    import chunkstream as cs
    from chunkstream.tools._synth import regime_bounds

    def block_means(out, regimes):
        write_synthetic(out, timesteps=900, neurons=16, stim_dims=4, regimes=regimes,
                        progress=False)  # fmt: skip
        v = zarr.open_array(str(out / "timeseries.zarr"))[:, :, 0]
        return np.stack([v[a:b].mean(0) for a, b in regime_bounds(900, 3)])

    plain = block_means(tmp_path / "plain", 1)
    changing = block_means(tmp_path / "regimes", 3)
    assert not (tmp_path / "plain" / "regimes.csv").exists()
    segs = cs.Segments.read(tmp_path / "regimes" / "regimes.csv")
    assert [(s.start, s.stop, s.name) for s in segs] == [
        (0, 300, "regime0"),
        (300, 600, "regime1"),
        (600, 900, "regime2"),
    ]
    # the blocks differ from each other far more than the blocks of a plain recording
    assert changing.std(0).mean() > 3 * plain.std(0).mean()
