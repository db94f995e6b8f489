"""systemd's watchdog, fed from its own thread for as long as the daemon makes progress.

Pinging from the decision loop starved the watchdog whenever that loop legitimately waited
(a manual apply holding the lock while busy instances drain, a reload): 12-21 s without
WATCHDOG=1.  Here every part that works marks progress on a :class:`Heartbeat` (the loop each
turn, an apply each step or busy poll), and the pings stop only when nothing has moved for
``stall_s``: a daemon truly stuck (say, in an NVML call that never returns) is still killed.
"""

from __future__ import annotations

import logging
import threading
import time

from migd.daemon.sdnotify import Notifier
from migd.state.live import WATCHDOG_STALL_S

log = logging.getLogger("migd")


class Heartbeat:
    def __init__(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()  # one float store: safe from any thread


class Watchdog:
    def __init__(self, notifier: Notifier, heartbeat: Heartbeat, stall_s: float = WATCHDOG_STALL_S) -> None:
        self.notifier = notifier
        self.heartbeat = heartbeat
        self.stall_s = stall_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.notifier.watchdog_interval_s:
            self._thread = threading.Thread(target=self._run, name="migd-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        interval = self.notifier.watchdog_interval_s or 1.0
        stalled = False
        while not self._stop.wait(interval):
            idle = time.monotonic() - self.heartbeat.last
            if idle < self.stall_s:
                self.notifier.watchdog()
                stalled = False
            elif not stalled:
                log.critical("no progress for %.0fs: no longer feeding systemd's watchdog", idle)
                stalled = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
