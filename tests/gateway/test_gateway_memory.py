"""Hostile clients cannot grow the gateway's memory: large rejected bodies on fresh connections,
clients that never finish their body (408), an instance that answers 2 GB. Each runs against a
gateway process, with the garbage collector settings of ``warmfleet serve`` and with Python's
defaults (a connection's reference cycles once kept its 8 MB body until a collection that the
production settings make rare)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from gateway_process_support import GatewayProcess, ThreadedGateway
from gateway_support import MODEL, gateway_doc, gateway_file

MiB = 1 << 20
BODY_BYTES = 7_900_000  # under the default 8 MiB body limit
HERE = Path(__file__).parent

pytestmark = pytest.mark.e2e


def _exchange(addr: tuple[str, int], payload: bytes, *, until_close: bool) -> bytes:
    """Send ``payload`` on a fresh connection; the status line of the answer."""
    with socket.create_connection(addr, timeout=30) as sock:
        sock.sendall(payload)
        answer = b""
        while b"\r\n" not in answer or until_close:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def _head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length
    )


def _bad_json(addr: tuple[str, int]) -> bytes:
    return _exchange(addr, _head(BODY_BYTES) + b"{" + b"x" * (BODY_BYTES - 1), until_close=False)


def _half_body(addr: tuple[str, int]) -> bytes:
    """Half of the declared body, then silence: the gateway's 408 ends it."""
    return _exchange(addr, _head(BODY_BYTES) + b"x" * (BODY_BYTES // 2), until_close=True)


class _Peak:
    """The process's RSS, sampled every 20 ms while the load runs."""

    def __init__(self, rss: Callable[[], int]) -> None:
        self.rss = rss
        self.peak = rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)


def _settled(rss: Callable[[], int], target: int, timeout_s: float = 10.0) -> int:
    """RSS once it is at most ``target`` (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    value = rss()
    while value > target and time.monotonic() < deadline:
        time.sleep(0.2)
        value = rss()
    return value


GC_MODES = {
    "serve": None,  # `warmfleet serve`: the production GC settings
    "default_gc": [sys.executable, str(HERE / "serve_default_gc.py")],
}


@pytest.fixture(params=sorted(GC_MODES))
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayProcess]:
    with ThreadedGateway(None, ["a"]) as fleet:
        doc = gateway_doc(fleet.backends, limits={"body_read_timeout_s": 1.0})
        path = gateway_file(tmp_path, doc)
        with GatewayProcess(path, command=GC_MODES[request.param]) as gw:
            yield gw
            assert "Traceback" not in gw.stderr()


@pytest.mark.slow
def test_large_rejected_bodies_and_408s_leave_no_memory_behind(gateway: GatewayProcess) -> None:
    split = urlsplit(gateway.url)
    addr = (split.hostname or "127.0.0.1", split.port or 80)
    start = gateway.rss_bytes()
    with _Peak(gateway.rss_bytes) as peak:
        for _ in range(150):  # sequential, each on a fresh connection
            assert _bad_json(addr) == b"HTTP/1.1 400 Bad Request"
        statuses: list[bytes] = []
        clients = [
            threading.Thread(target=lambda: statuses.append(_half_body(addr))) for _ in range(100)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(60)
    assert statuses == [b"HTTP/1.1 408 Request Timeout"] * 100
    assert peak.peak - start <= 100 * MiB, (start // MiB, peak.peak // MiB)
    end = _settled(gateway.rss_bytes, start + 50 * MiB)
    assert end - start <= 50 * MiB, (start // MiB, peak.peak // MiB, end // MiB)


DECLARED_BYTES = 2_000_000_000
SENT_BYTES = 512 * MiB  # then the instance hangs up: 2 GB is what it declared, not what it sent


class _HugeAnswer(BaseHTTPRequestHandler):
    """An instance whose completion declares a 2 GB body (health answers as usual)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(DECLARED_BYTES))
        self.end_headers()
        block = b"x" * MiB
        with contextlib.suppress(ConnectionError):
            for _ in range(SENT_BYTES // MiB):
                self.wfile.write(block)
        self.close_connection = True


@pytest.mark.slow
def test_a_2gb_upstream_answer_is_relayed_as_it_arrives(tmp_path: Path) -> None:
    instance = ThreadingHTTPServer(("127.0.0.1", 0), _HugeAnswer)
    threading.Thread(target=instance.serve_forever, daemon=True).start()
    try:
        backend = SimpleNamespace(name="huge", url=f"http://127.0.0.1:{instance.server_port}")
        doc = gateway_doc([backend])  # type: ignore[list-item]
        path = gateway_file(tmp_path, doc)
        with GatewayProcess(path, module=True) as gw:
            split = urlsplit(gw.url)
            assert split.hostname is not None
            conn = http.client.HTTPConnection(split.hostname, split.port, timeout=60)
            start = gw.rss_bytes()
            with _Peak(gw.rss_bytes) as peak:
                conn.request("POST", "/v1/chat/completions", body=_CHAT, headers=_JSON)
                answer = conn.getresponse()
                assert answer.status == 200
                assert answer.getheader("Content-Length") == str(DECLARED_BYTES)
                received = 0
                with contextlib.suppress(http.client.IncompleteRead, ConnectionError):
                    while chunk := answer.read1(MiB):
                        received += len(chunk)
            conn.close()
            assert received == SENT_BYTES  # all of it, then the cut the client can see
            assert peak.peak - start <= 50 * MiB, (start // MiB, peak.peak // MiB)
    finally:
        instance.shutdown()
        instance.server_close()


_CHAT = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % MODEL.encode()
_JSON = {"Content-Type": "application/json"}
