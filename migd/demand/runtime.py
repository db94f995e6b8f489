"""Time limits are upper bounds: how much of its limit an account's job actually runs, learned.

Users pad their limits (a notebook asked for 2 hours runs 40 minutes), so valuing pending work and
costing a drain by the limits alone overstates both: a node whose jobs will end in an hour looks
busy for four, and is never switched.  The planner sees each job it watched run end (the job leaves
Slurm's running set, or Slurm shows it completed with its end time) and keeps, per account, the
last ``keep`` ratios of run time to time limit.  The rule takes a high quantile of them (``q``, 0.9:
nine jobs in ten end earlier), so an expected end is rarely too early; an account with fewer than
``min_jobs`` ended jobs is taken to run to its limits, as before anything is learned.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

MIN_JOBS = 10  # ended jobs of an account before its share is used (fewer: it runs to its limits)


class RunTimes:
    def __init__(self, keep: int = 200, min_jobs: int = MIN_JOBS, q: float = 0.9) -> None:
        self.keep, self.min_jobs, self.q = keep, min_jobs, q
        self.seen: dict[str, deque[float]] = {}

    def observe(self, account: str, ran_s: float, limit_s: float) -> None:
        """One ended job: it ran ``ran_s`` of its ``limit_s`` (an unlimited job teaches nothing)."""
        if not 0 < limit_s < float("inf") or ran_s < 0:
            return
        self.seen.setdefault(account, deque(maxlen=self.keep)).append(min(1.0, ran_s / limit_s))

    def ratios(self) -> tuple[tuple[str, float], ...]:
        """Per account with enough ended jobs: the share of its limit nine jobs in ten stay within."""
        out = []
        for account, values in sorted(self.seen.items()):
            if len(values) >= self.min_jobs:
                ordered = sorted(values)
                out.append((account, round(ordered[min(len(ordered) - 1, int(self.q * len(ordered)))], 4)))
        return tuple(out)

    def to_json(self) -> dict[str, list[float]]:
        return {a: list(v) for a, v in sorted(self.seen.items())}

    def load(self, doc: Mapping[str, Iterable[float]]) -> None:
        for account, values in doc.items():
            self.seen[account] = deque((min(1.0, max(0.0, float(v))) for v in values), maxlen=self.keep)
