"""What one node offers and what a change of it costs, in GPU-slice-hours within the horizon.

A running job's end is what Slurm says (its EndTime: start plus time limit, an upper bound) unless
its account's jobs are known to stop earlier: then its expected end is its start plus the learned
share of its limit (migd/demand/runtime.py), never later than Slurm's.  A job already past that
expectation is taken to run to its limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from migd.demand.inputs import Layout, NodeView, Running, slices_of

Supply = dict[str, float]  # MIG type -> slice-hours a node offers within the horizon


@dataclass(frozen=True)
class Horizon:
    """The figures the node arithmetic needs from the rule's parameters."""

    horizon_s: float
    switch_s: float
    ratio: Mapping[str, float]  # account -> expected run time / time limit


def remaining_s(r: Running, h: Horizon) -> float:
    """How long ``r`` is expected to go on: to its learned expected end, else to its limit."""
    ratio = h.ratio.get(r.account, 1.0)
    if ratio >= 1.0 or not 0 < r.limit_s < float("inf"):
        return r.ends_in_s
    elapsed = r.limit_s - r.ends_in_s
    expected = expected_s(r.limit_s, ratio)
    return min(r.ends_in_s, expected - elapsed) if elapsed < expected else r.ends_in_s


def expected_s(limit_s: float, ratio: float) -> float:
    """How long a job of time limit ``limit_s`` is expected to run, its account running ``ratio`` of its
    limits: an unlimited job runs on (however short its account's other jobs ran)."""
    return limit_s * ratio if limit_s < float("inf") else float("inf")


def ready_in_s(node: NodeView, h: Horizon) -> float:
    """When a change of ``node`` can serve: its running jobs' expected end, then the switch itself."""
    return max((remaining_s(r, h) for r in node.running), default=0.0) + h.switch_s


def supply(node: NodeView, layout: Layout, h: Horizon, staying: bool) -> Supply:
    """Slice-hours ``node`` in ``layout`` offers within the horizon: each instance's time not taken by the
    running job on it (to its expected end), if it stays; all of ``layout`` from when it is ready, if
    it changes (or is changing) to it."""
    if not staying:
        return from_ready(layout, ready_in_s(node, h), h)
    out: Supply = {t: slices_of(t) * n * h.horizon_s / 3600 for t, n in layout.capacity}
    for r in node.running:
        if r.mig_type in out:
            out[r.mig_type] -= slices_of(r.mig_type) * r.count * min(remaining_s(r, h), h.horizon_s) / 3600
    return out


def from_ready(layout: Layout, ready_s: float, h: Horizon) -> Supply:
    """All of ``layout``'s slice-hours from ``ready_s`` on, to the horizon's end."""
    left = max(0.0, h.horizon_s - ready_s) / 3600
    return {t: slices_of(t) * n * left for t, n in layout.capacity}


def drain_cost(node: NodeView, slices: int, h: Horizon) -> float:
    """Slice-hours idled by a change: every slice from now until the node is ready, less the slices
    its running jobs keep busy meanwhile."""
    busy = sum(slices_of(r.mig_type) * r.count * remaining_s(r, h) for r in node.running)
    return max(0.0, slices * ready_in_s(node, h) - busy) / 3600
