"""A bound on what clients can hold: connections served at once, and how long one may sit idle.

Both of migd's servers (metrics over TCP, control over a Unix socket) start a thread per
connection; without a bound, ~1,100 idle connections from any local user exhausted the daemon's
file descriptors and killed it mid-transition.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable
from typing import Any


class CappedThreadingMixIn(socketserver.ThreadingMixIn):
    """At most ``cap``'s count of connections served at once; one more is closed as soon as it is
    accepted (a scraper or migctl retries).  The handler's ``timeout`` bounds a silent client."""

    cap: threading.BoundedSemaphore  # set by the server before it starts serving
    refused = 0
    shutdown_request: Callable[[Any], None]  # socketserver.BaseServer's, later in the MRO

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.cap.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.cap.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.cap.release()
