"""Bad input: every row of docs/parameters.md is refused with a clear, typed error.

Each case asserts the ``ChunkstreamError`` subclass, the built-in it also inherits, that the
message names the parameter and the value and says what to do, and that no
``chunkstream-*`` thread is running after the refusal.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import chunkstream as cs
from chunkstream import compat, flyvis
from chunkstream.consumer._sampling import WindowSampler
from chunkstream.pipeline import ResolvedSettings
from chunkstream.sources._base import FieldSpec
from chunkstream.tools import layout_from_shape, plan_memory
from tests.faults import ArraySource, chunkstream_threads, make_arrays, wait_for_no_threads
from tests.flat import loader_from, stream_from
from tests.stores import chunk_files, make_array, make_flyvis, random_data

DOC = Path(__file__).resolve().parents[1] / "docs" / "parameters.md"


def _src():
    return ArraySource(make_arrays(500))


class _FieldsLater(ArraySource):
    """A source whose fields are unknown and that has no way to learn them."""

    def __init__(self):
        super().__init__(make_arrays(500))
        self.fields = None


def _loader(**kwargs):
    chunk_size = kwargs.pop("chunk_size", 50)
    return loader_from(_src(), chunk_size, device="cpu", **kwargs)


def _zarr(tmp: Path, **kwargs) -> Path:
    path = tmp / "x.zarr"
    make_array(path, random_data((200, 6)), (50, 6), **kwargs)
    return path


def _epoch(num_chunks, sampling="shuffled", **kwargs):
    with _loader(sampling=sampling) as loader:
        loader.epoch(num_chunks, **kwargs)


def _state(state):
    with _loader() as loader:
        loader.load_state_dict(state)


def _bad_metadata(tmp: Path, fmt: int):
    path = _zarr(tmp, zarr_format=fmt)
    (path / ("zarr.json" if fmt == 3 else ".zarray")).write_text('{"zarr_format": ')
    cs.ZarrSource(path)


def _wrong_metadata(tmp: Path):
    path = _zarr(tmp, zarr_format=2)
    (path / ".zarray").write_text('{"zarr_format": 2, "shape": [200, 6]}')  # no dtype, chunks
    cs.ZarrSource(path)


def _group_member(tmp: Path):
    group = zarr.open_group(tmp / "g.zarr", mode="w")
    group.create_array("a", shape=(10, 2), dtype="f4")
    cs.ZarrSource(tmp / "g.zarr", array="nope")


def _uint32(tmp: Path):
    path = tmp / "u.zarr"
    zarr.create_array(path, shape=(20, 2), chunks=(10, 2), dtype="uint32")[...] = 1
    cs.ZarrSource(path)


def _missing_chunk(tmp: Path):
    path = _zarr(tmp)
    chunk_files(path)[2].unlink()
    cs.ZarrSource(path)


def _transposed_with_our_reader(tmp: Path):
    path = tmp / "s.zarr"
    zarr.create_array(path, shape=(20, 2), chunks=(5, 2), shards=(10, 2), dtype="f4",
                      filters=[zarr.codecs.TransposeCodec(order=(1, 0))])[...] = 1  # fmt: skip
    cs.ZarrSource(path, engine="chunkstream")


def _big_endian_complex_on_zarrs(tmp: Path):
    path = tmp / "c.zarr"
    zarr.create_array(path, shape=(20, 2), chunks=(8, 2), dtype="complex64",
                      serializer=zarr.codecs.BytesCodec(endian="big"))[...] = 1j  # fmt: skip
    cs.ZarrSource(path, engine="zarrs")


def _unreadable_shard_index(tmp: Path):
    from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec

    path = tmp / "s.zarr"
    sharding = ShardingCodec(chunk_shape=(5, 2), codecs=[BytesCodec()],
                             index_codecs=[BytesCodec(), GzipCodec()])  # fmt: skip
    zarr.create_array(path, shape=(20, 2), chunks=(10, 2), dtype="f4", serializer=sharding,
                      compressors=None)[...] = 1  # fmt: skip
    cs.ZarrSource(path, check_missing="open")


def _inner_chunk_left_out(tmp: Path):
    path = tmp / "s.zarr"
    data = random_data((20, 2))
    data[5:10] = 0  # zarr's default leaves this inner chunk out of its shard
    zarr.create_array(path, shape=(20, 2), chunks=(5, 2), shards=(10, 2), dtype="f4",
                      filters=[zarr.codecs.TransposeCodec(order=(1, 0))])[...] = data  # fmt: skip
    source = cs.ZarrSource(path, engine="zarr")
    source.read_into(0, 10, {"data": np.empty((10, 2), np.float32)})


def _truncated_chunk(tmp: Path):
    path = _zarr(tmp, codec="zstd")
    victim = chunk_files(path)[1]
    victim.write_bytes(victim.read_bytes()[:5])
    with cs.ZarrSource(path) as source:
        source.read_into(50, 100, {"data": np.empty((50, 6), np.float32)})


def _npy(tmp: Path, suffix: str, write: bool):
    path = tmp / f"a{suffix}"
    if write:
        path.write_text("1 2 3")
    cs.NumpySource({"a": path})


def _tensorstore(tmp: Path, what: str):
    pytest.importorskip("tensorstore")
    if what == "missing":
        cs.TensorStoreSource(tmp / "nope.zarr")
    elif what == "not_zarr":
        (tmp / "plain").mkdir()
        cs.TensorStoreSource(tmp / "plain")
    else:
        cs.TensorStoreSource(_zarr(tmp), {"x": 9})


def _flyvis(tmp: Path, **kwargs):
    make_flyvis(tmp / "run", T=64, N=8, chunks=(32, 8, 1))
    flyvis.open(tmp / "run", **kwargs)


def _lengths(_tmp):
    cs.NumpySource({"a": np.zeros((10, 2), np.float32), "b": np.zeros((9, 2), np.float32)})


def _stream(sampling="shuffled", **kwargs):
    with _loader(sampling=sampling) as loader:
        stream_from(loader, **{"window": 5, "batch_size": 4, "batches_per_chunk": 2, **kwargs})


def _unaligned_chunk() -> cs.Chunk:
    """8 rows at timesteps [3, 11): no multiple of 16 to start a window at."""
    return cs.Chunk({"x": torch.zeros(8, 1)}, start=3, stop=11, epoch=0, index=0)


def _join_lengths(tmp: Path):
    make_array(tmp / "short.zarr", random_data((199, 6)), (50, 6))
    cs.JoinSource({"long": cs.ZarrSource(_zarr(tmp)), "short": cs.ZarrSource(tmp / "short.zarr")})


def _x(rows: int = 10) -> np.ndarray:
    return np.zeros((rows, 2), np.float32)


def _convert_dtype(tmp: Path, dtype: str, big: bool = False, **kwargs):
    from chunkstream.tools import convert_store

    data = random_data((40, 3)) * (1e6 if big else 1)
    make_array(tmp / "in.zarr", data.astype(np.float32), (10, 3))
    convert_store(tmp / "in.zarr", tmp / "out", fields=["x=:"], dtype=dtype, progress=False,
                  **kwargs)  # fmt: skip


def _train_config(**kwargs):
    from chunkstream.train import TrainConfig

    TrainConfig(**kwargs)


def _stream_given(**kwargs):
    """A stream given ``kwargs`` as they are (no options object made from them)."""
    with _loader() as loader:
        cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=2, **kwargs)


def _stream_state(state):
    with _loader() as loader:
        cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=2).load_state_dict(state)


def _stream_state_from(batches_per_chunk, **kwargs):
    """A BatchStream state saved mid-epoch by a stream with ``batches_per_chunk``."""
    with _loader() as loader:
        stream = cs.BatchStream(loader, window=5, batch_size=4, batches_per_chunk=batches_per_chunk)
        iterator = iter(stream)
        next(iterator)
        state = stream.state_dict()
        iterator.close()
    return state


def _loader_state_past_its_end():
    with _loader() as loader:
        next(iter(loader.epoch(8)))
        state = loader.state_dict()
    return {**state, "step": 500}


def _resume_trainer(tmp: Path, **saved):
    """Resume a trainer from a checkpoint whose config differs in ``saved``."""
    from chunkstream.train import TrainConfig, Trainer

    source = cs.NumpySource({"voltage": np.zeros((600, 6), np.float32),
                             "stimulus": np.zeros((600, 2), np.float32)})  # fmt: skip
    config = TrainConfig(chunk_size=64, batch_size=8, epochs=1, device="cpu", progress=False,
                         tensorboard=False, mix=1, pieces=1)  # fmt: skip
    torch.save({"config": {**config.to_dict(), **saved}}, tmp / "checkpoint.pt")
    Trainer(source, config, out_dir=None).fit(resume=tmp / "checkpoint.pt")


def _compat_epoch(num_chunks):
    with compat.RandomChunkLoader(_load, 500, 50, device="cpu") as loader:
        loader.start_epoch(num_chunks)


def _load(_start, stop):
    return np.zeros((stop - _start, 2), np.float32), np.zeros((stop - _start, 1), np.float32)


def _segments_file(tmp: Path, name: str, text: str):
    path = tmp / name
    path.write_text(text)
    cs.Segments.read(path)


# (row id, call(tmp_path), error class, built-in, strings the message must hold)
#: A URL nothing listens at: the cache's options are refused before any request.
_URL = "http://127.0.0.1:9/x.zarr"


def _a_file(tmp: Path) -> Path:
    path = tmp / "a-file"
    path.write_text("")
    return path


CASES = [
    ("LoaderOptions.pieces", lambda t: _loader(pieces=0),
     cs.ConfigError, ValueError, ["pieces=0", ">= 1", "pieces=1"]),
    ("LoaderOptions.pieces", lambda t: _loader(pieces=3),
     cs.ConfigError, ValueError, ["pieces=3", "divisor of chunk_size=50", "[2, 5, 10, 25, 50]"]),
    ("LoaderOptions.pieces", lambda t: _loader(pieces=10, window=8),
     cs.ConfigError, ValueError, ["pieces=10", "batch window 8", "pieces <= 6"]),
    ("LoaderOptions.pieces", lambda t: _loader(chunk_size=800, pieces=4),
     cs.ConfigError, ValueError, ["pieces=4", "exceeds the data (500 timesteps)", "pieces=1"]),
    ("LoaderOptions.pieces",
     lambda t: _loader(chunk_size=16, window=8, segments=[(0, 9), (20, 29), (40, 500)]),
     cs.ConfigError, ValueError, ["pieces=1", "shorter than a piece (18 timesteps, pooled)",
                                  "2 * window - 1 = 15", "chunk_size // pieces >= 30"]),
    ("LoaderOptions.window", lambda t: _loader(window=80),
     cs.ConfigError, ValueError, ["window=80", "chunk length 50", "shorter window"]),
    ("LoaderOptions.resident", lambda t: _loader(resident="yes"),
     cs.ConfigError, ValueError, ["resident='yes'", "'auto', True or False", "resident='auto'"]),
    ("LoaderOptions.resident", lambda t: _loader(resident=True, host_memory=15_000),
     cs.ConfigError, ValueError, ["resident=True", "500 timesteps", "exceed host_memory",
                                  "Raise device_memory", "resident='auto'"]),
    ("LoaderOptions.resident", lambda t: _loader(resident=True, host_memory=100),
     cs.ConfigError, ValueError, ["host_memory=100", "Raise the budget"]),
    ("LoaderOptions.segments", lambda t: _loader(segments=[(100, 200), (0, 50)]),
     cs.ConfigError, ValueError, ["segments=(0, 50, 'seg1')", "sorted by start", "Sort them"]),
    ("LoaderOptions.segments", lambda t: _loader(segments=[(0, 200), (150, 300)]),
     cs.ConfigError, ValueError, ["segments=(150, 300, 'seg1')", "overlaps", "merge or trim"]),
    ("LoaderOptions.segments", lambda t: _loader(segments=[(10, 10)]),
     cs.ConfigError, ValueError, ["segments=(10, 10, 'seg0')", "non-empty", "Drop segment 0"]),
    ("LoaderOptions.segments", lambda t: _loader(segments=[(400, 600, "late")]),
     cs.ConfigError, ValueError, ["segments=(400, 600, 'late')", "[0, 500)", "belong"]),
    ("LoaderOptions.segments", lambda t: _loader(segments=[(0, 5)], window=8),
     cs.ConfigError, ValueError, ["segments=", ">= 8 timesteps", "longer segments"]),
    ("Segments.read", lambda t: _segments_file(t, "s.csv", "start,stop\n0,10\n20,x\n"),
     cs.ConfigError, ValueError, ["line 3", "'20,x'", "Fix line 3"]),
    ("Segments.read", lambda t: _segments_file(t, "s.json", '[[0, 10],\n [20, 30'),
     cs.ConfigError, ValueError, ["s.json", "valid JSON", "Line 2"]),
    ("split_segments.fractions", lambda t: cs.split_segments([(0, 100)], (0.7, 0.2, 0.2)),
     cs.ConfigError, ValueError, ["fractions=(0.7, 0.2, 0.2)", "sum to 1", "(0.7, 0.1, 0.2)"]),
    ("split_segments.gap", lambda t: cs.split_segments([(0, 100)], gap=-1),
     cs.ConfigError, ValueError, ["gap=-1", ">= 0", "window minus one"]),
    ("ChunkLoader.source", lambda t: cs.ChunkLoader([1, 2], 10, device="cpu"),
     cs.ConfigError, ValueError, ["source=", "'list'", "NumpySource"]),
    ("ChunkLoader.source", lambda t: cs.ChunkLoader(_FieldsLater(), 10, device="cpu"),
     cs.ConfigError, ValueError, ["_FieldsLater with fields=None", "learns them",
                                  "specs='first'"]),
    ("ChunkLoader.chunk_size", lambda t: _loader(chunk_size=0),
     cs.ConfigError, ValueError, ["chunk_size=0", ">= 1", "Pass"]),
    ("ChunkLoader.chunk_size", lambda t: _loader(chunk_size=2.5),
     cs.ConfigError, ValueError, ["chunk_size=2.5", "integer"]),
    ("ChunkLoader.chunk_size", lambda t: _loader(chunk_size=True),
     cs.ConfigError, ValueError, ["chunk_size=True", "integer"]),
    ("ChunkLoader.device", lambda t: cs.ChunkLoader(_src(), 50, device="tpu:0"),
     cs.ConfigError, ValueError, ["device='tpu:0'", "'cpu'"]),
    ("ChunkLoader.prefetch", lambda t: _loader(prefetch=0),
     cs.ConfigError, ValueError, ["prefetch=0", "Use 1 or more"]),
    ("ChunkLoader.gpu_prefetch", lambda t: _loader(gpu_prefetch=0),
     cs.ConfigError, ValueError, ["gpu_prefetch=0", "Use 1 or more"]),
    ("ChunkLoader.workers", lambda t: _loader(workers=0),
     cs.ConfigError, ValueError, ["workers=0", "Use 1 or more"]),
    ("LoaderOptions.host_slots", lambda t: _loader(host_slots=0),
     cs.ConfigError, ValueError, ["host_slots=0", "leave it None"]),
    ("LoaderOptions.host_memory", lambda t: _loader(host_memory=100),
     cs.ConfigError, ValueError, ["host_memory=100", "Raise the budget"]),
    ("LoaderOptions.device_memory", lambda t: _loader(device_memory=1),
     cs.ConfigError, ValueError, ["device_memory=1", "Raise the budget"]),
    ("ChunkLoader.sampling", lambda t: _loader(sampling="sorted"),
     cs.ConfigError, ValueError, ["sampling='sorted'", "'shuffled'"]),
    ("ChunkLoader.align", lambda t: _loader(align=0),
     cs.ConfigError, ValueError, ["align=0", "align=1"]),
    ("ChunkLoader.align", lambda t: _loader(align=500, sampling="random"),
     cs.ConfigError, ValueError, ["align=500", "Lower align"]),
    ("ChunkLoader.align", lambda t: _loader(align=3),
     cs.ConfigError, ValueError, ["chunk_size=50", "align=3", "multiple of align"]),
    ("ChunkLoader.seed", lambda t: _loader(seed=-1),
     cs.ConfigError, ValueError, ["seed=-1", "non-negative"]),
    ("LoaderOptions.rank", lambda t: _loader(rank=2, world_size=2),
     cs.ConfigError, ValueError, ["rank=2", "[0, world_size=2)"]),
    ("LoaderOptions.world_size", lambda t: _loader(rank=0, world_size=0),
     cs.ConfigError, ValueError, ["world_size=0", ">= 1"]),
    ("LoaderOptions.stall_timeout", lambda t: _loader(stall_timeout=0),
     cs.ConfigError, ValueError, ["stall_timeout=0", "None to disable"]),
    ("LoaderOptions.stall_timeout", lambda t: _loader(stall_timeout=-1),
     cs.ConfigError, ValueError, ["stall_timeout=-1", "None to disable"]),
    ("LoaderOptions.close_timeout", lambda t: _loader(close_timeout=0),
     cs.ConfigError, ValueError, ["close_timeout=0", "seconds > 0"]),
    ("LoaderOptions.close_source", lambda t: _loader(close_source="yes"),
     cs.ConfigError, ValueError, ["close_source='yes'", "Pass a bool"]),
    ("LoaderOptions.check_finite", lambda t: _loader(check_finite="no"),
     cs.ConfigError, ValueError, ["check_finite='no'", "Pass a bool"]),
    ("LoaderOptions.read_retries", lambda t: _loader(read_retries=-1),
     cs.ConfigError, ValueError, ["read_retries=-1", "Use 0"]),
    ("LoaderOptions.stats", lambda t: _loader(stats={}),
     cs.ConfigError, ValueError, ["stats='dict'", "cs.LatencyStats"]),
    ("ChunkLoader.options", lambda t: cs.ChunkLoader(_src(), 50, device="cpu", options={"pieces": 2}),
     cs.ConfigError, ValueError, ["options='dict'", "cs.LoaderOptions", "options=cs.LoaderOptions("]),
    ("ChunkLoader.config", lambda t: cs.ChunkLoader(_src(), device="cpu", config={"chunk_size": 50}),
     cs.ConfigError, ValueError, ["config='dict'", "another loader's .config",
                                  "options=cs.LoaderOptions(", "config= is deprecated"]),
    ("ChunkLoader.config", lambda t: _loader(config=ResolvedSettings(chunk_size=50), workers=3),
     cs.ConfigError, ValueError, ["workers=3", "config=", "its workers is 2", "leave config out"]),
    ("ChunkLoader.config", lambda t: _loader(config=ResolvedSettings(chunk_size=40)),
     cs.ConfigError, ValueError, ["chunk_size=50", "its chunk_size is 40"]),
    ("ChunkLoader.config",
     lambda t: _loader(chunk_size=None, config=ResolvedSettings(chunk_size=50), stall_timeout=1),
     cs.ConfigError, ValueError, ["options.stall_timeout=1", "its stall_timeout is 300.0",
                                  "dataclasses.replace(config, stall_timeout="]),
    ("ChunkLoader.config",
     lambda t: _loader(chunk_size=None, config=ResolvedSettings(chunk_size=50), host_memory=10**6),
     cs.ConfigError, ValueError, ["options.host_memory=1000000", "no byte budget with config=",
                                  "Set prefetch, gpu_prefetch and host_slots"]),
    ("ChunkLoader.(option keyword)",
     lambda t: cs.ChunkLoader(_src(), 50, stall_timeout=5, options=cs.LoaderOptions(stall_timeout=1)),
     cs.ConfigError, ValueError, ["stall_timeout=5", "ChunkLoader(stall_timeout=...) and",
                                  "options=cs.LoaderOptions(stall_timeout=...)", "holds 1"]),
    ("ChunkLoader.epoch.num_chunks", lambda t: _epoch(-1),
     cs.ConfigError, ValueError, ["num_chunks=-1", "plan_epoch"]),
    ("ChunkLoader.epoch.num_chunks", lambda t: _epoch(None, "random"),
     cs.ConfigError, ValueError, ["num_chunks=None", "plan_epoch"]),
    ("ChunkLoader.epoch.at", lambda t: _epoch(3, at=-1),
     cs.ConfigError, ValueError, ["at=-1", "[0, num_chunks=3]"]),
    ("ChunkLoader.epoch.at", lambda t: _epoch(3, at=4),
     cs.ConfigError, ValueError, ["at=4", "at <= num_chunks"]),
    ("ChunkLoader.load_state_dict.state", lambda t: _state({}),
     cs.ConfigError, ValueError, ["state={}", "state_dict()"]),
    ("ChunkLoader.load_state_dict.state", lambda t: _state({"epoch": -1, "step": 0}),
     cs.ConfigError, ValueError, ["state=", "'epoch': -1", "non-negative"]),
    ("ChunkLoader.load_state_dict.state", lambda t: _state(_loader_state_past_its_end()),
     cs.ConfigError, ValueError, ["'step'=500 at most 'num_chunks'=8", "ChunkLoader.state_dict()"]),
    ("ChunkLoader.load_state_dict.state", lambda t: _state(_stream_state_from(2)),
     cs.ConfigError, ValueError, ["BatchStream state", "pass state['loader']"]),
    ("ZarrSource.path.missing", lambda t: cs.ZarrSource(t / "nope.zarr"),
     cs.SourceNotFoundError, FileNotFoundError, ["path", "nope.zarr", "Check the path"]),
    ("ZarrSource.path.not_zarr", lambda t: (t / "plain").mkdir() or cs.ZarrSource(t / "plain"),
     cs.NotZarrError, ValueError, ["path", "plain", "Point at the .zarr folder"]),
    ("ZarrSource.path.bad_metadata", lambda t: _bad_metadata(t, 3),
     cs.NotZarrError, ValueError, ["x.zarr", "zarr.json", "Restore the metadata"]),
    ("ZarrSource.path.bad_metadata", lambda t: _bad_metadata(t, 2),
     cs.NotZarrError, ValueError, ["x.zarr", ".zarray", "Restore the metadata"]),
    ("ZarrSource.path.bad_metadata", _wrong_metadata,
     cs.NotZarrError, ValueError, ["x.zarr", "incomplete", "'dtype'", "rewrite the array"]),
    ("ZarrSource.fields.range", lambda t: cs.ZarrSource(_zarr(t), {"x": 9}),
     cs.FieldSelectionError, IndexError, ["field 'x'", "index 9", "Use an index in [0, 6)"]),
    ("ZarrSource.fields.step", lambda t: cs.ZarrSource(_zarr(t), {"x": slice(0, 6, 2)}),
     cs.FieldSelectionError, IndexError, ["field 'x'", "slice(0, 6, 2)", "only step 1"]),
    ("ZarrSource.fields.empty", lambda t: cs.ZarrSource(_zarr(t), {}),
     cs.ConfigError, ValueError, ["fields={}", "at least one field"]),
    ("ZarrSource.array", _group_member,
     cs.ConfigError, ValueError, ["array='nope'", "one of the arrays", "['a']"]),
    ("ZarrSource.check_missing", lambda t: cs.ZarrSource(_zarr(t), check_missing="sometimes"),
     cs.ConfigError, ValueError, ["check_missing='sometimes'", '"auto"']),
    ("ZarrSource.read_threads", lambda t: cs.ZarrSource(_zarr(t), read_threads=0),
     cs.ConfigError, ValueError, ["read_threads=0", "positive int"]),
    ("ZarrSource.read_threads", lambda t: cs.ZarrSource(_zarr(t), read_threads=True),
     cs.ConfigError, ValueError, ["read_threads=True", "positive int"]),
    ("ZarrSource.cache", lambda t: cs.ZarrSource(_zarr(t), cache=t / "c"),
     cs.ConfigError, ValueError, ["cache=", "None for the local path", "local store"]),
    ("ZarrSource.cache", lambda t: cs.ZarrSource(_URL, cache=_a_file(t)),
     cs.ConfigError, ValueError, ["cache=", "is a file", "Pass a folder"]),
    ("ZarrSource.cache", lambda t: cs.ZarrSource("memory://x", cache=t / "c"),
     cs.ConfigError, ValueError, ["cache=", "memory:// URL"]),
    ("ZarrSource.cache_group", lambda t: cs.ZarrSource(_URL, cache=t / "c", cache_group="no-such-group-x"),
     cs.ConfigError, ValueError, ["cache_group='no-such-group-x'", "getent group"]),
    ("ZarrSource.cache_group", lambda t: cs.ZarrSource(_URL, cache_group="lab"),
     cs.ConfigError, ValueError, ["cache_group='lab'", "Pass cache=DIR"]),
    ("ZarrSource.cache_bytes", lambda t: cs.ZarrSource(_URL, cache=t / "c", cache_bytes=0),
     cs.ConfigError, ValueError, ["cache_bytes=0", "positive number of bytes"]),
    ("ZarrSource.cache_bytes", lambda t: cs.ZarrSource(_URL, cache=t / "c", cache_bytes=True),
     cs.ConfigError, ValueError, ["cache_bytes=True", "positive number of bytes"]),
    ("ZarrSource.cache_bytes", lambda t: cs.ZarrSource(_URL, cache_bytes=10**9),
     cs.ConfigError, ValueError, ["cache_bytes=1000000000", "Pass cache=DIR"]),
    ("ZarrSource.engine", lambda t: cs.ZarrSource(_zarr(t), engine="rust"),
     cs.ConfigError, ValueError, ["engine='rust'", '"auto"', '"zarrs"']),
    ("ZarrSource.engine.unsuited", _transposed_with_our_reader,
     cs.ConfigError, ValueError, ["engine='chunkstream'", '"auto"', "no transpose"]),
    ("ZarrSource.engine.zarrs_defect", _big_endian_complex_on_zarrs,
     cs.ConfigError, ValueError, ["engine='zarrs'", "c.zarr", "real and imaginary",
                                  'engine="auto"']),
    ("ZarrSource.check_missing.shard_index", _unreadable_shard_index,
     cs.ConfigError, ValueError, ["check_missing='open'", "shard index",
                                  "check_missing=False"]),
    ("ZarrSource.dtype", _uint32,
     cs.FieldDtypeError, TypeError, ["dtype uint32", "u.zarr", "--dtype float32"]),
    ("ZarrSource.store.missing_chunk", _missing_chunk,
     cs.MissingChunkError, FileNotFoundError, ["c/2/0", "x.zarr", "write_empty_chunks=True"]),
    ("ZarrSource.store.missing_inner_chunk", _inner_chunk_left_out,
     cs.MissingChunkError, FileNotFoundError, ["inner chunk (1, 0)", "'c/0/0'", "s.zarr",
                                               "write_empty_chunks=True"]),
    ("ZarrSource.store.truncated_chunk", _truncated_chunk,
     cs.CorruptChunkError, ValueError, ["x.zarr/c/1/0", "truncated", "Rewrite the array"]),
    ("NumpySource.arrays.empty", lambda t: cs.NumpySource({}),
     cs.ConfigError, ValueError, ["arrays={}", "non-empty mapping"]),
    ("NumpySource.arrays.bare", lambda t: cs.NumpySource(np.zeros((4, 2))),
     cs.ConfigError, ValueError, ["arrays='ndarray'", "mapping", "cs.NumpySource({'data': array})"]),
    ("NumpySource.arrays.type", lambda t: cs.NumpySource({"a": [1, 2]}),
     cs.ConfigError, ValueError, ["arrays['a']", "'list'", "numpy array or .npy path"]),
    ("NumpySource.arrays.missing", lambda t: _npy(t, ".npy", False),
     cs.SourceNotFoundError, FileNotFoundError, ["field 'a'", "a.npy", "does not exist"]),
    ("NumpySource.arrays.not_npy", lambda t: _npy(t, ".txt", True),
     cs.NotZarrError, ValueError, ["field 'a'", "a.txt", "Pass a .npy path"]),
    ("NumpySource.arrays.timesteps", lambda t: cs.NumpySource({"a": np.zeros((0, 3))}),
     cs.ConfigError, ValueError, ["arrays['a'].shape=(0, 3)", "at least one timestep"]),
    ("NumpySource.arrays.dtype", lambda t: cs.NumpySource({"a": np.empty((3, 2), object)}),
     cs.FieldDtypeError, TypeError, ["field 'a'", "dtype object", "Convert"]),
    ("NumpySource.arrays.lengths", _lengths,
     cs.FieldLengthError, ValueError, ["a=10", "b=9", "Slice the longer arrays"]),
    ("CallableSource.load_fn", lambda t: cs.CallableSource(3, 10),
     cs.ConfigError, ValueError, ["load_fn=3", "callable"]),
    ("CallableSource.total_timesteps", lambda t: cs.CallableSource(_load, 0),
     cs.ConfigError, ValueError, ["total_timesteps=0", "positive int"]),
    ("CallableSource.total_timesteps", lambda t: cs.CallableSource(_load, 2.5),
     cs.ConfigError, ValueError, ["total_timesteps=2.5", "positive int"]),
    ("CallableSource.names", lambda t: cs.CallableSource(_load, 10, names=()),
     cs.ConfigError, ValueError, ["names=()", "non-empty sequence of distinct names"]),
    ("CallableSource.names", lambda t: cs.CallableSource(_load, 10, names=("a", "a")),
     cs.ConfigError, ValueError, ["names=('a', 'a')", "distinct"]),
    ("CallableSource.specs",
     lambda t: cs.CallableSource(_load, 10, specs={"x": FieldSpec((2,), np.dtype("f4"))}),
     cs.ConfigError, ValueError, ["specs=['x']", "one spec per name", "'data', 'stim'"]),
    ("CallableSource.specs", lambda t: cs.CallableSource(_load, 10, specs="last"),
     cs.ConfigError, ValueError, ["specs='last'", "'first'", "Pass the specs"]),
    ("CallableSource.specs", lambda t: cs.ChunkLoader(cs.CallableSource(_load, 10, specs="first"), 5, device="cpu", options=cs.LoaderOptions(host_memory=10**6)),
     cs.ConfigError, ValueError, ["host_memory", "learns them at its first read", "prefetch"]),
    ("CallableSource.specs", lambda t: cs.ChunkLoader(cs.CallableSource(_load, 10, specs="first"), 5, device="cpu", options=cs.LoaderOptions(resident=True)),
     cs.ConfigError, ValueError, ["resident=True", "learned at its first read"]),
    ("TensorStoreSource.path.missing", lambda t: _tensorstore(t, "missing"),
     cs.SourceNotFoundError, FileNotFoundError, ["path", "nope.zarr", "Check the path"]),
    ("TensorStoreSource.path.not_zarr", lambda t: _tensorstore(t, "not_zarr"),
     cs.NotZarrError, ValueError, ["plain", "not a zarr array", "Point at the array folder"]),
    ("TensorStoreSource.fields", lambda t: _tensorstore(t, "fields"),
     cs.FieldSelectionError, IndexError, ["field 'x'", "index 9", "Use an index in [0, 6)"]),
    ("flyvis.open.path", lambda t: flyvis.open(t / "nope"),
     cs.SourceNotFoundError, FileNotFoundError, ["nope", "timeseries.zarr", "Check the path"]),
    ("flyvis.open.column", lambda t: _flyvis(t, column=0),
     cs.ConfigError, ValueError, ["column=0", "metadata"]),
    ("flyvis.open.stim_dims", lambda t: _flyvis(t, stim_dims=0),
     cs.ConfigError, ValueError, ["stim_dims=0", "positive int or None"]),
    ("plan_memory.segments",
     lambda t: plan_memory(layout_from_shape((100, 4)), chunk_size=10, batch_size=2,
                           val_fraction=0.1, segments=[(0, 50), (50, 200)]),
     cs.ConfigError, ValueError, ["segments=", "[0, 100)"]),
    ("plan_memory.pieces",
     lambda t: plan_memory(layout_from_shape((100, 4)), chunk_size=10, batch_size=2,
                           segments=[(0, 50), (50, 100)], pieces=3),
     cs.ConfigError, ValueError, ["pieces=3", "a divisor of chunk_size=10"]),
    ("plan_epoch.chunk_size", lambda t: cs.plan_epoch(1000, 0, 10),
     cs.ConfigError, ValueError, ["chunk_size=0", "Pass a positive chunk_size"]),
    ("plan_epoch.chunk_size", lambda t: cs.plan_epoch(1000, 5, 10),
     cs.ConfigError, ValueError, ["chunk_size=5", "batch_size=10", "Raise chunk_size"]),
    ("plan_epoch.batch_size", lambda t: cs.plan_epoch(1000, 100, 0),
     cs.ConfigError, ValueError, ["batch_size=0", "Pass a positive batch_size"]),
    ("plan_epoch.batch_size", lambda t: cs.plan_epoch(1000, 100, 1001),
     cs.ConfigError, ValueError, ["batch_size=1001", "Lower batch_size"]),
    ("plan_epoch.passes_per_epoch", lambda t: cs.plan_epoch(1000, 100, 10, 0),
     cs.ConfigError, ValueError, ["passes_per_epoch=0", "Pass a positive passes_per_epoch"]),
    ("plan_epoch.world_size", lambda t: cs.plan_epoch(1000, 100, 10, world_size=11),
     cs.ConfigError, ValueError, ["world_size=11", "Lower world_size"]),
    ("plan_epoch.pieces", lambda t: cs.plan_epoch(1000, 100, 10, pieces=0),
     cs.ConfigError, ValueError, ["pieces=0", "Pass the loader's pieces"]),
    ("plan_epoch.pieces", lambda t: cs.plan_epoch(1000, 100, 10, pieces=3),
     cs.ConfigError, ValueError, ["pieces=3", "a divisor of chunk_size=100"]),
    ("BatchStream.loader", lambda t: cs.BatchStream(np.zeros((50, 2)), window=5, batch_size=4),
     cs.ConfigError, ValueError, ["loader='ndarray'", "a source", "cs.ChunkLoader"]),
    ("BatchStream.fields",  # from a source: the loader it built is closed again
     lambda t: cs.BatchStream(_src(), window=5, batch_size=4, loader_options={"seed": 1},
                              device="cpu", fields="nope"),
     cs.ConfigError, ValueError, ["fields='nope'"]),
    ("BatchStream.loader_options", lambda t: _stream(loader_options={"seed": 1}),
     cs.ConfigError, ValueError, ["loader_options=", "cs.ChunkLoader"]),
    ("BatchStream.options", lambda t: _stream_given(options={"seed": 1}),
     cs.ConfigError, ValueError, ["options='dict'", "cs.StreamOptions", "options=cs.StreamOptions("]),
    ("BatchStream.options", lambda t: _stream_given(seed=1, options=cs.StreamOptions(seed=2)),
     cs.ConfigError, ValueError, ["seed=1", "BatchStream(seed=...) and", "options=cs.StreamOptions(seed=...)"]),
    ("BatchStream.window", lambda t: _stream(window=0),
     cs.ConfigError, ValueError, ["window=0", "an integer >= 1"]),
    ("BatchStream.window", lambda t: _stream(window=51),
     cs.ConfigError, ValueError, ["window=51", "chunk length 50", "larger chunk_size"]),
    ("BatchStream.batch_size", lambda t: _stream(batch_size=0),
     cs.ConfigError, ValueError, ["batch_size=0", "plan=cs.plan_epoch"]),
    ("BatchStream.batch_size", lambda t: _stream(batch_size=None),
     cs.ConfigError, ValueError, ["batch_size=None", "an integer >= 1"]),
    ("BatchStream.batches_per_chunk", lambda t: _stream(batches_per_chunk=0),
     cs.ConfigError, ValueError, ["batches_per_chunk=0", "plan.batches_per_chunk"]),
    ("StreamOptions.chunks_per_epoch", lambda t: _stream(chunks_per_epoch=-1),
     cs.ConfigError, ValueError, ["chunks_per_epoch=-1", "plan.chunks_per_epoch"]),
    ("StreamOptions.chunks_per_epoch", lambda t: _stream("random"),
     cs.ConfigError, ValueError, ["chunks_per_epoch=None", "sampling='random'"]),
    ("StreamOptions.batches_per_epoch", lambda t: _stream(batches_per_epoch=-1),
     cs.ConfigError, ValueError, ["batches_per_epoch=-1", "plan.batches_per_epoch"]),
    ("StreamOptions.batches_per_epoch",
     lambda t: _stream(batches_per_epoch=4, chunks_per_epoch=2),
     cs.ConfigError, ValueError, ["batches_per_epoch=4", "in batches or in chunks"]),
    ("BatchStream.plan", lambda t: _stream(plan={"batch_size": 4}),
     cs.ConfigError, ValueError, ["plan='dict'", "cs.plan_epoch"]),
    ("BatchStream.fields", lambda t: _stream(fields="nope"),
     cs.ConfigError, ValueError, ["fields='nope'", "Name fields"]),
    ("BatchStream.fields", lambda t: _stream(fields=[]),
     cs.ConfigError, ValueError, ["fields=[]", "list of names"]),
    ("StreamOptions.seed", lambda t: _stream(seed=-1),
     cs.ConfigError, ValueError, ["seed=-1", "non-negative seed"]),
    ("BatchStream.load_state_dict.state", lambda t: _stream_state({}),
     cs.ConfigError, ValueError, ["state={}", "BatchStream.state_dict()"]),
    ("BatchStream.load_state_dict.state",
     lambda t: _stream_state({"loader": {"epoch": 0, "step": 0}, "batch": 2}),
     cs.ConfigError, ValueError, ["state=", "'batch' in [0, batches_per_chunk=2)"]),
    ("BatchStream.load_state_dict.state", lambda t: _stream_state(_stream_state_from(16)),
     cs.ConfigError, ValueError, ["saved with batches_per_chunk=16", "with batches_per_chunk=2",
                                  "Resume with batches_per_chunk=16"]),
    ("BatchStream.load_state_dict.state", lambda t: _stream_state({"epoch": 0, "step": 1}),
     cs.ConfigError, ValueError, ["ChunkLoader state", "loader.load_state_dict"]),
    ("Trainer.fit.resume", lambda t: _resume_trainer(t, chunk_size=128),
     cs.ConfigError, ValueError, ["chunk_size=128 (now 64)", "Resume with the checkpoint's"]),
    ("StreamOptions.dtype", lambda t: _stream(dtype=torch.int64),
     cs.ConfigError, ValueError, ["dtype=torch.int64", "torch.float32", "floating torch dtype"]),
    ("BatchStream.mix", lambda t: _stream(mix=0),
     cs.ConfigError, ValueError, ["mix=0", "an int >= 1", "mix=1"]),
    ("BatchStream.mix", lambda t: _stream(mix=2.0),
     cs.ConfigError, ValueError, ["mix=2.0", "an int >= 1", "mix=8"]),
    ("BatchStream.mix", lambda t: _stream(mix="most"),
     cs.ConfigError, ValueError, ["mix='most'", "an int >= 1"]),
    ("BatchStream.buffer", lambda t: _stream(buffer="gpu"),
     cs.ConfigError, ValueError, ["buffer='gpu'", "'auto', 'host', 'device'", "buffer='host'"]),
    ("BatchStream.device", lambda t: _stream(device="meta"),
     cs.ConfigError, ValueError, ["device='meta'", "a CUDA device"]),
    ("StreamOptions.host_memory", lambda t: _stream(host_memory=0),
     cs.ConfigError, ValueError, ["host_memory=0", "budget in bytes"]),
    ("StreamOptions.batch_prefetch", lambda t: _stream(batch_prefetch=-1),
     cs.ConfigError, ValueError, ["batch_prefetch=-1", "gathers ahead"]),
    ("StreamOptions.gather_threads", lambda t: _stream(gather_threads=0),
     cs.ConfigError, ValueError, ["gather_threads=0", "Pass None"]),
    ("gather_windows.starts",
     lambda t: cs.gather_windows(torch.zeros(9, 2), torch.tensor([0, 7]), 3),
     cs.ConfigError, ValueError, ["starts=", "[0, 6]", "sample_windows"]),
    ("StreamOptions.align", lambda t: _stream(align=0),
     cs.ConfigError, ValueError, ["align=0", "an integer >= 1", "align=1"]),
    ("StreamOptions.align", lambda t: _stream(align=True),
     cs.ConfigError, ValueError, ["align=True", "an integer >= 1", "time_units"]),
    ("sample_windows.align", lambda t: cs.sample_windows(100, 4, 5, align=0),
     cs.ConfigError, ValueError, ["align=0", "an integer >= 1", "align=1"]),
    ("sample_windows.align", lambda t: cs.sample_windows(100, 4, 5, align=2.0),
     cs.ConfigError, ValueError, ["align=2.0", "an integer >= 1"]),
    ("sample_windows.align", lambda t: cs.sample_windows(_unaligned_chunk(), 2, 4, align=16),
     cs.ConfigError, ValueError, ["align=16", "window=4", "Lower align", "ChunkLoader(align"]),
    ("WindowSampler.align", lambda t: WindowSampler(20, 4, 2, align=0),
     cs.ConfigError, ValueError, ["align=0", "an integer >= 1"]),
    ("WindowSampler.align", lambda t: WindowSampler(
        8, 4, 2, pieces=_unaligned_chunk().pieces, align=16),
     cs.ConfigError, ValueError, ["align=16", "pieces of up to 8 timesteps", "Lower align"]),
    ("TrainConfig.pieces", lambda t: _train_config(pieces=0),
     cs.ConfigError, ValueError, ["pieces=0", "an int >= 1", '"auto"', "pieces=1"]),
    ("TrainConfig.pieces", lambda t: _train_config(pieces="all"),
     cs.ConfigError, ValueError, ["pieces='all'", 'pieces="auto"', "stored time chunk"]),
    ("TrainConfig.mix", lambda t: _train_config(mix=0),
     cs.ConfigError, ValueError, ["mix=0", "an int >= 1", '"auto"']),
    ("TrainConfig.mix", lambda t: _train_config(mix="max"),
     cs.ConfigError, ValueError, ["mix='max'", "an int >= 1", 'mix="auto"', "the memory allows"]),
    ("TrainConfig.buffer", lambda t: _train_config(buffer="gpu"),
     cs.ConfigError, ValueError, ["buffer='gpu'", "'auto', 'host' or 'device'", "name a tier"]),
    ("JoinSource.sources.empty", lambda t: cs.JoinSource(),
     cs.ConfigError, ValueError, ["sources=()", "at least one source", "cs.JoinSource(traces"]),
    ("JoinSource.sources.type", lambda t: cs.JoinSource(cs.NumpySource({"a": _x()}), _x()),
     cs.ConfigError, ValueError, ["sources['part 1']='ndarray'", "cs.ZarrSource(path)"]),
    ("JoinSource.sources.lengths", _join_lengths,
     cs.FieldLengthError, ValueError, ["long ZarrSource(", "x.zarr", "has 200",
                                       "short ZarrSource(", "has 199", "Slice the longer"]),
    ("JoinSource.sources.names",
     lambda t: cs.JoinSource(cs.NumpySource({"a": _x()}), cs.NumpySource({"a": _x()})),
     cs.ConfigError, ValueError, ["field 'a' in both part 0", "part 1", "unique field names",
                                  "Rename a field"]),
    ("JoinSource.read_threads",
     lambda t: cs.JoinSource(cs.NumpySource({"a": _x()}), read_threads=0),
     cs.ConfigError, ValueError, ["read_threads=0", "Pass None"]),
    ("gather_windows.dtype",
     lambda t: cs.gather_windows(torch.zeros(9, 2), torch.tensor([0]), 3, dtype=torch.int32),
     cs.ConfigError, ValueError, ["dtype=torch.int32", "torch.float16", "floating torch dtype"]),
    ("gather_windows.out",
     lambda t: cs.gather_windows(torch.zeros(9, 2, dtype=torch.float16), torch.tensor([0]), 3,
                                 out=torch.empty(1, 3, 2, dtype=torch.float16),
                                 dtype=torch.float32),
     cs.ConfigError, ValueError, ["out=", "torch.float16", "torch.float32", "Allocate out"]),
    ("convert_store.dtype", lambda t: _convert_dtype(t, "int8"),
     cs.ConfigError, ValueError, ["dtype='int8'", "float16", "--dtype float16"]),
    ("convert_store.dtype.range", lambda t: _convert_dtype(t, "float16", big=True),
     cs.ConfigError, ValueError, ["dtype='float16'", "field 'x'", "65504", "Convert to float32"]),
    ("convert_store.workers", lambda t: _convert_dtype(t, None, workers=True),
     cs.ConfigError, ValueError, ["workers=True", "an integer >= 1"]),
    ("compat.load_fn", lambda t: compat.RandomChunkLoader(3, 500, 50, device="cpu"),
     cs.ConfigError, ValueError, ["load_fn=3", "a callable"]),
    ("compat.total_timesteps", lambda t: compat.RandomChunkLoader(_load, 0, 50, device="cpu"),
     cs.ConfigError, ValueError, ["total_timesteps=0", "The source must hold data"]),
    ("compat.chunk_size", lambda t: compat.RandomChunkLoader(_load, 500, 0, device="cpu"),
     cs.ConfigError, ValueError, ["chunk_size=0", "Pass a positive chunk_size"]),
    ("compat.device", lambda t: compat.RandomChunkLoader(_load, 500, 50, device="tpu:0"),
     cs.ConfigError, ValueError, ["device='tpu:0'", "'cpu'"]),
    ("compat.prefetch", lambda t: compat.RandomChunkLoader(_load, 500, 50, "cpu", prefetch=0),
     cs.ConfigError, ValueError, ["prefetch=0", "Use 1 or more"]),
    ("compat.seed", lambda t: compat.RandomChunkLoader(_load, 500, 50, "cpu", seed=[1]),
     cs.ConfigError, ValueError, ["seed=[1]", "Pass an int seed"]),
    ("compat.time_units", lambda t: compat.RandomChunkLoader(_load, 500, 50, "cpu", time_units=0),
     cs.ConfigError, ValueError, ["time_units=0", "Use 1 for no alignment"]),
    ("compat.gpu_prefetch", lambda t: compat.PipelineChunkLoader(_load, 500, 50, "cpu", gpu_prefetch=0),
     cs.ConfigError, ValueError, ["gpu_prefetch=0", "Use 1 or more"]),
    ("compat.start_epoch.num_chunks", lambda t: _compat_epoch(-1),
     cs.ConfigError, ValueError, ["num_chunks=-1", "calculate_chunk_params"]),
]  # fmt: skip


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    assert wait_for_no_threads() == [], "a test left chunkstream threads running"


@pytest.mark.parametrize(
    ("row", "call", "error", "builtin", "says"),
    CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)],
)
def test_bad_input_is_refused_clearly(tmp_path, row, call, error, builtin, says):
    before = {t.ident for t in chunkstream_threads()}
    with pytest.raises(cs.ChunkstreamError) as info:
        call(tmp_path)
    assert type(info.value) is error, (type(info.value), str(info.value))
    assert isinstance(info.value, builtin)
    message = str(info.value)
    for text in says:
        assert text in message, f"{row}: {text!r} not in {message!r}"
    # nothing keeps running after a refusal: no thread beyond those alive before the call
    deadline = time.monotonic() + 2.0
    while {t.ident for t in chunkstream_threads()} - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {t.ident for t in chunkstream_threads()} <= before, chunkstream_threads()


def test_check_int_is_the_one_integer_rule():
    from chunkstream._errors import check_int

    assert check_int("n", 3) == 3 and check_int("n", 0, 0) == 0
    assert check_int("n", np.int64(4), numpy=True) == 4
    assert type(check_int("n", np.int64(4), numpy=True)) is int
    for bad, kwargs in [(True, {}), (np.int64(4), {}), (2.0, {}), ("3", {}), (0, {}),
                        (np.True_, {"numpy": True}), (5, {"maximum": 4})]:  # fmt: skip
        with pytest.raises(cs.ConfigError) as info:
            check_int("depth", bad, fix="Use 1.", **kwargs)
        message = str(info.value)
        assert f"depth={bad!r}" in message and message.endswith("Use 1."), message
    with pytest.raises(cs.ConfigError, match=r"expected an integer in \[1, 4\]"):
        check_int("depth", 5, maximum=4)
    with pytest.raises(cs.ConfigError, match="expected a positive int or None"):
        check_int("depth", -1, expected="a positive int or None")


def test_every_documented_row_has_a_case_and_every_case_a_row():
    rows = set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.MULTILINE))
    rows = {r for r in rows if not r.startswith("chunkstream ")}  # tests/test_cli_sweep.py
    cases = {case[0] for case in CASES}
    assert rows, "no rows found in docs/parameters.md"
    assert rows - cases == set(), "documented rows without a test"
    assert cases - rows == set(), "tested rows missing from the docs"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on CPU-only machines")
def test_cuda_without_a_gpu_is_refused_with_the_fix():
    before = len(chunkstream_threads())
    with pytest.raises(cs.ConfigError, match="device='cuda'") as info:
        cs.ChunkLoader(_src(), 50, device="cuda")
    assert "Pass device='cpu'" in str(info.value)
    assert len(chunkstream_threads()) == before


def test_a_plain_file_is_not_a_zarr_store(tmp_path):
    path = tmp_path / "data.zarr"
    path.write_bytes(b"not zarr at all")
    with pytest.raises(cs.NotZarrError, match=r"data\.zarr"):
        cs.ZarrSource(path)


_HINT = re.compile(r"chunkstream (demo|synth|inspect|convert|plan|bench)\b([^`\"'\n]*)")


def test_every_cli_flag_a_message_names_exists():
    # issue 19: a dtype error's fix named `chunkstream convert --dtype`, which does not exist
    from chunkstream.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    src = Path(cs.__file__).resolve().parent
    named = []
    for path in sorted(src.rglob("*.py")):
        for m in _HINT.finditer(path.read_text(encoding="utf-8")):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2)):
                named.append((path.name, m.group(1), flag))
    assert named, "no fix hint names a CLI flag: the pattern is wrong"
    unknown = [(f, cmd, flag) for f, cmd, flag in named
               if flag not in commands[cmd]._option_string_actions]  # fmt: skip
    assert unknown == [], f"messages name flags the CLI does not have: {unknown}"


def test_a_window_longer_than_the_chunk_is_one_error_wherever_it_is_found():
    # The loader (options.window), the stream (window) and the sampler (window) say it
    # with one message, written once (chunkstream.plans.window_in_chunk).
    messages = []
    for refuse in (
        lambda: _loader(window=80),
        lambda: _stream(window=51),
        lambda: cs.sample_windows(50, batch_size=4, window=51),
    ):
        with pytest.raises(cs.ConfigError) as info:
            refuse()
        messages.append(re.sub(r"window=\d+", "window=W", str(info.value)))
    assert messages[0] == messages[1] == messages[2], messages
    assert "at most the chunk length 50" in messages[0]
