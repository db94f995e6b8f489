"""What makes the daemon's loop look again, said by other threads with verbs; taken by the loop alone.

Signals, the control socket, the fault watch and an apply's own end each have something to tell the
loop; none of them decides anything.  The loop is level-triggered (service.py), so a word said twice
before the loop wakes is one look, and a word said while a pass runs is seen at the next turn.
"""

from __future__ import annotations

import threading

from migd.kinds import Word


class Reload(Word):
    """What a reload asks of the loop's next turn."""

    READ = "read"  # SIGHUP: read the configuration again, then decide on it
    DECIDE = "decide"  # `migctl reload` read it already (to answer whether it took): decide on it


class Events:
    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._read = threading.Event()
        self._decide = threading.Event()
        self._changed = threading.Event()
        self.cancel = threading.Event()  # read by an apply in progress: stop waiting, roll back its step

    # -- said by other threads ----------------------------------------------------------------------
    def wake(self) -> None:
        """Look again now (a fault mark cleared, a manual apply left a GPU waiting, ...)."""
        self._wake.set()

    def request_reload(self) -> None:
        """SIGHUP: read the configuration at the next turn."""
        self._read.set()
        self._wake.set()

    def reloaded(self) -> None:
        """The configuration was read (and took) on a client's behalf: decide on it at the next turn."""
        self._decide.set()
        self._wake.set()

    def config_changed(self) -> None:
        """NVML reported a MIG configuration change: look for drift now, not at the next interval."""
        self._changed.set()
        self._wake.set()

    def terminate(self) -> None:
        """SIGTERM or SIGINT: stop waiting, roll back the step in progress, and end the loop."""
        self.cancel.set()
        self._stop.set()
        self._wake.set()

    # -- taken by the loop ----------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, timeout_s: float) -> None:
        """Until a word is said or ``timeout_s`` passes; what was said stays until taken."""
        self._wake.wait(timeout_s)
        self._wake.clear()

    def take_reload(self) -> Reload | None:
        if self._read.is_set():
            self._read.clear()
            self._decide.clear()
            return Reload.READ
        if self._decide.is_set():
            self._decide.clear()
            return Reload.DECIDE
        return None

    def take_config_changed(self) -> bool:
        changed = self._changed.is_set()
        self._changed.clear()
        return changed
