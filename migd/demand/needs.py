"""What the pending jobs need of the fleet's layouts, per MIG type: the instances its smallest job asks
on one node, the nodes its first job in Slurm's order spans, and which jobs any layout could start at
all.  The demand rule (rule.py) gives and keeps places by these."""

from __future__ import annotations

from collections.abc import Mapping

from migd.demand.inputs import Layout, NodeView, Pending, Shapes
from migd.demand.reserve import priority_order


def need(pending: tuple[Pending, ...], layouts: list[Layout]) -> dict[str, int]:
    """Per MIG type with pending work, the instances its smallest job asks."""
    smallest: dict[str, int] = {}
    for p in pending:
        smallest[p.mig_type] = min(smallest.get(p.mig_type, p.count), p.count)
    return startable(smallest, layouts)


def possible(pending: tuple[Pending, ...], nodes: tuple[NodeView, ...], shapes: Shapes) -> list[Pending]:
    """The pending jobs some layouts of the nodes could start: one over more nodes than can ever offer its
    share (in a layout of their GPUs) is left out, as no change lets it start."""
    able: dict[tuple[str, int], int] = {}
    out = []
    for p in pending:
        if p.nodes > 1:
            key = (p.mig_type, p.count)
            if key not in able:
                able[key] = sum(1 for n in nodes if any(lay.count(p.mig_type) >= p.count
                                                        for lay in shapes.of(n).values()))
            if p.nodes > able[key]:
                continue
        out.append(p)
    return out


def spread_of(pending: tuple[Pending, ...]) -> dict[str, int]:
    """Per MIG type with pending work, the nodes its first job in Slurm's order spans, where more than
    one: the job Slurm's backfill reserves for first (reserve.py), which younger jobs of its type may
    pass but not hold back for ever (by the least spread job instead, a job over two nodes behind a
    stream of one-node jobs of its type never had its second place)."""
    first: dict[str, Pending] = {}
    for p in sorted(pending, key=priority_order):
        first.setdefault(p.mig_type, p)
    return {t: p.nodes for t, p in first.items() if p.nodes > 1}


def startable(need: Mapping[str, int], layouts: list[Layout]) -> dict[str, int]:
    """Those of ``need`` (MIG type -> instances on one node) some layout can start: for the others no
    change gives or keeps a place."""
    return {t: k for t, k in need.items() if any(lay.count(t) >= k for lay in layouts)}
