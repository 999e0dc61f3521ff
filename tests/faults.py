"""Sources for timing and failure-injection tests (real threads, in-memory bytes), and a
fault hook in front of real HTTP and S3 servers on 127.0.0.1.

Everything else in the suite reads real zarr stores; these exist because a test
about a reader that raises, sleeps or hangs needs to control exactly when.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from chunkstream.sources._base import FieldSpec, field_context


class ArraySource:
    """Fields from in-memory arrays, with optional delay, failures and hangs per read.

    ``fail_at`` holds read numbers (0-based, counting every call) that raise
    ``OSError``; ``fail_windows`` holds starts whose reads raise; ``hang_at``
    read numbers block until ``release`` is set; ``delay`` sleeps per read.
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        *,
        delay: float = 0.0,
        fail_at: set[int] | None = None,
        fail_windows: set[int] | None = None,
        transient: int = 0,
        hang_at: set[int] | None = None,
    ) -> None:
        self.arrays = dict(arrays)
        self.fields = {k: FieldSpec(tuple(v.shape[1:]), v.dtype) for k, v in self.arrays.items()}
        self.delay = delay
        self.fail_at = fail_at or set()
        self.fail_windows = fail_windows or set()
        self.transient = transient  # the first `transient` reads of each window fail
        self.hang_at = hang_at or set()
        self.release = threading.Event()
        self.calls: list[tuple[int, int]] = []
        self._attempts: dict[int, int] = {}
        self._lock = threading.Lock()
        self.closed = False

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def read_into(self, start: int, stop: int, out) -> None:
        with self._lock:
            number = len(self.calls)
            self.calls.append((start, stop))
            attempt = self._attempts.get(start, 0)
            self._attempts[start] = attempt + 1
        if self.delay:
            time.sleep(self.delay)
        if number in self.hang_at:
            while not self.release.wait(0.05):
                pass
        if number in self.fail_at or start in self.fail_windows:
            with field_context(next(iter(self.arrays))):
                raise OSError(f"injected failure reading [{start}, {stop})")
        if attempt < self.transient:
            raise ConnectionError(f"injected transient failure {attempt} at {start}")
        for name, array in self.arrays.items():
            out[name][: stop - start] = array[start:stop]

    def close(self) -> None:
        self.closed = True


def make_arrays(timesteps: int = 2000, neurons: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "voltage": rng.standard_normal((timesteps, neurons), dtype=np.float32),
        "stimulus": rng.standard_normal((timesteps, 3), dtype=np.float32),
    }


# -- wrappers around real sources (additive: used by test_faults / test_integrity / test_soak) --


def chunkstream_threads() -> list[threading.Thread]:
    """Live threads the library started (loader stages and zarr decode pools)."""
    return [t for t in threading.enumerate() if t.name.startswith("chunkstream-")]


def wait_for_no_threads(timeout: float = 5.0) -> list[threading.Thread]:
    """Wait up to ``timeout`` s for every ``chunkstream-*`` thread to end; return the survivors."""
    deadline = time.monotonic() + timeout
    while chunkstream_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return chunkstream_threads()


class Wrapped:
    """A real source whose ``read_into`` can be made to fail, fail transiently or hang.

    ``fail_windows``: starts whose every read raises ``error`` (default ``OSError`` that is
    not transient: ``PermissionError``). ``transient``: a callable ``(start, attempt) -> bool``
    saying whether that attempt raises a transient ``ConnectionError`` *after* scribbling
    garbage into ``out`` (so a retry must overwrite it). ``hang_windows``: starts whose read
    blocks until ``release`` is set (ignoring cancellation, like a stuck network call).
    """

    def __init__(
        self,
        source,
        *,
        fail_windows: set[int] | None = None,
        error: BaseException | None = None,
        transient=None,
        hang_windows: set[int] | None = None,
    ) -> None:
        self.source = source
        self.fields = source.fields
        self.fail_windows = fail_windows or set()
        self.error = error
        self.transient = transient
        self.hang_windows = hang_windows or set()
        self.release = threading.Event()
        self.attempts: dict[int, int] = {}
        self.injected = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.source)

    def read_into(self, start: int, stop: int, out) -> None:
        with self._lock:
            attempt = self.attempts.get(start, 0)
            self.attempts[start] = attempt + 1
        if start in self.hang_windows:
            while not self.release.wait(0.05):
                pass
        if start in self.fail_windows:
            raise (
                self.error
                if self.error is not None
                else PermissionError(f"injected failure reading [{start}, {stop})")
            )
        if self.transient is not None and self.transient(start, attempt):
            for array in out.values():
                array[: stop - start] = 0x5A if array.dtype.kind in "iub" else np.nan
            with self._lock:
                self.injected += 1
            raise ConnectionError(f"injected transient failure at {start}, attempt {attempt}")
        self.source.read_into(start, stop, out)

    def close(self) -> None:
        self.source.close()


# -- a fault hook in front of real servers (used by test_remote and benchmarks/_remote) --------

#: How late a "slow" fault serves its request.
SLOW_S = 0.05


@dataclass
class Faults:
    """Requests whose path contains ``match`` get ``kind`` ("500", "403", "stall", "drop",
    "short": a byte range served one byte short, or "slow": served after ``SLOW_S``),
    ``times`` times (``None``: always). ``hits`` counts the faults served, ``paths`` every
    request by path.

    A stalled request waits on the ``release`` event of the rule that stalled it;
    :meth:`set` (a new rule, or ``set("", "", 0)`` to clear) sets that event, so no
    request stalled by an earlier rule still holds a server thread and its
    connection while the next measurement runs.
    """

    match: str = ""
    kind: str = ""
    times: int | None = 0
    hits: int = 0
    requests: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    paths: collections.Counter = field(default_factory=collections.Counter)

    def set(self, match: str, kind: str, times: int | None) -> None:
        with self.lock:
            self.match, self.kind, self.times, self.hits = match, kind, times, 0
            stalled, self.release = self.release, threading.Event()
        stalled.set()

    def take(self, path: str) -> tuple[str, threading.Event] | None:
        """The fault to serve ``path`` and the event that ends a stall, or ``None``."""
        with self.lock:
            self.requests += 1
            self.paths[path] += 1
            if not self.kind or self.match not in path:
                return None
            if self.times is not None and self.hits >= self.times:
                return None
            self.hits += 1
            return self.kind, self.release


class FaultHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from ``directory``, or forwards to ``upstream`` (host, port) when set;
    either way after consulting ``faults``. HTTP/1.1: connections are kept alive, as an
    object store's are, so a client's connection pool is part of what is measured. Byte
    ranges are served as object stores serve them (sharded zarr reads a shard's index and
    inner chunks by range)."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm the body of every
    # response on a kept-alive connection waits for the client's delayed ACK (40 ms on
    # Linux), which no object store makes a client wait.
    disable_nagle_algorithm = True
    faults: Faults
    upstream: tuple[str, int] | None = None

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _fault(self) -> bool:
        fault = self.faults.take(self.path)
        if fault is None:
            return False
        kind, release = fault
        if kind == "short":  # served as asked, less its last byte (a ranged GET only)
            self.short = True
            return False
        if kind == "slow":  # served as asked, late (a far-away server)
            release.wait(SLOW_S)
            return False
        if kind == "stall":
            release.wait(10)  # the client times out long before; the next set() ends it
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
            # a HEAD's length is the object's, which its empty body does not show
            length = response.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    def _ranged(self) -> bool:
        """Serve a ``Range: bytes=...`` GET of a file as an object store or a web server
        does (RFC 9110: 206 with the bytes that exist, 416 when none do); ``False`` for
        any other request, which the base class serves whole."""
        spec = self.headers.get("Range", "")
        path = self.translate_path(self.path)
        if self.command != "GET" or not spec.startswith("bytes=") or not os.path.isfile(path):
            return False
        first, _, last = spec.removeprefix("bytes=").partition("-")
        if "," in spec or not (first or last) or not (first or "0").isdigit() \
                or not (last or "0").isdigit():  # fmt: skip
            return False  # several ranges or a malformed one: the whole file, as servers may
        size = os.path.getsize(path)
        if first:
            start, stop = int(first), min(size, int(last) + 1 if last else size)
        else:  # a suffix: the last `last` bytes
            start, stop = max(0, size - int(last)), size
        stop -= self.short and stop - start > 1
        if start >= stop:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        with open(path, "rb") as file:
            file.seek(start)
            body = file.read(stop - start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def _handle(self) -> None:
        self.short = False  # one handler serves every request of its connection
        if self._fault():
            return
        if self.upstream is not None:
            self._forward()
        elif self._ranged():
            return
        elif self.command == "HEAD":
            super().do_HEAD()
        else:
            super().do_GET()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


class _Server(http.server.ThreadingHTTPServer):
    # The default accept backlog (5) drops connections when 64 requests open at once;
    # the client would then wait out a SYN retransmit (1 s) and the figures be the kernel's.
    request_queue_size = 256

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # kept-alive connections, each with its handler thread, so closing ends them all
        self.connections: dict[socket.socket, threading.Thread] = {}
        self.lock = threading.Lock()

    def process_request(self, request: socket.socket, client_address: object) -> None:
        thread = threading.Thread(target=self.process_request_thread, name="test-http-conn",
                                  args=(request, client_address), daemon=True)  # fmt: skip
        with self.lock:
            self.connections[request] = thread
        thread.start()

    def shutdown_request(self, request: socket.socket) -> None:
        with self.lock:
            self.connections.pop(request, None)
        super().shutdown_request(request)

    def close_connections(self, timeout: float = 5.0) -> None:
        """End every kept-alive connection and wait for its thread (a test counting
        threads must not see this server's idle connections come and go)."""
        with self.lock:
            open_now = dict(self.connections)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in open_now.values():
            thread.join(timeout)

    def handle_error(self, request: object, client_address: object) -> None:
        # a client closing a kept-alive connection (at exit, or after a timeout) is normal
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@dataclass
class Server:
    url: str
    faults: Faults


def serve(directory: Path | None, upstream: tuple[str, int] | None = None) -> Iterator[Server]:
    """An HTTP server on 127.0.0.1 behind a :class:`Faults` hook (a generator: one yield)."""
    faults = Faults()
    handler = type("Handler", (FaultHandler,), {"faults": faults, "upstream": upstream})
    if directory is not None:
        handler = partial(handler, directory=str(directory))
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}", faults)
    finally:
        faults.set("", "", 0)  # ends every stall
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        thread.join(5)


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


@contextlib.contextmanager
def s3_server(directory: Path, bucket: str = "bucket") -> Iterator[tuple[Server, dict]]:
    """moto's S3 server on 127.0.0.1 holding every file under ``directory`` in ``bucket``,
    behind a fault proxy. Yields the proxy and the S3 settings (endpoint, region, key, secret)."""
    import boto3
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in (*AWS_ENV, *AWS_UNSET, "AWS_CONFIG_FILE",
                                                     "AWS_SHARED_CREDENTIALS_FILE")}  # fmt: skip
    os.environ.update(AWS_ENV)
    for name in AWS_UNSET:
        os.environ.pop(name, None)
    empty = str(directory / "no-aws-config")  # no config or credentials file is read
    os.environ["AWS_CONFIG_FILE"] = os.environ["AWS_SHARED_CREDENTIALS_FILE"] = empty
    # werkzeug (under moto) logs every request to stderr unless its logger is set
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        client.create_bucket(Bucket=bucket)  # us-east-1 takes no LocationConstraint
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, path.relative_to(directory).as_posix())
        client.close()
        for proxy in serve(None, upstream=(host, port)):
            yield proxy, {"endpoint": proxy.url, "region": "us-east-1", "key": "testing",
                          "secret": "testing"}  # fmt: skip
    finally:
        moto.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
