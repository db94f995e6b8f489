"""A cluster's own job history, from ``sacct --parsable2``, as the jobs a what-if replays.

The operator's command (docs/demand.md, "What-if"):

    sacct --parsable2 -a -X -S 2026-10-01 -E now -o JobID,Submit,Start,End,Account,Partition,Timelimit,\
AllocTRES,ReqTRES,NNodes,NodeList,State > jobs.sacct

The first line names the fields (any order, any more of them); each line after it is one job, its
fields separated by ``|`` (``--parsable``'s trailing ``|`` is read too).  Needed: Submit, Start, End,
Timelimit, and AllocTRES or ReqTRES; Account, Partition, JobID, NNodes and NodeList are used when there.

- Job steps (``123.batch``, ``123.0``; without JobID, a line with neither Partition nor Timelimit,
  as sacct prints steps) are skipped: a step runs inside its job's allocation.  Array tasks
  (``123_4``) are jobs of their own, as Slurm schedules them.
- Times are as sacct prints them by default (ISO, ``2026-11-28T03:46:32``, the local time of whoever
  ran sacct, read in this machine's zone; one with a UTC offset is refused: it could be compared with
  none of the others).
  A job started if it has a Start and an AllocTRES (Slurm 22.05 prints a job cancelled while
  pending with Start and End both the cancel time, and no AllocTRES).  One that never started and
  is still pending (End ``Unknown``) with a finite Timelimit is replayed with its time limit as its
  run time (an upper bound); one that ended before it started (cancelled), or is pending without a
  limit, is counted and not replayed: its run time is unknown.  End ``Unknown`` with a Start (still
  running) runs to its limit the same way.  One whose End is before its Start (a clock stepped back;
  sacct's Elapsed says ``INVALID``) is counted and not replayed: its run time is unknown.
- The MIG type and count: ``gres/gpu:<type>=N`` in AllocTRES for a job that started (what Slurm
  gave it: a job that asked a plain ``gres/gpu=N`` shows there the type it got), in ReqTRES for one
  that did not.  A job that names no typed GPU (``gres/gpu=N`` alone: no type was asked, or the
  cluster does not track MIG types, ``AccountingStorageTRES=gres/gpu:1g.10gb,...``) cannot be
  placed on a layout: counted as untyped, not replayed.  A type that is not a MIG type (a whole
  GPU's ``gres/gpu:a100``) is counted, not replayed.  Counts are per job: over NNodes nodes, each
  node is taken to hold its share (rounded up), and the job is replayed over that many nodes, started
  on all of them at once (as Slurm starts it).  A job holding two MIG
  types is replayed as one job per type.  Counts are ASCII digits, nine at most; NNodes, a row's
  NodeList and the record's together name at most ``MAX_NODES`` (jobs.py: why).
- Timelimit ``UNLIMITED`` and ``Partition_Limit`` are unlimited; a job that ran past its limit
  (OverTimeLimit) is given a limit of its run time.
- The replay runs from the first replayed submission to the record's last time, and on for an hour
  or the longest run time, whichever is longer, so a job submitted at the end of the record can
  start; a job that has not started by then waited until then (figures.py: censored, never dropped).
  It replays at most ``MAX_DAYS`` (jobs.py: why) from the first time of a job it replays to the last,
  and a measured run time of at most as long; a row that goes past either is its located error.  A job
  whose time limit (replayed as its run) is longer is skipped and counted, as one with no limit is, and
  a job skipped stretches nothing (``sacct -S`` lists a held job however long ago it came).

A line that cannot be read is one ``SacctError``: ``file:line: field: what``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from migd.demand.inputs import slices_of
from migd.errors import ValidationError
from migd.numeral import whole
from migd.printable import clipped
from migd.slurm.ctl import text_of
from migd.slurm.hostlist import hostnames
from migd.slurm.parsable import Row, is_step, read_rows
from migd.slurm.parsable import SacctError as SacctError  # (migctl what-if names it from here)
from migd.slurm.queue import MAX_REQUESTS, array_size, array_tasks
from migd.trust import open_regular
from migd.whatif.jobs import DAY, MAX_DAYS, MAX_JOBS, MAX_NODES, Trace, TraceJob

NEEDED = ("Submit", "Start", "End", "Timelimit")
FIELDS = "JobID,Submit,Start,End,Account,Partition,Timelimit,AllocTRES,ReqTRES,NNodes,NodeList,State"
_TYPED = re.compile(r"^gres/gpu:([^=]+)=(.*)$")
_ARRAY = re.compile(r"^[0-9]+_\[(.+)\]$")
_PLAIN = re.compile(r"^gres/gpu=(.*)$")
ENDED_BEFORE_START = "End before Start (a clock stepped back: sacct's Elapsed INVALID)"
MAX_BYTES = 1 << 30  # a record of MAX_JOBS rows of a few hundred bytes each (jobs.py), and room beside
TAIL_S = 3600.0  # the replay runs past the record's last time by this (or the longest run time)


@dataclass(frozen=True)
class Record:
    """What one sacct file holds, read: the jobs to replay, and what was left out and why."""

    trace: Trace
    end_s: float  # the record's last time, seconds after trace.start
    skipped: Mapping[str, int]  # why -> jobs
    nodes: frozenset[str]  # every node NodeList names (empty without NodeList)
    source: str


def read_sacct(path: Path | str, text: str | None = None, partition: str | None = None) -> Record:
    """The file's jobs (``text``: its contents already read).  Bytes that are not UTF-8 (an account or
    comment in Latin-1) are read as U+FFFD, never refused."""
    if text is None:
        try:
            fd, _ = open_regular(path, lead="it ", pipes=True)  # (a device: /dev/zero ended in MemoryError)
        except ValidationError as e:
            raise SacctError(f"{path}: cannot read: {e.message}") from None
        except OSError as e:
            raise SacctError(f"{path}: cannot read: {e.strerror or e}") from None
        with open(fd, "rb", closefd=True) as f:
            text = read_bounded(str(path), f)
    rows = read_rows(str(path), text, NEEDED, f"sacct --parsable2 -o {FIELDS}", any_of=("AllocTRES", "ReqTRES"))
    return _record(str(path), rows, partition)


def read_bounded(name: str, stream: BinaryIO) -> str:
    """At most ``MAX_BYTES`` of a record (a file, or standard input), as text: a stream past it is refused,
    not read until memory runs out."""
    try:
        data = stream.read(MAX_BYTES + 1)
    except OSError as e:
        raise SacctError(f"{name}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise SacctError(f"{name}: over {MAX_BYTES >> 20} MiB, more than a what-if reads (sacct -S and -E: a "
                         "shorter window)")
    return text_of(data)


def _record(source: str, rows: Sequence[Row], partition: str | None) -> Record:
    skipped: Counter[str] = Counter()
    nodes: set[str] = set()
    read: list[tuple[datetime, _Job]] = []
    first: datetime | None = None
    last: datetime | None = None
    count = 0  # the jobs replayed so far
    for row in rows:
        if is_step(row):
            continue
        if partition is not None and partition not in row.get("Partition").split(","):
            skipped[f"not in partition {partition}"] += 1
            continue
        job, named = _read(row)
        nodes |= named
        if len(nodes) > MAX_NODES:
            raise row.error("NodeList", f"the record names more than {MAX_NODES} nodes, the most a what-if replays")
        if job.why_not is not None:  # (before the span: a job not replayed stretches nothing, a held one
            skipped[job.why_not] += 1  # submitted long ago included, which ``sacct -S`` lists whenever it came)
            continue
        ids, past = _replayed(job)
        if past:
            skipped[f"array tasks past {MAX_REQUESTS} jobs of one row (tasks times MIG types)"] += past
            job = replace(job, ids=ids)
        first, last = _span(row, job, first, last)
        read.append((job.submit, job))
        count += len(job.asked) * len(job.ids)
        if count > MAX_JOBS:
            raise row.error("JobID", f"the record gives more than {MAX_JOBS:,} jobs to replay, the most a what-if "
                            "replays (sacct -S and -E: a shorter window)")
    if not read or last is None:
        said = "; ".join(f"{n} {why}" for why, n in sorted(skipped.items())) or "no job lines"
        raise SacctError(f"{source}: no job to replay ({said})")
    start = min(s for s, _ in read)
    jobs = sorted((j for _, job in read for j in job.trace_jobs(start)), key=lambda j: j.submit_s)
    longest = max(j.duration_s for j in jobs)
    end = max((last - start).total_seconds(), max(j.submit_s for j in jobs)) + max(TAIL_S, longest)
    return Record(Trace(Path(source).name, tuple(jobs), start), end, dict(skipped), frozenset(nodes), source)


def _span(row: Row, job: _Job, first: datetime | None, last: datetime | None) -> tuple[datetime, datetime]:
    """The record's first and last times, with this row's.  A record spanning more than a what-if replays
    is the row that stretched it (a Submit of 0001-01-01 beside 2026 would replay for millennia)."""
    times = {f: t for f, t in (("Submit", job.submit), ("Start", job.start), ("End", job.end)) if t is not None}
    lo = min(t for t in (first, *times.values()) if t is not None)
    hi = max(t for t in (last, *times.values()) if t is not None)
    if hi - lo > timedelta(days=MAX_DAYS):
        field = next(f for f, t in times.items() if t in (lo, hi))
        raise row.error(field, f"{row.get(field)}: the record would span {(hi - lo).days} days, {lo.isoformat()} to "
                        f"{hi.isoformat()}; a what-if replays at most {MAX_DAYS} (sacct -S and -E: a shorter window)")
    return lo, hi


def _read(row: Row) -> tuple[_Job, set[str]]:
    """The row's job and the nodes it names.  Whatever in a row cannot be read is that row's one
    located line, never a traceback: a check missed here still names the file and line."""
    try:
        return _job(row), _nodes(row)
    except SacctError:
        raise
    except (ValueError, TypeError, ArithmeticError) as e:
        raise SacctError(f"{row.where}: {e}") from None


def _nodes(row: Row) -> set[str]:
    text = row.get("NodeList")
    if not text or text in ("None assigned", "(null)"):
        return set()
    try:
        return hostnames(text, most=MAX_NODES) or {text}
    except ValueError as e:
        raise row.error("NodeList", f"{e}: a what-if replays at most {MAX_NODES}") from None


@dataclass(frozen=True)
class _Job:
    account: str
    partition: str
    submit: datetime
    start: datetime | None
    end: datetime | None
    run_s: float
    limit_s: float
    asked: tuple[tuple[str, int], ...]  # (MIG type, instances per node)
    nodes: int
    why_not: str | None  # not replayed, and why
    ids: tuple[str, ...] = ("",)  # the job id of each job the row stands for: a pending array's row
    # (``12_[0-9%3]``) stands for its pending tasks, each replayed
    more: int = 0  # tasks the row names past ``ids`` (an array of more than MAX_ARRAY_TASKS)

    def trace_jobs(self, zero: datetime) -> list[TraceJob]:
        at = self.submit.timestamp() - zero.timestamp()  # (in the machine's zone, as the runs: one time base)
        limit = max(self.limit_s, self.run_s)
        return [TraceJob(at, self.account, self.partition, t, n, self.run_s, limit, job, self.nodes)
                for t, n in self.asked for job in self.ids]


def _job(row: Row) -> _Job:
    submit = row.time("Submit")
    if submit is None:
        raise row.error("Submit", f"{row.get('Submit')!r}: a job's submit time is always known")
    start, end = row.time("Start"), row.time("End")
    if start is not None and "alloctres" in row.fields and not row.get("AllocTRES"):
        start = None  # no allocation: cancelled while pending (22.05 prints Start=End=the cancel time)
    limit = row.duration("Timelimit")
    nodes = _count(row, "NNodes", 1)
    asked, why = _asked(row, started=start is not None, nodes=nodes)
    run = limit
    if why is None and start is None:
        why = "ended before starting" if end is not None else \
            "still pending with no time limit" if math.isinf(limit) else None
    elif why is None and start is not None:
        if end is None and math.isinf(limit):
            why = "still running with no time limit"
        run = _seconds_between(start, end) if end is not None else limit
        if run < 0:  # sacct prints its Elapsed INVALID (parse_time.c secs2time_str): the record is Slurm's own,
            why = ENDED_BEFORE_START  # and its run time unknown, as the planner's seed reads it (history.py)
    if why is None and run > MAX_DAYS * DAY:
        if start is None or end is None:  # a limit replayed as the run (a partition's MaxTime may allow it):
            why = f"a time limit past {MAX_DAYS} days"  # skipped, as one with no limit is
        else:
            raise row.error("End", f"{row.get('End')}: a run of {run / DAY:.0f} days, longer than a what-if "
                            f"replays ({MAX_DAYS} days)")
    return _Job(row.get("Account") or "-", row.get("Partition") or "-", submit, start, end, max(1.0, run), limit,
                asked, nodes, why, *_ids(row, pending=start is None))


def _ids(row: Row, pending: bool) -> tuple[tuple[str, ...], int]:
    """The job ids a row stands for, and how many tasks past them it names: a pending array's one row
    (sacct(1): ``ArrayJobID_[expression]``) its pending tasks', ``12_0``, ``12_1``... (at most
    MAX_ARRAY_TASKS listed); any other row (or an expression not read here: sacct cuts one past
    SLURM_BITSTR_LEN) its JobID alone."""
    job = row.get("JobID")
    m = _ARRAY.match(job) if pending else None
    found = array_tasks(m[1]) if m else None
    if not m or not found:
        return (job,), 0
    return tuple(f"{job.partition('_')[0]}_{task}" for task in found), (array_size(m[1]) or 0) - len(found)


def _replayed(job: _Job) -> tuple[tuple[str, ...], int]:
    """The tasks of a row replayed, and how many are not: each task is a job for each MIG type it asks
    (over all its nodes), at most ``MAX_REQUESTS`` of them from one row, as the planner reads one pending
    record (queue.py; an array of 4,096 tasks over 4,096 nodes, each node a job, was 16.7 million jobs:
    memory without end)."""
    keep = max(1, MAX_REQUESTS // max(1, len(job.asked)))
    return job.ids[:keep], max(0, len(job.ids) - keep) + job.more


def _seconds_between(start: datetime, end: datetime) -> float:
    """A run from sacct's local times, as this machine's zone reads them (sacct prints in its caller's zone):
    across a DST change the times' own difference is an hour off, and an end in the repeated hour of a
    fall-back printed before its start (the whole record was refused); that end's second occurrence
    (``fold=1``) is the one after the start."""
    run = end.timestamp() - start.timestamp()
    return run if run >= 0 else end.replace(fold=1).timestamp() - start.timestamp()


def _count(row: Row, name: str, default: int) -> int:
    text = row.get(name)
    if not text:
        return default
    count = _number(row, name, text, "a count of nodes")
    if count < 1:
        raise row.error(name, f"{text!r} is not a count of nodes")
    if count > MAX_NODES:
        raise row.error(name, f"{count} nodes: a what-if replays at most {MAX_NODES}")
    return count


def _number(row: Row, name: str, text: str, what: str) -> int:
    """``text`` as a whole number: ASCII digits only, and few (``str.isdigit`` takes ``'²'``, which ``int``
    refuses, and ``int`` refuses 4,300 digits or more: either would be an error naming no line)."""
    number = whole(text, 9)  # nine digits hold any count a cluster has
    if number is None:
        raise row.error(name, f"{clipped(text, 20, 'characters')!r} is not {what}")
    return number


def _asked(row: Row, started: bool, nodes: int) -> tuple[tuple[tuple[str, int], ...], str | None]:
    """(MIG type, instances per node) the job held or asked, and why it is not replayed, if so."""
    name = "AllocTRES" if (started or not row.get("ReqTRES")) and row.get("AllocTRES") else "ReqTRES"
    tres = row.get(name)
    typed: dict[str, int] = {}
    plain = False
    for item in filter(None, (t.strip() for t in tres.split(","))):
        m = _TYPED.match(item)
        p = _PLAIN.match(item)
        if m is not None:
            typed[m.group(1)] = typed.get(m.group(1), 0) + _number(row, name, m.group(2), "a count (gres/gpu:TYPE=N)")
        elif p is not None:
            plain = plain or _number(row, name, p.group(1), "a count (gres/gpu=N)") > 0
        elif item.startswith("gres/gpu") and "=" not in item:
            raise row.error(name, f"{item!r} is not TYPE=COUNT (sacct prints gres/gpu:1g.10gb=2)")
    if not typed:
        return (), "untyped (gres/gpu=N: no MIG type asked or tracked)" if plain else "without a GPU"
    mig = {t: n for t, n in typed.items() if _is_mig(t) and n > 0}
    if not mig:
        return (), "asking a GPU type that is not a MIG type"
    return tuple((t, -(-n // nodes)) for t, n in sorted(mig.items())), None


def _is_mig(mig_type: str) -> bool:
    try:
        slices_of(mig_type)
    except ValueError:
        return False
    return True


def days_of(record: Record) -> float:
    return record.end_s / DAY
