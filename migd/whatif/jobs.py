"""The jobs a what-if replays: each asks ``count`` instances of one MIG type on each of its nodes, for a run
time under a time limit, at a second of the trace (second 0 being ``Trace.start``).

Read from Slurm's accounting (sacct.py), from the bench's CSV (bench/demand_trace.py) or generated
(bench/demand_gen.py): one shape, so every source replays through the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

DAY = 86400.0
# The most nodes a what-if replays, and so the most a job's NNodes or a record's NodeList may name.  The
# replay steps every node through the record, so its time grows with them (4,096 nodes of the recorded
# eight jobs, tests/fixtures/slurm/sacct-parsable2.txt, took 30 s on one core); 4,096 nodes of 8 GPUs
# is 32,768 GPUs, a MIG partition larger than any the bench or docs/demand.md measures (64 nodes).
MAX_NODES = 4096
# The longest a what-if replays: a record's first time to its last, and a job's run time.  sacct windows
# are a month or a quarter (docs/demand.md: -S 2026-10-01); a replay's time grows with its span (30 days
# of two jobs on one node took 54 s), and a year is longer than any window it is meant for.
MAX_DAYS = 366
# The most jobs a what-if replays from one record (a row stands for up to 4,096: queue.MAX_REQUESTS).  A
# month of a busy partition is some 10^5; each job is a few hundred bytes held and stepped through the
# replay, so a record past this is refused at the row that passes it, not read until memory runs out.
MAX_JOBS = 1_000_000


@dataclass(frozen=True)
class TraceJob:
    submit_s: float
    account: str
    partition: str
    gres: str
    count: int
    duration_s: float
    time_limit_s: float
    job: str = ""  # Slurm's job id where known (sacct's JobID; ``12_3``: an array's task): an array's tasks
    # past the first few reserve nothing (backfill.py)
    nodes: int = 1  # a job over N nodes: ``count`` instances on each, started on all of them at once


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]
    start: datetime  # second 0 of the trace, in the configuration's time zone
    clock_right: bool = False  # generated so the configured schedule fits it (the clock is the reference)
