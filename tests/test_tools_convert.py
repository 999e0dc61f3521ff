"""convert_store on real zarr stores in tmp_path: exact, resumable, read-only on IN."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import zarr

from chunkstream import ConfigError, CorruptChunkError, FieldLengthError
from chunkstream.tools import convert_store, flyvis_fields, write_synthetic
from chunkstream.tools._convert import PROGRESS

FIELDS = ["voltage=:,0", "stimulus=0:8,1"]
# 40 neurons * 4 B = 160 B per voltage step: 0.005 MiB -> 32-step chunks, 10 voltage slabs.
CHUNK_MB = 32 * 160 / 2**20


@pytest.fixture
def store(tmp_path):
    info = write_synthetic(tmp_path / "run", timesteps=300, neurons=40, stim_dims=8,
                           chunks=(50, 40, 4), codec="blosc-zstd", zarr_format=2,
                           progress=False)  # fmt: skip
    return tmp_path / "run", zarr.open_array(info.arrays["timeseries"], mode="r")[:]


def _snapshot(root):
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                   hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*")) if p.is_file()
    }  # fmt: skip


def test_round_trip_is_exact(store, tmp_path):
    path, data = store
    report = convert_store(path / "timeseries.zarr", tmp_path / "out", fields=FIELDS,
                           chunk_mb=CHUNK_MB, workers=3, progress=False)  # fmt: skip
    assert report.verified and report.slabs_skipped == 0
    volt = zarr.open_array(str(tmp_path / "out" / "voltage"), mode="r")
    stim = zarr.open_array(str(tmp_path / "out" / "stimulus"), mode="r")
    assert volt.chunks == (32, 40) and volt.metadata.zarr_format == 3
    np.testing.assert_array_equal(volt[:], data[:, :, 0])
    np.testing.assert_array_equal(stim[:], data[:, :8, 1])
    assert report.fields[0].checksum_in == report.fields[0].checksum_out
    attrs = zarr.open_group(str(tmp_path / "out"), mode="r").attrs["chunkstream"]
    assert attrs["fields"] == {"voltage": "timeseries[:,0]", "stimulus": "timeseries[0:8,1]"}
    assert not (tmp_path / "out" / PROGRESS).exists()


def test_never_touches_input(store, tmp_path):
    path, _ = store
    before = _snapshot(path)
    convert_store(path, tmp_path / "out", fields=flyvis_fields("calcium", 8),
                  chunk_mb=CHUNK_MB, progress=False)  # fmt: skip
    assert _snapshot(path) == before
    with pytest.raises(ConfigError, match="inside the input"):
        convert_store(path, path / "out", fields=FIELDS, progress=False)
    assert _snapshot(path) == before


def test_resumes_after_interruption(store, tmp_path):
    path, data = store
    out = tmp_path / "out"

    def stop_after(n):
        if n == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_store(path, out, fields=FIELDS, chunk_mb=CHUNK_MB, workers=2,
                      progress=False, on_slab=stop_after)  # fmt: skip
    assert (out / PROGRESS).is_file()
    report = convert_store(path, out, fields=FIELDS, chunk_mb=CHUNK_MB, workers=2,
                           progress=False)  # fmt: skip
    assert report.slabs_skipped == 4
    assert report.slabs_written + report.slabs_skipped == sum(f.slabs for f in report.fields)
    assert report.verified
    np.testing.assert_array_equal(zarr.open_array(str(out / "voltage"))[:], data[:, :, 0])
    # A finished conversion is only re-verified.
    again = convert_store(path, out, fields=FIELDS, chunk_mb=CHUNK_MB, progress=False)
    assert again.slabs_written == 0 and again.verified


def test_other_arguments_need_overwrite(store, tmp_path):
    path, _ = store
    convert_store(path, tmp_path / "out", fields=FIELDS, chunk_mb=CHUNK_MB, progress=False)
    with pytest.raises(ConfigError, match="--overwrite"):
        convert_store(path, tmp_path / "out", fields=FIELDS, codec="zstd", progress=False)
    report = convert_store(path, tmp_path / "out", fields=FIELDS, codec="zstd",
                           overwrite=True, progress=False)  # fmt: skip
    assert report.verified and report.codec == "zstd"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match="delete it"):
        convert_store(path, tmp_path / "other", fields=FIELDS, progress=False)


def test_verification_catches_a_changed_output(store, tmp_path):
    path, _ = store
    out = tmp_path / "out"
    convert_store(path, out, fields=FIELDS, chunk_mb=CHUNK_MB, progress=False)
    zarr.open_array(str(out / "voltage"), mode="r+")[5] = 123.0
    with pytest.raises(CorruptChunkError, match="voltage"):
        convert_store(path, out, fields=FIELDS, chunk_mb=CHUNK_MB, progress=False)


def test_flyvis_fields():
    assert flyvis_fields("voltage", 1736) == [
        "voltage=timeseries[:,0]", "stimulus=timeseries[0:1736,1]",
    ]  # fmt: skip
    assert flyvis_fields(7, 10)[0] == "calcium=timeseries[:,2]"
    with pytest.raises(ConfigError, match="metadata"):
        flyvis_fields(1, 10)


def test_fields_must_share_time_length(tmp_path):
    zarr.create_array(str(tmp_path / "a.zarr"), shape=(10, 2), dtype="f4")
    zarr.create_array(str(tmp_path / "b.zarr"), shape=(12, 2), dtype="f4")
    with pytest.raises(FieldLengthError):
        convert_store(tmp_path, tmp_path / "out", fields=["x=a[:]", "y=b[:]"], progress=False)


# -- --dtype: a half-precision copy ------------------------------------------------------


def test_float16_copy_reports_its_rounding_error(store, tmp_path):
    path, data = store
    report = convert_store(path / "timeseries.zarr", tmp_path / "half", fields=FIELDS,
                           chunk_mb=CHUNK_MB, dtype="float16", progress=False)  # fmt: skip
    assert report.verified  # OUT against the converted input
    volt = zarr.open_array(str(tmp_path / "half" / "voltage"), mode="r")
    assert volt.dtype == np.float16
    np.testing.assert_array_equal(volt[:], data[:, :, 0].astype(np.float16))
    by_name = {f.name: f for f in report.fields}
    assert by_name["voltage"].dtype == "float16"
    full = np.abs(data[:, :, 0].astype(np.float64) - data[:, :, 0].astype(np.float16))
    first_slab = full[: volt.chunks[0]].max()  # the sample always holds the first slab
    assert 0 < first_slab <= by_name["voltage"].max_abs_error <= full.max()
    assert report.decoded_bytes == (300 * 40 + 300 * 8) * 2
    # the dtype is part of the arguments: another one needs --overwrite
    with pytest.raises(ConfigError, match="other arguments"):
        convert_store(path / "timeseries.zarr", tmp_path / "half", fields=FIELDS,
                      chunk_mb=CHUNK_MB, progress=False)  # fmt: skip
    plain = convert_store(path / "timeseries.zarr", tmp_path / "plain", fields=FIELDS,
                          chunk_mb=CHUNK_MB, progress=False)  # fmt: skip
    assert all(f.max_abs_error is None and f.dtype == "float32" for f in plain.fields)


def test_float16_overflow_is_refused_naming_the_field_and_the_fix(tmp_path):
    data = np.full((40, 3), 1.5, np.float32)
    data[25, 1] = 1e6
    zarr.create_array(tmp_path / "big.zarr", shape=data.shape, chunks=(10, 3),
                      dtype=data.dtype)[...] = data  # fmt: skip
    with pytest.raises(ConfigError, match=r"dtype='float16'.*'x'.*1e\+06.*Convert to float32"):
        convert_store(tmp_path / "big.zarr", tmp_path / "out", fields=["x=:"], chunk_mb=1e-4,
                      dtype="float16", progress=False)  # fmt: skip


def test_cli_dtype_prints_the_rounding_error(store, tmp_path, capsys):
    from chunkstream.cli import main

    path, _ = store
    rc = main(["convert", str(path / "timeseries.zarr"), str(tmp_path / "half"), "--fields",
               *FIELDS, "--dtype", "float16", "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "float16: max abs rounding error" in out


@pytest.mark.parametrize("dtype", ["int8", "bfloat16", "nope"])
def test_unsupported_output_dtype_is_refused(store, tmp_path, dtype):
    path, _ = store
    with pytest.raises(ConfigError, match=rf"dtype='{dtype}'.*float16"):
        convert_store(path / "timeseries.zarr", tmp_path / "o", fields=FIELDS, dtype=dtype,
                      progress=False)  # fmt: skip


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_big_endian_input_converts_to_native_order_and_verifies_its_values(tmp_path, zarr_format):
    # issue 19 item 4: a v2 '>f4' input was written correctly, then failed its own
    # verification ("differs from the input") because the digests hashed raw bytes
    from chunkstream import ZarrSource

    data = np.random.default_rng(3).standard_normal((90, 6, 2)).astype(">f4")
    zarr.create_array(str(tmp_path / "be.zarr"), shape=data.shape, dtype=data.dtype,
                      chunks=(20, 6, 2), zarr_format=2)[...] = data  # fmt: skip
    report = convert_store(tmp_path / "be.zarr", tmp_path / "out", fields=["v=:,0"],
                           chunk_mb=CHUNK_MB, zarr_format=zarr_format, progress=False)  # fmt: skip
    assert report.verified and report.fields[0].checksum_in == report.fields[0].checksum_out
    out = zarr.open_array(str(tmp_path / "out" / "v"), mode="r")
    assert np.dtype(out.dtype).isnative
    np.testing.assert_array_equal(out[:], data[:, :, 0])
    with ZarrSource(tmp_path / "out" / "v") as source:
        assert source.uses_fast_path
        got = np.empty((90, 6), np.float32)
        source.read_into(0, 90, {"data": got})
    np.testing.assert_array_equal(got, data[:, :, 0])
