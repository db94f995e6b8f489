"""Run times from the cluster's own accounting: what the demand planner knows the moment it starts.

The planner learns, per account, how much of its time limits a job runs (demand/runtime.py) from the
jobs it watches end; an account with fewer than 10 such jobs is taken to run to its limits.  Learned
only live, every restart of the planner (a daemon restart, a new planner node, an upgrade) would make
it blind for hours, while slurmdbd has held the answer all along.  So at its start the planner reads
the partition's jobs that ended in the last ``slurm.demand.history`` (168h by default) with one call:

    sacct --parsable2 --allusers --allocations --partition=gpu --state=COMPLETED,CANCELLED,FAILED,TIMEOUT,\
OUT_OF_MEMORY --starttime=... --endtime=... --format=JobID,Account,Partition,Start,End,Elapsed,Timelimit,\
AllocTRES,State

and feeds each job's (account, Elapsed, Timelimit) to its RunTimes in the order they ended, so each
account keeps its newest 200 as if they had been watched.  The states are those of a job that ran and
ended by its own or its user's doing (a job cancelled or timed out still ran); a job cancelled while
pending (no Start, no AllocTRES) did not run and is left out, as are jobs ended by the cluster
(PREEMPTED, NODE_FAIL, BOOT_FAIL): their run says nothing about their limit.

Accounting's record replaces what the planner's own ``demand.json`` held for an account it names: it
holds every job the planner watched end in the window, timed exactly.  Jobs that end later are learned
live, as before; a successful read is not repeated (the record would only repeat them).  Without
accounting (no slurmdbd: sacct exits non-zero) or with output it cannot read, the planner says so in
one line and learns live; it reads again an hour later (a slurmdbd restarting), saying a failure only
when it differs from the last.  The call is bounded (``TIMEOUT_S``, or command_timeout if shorter).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime

from migd.demand.runtime import RunTimes
from migd.repeat import Said
from migd.slurm.ctl import SlurmCtl, SlurmError
from migd.slurm.parsable import Row, SacctError, is_step, read_rows, seconds

log = logging.getLogger(__name__)

FIELDS = ("JobID", "Account", "Partition", "Start", "End", "Elapsed", "Timelimit", "AllocTRES", "State")
RAN = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY")  # ended, having run
RETRY_S = 3600.0  # a failed read is tried again this long after
TIMEOUT_S = 20.0  # at most this long in the planner's pass (it reads once)
NEEDED = ("Account", "End", "Elapsed", "Timelimit")


@dataclass(frozen=True)
class Ended:
    """One job that ran and ended: it ran ``ran_s`` of its ``limit_s``."""

    end: datetime
    job: str
    account: str
    ran_s: float
    limit_s: float


@dataclass(frozen=True)
class Seeded:
    """What one read of accounting gave: jobs fed to RunTimes, and the accounts they belong to."""

    jobs: int
    accounts: int


def sacct_args(partition: str, since: float, until: float) -> tuple[str, ...]:
    """sacct's arguments for the partition's jobs that ended having run between the two epochs (sacct
    reads its times in local time, as slurmctld writes them)."""
    return ("--parsable2", "--allusers", "--allocations", f"--partition={partition}", f"--state={','.join(RAN)}",
            f"--starttime={_local(since)}", f"--endtime={_local(until)}", f"--format={','.join(FIELDS)}")


def _local(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def ended_jobs(text: str, partition: str, source: str = "sacct") -> list[Ended]:
    """The jobs of ``partition`` that ran and ended, oldest end first (a SacctError names a bad line)."""
    rows = read_rows(source, text, NEEDED, f"sacct --parsable2 --format={','.join(FIELDS)}")
    out = []
    for row in rows:
        if is_step(row) or ("partition" in row.fields and partition not in row.get("Partition").split(",")):
            continue
        if "state" in row.fields and row.get("State").split(" ")[0] not in RAN:
            continue  # (sacct selects by --state; a record given otherwise is read the same)
        ended = _ended(row)
        if ended is not None:
            out.append(ended)
    return sorted(out, key=lambda e: (e.end, e.job))


def _ended(row: Row) -> Ended | None:
    end = row.time("End")
    start = row.time("Start") if "start" in row.fields else end
    if end is None or start is None or ("alloctres" in row.fields and not row.get("AllocTRES")):
        return None  # never ran: cancelled while pending (22.05 prints Start=End=the cancel time, no AllocTRES)
    if "alloctres" in row.fields and "gres/gpu" not in row.get("AllocTRES"):
        return None  # held no GPU: the planner learns from jobs that held MIG instances, live as at start
    if row.get("Elapsed") == "INVALID":  # sacct's word for a negative run time (End before Start: a clock
        return None  # stepped back; src/common/parse_time.c secs2time_str): one such record taught nothing and
    # refused the whole read, every hour
    ran, limit = _seconds(row, "Elapsed"), _seconds(row, "Timelimit")
    if math.isinf(ran):
        raise row.error("Elapsed", f"{row.get('Elapsed')!r} is not a run time (D-HH:MM:SS, HH:MM:SS)")
    return Ended(end, row.get("JobID"), row.get("Account") or "-", ran, limit)


def _seconds(row: Row, name: str) -> float:
    """A Slurm time; a limit of 0 or less (never set by Slurm itself) teaches nothing, like UNLIMITED."""
    text = row.get(name)
    try:
        value = seconds(text)
    except ValueError:
        raise row.error(name, f"{text!r} is not a Slurm time (D-HH:MM:SS, HH:MM:SS, MM:SS, UNLIMITED)") from None
    return value if value > 0 or name == "Elapsed" else math.inf


def seed(runtimes: RunTimes, ended: list[Ended]) -> Seeded:
    """Feed the ended jobs, oldest first, into a fresh record per account that replaces ``runtimes``'s own
    (accounting holds every job the planner saw end, timed exactly).  An unlimited job teaches nothing."""
    fresh = RunTimes(runtimes.keep, runtimes.min_jobs, runtimes.q)
    for e in ended:
        fresh.observe(e.account, e.ran_s, e.limit_s)
    runtimes.seen.update(fresh.seen)
    return Seeded(sum(1 for e in ended if e.limit_s < math.inf), len(fresh.seen))


class Accounting:
    """When the planner reads accounting: at its first pass, and after a failure an hour later."""

    def __init__(self, ctl: SlurmCtl, partition: str, window_s: float) -> None:
        self.ctl, self.partition, self.window_s = ctl, partition, window_s
        self.next_s = 0.0 if window_s > 0 else math.inf  # (0: off)
        self.seeded: Seeded | None = None
        self._said = Said(math.inf)  # (a failure said when it differs from the last)

    def due(self, now: float) -> bool:
        return now >= self.next_s

    def seed(self, runtimes: RunTimes, now: float) -> Seeded | None:
        """One sacct call; its jobs fed to ``runtimes`` (None: accounting could not be read, said once)."""
        self.next_s = math.inf
        try:
            text = self.ctl.accounting(*sacct_args(self.partition, now - self.window_s, now), timeout_s=TIMEOUT_S)
            ended = ended_jobs(text, self.partition)
        except (SlurmError, SacctError) as e:
            self.next_s = now + RETRY_S
            if self._said.due(str(e)):
                log.warning("demand: run times not seeded from accounting (%s); learning them from jobs seen to end, "
                            "reading accounting again every %.0f min", e, RETRY_S / 60)
            return None
        self.seeded = seed(runtimes, ended)
        log.info("demand: run times seeded from accounting: %d jobs of %d accounts that ended in partition %s in "
                 "the last %.0f h", self.seeded.jobs, self.seeded.accounts, self.partition, self.window_s / 3600)
        return self.seeded
