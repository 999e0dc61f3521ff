"""JoinSource on real stores: the mixes of a ZAPBench-like dataset, concurrency, errors.

The conformance suite (tests/test_sources.py, kinds ``join*``) covers windows, dirty
buffers and concurrent readers; this module covers what is particular to a join.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import chunkstream as cs
from chunkstream import flyvis
from tests.stores import make_array, make_flyvis, random_data

T, N, COV = 61, 9, 26


def _write_traces(path: Path, data: np.ndarray, pad: int) -> dict:
    """Write ``data`` (T, N) float16 as zarr v3 via tensorstore with ``pad`` rows before and
    after it; return a spec whose transform selects the real rows (domain [pad, pad + T))."""
    ts = pytest.importorskip("tensorstore")
    base = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    shape = [data.shape[0] + 2 * pad, data.shape[1]]
    grid = {"name": "regular", "configuration": {"chunk_shape": [8, data.shape[1]]}}
    meta = {"shape": shape, "data_type": "float16", "chunk_grid": grid}
    store = ts.open({**base, "metadata": meta}, create=True).result()
    store[pad : pad + data.shape[0]].write(data).result()
    domain = {"input_inclusive_min": [pad, 0], "input_exclusive_max": [pad + data.shape[0], N]}
    return {**base, "transform": domain}


@pytest.fixture
def zapbench(tmp_path):
    """The four stores of a ZAPBench-like dataset and the truth for each field."""
    rng = np.random.default_rng(3)
    truth = {
        "traces": rng.standard_normal((T, N)).astype(np.float16),
        "mask": rng.random((T, N)) > 0.3,
        "covariates": rng.standard_normal((T, COV)).astype(np.float32),
        "frame": np.arange(T, dtype=np.int32) * 3 + 7,
    }
    spec = _write_traces(tmp_path / "traces.zarr", truth["traces"], pad=4)
    make_array(tmp_path / "mask.zarr", truth["mask"], (16, N), zarr_format=2, codec="zstd")
    make_array(tmp_path / "frame.zarr", truth["frame"], (10,), zarr_format=3, codec=None)

    def open_parts() -> dict[str, cs.Source]:
        return {
            "traces": cs.TensorStoreSource(spec),
            "mask": cs.ZarrSource(tmp_path / "mask.zarr"),
            "covariates": cs.NumpySource({"stim": truth["covariates"]}),
            "frame": cs.ZarrSource(tmp_path / "frame.zarr"),
        }

    return open_parts, truth


def test_every_mix_streams_as_stored_and_equals_each_store(zapbench):
    open_parts, truth = zapbench
    alone = open_parts()
    with cs.JoinSource(open_parts()) as join:
        assert list(join.fields) == ["traces", "mask", "covariates", "frame"]
        dtypes = {n: s.dtype for n, s in join.fields.items()}
        assert dtypes == {"traces": np.float16, "mask": np.bool_, "covariates": np.float32,
                          "frame": np.int32}  # fmt: skip
        assert join.nbytes_per_step == N * 2 + N * 1 + COV * 4 + 4
        with cs.ChunkLoader(join, 16, device="cpu", workers=3, seed=2) as ld:  # shuffled
            seen, per_pass = 0, ld.plan.windows_per_pass
            for chunk in ld.epoch():
                seen += 1
                for name, tensor in chunk.items():
                    np.testing.assert_array_equal(
                        tensor.numpy(), truth[name][chunk.start : chunk.stop]
                    )
                    # ... and equals the store's own read of the same window
                    part = alone[name]
                    own = {n: np.empty((chunk.stop - chunk.start, *s.shape), s.dtype)
                           for n, s in part.fields.items()}  # fmt: skip
                    part.read_into(chunk.start, chunk.stop, own)
                    np.testing.assert_array_equal(tensor.numpy(), next(iter(own.values())))
        assert seen == per_pass == T // 16
    for part in alone.values():
        part.close()


def test_parts_are_read_concurrently_on_named_threads(tmp_path):
    """Every part blocks on one barrier: a join that read its parts one by one would break it."""
    arrays = [random_data((T, 3), seed=s) for s in range(3)]
    barrier = threading.Barrier(3, timeout=20)
    threads: dict[str, str] = {}

    class Meeting(cs.NumpySource):
        def read_into(self, start, stop, out):
            threads[next(iter(self.fields))] = threading.current_thread().name
            barrier.wait()
            super().read_into(start, stop, out)

    join = cs.JoinSource(*(Meeting({f"f{i}": a}) for i, a in enumerate(arrays)))
    out = {n: np.empty((10, 3), np.float32) for n in join.fields}
    join.read_into(5, 15, out)
    for i, array in enumerate(arrays):
        np.testing.assert_array_equal(out[f"f{i}"], array[5:15])
    assert threads["f0"] == threading.current_thread().name  # the first part: the caller
    assert threads["f1"].startswith("chunkstream-join-")
    assert threads["f2"].startswith("chunkstream-join-")
    join.close()
    assert not any(t.name in (threads["f1"], threads["f2"]) and t.is_alive()
                   for t in threading.enumerate())  # fmt: skip
    join.close()  # idempotent


def test_close_closes_every_part(tmp_path):
    parts = [cs.NumpySource({f"x{i}": np.zeros((5, 2), "f4")}) for i in range(2)]
    cs.JoinSource(*parts).close()
    assert all(not p._arrays for p in parts)  # NumpySource.close drops its arrays


def test_a_failing_part_names_the_store_the_field_and_the_window(zapbench, tmp_path):
    open_parts, _ = zapbench
    join = cs.JoinSource(open_parts())
    chunk = tmp_path / "mask.zarr" / "1.0"  # zarr v2 key: time chunk 1 (rows 16..31)
    chunk.unlink()
    with (
        cs.ChunkLoader(
            join,
            16,
            device="cpu",
            sampling="sequential",
            options=cs.LoaderOptions(close_source=True),
        ) as ld,
        pytest.raises(cs.ChunkLoadError) as info,
    ):
        list(ld.epoch())
    error = info.value
    assert error.window == (16, 32) and error.field == "mask"
    assert "[16, 32)" in str(error) and "'mask'" in str(error)
    cause = error.__cause__
    assert isinstance(cause, cs.MissingChunkError)  # the part's error keeps its type
    note = "\n".join(getattr(cause, "__notes__", []))
    assert "mask.zarr" in note and "[16, 32)" in note and "part mask" in note


def test_lengths_must_match_and_name_each_store(tmp_path):
    make_array(tmp_path / "a.zarr", random_data((T, 4)), (16, 4))
    make_array(tmp_path / "b.zarr", random_data((T - 1, 4)), (16, 4))
    a, b = cs.ZarrSource(tmp_path / "a.zarr"), cs.ZarrSource(tmp_path / "b.zarr")
    with pytest.raises(cs.FieldLengthError) as info:
        cs.JoinSource({"a": a, "b": b})
    message = str(info.value)
    assert "a.zarr" in message and "b.zarr" in message
    assert f"has {T}" in message and f"has {T - 1}" in message


def test_duplicate_field_names_are_refused_with_the_fix():
    x = np.zeros((5, 2), "f4")
    with pytest.raises(cs.ConfigError, match=r"'x'.*part 0.*part 1.*unique.*Rename"):
        cs.JoinSource(cs.NumpySource({"x": x}), cs.NumpySource({"x": x}))
    # several-field parts keep their names, even under a label
    with pytest.raises(cs.ConfigError, match="'a'"):
        cs.JoinSource({"p": cs.NumpySource({"a": x, "b": x}), "a": cs.NumpySource({"z": x})})


def test_flyvis_open_joins_with_covariates(tmp_path):
    data = make_flyvis(tmp_path / "run", T=40, N=6, chunks=(8, 6, 1))
    covariates = random_data((40, COV), seed=5)
    src = flyvis.open(tmp_path / "run", column="voltage")
    with cs.JoinSource(src, cs.NumpySource({"covariates": covariates})) as join:
        assert list(join.fields) == ["voltage", "stimulus", "covariates"]
        out = {n: np.empty((12, *s.shape), s.dtype) for n, s in join.fields.items()}
        join.read_into(20, 32, out)
    np.testing.assert_array_equal(out["voltage"], data[20:32, :, 0])
    np.testing.assert_array_equal(out["stimulus"], data[20:32, :, 1])
    np.testing.assert_array_equal(out["covariates"], covariates[20:32])


def test_a_failure_is_raised_only_after_every_part_has_finished():
    """A part that fails fast must not let read_into return while a slow part still writes."""
    finished = threading.Event()
    release = threading.Event()

    class Failing(cs.NumpySource):
        def read_into(self, start, stop, out):
            release.set()  # the slow part may finish now, after this one has failed
            raise OSError("disk went away")

    class Slow(cs.NumpySource):
        def read_into(self, start, stop, out):
            assert release.wait(20)
            super().read_into(start, stop, out)
            finished.set()

    x = random_data((T, 2))
    join = cs.JoinSource(Failing({"a": x}), Slow({"b": x}))
    out = {n: np.zeros((5, 2), np.float32) for n in join.fields}
    with pytest.raises(OSError, match="disk went away") as info:
        join.read_into(0, 5, out)
    assert finished.is_set()  # the slow part was waited for
    np.testing.assert_array_equal(out["b"], x[:5])
    assert info.value.chunkstream_field == "a"
    assert "part 0 (Failing), fields ['a'], failed reading window [0, 5)" in info.value.__notes__[0]
    join.close()


def test_pieces_of_a_join_start_on_every_parts_stored_chunk_grid(tmp_path):
    """Time chunks of 40 and 60 steps: the join's grid is their lcm, 120, so every piece
    start is on both grids and a piece of 240 steps decodes whole chunks of each store."""
    rng = np.random.default_rng(5)
    a = make_array(tmp_path / "a.zarr", rng.standard_normal((2400, 3)).astype(np.float32), (40, 3))
    b = make_array(tmp_path / "b.zarr", rng.standard_normal((2400, 2)).astype(np.float32), (60, 2),
                   zarr_format=2)  # fmt: skip
    numpy = cs.NumpySource({"c": np.arange(2400, dtype=np.int64)})
    with cs.ZarrSource(tmp_path / "a.zarr") as alone:
        assert (alone.time_chunk, numpy.time_chunk) == (40, 1)
    join = cs.JoinSource({"a": cs.ZarrSource(tmp_path / "a.zarr"),
                          "b": cs.ZarrSource(tmp_path / "b.zarr"), "c": numpy})  # fmt: skip
    assert join.time_chunk == 120
    with cs.ChunkLoader(join, 960, device="cpu", sampling="random", seed=2, workers=1, options=cs.LoaderOptions(pieces=4)) as loader:  # fmt: skip
        assert loader.plan.piece_align == 120
        chunks = list(loader.epoch(6))
        starts = [p.start for c in chunks for p in c.pieces]
        for chunk in chunks:
            for p in chunk.pieces:
                np.testing.assert_array_equal(
                    chunk["a"].numpy()[p.offset : p.offset + p.length], a[p.start : p.stop]
                )
                np.testing.assert_array_equal(
                    chunk["b"].numpy()[p.offset : p.offset + p.length], b[p.start : p.stop]
                )
    assert len(starts) == 24 and all(s % 40 == 0 and s % 60 == 0 for s in starts)
    assert len(set(starts)) > 1
    # a join of a join keeps the grid; a part without a grid leaves it unchanged
    with cs.JoinSource(join, cs.NumpySource({"d": np.zeros(2400)})) as outer:  # closes join
        assert outer.time_chunk == 120
