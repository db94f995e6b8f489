"""The /metrics bytes: rendered in two parts, each only as often as it changes (issue 16).

The per-GPU and per-instance series (nearly all the bytes) come from the sampler's snapshot, so
they are rendered once per snapshot; the daemon's own few series (status, counters, faults) are
rendered at most every ``live_max_age_s``.  While each snapshot's rendering gets scraped, the sampler
thread renders the next one as it is taken (:meth:`refresh`), so under load a scrape only joins
bytes and never waits for a big rendering on the event loop: if one is under way in the sampler
thread, the previous snapshot's bytes are sent, as if the scrape had come those milliseconds
earlier.  A lone scrape after a quiet spell renders the snapshot itself.
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, generate_latest

from migd.metrics.sampler import Sampler


class Exposition:
    live_max_age_s = 0.1

    def __init__(self, snapshot: CollectorRegistry, live: CollectorRegistry, sampler: Sampler) -> None:
        self.snapshot_registry = snapshot
        self.live_registry = live
        self.sampler = sampler
        self._lock = threading.Lock()
        self._snap: tuple[object, bytes] | None = None  # (snapshot, its rendering)
        self._live: tuple[float, bytes] | None = None  # (monotonic time, rendering)
        self._served = False  # the current snapshot rendering was sent at least once
        self._rendering = False  # the sampler thread is rendering the next snapshot

    def render(self) -> bytes:
        return b"".join(self.parts())

    def parts(self) -> tuple[bytes, bytes]:
        """The snapshot's rendering and the live one: the same objects until each changes."""
        return self._snapshot_bytes(), self._live_bytes()

    def _live_bytes(self) -> bytes:
        now = time.monotonic()
        cached = self._live
        if cached is None or now - cached[0] > self.live_max_age_s:
            cached = self._live = (now, generate_latest(self.live_registry))
        return cached[1]

    def _snapshot_bytes(self) -> bytes:
        with self._lock:
            self._served = True
            cached = self._snap
            if cached is not None and (cached[0] is self.sampler.snapshot or self._rendering):
                return cached[1]
        return self._render_snapshot()

    def refresh(self, snapshot: object) -> None:
        """After a sampling cycle (sampler thread): render ahead only if the last rendering was
        served, so a daemon sampling every second and scraped every 15 s renders about twice per
        scrape, not every second."""
        with self._lock:
            wanted, self._served = self._served, False
        if wanted:
            self._render_snapshot()

    def _render_snapshot(self) -> bytes:
        snapshot = self.sampler.snapshot
        with self._lock:
            if self._snap is not None and self._snap[0] is snapshot:
                return self._snap[1]
            self._rendering = True
        try:
            body = generate_latest(self.snapshot_registry)  # no lock held: scrapes meanwhile get the last bytes
        finally:
            with self._lock:
                self._rendering = False
        with self._lock:
            self._snap = (snapshot, body)
        return body
