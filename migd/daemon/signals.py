"""Signals handled on a thread of their own, never inside the interrupted main thread.

A Python signal handler runs between two bytecodes of the main thread.  If it sets an Event
whose lock the main thread holds at that moment (inside ``Event.wait`` or ``clear``), it waits
on itself forever; a burst of signals can also nest handlers until the stack overflows.  Both
were seen with ``systemctl reload``.  So the handler does nothing: the interpreter's C-level
handler writes the signal number to a pipe (``signal.set_wakeup_fd``) and this thread reads it
and acts, taking locks like any other thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The wakeup fd is only written for signals with a Python handler; the work is done elsewhere."""


class SignalRelay:
    """Calls ``action(signum)`` on the ``migd-signals`` thread for each signal received."""

    def __init__(self, signals: Iterable[signal.Signals], action: Callable[[int], None]) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # set_wakeup_fd requires it; a full pipe drops, never blocks
        self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)  # main thread only
        self._old = {s: signal.signal(s, _ignore) for s in signals}
        self._action = action
        self._thread = threading.Thread(target=self._run, name="migd-signals", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in self._old:
                    self._action(signum)

    def close(self) -> None:
        """Restore the previous handlers (main thread only) and stop the relay thread."""
        for s, old in self._old.items():
            signal.signal(s, old)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._write)  # the reader sees end of file
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._read)
