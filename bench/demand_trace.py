"""Job traces for bench/demand.py: a trace is its jobs and the date and time its second 0 is (the
clock policy and the weekday of each job follow the calendar from there; ``Trace`` and ``TraceJob``
are migd/whatif/jobs.py's, as the what-if reads sacct into them).

CSV (with a header): ``submit_s,account,partition,gres,count,duration_s,time_limit_s``, and ``nodes``
after them where a job spans several (``sbatch -N``; one where the column is absent); ``gres`` is a MIG
type (``1g.10gb``), ``count`` the instances the job needs on each of its nodes.  A bad row is one line
naming file, line and field (``TraceError``; the bench exits 2).  Generated traces: demand_gen.py.
"""

from __future__ import annotations

import csv
from pathlib import Path

from migd.demand.inputs import slices_of
from migd.errors import ValidationError
from migd.trust import open_regular
from migd.whatif.jobs import DAY, MAX_DAYS, MAX_NODES, Trace, TraceJob

__all__ = ["DAY", "FIELDS", "Trace", "TraceError", "TraceJob", "read_csv", "write_csv"]
FIELDS = ["submit_s", "account", "partition", "gres", "count", "duration_s", "time_limit_s"]


class TraceError(Exception):
    """One line: file, line, field and what is wrong."""


MOST = {"count": 4096.0, "nodes": float(MAX_NODES), "submit_s": MAX_DAYS * DAY, "duration_s": MAX_DAYS * DAY,
        "time_limit_s": MAX_DAYS * DAY}


def read_csv(path: Path) -> list[TraceJob]:
    try:
        fd, _ = open_regular(path, lead="it ")  # (a FIFO would block the bench for ever)
        with open(fd, "rb", closefd=True) as f:
            text = f.read().decode("utf-8")
    except ValidationError as e:
        raise TraceError(f"{path}: cannot read: {e.message}") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: cannot read: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = csv.reader(text.splitlines())
    header = [f.strip() for f in next(lines, [])]
    if header not in (FIELDS, [*FIELDS, "nodes"]):
        raise TraceError(f"{path}:1: the header must be {','.join(FIELDS)} (and nodes, if it has that column)")
    rows = ((n, dict(zip(header, (v.strip() for v in values), strict=False))) for n, values in enumerate(lines, 2)
            if any(v.strip() for v in values))  # (a blank line is no row, as csv.DictReader read it)
    return sorted((_row(path, n, r, wide=len(header) > len(FIELDS)) for n, r in rows), key=lambda j: j.submit_s)


def _row(path: Path, line: int, r: dict[str, str], wide: bool) -> TraceJob:
    def num(field: str, minimum: float) -> float:
        try:
            v = float(r[field])
        except (KeyError, ValueError):
            raise TraceError(f"{path}:{line}: {field}: {r.get(field)!r} is not a number") from None
        if not v >= minimum:
            raise TraceError(f"{path}:{line}: {field}: {v:g} is below {minimum:g}")
        if not v <= MOST[field]:  # (inf: an int() of it raised OverflowError, a traceback)
            raise TraceError(f"{path}:{line}: {field}: {v:g} is above {MOST[field]:,.0f}")
        return v
    gres = (r.get("gres") or "").strip()
    try:
        slices_of(gres)
    except ValueError as e:
        raise TraceError(f"{path}:{line}: gres: {e}") from None
    count = num("count", 1)
    if count != int(count):
        raise TraceError(f"{path}:{line}: count: {count:g} is not a whole number of instances")
    nodes = num("nodes", 1) if wide else 1.0  # (a row short of it: "None is not a number", as any field)
    if nodes != int(nodes):
        raise TraceError(f"{path}:{line}: nodes: {nodes:g} is not a whole number of nodes")
    run, limit = num("duration_s", 1), num("time_limit_s", 1)
    if limit < run:
        raise TraceError(f"{path}:{line}: time_limit_s: {limit:g} is shorter than duration_s {run:g} "
                         "(Slurm would kill the job at its limit)")
    return TraceJob(num("submit_s", 0), (r.get("account") or "").strip() or "-",
                    (r.get("partition") or "").strip() or "-", gres, int(count), run, limit, nodes=int(nodes))


def write_csv(path: Path, jobs: list[TraceJob]) -> None:
    """``jobs`` as the CSV read_csv reads: the ``nodes`` column only where a job spans several."""
    wide = any(j.nodes > 1 for j in jobs)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*FIELDS, "nodes"] if wide else FIELDS)
        for j in jobs:
            w.writerow([j.submit_s, j.account, j.partition, j.gres, j.count, j.duration_s, j.time_limit_s,
                        *([j.nodes] if wide else [])])
