"""The /metrics bytes: rendered in two parts, each only as often as it changes.

The per-GPU and per-instance series and the fault counters (most of the bytes) change with the
sampler's snapshot or an event, so they are rendered once per version; the daemon's own series
(status, applies, the sampler, the process) again when more than ``live_max_age_s`` old, in a
thread while scrapes keep coming.  While each slow rendering gets scraped, the sampler thread
renders the next one as a snapshot is taken (:meth:`refresh`), so under load a scrape only joins
bytes and never waits for a big rendering on the event loop: if one is under way in the sampler
thread, the previous bytes are sent, as if the scrape had come those milliseconds earlier.  A
lone scrape after a quiet spell renders them itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest


class Exposition:
    """``slow``: the registry of the series that change with a snapshot or an event, and ``version``
    what tells their renderings apart (compared by identity first, then by value); ``live``: the
    daemon's own series."""

    # The daemon's own series (its CPU, memory, descriptors, applies) are at most 1 s old under a
    # burst of scrapes; re-rendering them every 0.1 s (ProcessCollector reads /proc) competed with
    # the event loop for the GIL and cost the scrape p99 about a tenth.
    live_max_age_s = 1.0
    live_stale_s = 3.0

    def __init__(self, slow: CollectorRegistry, version: Callable[[], tuple[Any, ...]],
                 live: CollectorRegistry) -> None:
        self.slow_registry = slow
        self.version = version
        self.live_registry = live
        self._lock = threading.Lock()
        self._slow: tuple[tuple[Any, ...], bytes] | None = None  # (version, its rendering)
        self._live: tuple[float, bytes] | None = None  # (monotonic time, rendering)
        self._served = False  # the current slow rendering was sent at least once
        self._rendering = False  # the sampler thread is rendering the next one
        self._live_pending = False  # a thread is rendering the live part

    def render(self) -> bytes:
        return b"".join(self.parts())

    def parts(self) -> tuple[bytes, bytes]:
        """The slow rendering and the live one: the same objects until each changes."""
        return self._slow_bytes(), self._live_bytes()

    def _live_bytes(self) -> bytes:
        """At most ``live_max_age_s`` old.  Between that and ``live_stale_s`` the last rendering is
        sent while a thread renders the next (scrapes under load never render on the event loop);
        older than that (a lone scrape after a quiet spell) it is rendered here, fresh."""
        now = time.monotonic()
        cached = self._live
        if cached is None or now - cached[0] > self.live_stale_s:
            cached = self._live = (now, generate_latest(self.live_registry))
        elif now - cached[0] > self.live_max_age_s:
            with self._lock:
                start, self._live_pending = not self._live_pending, True
            if start:
                threading.Thread(target=self._render_live, name="migd-render", daemon=True).start()
        return cached[1]

    def _render_live(self) -> None:
        try:
            self._live = (time.monotonic(), generate_latest(self.live_registry))
        finally:
            with self._lock:
                self._live_pending = False

    def _slow_bytes(self) -> bytes:
        version = self.version()
        with self._lock:
            self._served = True
            cached = self._slow
            if cached is not None and (_same(cached[0], version) or self._rendering):
                return cached[1]
        return self._render_slow(version)

    def refresh(self, snapshot: object) -> None:
        """After a sampling cycle (sampler thread): render ahead only if the last rendering was
        served, so a daemon sampling every second and scraped every 15 s renders about twice per
        scrape, not every second."""
        with self._lock:
            wanted, self._served = self._served, False
        if wanted:
            self._render_slow(self.version())

    def _render_slow(self, version: tuple[Any, ...]) -> bytes:
        with self._lock:
            if self._slow is not None and _same(self._slow[0], version):
                return self._slow[1]
            self._rendering = True
        try:
            body = generate_latest(self.slow_registry)  # no lock held: scrapes meanwhile get the last bytes
        finally:
            with self._lock:
                self._rendering = False
        with self._lock:
            self._slow = (version, body)
        return body


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))
