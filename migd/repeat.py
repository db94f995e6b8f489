"""How often a lasting condition is logged: when it starts, when its cause changes, and again at most
every ``repeat_s`` while it lasts.  A controller down for an hour is a handful of lines, not one per
pass; the metric that says it (``migd_demand_slurm_unreadable``, say) is what pages."""

from __future__ import annotations

import time
from collections.abc import Callable

REPEAT_S = 600.0


class Said:
    """One condition's log lines (real time: a log is read by people, whatever migd's clock)."""

    def __init__(self, repeat_s: float = REPEAT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.repeat_s = repeat_s
        self._clock = clock
        self._why: str | None = None
        self._at = 0.0

    def due(self, why: str) -> bool:
        """Whether ``why`` is to be logged now (then it counts as said)."""
        now = self._clock()
        if why == self._why and now - self._at < self.repeat_s:
            return False
        self._why, self._at = why, now
        return True

    def ended(self) -> bool:
        """The condition is over: whether it had been said (its end is then worth a line)."""
        was, self._why = self._why, None
        return was is not None
