"""Where each GPU stands against the active profile, and a bounded log of the ones that wait.

Each GPU converges on its own: one that waits for busy instances, is rolled back or carries a
fault mark is tracked (and logged when that starts, when it changes, then at a bounded rate)
while the other GPUs go ahead.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from migd.api.daemon import Progress
from migd.apply.result import ApplyResult, GpuResult, GpuStatus
from migd.daemon.retry import Failure
from migd.hardware.inventory import Unreadable
from migd.numeral import whole
from migd.plan.planner import GpuPlan
from migd.repeat import REPEAT_S  # (a wait past busy_timeout is logged again at most this often)
from migd.state.live import GpuProgress, Status

log = logging.getLogger("migd")
_SET_ASIDE = (Progress.FAULTED, Progress.LOST, Progress.UNREADABLE)
_BUSY = re.compile(r"\[busy: pids ([0-9, ]+)\]")


_BY_STATUS = {GpuStatus.APPLIED: Progress.CONVERGED, GpuStatus.UNCHANGED: Progress.CONVERGED,
              GpuStatus.BLOCKED: Progress.WAITING, GpuStatus.FAULTED: Progress.FAULTED}


def judge(plan: GpuPlan, result: GpuResult | None, failure: Failure | None = None) -> tuple[Progress, str]:
    """``failure``: the GPU's failed change to this layout, if it has one (it waits out its backoff)."""
    if result is None:  # not applied: nothing to do, drift only reported, or a failed change waiting its turn
        if not plan.changes:
            return Progress.CONVERGED, ""
        return (Progress.FAILED, failure.cause) if failure else (Progress.DRIFTED, "")
    return _BY_STATUS.get(result.status, Progress.FAILED), result.error or ""


def _pids(plan: GpuPlan, result: GpuResult | None) -> tuple[int, ...]:
    """The processes a GPU waits for: on the instances its change must destroy, or (an owner change)
    holding instances whose owners change, as its result names them."""
    if result is None or result.status is not GpuStatus.BLOCKED:
        return ()
    pids = {pid for o in plan.blocked for pid in o.busy_pids}
    for found in _BUSY.findall(result.error or ""):
        pids.update(n for n in (whole(x.strip(), 7) for x in found.split(",")) if n is not None)
    return tuple(sorted(pids))


def blocked_pids(result: ApplyResult) -> dict[int, tuple[int, ...]]:
    """GPU index -> the PIDs it was left waiting for, of each GPU an apply left waiting."""
    plans = {p.gpu.index: p for p in result.plans}
    return {r.index: _pids(plans[r.index], r) for r in result.results
            if r.status is GpuStatus.BLOCKED and r.index in plans}


class Tracker:
    """Keeps ``status.gpus`` (``busy_timeout_s``: real seconds after which a wait is an error; ``failure``:
    a GPU's failed change to a plan's layout, and its backoff)."""

    def __init__(self, status: Status, busy_timeout_s: Callable[[], float],
                 failure: Callable[[GpuPlan], Failure | None] = lambda p: None) -> None:
        self.status = status
        self.busy_timeout_s = busy_timeout_s
        self.failure = failure
        self.node: dict[int, str] = {}  # every GPU of the node (index -> UUID), as found at start

    def update(self, name: str, plans: list[GpuPlan], result: ApplyResult | None,
               unreadable: list[Unreadable] | tuple[Unreadable, ...] = ()) -> None:
        """Every GPU of the node: those ``plans`` cover as judged, those NVML cannot read as such, and the
        others (a profile that selects some GPUs) as not selected, left as they are."""
        now = time.time()
        by_index = {r.index: r for r in result.results} if result else {}
        judged = {p.gpu.index: (p.gpu.uuid, *judge(p, by_index.get(p.gpu.index), f := self.failure(p)), f,
                                _pids(p, by_index.get(p.gpu.index))) for p in plans}
        for u in unreadable:  # the UUID as last known: NVML cannot say it now
            old_uuid = self.status.gpus[u.index].uuid if u.index in self.status.gpus else ""
            judged[u.index] = (old_uuid, Progress.LOST if u.lost else Progress.UNREADABLE, u.error, None, ())
        aside = {i: uuid for i, uuid in {**self.node, **{i: g.uuid for i, g in self.status.gpus.items()}}.items()
                 if i not in judged}
        new: dict[int, GpuProgress] = {}
        for i, (uuid, progress, reason, f, pids) in sorted(judged.items()):
            old = self.status.gpus.get(i)
            same = old is not None and old.progress is progress and old.selected
            new[i] = GpuProgress(uuid, progress, old.since if old and same else now, reason,
                                 old.logged if old and same else now, pids=pids)
            if f is not None and progress is Progress.FAILED:
                new[i].failures, new[i].failed_at, new[i].next_try = f.count, f.last, f.next_try
            self._log(i, name, old, new[i], now)
        for i, uuid in sorted(aside.items()):
            old = self.status.gpus.get(i)
            new[i] = GpuProgress(uuid, Progress.CONVERGED, old.since if old and not old.selected else now,
                                 selected=False)
        self.status.gpus = dict(sorted(new.items()))

    def converged(self) -> bool:
        return all(g.progress is Progress.CONVERGED for g in self.status.gpus.values())

    def _log(self, i: int, name: str, old: GpuProgress | None, new: GpuProgress, now: float) -> None:
        was = old.progress if old else None
        if was is Progress.WAITING and new.progress is not Progress.WAITING:
            log.info("GPU %d: no longer waits for busy instances", i)
        if new.progress in _SET_ASIDE and was is not new.progress:
            log.warning("GPU %d: %s, not reconfigured to %s (the other GPUs go ahead): %s", i, new.progress, name,
                        new.reason)
        if new.progress is not Progress.WAITING:
            return
        if old is None or was is not Progress.WAITING or old.reason != new.reason:
            log.warning("GPU %d: transition to %s waits for busy instances (PIDs %s): %s", i, name,
                        ", ".join(map(str, new.pids)) or "-", new.reason)
            new.logged = now
            return
        timeout = self.busy_timeout_s()
        if now - new.since >= timeout and (new.logged < new.since + timeout or now - new.logged >= REPEAT_S):
            log.error("GPU %d: transition to %s still blocked after busy_timeout (%gs): %s", i, name, timeout,
                      new.reason)
            new.logged = now
