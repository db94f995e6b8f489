"""An owner-only change (the same layout, other owners) as a transaction of its own.

Who may open an instance follows its owner label (``owners.json``), so a relabel moves an instance
from one team to another without any NVML call.  Done as close -> write the labels -> open, with a
journal entry (``relabeling``, the labels before and after) written before the close: a crash at any
cut leaves the instance closed to all but root, or the new owner's, never the old owner's with the
new owner's label nor the reverse; recovery finishes it forward (close, write the new labels) and the
pass's open grants by them.

An instance in use (a process runs on it, as NVML says, or holds its capability nodes open, as
/proc says: ``migd.access.holders``) does not change owner: a handle outlives chmod, so its process
would keep the new team's instance.  ``on_busy`` decides, as for a destroy: refuse, wait up to
``busy_timeout``, or stop the processes first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from migd.apply.result import ApplyOptions, BusyError, OnBusy
from migd.plan.planner import GpuPlan

log = logging.getLogger(__name__)


def labels_of(plan: GpuPlan) -> dict[int, str]:
    """The owner labels a plan's layout carries: GI placement start -> owner."""
    return {t.placement.start: t.owner for t in plan.targets if t.owner}


def relabelled(plans: list[GpuPlan], owners: Mapping[str, Mapping[int, str]]) -> list[GpuPlan]:
    """The GPUs whose layout holds and whose owners change (a GPU whose layout changes relabels with it)."""
    return [p for p in plans if not p.changes and p.targets and labels_of(p) != dict(owners.get(p.gpu.uuid, {}))]


def owners_only(plans: list[GpuPlan], owners: Mapping[str, Mapping[int, str]]) -> frozenset[int]:
    """The indexes of :func:`relabelled`'s GPUs: what every account of a plan or an apply marks as an owner
    change (ApplyResult.owners_only, migd.plan/v1's ``owners_only``)."""
    return frozenset(p.gpu.index for p in relabelled(plans, owners))


def moves(before: Mapping[int, str], after: Mapping[int, str]) -> str:
    """``GI at slice 0: notebooks -> training`` for each instance whose owner changes (for the log)."""
    return ", ".join(f"GI at slice {start}: {before.get(start, '(none)')} -> {after.get(start, '(none)')}"
                     for start in sorted(set(before) | set(after)) if before.get(start) != after.get(start))


def in_use(plan: GpuPlan, before: Mapping[int, str]) -> tuple[int, ...]:
    """The pids running on, or holding the nodes of, the plan's instances whose owner changes (the
    plan's ``busy`` has both when access by owner is on: ``planning.plan_layout``)."""
    after = labels_of(plan)
    starts = {s for s in set(before) | set(after) if before.get(s) != after.get(s)}
    ids = {g.id for g in plan.current if g.placement.start in starts}
    return tuple(sorted({pid for gi in ids for pids in plan.busy.get(gi, {}).values() for pid in pids}))


def settle_handover(plans: list[GpuPlan], owners: Callable[[], Mapping[str, Mapping[int, str]]], opts: ApplyOptions,
                    replan: Callable[[list[GpuPlan]], list[GpuPlan]],
                    stop: Callable[[list[int]], None]) -> tuple[list[GpuPlan], dict[str, str]]:
    """The relabels that may go ahead now, and those left waiting (GPU UUID -> why), as ``on_busy``
    says; without ``opts.partial`` one left waiting stops the apply (BusyError)."""
    deadline, stopped = time.monotonic() + opts.busy_timeout_s, False
    while True:
        labels = owners()
        busy = {p.gpu.uuid: pids for p in plans if (pids := in_use(p, labels.get(p.gpu.uuid, {})))}
        if not busy:
            return plans, {}
        why = {p.gpu.uuid: f"GPU {p.gpu.index}: its owners change ({moves(labels.get(p.gpu.uuid, {}), labels_of(p))}) "
               f"but instances are in use [busy: pids {','.join(map(str, busy[p.gpu.uuid]))}]"
               for p in plans if p.gpu.uuid in busy}
        if opts.on_busy is OnBusy.FORCE and not stopped and time.monotonic() >= deadline:  # (busy.py: one meaning)
            stop(sorted({pid for pids in busy.values() for pid in pids}))
            stopped = True
        elif opts.on_busy is not OnBusy.REFUSE and time.monotonic() < deadline and not opts.stopping():
            with opts.unheld():
                time.sleep(opts.poll_s)
        elif opts.partial:
            return [p for p in plans if p.gpu.uuid not in busy], why
        else:
            raise BusyError("; ".join(why.values()), [], opts.on_busy)
        if opts.progress is not None:
            opts.progress()
        plans = replan(plans)
