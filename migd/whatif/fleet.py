"""The queue model's jobs and nodes (replay.py runs them; backfill.py plans over them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from migd.demand.inputs import Layout, slices_of
from migd.whatif.jobs import TraceJob


@dataclass
class Job:
    """A job of the replay: once started, in the ``running`` of each of its ``nodes`` (its ``count`` on
    each)."""

    spec: TraceJob
    start: float | None = None
    nodes: tuple[str, ...] = ()  # where it started, in the order Slurm picked them

    @property
    def node(self) -> str | None:
        """The first of its nodes (None before it starts): where it is counted once."""
        return self.nodes[0] if self.nodes else None

    @property
    def end(self) -> float:
        assert self.start is not None
        return self.start + self.spec.duration_s


@dataclass
class Node:
    name: str
    layout: Layout
    slices: int  # physical slices (7 per GPU)
    since: float = 0.0
    running: list[Job] = field(default_factory=list)
    target: Layout | None = None  # draining towards it
    ready_at: float | None = None  # switching: in service again then
    switches: list[float] = field(default_factory=list)
    history: list[tuple[float, Layout, Layout]] = field(default_factory=list)  # (when, from, to), each switch

    def free(self, mig_type: str) -> int:
        if self.target is not None or self.ready_at is not None:
            return 0
        used = sum(j.spec.count for j in self.running if j.spec.gres == mig_type)
        return self.layout.count(mig_type) - used

    def busy_slices(self) -> int:
        return sum(slices_of(j.spec.gres) * j.spec.count for j in self.running)
