"""The /metrics and /healthz endpoint on one asyncio loop: no thread per connection (issue 16).

A thread per connection cost 38% of a scrape and header parsing through http.server another
27%.  Here one thread runs an event loop; the exposition is rendered as often as it changes
(exposition.py) and served as bytes; HTTP/1.1 keep-alive is honoured (Prometheus keeps its connection); a client
silent for ``idle_timeout_s`` is dropped; beyond ``max_connections`` a new connection is closed
at once (the bound that kept ~1,100 idle connections from exhausting the daemon's descriptors).
Only GET /metrics and GET /healthz exist; nothing here can change a GPU.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CONTENT_TYPE_LATEST

from migd.metrics.exposition import Exposition
from migd.metrics.sampler import Sampler

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}
_TEXT = "text/plain; charset=utf-8"


class MetricsServer:
    backlog = 128
    max_connections = 64  # Prometheus scrapes with one connection; a few more for people and curl
    idle_timeout_s = 5.0
    max_header_bytes = 16384

    def __init__(self, host: str, port: int, exposition: Exposition, sampler: Sampler, stale_after_s: float) -> None:
        self.exposition = exposition
        self.sampler = sampler
        self.stale_after_s = stale_after_s
        self.refused = 0
        self._active = 0
        self._responses: dict[bool, tuple[tuple[bytes, bytes], bytes]] = {}  # keep-alive -> (parts, response)
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(  # binding errors surface here, as OSError
            asyncio.start_server(self._client, host, port, backlog=self.backlog, limit=self.max_header_bytes))
        self.server_address = self._server.sockets[0].getsockname()

    def health(self) -> tuple[bool, str]:
        last = self.sampler.last_success
        if last is None:
            return False, "no NVML sample yet\n"
        age = time.time() - last
        if age > self.stale_after_s:
            return False, f"last NVML sample {age:.0f}s ago\n"
        return True, "ok\n"

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
        return 404, _TEXT, b"not found: only /metrics and /healthz\n", ""

    # -- connections ----------------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= self.max_connections:
            self.refused += 1
            writer.close()
            return
        self._active += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # a client that went away, sent too much or stayed silent: drop it
        finally:
            self._active -= 1
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True when the connection stays open for another (keep-alive).  A client
        silent for ``idle_timeout_s`` is cut off by a timer (cheaper than a wait_for task per request)."""
        timer = self._loop.call_later(self.idle_timeout_s, writer.transport.abort)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        finally:
            timer.cancel()
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            writer.write(_response(400, _TEXT, b"bad request\n", "", keep=False))
            return False
        method, target, version = parts
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        path = target.split("?", 1)[0]
        keep = (version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                and method == "GET" and "content-length" not in headers)
        if method == "GET" and path == "/metrics":
            writer.write(self._metrics_response(keep))
        else:
            code, ctype, body, extra = self._route(method, path)
            writer.write(_response(code, ctype, body, extra, keep))
        await writer.drain()
        return keep

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
        self.sampler.stop()


def _response(code: int, ctype: str, body: bytes, extra: str, keep: bool) -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}{'' if keep else 'Connection: close' + chr(13) + chr(10)}\r\n")
    return head.encode("latin-1") + body

