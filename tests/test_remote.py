"""Remote zarr over real servers on 127.0.0.1: an HTTP file server and moto's S3 server,
each behind a fault hook that returns 500s, stalls or drops connections on demand."""

from __future__ import annotations

import http.client
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import zarr

import chunkstream as cs
from chunkstream.sources._remote import (
    RemoteOptions,
    RemoteStoreError,
    RetryingStore,
    compare_throughput,
    is_transient,
)

T, F, ZCHUNK, WINDOW = 400, 8, 50, 100
FAST = RemoteOptions(timeout=0.5, retries=3, backoff=0.01, max_backoff=0.05)


# -- the fault hook ------------------------------------------------------------------------


@dataclass
class Faults:
    """Requests whose path contains ``match`` get ``kind`` ("500", "403", "stall", "drop"),
    ``times`` times (``None``: always). ``hits`` counts the faults served."""

    match: str = ""
    kind: str = ""
    times: int | None = 0
    hits: int = 0
    requests: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, match: str, kind: str, times: int | None) -> None:
        with self.lock:
            self.match, self.kind, self.times, self.hits = match, kind, times, 0

    def take(self, path: str) -> str | None:
        with self.lock:
            self.requests += 1
            if not self.kind or self.match not in path:
                return None
            if self.times is not None and self.hits >= self.times:
                return None
            self.hits += 1
            return self.kind


class FaultHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from ``directory``, or forwards to ``upstream`` (host, port) when set;
    either way after consulting ``faults``."""

    faults: Faults
    upstream: tuple[str, int] | None = None

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _fault(self) -> bool:
        kind = self.faults.take(self.path)
        if kind is None:
            return False
        if kind == "stall":
            self.faults.release.wait(10)  # the client times out long before
        elif kind == "drop":
            pass  # close the connection without a byte of response
        else:
            self.send_response(int(kind))
            self.send_header("Content-Length", "0")
            self.end_headers()
        self.close_connection = True
        return True

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(*self.upstream, timeout=10)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = f"{self.upstream[0]}:{self.upstream[1]}"
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    def _handle(self) -> None:
        if self._fault():
            return
        if self.upstream is not None:
            self._forward()
        elif self.command == "HEAD":
            super().do_HEAD()
        else:
            super().do_GET()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


@dataclass
class Server:
    url: str
    faults: Faults


def serve(directory: Path | None, upstream: tuple[str, int] | None = None) -> Iterator[Server]:
    faults = Faults()
    handler = type("Handler", (FaultHandler,), {"faults": faults, "upstream": upstream})
    if directory is not None:
        handler = partial(handler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}", faults)
    finally:
        faults.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


# -- data and servers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("remote")
    data = np.random.default_rng(0).standard_normal((T, F)).astype(np.float32)
    array = zarr.create_array(root / "x.zarr", shape=data.shape, chunks=(ZCHUNK, F), dtype="f4")
    array[:] = data
    return root, data


@pytest.fixture(scope="module")
def http_server(data_dir) -> Iterator[Server]:
    yield from serve(data_dir[0])


#: The environment botocore would otherwise read: a region or profile set outside the test
#: (or by another test) must not reach the moto server.
AWS_ENV = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}
AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
             "AWS_ENDPOINT_URL_S3", "AWS_S3_ENDPOINT")  # fmt: skip


@pytest.fixture(scope="module")
def s3_server(data_dir, tmp_path_factory) -> Iterator[tuple[Server, dict]]:
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    with pytest.MonkeyPatch.context() as env:
        for name, value in AWS_ENV.items():
            env.setenv(name, value)
        for name in AWS_UNSET:
            env.delenv(name, raising=False)
        empty = tmp_path_factory.mktemp("aws") / "none"  # no config or credentials file
        env.setenv("AWS_CONFIG_FILE", str(empty))
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
        moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        try:
            host, port = moto.get_host_and_port()
            creds = {
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"},
            }
            fs = s3fs.S3FileSystem(
                endpoint_url=f"http://{host}:{port}", skip_instance_cache=True, **creds
            )
            # us-east-1 takes no LocationConstraint (s3fs.mkdir would send one).
            fs.call_s3("create_bucket", Bucket="bucket")
            fs.put(str(data_dir[0] / "x.zarr"), "bucket/x.zarr", recursive=True)
            for proxy in serve(None, upstream=(host, port)):
                yield proxy, {**creds, "endpoint_url": proxy.url}
        finally:
            moto.stop()


@pytest.fixture
def http_faults(http_server) -> Iterator[Server]:
    yield http_server
    http_server.faults.set("", "", 0)


@pytest.fixture
def s3(s3_server) -> Iterator[tuple[Server, dict]]:
    yield s3_server
    s3_server[0].faults.set("", "", 0)


def read_all(url: str, options: dict) -> np.ndarray:
    """Every timestep through a ChunkLoader (sequential windows, 2 readers)."""
    with (
        cs.ZarrSource(url, {"x": (slice(None),)}, storage_options=options) as source,
        cs.ChunkLoader(
            source, WINDOW, device="cpu", workers=2, sampling="sequential", read_retries=0
        ) as loader,
    ):
        assert isinstance(source.array.store, RetryingStore)
        return np.concatenate([c["x"].numpy() for c in loader.epoch(T // WINDOW)])


# -- HTTP --------------------------------------------------------------------------------


def test_http_reads_identical_data(http_faults, data_dir):
    got = read_all(f"{http_faults.url}/x.zarr", {"chunkstream": FAST})
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["500", "stall", "drop"])
def test_http_transient_faults_are_survived(http_faults, data_dir, kind):
    http_faults.faults.set("/c/", kind, times=2)
    got = read_all(f"{http_faults.url}/x.zarr", {"chunkstream": FAST})
    assert http_faults.faults.hits == 2  # the faults happened, and were retried
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["500", "stall"])
def test_http_persistent_fault_names_the_url_and_window(http_faults, kind):
    http_faults.faults.set("/c/3/0", kind, times=None)  # zarr chunk 3: timesteps [150, 200)
    url = f"{http_faults.url}/x.zarr"
    with pytest.raises(cs.ChunkLoadError) as info:
        read_all(url, {"chunkstream": FAST})
    message = str(info.value)
    assert f"{url}/c/3/0" in message and "[100, 200)" in message
    assert ("timed out" if kind == "stall" else "failed") + " 4 times" in message
    assert isinstance(info.value.__cause__, RemoteStoreError)
    assert http_faults.faults.hits == 1 + FAST.retries


def test_http_permanent_error_is_not_retried(http_faults):
    http_faults.faults.set("/c/0/0", "403", times=None)
    with pytest.raises(cs.ChunkLoadError):
        read_all(f"{http_faults.url}/x.zarr", {"chunkstream": FAST})
    assert http_faults.faults.hits == 1


def test_missing_url_is_a_source_error(http_faults):
    with pytest.raises(cs.SourceNotFoundError, match=r"nothing\.zarr"):
        cs.ZarrSource(f"{http_faults.url}/nothing.zarr", storage_options={"chunkstream": FAST})


def test_compare_throughput_against_the_local_copy(http_faults, data_dir):
    report = compare_throughput(
        f"{http_faults.url}/x.zarr",
        data_dir[0] / "x.zarr",
        fields={"x": (slice(None),)},
        chunk_size=WINDOW,
        windows=4,
        workers=2,
        storage_options={"chunkstream": FAST},
    )
    assert report.nbytes == 4 * WINDOW * F * 4
    assert report.remote_gbps > 0 and report.local_gbps > 0 and report.ratio > 0


def test_bench_on_a_url_reports_throughput_against_the_local_copy(http_faults, data_dir, capsys):
    from chunkstream.cli import main

    url, local = f"{http_faults.url}/x.zarr", str(data_dir[0] / "x.zarr")
    code = main(["bench", url, "--local", local, "--chunk-size", str(WINDOW), "--chunks", "3",
                 "--prefetch", "1", "--workers", "2", "--train-ms", "0", "--device", "cpu",
                 "--no-progress", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    remote = json.loads(out)["remote"]
    assert remote["url"] == url and remote["local"] == local and remote["windows"] == 3
    assert remote["nbytes"] == 3 * WINDOW * F * 4
    assert remote["remote_s"] > 0 and remote["local_s"] > 0
    assert remote["remote_gbps"] == pytest.approx(remote["nbytes"] / remote["remote_s"] / 1e9)
    assert remote["local_gbps"] == pytest.approx(remote["nbytes"] / remote["local_s"] / 1e9)
    assert remote["ratio"] == pytest.approx(remote["remote_gbps"] / remote["local_gbps"])


def test_closing_a_url_source_closes_its_http_session(http_faults, data_dir):
    source = cs.ZarrSource(f"{http_faults.url}/x.zarr", storage_options={"chunkstream": FAST})
    out = {"data": np.empty((WINDOW, F), np.float32)}
    source.read_into(0, WINDOW, out)
    np.testing.assert_array_equal(out["data"], data_dir[1][:WINDOW])
    fs = source.array.store._store.fs
    session = fs._session  # aiohttp's, opened by the read
    assert session is not None and not session.closed
    source.close()
    source.close()  # idempotent
    assert session.closed
    with cs.ZarrSource(data_dir[0] / "x.zarr") as local:  # a local source has no session
        assert local._owned_store is None


@pytest.mark.parametrize("bad", [{"array": "x"}, {"fields": {"x": (9,)}}])
def test_a_failed_open_closes_the_store(http_faults, monkeypatch, bad):
    closed = []
    close = RetryingStore.close
    monkeypatch.setattr(RetryingStore, "close", lambda self: (closed.append(self), close(self)))
    with pytest.raises(cs.SourceError if "fields" in bad else cs.ConfigError):
        cs.ZarrSource(f"{http_faults.url}/x.zarr", storage_options={"chunkstream": FAST}, **bad)
    assert len(closed) == 1 and not closed[0].owns_filesystem  # closed, session included


# -- S3 (moto server) -------------------------------------------------------------------


def test_s3_reads_identical_data(s3, data_dir):
    _proxy, options = s3
    got = read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    np.testing.assert_array_equal(got, data_dir[1])


@pytest.mark.parametrize("kind", ["500", "drop"])
def test_s3_transient_faults_are_survived(s3, data_dir, kind):
    proxy, options = s3
    proxy.faults.set("/c/", kind, times=2)
    got = read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    assert proxy.faults.hits == 2
    np.testing.assert_array_equal(got, data_dir[1])


def test_closing_an_s3_source_closes_its_client(s3, data_dir):
    _proxy, options = s3
    source = cs.ZarrSource("s3://bucket/x.zarr", storage_options={**options, "chunkstream": FAST})
    out = {"data": np.empty((WINDOW, F), np.float32)}
    source.read_into(0, WINDOW, out)
    fs = source.array.store._store.fs
    assert fs._s3 is not None
    source.close()
    assert fs._s3 is None  # the botocore client and its connection pool are gone


def test_s3_persistent_fault_names_the_url_and_window(s3):
    proxy, options = s3
    proxy.faults.set("/c/2/0", "500", times=None)  # timesteps [100, 150)
    with pytest.raises(cs.ChunkLoadError) as info:
        read_all("s3://bucket/x.zarr", {**options, "chunkstream": FAST})
    assert "bucket/x.zarr/c/2/0" in str(info.value) and "[100, 200)" in str(info.value)
    assert isinstance(info.value.__cause__, RemoteStoreError)


# -- classification ----------------------------------------------------------------------


def test_transient_classification():
    assert is_transient(TimeoutError()) and is_transient(ConnectionResetError())
    assert not is_transient(FileNotFoundError()) and not is_transient(PermissionError())
    assert not is_transient(ValueError()) and not is_transient(cs.ConfigError("x"))
    aiohttp = pytest.importorskip("aiohttp")
    assert is_transient(aiohttp.ServerDisconnectedError())
    info = aiohttp.RequestInfo(url="http://x", method="GET", headers={}, real_url="http://x")  # type: ignore[arg-type]
    for status, transient in ((500, True), (503, True), (429, True), (404, False), (403, False)):
        error = aiohttp.ClientResponseError(info, (), status=status)
        assert is_transient(error) is transient


def test_remote_options_are_validated():
    with pytest.raises(cs.ConfigError, match="timeout"):
        RemoteOptions(timeout=0)
    with pytest.raises(cs.ConfigError, match="retries"):
        RemoteOptions(retries=-1)
