"""The public surface is exactly this list; changing it is a decision, not an accident."""

import inspect

import chunkstream as cs

PUBLIC = [
    "BatchStream", "BatchTimer", "CacheWarning", "CallableSource", "Chunk", "ChunkLoadError", "ChunkLoader", "ChunkMixer",
    "ChunkstreamError",
    "ConfigError", "CorruptChunkError", "EpochPlan", "FieldDtypeError", "FieldLengthError",
    "FieldSelectionError", "FieldSpec", "JoinSource", "LatencyStats", "LoaderClosedError", "LoaderConfig", "LoaderOptions",
    "LoaderStalledError", "MissingChunkError", "NonFiniteError", "NotZarrError", "NumpySource",
    "Piece", "PiecePlan", "RandomPlan", "ReadAmplificationWarning", "Recordings", "RemoteOptions", "RemotePermissionError", "RemoteStoreError", "Segments", "SequentialPlan", "ShuffledPlan", "Source",
    "SourceError", "SourceNotFoundError", "StreamOptions", "TensorStoreSource", "WindowPlan", "WindowSampler",
    "ZarrGroupSource", "ZarrSource", "__version__", "compat", "flyvis", "gather_windows", "make_plan",
    "neighbour_union", "plan_epoch", "plans", "plot_timeline", "sample_windows",
    "split_segments", "staggered_observations", "zero_neurons_with_neighbours",
]  # fmt: skip


def test_all_is_pinned_and_sorted():
    assert cs.__all__ == sorted(cs.__all__)
    assert sorted(PUBLIC) == cs.__all__
    for name in cs.__all__:
        assert getattr(cs, name) is not None


def test_compat_names_the_originals_api_and_the_guides():
    from chunkstream import compat

    assert compat.__all__ == [
        "ChunkLatencyStats", "GuideRandomChunkLoader", "PipelineChunkLoader", "RandomChunkLoader",
        "calculate_chunk_params", "create_zarr_loader", "sample_batch_within_chunk",
    ]  # fmt: skip
    # The merged code's loader takes time_units; the guide's form does not.
    assert "time_units" in inspect.signature(compat.RandomChunkLoader).parameters
    assert "time_units" not in inspect.signature(compat.GuideRandomChunkLoader).parameters


def test_errors_inherit_the_builtins_callers_catch():
    assert issubclass(cs.ConfigError, ValueError)
    assert issubclass(cs.SourceNotFoundError, FileNotFoundError)
    assert issubclass(cs.FieldSelectionError, IndexError)
    assert issubclass(cs.FieldDtypeError, TypeError)
    assert issubclass(cs.MissingChunkError, FileNotFoundError)
    assert issubclass(cs.LoaderStalledError, cs.ChunkLoadError)
    assert issubclass(cs.LoaderStalledError, TimeoutError)
    assert issubclass(cs.RemotePermissionError, PermissionError)
    assert issubclass(cs.RemotePermissionError, cs.RemoteStoreError)
    for name in cs.__all__:
        obj = getattr(cs, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert obj is cs.ChunkstreamError or issubclass(obj, cs.ChunkstreamError), name


def test_every_public_object_has_a_docstring():
    for name in cs.__all__:
        obj = getattr(cs, name)
        if callable(obj) or isinstance(obj, type):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
