"""What no MIG policy reaches: the fleet as one pool of GPU slices, a job starting on any free slices as
soon as enough are free (in arrival order, a job that fits passing one that does not, as the model's
backfill), so no partition, drain or switch ever holds a job back.  The waits left here are demand
beyond the whole fleet; a policy's waits above them are the price of MIG's partitions and of changing
them, the most any policy could still win.  It flatters beyond that: a 2g or 3g layout of an H100 leaves
one of its seven slices unused, and a job here may spread over nodes."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from demand_trace import TraceJob

from migd.demand.inputs import slices_of
from migd.whatif.figures import type_waits


def pool(jobs: Sequence[TraceJob], slices: int, end_s: float, step_s: float = 30.0) -> dict[str, Any]:
    """Waits of ``jobs`` on ``slices`` pooled, to the model's step; a job still waiting at ``end_s`` waited
    until then (censored, as in every replay)."""
    arrivals = iter(sorted(jobs, key=lambda j: j.submit_s))
    nxt = next(arrivals, None)
    free, t = slices, 0.0
    queue: list[TraceJob] = []
    running: list[tuple[float, int]] = []  # (end, slices), soonest first
    waits: dict[str, list[float]] = {}
    while t < end_s:
        moved = False
        while nxt is not None and nxt.submit_s <= t:
            queue.append(nxt)
            nxt, moved = next(arrivals, None), True
        while running and running[0][0] <= t:
            free, moved = free + heapq.heappop(running)[1], True
        if moved:
            waiting = []
            for j in queue:
                need = slices_of(j.gres) * j.count * j.nodes
                if need <= free:
                    free -= need
                    heapq.heappush(running, (t + j.duration_s, need))
                    waits.setdefault(j.gres, []).append(t - j.submit_s)
                else:
                    waiting.append(j)
            queue = waiting
        t += step_s
    for j in queue:
        waits.setdefault(j.gres, []).append(end_s - j.submit_s)
    return {**type_waits(waits), "never_started": len(queue)}
