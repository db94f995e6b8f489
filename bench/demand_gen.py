"""Generated job traces for bench/demand.py (seeded: the same arguments give the same jobs).

A generated trace is a model of demand written here, not evidence about any site: it shows how the
policies behave on that model, and each is built to test one claim.

- ``synthetic``: four departments as shared-GPU sites describe them: notebooks (1g, 10-120 min) in
  working hours with two class bursts on weekdays; inference (2g, 1-3 h) by day; vision training
  (2 x 3g, 2-6 h) with an evening peak; language-model training (1-4 x 7g, 3-10 h) mostly submitted
  in the evening; a quiet weekend (by the calendar, from the trace's start date).
- ``shifting``: the same four departments, but which one is busy changes in phases of 8-30 hours
  that ignore the clock (a deadline, a course's project week, a new service): a fixed mix or a
  schedule is wrong for most phases.  The fleet is asked for about 85% of its slices.
- ``clock-right``: demand the configured schedule fits: notebooks only in working hours on weekdays,
  whole-GPU training only at night, two-instance training at the weekend (about 70% of the slices).

Rates scale with the node count.  Time limits are 1.2-2x the run time, rounded up to 10 minutes,
as users pad them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from demand_trace import DAY, Trace, TraceJob

from migd.demand.inputs import slices_of

THURSDAY = datetime(2026, 11, 26)  # the synthetic trace's start (a Thursday: two weekdays, a weekend)
MONDAY = datetime(2026, 11, 30)


@dataclass(frozen=True)
class Stream:
    """One department's arrivals: jobs per node per hour in each period (weekday day/evening/night,
    weekend), the MIG type, instances per job and run time range (minutes)."""

    account: str
    gres: str
    counts: tuple[int, ...]
    minutes: tuple[float, float]
    day: float = 0.0
    evening: float = 0.0
    night: float = 0.0
    weekend: float = 0.0

    @property
    def slice_hours(self) -> float:
        """The mean slice-hours one of its jobs brings."""
        return slices_of(self.gres) * sum(self.counts) / len(self.counts) * sum(self.minutes) / 2 / 60


STREAMS = (  # sized so a node (8 GPUs, 56 slices) is about fully asked for by day and in the evening
    Stream("teaching", "1g.10gb", (1,), (10, 120), day=22, evening=3, night=0.3, weekend=1),
    Stream("serving", "2g.20gb", (1,), (60, 180), day=3, evening=1, night=0.3, weekend=0.5),
    Stream("vision", "3g.40gb", (2,), (120, 360), day=0.3, evening=0.6, night=0.1, weekend=0.1),
    Stream("nlp", "7g.80gb", (1, 2, 2, 4), (180, 600), day=0.1, evening=0.45, night=0.05, weekend=0.05),
)
BURSTS = ((10 * 3600.0, "teaching"), (14 * 3600.0, "teaching"))  # a class starts its notebooks at once
NODE_SLICES = 56


def _weekend(start: datetime, t: float) -> bool:
    return (start + timedelta(seconds=t)).weekday() >= 5


def _synthetic_rate(s: Stream, start: datetime, t: float) -> float:
    if _weekend(start, t):
        return s.weekend
    wall = start + timedelta(seconds=t)
    hour = wall.hour + wall.minute / 60
    if 8.5 <= hour < 18.5:
        return s.day
    return s.evening if 18.5 <= hour < 23 else s.night


def synthetic(nodes: int, days: int, seed: int = 7, start: datetime = THURSDAY) -> Trace:
    """Arrivals minute by minute (Poisson per stream), plus the class bursts on weekdays."""
    rng = random.Random(seed * 1000 + nodes)
    jobs = _arrivals(rng, days, nodes, lambda s, t: _synthetic_rate(s, start, t))
    for d in range(days):
        if _weekend(start, d * DAY):
            continue
        for at, account in BURSTS:
            s = next(x for x in STREAMS if x.account == account)
            jobs += [_job(rng, s, d * DAY + at + rng.uniform(0, 600)) for _ in range(10 * nodes)]
    return Trace("synthetic", _sorted(jobs), start)


def shifting(nodes: int, days: int, seed: int = 11, start: datetime = MONDAY) -> Trace:
    """Phases of 8-30 hours, each with one department four times as busy as in the mean and the others
    at half; the fleet asked for 85% of its slices throughout."""
    rng = random.Random(seed * 1000 + nodes)
    phases: list[tuple[float, str]] = []  # (phase ends at, the busy department)
    t = 0.0
    while t < days * DAY:
        t += rng.uniform(8, 30) * 3600
        phases.append((t, rng.choice(STREAMS).account))

    def rate(s: Stream, at: float) -> float:
        hot = next(account for end, account in phases if at < end)
        weights = {x.account: 4.0 if x.account == hot else 0.5 for x in STREAMS}
        return 0.85 * NODE_SLICES * weights[s.account] / sum(weights.values()) / s.slice_hours
    return Trace("shifting", _sorted(_arrivals(rng, days, nodes, rate)), start)


def clock_right(nodes: int, days: int, seed: int = 13, start: datetime = MONDAY) -> Trace:
    """Notebooks 08:30-18:30 on weekdays, whole-GPU training submitted 19:00-06:00 on weekdays (so it
    ends by morning), two-instance training at the weekend; each about 70% of the node's slices."""
    streams = {"teaching": Stream("teaching", "1g.10gb", (1,), (10, 120)),
               "nlp": Stream("nlp", "7g.80gb", (1, 2), (120, 420)),
               "vision": Stream("vision", "3g.40gb", (2,), (120, 480))}
    rng = random.Random(seed * 1000 + nodes)

    def rate(s: Stream, at: float) -> float:
        wall = start + timedelta(seconds=at)
        hour = wall.hour + wall.minute / 60
        if wall.weekday() >= 5:
            busy = "vision"
        else:
            busy = "teaching" if 8.5 <= hour < 18.5 else ("nlp" if hour >= 19 or hour < 6 else "")
        return 0.7 * NODE_SLICES / s.slice_hours if s.account == busy else 0.0
    return Trace("clock-right", _sorted(_arrivals(rng, days, nodes, rate, tuple(streams.values()))), start, True)


def _arrivals(rng: random.Random, days: int, nodes: int, rate: Callable[[Stream, float], float],
              streams: tuple[Stream, ...] = STREAMS) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    for minute in range(int(days * DAY / 60)):
        t = minute * 60.0
        for s in streams:
            for _ in range(poisson(rng, rate(s, t) * nodes / 60)):
                jobs.append(_job(rng, s, t + rng.uniform(0, 60)))
    return jobs


def _sorted(jobs: list[TraceJob]) -> tuple[TraceJob, ...]:
    return tuple(sorted(jobs, key=lambda j: (j.submit_s, j.account)))


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw with mean ``lam`` (Knuth's product of uniforms: small means, one stream of draws)."""
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _job(rng: random.Random, s: Stream, t: float) -> TraceJob:
    run = rng.uniform(*s.minutes) * 60
    limit = math.ceil(run * rng.uniform(1.2, 2.0) / 600) * 600
    return TraceJob(round(t, 1), s.account, "gpu", s.gres, rng.choice(s.counts), round(run), limit)


def over_two_nodes(trace: Trace, share: float, seed: int = 1) -> Trace:
    """The same trace with ``share`` of its jobs that ask an even number (2 or more) of whole GPUs (the
    largest MIG type, 7 slices) spread over two nodes (``sbatch -N 2``, half the count on each), as
    multi-node training is: the same work, but a job Slurm starts on both nodes at once or not at all.
    Drawn from its own seeded stream, so every job's time and size is as in the trace without."""
    rng = random.Random(seed)
    jobs = tuple(replace(j, count=j.count // 2, nodes=2)
                 if j.nodes == 1 and slices_of(j.gres) == 7 and j.count % 2 == 0 and rng.random() < share else j
                 for j in trace.jobs)
    return replace(trace, name=f"{trace.name}, {share:g} of even whole-GPU jobs over two nodes", jobs=jobs)


GENERATED = {"synthetic": synthetic, "shifting": shifting, "clock-right": clock_right}
