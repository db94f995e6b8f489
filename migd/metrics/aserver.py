"""The /metrics and /healthz endpoint on one asyncio loop: no thread per connection.

A thread per connection cost 38% of a scrape and header parsing through http.server another
27%.  Here one thread runs an event loop with a plain ``asyncio.Protocol`` per connection (no
stream reader, writer and futures per request: a third less work per connection than asyncio's
streams); the exposition is rendered as often as it changes (exposition.py) and served as bytes.
HTTP/1.1 keep-alive is honoured (Prometheus keeps its connection), pipelined requests are answered
in order, and a client that does not read its responses is not read from until it does (flow
control, as a stream's ``drain`` gives).

Hostile neighbours: only a complete request counts as activity, so a client that drips a
head a byte at a time is dropped ``idle_timeout_s`` after its last complete request (or its connect),
as servers defend against slowloris; at ``max_connections`` a new connection takes the place of the
one idle longest (the bound that kept ~1,100 idle connections from exhausting the daemon's
descriptors, without letting 64 of them lock a scrape out); pipelined requests are answered one per
turn of the event loop, so one connection's buffer cannot hold the others back; a request head over
``max_header_bytes`` is answered 431 and the connection closed; a request with a body (Content-Length,
Transfer-Encoding) is answered and the connection closed, its body never read as a request.  Only
GET /metrics, GET /healthz and GET / (the page, page.py) exist; nothing here can change a GPU.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from migd.metrics.exposition import Exposition
from migd.metrics.sampler import Sampler

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TEXT = "text/plain; charset=utf-8"
_END = re.compile(rb"\r?\n\r?\n")  # RFC 9112 2.2: a recipient may take a bare LF for a line's end
_LINE = re.compile(r"\r?\n")
_EMPTY = re.compile(rb"(?:\r?\n)+")


class MetricsServer:
    backlog = 128
    max_connections = 64  # Prometheus scrapes with one connection; a few more for people and curl
    idle_timeout_s = 5.0
    max_header_bytes = 16384

    def __init__(self, host: str, port: int, exposition: Exposition, sampler: Sampler, stale_after_s: float,
                 page: Callable[[], bytes] | None = None) -> None:
        self.exposition = exposition
        self.page = page
        self.sampler = sampler
        self.stale_after_s = stale_after_s
        self.refused = 0
        self.connections: set[_Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._responses: dict[bool, tuple[tuple[bytes, bytes], bytes]] = {}  # keep-alive -> (parts, response)
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(  # binding errors surface here, as OSError
            self._loop.create_server(lambda: _Connection(self), host, port, backlog=self.backlog))
        self.server_address = self._server.sockets[0].getsockname()

    def health(self) -> tuple[bool, str]:
        last = self.sampler.last_success
        if last is None:
            return False, "no NVML sample yet\n"
        age = time.time() - last
        if age > self.stale_after_s:
            return False, f"last NVML sample {age:.0f}s ago\n"
        return True, "ok\n"

    def answer(self, head: bytes) -> tuple[bytes, bool]:
        """The response to one request head (request line and headers, without the blank line), and
        whether the connection stays open for another request."""
        lines = _LINE.split(head.decode("latin-1"))
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(400, _TEXT, b"bad request\n", "", keep=False), False
        if parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
            return _response(505, _TEXT, b"HTTP/1.0 and HTTP/1.1 only\n", "", keep=False), False
        method, target, version = parts
        keep = version == "HTTP/1.1" and method == "GET" and _keep_alive(lines)
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/metrics":
            return self._metrics_response(keep), keep
        code, ctype, body, extra = self._route(method, path)
        return _response(code, ctype, body, extra, keep), keep

    def _metrics_response(self, keep: bool) -> bytes:
        """The whole response, built once per rendering (110 KiB are not copied per scrape)."""
        parts = self.exposition.parts()
        cached = self._responses.get(keep)
        if cached is None or cached[0][0] is not parts[0] or cached[0][1] is not parts[1]:
            cached = self._responses[keep] = (parts, _response(200, CONTENT_TYPE_LATEST, b"".join(parts), "", keep))
        return cached[1]

    def _route(self, method: str, path: str) -> tuple[int, str, bytes, str]:
        """Everything but GET /metrics (answered whole by :meth:`_metrics_response`)."""
        if method != "GET":
            return 405, _TEXT, b"", "Allow: GET\r\n"
        if path == "/healthz":
            ok, text = self.health()
            return 200 if ok else 503, _TEXT, text.encode(), ""
        if path == "/" and self.page is not None:
            return 200, "text/html; charset=utf-8", self.page(), ""
        return 404, _TEXT, b"not found: only /, /metrics and /healthz\n", ""

    # -- connections ----------------------------------------------------------------------------
    def opened(self, conn: _Connection) -> None:
        """Admit a new connection; at the cap, the one idle longest (no complete request for longest) makes
        room: a slot stays for a new scrape however many clients hold connections without asking."""
        if len(self.connections) >= self.max_connections:
            oldest = min(self.connections, key=lambda c: c.active)
            self.connections.discard(oldest)
            oldest.transport.abort()
            self.refused += 1
        self.connections.add(conn)
        if self._sweep is None:
            self._sweep = self._loop.call_later(self.idle_timeout_s / 4, self._drop_idle)

    def _drop_idle(self) -> None:
        """Abort connections idle for ``idle_timeout_s``; runs again only while any are open."""
        self._sweep = None
        limit = self._loop.time() - self.idle_timeout_s
        for conn in [c for c in self.connections if c.active < limit]:
            conn.transport.abort()
        if self.connections:
            self._sweep = self._loop.call_later(self.idle_timeout_s / 4, self._drop_idle)

    # -- life cycle -----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def stop(self) -> None:
        def close() -> None:
            self._server.close()
            self._loop.stop()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(close)


class _Connection(asyncio.Protocol):
    """One client: request heads are collected from the bytes received and answered in order, one per
    turn of the event loop."""

    __slots__ = ("server", "transport", "buffer", "active", "paused", "queued", "held", "eof")

    def __init__(self, server: MetricsServer) -> None:
        self.server = server
        self.buffer = bytearray()
        self.paused = False  # the client is not reading: answer nothing more until it does
        self.queued = False  # a turn to answer the next request is scheduled
        self.held = False  # reading paused: enough unanswered requests are buffered
        self.active = 0.0  # loop time of the last complete request (or the connect, or writing resumed)
        self.eof = False  # the client closed its side: answer what it sent, then close

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.active = self.server._loop.time()
        self.server.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data  # (bytes alone are no sign of life: only a complete request is)
        if len(self.buffer) > 4 * self.server.max_header_bytes and not self.held:
            self.held = True  # read no more until what is buffered is answered
            self.transport.pause_reading()
        self._queue()

    def eof_received(self) -> bool:
        """A client that sends its requests and closes its side (``nc -N``) still gets every answer: the
        transport stays open for writing until the buffered requests are answered (asyncio's default
        closed it at once, and all but the first answer were lost)."""
        self.eof = True
        self._queue()
        return True

    def pause_writing(self) -> None:
        self.paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self.active = self.server._loop.time()
        if not self.held:
            self.transport.resume_reading()
        self._queue()

    def _queue(self) -> None:
        if not self.queued:
            self.queued = True
            self.server._loop.call_soon(self._turn)

    def _turn(self) -> None:
        """Answer one buffered request; the next waits for another turn, after every other connection's."""
        self.queued = False
        if self.paused or self.transport.is_closing():
            return
        if (empty := _EMPTY.match(self.buffer)) is not None:  # (RFC 9112 2.2: empty lines before a request
            del self.buffer[:empty.end()]  # line are ignored)
        found = _END.search(self.buffer)
        end = -1 if found is None else found.start()
        if end > self.server.max_header_bytes or (end < 0 and len(self.buffer) > self.server.max_header_bytes):
            self.transport.write(_response(431, _TEXT, b"request head too large\n", "", keep=False))
            self.transport.close()  # a head that large is no request of ours
            return
        if found is None:
            if self.eof:
                self.transport.close()  # every request the client sent is answered
            elif self.held:
                self.held = False
                self.transport.resume_reading()
            return
        head = bytes(self.buffer[:end])
        del self.buffer[:found.end()]
        self.active = self.server._loop.time()
        response, keep = self.server.answer(head)
        self.transport.write(response)
        if not keep:
            self.transport.close()  # after the response is sent
        elif self.buffer or self.held or self.eof:
            self._queue()  # the next request, or reading resumed once the buffer is answered, or the close


def _keep_alive(lines: list[str]) -> bool:
    """HTTP/1.1 GET: the connection stays unless the client says close or sent a body."""
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("content-length", "transfer-encoding") or (name == "connection"
                                                               and value.strip().lower() == "close"):
            return False
    return True


def _response(code: int, ctype: str, body: bytes, extra: str, keep: bool) -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}{'' if keep else 'Connection: close' + chr(13) + chr(10)}\r\n")
    return head.encode("latin-1") + body
