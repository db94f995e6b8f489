"""Slurm's queue as the demand rule reads it: pending requests and running jobs, per MIG type.

From one ``squeue --json`` (every job, one RPC; Slurm 21.08 and later) and the nodes' records.  JSON,
not ``scontrol show job -o``: that line is ``Key=Value`` pairs split at spaces, and a job's name, comment,
working directory and output paths are the user's own text, printed among them, so a job named
``x TresPerNode=gres:gpu:3g.40gb:2`` asked for instances it never asked for, and an output path holding
``Nodes=gpu2 ... GRES=gpu:7g.80gb:1`` put a job on a node it did not run on.  In JSON each is a string
of its own.

A job asks for MIG instances with ``--gres`` or ``--gpus-per-node`` (``tres_per_node``), ``--gpus``
(``tres_per_job``, the job's total even beside ``--gpus-per-task``: sbatch(1)), ``--gpus-per-task``
alone (``tres_per_task``, times its tasks) or ``--gpus-per-socket`` (``tres_per_socket``, times its
sockets per node); Slurm 22.05 prints ``gres:gpu:TYPE:N``, later releases ``gres/gpu:TYPE=N``: both are
read.  A job over N nodes asks its share on each: N requests.  A pending job array is one record for
all its pending tasks (``array_task_string``: ``1-9%3``), each a request of its own (up to
``MAX_ARRAY_TASKS`` per array).  A running job's instances on a node are what Slurm allocated there
(``gres_detail``).  Held jobs and jobs whose dependency can never be met are not demand.  Times are
Unix seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from migd.demand.inputs import Pending, Running
from migd.numeral import whole
from migd.slurm.ctl import SlurmError, bounded_hostnames
from migd.wire import JsonError, loads

_TRES = re.compile(r"gres[:/]gpu:([^:=,\s]+)[:=]([0-9]{1,9})\b", re.ASCII)
_UNTYPED = re.compile(r"gres[:/]gpu(?:[:=][0-9]{1,9})?(?:,|$)", re.ASCII)
_ALLOC = re.compile(r"gpu:([^:(,\s]+):([0-9]{1,9})\b", re.ASCII)
# squeue(1) reason codes of a job not yet eligible (Dependency, BeginTime): Slurm's backfill does not test it,
# so it reserves no node (demand/reserve.py), though its work is still wanted
WAITING_ON = ("Dependency", "BeginTime")
NEVER = ("JobHeld", "DependencyNeverSatisfied")  # not demand: it starts only when someone acts (or never)
RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})  # (STOPPED: SIGSTOP,
# its allocation kept: squeue(1))
MAX_ARRAY_TASKS = 4096  # pending tasks of one array read as requests: past a day's work for any fleet planned
_INFINITE = 0xFFFFFFFE  # slurm.h NO_VAL (0xfffffffe) and INFINITE (0xffffffff): no time limit


@dataclass(frozen=True)
class Queue:
    pending: tuple[Pending, ...]
    running: dict[str, tuple[Running, ...]]  # node -> its running GPU jobs
    untyped: int  # pending jobs asking for GPUs without a MIG type (no layout can be chosen for them)


def _number(value: Any) -> int | None:
    """An integer field: 22.05 writes a number, later releases ``{"set": .., "infinite": .., "number": ..}``
    (None: not set; -1: infinite)."""
    if isinstance(value, dict):
        if value.get("infinite") is True:
            return -1
        return _number(value.get("number")) if value.get("set", True) is True else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _state(job: Mapping[str, Any]) -> str:
    """The job's base state (22.05: a string; later releases: a list of the base state and flags)."""
    state = job.get("job_state")
    return state[0] if isinstance(state, list) and state and isinstance(state[0], str) else _text(state)


def _limit_s(job: Mapping[str, Any]) -> float:
    minutes = _number(job.get("time_limit"))
    return float("inf") if minutes is None or minutes < 0 or minutes >= _INFINITE else minutes * 60.0


def array_tasks(expr: str) -> list[str] | None:
    """The task ids of a pending array's ``1-9%3``, ``0-99:2``, ``1,3,5-7`` (the ``%N`` throttle limits how
    many run at once, not how many there are), at most MAX_ARRAY_TASKS; None for a form not read here."""
    ids: list[str] = []
    for part in expr.partition("%")[0].split(","):
        span, _, step_text = part.partition(":")
        lo_text, _, hi_text = span.partition("-")
        lo, hi, step = whole(lo_text), whole(hi_text or lo_text), whole(step_text or "1")
        if lo is None or hi is None or not step or hi < lo:
            return None
        ids += [str(i) for i in range(lo, min(hi, lo + step * MAX_ARRAY_TASKS) + 1, step)]
        if len(ids) >= MAX_ARRAY_TASKS:
            return ids[:MAX_ARRAY_TASKS]
    return ids


def _asked(job: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(MIG type, instances on each node) a pending job asks for; untyped requests as type ''."""
    nodes = max(1, _number(job.get("node_count")) or 1)
    tasks = max(1, _number(job.get("tasks")) or 1)
    sockets = max(1, _number(job.get("sockets_per_node")) or 1)
    per_job = bool(_text(job.get("tres_per_job")))  # --gpus is the job's total, --gpus-per-task beside it too
    out: list[tuple[str, int]] = []
    for key, times, per in (("tres_per_node", 1, 1), ("tres_per_socket", sockets, 1), ("tres_per_job", 1, nodes),
                            ("tres_per_task", tasks, nodes)):
        value = _text(job.get(key))
        if key == "tres_per_task" and per_job:
            continue
        typed = _TRES.findall(value)
        out += [(t, max(1, int(n) * times // per)) for t, n in typed]
        if not typed and _UNTYPED.search(value):
            out.append(("", 0))
    return out


def _ids(job: Mapping[str, Any]) -> list[str]:
    """The job's id, or for a pending array's record the ids of its pending tasks (``12_3``)."""
    job_id = str(_number(job.get("job_id")) or "")
    tasks = _text(job.get("array_task_string"))
    if not tasks:
        return [job_id] if job_id else []
    array = str(_number(job.get("array_job_id")) or job_id)
    found = array_tasks(tasks)
    return [f"{array}_[{tasks}]"] if found is None else [f"{array}_{t}" for t in found]


def _allocations(job: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(node, the GRES Slurm allocated the job there): ``gres_detail`` runs in the order of the job's
    nodes (22.05: ``job_resources.allocated_nodes``; otherwise its ``nodes`` hostlist, one node)."""
    detail = [d for d in job.get("gres_detail") or () if isinstance(d, str)]
    resources = job.get("job_resources")
    named = resources.get("allocated_nodes") if isinstance(resources, dict) else None
    nodes = [_text(n.get("nodename")) for n in named if isinstance(n, dict)] if isinstance(named, list) else []
    if not nodes:
        hosts = bounded_hostnames(_text(job.get("nodes")))
        nodes = sorted(hosts) if hosts is not None and len(hosts) == 1 else []
    yield from zip(nodes, detail, strict=False)  # (a detail past the nodes named: not placed)


def read_queue(jobs_json: str, partition: str, now: float) -> Queue:
    """``squeue --json``'s jobs of ``partition``; SlurmError for output that is not its document."""
    try:
        doc = loads(jobs_json)
    except JsonError as e:
        raise SlurmError(f"squeue --json: {e}") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise SlurmError("squeue --json: no list of jobs in its output")
    pending: list[Pending] = []
    running: dict[str, list[Running]] = {}
    untyped = 0
    for job in jobs:
        if not isinstance(job, dict) or partition not in _text(job.get("partition")).split(","):
            continue
        state, reason = _state(job), _text(job.get("state_reason"))
        account = _text(job.get("account")) or "-"
        limit = _limit_s(job)
        submitted = _number(job.get("submit_time")) or now
        if state == "PENDING" and not reason.startswith(NEVER):
            nodes = max(1, _number(job.get("node_count")) or 1)
            for job_id in _ids(job):
                for mig_type, count in _asked(job):
                    if not mig_type:
                        untyped += 1
                        continue
                    pending += [Pending(job_id, account, mig_type, count, limit, _number(job.get("priority")) or 0,
                                        max(0.0, now - submitted), not reason.startswith(WAITING_ON))] * nodes
        elif state in RUNNING:
            end = _number(job.get("end_time"))
            ends_in = max(0.0, (end if end and end > 0 else now + limit) - now)
            for node, gres in _allocations(job):
                for mig_type, count in _ALLOC.findall(gres):
                    running.setdefault(node, []).append(Running(str(_number(job.get("job_id"))), mig_type,
                                                                int(count), ends_in, account,
                                                                max(0.0, now - submitted), limit))
    return Queue(tuple(pending), {n: tuple(r) for n, r in running.items()}, untyped)
