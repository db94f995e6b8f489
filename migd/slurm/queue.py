"""Slurm's queue as the demand rule reads it: pending requests and running jobs, per MIG type.

From one ``scontrol show job -o -d`` (every job, one RPC) and one ``scontrol show node -o``.  A job
asks for MIG instances with ``--gres`` (``TresPerNode=gres:gpu:1g.10gb:2``), ``--gpus``
(``TresPerJob``), ``--gpus-per-node`` (``TresPerNode``) or ``--gpus-per-task`` (``TresPerTask``,
times its tasks); Slurm 22.05 prints ``gres:gpu:TYPE:N``, later releases ``gres/gpu:TYPE=N``: both
are read.  A running job's instances on a node are what Slurm allocated there (the ``-d`` detail).
Held jobs are not demand (they start only when released).  Times are slurmctld's local time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from migd.demand.inputs import Pending, Running
from migd.slurm.ctl import allocated_gres, bounded_hostnames, fields

_TRES = re.compile(r"gres[:/]gpu:([^:=,\s]+)[:=]([0-9]{1,9})\b", re.ASCII)
_ALLOC = re.compile(r"gpu:([^:(,\s]+):([0-9]{1,9})\b", re.ASCII)
# squeue(1) reason codes of a job not yet eligible (Dependency, DependencyNeverSatisfied, BeginTime): Slurm's
# backfill does not test it, so it reserves no node (demand/reserve.py), though its work is still wanted
WAITING_ON = ("Dependency", "BeginTime")


@dataclass(frozen=True)
class Queue:
    pending: tuple[Pending, ...]
    running: dict[str, tuple[Running, ...]]  # node -> its running GPU jobs
    untyped: int  # pending jobs asking for GPUs without a MIG type (no layout can be chosen for them)


def seconds(limit: str) -> float:
    """A Slurm time (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``MM``; UNLIMITED: infinite)."""
    if limit.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT", ""):
        return float("inf")
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


def _when(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _asked(f: dict[str, str]) -> list[tuple[str, int]]:
    """(MIG type, instances per node) a pending job asks for; untyped requests as type ''."""
    nodes = max(1, int(f.get("NumNodes", "1").split("-")[0] or 1))
    tasks = max(1, int(f.get("NumTasks", "1") or 1))
    out = []
    for key, times, per in (("TresPerNode", 1, 1), ("TresPerJob", 1, nodes), ("TresPerTask", tasks, nodes)):
        value = f.get(key, "")
        typed = _TRES.findall(value)
        out += [(t, max(1, int(n) * times // per)) for t, n in typed]
        if not typed and re.search(r"gres[:/]gpu[:=][0-9]", value):
            out.append(("", 0))
    return out


def read_queue(jobs_output: str, partition: str, now: float) -> Queue:
    pending: list[Pending] = []
    running: dict[str, list[Running]] = {}
    untyped = 0
    for line in jobs_output.splitlines():
        f = fields(line)
        if not f.get("JobId") or partition not in f.get("Partition", "").split(","):
            continue
        state, job, account = f.get("JobState", ""), f["JobId"], f.get("Account", "(null)")
        account = "-" if account == "(null)" else account
        limit = seconds(f.get("TimeLimit", ""))
        submitted = _when(f.get("SubmitTime", "")) or now
        if state == "PENDING" and not f.get("Reason", "").startswith("JobHeld"):
            for mig_type, count in _asked(f):
                if not mig_type:
                    untyped += 1
                    continue
                pending.append(Pending(job, account, mig_type, count, limit, int(f.get("Priority", "0") or 0),
                                       max(0.0, now - submitted), not f.get("Reason", "").startswith(WAITING_ON)))
        elif state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
            end = _when(f.get("EndTime", "")) or now + limit
            for node in _nodes_of(line):
                for mig_type, count in _ALLOC.findall(allocated_gres(line, node)):
                    running.setdefault(node, []).append(Running(job, mig_type, int(count), max(0.0, end - now),
                                                                account, max(0.0, now - submitted), limit))
    return Queue(tuple(pending), {n: tuple(r) for n, r in running.items()}, untyped)


def _nodes_of(line: str) -> list[str]:
    """The nodes a job's ``-d`` detail names (each ``Nodes=`` entry; hostlists as one entry each)."""
    return sorted({n for m in re.finditer(r"\bNodes=(\S+) CPU_IDs=", line) for n in _expand(m.group(1))})


def _expand(expr: str) -> list[str]:
    return sorted(bounded_hostnames(expr) or {expr})
