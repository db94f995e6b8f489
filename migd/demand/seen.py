"""When the planner last saw a job of each MIG type, pending or running: what lets a type used recently
keep its last place to run (migd/demand/rule.py) between its jobs.  Kept across restarts in the
planner's ``demand.json``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from migd.demand.inputs import Seen


class LastSeen:
    def __init__(self) -> None:
        self.at: dict[str, tuple[float, int]] = {}  # MIG type -> (when last seen, fewest instances asked)

    def observe(self, now: float, jobs: Iterable[tuple[str, int]]) -> None:
        """Jobs (MIG type, instances on one node) pending or running at ``now``."""
        fewest: dict[str, int] = {}
        for mig_type, count in jobs:
            fewest[mig_type] = min(count, fewest.get(mig_type, count))
        for mig_type, count in fewest.items():
            before = self.at.get(mig_type)
            self.at[mig_type] = (now, count if before is None else min(count, before[1]))

    def seen(self, now: float) -> tuple[Seen, ...]:
        return tuple(Seen(t, max(0.0, now - at), k) for t, (at, k) in sorted(self.at.items()))

    def to_json(self) -> dict[str, tuple[float, float]]:
        return {t: (at, float(k)) for t, (at, k) in sorted(self.at.items())}

    def load(self, doc: Mapping[str, tuple[float, float]]) -> None:
        for mig_type, (at, k) in doc.items():
            self.at[mig_type] = (float(at), max(1, int(k)))
