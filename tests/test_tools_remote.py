"""The tools open a URL through the library's opener (``sources._open``), with its
timeouts, retries and ``RemoteStoreError``: ``chunkstream inspect`` of a server that
accepts and never answers fails within the remote timeout, naming the URL."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from chunkstream.cli import main
from chunkstream.tools import _stores


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """An HTTP URL on the loopback whose server accepts every connection and never
    answers; every socket is closed and the thread joined on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, held = threading.Event(), []

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, name="test-silent-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/run.zarr"
    finally:
        stop.set()
        thread.join(5)
        for sock in [*held, listener]:
            sock.close()


def test_inspect_of_a_silent_server_fails_within_the_timeout_naming_the_url(monkeypatch, capsys):
    monkeypatch.setenv("CHUNKSTREAM_REMOTE_TIMEOUT", "0.5")
    monkeypatch.setenv("CHUNKSTREAM_REMOTE_RETRIES", "1")
    monkeypatch.delenv("CHUNKSTREAM_CACHE", raising=False)
    monkeypatch.delenv("CHUNKSTREAM_DEBUG", raising=False)
    with silent_server() as url:
        began = time.monotonic()
        status = main(["inspect", url])
        took = time.monotonic() - began
    err = capsys.readouterr().err
    assert status == 2
    assert url in err and "chunkstream inspect: error:" in err
    assert "Traceback" not in err
    # two attempts of 0.5 s and a backoff: far below the defaults' two and a half minutes
    assert took < 30, took


def test_the_remote_bounds_come_from_the_environment():
    (options,) = _stores.remote_options({"CHUNKSTREAM_REMOTE_TIMEOUT": "2.5"}).values()
    assert (options.timeout, options.retries) == (2.5, 4)
    with pytest.raises(ValueError, match=r"CHUNKSTREAM_REMOTE_RETRIES='x'"):
        _stores.remote_options({"CHUNKSTREAM_REMOTE_RETRIES": "x"})
    with pytest.raises(ValueError, match=r"CHUNKSTREAM_REMOTE_TIMEOUT.*timeout=-1"):
        _stores.remote_options({"CHUNKSTREAM_REMOTE_TIMEOUT": "-1"})
