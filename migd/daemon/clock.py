"""The daemon's clock: wall time, or a virtual time started elsewhere and run faster (demo, tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from migd.api.daemon import SimClock
from migd.isolation.xids import utc_iso


class Clock:
    """Wall clock, optionally started at ``start`` and running ``scale`` times faster."""

    def __init__(self, start: datetime | None = None, scale: float = 1.0) -> None:
        self._real0 = time.time()
        self._virt0 = (start or datetime.now(timezone.utc)).astimezone(timezone.utc)
        self._start = self._virt0
        self.scale = scale
        self.own = start is not None or scale != 1.0  # not the machine's: said wherever times are shown

    def restart(self) -> None:
        """Count from here: with a scaled clock, start-up time must not eat virtual time."""
        if self.scale != 1.0:
            self._virt0, self._real0 = self._start, time.time()

    def now(self) -> datetime:
        return self._virt0 + timedelta(seconds=(time.time() - self._real0) * self.scale)

    def real(self, virtual_s: float) -> float:
        return virtual_s / self.scale

    def view(self) -> SimClock | None:
        """How a Unix time turns into this clock (None: it is the machine's)."""
        return SimClock(self._virt0.isoformat(), round(self._real0, 3), self.scale) if self.own else None


def iso_on(clock: SimClock) -> Callable[[float], str]:
    """A Unix time in UTC, ISO 8601, as ``clock`` reads it: the form migd's words give a time in (a fault
    mark's, say), on its own clock."""
    return lambda epoch: utc_iso(clock.of(epoch).timestamp())
