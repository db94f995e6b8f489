"""Waiting for the NVIDIA driver at start: NVML that cannot be opened yet is a hardware condition.

After a reboot the driver may come up after migd (a late module load, a driver being installed or
upgraded, nvidia-persistenced not yet done).  Refusing to start (exit 2, which the unit does not
restart) left the node without migd for good.  Instead migd tries again, 1 s after the first failure and
doubling up to 60 s (``--time-scale`` runs this faster, as every wait of the daemon's), and says so: one
WARNING when the wait begins or its cause changes, then at most every 10 minutes; ``STATUS=`` for
``systemctl status``; and ``/healthz`` answers 503 with the reason (``/metrics`` and ``/`` too) on the
configured address.  READY=1 is not sent before the GPUs are served, so units ordered after migd
(``Before=slurmd.service``) wait, as long as systemd's start timeout lets them; SIGTERM ends the wait
(exit 0).  A configuration error is still exit 2, at once.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from migd.daemon.sdnotify import Notifier
from migd.hardware.ports import GpuBackend
from migd.hardware.types import HardwareError
from migd.repeat import Said
from migd.yamlsrc import parse_host_port

log = logging.getLogger("migd")
FIRST_S, MOST_S = 1.0, 60.0  # between tries: 1 s, 2 s, 4 s, ... at most 60 s (systemd's watchdog is not armed yet)


class _Unavailable(http.server.BaseHTTPRequestHandler):
    """Every path answers 503 with why: migd is up, its GPUs are not served yet.  A client has
    ``timeout`` seconds to send its request (one that sent half and waited held a thread for ever)."""

    server: _HealthServer
    timeout = 5.0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = f"waiting for the NVIDIA driver: {self.server.why}\n".encode()
        self.send_response(503)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


class _HealthServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    why = ""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that reset its connection or left mid-answer is its own business: socketserver's
        default printed a traceback per client into migd's log (hundreds from a burst of resets)."""
        log.debug("/healthz while waiting for the driver: a client from %s went away", client_address)


def _health(listen: str | None) -> _HealthServer | None:
    """``/healthz`` while migd waits (None: metrics are off, or the address cannot be bound now: the
    metrics server says so once it starts)."""
    if not listen:
        return None
    host, port = parse_host_port(listen)
    try:
        server = _HealthServer((host, port), _Unavailable)
    except OSError as e:
        log.debug("no /healthz while waiting for the driver: %s", e)
        return None
    threading.Thread(target=server.serve_forever, name="migd-health-wait", daemon=True).start()
    return server


Answer = Callable[[Callable[[], str]], Callable[[], None]]  # (what migd is doing, asked) -> stop answering


def open_nvml(open_backend: Callable[[], GpuBackend], notifier: Notifier, stop: threading.Event,
              listen: str | None, scale: float = 1.0, answer: Answer | None = None) -> GpuBackend | None:
    """The backend, once NVML opens; None if ``stop`` was set first (SIGTERM while waiting).  ``answer``:
    started when the wait begins, with the line that says it (migd's sockets refuse with it, so migctl
    tells that migd runs and why it serves nothing yet, not that no migd listens); stopped if the wait
    ends without a backend, else left answering for the daemon to take over."""
    try:
        return open_backend()
    except HardwareError as e:
        why = str(e)
    server = _health(listen)
    since, delay, said = time.monotonic(), FIRST_S, Said()  # (the same cause again every 10 min at most)
    stop_answering = answer(lambda: f"migd is waiting for the NVIDIA driver ({time.monotonic() - since:.0f} s so "
                                    f"far; it serves the GPUs once NVML opens): {why}") if answer else None
    backend: GpuBackend | None = None
    try:
        while True:
            if server is not None:
                server.why = why
            if said.due(why):
                log.warning("cannot open NVML (%s): waiting for the NVIDIA driver, trying again every %gs at most; "
                            "migd serves the GPUs once it opens", why, MOST_S)
            notifier.status(f"waiting for the NVIDIA driver ({why}); next try in {delay:g}s")
            if stop.wait(delay / scale):
                log.info("stopped while waiting for the NVIDIA driver")
                return None
            try:
                backend = open_backend()
            except HardwareError as e:
                why, delay = str(e), min(MOST_S, delay * 2)
                continue
            log.info("NVML opened after waiting %.0fs for the NVIDIA driver", time.monotonic() - since)
            return backend
    finally:
        if stop_answering is not None and backend is None:
            stop_answering()
        if server is not None:
            server.shutdown()
            server.server_close()
