"""The public surface is exactly this list; changing it is a decision, not an accident."""

import inspect

import chunkstream as cs

PUBLIC = [
    "BatchStream", "BatchTimer", "CacheWarning", "CallableSource", "Chunk", "ChunkLoadError", "ChunkLoader",
    "ChunkstreamError",
    "ConfigError", "CorruptChunkError", "EpochPlan", "FieldDtypeError", "FieldLengthError",
    "FieldSelectionError", "FieldSpec", "JoinSource", "LatencyStats", "LoaderClosedError", "LoaderOptions",
    "LoaderStalledError", "MissingChunkError", "NonFiniteError", "NotZarrError", "NumpySource",
    "Piece", "PiecePlan", "RandomPlan", "ReadAmplificationWarning", "Recordings", "RemoteOptions", "RemotePermissionError", "RemoteStoreError", "Segments", "SequentialPlan", "ShuffledPlan", "Source",
    "SourceError", "SourceNotFoundError", "StreamOptions", "TensorStoreSource", "WindowPlan",
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


def test_the_mixer_and_the_sampler_are_private_and_still_found_for_one_release():
    """``ChunkMixer`` and ``WindowSampler`` left the public API (issue 47): the old spellings
    resolve for one release, each with a ``FutureWarning`` naming what replaces it."""
    import pytest

    from chunkstream import consumer
    from chunkstream.consumer._mixing import ChunkMixer
    from chunkstream.consumer._sampling import WindowSampler

    for module in (cs, consumer):
        assert "ChunkMixer" not in module.__all__ and "WindowSampler" not in module.__all__
        with pytest.warns(FutureWarning, match=r"ChunkMixer is no longer public.*BatchStream"):
            assert module.ChunkMixer is ChunkMixer
        with pytest.warns(FutureWarning, match=r"WindowSampler .*sample_windows.*gather_windows"):
            assert module.WindowSampler is WindowSampler
        with pytest.raises(AttributeError):
            module.NoSuchName  # noqa: B018


def test_the_augmentation_moved_to_compat_and_is_still_found_under_consumer_for_one_release():
    """The original's augmentation lives beside its batch sampler in ``chunkstream.compat``
    (issue 47: ``consumer/`` keeps only what draws batches); ``cs.neighbour_union`` and
    ``cs.zero_neurons_with_neighbours`` are unchanged, and the ``chunkstream.consumer``
    spellings resolve for one release with a ``FutureWarning`` naming ``cs.``'s."""
    import pytest

    from chunkstream import compat, consumer

    assert cs.neighbour_union is compat.neighbour_union
    assert cs.zero_neurons_with_neighbours is compat.zero_neurons_with_neighbours
    for name in ("neighbour_union", "zero_neurons_with_neighbours"):
        assert name in cs.__all__ and name not in consumer.__all__
        with pytest.warns(
            FutureWarning, match=rf"consumer\.{name} is no longer public.*cs\.{name}"
        ):
            assert getattr(consumer, name) is getattr(compat, name)


def test_loader_config_is_private_and_still_found_for_one_release():
    """``LoaderConfig`` left the public API (issue 47 part 5: ``LoaderOptions`` is the one
    settings type users pass): ``cs.LoaderConfig`` and ``chunkstream.pipeline.LoaderConfig``
    resolve for one release, with a ``FutureWarning`` naming the replacement."""
    import pytest

    from chunkstream import pipeline
    from chunkstream.pipeline import ResolvedSettings

    for module in (cs, pipeline):
        assert "LoaderConfig" not in module.__all__
        with pytest.warns(
            FutureWarning,
            match=r"LoaderConfig is no longer public .*0\.3.*"
            r"keywords and options=cs\.LoaderOptions",
        ):
            assert module.LoaderConfig is ResolvedSettings
        with pytest.raises(AttributeError):
            module.NoSuchName  # noqa: B018
    assert "config=" in (ResolvedSettings.__doc__ or "") and "read-only" in ResolvedSettings.__doc__
