"""How much a trace's mix of MIG types shifts: each window's share of slice-hours per type, and how far
it is from the whole trace's mix.

The target of 0.85x the best fixed mix in hindsight is for traces whose demand shifts: a mix sized
for the whole trace is then wrong part of the time, and a layout that follows demand has room to beat
it.  Where every window asks the trace's own mix, the best fixed mix already offers each window what
it asks, and the target does not apply.  The distance of two mixes is their total variation distance
(half the summed differences of the shares: 0 the same mix, 1 no type in common); the figure is its
mean over the windows, weighted by each window's slice-hours (a quiet hour's odd mix counts for little).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from migd.whatif.fixedmix import slice_hours
from migd.whatif.jobs import TraceJob

Mix = dict[str, float]  # MIG type -> slice-hours

WINDOW_S = 6 * 3600.0  # a window: day and night apart
SHIFT_MIN = 0.10  # a trace's demand shifts at this distance or more.  Not derived: it lies between the
# traces measured (docs/demand.md): every synthetic draw 0.22 or more, the shifting trace 0.40, the
# Alibaba week 0.03 (7g is 91-99% of each of its days' slice-hours)


def windows(jobs: Iterable[TraceJob], window_s: float, end_s: float) -> list[Mix]:
    """Slice-hours asked per MIG type by the jobs submitted in each window of ``window_s`` before ``end_s``."""
    out: list[list[TraceJob]] = [[] for _ in range(max(1, int(-(-end_s // window_s))))]
    for j in jobs:
        if 0 <= j.submit_s < end_s:
            out[int(j.submit_s // window_s)].append(j)
    return [slice_hours(w) for w in out]


def distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Total variation distance of two mixes, each taken as shares of its own total (an empty one: 0)."""
    ta, tb = sum(a.values()), sum(b.values())
    if ta <= 0 or tb <= 0:
        return 0.0
    return sum(abs(a.get(t, 0.0) / ta - b.get(t, 0.0) / tb) for t in {*a, *b}) / 2


def shift(mixes: list[Mix]) -> float:
    """The windows' distance from the whole trace's mix, weighted by their slice-hours."""
    whole: Mix = defaultdict(float)
    for m in mixes:
        for t, v in m.items():
            whole[t] += v
    total = sum(whole.values())
    return sum(sum(m.values()) * distance(m, whole) for m in mixes) / total if total > 0 else 0.0


def of_trace(jobs: Iterable[TraceJob], end_s: float) -> float:
    """The trace's shift over windows of ``WINDOW_S``: what decides whether the hindsight target applies."""
    return shift(windows(jobs, WINDOW_S, end_s))


def holds(distance_from_whole: float) -> bool:
    """Whether a trace whose windows are this far from its whole mix (``shift``) asks one mix throughout:
    the best fixed mix then already offers each window what it asks."""
    return distance_from_whole < SHIFT_MIN
