"""A background loop that outlives its errors: the sampler and the fault watch both run on one.

A thread that dies on one unexpected exception leaves the daemon running with frozen metrics
or a deaf Xid watch, which is worse than crashing.  So every error is logged (a traceback for
the unexpected ones), counted, and the loop carries on after a pause.
"""

from __future__ import annotations

import logging
import threading

from migd.hardware.types import HardwareError


class BackgroundLoop:
    """Calls :meth:`step` on a daemon thread until :meth:`stop`."""

    thread_name = "migd-loop"
    join_timeout_s = 10.0

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what  # names the loop in its log lines
        self._stop = threading.Event()
        self._wake = threading.Event()  # ends the pause early (stop, or something to do now)
        self._thread: threading.Thread | None = None
        self.failures = 0

    def step(self) -> float:
        """One iteration; returns the seconds to wait before the next."""
        raise NotImplementedError

    def error_pause_s(self) -> float:
        return 1.0

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                pause = self.step()
            except HardwareError as e:
                self.failures += 1
                self._log.warning("%s failed: %s", self._what, e)
                pause = self.error_pause_s()
            except Exception:  # noqa: BLE001 - keep the loop alive, loudly
                self.failures += 1
                self._log.exception("%s failed unexpectedly; carrying on", self._what)
                pause = self.error_pause_s()
            self._wake.wait(pause)
            self._wake.clear()

    def wake(self) -> None:
        """Run the next step now instead of after the pause."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout_s)
