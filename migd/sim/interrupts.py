"""Ctrl-C during a simulated NVML call reaches the caller after the call returns, as with C.

A real libnvidia-ml runs no Python: a SIGINT during a call only sets Python's flag, and the
KeyboardInterrupt is raised in the calling Python code once the call returns.  The simulator's
entry points are Python (ctypes callbacks), so the interrupt is raised inside them instead, where
ctypes would print it and return 0.  The callbacks catch it and hand it to :func:`raise_after_return`,
which raises it again at the first Python call the caller makes after the C call returned (pynvml's
``_nvmlCheckReturn``): a profile hook on the calling thread, removed as it fires.  An earlier relay
thread that re-posted the signal "once the caller looked idle" kept missing a thread that spends its
time inside slow simulated calls, and so deferred a second Ctrl-C during a rollback until the
rollback had finished.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIM = "migd.sim"


def _in_simulator(frame: FrameType | None) -> bool:
    return frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_SIM)


def raise_after_return() -> None:
    """Raise KeyboardInterrupt in this thread at its first Python call made from outside the
    simulator, i.e. right after the simulated C call returned to its caller."""
    previous = sys.getprofile()
    if getattr(previous, "migd_sim_interrupt", False):
        return  # one is pending already: like Python's signal flag, two Ctrl-Cs raise once

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and not _in_simulator(frame.f_back):
            sys.setprofile(previous)
            raise KeyboardInterrupt
    hook.migd_sim_interrupt = True  # type: ignore[attr-defined]
    sys.setprofile(hook)


def watch_unraisable(ours: Callable[[object], bool]) -> None:
    """A Ctrl-C that lands in a callback before its first line escapes every handler there: ctypes
    reports it to ``sys.unraisablehook`` (and returns 0).  Raise that one after the return as well."""
    previous = sys.unraisablehook

    def hook(u: Any) -> None:
        if isinstance(u.exc_value, KeyboardInterrupt) and ours(u.object):
            raise_after_return()
        previous(u)
    sys.unraisablehook = hook
