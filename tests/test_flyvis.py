"""The FlyVis layout: column ids, flyvis.open, read_metadata, make_load_fn, write."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from chunkstream import flyvis
from chunkstream._errors import ConfigError, ReadAmplificationWarning, SourceNotFoundError
from chunkstream.sources import ZarrSource
from tests.stores import make_flyvis

T, N, STIM = 40, 8, 4


@pytest.fixture
def run(tmp_path):
    # chunks split N at STIM, so neither field decodes what it does not use
    data = make_flyvis(tmp_path / "run", T, N, chunks=(16, STIM, 1))
    return tmp_path / "run", data


def test_column_ids():
    layout = [flyvis.INDEX, flyvis.XPOS, flyvis.YPOS, flyvis.VOLTAGE, flyvis.STIMULUS,
              flyvis.GROUP_TYPE, flyvis.TYPE, flyvis.CALCIUM, flyvis.FLUORESCENCE]  # fmt: skip
    assert layout == list(range(9))
    assert [k for _, k in flyvis.DYNAMIC_COLUMNS.values()] == [0, 1, 2, 3]


@pytest.mark.parametrize("column, k", [("voltage", 0), (flyvis.CALCIUM, 2), ("fluorescence", 3)])
def test_open_gives_column_and_stimulus(run, column, k):
    path, data = run
    with flyvis.open(path, column=column, stim_dims=STIM) as src:
        assert isinstance(src, ZarrSource) and len(src) == T
        name = flyvis.DYNAMIC_COLUMNS[flyvis._BY_NAME.get(column, column)][0]
        assert list(src.fields) == [name, "stimulus"]
        out = {n: np.full((T, *f.shape), np.nan, f.dtype) for n, f in src.fields.items()}
        src.read_into(5, 37, out)
        np.testing.assert_array_equal(out[name][:32], data[5:37, :, k])
        np.testing.assert_array_equal(out["stimulus"][:32], data[5:37, :STIM, 1])


def test_open_stimulus_column_alone(run):
    path, _ = run
    with flyvis.open(path, column="stimulus", stim_dims=STIM) as src:
        assert list(src.fields) == ["stimulus"]


@pytest.mark.parametrize("column", [flyvis.XPOS, "type", flyvis.INDEX])
def test_static_column_says_read_metadata(run, column):
    with pytest.raises(ConfigError, match="read_metadata"):
        flyvis.open(run[0], column=column, stim_dims=STIM)


@pytest.mark.parametrize("column", [9, "speed", -1])
def test_unknown_column(run, column):
    with pytest.raises(ConfigError, match="voltage"):
        flyvis.open(run[0], column=column)


def test_missing_run(tmp_path):
    with pytest.raises(SourceNotFoundError, match="timeseries"):
        flyvis.open(tmp_path / "none")
    with pytest.raises(SourceNotFoundError, match="metadata"):
        flyvis.read_metadata(tmp_path / "none")


def test_read_metadata(run):
    meta = flyvis.read_metadata(run[0])
    assert meta.shape == (N, 5)
    np.testing.assert_array_equal(meta[:, 0], np.arange(N))


def test_make_load_fn(run):
    path, data = run
    load_fn = flyvis.make_load_fn(path, flyvis.VOLTAGE, flyvis.STIMULUS, STIM)
    x, s = load_fn(3, 20)
    np.testing.assert_array_equal(x, data[3:20, :, 0])
    np.testing.assert_array_equal(s, data[3:20, :STIM, 1])
    x2, _ = load_fn(30, T + 100)  # end clamps to the data
    assert x2.shape == (T - 30, N)
    x[...] = 0  # fresh arrays each call: the caller may keep and change them
    np.testing.assert_array_equal(load_fn(3, 20)[0], data[3:20, :, 0])
    with pytest.raises(ConfigError, match="metadata"):
        flyvis.make_load_fn(path, flyvis.YPOS, flyvis.STIMULUS, STIM)
    load_fn.source.close()


def test_per_column_chunks_warn_for_a_short_stimulus(tmp_path):
    make_flyvis(tmp_path / "r", T, N, chunks=(16, N, 1), codec="zstd", zarr_format=2)
    with pytest.warns(ReadAmplificationWarning, match=r"'stimulus'.*2\.0x"):
        src = flyvis.open(tmp_path / "r", stim_dims=STIM)
    assert src.read_amplification == {"voltage": 1.0, "stimulus": 2.0}
    src.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadAmplificationWarning)
        flyvis.open(tmp_path / "r", stim_dims=N).close()


def test_write_validates_shapes(tmp_path):
    with pytest.raises(ConfigError, match=r"timeseries\.shape"):
        flyvis.write(tmp_path, np.zeros((4, 3, 5), "f4"), np.zeros((3, 5), "f4"))
    with pytest.raises(ConfigError, match=r"metadata\.shape"):
        flyvis.write(tmp_path, np.zeros((4, 3, 4), "f4"), np.zeros((2, 5), "f4"))
