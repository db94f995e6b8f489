"""One reader for ``squeue --json`` (Slurm's openapi job records; 22.05 recorded, the shapes of later
releases read too): the jobs, each job's state, and what Slurm allocated it on each node.

JSON, not ``scontrol show job -o``: that line is ``Key=Value`` pairs split at spaces, and a job's name,
comment, working directory and output paths are the user's own text printed among them, so a CPU-only
job named ``x Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:1g.10gb:1`` held GPUs there (a switch waited for it)
and one named ``x TresPerNode=gres:gpu:3g.40gb:2`` asked for them.  Here each is a string of its own.
The planner's queue (queue.py) and a node's own switch (``SlurmCtl.jobs``) read jobs through here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from migd.numeral import MOST_DIGITS
from migd.slurm.hostlist import bounded_hostnames
from migd.wire import JsonError, loads

# Job states that hold an allocation (squeue(1) JOB STATE CODES): STOPPED is SIGSTOP, its CPUs and GRES kept;
# STAGE_OUT is staging files out, its nodes not yet released; 22.05 writes a running job's flag in place of its
# state (job_state_string: SIGNALING while slurmctld signals it, RESIZING while it changes size)
ACTIVE = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "STAGE_OUT", "SIGNALING",
                    "RESIZING"})
INFINITE = 0xFFFFFFFE  # slurm.h NO_VAL (0xfffffffe) and INFINITE (0xffffffff): no time limit
MOST = 10**MOST_DIGITS - 1  # the largest number read, as migd.numeral reads text: a float of it stays a time


def read_jobs(text: str) -> list[Mapping[str, Any]]:
    """The job records of ``squeue --json``'s output; ValueError for output that is not that document."""
    try:
        doc = loads(text)
    except JsonError as e:
        raise ValueError(str(e)) from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise ValueError("no list of jobs in its output")
    return [j for j in jobs if isinstance(j, dict)]


def number(value: Any) -> int | None:
    """An integer field: 22.05 writes a number, later releases ``{"set": .., "infinite": .., "number": ..}``
    (None: not set; -1: infinite)."""
    if isinstance(value, dict):
        if value.get("infinite") is True:
            return -1
        return number(value.get("number")) if value.get("set", True) is True else None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MOST:
        return value
    return None  # (past 18 digits no Slurm field: job ids are 32 bits, times 64-bit seconds of this era)


def text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def states(job: Mapping[str, Any]) -> frozenset[str]:
    """The job's state and its flags: 22.05 writes one word (``COMPLETING``), later releases a list whose
    first entry is the base state and the rest flags (``["COMPLETED", "COMPLETING"]``)."""
    state = job.get("job_state")
    return frozenset(s for s in state if isinstance(s, str)) if isinstance(state, list) else frozenset({text(state)})


def active(job: Mapping[str, Any]) -> bool:
    """Whether the job holds its allocation (a completing job still does: its flag counts)."""
    return bool(states(job) & ACTIVE)


def limit_s(job: Mapping[str, Any]) -> float:
    minutes = number(job.get("time_limit"))
    return float("inf") if minutes is None or minutes < 0 or minutes >= INFINITE else minutes * 60.0


def job_id(job: Mapping[str, Any]) -> str:
    found = number(job.get("job_id"))
    return "" if found is None else str(found)


def allocations(job: Mapping[str, Any]) -> Iterator[tuple[str | None, str]]:
    """(node, the GRES Slurm allocated the job there), one per node of the job: ``gres_detail`` has a slot per
    allocated node in the job's node order, null where the job holds no GRES (slurmctld's
    ``gres_detail_str``), named by ``job_resources`` (22.05: ``allocated_nodes[].nodename``; 23.11 on:
    ``nodes.allocation[].name``) or by a one-node ``nodes``.  A node not named is None: the GRES is held
    somewhere the reader cannot place (never assume it free)."""
    listed = job.get("gres_detail")
    listed = [] if listed is None else listed
    if not isinstance(listed, list):  # (a string would be walked a character at a time: no GPU held, a switch
        raise ValueError(f"job {job_id(job) or '?'}: gres_detail is not a list")  # under the job)
    detail = [d if isinstance(d, str) else "" for d in listed]
    names = _node_names(job)
    for i, gres in enumerate(detail):
        yield (names[i] if i < len(names) else None), gres


def _node_names(job: Mapping[str, Any]) -> list[str]:
    resources = job.get("job_resources")
    if isinstance(resources, dict):
        listed = resources.get("allocated_nodes")
        if not isinstance(listed, list):
            nodes = resources.get("nodes")
            listed = nodes.get("allocation") if isinstance(nodes, dict) else None
        if isinstance(listed, list):
            return [text(n.get("nodename") or n.get("name")) for n in listed if isinstance(n, dict)]
    hosts = bounded_hostnames(text(job.get("nodes")))
    return sorted(hosts) if hosts is not None and len(hosts) == 1 else []


def on_node(text_: str, node: str) -> list[tuple[str, str, str]]:
    """(job, state, GRES held on ``node``) of every active job with part of its allocation there (its
    GRES where it cannot be placed: counted on every node of the job)."""
    out = []
    for job in read_jobs(text_):
        hosts = bounded_hostnames(text(job.get("nodes")))
        if not active(job) or (hosts is not None and node not in hosts):
            continue  # (a hostlist not read here: the job may be on this node)
        held = [g for n, g in allocations(job) if n in (node, None) and g]
        out.append((job_id(job), "+".join(sorted(states(job))), ",".join(held)))
    return out
