"""The daemon's loop: one pass at start, then a pass whenever a transition fires, the reconcile
interval passes, NVML reports a MIG change, a reload takes, a waiting GPU is due another look, or a
GPU whose change failed is due its next try; and a look at the capability nodes alone every few
seconds while an instance is held back from its owner for a stranger's handle.

Level-triggered (see service.py): each pass decides from the time it runs, so the loop only has to
decide when to look, never what to do.
"""

from __future__ import annotations

import time

from migd.daemon.accesspass import view as access_view
from migd.daemon.service import Daemon
from migd.daemon.wakeups import Reload

SLURM_RETRY_S = 5.0
HOLD_RETRY_S = 2.0


def run(d: Daemon) -> None:
    d.start()
    last = time.monotonic()
    while not d.events.stopping:
        d.events.wait(sleep_s(d))
        d.heartbeat.beat()
        if d.events.stopping:
            break
        reload = d.events.take_reload()
        if reload is not None:
            if reload is Reload.READ:
                d.reload()
            d.reconcile("reload")
            last = time.monotonic()
            continue
        due = time.monotonic() - last >= d.clock.real(d.config.reconcile_interval_s)
        due = d.events.take_config_changed() or due
        fired = until_next_s(d) == 0.0
        retry = d.retries.due_in_s() == 0.0  # a failed GPU's backoff ended (its next try is this pass)
        if due or fired or retry or d.status.blocked_since is not None or d.slurm_pending or d.planning_due:
            d.reconcile("transition" if fired else "reconcile")
            last = time.monotonic()
        elif d.access is not None and d.access.holding:
            recheck_access(d)
    d.notifier.stopping()


def recheck_access(d: Daemon) -> None:
    """An instance is held back from its owner while a stranger holds its nodes: look again soon (the
    capability nodes only, not a whole pass), so the owner gets it within seconds of the stranger
    letting go."""
    access = d.access
    if access is None:
        return
    with d.lock, d.hw_lock:
        access.reconcile()
        d.status.access = access_view(access)


def until_next_s(d: Daemon) -> float | None:
    """Real seconds to the next scheduled transition (0: it fired; None: there is none)."""
    nxt = d.status.next_transition
    if nxt is None:
        return None
    return max(0.0, d.clock.real((nxt[0] - d.clock.now()).total_seconds()))


def sleep_s(d: Daemon) -> float:
    waits = [d.clock.real(d.config.reconcile_interval_s)]
    if d.notifier.watchdog_interval_s:
        waits.append(d.notifier.watchdog_interval_s)
    until = until_next_s(d)
    if until is not None:
        waits.append(until)
    since = d.status.blocked_since
    if since is not None:  # retry a blocked GPU, backing off from 1 s to 30 s
        waits.append(min(30.0, max(1.0, (time.time() - since) / 10)))
    retry = d.retries.due_in_s()
    if retry is not None:  # a GPU whose change failed is tried again when its backoff ends
        waits.append(retry)
    if d.access is not None and d.access.holding:  # an instance waits for a stranger to let go of its nodes
        waits.append(HOLD_RETRY_S)
    if d.slurm_pending:  # Slurm has not confirmed the node's resume: ask again soon
        waits.append(SLURM_RETRY_S)
    if d.slurm is not None and d.slurm.demand is not None and d.slurm.demand.planning:
        waits.append(d.slurm.demand.s.interval_s)
    return max(0.05, min(waits))
