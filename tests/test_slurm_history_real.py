"""The demand planner's run times seeded from a real Slurm's accounting at its start: Debian's Slurm 22.05
with slurmdbd over MariaDB (tests/slurm_accounting.py) runs jobs of two accounts with known run times and
limits, and a planner started afterwards knows each account's share of its limits before it has watched
a single job end.  On the cluster without accounting (tests/slurm_cluster.py), sacct fails as it does on
a site without slurmdbd, and migd says so in one line and plans on.

Skipped where Slurm, slurmdbd or MariaDB is missing or not root, unless MIGD_REQUIRE_SLURM=1 /
MIGD_REQUIRE_SLURMDBD=1 (.ci/run sets them)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.daemon.clock import Clock
from migd.demand.runtime import RunTimes
from migd.slurm.ctl import SlurmCtl, command_runner
from migd.slurm.demandconf import DemandMode, DemandSettings
from migd.slurm.demandplan import Planner
from migd.slurm.history import ended_jobs, sacct_args
from tests.helpers import REPO
from tests.slurm_accounting import AccountedCluster, skip_without_slurmdbd
from tests.slurm_node import NIGHT, Node, night_node  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration  # Slurm, slurmdbd and MariaDB

SLOTS = 4
# account -> (jobs, seconds each sleeps, time limit in minutes): shares of about 1/60 and 5/120
JOBS = {"bio": (10, 1, 1), "physics": (10, 5, 2)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[AccountedCluster]:
    skip_without_slurmdbd()
    c = AccountedCluster(SLOTS, tuple(JOBS), ("1g.10gb", "7g.80gb"))
    try:
        c.start(f"gpu:1g.10gb:{SLOTS}", "".join(f"NodeName=gpu1 Name=gpu Type=1g.10gb File={c.dev}/nvidia{i}\n"
                                                for i in range(SLOTS)), cpus=8,
                catalog="gpu:7g.80gb:1")  # (a type no node offers: a job asking it queues)
        yield c
    finally:
        c.stop()


def _run_jobs(c: AccountedCluster) -> None:
    """Every account's jobs run and end; one more job runs and is cancelled (it ran: it counts), and one
    is cancelled while held (it never ran: it does not)."""
    for account, (n, sleep_s, limit_min) in JOBS.items():
        for _ in range(n):
            c.submit("gpu:1g.10gb:1", f"sleep {sleep_s}", "-A", account, "-t", str(limit_min))
    cancelled = c.submit("gpu:1g.10gb:1", "sleep 100", "-A", "physics", "-t", "5")
    withdrawn = c.submit("gpu:7g.80gb:1", "sleep 1", "-A", "bio", "-t", "5")
    c.wait(lambda: c.job_state(cancelled) == "RUNNING", "the job to cancel to run", 60)
    time.sleep(2)
    c.cmd("scancel", cancelled, withdrawn)
    c.wait(lambda: c.cmd("squeue", "-h", "-o", "%i").split() == [], "every job to end", 120)
    ended = sum(n for n, _, _ in JOBS.values()) + 2
    seen: list[str] = []

    def recorded() -> bool:
        seen[:] = [line.split("|")[1] for line in c.sacct("JobID", "State").splitlines()[1:] if line]
        return len(seen) == ended and not {"PENDING", "RUNNING"} & set(seen)
    try:
        c.wait(recorded, "slurmdbd to hold every end", 60)
    except AssertionError as e:
        raise AssertionError(f"{e}: sacct shows {seen}") from None


def _expected(c: AccountedCluster) -> RunTimes:
    """Each account's share, from sacct's raw figures (ElapsedRaw in seconds, TimelimitRaw in minutes) of
    every job that had an allocation: the figures the planner reads, by other fields, fed as when watched."""
    out = RunTimes()
    rows = [line.split("|") for line in c.sacct("JobID", "Account", "ElapsedRaw", "TimelimitRaw", "AllocTRES",
                                                "End").splitlines()[1:] if line]
    for _, account, elapsed, limit, alloc, _ in sorted(rows, key=lambda r: (r[5], r[0])):
        if alloc:
            out.observe(account, float(elapsed), float(limit) * 60)
    return out


def test_a_planner_started_after_the_jobs_ended_knows_each_accounts_share(cluster: AccountedCluster,
                                                                         tmp_path: Path) -> None:
    c = cluster
    _run_jobs(c)
    ctl = SlurmCtl("gpu1", command_runner({"SLURM_CONF": str(c.conf)}), 30.0)
    planner = Planner(DemandSettings(DemandMode.DRY_RUN, "gpu1", ("day", "night")), "main", "gpu1", ctl, {},
                      tmp_path / "demand.json")
    assert planner.runtimes.ratios() == ()  # nothing watched, nothing kept
    began = time.monotonic()
    plan = planner.tick()
    assert plan.error is None  # (its first pass: the sacct call, then the queue and the decision)
    print(f"\nfirst pass {time.monotonic() - began:.2f} s; {planner.accounting.seeded}; "
          f"learned {planner.runtimes.ratios()}")  # (docs/demand.md's figures, with -s)
    assert planner.accounting.seeded is not None
    assert (planner.accounting.seeded.jobs, planner.accounting.seeded.accounts) == (21, 2)  # not the withdrawn one
    learned = dict(planner.runtimes.ratios())
    assert learned == dict(_expected(c).ratios())
    assert plan.run_share == learned and plan.seeded_jobs == 21  # what migctl daemon and the metrics show
    assert 1 / 60 <= learned["bio"] <= 3 / 60 and 5 / 120 <= learned["physics"] <= 8 / 120, learned
    assert len(planner.runtimes.seen["physics"]) == 11 and len(planner.runtimes.seen["bio"]) == 10
    by_hand = _documented_sacct().replace("--partition=gpu", "--partition=main")
    assert [e.job for e in ended_jobs(c.cmd(*by_hand.split()), "main")] == \
        [e.job for e in ended_jobs(ctl.accounting(*_planner_args(planner)), "main")]


def _documented_sacct() -> str:
    """The sacct command docs/demand.md gives for reading by hand what the planner reads."""
    (line,) = [x.strip().strip("`") for x in (REPO / "docs" / "demand.md").read_text().splitlines()
               if x.strip().startswith("`sacct --parsable2 --allusers")]
    return line


def _planner_args(planner: Planner) -> tuple[str, ...]:
    now = time.time()
    return sacct_args("main", now - planner.s.history_s, now)


def test_without_accounting_migd_says_so_once_and_plans(night_node: Node,  # noqa: F811
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The one-node cluster keeps no accounting (AccountingStorageType=accounting_storage/none): sacct
    fails, as on a site without slurmdbd.  migd's log says so in one line, and the planner decides."""
    settings = ("  demand:\n    mode: dry-run\n    planner: gpu1\n    candidates: [day, night]\n"
                "    interval: 1s\n    lease: 1h\n")
    d = night_node.daemon(Clock(NIGHT), settings=settings)
    with caplog.at_level(logging.INFO, logger="migd"):
        d.reconcile("demand")
        time.sleep(1.1)
        d.reconcile("demand")
    assert d.slurm is not None and d.slurm.demand is not None and d.slurm.demand.last_plan is not None
    assert d.slurm.demand.last_plan.error is None
    said = [r for r in caplog.records if "accounting" in r.getMessage()]
    assert len(said) == 1, caplog.text
    line = said[0].getMessage()
    assert said[0].exc_info is None and "\n" not in line
    assert line.startswith("demand: run times not seeded from accounting (sacct --parsable2 ") and \
        "exited 1: " in line and "learning them from jobs seen to end" in line, line
