"""``migd.plan/v1``, ``migd.assert/v1`` and ``migd.apply/v1``: a plan, a check and an apply's outcome, as
``migctl plan|assert|apply -o json`` and migd's control socket give them (docs/migctl.md "Output
formats").  An apply document is its plan's fields, then the outcome's.  Fields are only ever added
within a version."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from migd.api.status import Placement, Unreadable
from migd.apply.result import GpuStatus
from migd.plan.planner import OpKind
from migd.wire import OMIT_NONE


@dataclass(frozen=True)
class Operation:
    kind: OpKind
    description: str
    busy_pids: tuple[int, ...]


@dataclass(frozen=True)
class ComputeTarget:
    profile_id: int
    placement: Placement


@dataclass(frozen=True)
class Target:
    """One GPU instance the profile wants, where, with its compute instances and owner."""

    profile: str
    profile_id: int
    placement: Placement
    compute: tuple[ComputeTarget, ...]
    owner: str | None


@dataclass(frozen=True)
class GpuPlan:
    index: int
    uuid: str
    model: str
    changes: bool
    kept: int
    mig: bool
    operations: tuple[Operation, ...]
    target: tuple[Target, ...]
    # true where the instances stay as they are and only their owners change (no MIG operation; added in
    # v1, left out otherwise)
    owners_only: bool | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class PlanDoc:
    SCHEMA: ClassVar[str] = "migd.plan/v1"
    profile: str
    gpus: tuple[GpuPlan, ...]
    unreadable: tuple[Unreadable, ...]


@dataclass(frozen=True)
class AssertGpu:
    index: int
    uuid: str
    model: str
    applied: bool
    operations: int
    # true where the instances are as asked and their owners are not (added in v1, left out otherwise)
    owners_only: bool | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class AssertDoc:
    """``unmatched``: GPUs a mig-parted file's entries do not match (its assert counts them as not applied)."""

    SCHEMA: ClassVar[str] = "migd.assert/v1"
    profile: str
    ok: bool
    gpus: tuple[AssertGpu, ...]
    unmatched: tuple[int, ...]
    unreadable: tuple[Unreadable, ...]


@dataclass(frozen=True)
class GpuResult:
    index: int
    uuid: str
    status: GpuStatus
    operations: int
    error: str | None
    seconds: float


@dataclass(frozen=True)
class SignalSent:
    """One signal the busy policy ``force`` sent: to which process, which signal (``SIGTERM``, then
    ``SIGKILL`` if it had not exited), when (Unix time), and the GPU it ran on (None: it only held one of
    the GPU's capability nodes open)."""

    pid: int
    signal: str
    at: float
    gpu: int | None


@dataclass(frozen=True)
class ApplyDoc:
    """``error``: why the apply was refused before any GPU was touched (busy instances under ``--on-busy
    refuse`` or after ``--busy-timeout``), the line migctl says on stderr; then ``results`` is empty and
    ``gpus`` is the plan it refused, each busy operation with its ``busy_pids``.  Absent otherwise."""

    SCHEMA: ClassVar[str] = "migd.apply/v1"
    profile: str
    gpus: tuple[GpuPlan, ...]
    unreadable: tuple[Unreadable, ...]
    dry_run: bool
    ok: bool
    seconds: float
    results: tuple[GpuResult, ...]
    error: str | None = field(default=None, metadata=OMIT_NONE)  # added 2026-11-27
    # every signal the busy policy force sent, in order (added in v1; left out when none was sent)
    signalled: tuple[SignalSent, ...] | None = field(default=None, metadata=OMIT_NONE)
