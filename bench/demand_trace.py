"""Job traces for bench/demand.py: a synthetic Thursday-to-Sunday of several departments, or a CSV.

CSV (with a header): ``submit_s,account,partition,gres,count,duration_s,time_limit_s``; ``gres`` is a
MIG type (``1g.10gb``), ``count`` the instances the job needs on one node.  A bad row is one line
naming file, line and field (``TraceError``; the bench exits 2).

The synthetic trace (seeded: the same N gives the same jobs) is built from what shared-GPU sites
describe: notebooks (1g, 10-120 min) in working hours with two class bursts a day; inference
services (2g, 1-3 h) by day; vision training (2 x 3g, 2-6 h) with an evening peak; language-model
training (1-4 x 7g, 3-10 h) mostly submitted in the evening; a quiet weekend.  Rates scale with the
node count.  Time limits are 1.2-2x the run time, as users pad them.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

from migd.demand.model import slices_of

DAY = 86400.0
FIELDS = ["submit_s", "account", "partition", "gres", "count", "duration_s", "time_limit_s"]


class TraceError(Exception):
    """One line: file, line, field and what is wrong."""


@dataclass(frozen=True)
class TraceJob:
    submit_s: float
    account: str
    partition: str
    gres: str
    count: int
    duration_s: float
    time_limit_s: float


@dataclass(frozen=True)
class Stream:
    """One department's arrivals: jobs per node per hour in each period (weekday day/evening/night,
    weekend), the MIG type, instances per job and run time range (minutes)."""

    account: str
    gres: str
    counts: tuple[int, ...]
    minutes: tuple[float, float]
    day: float
    evening: float
    night: float
    weekend: float


STREAMS = (  # sized so a node (8 GPUs, 56 slices) is about fully asked for by day and in the evening
    Stream("teaching", "1g.10gb", (1,), (10, 120), day=22, evening=3, night=0.3, weekend=1),
    Stream("serving", "2g.20gb", (1,), (60, 180), day=3, evening=1, night=0.3, weekend=0.5),
    Stream("vision", "3g.40gb", (2,), (120, 360), day=0.3, evening=0.6, night=0.1, weekend=0.1),
    Stream("nlp", "7g.80gb", (1, 2, 2, 4), (180, 600), day=0.1, evening=0.45, night=0.05, weekend=0.05),
)
BURSTS = ((10 * 3600.0, "teaching"), (14 * 3600.0, "teaching"))  # a class starts its notebooks at once


def _rate(s: Stream, t: float) -> float:
    day, hour = int(t // DAY), (t % DAY) / 3600
    if day >= 2:  # the trace starts on a Thursday: days 2 and 3 are the weekend
        return s.weekend
    if 8.5 <= hour < 18.5:
        return s.day
    if 18.5 <= hour < 23:
        return s.evening
    return s.night


def synthetic(nodes: int, days: int, seed: int = 7) -> list[TraceJob]:
    """Arrivals minute by minute (Poisson per stream), plus the class bursts on weekdays."""
    rng = random.Random(seed * 1000 + nodes)
    jobs: list[TraceJob] = []
    for minute in range(int(days * DAY / 60)):
        t = minute * 60.0
        for s in STREAMS:
            for _ in range(_poisson(rng, _rate(s, t) * nodes / 60)):
                jobs.append(_job(rng, s, t + rng.uniform(0, 60)))
    for d in range(min(days, 2)):
        for at, account in BURSTS:
            s = next(x for x in STREAMS if x.account == account)
            jobs += [_job(rng, s, d * DAY + at + rng.uniform(0, 600)) for _ in range(10 * nodes)]
    return sorted(jobs, key=lambda j: (j.submit_s, j.account))


def _poisson(rng: random.Random, lam: float) -> int:
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


def read_csv(path: Path) -> list[TraceJob]:
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    rows = csv.DictReader(text.splitlines())
    if rows.fieldnames is None or [f.strip() for f in rows.fieldnames] != FIELDS:
        raise TraceError(f"{path}:1: the header must be {','.join(FIELDS)}")
    return sorted((_row(path, n, r) for n, r in enumerate(rows, 2)), key=lambda j: j.submit_s)


def _row(path: Path, line: int, r: dict[str, str]) -> TraceJob:
    def num(field: str, minimum: float) -> float:
        try:
            v = float(r[field])
        except (TypeError, ValueError):
            raise TraceError(f"{path}:{line}: {field}: {r.get(field)!r} is not a number") from None
        if not v >= minimum:
            raise TraceError(f"{path}:{line}: {field}: {v:g} is below {minimum:g}")
        return v
    gres = (r.get("gres") or "").strip()
    try:
        slices_of(gres)
    except ValueError as e:
        raise TraceError(f"{path}:{line}: gres: {e}") from None
    count = num("count", 1)
    if count != int(count):
        raise TraceError(f"{path}:{line}: count: {count:g} is not a whole number of instances")
    run, limit = num("duration_s", 1), num("time_limit_s", 1)
    if limit < run:
        raise TraceError(f"{path}:{line}: time_limit_s: {limit:g} is shorter than duration_s {run:g} "
                         "(Slurm would kill the job at its limit)")
    return TraceJob(num("submit_s", 0), (r.get("account") or "").strip() or "-",
                    (r.get("partition") or "").strip() or "-", gres, int(count), run, limit)


def write_csv(path: Path, jobs: list[TraceJob]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for j in jobs:
            w.writerow([j.submit_s, j.account, j.partition, j.gres, j.count, j.duration_s, j.time_limit_s])
