"""Job traces for bench/demand.py: a trace is its jobs and the date and time its second 0 is (the
clock policy and the weekday of each job follow the calendar from there; ``Trace`` and ``TraceJob``
are migd/whatif/jobs.py's, as the what-if reads sacct into them).

CSV (with a header): ``submit_s,account,partition,gres,count,duration_s,time_limit_s``; ``gres`` is a
MIG type (``1g.10gb``), ``count`` the instances the job needs on one node.  A bad row is one line
naming file, line and field (``TraceError``; the bench exits 2).  Generated traces: demand_gen.py.
"""

from __future__ import annotations

import csv
from pathlib import Path

from migd.demand.inputs import slices_of
from migd.whatif.jobs import DAY, Trace, TraceJob

__all__ = ["DAY", "FIELDS", "Trace", "TraceError", "TraceJob", "read_csv", "write_csv"]
FIELDS = ["submit_s", "account", "partition", "gres", "count", "duration_s", "time_limit_s"]


class TraceError(Exception):
    """One line: file, line, field and what is wrong."""


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
