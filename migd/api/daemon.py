"""``migd.daemon/v1``: what the daemon says about itself (``migctl daemon``, the control socket).

The live state it is made from (``migd.state.live``) is the daemon's; this is the document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from migd.api.access import AccessView
from migd.api.demand import DemandView
from migd.api.plan import SignalSent
from migd.api.slurm import SlurmView
from migd.kinds import Word
from migd.wire import OMIT_NONE

SCHEMA = "migd.daemon/v1"


class Outcome(Word):
    """One apply attempt, as counted in ``migd_applies_total{result}``."""

    SUCCESS = "success"
    UNCHANGED = "unchanged"  # a manual apply that found every GPU already as asked
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    BLOCKED = "blocked"  # busy instances held back some or all GPUs (refused, or waiting): not a failure
    CANCELLED = "cancelled"  # stopped on request (migctl's Ctrl-C, SIGTERM): GPUs put back, not a failure
    ERROR = "error"  # refused before any GPU changed (plan, lock, hook, hardware)

    @property
    def failed(self) -> bool:
        """What pages (``MigdApplyFailed``): a change that failed or was refused by an error.  A blocked
        or cancelled apply did what the busy policy or the operator asked."""
        return self in (Outcome.FAILED, Outcome.ROLLED_BACK, Outcome.ERROR)


class Progress(Word):
    """Where one GPU stands against the active profile."""

    CONVERGED = "converged"
    DRIFTED = "drifted"  # differs, and reconcile: report leaves it
    WAITING = "waiting"  # its change waits for busy instances
    FAILED = "failed"  # its last change was rolled back or failed
    FAULTED = "faulted"  # a GPU-wide fault mark refuses reconfiguration
    LOST = "lost"  # NVML says GPU_IS_LOST: fallen off the bus, until a reset or reboot
    UNREADABLE = "unreadable"  # another NVML error while reading it; tried again next pass


@dataclass(frozen=True)
class HeldView:
    """A manual apply's hold as the file and ``migd.daemon/v1``'s ``override`` write it (times ISO 8601)."""

    profile: str
    source: str
    until: str | None
    since: str


@dataclass(frozen=True)
class LastApply:
    """``result`` is the apply's worst GPU's, as counted in ``migd_applies_total``; what it did per GPU is
    in the fields added in v1 (left out when unknown): ``trigger`` (``start``, ``transition``, ``reconcile``,
    ``retry``, ``manual``, ``resume``, ``reload``), ``changed`` (GPUs it changed), ``waiting`` (GPU -> the
    PIDs it was left waiting for) and ``signalled`` (the signals ``force`` sent)."""

    time: float
    result: Outcome
    seconds: float
    profile: str | None
    trigger: str | None = field(default=None, metadata=OMIT_NONE)
    changed: int | None = field(default=None, metadata=OMIT_NONE)
    waiting: dict[str, tuple[int, ...]] | None = field(default=None, metadata=OMIT_NONE)
    signalled: tuple[SignalSent, ...] | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Applying:
    """A manual apply in progress (``migctl apply`` through migd), while it waits for busy instances:
    what, from where, since when (Unix time), its busy policy, the GPUs it waits for (index -> PIDs) and
    when that wait ends (Unix time: refused with ``wait``, the processes stopped with ``force``)."""

    profile: str
    source: str
    since: float
    on_busy: str
    waiting: dict[str, tuple[int, ...]]
    until: float | None


@dataclass(frozen=True)
class SimClock:
    """A clock of migd's own (``--now``, ``--time-scale``: demo, tests): at Unix time ``real`` it read
    ``at`` (ISO 8601), and it runs ``scale`` times as fast.  Every Unix time in the document is real; this
    turns one into migd's clock (the schedule's, as ``next`` and ``active.until`` are)."""

    at: str
    real: float
    scale: float

    def of(self, epoch: float) -> datetime:
        return datetime.fromisoformat(self.at) + timedelta(seconds=(epoch - self.real) * self.scale)


class Reason(Word):
    """Why the active profile holds."""

    SCHEDULE = "schedule"
    MANUAL = "manual"  # migctl apply through migd, until the next transition (or migctl resume)
    DEMAND = "demand"  # the demand planner's want, its lease running


@dataclass(frozen=True)
class Active:
    """``until``: a manual apply's end as an ISO time, a demand want's lease as a Unix time; ``since``:
    when a manual apply was made (manual only)."""

    profile: str
    reason: Reason
    source: str | None  # manual: the profile's file; demand: the planner node
    until: str | float | None
    since: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Next:
    profile: str
    at: str  # UTC, ISO 8601
    local: str  # in the schedule's time zone


@dataclass(frozen=True)
class Blocked:
    since: float
    reason: str


@dataclass(frozen=True)
class Fault:
    """A GPU-wide fault mark as numbers: its Xid and when the fault watch read it (Unix time), so that a
    reader shows the time on the document's clock (``unhealthy`` gives it in words, in UTC); ``gpu``: the
    GPU's index as migd reads it (added in v1; left out when migd cannot read it), so that a reader of the
    isolation document, which has no GPU list, names the GPU as every other line does."""

    xid: int
    at: float
    gpu: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class GpuView:
    """``failures``, ``failed_at`` and ``next_try`` only for a failed GPU waiting out its backoff (added in
    v1 with the backoff; left out otherwise); ``pids`` only for a GPU waiting for busy instances: the
    processes it waits for; ``selected`` (false) only for a GPU the active profile does not select, left
    as it is (both added in v1)."""

    uuid: str
    state: Progress
    since: float
    reason: str | None
    failures: int | None = field(default=None, metadata=OMIT_NONE)
    failed_at: float | None = field(default=None, metadata=OMIT_NONE)
    next_try: float | None = field(default=None, metadata=OMIT_NONE)
    pids: tuple[int, ...] | None = field(default=None, metadata=OMIT_NONE)
    selected: bool | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class DaemonDoc:
    """``migd.daemon/v1``, as ``migctl daemon -o json`` gives it.  Fields are only ever added within v1;
    ``override``, ``next_transition`` and ``blocked_gpus`` repeat what ``active``, ``next`` and ``gpus``
    say, for v1's first readers (docs/migctl.md)."""

    SCHEMA: ClassVar[str] = SCHEMA
    started: float
    config_path: str
    timezone: str
    active: Active | None
    desired_profile: str | None
    applied_profile: str | None
    override: HeldView | None
    next_transition: tuple[str, ...] | None  # [at, profile]
    next: Next | None
    drift_gpus: tuple[int, ...]
    blocked_since: float | None
    blocked_reason: str | None
    last_apply: LastApply | None
    blocked_gpus: dict[str, Blocked]
    gpus: dict[str, GpuView]
    last_reload_error: str | None
    restart_needed: tuple[str, ...]
    apply_count: dict[str, int]
    unhealthy: dict[str, str]
    slurm: SlurmView | None
    demand: DemandView | None
    access: AccessView | None = None  # (added in v1 with access by owner; older migd leaves it out)
    applying: Applying | None = field(default=None, metadata=OMIT_NONE)  # (added in v1: a manual apply waiting)
    clock: SimClock | None = field(default=None, metadata=OMIT_NONE)  # (added in v1: only on a clock of migd's own)
    faults: dict[str, Fault] | None = field(default=None, metadata=OMIT_NONE)  # (added in v1: ``unhealthy``'s marks
    # as numbers, by GPU UUID; left out with none)


def wait_words(reason: str) -> str:
    """A GPU's wait reason without what its line already says (the GPU, the PIDs): ``migctl daemon`` and the
    page show it beside the GPU (``GPU 0: waiting: GPU 0: destroy CI ...`` said the GPU twice)."""
    return re.sub(r" \[busy: pids [0-9, ]+\]", "", re.sub(r"\bGPU [0-9]+: ", "", reason))
