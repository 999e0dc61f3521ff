"""The node-local cache (issue 38) against a throttled HTTP server and against local disk.

A zstd-compressed float32 zarr array (format 3, not sharded) is written under the data
folder and served by a threaded HTTP server on 127.0.0.1 that makes every request wait
``latency_ms`` before its answer and sends every body through one shared link of
``link_mb_s`` MB/s (a total cap over all connections, as a node's network link: each
body's bytes take the link in turn, so concurrent requests share the bandwidth).

Arms, each a ``ChunkLoader`` epoch (CPU, ``workers`` readers, shuffled windows with one
seed: every arm reads the same windows in the same order) over every timestep:

* ``local``: ``ZarrSource(path)`` on the local copy (chunkstream's reader, page cache warm);
* ``nocache``: ``ZarrSource(url)`` through the throttled server;
* ``cold``: ``ZarrSource(url, cache=DIR)`` with an empty ``DIR``, its epoch 1;
* ``warm``: the same source's epoch 2 (a new loader, the same windows).

Chunks/s of each are figures of the same epochs of the same windows, so at a fixed
number of batches per chunk, batches/s ratios are these ratios. Repeats take turns
(local, nocache, cold+warm) so a change in the machine's load falls on all; the figure
is the median ratio over the repeats. Targets (issue 38): warm / local >= 0.8,
cold / nocache >= 0.9.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import zarr

import chunkstream as cs
from chunkstream.sources._remote import RemoteOptions

__all__ = ["CacheGeometry", "cache_targets", "run_cache"]


@dataclass(frozen=True, kw_only=True)
class CacheGeometry:
    """The array ``(windows * chunks_per_window * chunk_steps, width)`` float32, the
    server's throttle, the loader and the repeats."""

    chunk_steps: int
    width: int
    chunks_per_window: int
    windows: int
    latency_ms: float
    link_mb_s: float
    workers: int = 2
    runs: int = 3

    @staticmethod
    def full() -> CacheGeometry:
        # 128 KiB chunks, 32 per window (4 MiB), 24 windows (96 MiB); 20 ms, 200 MB/s
        return CacheGeometry(chunk_steps=128, width=256, chunks_per_window=32, windows=24,
                             latency_ms=20.0, link_mb_s=200.0, runs=5)  # fmt: skip

    @staticmethod
    def tiny() -> CacheGeometry:
        return CacheGeometry(chunk_steps=16, width=8, chunks_per_window=4, windows=3,
                             latency_ms=1.0, link_mb_s=100.0, runs=1)  # fmt: skip

    @property
    def window_steps(self) -> int:
        return self.chunk_steps * self.chunks_per_window

    @property
    def timesteps(self) -> int:
        return self.window_steps * self.windows


class _Link:
    """One link of ``rate`` bytes/s shared by every response: each body waits its turn."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.free_at = 0.0

    def send_time(self, nbytes: int) -> float:
        """When a body of ``nbytes`` sent now has crossed the link (perf_counter)."""
        with self.lock:
            start = max(time.perf_counter(), self.free_at)
            self.free_at = start + nbytes / self.rate
            return self.free_at


class _ThrottledHandler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    latency_s = 0.0
    link: _Link

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        time.sleep(self.latency_s)
        super().do_GET()

    def do_HEAD(self) -> None:
        time.sleep(self.latency_s)
        super().do_HEAD()

    def copyfile(self, source, outputfile) -> None:
        body = source.read()
        time.sleep(max(0.0, self.link.send_time(len(body)) - time.perf_counter()))
        outputfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 256  # 64 requests open at once must not wait out a SYN retry
    daemon_threads = True


@contextlib.contextmanager
def throttled_server(root: Path, latency_ms: float, link_mb_s: float) -> Iterator[str]:
    """An HTTP server over ``root`` on 127.0.0.1 with the throttle of the module docs."""
    handler = type("Handler", (_ThrottledHandler,), {"latency_s": latency_ms / 1e3,
                                                     "link": _Link(link_mb_s * 1e6)})  # fmt: skip
    httpd = _Server(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, name="bench-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _write_array(root: Path, geo: CacheGeometry) -> None:
    rng = np.random.default_rng(0)
    # a random walk, rounded: compressible as recordings are (zstd ~0.6 of the raw bytes)
    data = np.cumsum(rng.standard_normal((geo.timesteps, geo.width), dtype=np.float32), axis=0)
    data = np.round(data, 2).astype(np.float32)
    array = zarr.create_array(root / "x.zarr", shape=data.shape, dtype="f4",
                              chunks=(geo.chunk_steps, geo.width),
                              compressors=zarr.codecs.ZstdCodec(level=3))  # fmt: skip
    array[:] = data


def _epoch(source: cs.ZarrSource, geo: CacheGeometry) -> float:
    """Chunks/s of one shuffled epoch over every window of ``source``."""
    with cs.ChunkLoader(source, geo.window_steps, device="cpu", workers=geo.workers,
                        sampling="shuffled", seed=7) as loader:  # fmt: skip
        begin = time.perf_counter()
        count = sum(1 for _ in loader.epoch(geo.windows))
        return count / (time.perf_counter() - begin)


def run_cache(geo: CacheGeometry, data_dir: Path) -> dict:
    """Write the array, serve it throttled, time the four arms ``geo.runs`` times."""
    data_dir.mkdir(parents=True, exist_ok=True)
    options = {"chunkstream": RemoteOptions(timeout=30.0)}
    res: dict = {"geometry": asdict(geo), "load_1min_before": os.getloadavg()[0],
                 "link": "one link shared by all connections (a total cap)"}  # fmt: skip
    rates: dict[str, list[float]] = {"local": [], "nocache": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory(dir=data_dir, prefix="cache-") as tmp:
        root = Path(tmp)
        _write_array(root, geo)
        stored = sum(p.stat().st_size for p in (root / "x.zarr").rglob("*") if p.is_file())
        res["stored_bytes"], res["raw_bytes"] = stored, geo.timesteps * geo.width * 4
        with throttled_server(root, geo.latency_ms, geo.link_mb_s) as url:
            url = f"{url}/x.zarr"
            with cs.ZarrSource(root / "x.zarr") as local:
                _epoch(local, geo)  # the page cache warm, as epoch 2 of a local store
            for _ in range(geo.runs):
                with cs.ZarrSource(root / "x.zarr") as local:
                    rates["local"].append(_epoch(local, geo))
                with cs.ZarrSource(url, storage_options=options) as remote:
                    rates["nocache"].append(_epoch(remote, geo))
                cache = root / "node-cache"
                shutil.rmtree(cache, ignore_errors=True)
                with cs.ZarrSource(url, storage_options=options, cache=cache) as cached:
                    rates["cold"].append(_epoch(cached, geo))
                    rates["warm"].append(_epoch(cached, geo))
                    res["counters"] = cached.cache.counters.as_dict()
    res["chunks_per_s"] = rates
    res["ratios"] = {
        "warm_over_local": [w / lo for w, lo in zip(rates["warm"], rates["local"], strict=True)],
        "cold_over_nocache": [c / n for c, n in zip(rates["cold"], rates["nocache"], strict=True)],
        "warm_over_nocache": [w / n for w, n in zip(rates["warm"], rates["nocache"], strict=True)],
    }
    res["median"] = {k: float(np.median(v)) for k, v in res["ratios"].items()}
    res["load_1min_after"] = os.getloadavg()[0]
    res["targets"] = cache_targets(res)
    return res


def cache_targets(res: dict) -> list[dict]:
    """Issue 38's two targets from a :func:`run_cache` result."""
    warm, cold = res["median"]["warm_over_local"], res["median"]["cold_over_nocache"]
    return [
        {"what": "cache: epoch 2 over the same store on local disk (chunks/s)",
         "figure": f"{warm:.2f}x", "target": ">= 0.8x", "met": warm >= 0.8},
        {"what": "cache: a cold epoch over no cache (chunks/s)",
         "figure": f"{cold:.2f}x", "target": ">= 0.9x", "met": cold >= 0.9},
    ]  # fmt: skip
