"""The busy policy: what an apply does about instances with running processes that it would destroy.

Refuse (the default), wait up to ``busy_timeout``, or (explicitly) stop the processes: SIGTERM, then
SIGKILL.  With ``ApplyOptions.partial`` only the busy GPU waits and the others are applied now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from migd.apply.force import stop_processes
from migd.apply.result import ApplyOptions, BusyError, OnBusy
from migd.hardware.ports import GpuReader
from migd.plan.planner import GpuPlan, Op

log = logging.getLogger(__name__)


def blocked_text(ops: list[Op]) -> str:
    return "; ".join(o.describe() for o in ops)


def settle_busy(backend: GpuReader, plans: list[GpuPlan], opts: ApplyOptions,
                replan: Callable[[], list[GpuPlan]],
                holding: Callable[[], set[int]] | None = None) -> tuple[list[GpuPlan], list[GpuPlan]]:
    """Wait for (or force) busy instances as ``opts`` says: (plans to run, plans left blocked).

    Without ``opts.partial`` any blocked GPU stops the whole apply (BusyError); with it, only that
    GPU waits and the others are applied now.  ``replan``: the plans read afresh after each wait."""
    deadline = time.monotonic() + opts.busy_timeout_s
    killed = waited = False
    while True:
        blocked = [o for p in plans for o in p.blocked]
        if not blocked:
            return plans, []
        stop = None
        if opts.stopping():
            stop = f"stopped while waiting for busy instances: {blocked_text(blocked)}"
        elif opts.on_busy is OnBusy.REFUSE:
            stop = f"instances with running processes would be destroyed: {blocked_text(blocked)}"
        elif opts.on_busy is OnBusy.WAIT and time.monotonic() >= deadline:
            stop = f"instances still busy after {opts.busy_timeout_s:g}s: {blocked_text(blocked)}"
        if stop is not None and opts.partial:
            return [p for p in plans if not p.blocked], [p for p in plans if p.blocked]
        if stop is not None:
            raise BusyError(stop, blocked, opts.on_busy)
        if not waited:
            log.info("waiting up to %gs for busy instances: %s", opts.busy_timeout_s, blocked_text(blocked))
            waited = True
        if opts.on_busy is OnBusy.FORCE and not killed:
            stop_processes(backend, sorted({pid for o in blocked for pid in o.busy_pids}), opts.kill_grace_s, holding)
            killed = True
        elif opts.on_busy is OnBusy.FORCE and time.monotonic() >= deadline:
            raise BusyError(f"instances still busy after SIGKILL: {blocked_text(blocked)}", blocked,
                            opts.on_busy)
        else:
            time.sleep(opts.poll_s)
        if opts.progress is not None:
            opts.progress()
        plans = replan()
