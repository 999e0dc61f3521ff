"""ZarrGroupSource and flyvis.open on the layout `chunkstream convert` writes."""

from __future__ import annotations

import numpy as np
import pytest

import chunkstream as cs
from chunkstream.sources import ZarrGroupSource
from chunkstream.tools._convert import convert_store, flyvis_fields
from tests.stores import make_array, make_flyvis


def test_converted_flyvis_store_streams_with_the_same_fields(tmp_path):
    data = make_flyvis(tmp_path / "run", 600, 12, chunks=(100, 12, 1))
    out = tmp_path / "converted"
    convert_store(
        tmp_path / "run", out, fields=flyvis_fields("voltage", 5), chunk_mb=0.01, progress=False
    )
    with cs.flyvis.open(out, column="voltage", stim_dims=5) as src:
        assert isinstance(src, ZarrGroupSource)
        assert list(src.fields) == ["voltage", "stimulus"]
        assert src.fields["stimulus"].shape == (5,)
        assert all(f == 1.0 for f in src.read_amplification.values())
        with cs.ChunkLoader(src, 64, device="cpu", workers=2, seed=0) as loader:
            for chunk in loader.epoch(6):
                np.testing.assert_array_equal(
                    chunk["voltage"].numpy(), data[chunk.start : chunk.stop, :, 0]
                )
                np.testing.assert_array_equal(
                    chunk["stimulus"].numpy(), data[chunk.start : chunk.stop, :5, 1]
                )


def test_group_fields_by_name_and_index_and_errors(tmp_path):
    import zarr

    zarr.open_group(tmp_path / "g", mode="w")
    a = make_array(tmp_path / "g" / "a", np.arange(400, dtype=np.float32).reshape(100, 4), (10, 4))
    b = make_array(tmp_path / "g" / "b", np.arange(200, dtype=np.int16).reshape(100, 2), (25, 2))
    with ZarrGroupSource(tmp_path / "g") as src:
        assert sorted(src.fields) == ["a", "b"] and len(src) == 100
        out = {n: np.empty((30, *s.shape), s.dtype) for n, s in src.fields.items()}
        src.read_into(40, 70, out)
        np.testing.assert_array_equal(out["a"], a[40:70])
        np.testing.assert_array_equal(out["b"], b[40:70])
    with (
        pytest.warns(cs.ReadAmplificationWarning, match="'first'"),
        ZarrGroupSource(tmp_path / "g", {"first": ("a", (slice(0, 2),)), "bb": "b"}) as src,
    ):
        assert src.fields["first"].shape == (2,)
    with pytest.raises(cs.ConfigError, match="fields\\['x'\\]"):
        ZarrGroupSource(tmp_path / "g", {"x": "missing"})
    with pytest.raises(cs.SourceNotFoundError):
        ZarrGroupSource(tmp_path / "nope")
    make_array(tmp_path / "g" / "short", np.zeros((50, 1), np.float32), (10, 1))
    with pytest.raises(cs.FieldLengthError):
        ZarrGroupSource(tmp_path / "g")
