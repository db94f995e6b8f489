"""What is asked of migd before its daemon serves (while it waits for the NVIDIA driver, and while it
starts): SIGHUP, SIGTERM and ``migctl reload``, kept and handed to the daemon once it answers.

Why a module of its own: migd's signal handlers were the default ones between the wait and the daemon's
own (a ``systemctl reload`` then killed migd), and a reload answered "kept" in the moment the sockets
passed to the daemon was never read.  One relay serves the whole run, and the hand-over takes the same
lock as a reload being answered, so everything asked before it is seen after it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from migd.config.migdyaml import Config, load_config, restart_note, restart_only
from migd.daemon.answers import Reloaded, rejection

log = logging.getLogger("migd")


class Early:
    """SIGHUP and ``migctl reload`` (``hup``), SIGTERM and SIGINT (``stop``) until :meth:`hand_over`."""

    def __init__(self, config_path: str) -> None:
        self.config_path = config_path
        self.started: Config | None = None  # what migd starts on (read before its sockets are bound, so before
        # any reload is asked): what a restart-only change is read against
        self.hup = threading.Event()
        self.stop = threading.Event()
        self._stopped_by = signal.SIGTERM  # (SIGINT is handed on as itself: the log names the signal)
        self._lock = threading.Lock()
        self._to: Callable[[int], None] | None = None  # the daemon's, once handed over

    def signal(self, signum: int) -> None:
        """The relay's action for the whole run: kept here until the daemon takes them."""
        with self._lock:
            to = self._to
            if to is None and signum == signal.SIGHUP:
                self.hup.set()
            elif to is None:
                self._stopped_by = signal.Signals(signum)
                self.stop.set()
        if to is not None:
            to(signum)

    def reload(self) -> Reloaded:
        """``migctl reload`` before the daemon serves: the files read and checked now (a bad one rejected,
        as at any time, and any reload kept before it dropped with it), then kept, as a SIGHUP then is: the
        daemon reads them again as it starts serving (checked then against the GPUs too)."""
        with self._lock:
            try:
                new = load_config(self.config_path)
            except Exception as e:  # noqa: BLE001 - a rejected reload, never a traceback (answers.rejection)
                self.hup.clear()
                said = rejection(e)
                log.error("reload rejected before migd serves the GPUs: %s", said)
                return Reloaded(said, "")
            to = self._to  # (set: asked as the sockets passed to the daemon, which takes it as a SIGHUP)
            if to is not None:
                to(signal.SIGHUP)
            else:
                self.hup.set()
        stale = restart_only(self.started, new) if self.started else []
        log.info("reload asked as migd started: %s is read again as it serves the GPUs", new.path)
        then = "migd reads it again now" if to is not None else \
            "migd reads it again and serves the GPUs with it once NVML opens (it waits for the NVIDIA driver)"
        return Reloaded(None, f"{new.summary}; {then}{restart_note(stale)}")

    def hand_over(self, to: Callable[[int], None]) -> None:
        """From now on signals go to ``to``; what came before is given to it now, once (a reload being
        answered finishes first)."""
        with self._lock:
            self._to = to
            kept = [s for s, e in ((signal.SIGHUP, self.hup), (self._stopped_by, self.stop)) if e.is_set()]
        for signum in kept:
            to(signum)
