"""What the demand rule decides from: one snapshot of Slurm's queue and nodes, and the candidate
layouts each node may take.  Everything here comes from Slurm itself (``squeue --json``, ``scontrol show node``)
or from the profiles; the rule reads nothing else, so the same snapshot gives the same decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property

_SLICES = re.compile(r"^([0-9]{1,2})g\.", re.ASCII)


def is_mig_type(name: str) -> bool:
    """A GPU instance profile's name, as the rule weighs it (``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``): not a
    whole GPU's type (``a100``), a compute instance's (``1c.3g.40gb``: layouts count GPU instances) or
    Slurm AutoDetect's (``nvidia_a100_1g.5gb``).  No candidate layout offers any of those."""
    return _SLICES.match(name) is not None


@cache  # (the rule asks it millions of times a replay, of a handful of names)
def slices_of(mig_type: str) -> int:
    """The compute slices of a MIG type (``3g.40gb`` -> 3; ``1g.10gb+me`` -> 1): the unit demand and
    supply are weighed in (NVIDIA's MIG user guide: an A100/H100 has 7)."""
    m = _SLICES.match(mig_type)
    if m is None:
        raise ValueError(f"{mig_type!r} is not a MIG type such as 1g.10gb")
    return int(m.group(1))


@dataclass(frozen=True)
class Pending:
    """A pending job's request: ``count`` instances of ``mig_type`` on each of ``nodes`` nodes.  Slurm
    starts a job over N nodes on all of them at once or not at all (its whole allocation is selected in
    one test: select/cons_tres ``_eval_nodes``), so its instances on one node serve it only beside the
    others'."""

    job: str
    account: str
    mig_type: str
    count: int
    time_limit_s: float
    priority: int = 0
    age_s: float = 0.0
    startable: bool = True  # False: waiting on a dependency or its begin time (Slurm's backfill skips it)
    nodes: int = 1


@dataclass(frozen=True)
class Running:
    """A running job on a node; ``ends_in_s`` from its time limit (Slurm's EndTime), an upper bound."""

    job: str
    mig_type: str
    count: int
    ends_in_s: float
    account: str = "-"
    submitted_s_ago: float = float("inf")  # (its SubmitTime): recent arrivals hint at what comes next
    limit_s: float = 0.0  # its time limit: the work a job like it brings


@dataclass(frozen=True)
class NodeView:
    name: str
    layout: str  # the candidate layout it is in now (or switching to, when ``draining``)
    in_layout_s: float  # how long it has been in that layout (hysteresis)
    running: tuple[Running, ...] = ()
    draining: bool = False  # drained for a switch already: counts against the maintenance limit
    changes_today: int = 0  # switches in the last 24 hours
    left: str | None = None  # the layout it held before its last switch (a change undoing that one is held)
    shape: str = ""  # its GPUs, when they differ from the planner's: the key of its layouts in Shapes.other


@dataclass(frozen=True)
class Layout:
    """A candidate layout as the rule sees it: instances of each MIG type one node offers."""

    name: str
    capacity: tuple[tuple[str, int], ...]  # (MIG type, instances), sorted: hashable and ordered

    @classmethod
    def of(cls, name: str, capacity: Mapping[str, int]) -> Layout:
        return cls(name, tuple(sorted((t, n) for t, n in capacity.items() if n > 0)))

    def count(self, mig_type: str) -> int:
        return dict(self.capacity).get(mig_type, 0)

    @cached_property
    def slices(self) -> int:
        return sum(slices_of(t) * n for t, n in self.capacity)


@dataclass(frozen=True)
class Shapes:
    """The layouts each node may take: ``own``, those of the planner's GPUs, and for a node whose GPUs
    differ (fewer or more of the same model) its own, keyed by ``NodeView.shape``.  A candidate named
    alike on both (``night``) offers what it offers on that node's GPUs."""

    own: Mapping[str, Layout]
    other: Mapping[str, Mapping[str, Layout]] = field(default_factory=dict)
    choices: frozenset[str] | None = None  # the layouts a change may go to (None: all; a node in another is read)

    def named(self, shape: str) -> Mapping[str, Layout]:
        return self.other[shape] if shape else self.own

    def of(self, node: NodeView) -> Mapping[str, Layout]:
        return self.named(node.shape)

    def slices(self, node: NodeView) -> int:
        """The node's slices (its fullest layout's): what a drain idles."""
        return max(lay.slices for lay in self.of(node).values())

    def every(self, nodes: Iterable[NodeView]) -> list[Layout]:
        """Every layout of the shapes ``nodes`` have (a count no node has offers nothing)."""
        return [lay for shape in sorted({n.shape for n in nodes}) for lay in self.named(shape).values()]


@dataclass(frozen=True)
class Seen:
    """A MIG type the planner has seen a job of: how long ago it last did, and the fewest instances such
    a job asked on one node.  A type used recently keeps its last place (the rule) though nothing of it
    is pending at this moment: notebooks and inference come back, and a place taken away costs the next
    job a drain and a switch."""

    mig_type: str
    ago_s: float
    count: int


@dataclass(frozen=True)
class Snapshot:
    pending: tuple[Pending, ...]
    nodes: tuple[NodeView, ...]
    # per account, how much of its time limit a job actually runs (learned, migd/demand/runtime.py):
    # time limits are upper bounds; an account absent here is taken to run to its limits
    run_ratio: tuple[tuple[str, float], ...] = ()
    # per MIG type the planner has seen a job of (pending or running): how long ago it last saw one and
    # the fewest instances such a job asked on one node (migd/demand/seen.py)
    seen: tuple[Seen, ...] = ()
