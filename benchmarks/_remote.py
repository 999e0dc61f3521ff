"""The remote stores, raced against the same local servers behind the same fault hook (issue 11).

Servers, both on 127.0.0.1 and both behind ``tests/faults.py``'s fault hook (500s,
stalls, dropped connections on demand): a threaded HTTP file server over a local
zarr array, and moto's S3 server holding a copy of it (the hook as a proxy in front).

Stores, each opened on each server with the same bounds (``timeout`` s per request,
``RETRIES`` retries, backoff from ``BACKOFF`` s up to ``MAX_BACKOFF`` s):

* ``obstore``: zarr's ``ObjectStore`` over obstore's ``HTTPStore`` / ``S3Store``,
  the bounds given as obstore's own ``ClientConfig`` (``timeout``,
  ``connect_timeout``) and ``RetryConfig`` (``max_retries``, ``backoff``,
  ``retry_timeout``); no wrapper of ours;
* ``fsspec``: zarr's ``FsspecStore`` (aiohttp for HTTP, s3fs for S3) inside the
  ``RetryingStore`` chunkstream wrapped it in before this race
  (``benchmarks/_fsspec_baseline.py``, kept outside the library as the baseline).

``ZarrSource`` now opens these URLs as the ``obstore`` store here, its bounds from
``RemoteOptions``, and adds only the mapping of obstore's errors into
``RemoteStoreError``.

Figures per store and server:

A store that raises anything else (opening the array, a timed read) is recorded as
``{"failed": "<error>"}`` in its place, and the race goes on.

* throughput: GB/s of windows of ``chunks_per_window`` zarr chunks (uncompressed,
  so the transport is what is measured) read through ``ZarrSource.read_into`` with
  zarr's ``async.concurrency`` at 64, min/median/max over repeats; the stores take
  turns within each repeat (in a rotating order), so a change in load falls on all;
* faults, through a ``ChunkLoader`` (its own retries off, so the store's are
  measured): after 2 transient faults of each kind, whether the data read back is
  identical; with a persistent fault on one chunk, the error raised, whether its
  message names the chunk's URL and the window ``[start, stop)``, and the seconds
  from the start of the read to the error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import chunkstream as cs

from ._measure import spread

__all__ = ["STORES", "RemoteGeometry", "remote_decision", "run_remote"]

STORES = ("obstore", "fsspec")
KINDS = ("500", "stall", "drop")
CONCURRENCY = 64
RETRIES, BACKOFF, MAX_BACKOFF = 3, 0.02, 0.1
#: How far behind the baseline obstore may be and still count as "as fast" (run-to-run noise).
TOLERANCE = 0.05


@dataclass(frozen=True, kw_only=True)
class RemoteGeometry:
    """The remote array: ``(windows * chunks_per_window * chunk_steps, width)`` float32."""

    chunk_steps: int  # timesteps per zarr chunk
    width: int  # float32 values per timestep
    chunks_per_window: int
    windows: int  # windows per timed repeat
    runs: int  # timed repeats
    timeout: float = 1.0  # seconds per request attempt, for both stores

    @staticmethod
    def full() -> RemoteGeometry:
        # 256 KiB chunks, 128 per window (32 MiB), 4 windows a repeat
        return RemoteGeometry(chunk_steps=256, width=256, chunks_per_window=128, windows=4, runs=5)

    @staticmethod
    def quick() -> RemoteGeometry:
        return RemoteGeometry(chunk_steps=256, width=256, chunks_per_window=128, windows=2, runs=3)

    @staticmethod
    def tiny() -> RemoteGeometry:
        return RemoteGeometry(chunk_steps=16, width=8, chunks_per_window=8, windows=2, runs=1,
                              timeout=0.25)  # fmt: skip

    @property
    def window_steps(self) -> int:
        return self.chunk_steps * self.chunks_per_window

    @property
    def timesteps(self) -> int:
        return self.window_steps * self.windows


def _write_array(root: Path, geo: RemoteGeometry) -> np.ndarray:
    data = np.random.default_rng(0).standard_normal((geo.timesteps, geo.width), dtype=np.float32)
    array = zarr.create_array(root / "x.zarr", shape=data.shape, chunks=(geo.chunk_steps,
                              geo.width), dtype="f4", compressors=None)  # fmt: skip
    array[:] = data
    return data


# -- the two stores -------------------------------------------------------------------------


def _open_obstore(server: str, url: str, s3: dict | None, timeout: float) -> Any:
    from obstore.store import HTTPStore, S3Store
    from zarr.storage import ObjectStore

    client = {"timeout": timedelta(seconds=timeout), "connect_timeout": timedelta(seconds=timeout),
              "allow_http": True}  # fmt: skip
    # retry_timeout bounds the whole retried request: room for every attempt and backoff
    retry = {"max_retries": RETRIES, "retry_timeout": timedelta(seconds=(RETRIES + 2) * timeout),
             "backoff": {"init_backoff": timedelta(seconds=BACKOFF),
                         "max_backoff": timedelta(seconds=MAX_BACKOFF)}}  # fmt: skip
    if server == "http":
        store = HTTPStore.from_url(url, client_options=client, retry_config=retry)
    else:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        store = S3Store(bucket, prefix=prefix, endpoint=s3["endpoint"], region=s3["region"],
                        access_key_id=s3["key"], secret_access_key=s3["secret"],
                        client_options=client, retry_config=retry)  # fmt: skip
    return ObjectStore(store, read_only=True)


def _open_fsspec(server: str, url: str, s3: dict | None, timeout: float) -> Any:
    from ._fsspec_baseline import open_fsspec_store

    options: dict[str, Any] = {}
    if server == "s3":
        options = {"key": s3["key"], "secret": s3["secret"], "endpoint_url": s3["endpoint"],
                   "client_kwargs": {"region_name": s3["region"]}}  # fmt: skip
    bounds = cs.RemoteOptions(timeout=timeout, retries=RETRIES, backoff=BACKOFF,
                              max_backoff=MAX_BACKOFF, concurrency=CONCURRENCY)  # fmt: skip
    return open_fsspec_store(url, options, bounds)


OPENERS: dict[str, Callable[[str, str, dict | None, float], Any]] = {
    "obstore": _open_obstore,
    "fsspec": _open_fsspec,
}


@contextmanager
def _source(name: str, server: str, url: str, s3: dict | None, timeout: float
            ) -> Iterator[cs.ZarrSource]:  # fmt: skip
    store = OPENERS[name](server, url, s3, timeout)
    try:
        with cs.ZarrSource(zarr.open_array(store, mode="r")) as source:
            yield source
    finally:
        store.close()


@contextmanager
def _servers(root: Path) -> Iterator[dict[str, tuple[Any, str, dict | None]]]:
    """name -> (server with its fault hook, the array's URL, S3 settings or None)."""
    from tests.faults import s3_server, serve

    with ExitStack() as stack:
        http = serve(root)
        http_server = next(http)
        stack.callback(http.close)
        proxy, s3 = stack.enter_context(s3_server(root))
        yield {"http": (http_server, f"{http_server.url}/x.zarr", None),
               "s3": (proxy, "s3://bucket/x.zarr", s3)}  # fmt: skip


# -- the measurements -----------------------------------------------------------------------


def _failure(exc: BaseException) -> str:
    """What a results file and the table say about a store that failed: its error, one line."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


def _throughput(servers: dict, data: np.ndarray, geo: RemoteGeometry) -> dict:
    """Per server, per store: the GB/s spread, or ``{"failed": reason}`` for a store that
    could not open the array, read other data, or raised during a timed repeat."""
    out: dict = {}
    buf = {"data": np.empty((geo.window_steps, geo.width), np.float32)}
    nbytes = geo.window_steps * geo.width * 4 * geo.windows
    for server, (_hook, url, s3) in servers.items():
        rates: dict[str, list[float]] = {name: [] for name in STORES}
        failed: dict[str, str] = {}
        sources = {}
        with ExitStack() as stack:
            for name in STORES:
                # A broad except on purpose: whatever a store raises is its result, and the
                # other store's figures (and the rest of the run) must still come out.
                try:
                    sources[name] = stack.enter_context(_source(name, server, url, s3, geo.timeout))
                    sources[name].read_into(0, geo.window_steps, buf)  # connect, warm the pool
                    if not np.array_equal(buf["data"], data[: geo.window_steps]):
                        failed[name] = "read other data than was written"
                except Exception as exc:
                    failed[name] = _failure(exc)
            for run in range(geo.runs):
                order = STORES[run % len(STORES) :] + STORES[: run % len(STORES)]
                for name in (n for n in order if n not in failed):
                    begin = time.perf_counter()
                    try:
                        for w in range(geo.windows):
                            start = w * geo.window_steps
                            sources[name].read_into(start, start + geo.window_steps, buf)
                    except Exception as exc:  # its result, as above
                        failed[name] = _failure(exc)
                        continue
                    rates[name].append(nbytes / (time.perf_counter() - begin) / 1e9)
        out[server] = {name: {"failed": failed[name]} if name in failed
                       else spread(v) | {"values": v} for name, v in rates.items()}  # fmt: skip
    return out


def _read_all(source: cs.ZarrSource, geo: RemoteGeometry) -> np.ndarray:
    with cs.ChunkLoader(source, geo.window_steps, device="cpu", workers=1, prefetch=1, sampling="sequential", options=cs.LoaderOptions(read_retries=0)) as loader:  # fmt: skip
        return np.concatenate([c["data"].numpy() for c in loader.epoch(geo.windows)])


def _fault_row(hook: Any, name: str, server: str, url: str, s3: dict | None,
               kind: str, data: np.ndarray, geo: RemoteGeometry) -> dict:  # fmt: skip
    """One store's transient and persistent ``kind`` faults on one server (module docs)."""
    chunk = geo.chunks_per_window + 1  # a chunk of the second window
    window = f"[{geo.window_steps}, {2 * geo.window_steps})"
    row: dict = {}
    hook.faults.set("/c/", kind, times=2)
    with _source(name, server, url, s3, geo.timeout) as source:
        try:
            row["transient_identical"] = bool(np.array_equal(_read_all(source, geo), data))
            row["transient_error"] = None
        except cs.ChunkLoadError as exc:
            row["transient_identical"] = False
            row["transient_error"] = f"{type(exc.__cause__).__name__}: {exc}"[:500]
        row["transient_hits"] = hook.faults.hits
        hook.faults.set(f"/c/{chunk}/0", kind, times=None)
        begin = time.perf_counter()
        try:
            _read_all(source, geo)
            row.update(raised=None, message="", names_url=False, names_window=False)
        except cs.ChunkLoadError as exc:
            message = str(exc)
            row.update(raised=type(exc).__name__, cause=type(exc.__cause__).__name__,
                       message=message[:600], names_window=window in message,
                       names_url=f"/x.zarr/c/{chunk}/0" in message)  # fmt: skip
        row["seconds_to_error"] = time.perf_counter() - begin
        row["persistent_hits"] = hook.faults.hits
    return row


def _faults(servers: dict, data: np.ndarray, geo: RemoteGeometry) -> dict:
    """Per server, store and fault kind: :func:`_fault_row`, or ``{"failed": reason}`` where
    the store raised anything else (opening the array included)."""
    out: dict = {}
    for server, (hook, url, s3) in servers.items():
        for name in STORES:
            for kind in KINDS:
                # A broad except on purpose: a store that fails is recorded, the race goes on.
                try:
                    row = _fault_row(hook, name, server, url, s3, kind, data, geo)
                except Exception as exc:
                    row = {"failed": _failure(exc)}
                finally:
                    # no fault, and no request stalled by this row still holding the server
                    hook.faults.set("", "", 0)
                out.setdefault(server, {}).setdefault(name, {})[kind] = row
    return out


def row_meets_contract(row: dict) -> bool:
    """Whether one fault row (:func:`_fault_row`) meets the contract: identical data after
    transient faults, and a ``ChunkLoadError`` naming the chunk's URL and the window for a
    persistent one (a row that failed outright misses it)."""
    return ("failed" not in row and row["transient_identical"] and row["raised"] == "ChunkLoadError"
            and row["names_url"] and row["names_window"])  # fmt: skip


def contract_misses(faults: dict, name: str) -> dict[str, dict]:
    """``"server/kind"`` -> the row, for every row of store ``name`` that misses the contract."""
    return {f"{server}/{kind}": faults[server][name][kind] for server in faults for kind in KINDS
            if not row_meets_contract(faults[server][name][kind])}  # fmt: skip


def contract_met(faults: dict, name: str) -> bool:
    """Whether store ``name`` met the fault contract on every server and fault kind."""
    return not contract_misses(faults, name)


def _ratio(figures: dict) -> float | None:
    """obstore's median GB/s over the baseline's on one server; ``None`` where either failed."""
    if "failed" in figures["obstore"] or "failed" in figures["fsspec"]:
        return None
    return figures["obstore"]["median"] / figures["fsspec"]["median"]


def remote_decision(res: dict) -> dict:
    """The issue's rule: obstore takes over if it meets the fault contract on both servers
    and is as fast (within ``TOLERANCE``) or faster on both. Where the baseline failed and
    obstore did not, obstore counts as faster there; where obstore failed, it is not."""
    throughput = res["throughput"]
    ratios = {server: _ratio(throughput[server]) for server in throughput}
    contract = {name: contract_met(res["faults"], name) for name in STORES}
    fast = all((r >= 1 - TOLERANCE) if r is not None else "failed" not in throughput[s]["obstore"]
               for s, r in ratios.items())  # fmt: skip
    return {"obstore_over_fsspec": ratios, "contract_met": contract,
            "obstore_default": bool(contract["obstore"] and fast)}  # fmt: skip


def run_remote(geo: RemoteGeometry, data_dir: Path) -> dict:
    """Write the array under ``data_dir``, start both servers, race both stores; the results."""
    import tempfile

    data_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {"geometry": asdict(geo), "concurrency": CONCURRENCY,
                 "bounds": {"timeout_s": geo.timeout, "retries": RETRIES, "backoff_s": BACKOFF,
                            "max_backoff_s": MAX_BACKOFF},
                 "load_1min_before": os.getloadavg()[0]}  # fmt: skip
    with tempfile.TemporaryDirectory(dir=data_dir, prefix="remote-") as tmp:
        root = Path(tmp)
        data = _write_array(root, geo)
        res["window_bytes"] = geo.window_steps * geo.width * 4
        with zarr.config.set({"async.concurrency": CONCURRENCY}), _servers(root) as servers:
            res["throughput"] = _throughput(servers, data, geo)
            res["faults"] = _faults(servers, data, geo)
    res["load_1min_after"] = os.getloadavg()[0]
    res["decision"] = remote_decision(res)
    return res
