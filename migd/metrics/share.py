"""Each owner's share of the node's compute slices over today, for the page: slice-seconds per
owner since local midnight in the schedule's time zone, summed from the sampler's snapshots.

Between two snapshots the layout of the earlier one is taken to have held (the sampler sees changes
at its next cycle, so a share is exact to one sampling interval); the interval across midnight is
counted in neither day.  Slices no instance holds count as "free", so the shares add up to the whole
node over the time migd has been sampling today.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import date, datetime, tzinfo

from migd.metrics.snapshot import Snapshot

FREE = "free"


def held(snap: Snapshot) -> Counter[str]:
    """Compute slices per owner ("-": no owner; FREE: no instance) in one snapshot."""
    out: Counter[str] = Counter()
    for g in snap.gpus:
        taken = 0
        for gi in g.instances:
            out[gi.owner or "-"] += gi.compute_slices
            taken += gi.compute_slices
        if g.instances and g.compute_slices > taken:
            out[FREE] += g.compute_slices - taken
    return out


class DayShare:
    def __init__(self, tz: Callable[[], tzinfo]) -> None:
        self._tz = tz
        self._lock = threading.Lock()
        self._day: date | None = None
        self._seconds: dict[str, float] = {}  # slice-seconds today, per owner
        self._prev: tuple[float, Counter[str]] | None = None

    def observe(self, snap: Snapshot) -> None:
        """The sampler's hook: count the slices held since the previous snapshot."""
        day = datetime.fromtimestamp(snap.taken_at, self._tz()).date()
        now = held(snap)
        with self._lock:
            if day != self._day:
                self._day, self._seconds, self._prev = day, {}, None
            if self._prev is not None:
                t0, before = self._prev
                for owner, slices in before.items():
                    self._seconds[owner] = self._seconds.get(owner, 0.0) + slices * max(0.0, snap.taken_at - t0)
            self._prev = (snap.taken_at, now)

    def today(self) -> dict[str, float]:
        """Each owner's fraction of today's slice-seconds so far (empty until two snapshots)."""
        with self._lock:
            total = sum(self._seconds.values())
            return {o: s / total for o, s in sorted(self._seconds.items())} if total else {}
