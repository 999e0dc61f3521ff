"""The zarr internals ``sources/_checked_codecs.py`` overrides are still there, with the
signatures it calls, and a corrupt chunk is still refused through each checked codec
when zarr itself decodes it: a zarr release that renamed ``_decode_sync`` or
``_decode_partial_single`` would otherwise turn the integrity checks off in silence.
pyproject.toml caps zarr at the newest minor this passed on (3.1)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ShardingCodec

import chunkstream as cs
from chunkstream.sources import _checked_codecs as checked

DATA = np.arange(400, dtype=np.float32).reshape(100, 4)


def test_the_overridden_methods_exist_with_the_signatures_we_call():
    assert tuple(inspect.signature(BloscCodec._decode_sync).parameters) == (
        "self",
        "chunk_bytes",
        "chunk_spec",
    )
    partial = ShardingCodec._decode_partial_single
    assert inspect.iscoroutinefunction(partial)
    assert tuple(inspect.signature(partial).parameters) == (
        "self",
        "byte_getter",
        "selection",
        "shard_spec",
    )
    assert checked.changed_internals() == []
    for (cls, name), params in checked.OVERRIDDEN.items():
        ours = {BloscCodec: checked.CheckedBloscCodec, ShardingCodec: checked.CheckedShardingCodec}
        assert tuple(inspect.signature(getattr(ours[cls], name)).parameters) == params


def test_a_zarr_without_them_is_refused_not_read_unchecked(tmp_path, monkeypatch):
    arr = zarr.create_array(tmp_path / "a.zarr", shape=(100, 4), chunks=(10, 4), dtype="f4")
    monkeypatch.delattr(ShardingCodec, "_decode_partial_single")
    with pytest.raises(RuntimeError, match=r"ShardingCodec\._decode_partial_single.*zarr>=3\.1"):
        checked.with_checked_codecs(arr)


def _truncate(file: Path) -> None:
    raw = file.read_bytes()
    file.write_bytes(raw[: len(raw) // 2])


def _v2_blosc(path: Path) -> Path:
    arr = zarr.create_array(
        path,
        shape=(100, 4),
        chunks=(10, 4),
        dtype="f4",
        zarr_format=2,
        compressors=numcodecs.Blosc(cname="lz4"),
    )
    arr[:] = DATA
    return path / "0.0"


def _v3_blosc(path: Path) -> Path:
    arr = zarr.create_array(
        path, shape=(100, 4), chunks=(10, 4), dtype="f4", compressors=BloscCodec(cname="lz4")
    )
    arr[:] = DATA
    return path / "c" / "0" / "0"


def _v3_shard(path: Path) -> Path:
    arr = zarr.create_array(
        path,
        shape=(100, 4),
        chunks=(10, 4),
        shards=(50, 4),
        dtype="f4",
        compressors=BloscCodec(cname="lz4"),
    )
    arr[:] = DATA
    return path / "c" / "0" / "0"


@pytest.mark.parametrize(
    ("make", "codec"),
    [
        (_v2_blosc, checked.CheckedCodec),
        (_v3_blosc, checked.CheckedBloscCodec),
        (_v3_shard, checked.CheckedShardingCodec),
    ],
)
def test_a_corrupt_chunk_is_refused_through_each_checked_codec(tmp_path, make, codec):
    _truncate(make(tmp_path / "a.zarr"))
    arr = checked.with_checked_codecs(zarr.open_array(tmp_path / "a.zarr", mode="r"))
    meta = arr.metadata
    used = [meta.compressor] if meta.zarr_format == 2 else list(meta.codecs)
    assert any(type(c) is codec for c in used)
    with pytest.raises(cs.CorruptChunkError):
        arr[0:10]  # one chunk (one inner chunk of the shard: zarr's partial decode)


def test_the_internals_a_leavable_remote_read_calls_are_there():
    """``sources/_leave.py`` runs zarr's basic selection as a task it can cancel, through
    ``AsyncArray._get_selection`` and zarr's loop: under this zarr they are there as
    called (else reads fall back to ``get_basic_selection``, correct but not leavable)."""
    from chunkstream.sources import _leave

    assert _leave.changed_internals() == []
    assert _leave._leavable()


@pytest.mark.parametrize("leavable", [True, False])
def test_the_general_path_reads_the_same_leavable_or_not(tmp_path, monkeypatch, leavable):
    """zarr's own pipeline (engine "zarr") reads the true rows through the leavable read
    and through the fallback a changed zarr would get."""
    from chunkstream.sources import _leave

    monkeypatch.setattr(_leave, "_leavable", lambda: leavable)
    zarr.create_array(str(tmp_path / "a.zarr"), data=DATA, chunks=(16, 4), zarr_format=3)
    with cs.ZarrSource(str(tmp_path / "a.zarr"), engine="zarr") as source:
        assert not source.uses_fast_path
        out = {
            name: np.empty((37, *spec.shape), spec.dtype) for name, spec in source.fields.items()
        }
        source.read_into(21, 58, out)
    np.testing.assert_array_equal(next(iter(out.values())), DATA[21:58])
