"""``migd.doctor/v1`` and ``migd.isolation/v1``: the doctor's checks against the catalog and the fault
isolation audit, as ``migctl doctor|isolation -o json`` give them (docs/migctl.md "Output formats").
Their findings are the checks' own frozen types.  Fields are only ever added within a version."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from migd.api.daemon import Fault, SimClock
from migd.api.status import Unreadable
from migd.hardware.doctor import Finding as DoctorFinding
from migd.isolation.audit import Finding
from migd.isolation.probe import Probe
from migd.wire import OMIT_NONE


@dataclass(frozen=True)
class DoctorDoc:
    """``ok`` is false when any check differs from the catalog (or failed)."""

    SCHEMA: ClassVar[str] = "migd.doctor/v1"
    ok: bool
    findings: tuple[DoctorFinding, ...]


@dataclass(frozen=True)
class DaemonMarks:
    """The running migd's fault marks: GPU-wide faults by UUID, and isolation breaches it saw; ``faults``
    and ``clock`` as in migd.daemon/v1 (added in v1; left out with no mark, and off migd's own clock), so
    that a mark's time is shown on the clock the daemon's other times are."""

    unhealthy: dict[str, str]
    breaches: tuple[str, ...]
    faults: dict[str, Fault] | None = field(default=None, metadata=OMIT_NONE)
    clock: SimClock | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class IsolationDoc:
    """``daemon``: None when no migd answered; ``probe``: ``migctl isolation --probe``'s run."""

    SCHEMA: ClassVar[str] = "migd.isolation/v1"
    findings: tuple[Finding, ...]
    unreadable: tuple[Unreadable, ...]
    daemon: DaemonMarks | None
    probe: Probe | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class DaemonAudit:
    """migd's answer to ``isolation`` (both sockets): its fault marks and its last audit of the active
    profile."""

    unhealthy: dict[str, str]
    breaches: tuple[str, ...]
    findings: tuple[Finding, ...]
    faults: dict[str, Fault] | None = None
    clock: SimClock | None = None
