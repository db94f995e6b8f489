"""Slurm's queue as the demand rule reads it: pending requests and running jobs, per MIG type.

From one ``squeue --json`` (every job, one RPC; read by jobjson.py, where a job's own text is never taken
for its request or its allocation) and the nodes' records.

A job asks for MIG instances with ``--gres`` or ``--gpus-per-node`` (``tres_per_node``), ``--gpus``
(``tres_per_job``, the job's total even beside ``--gpus-per-task``: sbatch(1)), ``--gpus-per-task``
alone (``tres_per_task``, times its tasks) or ``--gpus-per-socket`` (``tres_per_socket``, times its
sockets per node); Slurm 22.05 prints ``gres:gpu:TYPE:N``, later releases ``gres/gpu:TYPE=N``: both are
read.  A job over N nodes asks its share on each, all at once: one request over N nodes.  A pending
job array is one record for all its pending tasks (``array_task_string``: ``1-9%3``), each a request
of its own, as many startable at once as its throttle (``%3``) leaves beside its running tasks.  A
record gives at most ``MAX_REQUESTS`` requests.  A running job's instances on a node are what Slurm
allocated there (``gres_detail``).  Held jobs and jobs whose dependency can never be met are not
demand.  Times are Unix seconds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from migd.demand.inputs import Pending, Running, is_mig_type
from migd.numeral import whole
from migd.slurm.ctl import SlurmError
from migd.slurm.jobjson import active, allocations, job_id, limit_s, number, read_jobs, states, text

_TRES = re.compile(r"gres[:/]gpu:([^:=,\s]+)[:=]([0-9]{1,9})\b", re.ASCII)
_UNTYPED = re.compile(r"gres[:/]gpu(?:[:=][0-9]{1,9})?(?:,|$)", re.ASCII)
_ALLOC = re.compile(r"gpu:([^:(,\s]+):([0-9]{1,9})\b", re.ASCII)
# squeue(1) reason codes of a job not yet eligible (Dependency, BeginTime): Slurm's backfill does not test it,
# so it reserves no node (demand/reserve.py), though its work is still wanted
WAITING_ON = ("Dependency", "BeginTime")
NEVER = ("JobHeld", "DependencyNeverSatisfied")  # not demand: it starts only when someone acts (or never)
MAX_ARRAY_TASKS = 4096  # pending tasks of one array read as requests: past a day's work for any fleet planned
MAX_REQUESTS = MAX_ARRAY_TASKS  # requests one pending record gives (tasks times MIG types): as many, as above


@dataclass(frozen=True)
class Queue:
    pending: tuple[Pending, ...]
    running: dict[str, tuple[Running, ...]]  # node -> its running GPU jobs
    untyped: int  # pending jobs asking for GPUs without a MIG type (no layout can be chosen for them)
    others: dict[str, int] = field(default_factory=dict)  # pending jobs per GPU type that is no MIG type


def _spans(expr: str) -> list[tuple[int, int, int]] | None:
    """``1-9%3``, ``0-99:2``, ``1,3,5-7`` as (first, last, step) per part (the ``%N`` throttle limits how
    many run at once, not how many there are); None for a form not read here."""
    out = []
    for part in expr.partition("%")[0].split(","):
        span, _, step_text = part.partition(":")
        lo_text, _, hi_text = span.partition("-")
        lo, hi, step = whole(lo_text), whole(hi_text or lo_text), whole(step_text or "1")
        if lo is None or hi is None or not step or hi < lo:
            return None
        out.append((lo, hi, step))
    return out


def array_size(expr: str) -> int | None:
    """How many tasks a pending array's expression names, however many (:func:`array_tasks` lists at
    most MAX_ARRAY_TASKS of them); None for a form not read here."""
    spans = _spans(expr)
    return None if spans is None else sum((hi - lo) // step + 1 for lo, hi, step in spans)


def array_tasks(expr: str) -> list[str] | None:
    """The task ids of a pending array's ``1-9%3``, ``0-99:2``, ``1,3,5-7``, at most MAX_ARRAY_TASKS;
    None for a form not read here."""
    spans = _spans(expr)
    if spans is None:
        return None
    ids: list[str] = []
    for lo, hi, step in spans:
        ids += [str(i) for i in range(lo, min(hi, lo + step * MAX_ARRAY_TASKS) + 1, step)]
        if len(ids) >= MAX_ARRAY_TASKS:
            return ids[:MAX_ARRAY_TASKS]
    return ids


def _asked(job: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(MIG type, instances on each node) a pending job asks for; untyped requests as type ''."""
    nodes = max(1, number(job.get("node_count")) or 1)
    tasks = max(1, number(job.get("tasks")) or 1)
    sockets = max(1, number(job.get("sockets_per_node")) or 1)
    per_job = bool(text(job.get("tres_per_job")))  # --gpus is the job's total, --gpus-per-task beside it too
    out: list[tuple[str, int]] = []
    for key, times, per in (("tres_per_node", 1, 1), ("tres_per_socket", sockets, 1), ("tres_per_job", 1, nodes),
                            ("tres_per_task", tasks, nodes)):
        value = text(job.get(key))
        if key == "tres_per_task" and per_job:
            continue
        typed = _TRES.findall(value)
        out += [(t, max(1, int(n) * times // per)) for t, n in typed]
        if not typed and _UNTYPED.search(value):
            out.append(("", 0))
    return out


def _tasks(job: Mapping[str, Any], running: Mapping[str, int]) -> list[tuple[str, bool]]:
    """(id, may start now) of the job, or of each pending task of an array's record (``12_3``): an array
    throttled to N (``%N``) starts at most N at once, its running tasks included; the rest wait for them."""
    own = job_id(job)
    expr = text(job.get("array_task_string"))
    if not expr:
        return [(own, True)] if own else []
    array = str(number(job.get("array_job_id")) or own)
    found = array_tasks(expr)
    if found is None:
        return [(f"{array}_[{expr}]", True)]
    throttle = number(job.get("array_max_tasks")) or 0
    free = len(found) if throttle <= 0 else max(0, throttle - running.get(array, 0))
    return [(f"{array}_{t}", k < free) for k, t in enumerate(found)]


def read_queue(jobs_json: str, partition: str, now: float) -> Queue:
    """``squeue --json``'s jobs of ``partition``; SlurmError for output that is not its document."""
    try:
        jobs = [j for j in read_jobs(jobs_json) if partition in text(j.get("partition")).split(",")]
        return _Reader(jobs, now).queue()
    except ValueError as e:
        raise SlurmError(f"squeue --json: {e}") from None


class _Reader:
    """One read of the queue's job records into pending requests and running jobs per node."""

    def __init__(self, jobs: list[Mapping[str, Any]], now: float) -> None:
        self.jobs, self.now = jobs, now
        self.arrays = Counter(str(number(j.get("array_job_id"))) for j in jobs
                              if active(j) and number(j.get("array_job_id")))
        self.pending: list[Pending] = []
        self.running: dict[str, list[Running]] = {}
        self.untyped = 0
        self.others: set[tuple[str, str]] = set()

    def queue(self) -> Queue:
        for job in self.jobs:
            reason = text(job.get("state_reason"))
            if "PENDING" in states(job) and not reason.startswith(NEVER):
                self._pending(job, reason)
            elif active(job):
                self._running(job)
        return Queue(tuple(self.pending), {n: tuple(r) for n, r in self.running.items()}, self.untyped,
                     dict(Counter(t for t, _ in sorted(self.others))))

    def _age_s(self, job: Mapping[str, Any]) -> float:
        return max(0.0, self.now - (number(job.get("submit_time")) or self.now))

    def _pending(self, job: Mapping[str, Any], reason: str) -> None:
        """Each task's request (over all of the job's nodes at once), at most ``MAX_REQUESTS`` for the
        record: an array of 4,096 tasks over 1,024 nodes was four million requests while each node was one
        (a minute and a gigabyte a decision), and a record of a million tasks would be as many."""
        nodes = min(max(1, number(job.get("node_count")) or 1), MAX_REQUESTS)
        account, limit, left = _account(job), limit_s(job), MAX_REQUESTS
        asked, priority, age = _asked(job), number(job.get("priority")) or 0, self._age_s(job)  # (each task's own)
        for task, free in _tasks(job, self.arrays):
            for mig_type, count in asked:
                if not mig_type:
                    self.untyped += 1
                elif not is_mig_type(mig_type):  # (a whole GPU's type, say: a candidate layout never offers it)
                    self.others.add((mig_type, task))
                elif left > 0:
                    left -= 1
                    self.pending.append(Pending(task, account, mig_type, count, limit, priority, age,
                                                free and not reason.startswith(WAITING_ON), nodes))

    def _running(self, job: Mapping[str, Any]) -> None:
        limit, end = limit_s(job), number(job.get("end_time"))
        ends_in = max(0.0, (end if end and end > 0 else self.now + limit) - self.now)
        own, account, age = job_id(job), _account(job), self._age_s(job)
        for node, gres in allocations(job):
            if node is None:
                continue  # (a node not named: the planner cannot place it; a node's own switch counts it)
            for mig_type, count in _ALLOC.findall(gres):
                if not is_mig_type(mig_type):
                    continue  # (its node holds a type no candidate layout has: the planner skips that node)
                self.running.setdefault(node, []).append(Running(own, mig_type, int(count), ends_in, account, age,
                                                                 limit))


def _account(job: Mapping[str, Any]) -> str:
    return text(job.get("account")) or "-"
