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
  (``_add_reservation`` removes the node from the plan: a younger job of another MIG type waits too);
- of a pending array, only the first ``bf_max_job_array_resv`` (20) tasks reserve: the pass tries the
  array's next task after a reservation only while ``test_array_count`` is below it (a task that starts
  is followed by the next whatever the count), and the tasks left start when they can, as the main
  scheduler starts them, counting for none of ``bf_max_job_test`` (``reserve.backfill_tests``; the
  model takes an array's first 20 tasks as those tested, though one that starts lets Slurm try one more);
- a job over N nodes is one job, and one of ``bf_max_job_test`` (its queue record is counted once):
  its estimate is the first moment N nodes have its instances free (the jobs removed until cons_tres's
  test passes on N nodes, in the batches above), it starts on all N at once or not at all, and it
  reserves all N whole nodes (``_add_reservation`` over the job's node bitmap).
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

from migd.demand.reserve import backfill_tests
from migd.whatif.fleet import Job, Node
from migd.whatif.place import best_nodes

WILL_RUN_WINDOW_S = 30  # cons_tres _will_run's first window (doubled for each batch after it)
_TRIES = 64  # TRY_LATER rounds for one job (each moves its earliest start on)
YEAR_S = 365 * 24 * 3600.0  # a running job with no time limit is expected to end this long after its start
_EPS = 1e-6  # margin on a moment computed as a sum (now + limit), so a skip is never taken late

Running = list[tuple[float, str, Job]]
Placed = tuple[float, tuple[int, ...]] | None  # (when, node indices): at ``now``, a start; later, a reservation;
# None: neither
Key = tuple[int, str, int, int]  # an estimate's question: (nodes open, a bit each by index; MIG type; count; nodes)
Asked = tuple[tuple[Key, Any], ...]  # the estimates a walk read, with what they said
Estimate = tuple[float, tuple[Node, ...]] | None  # cons_tres's: when, on which nodes; None: never
Pass = Callable[[list[Node], dict[str, list[Job]], float, float], None]  # (nodes, pending, now, epoch_s)


class Backfill:
    """The pass the model runs every step, which does the work of one only when its outcome can differ
    from the last one's: when something it reads changed (the first ``BF_MAX_JOB_TEST`` pending jobs, a
    node's layout, drain, switch or running jobs) or the clock reached a moment one of its comparisons
    with ``now`` turns at (a reservation's end, a reservation's start minus a job's limit, an expected
    start).  Between those the pass is a function of nothing that moved, so it would start nothing again
    (a pass that starts a job changes what it reads).  A pass that is run takes from the last one each
    job's place that still holds (``_Pass.run``).  The result is the same job for job as a pass made
    afresh every step; this is what makes Slurm's reservations affordable over the bench's traces."""

    def __init__(self) -> None:
        self._reads: Any = None
        self._until = -math.inf
        self._notes: dict[int, _Note] = {}  # the last pass's, per job
        self._frame: Any = None  # what the notes hold for: the nodes, those usable, the clock's epoch
        self.passes = 0  # passes whose work was done (the rest were skipped)

    def __call__(self, nodes: list[Node], pending: dict[str, list[Job]], now: float, epoch_s: float) -> None:
        tested, past = backfill_tests(sorted((j for q in pending.values() for j in q), key=lambda j: j.spec.submit_s),
                                      lambda j: j.spec.job or str(id(j)))  # (a job with no id: one of its own)
        queue = tested + past  # (the array tasks past those tested: started where they fit, reserving nothing)
        reads = (epoch_s, tuple(queue), tuple((n.name, n.layout, n.target, n.ready_at, tuple(n.running),
                                               tuple(j.start for j in n.running)) for n in nodes))
        if now < self._until and reads == self._reads:
            return
        p = _Pass(nodes, now, epoch_s)
        p.start_only = {id(j) for j in past}
        frame = (tuple(map(id, nodes)), tuple(p.usable), epoch_s)
        self.passes += 1
        started = p.run(queue, self._notes if frame == self._frame else {})
        self._reads, self._until = (None, -math.inf) if started else (reads, p.until)
        self._notes, self._frame = p.notes, frame
        if started:
            for t, q in pending.items():
                pending[t] = [j for j in q if id(j) not in started]


def backfill(nodes: list[Node], pending: dict[str, list[Job]], now: float, epoch_s: float) -> None:
    """One pass over ``pending`` (MIG type -> its queue): start what may start now, reserve a node for
    the rest (the plan lives one pass).  ``epoch_s``: the wall clock at time 0."""
    Backfill()(nodes, pending, now, epoch_s)


@dataclass(frozen=True)
class _Note:
    """What one job's place was, and what it was found from: the estimates read (the plan before it
    aside) and the first moment a comparison with ``now`` it made would turn."""

    job: Job
    placed: Placed
    asked: Asked
    until: float
    made: int  # reservations the pass had made before it (the plan it was placed in)


class _Pass:
    """One pass's plan: each node's reservations, disjoint (a node is reserved only where it has none),
    so kept sorted, begins and ends alike, and searched by bisection; cons_tres's estimates, kept while
    no job starts (they read only the running jobs); ``until``: the first moment a comparison this pass
    made with ``now`` would turn."""

    def __init__(self, nodes: list[Node], now: float, epoch_s: float) -> None:
        self.nodes, self.now, self.epoch_s = nodes, now, epoch_s
        self.usable = [i for i, n in enumerate(nodes) if n.target is None and n.ready_at is None]  # drained: out
        self.index = {id(n): i for i, n in enumerate(nodes)}
        self.begins: list[list[float]] = [[] for _ in nodes]
        self.ends: list[list[float]] = [[] for _ in nodes]
        self.rows = [(i, self.begins[i], self.ends[i]) for i in self.usable]
        self.estimates: dict[Key, Estimate] = {}
        self.running: Running | None = None
        self.nowhere: dict[tuple[str, int, int, float], tuple[float, Asked, float]] = {}  # a shape that found no
        # place -> how far its walk looked, what it read, when a comparison it made turns
        self.notes: dict[int, _Note] = {}
        self.made = 0
        self.until = math.inf
        self.start_only: set[int] = set()  # the jobs that start where they fit and reserve nothing

    def run(self, queue: list[Job], before: dict[int, _Note]) -> set[int]:
        """The pass over ``queue``.  ``before``: the last pass's notes, over the same nodes.  While every
        job so far was placed as then and the plan holds as many reservations as then (so it is the plan
        it was), a job whose estimates still say what they said and whose comparisons with ``now`` have
        not turned is placed as then, without a walk."""
        started: set[int] = set()
        same = True
        for job in queue:
            note = before.get(id(job)) if same else None
            if note is not None and note.job is job and note.made == self.made and self.still(note):
                placed = note.placed
                self.notes[id(job)] = note
                self.until = min(self.until, note.until)
            else:
                placed = self.place(job)  # (the same plan on only if it reserves what it did; a start differs)
                same = same and placed == (note.placed if note is not None else None) and not (
                    placed is not None and placed[0] <= self.now)
            if placed is None:
                continue
            at, where = placed
            if at <= self.now:
                job.start, job.nodes = self.now, tuple(self.nodes[i].name for i in where)
                for i in where:
                    self.nodes[i].running.append(job)
                started.add(id(job))
                self.estimates, self.running, self.nowhere = {}, None, {}
            elif id(job) in self.start_only:  # (an array's task past those tested: backfill_tests)
                continue
            else:
                self.nowhere = {shape: got for shape, got in self.nowhere.items() if got[0] < at}
                self.made += 1
                for i in where:
                    x = bisect_right(self.ends[i], at)
                    self.begins[i].insert(x, at)
                    insort(self.ends[i], at + job.spec.time_limit_s)
        return started

    def still(self, note: _Note) -> bool:
        """Whether a job's last place holds: ``now`` before its turn, its estimates unchanged."""
        return self.now < note.until and all(self.estimate(*key) == said for key, said in note.asked)

    def place(self, job: Job) -> Placed:
        """Where and when ``job`` starts (``now``: at once) by Slurm's plan; None: no reservation.  A job
        of the shape of one that found no place finds none either while no job has started and no
        reservation was added within the reach of that one's walk (its every test would be the same)."""
        shape = (job.spec.gres, job.spec.count, job.spec.nodes, job.spec.time_limit_s)
        outer, self.until = self.until, math.inf
        self.turning(shape[3])  # (over the plan as it is now, whether or not the job walks)
        if shape in self.nowhere:
            placed, (_, asked, turn) = None, self.nowhere[shape]
            self.until = min(self.until, turn)
        else:
            placed, reach, asked = self.walk(*shape)
            if placed is None:
                self.nowhere[shape] = reach, asked, self.until
        self.notes[id(job)] = _Note(job, placed, asked, self.until, self.made)
        self.until = min(outer, self.until)
        return placed

    def walk(self, t: str, k: int, n: int, limit: float) -> tuple[Placed, float, Asked]:
        """Slurm's tries for a job of MIG type ``t``, ``k`` instances on each of ``n`` nodes, ``limit``:
        where and when it starts (None: nowhere), the latest moment a reservation was looked for up to,
        the estimates read."""
        placed, reach, asked = self._walk(t, k, n, limit)
        return placed, reach, tuple((key, self.estimates[key]) for key in asked)

    def _walk(self, t: str, k: int, n: int, limit: float) -> tuple[Placed, float, set[Key]]:
        s, reach, asked = self.now, -math.inf, set()
        sweep = _Sweep(self.rows, s, limit)
        for _ in range(_TRIES):
            reach = max(reach, s + limit)
            avail, later = sweep.move(s)
            key = (avail, t, k, n)
            asked.add(key)
            got = self.estimates[key] if key in self.estimates else self.estimate(*key)
            if got is None:
                if later is None:
                    return None, reach, asked
                s = later
                continue
            at, where = max(s, got[0]), tuple(self.index[id(x)] for x in got[1])
            if at <= self.now:
                return (self.now, where), reach, asked
            if at < self.until:
                self.until = at
            if later is not None and at > later:
                s = later
                continue
            reach = max(reach, at + limit)
            if self.meets(where, at, at + limit):
                s = at
            else:
                return (at, where), reach, asked
        return None, reach, asked

    def meets(self, where: tuple[int, ...], start: float, end: float) -> bool:
        """Whether a node of ``where`` has a reservation [b, e) with b <= end and e > start (``overlaps``)."""
        for i in where:
            x = bisect_right(self.ends[i], start)
            if x < len(self.begins[i]) and self.begins[i][x] <= end:
                return True
        return False

    def turning(self, limit: float) -> None:
        """When the first test of a job of ``limit`` would turn: a reservation's end passed, or one's
        begin reached by ``now`` plus the limit."""
        end = self.now + limit
        for _, begins, ends in self.rows:
            x, y = bisect_right(ends, self.now), bisect_right(begins, end)
            self.until = min(self.until, ends[x] if x < len(ends) else math.inf,
                             begins[y] - limit - _EPS if y < len(begins) else math.inf)

    def estimate(self, avail: int, mig_type: str, count: int, nodes: int) -> Estimate:
        key = (avail, mig_type, count, nodes)
        if key not in self.estimates:
            if self.running is None:
                self.running = by_limit_end(self.nodes)
            self.estimates[key] = will_run(self.nodes, [self.nodes[i] for i in self.usable if avail >> i & 1],
                                           mig_type, count, self.now, self.epoch_s, self.running, nodes)
        return self.estimates[key]


class _Sweep:
    """The usable nodes open to one job over [start, start + limit] as its tries move the start on (a
    walk's start only grows): a node held by a reservation waits in a heap by that reservation's end,
    an open one by its next reservation's begin, so a try looks only at the nodes whose state turns
    (a reservation [b, e) holds the node over [start, end] if b <= end and e > start: ``overlaps``)."""

    def __init__(self, rows: list[tuple[int, list[float], list[float]]], start: float, limit: float) -> None:
        self.limit, self.open = limit, 0  # (open nodes: a bit each, by index)
        self.rows = {i: (begins, ends) for i, begins, ends in rows}
        self.next: dict[int, int] = {}  # node -> its first reservation ending after the start
        self.held: list[tuple[float, int]] = []  # (end of the reservation holding it, node)
        self.free: list[tuple[float, int]] = []  # (begin of its next reservation, node)
        for i, _, ends in rows:
            self.settle(i, bisect_right(ends, start), start + limit)

    def settle(self, i: int, x: int, end: float) -> None:
        begins, ends = self.rows[i]
        self.next[i] = x
        if x < len(begins) and begins[x] <= end:
            heappush(self.held, (ends[x], i))
            self.open &= ~(1 << i)
        else:
            self.open |= 1 << i
            if x < len(begins):
                heappush(self.free, (begins[x], i))

    def move(self, start: float) -> tuple[int, float | None]:
        """The nodes open over [start, start + limit], and the first end of a reservation that meets
        it (None: none does)."""
        end, turned = start + self.limit, []
        while self.held and self.held[0][0] <= start:
            turned.append(heappop(self.held)[1])
        while self.free and self.free[0][0] <= end:
            turned.append(heappop(self.free)[1])
        for i in turned:
            self.settle(i, bisect_right(self.rows[i][1], start, self.next[i]), end)
        return self.open, self.held[0][0] if self.held else None


def will_run(every: list[Node], nodes: list[Node], mig_type: str, count: int, now: float,
             epoch_s: float, running: Running | None = None, wanted: int = 1) -> Estimate:
    """cons_tres's estimate on ``nodes`` for ``count`` instances on each of ``wanted`` nodes: ``now`` if
    that many have them free, else the end (by time limit) of the last job of the batch whose removal
    frees them; None: never on these nodes.  The nodes are cons_tres's best fit then (place.py: in a
    batch's estimate, the jobs removed no longer count).
    Every running job (``every`` node's) is walked in order of its limit's end; one on a node not in
    ``nodes`` is passed over without ending the batch, so a batch reaches past it (Slurm's loop
    ``continue``s before its window test).  ``running``: ``by_limit_end(every)``, if already sorted."""
    used = {n.name: sum(j.spec.count for j in n.running if j.spec.gres == mig_type) for n in nodes}
    left = {n.name: len(n.running) for n in nodes}  # jobs each still runs (its CPUs in use)

    def fit() -> tuple[Node, ...] | None:
        got = best_nodes(every, {n.name for n in nodes if n.layout.count(mig_type) - used[n.name] >= count},
                         wanted, lambda n: left[n.name])
        return None if got is None else tuple(got)

    if (node := fit()) is not None:
        return now, node
    if sum(1 for n in nodes if n.layout.count(mig_type) >= count) < wanted:
        return None
    if running is None:
        running = by_limit_end(every)
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
            left[name] -= 1
            if j.spec.gres == mig_type:
                used[name] -= j.spec.count
            if i >= len(running) or running[i][0] > barrier + window:
                break
        if last is None or barrier is None:
            return None
        window *= 2
        while i < len(running) and running[i][0] > barrier + window:
            window *= 2
        if (node := fit()) is not None:
            return last, node
    return None


def overlaps(windows: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether [start, end] meets a reserved window [b, e) (Slurm: a window beginning as the job's limit
    ends still counts)."""
    return any(b <= end and e > start for b, e in windows)


def by_limit_end(nodes: list[Node]) -> Running:
    """Every running job with its node, in order of its limit's end (ties: node, then start order)."""
    return sorted(((_limit_end(j), n.name, j) for n in nodes for j in n.running), key=lambda x: x[0])


def _limit_end(j: Job) -> float:
    """When Slurm expects a running job to end: its start plus its limit, or a year on for an unlimited
    one (slurmctld's job_end_time_reset: ``start_time + 365 * 24 * 60 * 60``)."""
    assert j.start is not None
    return j.start + (j.spec.time_limit_s if math.isfinite(j.spec.time_limit_s) else YEAR_S)
