"""Exit codes, and the one mapping from outcomes to them, for migctl, the control socket and migd.

0 ok; 1 not applied (lock held, hook refused, assert failed, daemon unreachable); 2 invalid input
or start-up refused; 3 blocked by busy instances; 4 hardware error (or an apply that failed and
could not be rolled back); 5 partly: done on every GPU NVML could read, but a GPU the request
touches is lost or unreadable and was left alone (a request that touches only such GPUs is 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from migd.apply.hooks import HookError
from migd.apply.lock import LockBusy
from migd.apply.result import ApplyResult, BusyError, GpuStatus, GpuUnhealthy
from migd.errors import ValidationError
from migd.hardware.types import HardwareError
from migd.plan.planner import PlanError
from migd.printable import shown
from migd.wire import WireError


class Exit(IntEnum):
    OK = 0
    NOT_APPLIED = 1
    INVALID = 2
    BUSY = 3
    HARDWARE = 4
    PARTLY = 5


@dataclass(frozen=True)
class Failure:
    """An expected failure as a user reads it: ``<kind>: <message>``, and its exit code."""

    code: Exit
    kind: str
    message: str

    def __str__(self) -> str:
        return shown(f"{self.kind}: {self.message}")  # (it may quote Slurm, NVML or a file: one printable line)


EXPECTED = (ValidationError, PlanError, BusyError, HardwareError, GpuUnhealthy, LockBusy, HookError, OSError,
            WireError)


def failure(e: BaseException) -> Failure:
    """How an expected failure (one of ``EXPECTED``) is reported."""
    if isinstance(e, (ValidationError, PlanError)):
        return Failure(Exit.INVALID, "error", str(e))
    if isinstance(e, BusyError):
        return Failure(Exit.BUSY, "blocked", f"{e} ({e.advice})")
    if isinstance(e, (HardwareError, GpuUnhealthy)):
        return Failure(Exit.HARDWARE, "hardware error", str(e))
    if isinstance(e, WireError):  # (documents are read back only from migd's replies)
        return Failure(Exit.NOT_APPLIED, "error talking to migd", f"its reply does not read as this migctl expects "
                       f"(a migd of another version?): {e}")
    if isinstance(e, (ConnectionError, TimeoutError)):
        return Failure(Exit.NOT_APPLIED, "error talking to migd", str(e))
    if isinstance(e, PermissionError):
        return Failure(Exit.NOT_APPLIED, "not permitted", f"{e.filename or e}: {e.strerror} (MIG changes need "
                       "root, or migd's control socket; reading needs access to the GPUs' device files)")
    if isinstance(e, OSError):  # disk full, read-only state dir, ...
        return Failure(Exit.NOT_APPLIED, "not applied", f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
    return Failure(Exit.NOT_APPLIED, "not applied", str(e))


def partly(code: Exit, unreadable: Sequence[object], served: bool) -> Exit:
    """A request that touched GPUs NVML cannot read (lost): PARTLY where the others were served, HARDWARE
    where there were none to serve; any other failure keeps its own code."""
    if code is not Exit.OK or not unreadable:
        return code
    return Exit.PARTLY if served else Exit.HARDWARE


def for_result(result: ApplyResult) -> Exit:
    if result.ok:
        return partly(Exit.OK, result.unreadable, bool(result.plans))
    if any(r.status in (GpuStatus.FAILED, GpuStatus.FAULTED) for r in result.results):
        return Exit.HARDWARE  # (a GPU-wide fault refuses a change as the check before the apply does)
    return Exit.BUSY if any(r.status is GpuStatus.BLOCKED for r in result.results) else Exit.NOT_APPLIED
