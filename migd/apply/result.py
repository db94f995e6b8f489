"""What an apply is asked to do and what it reports: options, per-GPU results, refusals."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from migd.apply.hooks import Hooks
from migd.hardware.inventory import Unreadable
from migd.hardware.types import GpuState, HardwareError
from migd.kinds import Word
from migd.plan.planner import GpuPlan, Op


class OnBusy(Word):
    """What an apply does about instances with running processes that it would destroy (docs/apply.md):
    refuse at once; wait up to ``busy_timeout`` for them to end, then refuse; or wait up to
    ``busy_timeout``, then stop them (SIGTERM, then SIGKILL): one meaning in migd.yaml and on migctl's
    command line, where ``--busy-timeout`` defaults to 5m with wait and to 0 (at once) with force."""

    REFUSE = "refuse"
    WAIT = "wait"  # until busy_timeout, then refuse
    FORCE = "force"  # after busy_timeout, SIGTERM, then SIGKILL: never the default


CLI_BUSY_TIMEOUT_S = {OnBusy.REFUSE: 0.0, OnBusy.WAIT: 300.0, OnBusy.FORCE: 0.0}  # migctl's --busy-timeout default


def busy_timeout_for(on_busy: OnBusy | str, given: float | None) -> float:
    """migctl's ``--busy-timeout``: as given, else its default for the policy (5m to wait, 0 to force)."""
    return CLI_BUSY_TIMEOUT_S[OnBusy(on_busy)] if given is None else given


@dataclass(frozen=True)
class Signalled:
    """A signal the busy policy ``force`` sent: to ``pid`` (on GPU ``gpu``; None: it held a capability node
    of one), which (``SIGTERM``, ``SIGKILL``) and when (Unix time)."""

    pid: int
    signal: str
    at: float
    gpu: int | None


class BusyError(Exception):
    """Instances that would be destroyed have running processes (``policy``: what the apply was told
    to do about them, so the advice offered is one the user has not already taken)."""

    def __init__(self, message: str, blocked: list[Op], policy: OnBusy) -> None:
        super().__init__(message)
        self.blocked = blocked
        self.policy = policy

    @property
    def advice(self) -> str:
        if self.policy is OnBusy.REFUSE:
            return "--on-busy wait waits for them; --on-busy force stops them"
        if self.policy is OnBusy.WAIT:
            return "a longer --busy-timeout waits longer; --on-busy force stops them"
        return "their processes did not exit after SIGKILL: see migctl status"


class GpuUnhealthy(Exception):
    pass


class GpuFaulted(HardwareError):
    """A GPU-wide fault mark found at the last moment before a change: the change is not made."""


class FaultGate(Protocol):
    """What an apply asks of the GPU-wide fault marks (``migd.isolation.marks.FaultMarks``): which GPUs
    carry one when it plans, once the fault watch has read every event delivered so far (right before
    the first change, after any busy wait), and again before each change."""

    def reasons(self) -> dict[str, str]: ...

    def caught_up(self) -> dict[str, str]: ...

    def guard(self, uuid: str) -> AbstractContextManager[str | None]: ...


class AccessGate(Protocol):
    """Who may use a GPU's instances (``migd.access.enforce.AccessControl``): closed before its layout
    or owners change (HardwareError: then it is not changed), each new instance sealed as the driver
    makes it, opened as its owners' grants say once settled."""

    def close_gpu(self, index: int) -> None: ...

    def seal(self, index: int) -> None: ...

    def held(self, indices: Collection[int]) -> dict[int, dict[int, dict[int, tuple[int, ...]]]]: ...

    def open_gpu(self, index: int) -> list[str]: ...


class GpuStatus(Word):
    UNCHANGED = "unchanged"
    APPLIED = "applied"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    WOULD_CHANGE = "would_change"  # dry run
    BLOCKED = "blocked"  # busy instances; the other GPUs went ahead (ApplyOptions.partial)
    FAULTED = "faulted"  # a GPU-wide fault mark refuses its reconfiguration (ApplyOptions.partial)
    CANCELLED = "cancelled"  # the requester withdrew (Ctrl-C): put back as it was before the apply


class Flag(Protocol):
    """A stop request an apply polls between steps (a ``threading.Event``, or several as one)."""

    def is_set(self) -> bool: ...


@dataclass
class ApplyOptions:
    on_busy: OnBusy = OnBusy.REFUSE
    busy_timeout_s: float = 300.0
    dry_run: bool = False
    parallel: bool = True
    hooks: Hooks = field(default_factory=Hooks)
    lock_timeout_s: float = 0.0
    poll_s: float = 1.0
    kill_grace_s: float = 10.0
    faults: FaultGate | None = None  # GPU-wide fault marks: refused when planned, checked before every change
    partial: bool = False  # GPUs busy instances block are left (status "blocked"); the others go ahead
    cancel: Flag | None = None  # set (SIGTERM): stop waiting; roll back the GPU being changed
    abort: Flag | None = None  # set (the requester's Ctrl-C): stop, and put every GPU back as it was
    progress: Callable[[], None] | None = None  # called at each step and busy poll (feeds the watchdog)
    # while busy instances are waited for: GPU index -> the PIDs in the way, and when the wait ends (Unix time)
    on_wait: Callable[[dict[int, tuple[int, ...]], float], None] | None = None
    mode_only: bool = False  # only the MIG mode (mig-parted's --mode-only): existing instances are kept
    # lets go of the daemon's hardware lock while the apply waits on something else (busy work, the
    # fault watch): the sampler and the fault watch read NVML meanwhile (migd.daemon.hwlock)
    unheld: Callable[[], AbstractContextManager[object]] = nullcontext

    def stopping(self) -> bool:
        """Whether the apply should stop at its next step (SIGTERM, or the requester withdrew)."""
        return any(f is not None and f.is_set() for f in (self.cancel, self.abort))

    @property
    def aborted(self) -> bool:
        return self.abort is not None and self.abort.is_set()


@dataclass
class GpuResult:
    index: int
    uuid: str
    status: GpuStatus
    ops: int = 0
    error: str | None = None
    seconds: float = 0.0
    seen: GpuState | None = None  # read back after the change (verify): the post-apply audit uses it


@dataclass
class ApplyResult:
    profile: str
    plans: list[GpuPlan]
    results: list[GpuResult]
    seconds: float = 0.0
    unreadable: list[Unreadable] = field(default_factory=list)  # GPUs the profile may select, left alone
    signalled: list[Signalled] = field(default_factory=list)  # what the busy policy force sent, in order
    owners_only: frozenset[int] = frozenset()  # GPUs whose instances stay and whose owners change

    @property
    def ok(self) -> bool:
        return all(r.status in _OK for r in self.results)

    @property
    def changed(self) -> bool:
        """Whether any GPU was touched (a GPU left waiting, or as it is for a fault mark, was not)."""
        return any(r.status not in (GpuStatus.UNCHANGED, GpuStatus.BLOCKED, GpuStatus.FAULTED) for r in self.results)

    def readings(self) -> dict[int, GpuState]:
        """Each planned GPU as last read: after its change if it changed, else as planned."""
        out = {p.gpu.index: p.seen for p in self.plans if p.seen is not None}
        out.update({r.index: r.seen for r in self.results if r.seen is not None})
        return out


class Cancelled(Exception):
    """An apply stopped between two steps because it was asked to (SIGTERM, Ctrl-C)."""


_OK = (GpuStatus.UNCHANGED, GpuStatus.APPLIED, GpuStatus.WOULD_CHANGE)
