"""The busy policy: what an apply does about instances with running processes that it would destroy.

``refuse`` (migctl's default) stops at once; ``wait`` waits up to ``busy_timeout`` for the processes to
end, then refuses; ``force`` waits up to ``busy_timeout`` too, then stops them: SIGTERM, then SIGKILL
(force.py).  One meaning wherever it is set (migd.yaml's ``on_busy``, migctl's ``--on-busy``); migctl's
``--busy-timeout`` is 0 with force unless given, so ``--on-busy force`` alone stops them at once.
With ``ApplyOptions.partial`` only the busy GPU waits and the others are applied now.  A request
withdrawn (Ctrl-C) or a stop (SIGTERM) while waiting cancels the apply: nothing was changed yet.
The wait lets go of the daemon's hardware lock (``ApplyOptions.unheld``): a fault watch queued behind
it read a fatal Xid that came meanwhile only after the apply had changed that GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from migd.apply.force import stop_processes
from migd.apply.result import ApplyOptions, ApplyResult, BusyError, Cancelled, GpuResult, GpuStatus, OnBusy, Signalled
from migd.hardware.ports import GpuReader
from migd.plan.planner import GpuPlan, Op

log = logging.getLogger(__name__)


def blocked_text(ops: list[Op]) -> str:
    return "; ".join(o.describe() for o in ops)


def busy_pids(plans: list[GpuPlan]) -> dict[int, tuple[int, ...]]:
    """GPU index -> the PIDs on the instances its plan would destroy."""
    return {p.gpu.index: tuple(sorted({pid for o in p.blocked for pid in o.busy_pids})) for p in plans if p.blocked}


def pids_text(by_gpu: dict[int, tuple[int, ...]]) -> str:
    return "; ".join(f"GPU {i}: PIDs {', '.join(map(str, pids))}" for i, pids in sorted(by_gpu.items()))


def settle_busy(backend: GpuReader, plans: list[GpuPlan], opts: ApplyOptions, replan: Callable[[], list[GpuPlan]],
                holding: Callable[[], set[int]] | None = None,
                sent: list[Signalled] | None = None) -> tuple[list[GpuPlan], list[GpuPlan]]:
    """Wait for (or force) busy instances as ``opts`` says: (plans to run, plans left blocked).

    Without ``opts.partial`` any blocked GPU stops the whole apply (BusyError); with it, only that
    GPU waits and the others are applied now.  ``replan``: the plans read afresh after each wait;
    ``sent``: each signal force sends.  Cancelled: withdrawn or stopped while it waited."""
    deadline = time.monotonic() + opts.busy_timeout_s
    until = time.time() + opts.busy_timeout_s
    killed = said = False
    while True:
        blocked = [o for p in plans for o in p.blocked]
        if not blocked:
            return plans, []
        stop = _stop(opts, blocked, time.monotonic() >= deadline, killed)
        if stop is not None and opts.partial:
            return [p for p in plans if not p.blocked], [p for p in plans if p.blocked]
        if stop is not None:
            raise BusyError(stop, blocked, opts.on_busy)
        if opts.stopping():
            raise Cancelled(f"cancelled while waiting for busy instances ({pids_text(busy_pids(plans))}); "
                            "nothing was changed")
        if not said:
            _say_wait(opts, plans)
            said = True
        if opts.on_busy is OnBusy.FORCE and time.monotonic() >= deadline:
            stop_processes(backend, sorted({pid for o in blocked for pid in o.busy_pids}), opts.kill_grace_s, holding,
                           sent)
            killed = True
        else:
            if opts.on_wait is not None:
                opts.on_wait(busy_pids(plans), until)
            with opts.unheld():  # (the fault watch reads a fatal Xid meanwhile, the sampler samples)
                time.sleep(min(opts.poll_s, max(0.01, deadline - time.monotonic())))
        if opts.progress is not None:
            opts.progress()
        plans = replan()


def _stop(opts: ApplyOptions, blocked: list[Op], due: bool, killed: bool) -> str | None:
    """Why the wait ends here without the instances (None: it goes on)."""
    if opts.stopping() and opts.partial:
        return f"stopped while waiting for busy instances: {blocked_text(blocked)}"
    if opts.on_busy is OnBusy.REFUSE:
        return f"instances with running processes would be destroyed: {blocked_text(blocked)}"
    if opts.on_busy is OnBusy.WAIT and due:
        return f"instances still busy after {opts.busy_timeout_s:g}s: {blocked_text(blocked)}"
    if opts.on_busy is OnBusy.FORCE and killed:
        return f"instances still busy after SIGKILL: {blocked_text(blocked)}"
    return None


def _say_wait(opts: ApplyOptions, plans: list[GpuPlan]) -> None:
    pids = pids_text(busy_pids(plans))
    if opts.on_busy is OnBusy.WAIT:
        log.info("waiting up to %gs for busy instances to end (%s), then refusing", opts.busy_timeout_s, pids)
    elif opts.busy_timeout_s > 0:
        log.warning("on-busy force: waiting up to %gs for busy instances to end (%s), then stopping them "
                    "(SIGTERM, then SIGKILL)", opts.busy_timeout_s, pids)
    else:
        log.warning("on-busy force: stopping the processes on busy instances now (%s): SIGTERM, then SIGKILL", pids)


def cancelled(profile: str, plans: list[GpuPlan], why: str, seconds: float,
              owners_only: frozenset[int] = frozenset()) -> ApplyResult:
    """An apply withdrawn while it waited for busy instances: no GPU was touched (``owners_only``: the GPUs
    whose owners it would have changed, cancelled too)."""
    return ApplyResult(profile, plans, [
        GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.CANCELLED, 0, why) if p.changes or p.gpu.index in owners_only
        else GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.UNCHANGED) for p in plans], seconds, owners_only=owners_only)
