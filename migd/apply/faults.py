"""GPU-wide fault marks as an apply reads them: when it plans, and once more right before its first change.

The fault watch marks a GPU from its own thread when a fatal Xid arrives.  An apply reads the marks
when it plans: a marked GPU is refused (the whole apply, or only that GPU with ``partial``).  It reads
them again once any busy wait is over, right before the journal, the hooks and the first change,
because the fatal Xid most likely to come during that wait is the one that ends the awaited work
(Xid 79 takes every process with it): the wait ends the very moment the mark is due.  That reading
waits for the watch to have read every event the driver delivered before it (``FaultGate.caught_up``),
with the hardware lock let go, so the mark wins by construction rather than by which thread wakes
first; a GPU marked by then is set aside as ``faulted`` and never touched, the others go ahead as
planned.  Each change is checked once more under the marks' lock (``steps.guarded``).
"""

from __future__ import annotations

from dataclasses import dataclass

from migd.apply.result import ApplyOptions, GpuResult, GpuStatus, GpuUnhealthy
from migd.plan.planner import GpuPlan


@dataclass(frozen=True)
class SetAside:
    """A GPU the apply does not change because of a GPU-wide fault mark (``why``: the mark, Xid named)."""

    plan: GpuPlan
    why: str

    def result(self) -> GpuResult:
        p = self.plan
        return GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.FAULTED, len(p.ops),
                         f"GPU-wide fault: {self.why} (migctl clear-fault after checking it)")


def _marked(plans: list[GpuPlan], reasons: dict[str, str]) -> list[SetAside]:
    return [SetAside(p, reasons[p.gpu.uuid]) for p in plans if p.changes and p.gpu.uuid in reasons]


def refused_when_planned(plans: list[GpuPlan], opts: ApplyOptions) -> list[SetAside]:
    """The GPUs marked when the apply planned; without ``partial`` any of them refuses the whole apply
    (GpuUnhealthy), before anything is waited for or changed."""
    faulted = _marked(plans, opts.faults.reasons() if opts.faults is not None else {})
    if faulted and not opts.partial:
        raise GpuUnhealthy("reconfiguration refused on unhealthy GPUs: "
                           + "; ".join(f"GPU {f.plan.gpu.index}: {f.why}" for f in faulted))
    return faulted


def marked_before_change(plans: list[GpuPlan], opts: ApplyOptions) -> list[SetAside]:
    """The GPUs about to change that carry a mark once the fault watch has caught up: set aside, the
    others go ahead (nothing has been changed yet, so the rest of the apply stands as planned)."""
    if opts.faults is None or not any(p.changes for p in plans):
        return []
    with opts.unheld():  # the watch may need the hardware lock to get through what it has read
        reasons = opts.faults.caught_up()
    return _marked(plans, reasons)
