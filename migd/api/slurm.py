"""``migd.slurm/v2``: where a Slurm node's layout switch stands, as kept in the state dir, shown in
``migctl daemon`` and exported as metrics (``SlurmSnapshot``: the same, with the node's name).

v2 added the ``resuming`` phase (a switch is over and Slurm has not yet confirmed the node's resume
and the reservation's removal), the ended switch's outcome, and the GPUs' layouts from before the
switch (``before``), recorded before the first GPU changes so a restarted migd can put them back.  A
v1 file reads as v2 without those: every v1 field kept its meaning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from migd.apply.journal import LayoutDoc
from migd.kinds import Word

SCHEMA = "migd.slurm/v2"
READS = (SCHEMA, "migd.slurm/v1")


class Phase(Word):
    SERVING = "serving"  # no switch in progress
    DRAINING = "draining"  # drained for a switch; jobs holding GPUs still run
    SWITCHING = "switching"  # applying the layout and publishing the GRES
    RESUMING = "resuming"  # the switch ended (``ended_ok``); resume and unreserve until Slurm confirms
    FAILED = "failed"  # the last switch failed; the node serves its old layout


@dataclass(frozen=True)
class SwitchBefore:
    """One GPU as it was before a switch changed it: what a failed switch restores."""

    layout: LayoutDoc
    owners: dict[int, str] = field(default_factory=dict)  # GI placement start -> owner


@dataclass
class SlurmState:
    """``slurm.json``, a wire type read and written whole (``migd.wire``); changed in place by the gate, so
    not frozen.  Every field has a default: v1 lacks those v2 added."""

    SCHEMA: ClassVar[str] = SCHEMA
    READS: ClassVar[tuple[str, ...]] = READS
    phase: Phase = Phase.SERVING
    profile: str | None = None
    was_serving: bool = True  # resume after the switch only if it was serving when migd drained it
    reservation: str | None = None
    reserved_for: float | None = None  # the transition (epoch) the reservation is for
    jobs_waiting: int = 0
    gres_in_sync: bool | None = None
    reason: str = ""
    since: float = 0.0
    ended_ok: bool | None = None  # (resuming) whether the switch that ended succeeded
    ended_reason: str = ""  # (resuming) what it ended with: the reason once Slurm confirms
    agree: bool = True  # (resuming) False: GRES and GPUs disagree, the node is to stay drained
    before: dict[str, SwitchBefore] = field(default_factory=dict)  # by GPU UUID: what a failed switch restores


@dataclass(frozen=True)
class SlurmSnapshot:
    """One node's switch state at one moment (a copy: the daemon's thread goes on changing its own)."""

    node: str
    state: SlurmState

    @classmethod
    def of(cls, node: str, state: SlurmState) -> SlurmSnapshot:
        return cls(node, replace(state, before=dict(state.before)))

    def view(self) -> SlurmView:
        """The switch as an operator reads it (the layouts kept for a rollback are not shown)."""
        s = self.state
        return SlurmView(self.node, s.phase, s.profile, s.was_serving, s.reservation, s.reserved_for, s.jobs_waiting,
                         s.gres_in_sync, s.reason, s.since, s.ended_ok, s.ended_reason, s.agree)


@dataclass(frozen=True)
class SlurmView:
    """``migd.daemon/v1``'s ``slurm``: the node's switch state (SlurmState's fields but ``before``)."""

    node: str
    phase: Phase
    profile: str | None
    was_serving: bool
    reservation: str | None
    reserved_for: float | None
    jobs_waiting: int
    gres_in_sync: bool | None
    reason: str
    since: float
    ended_ok: bool | None
    ended_reason: str
    agree: bool
