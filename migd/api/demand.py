"""What a node's migd shows about the demand mode (``migctl daemon``, the status JSON's ``demand``,
metrics): which layout it follows and why, and, on the planner, its last decision with the figures."""

from __future__ import annotations

from dataclasses import dataclass, field

from migd.kinds import Word
from migd.wire import OMIT_NONE


class Source(Word):
    PLANNER = "planner"  # the planner's want, its lease running
    SCHEDULE = "schedule"  # no want, its lease ended, or dry-run: the clock decides
    HELD = "held"  # Slurm cannot be read: the layout there now is kept (no change, not a guess)


@dataclass(frozen=True)
class PlanSummary:
    """The planner's last decision (``changes`` and ``held`` say why, with their slice-hours)."""

    at: float
    mode: str
    changes: tuple[str, ...]
    held: tuple[str, ...]
    wanted_slice_h: dict[str, float]  # per MIG type, fair-weighted, within the horizon
    skipped: tuple[str, ...]  # nodes not planned for, and why
    writes: int  # scontrol updates this decision made (changes, pins, lease renewals)
    untyped: int  # pending jobs asking for GPUs without a MIG type
    error: str | None = None  # Slurm could not be read: nothing decided
    # time to capacity: from the oldest pending job a change was made for to the node serving its new
    # layout (observed over this planner's life: how many, their sum, the last one)
    capacity_count: int = 0
    capacity_sum_s: float = 0.0
    capacity_last_s: float | None = None
    # per account with enough ended jobs, the share of its time limits the rule expects a job to run
    # (learned from accounting at the planner's start and from the jobs it watched end)
    run_share: dict[str, float] | None = field(default=None, metadata=OMIT_NONE)  # (None: not said)
    seeded_jobs: int | None = None  # ended jobs read from accounting at start (None: not read)
    # pending jobs per MIG type that no candidate layout offers: work the rule cannot serve by any change
    # (a type asked under another name, e.g. Slurm AutoDetect's nvidia_h100_80gb_hbm3_1g.10gb; docs/slurm.md)
    unoffered: dict[str, int] | None = field(default=None, metadata=OMIT_NONE)  # (None: none, or not said)


@dataclass(frozen=True)
class DemandView:
    mode: str
    planner: str
    source: Source
    profile: str | None
    why: str
    until: float | None = None
    plan: PlanSummary | None = None  # (the planner node only)
