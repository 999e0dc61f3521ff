"""Drop-in replacements for the original implementation's API (change one import).

Signatures and return values match the original (see DESIGN.md, "Drop-in
compatibility"); the machinery underneath is the public
:class:`~chunkstream.ChunkLoader`, fed by a :class:`~chunkstream.CallableSource`
over ``load_fn``.

**The same windows as the original.** Each loader keeps one
``random.Random(seed)`` and takes one draw per chunk the original would have
loaded, across epochs: ``randint(0, max(0, T - chunk_size))`` for
:class:`RandomChunkLoader`, ``randint(0, n_valid - 1) * time_units`` for
:class:`PipelineChunkLoader`. An epoch's chunk ``k`` is the draw after those
the earlier epochs consumed, so the same seed gives the same ``load_fn`` calls
in the same order. An epoch drained to its end consumed its ``num_chunks``
draws. An epoch abandoned by ``start_epoch`` after ``d`` chunks consumed
``min(num_chunks, d + depth)``: what the original's reader had loaded once it
had filled its queues, ``depth = prefetch + 1`` for ``RandomChunkLoader`` (its
queue and the chunk blocked on ``put``) and ``prefetch + gpu_prefetch + 2`` for
``PipelineChunkLoader`` (both queues and a chunk held by each thread). That is
the original's count whenever its reader was ahead of the training loop, the
usual case; a restart that came before the reader had filled its queues (e.g.
``start_epoch`` twice in a row) consumed fewer draws there, a number that
depended on thread timing, and compat then still counts ``d + depth``.

**load_fn** is called as the original calls it: only for windows of the
draws above, each ``chunk_size`` long (the whole data, ``(0, T)``, when
``chunk_size > T``). No probe call: the arrays' shapes and dtypes are learnt
from the first real window, which ``start_epoch`` starts reading in a
background thread (``chunkstream-compat-first-<epoch>``), as the original's
reader thread did; the first ``get_next_chunk()`` waits for it with a bounded
wait and then builds the pipeline, which answers that window from the arrays
already read and reads ahead from the second on.

**Where compat deliberately differs from the original:**

* a ``load_fn`` error raises :class:`~chunkstream.ChunkLoadError` in
  ``get_next_chunk`` (its ``__cause__`` the original exception) and shuts the
  loader down, where the original hung forever; a later call raises
  :class:`~chunkstream.LoaderClosedError`;
* a ``load_fn`` that does not return within the stall timeout (300 s) raises
  :class:`~chunkstream.LoaderStalledError` with the reader's stack instead of
  blocking forever;
* ``start_epoch`` mid-epoch abandons the old epoch at once: no 2 s join, and
  no stale end-of-epoch marker that made the new epoch yield nothing;
* windows read ahead for an abandoned epoch (at most the pipeline's read-ahead,
  ``prefetch + 1`` on the CPU) were passed to ``load_fn`` and are dropped; a
  first read already begun when its epoch is abandoned runs to its end, and
  the next epoch's first read starts after it (one ``load_fn`` call at a time);
* the pipeline exists from the first ``get_next_chunk()`` on, so in the first
  epoch only its first window is read before that call (the original's reader
  read ahead from ``start_epoch``);
* a read that fails with a transient I/O error is retried twice, as
  ``ChunkLoader``'s reads (the original retried nothing), except the first
  window, read before the pipeline exists;
* every window's arrays must keep the first window's per-timestep shape and
  dtype (a ``ChunkLoadError`` otherwise), and ``start_epoch`` refuses a
  ``num_chunks`` that is not an int >= 0 with a ``ConfigError``;
* ``get_stats()['chunks_transferred']`` counts chunks delivered this epoch for
  both loaders (the original ``PipelineChunkLoader`` counted copies to the
  device, up to ``gpu_prefetch + 1`` ahead), and ``chunks_loaded`` counts
  ``load_fn`` calls of this epoch that returned, which depends on compat's
  read-ahead, not the original's;
* on CUDA chunks are copied from a fixed pool of pinned host memory, not a
  pinned copy per chunk, and the host does not block on the copy (under
  torchrun every rank still reads the whole, unsharded sequence, as the
  original did);
* ``ChunkLatencyStats.print_summary`` prints a table of the summary's keys;
* ``cleanup()`` also closes the store that :func:`create_zarr_loader` opened,
  once no other live compat loader uses it (it reopens on its next call); a
  ``load_fn`` still running after a few seconds is left to finish in its
  daemon thread.
"""

from ..plans import calculate_chunk_params
from ._helpers import ChunkLatencyStats, create_zarr_loader, sample_batch_within_chunk
from ._loaders import PipelineChunkLoader, RandomChunkLoader

__all__ = [
    "ChunkLatencyStats",
    "PipelineChunkLoader",
    "RandomChunkLoader",
    "calculate_chunk_params",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]
