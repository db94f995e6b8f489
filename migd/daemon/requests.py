"""What the control socket asks of the daemon and what it answers, as typed values: a manual apply's
options, a reload's verdict and what ``migctl resume`` did."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from migd.apply.result import ApplyResult, OnBusy


@dataclass(frozen=True)
class ManualApply:
    """What migctl may choose for an apply the daemon does on its behalf (hooks stay the daemon's)."""

    on_busy: OnBusy = OnBusy.REFUSE
    dry_run: bool = False
    busy_timeout_s: float | None = None  # None: the daemon's busy_timeout
    lock_timeout_s: float = 30.0
    parallel: bool = True
    mode_only: bool = False

    @classmethod
    def from_request(cls, req: dict[str, Any]) -> ManualApply:
        """Checked values from a control-socket request; ValueError names a bad one."""
        on_busy = OnBusy(req.get("on_busy", "refuse"))
        numbers = {k: req.get(k) for k in ("busy_timeout_s", "lock_timeout_s")}
        for k, v in numbers.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ValueError(f"{k} {v!r}")
        return cls(on_busy=on_busy, dry_run=bool(req.get("dry_run")), busy_timeout_s=numbers["busy_timeout_s"],
                   lock_timeout_s=30.0 if numbers["lock_timeout_s"] is None else float(numbers["lock_timeout_s"]),
                   parallel=bool(req.get("parallel", True)), mode_only=bool(req.get("mode_only")))


@dataclass(frozen=True)
class Reloaded:
    """A reload's outcome: ``error`` if rejected (the running configuration stays), else ``detail``."""

    error: str | None
    detail: str


@dataclass(frozen=True)
class Resumed:
    """What ``migctl resume`` did: the manual apply lifted (None: none held), the scheduled profile
    now active (None: no schedule entry has fired) and its apply (None: nothing was planned)."""

    lifted: str | None
    profile: str | None
    result: ApplyResult | None
