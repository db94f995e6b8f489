"""migctl's table of the running daemon (``migctl daemon``), from its ``migd.daemon/v1`` document.

Every time on the screen is on one clock, the one the schedule runs on: the machine's, or on a clock
of migd's own (``--now``, ``--time-scale``) that one, said on the second line.  A GPU that waits for busy
instances says for which PIDs; it is neither drifted nor the apply's failure.  (``tables`` has the
other tables and takes ``daemon_table`` from here.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone

from migd.api.access import AccessView
from migd.api.daemon import (
    Active,
    Applying,
    DaemonDoc,
    Fault,
    GpuView,
    LastApply,
    Outcome,
    Progress,
    Reason,
    SimClock,
    wait_words,
)
from migd.api.demand import DemandView, PlanSummary
from migd.api.plan import SignalSent
from migd.demand.runtime import MIN_JOBS
from migd.isolation.xids import fault_text
from migd.printable import text_lines
from migd.profiles.model import index_ranges

RESUME_HINT = "`migctl resume` returns to the schedule now"
When = Callable[[float | None], str]


def _shown(render: Callable[[float], str], epoch: float | None) -> str:
    """``render(epoch)``, "-" for none; a time out of the calendar's range (one read from Slurm in
    milliseconds, say) is shown as its number: it never stops a report."""
    if not epoch:
        return "-"
    try:
        return render(epoch)
    except (OverflowError, OSError, ValueError):
        return f"{epoch:.0f} (epoch seconds, out of range)"


def utc(epoch: float | None) -> str:
    return _shown(lambda e: datetime.fromtimestamp(e, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), epoch)


def _on(clock: SimClock, epoch: float | None) -> str:
    return _shown(lambda e: utc_of(clock.of(e).isoformat()), epoch)


def utc_of(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock_of(clock: SimClock | None) -> When:
    """Unix times as the document's clock shows them (on a clock of migd's own: turned into it)."""
    if clock is None:
        return utc
    return lambda epoch: _on(clock, epoch)


def signal_lines(sent: Sequence[SignalSent] | None, when: When = utc) -> list[str]:
    """Every process the busy policy force signalled: one line per PID, each signal with its time."""
    by_pid: dict[int, list[SignalSent]] = {}
    for s in sent or ():
        by_pid.setdefault(s.pid, []).append(s)
    return [f"on-busy force: PID {pid} " + (f"on GPU {ss[0].gpu}" if ss[0].gpu is not None else
                                            "(holding a capability node)") + ": " +
            ", then ".join(f"{s.signal} at {when(s.at)}" for s in ss) for pid, ss in by_pid.items()]


def _pids(pids: Iterable[int]) -> str:
    return f"PIDs {', '.join(map(str, pids))}"


def _in_groups(items: Iterable[tuple[int, str]]) -> list[str]:
    """``(gpu, text)`` as ``GPU 0-3 text``, one per distinct text, in first-seen order."""
    by_text: dict[str, list[int]] = {}
    for index, text in items:
        by_text.setdefault(text, []).append(index)
    return [f"GPU {index_ranges(ix)} {text}" for text, ix in by_text.items()]


def _state_word(g: GpuView) -> str:
    return f"waiting for {_pids(g.pids)}" if g.state is Progress.WAITING and g.pids else g.state.value


def _asked_line(doc: DaemonDoc) -> str:
    """Which profile every GPU holds, and each GPU that does not hold the active one yet, with why."""
    wanted = doc.active.profile if doc.active is not None else "the active profile"
    off = _in_groups((i, _state_word(doc.gpus[str(i)])) for i in doc.drift_gpus if str(i) in doc.gpus)
    now = f"not yet as {wanted} asks: {', '.join(off)}" if off else f"every GPU as {wanted} asks"
    return f"applied profile: {doc.applied_profile or '-'}; {now}"


def _gpu_lines(doc: DaemonDoc, when: When) -> list[str]:
    lines = []
    for i, g in doc.gpus.items():
        if g.state is Progress.FAILED and g.next_try is not None:  # waiting out its backoff
            again = f"; {g.failures} attempts failed in a row since {when(g.since)}" if (g.failures or 0) > 1 else ""
            lines.append(f"  GPU {i}: failed at {when(g.failed_at)} ({g.reason or 'no reason given'}); next try at "
                         f"{when(g.next_try)}{again}")
        elif g.state is Progress.WAITING and g.pids:
            lines.append(f"  GPU {i}: waiting for {_pids(g.pids)} since {when(g.since)}: they run on instances the "
                         f"change must destroy ({wait_words(g.reason or '')}); it goes ahead when they end")
        elif g.state is not Progress.CONVERGED:
            why = f": {g.reason}" if g.reason else ""
            lines.append(f"  GPU {i}: {g.state.value} since {when(g.since)}{why}")
    aside = [int(i) for i, g in doc.gpus.items() if g.selected is False]
    if aside:
        wanted = doc.active.profile if doc.active is not None else "the active profile"
        lines.append(f"  GPU {index_ranges(aside)}: not selected by {wanted}; left as they are")
    return lines


def _waiting_text(waiting: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(_in_groups((int(i), f"waiting for {_pids(p)}") for i, p in sorted(waiting.items(),
                                                                                       key=lambda kv: int(kv[0]))))


def _last_line(last: LastApply, when: When) -> list[str]:
    """The last apply: what it did per GPU where known (some switched, some wait), not only its worst word."""
    waiting = _waiting_text(last.waiting or {})
    changed = f"{last.changed} GPU(s) changed" if last.changed is not None else ""
    what = last.result.value
    if last.result is Outcome.BLOCKED and waiting and last.changed is None:  # refused at once for busy ones
        what = "blocked by busy instances: " + waiting.replace("waiting for", "in use by")
    elif last.result is Outcome.BLOCKED and waiting:
        what = f"{changed}, {waiting}"
    elif changed or waiting:
        what += "; " + ", ".join(x for x in (changed, waiting) if x)
    trigger = f"{last.trigger} " if last.trigger else ""
    lines = [f"last apply: {last.profile}: {what} ({trigger}at {when(last.time)}, took {last.seconds}s)"]
    return lines + [f"  {s}" for s in signal_lines(last.signalled, when)]


def _applying_line(a: Applying, when: When) -> str:
    """A manual apply that waits inside migd for busy instances, and what it does when the wait ends."""
    then = "stops them (SIGTERM, then SIGKILL)" if a.on_busy == "force" else "is refused"
    waits = _waiting_text(a.waiting) or "reading the GPUs"
    return (f"manual apply of {a.profile} ({a.source}) in progress since {when(a.since)}: {waits}; at "
            f"{when(a.until)} it {then} (on-busy {a.on_busy}; Ctrl-C on its migctl cancels it)")


def daemon_table(doc: DaemonDoc) -> str:
    """``migctl daemon``: which profile holds and why, what comes next, what is in the way."""
    when = clock_of(doc.clock)
    lines = [f"migd running since {when(doc.started)} (config {doc.config_path}, timezone {doc.timezone})"]
    if doc.clock is not None:
        lines.append(f"clock: migd's own (--now, --time-scale), not this machine's: from {utc_of(doc.clock.at)}, "
                     f"{doc.clock.scale:g}x real time; every time here is on it")
    lines.append(_active_line(doc.active, when))
    if doc.applying is not None:
        lines.append(_applying_line(doc.applying, when))
    lines.append(_asked_line(doc))
    nxt = doc.next
    lines.append(f"next transition: {nxt.profile} at {nxt.local} ({nxt.at})" if nxt else "next transition: none")
    states = Counter("not selected" if g.selected is False else g.state.value for g in doc.gpus.values())
    lines.append("GPUs: " + (", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none planned"))
    lines += _gpu_lines(doc, when)
    if doc.last_apply:
        lines += _last_line(doc.last_apply, when)
    lines += _unhealthy_lines(doc, when)
    if doc.last_reload_error:
        lines.append(f"last reload rejected: {doc.last_reload_error}")
    if doc.restart_needed:
        lines.append(f"restart needed: {', '.join(doc.restart_needed)} changed since start")
    sl = doc.slurm
    if sl:
        sync = {True: "in sync", False: "NOT in sync", None: "not checked yet"}[sl.gres_in_sync]
        res = f"; reserved ({sl.reservation})" if sl.reservation else ""
        lines.append(f"slurm node {sl.node}: {sl.phase.value} since {when(sl.since)}; GRES {sync}{res}"
                     + (f": {sl.reason}" if sl.reason else ""))
    return text_lines(lines + _access_lines(doc.access) + _demand_lines(doc.demand, when))


def mark_text(uuid: str, why: str, faults: Mapping[str, Fault] | None, when: When,
              index: int | None = None) -> str:
    """A GPU's fault mark in words (``migctl daemon`` and ``migctl isolation`` alike): the GPU by index,
    as every other line names one, its time on the document's clock, and how it is cleared.  ``index``:
    the GPU's, if the caller knows it, else the one migd sent with the mark; a migd that sends no
    ``faults`` gives the mark in words only: shown as it is."""
    f = (faults or {}).get(uuid)
    what = fault_text(f.xid, when(f.at)) if f is not None else why
    index = index if index is not None else (f.gpu if f is not None else None)
    if index is None:
        return f"{uuid}: {what}; reconfiguring it is refused until cleared (`migctl clear-fault`, once it can be read)"
    return f"GPU {index} ({uuid}): {what}; reconfiguring it is refused until `migctl clear-fault {index}`"


def _unhealthy_lines(doc: DaemonDoc, when: When) -> list[str]:
    """Each GPU a fault mark holds, and the mark's time on the document's clock."""
    index = {g.uuid: int(i) for i, g in doc.gpus.items()}
    return [f"unhealthy: {mark_text(uuid, why, doc.faults, when, index.get(uuid))}"
            for uuid, why in doc.unhealthy.items()]


def _access_lines(ac: AccessView | None) -> list[str]:
    """Access by owner: whose instances are open to whom, and what could not be set."""
    if ac is None:
        return []
    owners = "; ".join(f"{o}: {who}" for o, who in ac.owners.items()) or "no owner listed"
    lines = [f"access by owner ({ac.interface} interface): {owners}; unowned: {ac.unowned}; "
             f"{ac.changed} capability node(s) set since start"]
    return lines + [f"  access NOT set: {e}" for e in ac.errors]


def _active_line(active: Active | None, when: When) -> str:
    if active is None:
        return "active profile: none yet (no schedule entry has fired)"
    if active.reason is Reason.MANUAL:
        until = active.until or "no further scheduled transition"
        return (f"active profile: {active.profile} (manual apply of {active.source}, until {until}; "
                f"{RESUME_HINT})")
    if active.reason is Reason.DEMAND:
        lease = active.until if isinstance(active.until, (int, float)) else None
        return f"active profile: {active.profile} (demand: wanted by planner {active.source} until {when(lease)})"
    return f"active profile: {active.profile} (schedule)"


def _run_times(plan: PlanSummary) -> list[str]:
    """What the rule takes a job to run, per account: a share of its time limit (docs/demand.md, item 1);
    nothing from a migd that does not say it."""
    if plan.run_share is None:
        return []
    shares = ", ".join(f"{a} {s:.2g}" for a, s in sorted(plan.run_share.items()))
    seeded = "" if plan.seeded_jobs is None else f"; {plan.seeded_jobs} ended job(s) read from accounting at start"
    return [f"  run times (share of the time limit): {shares}; other accounts run to their limits{seeded}" if shares
            else f"  run times: every account runs to its limits (fewer than {MIN_JOBS} ended jobs seen){seeded}"]


def _demand_lines(dm: DemandView | None, when: When) -> list[str]:
    """The demand mode: what this node follows and why; on the planner, its last decision."""
    if not dm:
        return []
    lines = [f"demand ({dm.mode}, planner {dm.planner}): {dm.source.value}: {dm.why}"]
    plan = dm.plan
    if plan:
        wanted = ", ".join(f"{t} {v:g}" for t, v in plan.wanted_slice_h.items()) or "none"
        lines.append(f"  last decision at {when(plan.at)}: wanted slice-hours {wanted}; {plan.writes} write(s)"
                     + (f"; Slurm not read: {plan.error}" if plan.error else ""))
        lines += _run_times(plan)
        lines += [f"  change {c}" for c in plan.changes] + [f"  held {h}" for h in plan.held]
        lines += [f"  skipped {s}" for s in plan.skipped]
        lines += [f"  not offered by any candidate layout: {t} ({n} pending job(s))"
                  for t, n in sorted((plan.unoffered or {}).items())]
        if plan.untyped:
            lines.append(f"  {plan.untyped} pending request(s) for GPUs without a MIG type (--gres=gpu:N): no layout "
                         "is chosen for them")
    return lines
