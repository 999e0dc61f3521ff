"""inspect_store and read_amplification on real zarr stores in tmp_path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from chunkstream import ConfigError, FieldSelectionError, NotZarrError, SourceNotFoundError
from chunkstream.tools import inspect_store, parse_field, read_amplification


def _array(path, shape, chunks, zarr_format=3):
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32",
                            zarr_format=zarr_format, compressors=None)  # fmt: skip
    arr[:] = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return arr


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_interleaved_column_amplification_is_4x(tmp_path, zarr_format):
    _array(tmp_path / "ts.zarr", (40, 6, 4), (10, 6, 4), zarr_format)
    report = inspect_store(tmp_path / "ts.zarr", ["voltage=:,0"])
    (field,) = report.fields
    assert field.amplification == pytest.approx(4.0)
    assert field.shape == (6,) and field.used_bytes_per_step == 24
    assert "interleaved" in field.verdict and "chunkstream convert" in field.verdict
    assert "--fields voltage=:,0" in report.verdicts[0]
    (arr,) = report.arrays
    assert arr.grid == (4, 1, 1) and arr.chunk_bytes == 10 * 6 * 4 * 4
    assert arr.missing_chunks == 0 and arr.stored_bytes > 0


def test_per_column_chunks_amplification_is_1x(tmp_path):
    _array(tmp_path / "ts.zarr", (40, 6, 4), (10, 6, 1))
    (field,) = inspect_store(tmp_path / "ts.zarr", ["voltage=:,0"]).fields
    assert field.amplification == pytest.approx(1.0)
    assert field.verdict.startswith("ok")


def test_deleted_chunk_file_is_missing(tmp_path):
    _array(tmp_path / "ts.zarr", (40, 6, 4), (10, 6, 4))
    (tmp_path / "ts.zarr" / "c" / "2" / "0" / "0").unlink()
    report = inspect_store(tmp_path / "ts.zarr")
    assert report.arrays[0].missing_chunks == 1
    assert report.arrays[0].missing_examples == ["c/2/0/0"]
    assert any(v.startswith("missing") for v in report.verdicts)


def test_directory_of_stores_and_json(tmp_path):
    _array(tmp_path / "timeseries.zarr", (20, 5, 4), (5, 5, 4))
    _array(tmp_path / "metadata.zarr", (5, 5), (5, 5), zarr_format=2)
    report = inspect_store(tmp_path, ["voltage=:,0", "stim=metadata[0:2]"], window=5)
    assert sorted(a.name for a in report.arrays) == ["metadata", "timeseries"]
    assert [f.array for f in report.fields] == ["timeseries", "metadata"]
    assert report.fields[0].window_amplification == pytest.approx(4.0 * 9 / 5)
    json.loads(json.dumps(report.to_dict()))


def test_group_members_are_walked(tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_group("sub").create_array("x", shape=(8, 3), chunks=(4, 3), dtype="f4")[:] = 1
    report = inspect_store(tmp_path / "g.zarr")
    assert [a.name for a in report.arrays] == ["sub/x"]


def test_read_amplification_is_a_function_of_chunks_and_selection():
    assert read_amplification((100, 10, 4), (10, 10, 4), (slice(None), 0)) == 4.0
    assert read_amplification((100, 10, 4), (10, 10, 4), ()) == 1.0
    # 3 of the first 5-wide chunk along axis 1: 5/3.
    assert read_amplification((100, 10), (10, 5), (slice(0, 3),)) == pytest.approx(5 / 3)
    # Edge chunk is shorter: index 9 of length 10 in chunks of 4 decodes 2 elements.
    assert read_amplification((100, 10), (10, 4), (9,)) == 2.0
    assert read_amplification((100, 10), (10, 10), (), window=10) == pytest.approx(19 / 10)


def test_parse_field_syntax():
    req = parse_field("stimulus=0:1736,1")
    assert req.index == (slice(0, 1736), 1) and req.array is None
    req = parse_field("voltage=timeseries[:,0]")
    assert req.array == "timeseries" and req.index == (slice(None), 0)
    with pytest.raises(ConfigError):
        parse_field("voltage")
    with pytest.raises(ConfigError):
        parse_field("voltage=a:b")


def test_errors(tmp_path):
    with pytest.raises(SourceNotFoundError):
        inspect_store(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotZarrError):
        inspect_store(tmp_path / "plain")
    _array(tmp_path / "ts.zarr", (20, 5, 4), (5, 5, 4))
    with pytest.raises(FieldSelectionError, match="out of range"):
        inspect_store(tmp_path / "ts.zarr", ["voltage=:,4"])
    with pytest.raises(FieldSelectionError):
        inspect_store(tmp_path / "ts.zarr", ["voltage=:,0,0"])
