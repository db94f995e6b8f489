"""HTTP exposition: GET /metrics and GET /healthz, nothing else (and nothing that changes a GPU)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from migd.metrics.collector import EventCounters, MigdCollector
from migd.metrics.sampler import NvmlErrorCounter, Sampler, ViewSource
from migd.netcap import CappedThreadingMixIn


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = 5.0  # seconds a client may stay silent (idle connections must not pile up)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, self.server.render())
        elif path == "/healthz":
            ok, text = self.server.health()
            self._send(200 if ok else 503, "text/plain; charset=utf-8", text.encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: only /metrics and /healthz\n")

    def _refuse(self) -> None:
        self.send_response(405)
        self.send_header("Allow", "GET")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def do_HEAD(self) -> None:  # noqa: N802
        self._refuse()

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are not events worth a log line


class MetricsServer(CappedThreadingMixIn, HTTPServer):
    daemon_threads = True
    request_queue_size = 128
    max_connections = 64  # Prometheus scrapes with one connection; a few more for people and curl

    def __init__(self, host: str, port: int, registry: CollectorRegistry, sampler: Sampler,
                 stale_after_s: float) -> None:
        self.cap = threading.BoundedSemaphore(self.max_connections)
        self.registry = registry
        self.sampler = sampler
        self.stale_after_s = stale_after_s
        self._render_lock = threading.Lock()
        self._rendered: tuple[float, object, bytes] | None = None  # (time, snapshot, exposition)
        super().__init__((host, port), _Handler)

    def render(self, max_age_s: float = 1.0) -> bytes:
        """The exposition, rendered at most once a second (or per new snapshot) however many scrape."""
        with self._render_lock:
            now = time.monotonic()
            cached = self._rendered
            if cached is None or now - cached[0] > max_age_s or cached[1] is not self.sampler.snapshot:
                cached = (now, self.sampler.snapshot, generate_latest(self.registry))
                self._rendered = cached
            return cached[2]

    def health(self) -> tuple[bool, str]:
        last = self.sampler.last_success
        if last is None:
            return False, "no NVML sample yet\n"
        age = time.time() - last
        if age > self.stale_after_s:
            return False, f"last NVML sample {age:.0f}s ago\n"
        return True, "ok\n"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.sampler.stop()


@dataclass(frozen=True)
class Sources:
    """What the metrics side reads, each passed as the narrow thing it needs (never the daemon)."""

    backend: ViewSource
    lock: AbstractContextManager[Any]  # the reconfiguration lock: no NVML sample during an apply
    owners: Callable[[], dict[str, dict[int, str]]]
    status: Callable[[], Any]  # the daemon's Status
    audit: Callable[[], list[Any]] | None = None
    errors: NvmlErrorCounter | None = None
    events: EventCounters | None = None


def start_metrics(listen: str, sources: Sources, interval_s: float) -> tuple[MetricsServer, MigdCollector]:
    """Start the sampler thread and the HTTP server; the collector's observe_apply takes apply durations."""
    host, _, port = listen.rpartition(":")
    sampler = Sampler(sources.backend, sources.lock, sources.owners, interval_s)
    sampler.sample_once()
    sampler.start()
    registry = CollectorRegistry(auto_describe=True)
    collector = MigdCollector(sampler, sources.status, sources.errors or NvmlErrorCounter(), sources.events,
                              sources.audit)
    registry.register(collector)
    server = MetricsServer(host.strip("[]"), int(port), registry, sampler, stale_after_s=max(60.0, 4 * interval_s))
    threading.Thread(target=server.serve_forever, name="migd-http", daemon=True).start()
    return server, collector
