"""The ``zarrs`` engine: a zarr array re-opened with the zarrs Rust codec pipeline (optional extra).

zarr-python picks an array's codec pipeline from its global config when the
array object is made, so :func:`with_zarrs_pipeline` makes a second array
object over the same store and metadata while that config names zarrs. The
pipeline is ``strict``: an array zarrs cannot read is refused here, at open,
instead of falling back silently to zarr's own pipeline on every read.

What zarrs gives and what it does not (zarrs 0.2.3, checked by the tests):
it writes straight into the caller's buffer and raises for a truncated or
corrupt frame (``RuntimeError`` for blosc, ``OSError`` for zstd and gzip), but
like zarr it reads an absent chunk as the fill value, so ``ZarrSource`` keeps
its own missing-chunk check on this engine too.
"""

from __future__ import annotations

import zarr

from .._errors import ConfigError

__all__ = ["with_zarrs_pipeline"]


def with_zarrs_pipeline(arr: zarr.Array, threads: int | None) -> zarr.Array:
    """``arr`` read through zarrs (``threads``: its decode threads; ``None``: zarrs' default)."""
    try:
        import zarrs  # noqa: F401  (the pipeline class is looked up by name below)
        from zarrs.pipeline import UnsupportedMetadataError
    except ImportError as exc:
        raise ImportError(
            "ZarrSource(engine='zarrs') needs zarrs: `pip install chunkstream[zarrs]`, or "
            "use engine='auto'."
        ) from exc
    from zarr.core.array import AsyncArray

    settings: dict = {
        "codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
        "codec_pipeline.strict": True,
    }
    if threads is not None:
        settings["threading.max_workers"] = threads
    # zarr's config is process-wide: while it is set, an array another thread makes gets
    # zarrs as well (same data, other decoder). No I/O happens inside, so the window is short.
    with zarr.config.set(settings):
        try:
            inner = AsyncArray(metadata=arr.metadata, store_path=arr.store_path, config=arr.config)
        except (UnsupportedMetadataError, TypeError, ValueError) as exc:
            # a store zarrs cannot rebuild in Rust (e.g. obstore's MemoryStore) is a ValueError
            # ("Expected an object store-compatible instance"), unsupported codecs the others
            raise ConfigError.bad(
                "engine", "zarrs", f'"auto" or "zarr" for {arr.store_path}',
                f"zarrs cannot read this array's codecs or store ({exc}).",
            ) from exc  # fmt: skip
    return zarr.Array(inner)
