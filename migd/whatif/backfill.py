"""Slurm 22.05's backfill pass over the queue model's nodes (``Cluster.reserve``), as sched/backfill
and select/cons_tres do it, so that a replay on real Slurm and the model agree job by job.

What Slurm does (src/plugins/sched/backfill/backfill.c ``_attempt_backfill``; select/cons_tres
``_will_run_test``; slurm.conf(5) ``bf_max_job_test``, ``bf_window_linear``):

- every pending job in priority order (priority/basic: submission order), at most ``bf_max_job_test``
  (500);
- a job starts now on a node that has its instances free and no reservation in [now, now + its time
  limit] (a reservation that begins exactly as the job's limit ends still counts: ``begin_time <=
  end_time``);
- otherwise its expected start is found by removing the running jobs on the nodes still open to it in
  order of their time limits' ends, in batches: the first batch takes every job ending up to the first
  end rounded up to a 30-s wall-clock boundary plus 30 s, each later batch a window twice as long, and
  the start is the last removed job's end (a coarse estimate: in compressed time, 30 s is half an
  hour);
- if that start is after the first moment a reserved node opens again, the job is tried from that
  moment instead; if its window then meets a reservation on the node chosen, from its start;
- the job reserves that whole node from its start to its start plus its time limit
  (``_add_reservation`` removes the node from the plan: a younger job of another MIG type waits too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from migd.whatif.fleet import Job, Node

BF_MAX_JOB_TEST = 500  # slurm.conf(5) default: jobs past it are not tested
WILL_RUN_WINDOW_S = 30  # cons_tres _will_run_test's first window (doubled for each batch after it)
_TRIES = 64  # TRY_LATER rounds for one job (each moves its earliest start on)

Windows = Mapping[str, list[tuple[float, float]]]


def backfill(nodes: list[Node], pending: dict[str, list[Job]], now: float, epoch_s: float) -> None:
    """One pass over ``pending`` (MIG type -> its queue): start what may start now, reserve a node for
    the rest (the plan lives one pass).  ``epoch_s``: the wall clock at time 0."""
    queue = sorted((j for q in pending.values() for j in q), key=lambda j: j.spec.submit_s)
    plan: Windows = {n.name: [] for n in nodes}
    started: set[int] = set()
    for job in queue[:BF_MAX_JOB_TEST]:
        placed = _place(nodes, job, now, plan, epoch_s)
        if placed is None:
            continue
        at, node = placed
        if at <= now:
            job.start, job.node = now, node.name
            node.running.append(job)
            started.add(id(job))
        else:
            plan[node.name].append((at, at + job.spec.time_limit_s))
    if started:
        for t, q in pending.items():
            pending[t] = [j for j in q if id(j) not in started]


def _place(nodes: list[Node], job: Job, now: float, plan: Windows, epoch_s: float) -> tuple[float, Node] | None:
    """Where and when ``job`` starts (``now``: at once) by Slurm's plan; None: no reservation."""
    t, k, limit = job.spec.gres, job.spec.count, job.spec.time_limit_s
    usable = [n for n in nodes if n.target is None and n.ready_at is None]  # drained: not in the plan
    start_res = now
    for _ in range(_TRIES):
        end = start_res + limit
        avail = [n for n in usable if not overlaps(plan[n.name], start_res, end)]
        later = min((e for n in usable for b, e in plan[n.name] if b <= end and e > start_res), default=None)
        got = will_run(nodes, avail, t, k, now, epoch_s)
        if got is None:
            if later is None:
                return None
            start_res = later
            continue
        at, node = max(start_res, got[0]), got[1]
        if at <= now:
            return now, node
        if later is not None and at > later:
            start_res = later
        elif overlaps(plan[node.name], at, at + limit):
            start_res = at
        else:
            return at, node
    return None


def will_run(every: list[Node], nodes: list[Node], mig_type: str, count: int, now: float,
             epoch_s: float) -> tuple[float, Node] | None:
    """cons_tres's estimate on ``nodes``: ``now`` on the first with the instances free, else the end (by
    time limit) of the last job of the batch whose removal frees them; None: never on these nodes.
    Every running job (``every`` node's) is walked in order of its limit's end; one on a node not in
    ``nodes`` is passed over without ending the batch, so a batch reaches past it (Slurm's loop
    ``continue``s before its window test)."""
    used = {n.name: sum(j.spec.count for j in n.running if j.spec.gres == mig_type) for n in nodes}
    fits = [n for n in nodes if n.layout.count(mig_type) - used[n.name] >= count]
    if fits:
        return now, fits[0]
    if not any(n.layout.count(mig_type) >= count for n in nodes):
        return None
    running = sorted(((_limit_end(j), n.name, j) for n in every for j in n.running), key=lambda x: x[0])
    window, barrier, i, last = WILL_RUN_WINDOW_S, None, 0, None
    while i < len(running):
        while i < len(running):
            end, name, j = running[i]
            i += 1
            if name not in used:
                continue
            if barrier is None:  # aligned on a wall-clock multiple of the window, as Slurm's epoch seconds
                barrier = end + window - math.floor(epoch_s + end) % window
            last = end
            if j.spec.gres == mig_type:
                used[name] -= j.spec.count
            if i >= len(running) or running[i][0] > barrier + window:
                break
        if last is None or barrier is None:
            return None
        window *= 2
        while i < len(running) and running[i][0] > barrier + window:
            window *= 2
        fits = [n for n in nodes if n.layout.count(mig_type) - used[n.name] >= count]
        if fits:
            return last, fits[0]
    return None


def overlaps(windows: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether [start, end] meets a reserved window [b, e) (Slurm: a window beginning as the job's limit
    ends still counts)."""
    return any(b <= end and e > start for b, e in windows)


def _limit_end(j: Job) -> float:
    assert j.start is not None
    return j.start + j.spec.time_limit_s
