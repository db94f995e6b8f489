"""Slurm's whole-node reservations, as the demand rule weighs them.

Under sched/backfill, Slurm's default scheduler, every pending job that cannot start now, in priority
order (priority/basic: submission order), at most ``bf_max_job_test`` of them, reserves a whole node
from its expected start to that plus its time limit: ``_add_reservation`` in
src/plugins/sched/backfill/backfill.c takes the node out of the plan for that window.  A younger job
starts on that node only if its own time limit ends before the reservation begins, whatever MIG type
it asks and however many of the node's instances are free.  So on a node that offers several MIG
types, one type's free instances serve it only while the older pending jobs of the node's other types
have not reserved the node: on a node mixed for a minority (``night*7/balanced``), the majority's queue
keeps the minority off its GPU.  The replay on real Slurm checks this model job by job
(migd/whatif/backfill.py, docs/demand.md).  sched/builtin, the other scheduler, is stricter still: no
job past the first that cannot start is started at all.

The rule weighs it as an expectation: the node is held for the older pending jobs of its other types
that the fleet's free instances of their type cannot start at once (a job that starts reserves
nothing), for as long as the fleet's supply of those types takes to run them, and a type's supply on
the node is what is left of the horizon (``share``).  Which node each job reserves is Slurm's choice
at each pass; the expectation spreads it over every node offering the type.  Per node that is first
come, first served across the types it offers, as Slurm's priority order makes it; whole nodes of one
type lose nothing to it (their own type's jobs start in priority order anyway), and a node mixed for a
minority behind a long queue of its majority's older jobs offers the minority little.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from migd.demand.inputs import Layout, Pending

_DIGITS = re.compile(r"([0-9]+)", re.ASCII)  # (split: text at even places, digit runs at odd ones, for every id)
BF_MAX_JOB_TEST = 500  # slurm.conf(5) bf_max_job_test's default: jobs past it reserve nothing
BF_MAX_JOB_ARRAY_RESV = 20  # slurm.conf(5) bf_max_job_array_resv's default: a pending array's tasks past it
# are not tested in a backfill pass (backfill.c tries the array's next task only while test_array_count is below it)


T = TypeVar("T")
Work = Callable[[Pending], float]  # a pending job's slice-hours within the horizon


@dataclass(frozen=True)
class Ahead:
    """Per MIG type, the work (slice-hours) of each other type's pending jobs that Slurm tests before that
    type's oldest pending job (all of it, for a type with none pending: its next job comes last)."""

    before: Mapping[str, Mapping[str, tuple[float, int]]]  # MIG type -> other type -> (work, instances) ahead
    everyone: Mapping[str, tuple[float, int]]  # type -> all its pending (work, instances) tested

    @classmethod
    def of(cls, pending: Iterable[Pending], work: Work) -> Ahead:
        """What is ahead of whom in the order Slurm's backfill tests pending jobs: priority first, then
        submission, then job id (numerically: 999 before 1000, 12_2 before 12_10); a job waiting on a
        dependency or its begin time is not tested and reserves nothing."""
        queue = _reserving(pending)
        before: dict[str, dict[str, tuple[float, int]]] = {}
        seen: dict[str, tuple[float, int]] = defaultdict(lambda: (0.0, 0))
        for p in queue:
            if p.mig_type not in before:  # its oldest: what is ahead of it is what came before
                before[p.mig_type] = {t: w for t, w in seen.items() if t != p.mig_type}
            w, n = seen[p.mig_type]
            seen[p.mig_type] = (w + work(p), n + p.count * p.nodes)
        return cls(before, dict(seen))

    def share(self, layout: Layout, mig_type: str, supply: Mapping[str, float], free: Mapping[str, int]) -> float:
        """The share of ``mig_type``'s slice-hours in ``layout`` that older jobs of the layout's other
        types leave: those the fleet's ``free`` instances of their type cannot start at once reserve,
        and hold the node for the part of the horizon the fleet's ``supply`` of their type (slice-hours
        before reservations) takes to run them."""
        held = 0.0
        for t, (w, n) in self.before.get(mig_type, self.everyone).items():
            if t != mig_type and w > 0 and n > 0 and layout.count(t) > 0:
                waiting = w * max(0, n - free.get(t, 0)) / n
                held += waiting / supply[t] if supply.get(t, 0.0) > 0 else float(waiting > 0)
        return max(0.0, 1.0 - held)

    @property
    def holds(self) -> bool:
        """Whether any pending job may hold a node (none: a node's supply is all its own)."""
        return bool(self.everyone)


def tested(pending: Iterable[Pending]) -> list[Pending]:
    """The pending jobs Slurm's backfill tests, in its order: those it may start (no dependency or begin
    time to wait for), by ``priority_order``, at most ``BF_MAX_JOB_TEST``."""
    return _in_order(pending)[:BF_MAX_JOB_TEST]  # (requests: what the replay check weighs stays bounded however
    # many nodes a job spans)


def _in_order(pending: Iterable[Pending]) -> list[Pending]:
    """Those Slurm's backfill may start (no dependency or begin time to wait for), in its order."""
    return sorted((p for p in pending if p.startable), key=priority_order)


def first_jobs(queue: list[T], job_of: Callable[[T], Hashable]) -> list[T]:
    """The requests of the first ``BF_MAX_JOB_TEST`` jobs (``job_of``: a request's job): a job asking two
    MIG types is two requests and one test.  The queue model's backfill counts its jobs by the same rule."""
    seen: set[Hashable] = set()
    for i, p in enumerate(queue):
        seen.add(job_of(p))
        if len(seen) > BF_MAX_JOB_TEST:
            return queue[:i]
    return queue


def _reserving(pending: Iterable[Pending]) -> list[Pending]:
    """The jobs Slurm's backfill tests, so that they may reserve a node (:func:`backfill_tests`)."""
    return backfill_tests(_in_order(pending), lambda p: p.job)[0]


def backfill_tests(queue: list[T], job_of: Callable[[T], str]) -> tuple[list[T], list[T]]:
    """``queue`` (in Slurm's order) as one backfill pass takes it: the requests it tests, which may reserve
    a node, and the array tasks it leaves to the main scheduler, which starts them where they fit.  Of each
    array only its first ``BF_MAX_JOB_ARRAY_RESV`` tasks are tested (an array is one record of Slurm's
    queue, its tasks tried in turn up to that many reservations: a task that starts at once lets one more
    be tried, which this leaves out), and ``BF_MAX_JOB_TEST`` jobs are counted over what is left (so a
    thousand-task array does not take every test from the jobs behind it)."""
    tasks: dict[str, set[str]] = defaultdict(set)
    tested, past = [], []
    for p in queue:
        array = array_of(job_of(p))
        if array is not None:
            tasks[array].add(job_of(p))  # (a task over N nodes, or asking two types, is one task)
            if len(tasks[array]) > BF_MAX_JOB_ARRAY_RESV:
                past.append(p)
                continue
        tested.append(p)
    return first_jobs(tested, job_of), past


def array_of(job: str) -> str | None:
    """The array a job id's task belongs to (``12`` for ``12_3``, as Slurm names a task); None for a job
    that is no array's task."""
    array, task, _ = job.partition("_")
    return array if task else None


def priority_order(p: Pending) -> tuple[int, float, tuple[str | int, ...]]:
    """The order Slurm's backfill tests pending jobs in (``Ahead.of``): the sort key."""
    return -p.priority, -p.age_s, tuple(int(x) if i % 2 else x for i, x in enumerate(_DIGITS.split(p.job)))


NONE = Ahead({}, {})  # no reservations weighed: the bench's plain model, where none are made
