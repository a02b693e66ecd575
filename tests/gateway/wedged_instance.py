"""A wedged inference instance for tests: a small asyncio HTTP/1.1 server on 127.0.0.1 whose
``/health`` answers 200 while its completions never answer (``wedged``); with
``wedged = False`` it answers them (a minimal chat completion), as an engine that recovered,
except those whose body contains ``hang_on`` (an engine that hangs on one prompt only).

A held completion waits until the gateway gives up and closes the connection; nothing is
ever sent on it. Connections are keep-alive (the gateway pools them); each serves at most
``_MAX_REQUESTS_PER_CONNECTION`` requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

_MAX_REQUESTS_PER_CONNECTION = 10_000
_MAX_HEAD_BYTES = 64 * 1024


class WedgedInstance:
    def __init__(self, name: str) -> None:
        self.name = name
        self.wedged = True
        self.hang_on: bytes | None = None
        self.health_probes = 0
        self.completions_received = 0  # every completion request that reached it
        self.completions_held = 0  # those it never answered
        self.completions_answered = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            for _ in range(_MAX_REQUESTS_PER_CONNECTION):
                if not await self._one(reader, writer):
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is done."""
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD_BYTES:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        if method == "GET" and path == "/health":
            self.health_probes += 1
            _answer(writer, 200, {"ok": True})
        elif method == "POST" and path.endswith("/completions"):
            self.completions_received += 1
            if self.wedged or (self.hang_on is not None and self.hang_on in body):
                self.completions_held += 1
                await reader.read()  # never answers: held until the gateway closes
                return False
            self.completions_answered += 1
            _answer(writer, 200, _completion(self.name, json.loads(body)))
        else:
            _answer(writer, 404, {"error": {"message": "not found"}})
        await writer.drain()
        return True


def _answer(writer: asyncio.StreamWriter, status: int, payload: object) -> None:
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)


def _completion(name: str, request: dict[str, object]) -> dict[str, object]:
    message = {"role": "assistant", "content": f"hello from {name}"}
    return {
        "id": f"cmpl-{name}",
        "object": "chat.completion",
        "created": 1,
        "model": request.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
