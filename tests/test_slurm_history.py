"""The demand planner's run times seeded from accounting at its start (migd/slurm/history.py), through a
fake runner: the sacct call it makes, what it learns from the jobs read, and what it says when
accounting cannot be read.  tests/test_slurm_history_real.py does the same through real slurmdbd."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from migd.api.demand import PlanSummary
from migd.apply.statefile import atomic_write_json
from migd.config.migdyaml import load_config
from migd.demand.runtime import RunTimes
from migd.errors import ValidationError
from migd.slurm.ctl import SlurmCtl, SlurmError
from migd.slurm.demandconf import DemandMode, DemandSettings
from migd.slurm.demandplan import History, Planner
from migd.slurm.history import RETRY_S, ended_jobs, seed
from migd.slurm.parsable import SacctError
from tests.helpers import NO_JOBS, PROFILES

NOW = datetime.fromisoformat("2026-11-28T06:00:00").timestamp()
HEADER = "JobID|Account|Partition|Start|End|Elapsed|Timelimit|AllocTRES|State"
DISABLED = "sacct --parsable2 exited 1: Slurm accounting storage is disabled"


def _line(job: str, account: str, ran_s: int, limit_min: int, end: str, state: str = "COMPLETED",
          partition: str = "gpu", alloc: str = "cpu=1,gres/gpu:1g.10gb=1") -> str:
    h, rest = divmod(ran_s, 3600)
    elapsed = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{job}|{account}|{partition}|2026-11-27T00:00:00|2026-11-27T{end}|{elapsed}|{limit_min}|{alloc}|{state}"


def _record(n: int, account: str, share: float, limit_min: int = 60, first: int = 0) -> list[str]:
    """``n`` jobs of ``account`` each ending a minute after the last, each running ``share`` of its limit."""
    return [_line(f"{account}{i}", account, round(share * limit_min * 60), limit_min,
                  f"{(first + i) // 60 + 1:02d}:{(first + i) % 60:02d}:00") for i in range(n)]


class Sacct:
    """A runner: sacct answers ``text`` (or fails with ``error``); scontrol shows no node, squeue no job."""

    def __init__(self, text: str = "", error: str | None = None) -> None:
        self.text, self.error = text, error
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.calls.append(tuple(argv))
        if argv[0] == "sacct":
            assert timeout_s <= 20.0
            if self.error is not None:
                raise SlurmError(self.error)
            return self.text
        return NO_JOBS if argv[0] == "squeue" else ""

    def sacct_calls(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == "sacct"]


def _planner(tmp_path: Path, runner: Sacct, history_s: float = 7 * 86400.0,
             clock: list[float] | None = None) -> Planner:
    at = clock if clock is not None else [NOW]
    settings = DemandSettings(DemandMode.DRY_RUN, "gpu1", ("day", "night"), history_s=history_s)
    return Planner(settings, "gpu", "gpu1", SlurmCtl("gpu1", runner), {}, tmp_path / "demand.json", lambda: at[0])


def test_the_planner_reads_accounting_once_at_start_and_learns_each_accounts_share(tmp_path: Path) -> None:
    text = "\n".join([HEADER, *_record(12, "bio", 0.25), *_record(10, "physics", 0.5, first=20),
                      *_record(3, "chem", 0.1, first=40)]) + "\n"
    runner = Sacct(text)
    planner = _planner(tmp_path, runner)
    assert planner.runtimes.ratios() == ()
    summary = planner.tick()
    assert summary.error is None
    assert planner.runtimes.ratios() == (("bio", 0.25), ("physics", 0.5))  # chem: 3 jobs, under 10: its limits
    assert planner.accounting.seeded is not None and planner.accounting.seeded.jobs == 25
    (call,) = runner.sacct_calls()
    since = datetime.fromtimestamp(NOW - 7 * 86400).strftime("%Y-%m-%dT%H:%M:%S")
    assert call == ("sacct", "--parsable2", "--allusers", "--allocations", "--partition=gpu",
                    "--state=COMPLETED,CANCELLED,FAILED,TIMEOUT,OUT_OF_MEMORY", f"--starttime={since}",
                    f"--endtime={datetime.fromtimestamp(NOW).strftime('%Y-%m-%dT%H:%M:%S')}",
                    "--format=JobID,Account,Partition,Start,End,Elapsed,Timelimit,AllocTRES,State")
    planner.tick()
    assert len(runner.sacct_calls()) == 1  # never again once read: jobs ending later are learned live


def test_history_0_reads_no_accounting(tmp_path: Path) -> None:
    runner = Sacct("\n".join([HEADER, *_record(12, "bio", 0.25)]))
    planner = _planner(tmp_path, runner, history_s=0)
    planner.tick()
    assert runner.sacct_calls() == [] and planner.runtimes.ratios() == ()


def test_only_jobs_that_ran_are_read_and_in_the_order_they_ended() -> None:
    text = "\n".join([
        HEADER,
        _line("3", "bio", 600, 60, "03:00:00"),
        _line("3.batch", "", 600, 0, "03:00:00").replace("|0|", "||"),  # a step: inside job 3
        _line("1", "bio", 60, 60, "01:00:00", state="CANCELLED by 0"),  # cancelled while running: it ran
        _line("2", "bio", 3600, 60, "02:00:00", state="TIMEOUT"),
        _line("4", "bio", 0, 60, "04:00:00", state="CANCELLED by 0", alloc=""),  # cancelled while pending
        _line("5", "bio", 60, 60, "05:00:00", state="PREEMPTED"),  # ended by the cluster
        _line("6", "bio", 60, 60, "06:00:00", partition="cpu"),
        _line("7_1", "", 120, 60, "00:30:00"),  # an array task with no account
        _line("8", "bio", 60, 60, "07:00:00", alloc="billing=1,cpu=1,mem=1G,node=1"),  # held no GPU: the planner
        # (learns live from jobs that held MIG instances only, and so does its seed); End before Start (a clock
        # stepped back), which sacct prints as Elapsed INVALID: it refused the whole read, again every hour
        _line("9", "bio", 60, 60, "08:00:00").replace("|00:01:00|", "|INVALID|"),
    ]) + "\n"
    ended = ended_jobs(text, "gpu")
    assert [(e.job, e.account, e.ran_s, e.limit_s) for e in ended] == [
        ("7_1", "-", 120, 3600), ("1", "bio", 60, 3600), ("2", "bio", 3600, 3600), ("3", "bio", 600, 3600)]


def test_the_newest_200_are_kept_and_accounting_replaces_what_was_kept_before() -> None:
    runtimes = RunTimes()
    runtimes.load({"bio": [1.0] * 50, "chem": [0.3] * 12})
    old = [e for e in ended_jobs("\n".join([HEADER, *_record(100, "bio", 1.0)]), "gpu")]
    new = [e for e in ended_jobs("\n".join([HEADER, *_record(200, "bio", 0.5, first=200)]), "gpu")]
    seeded = seed(runtimes, old + new)
    assert (seeded.jobs, seeded.accounts) == (300, 1)
    assert list(runtimes.seen["bio"]) == [0.5] * 200  # the 100 older jobs fell out, as when learned live
    assert runtimes.ratios() == (("bio", 0.5), ("chem", 0.3))  # an account accounting does not name is kept


def test_accounting_replaces_the_planners_own_record_on_restart(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / "demand.json", History({}, {}, {"bio": (1.0,) * 20, "nlp": (0.2,) * 10}))
    planner = _planner(tmp_path, Sacct("\n".join([HEADER, *_record(10, "bio", 0.25)])))
    assert planner.runtimes.ratios() == (("bio", 1.0), ("nlp", 0.2))
    planner.tick()
    assert planner.runtimes.ratios() == (("bio", 0.25), ("nlp", 0.2))


def test_without_accounting_the_planner_says_so_in_one_line_and_decides(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    runner = Sacct(error=DISABLED)
    clock = [NOW]
    planner = _planner(tmp_path, runner, clock=clock)
    with caplog.at_level(logging.INFO):
        assert planner.tick().error is None  # the pass goes on: no decision is lost to accounting
        clock[0] += 60
        planner.tick()  # not read again at the next pass...
        clock[0] = NOW + RETRY_S
        planner.tick()  # ...but an hour on, and the same failure is not said again
    said = [r for r in caplog.records if "accounting" in r.getMessage()]
    assert len(runner.sacct_calls()) == 2 and len(said) == 1, caplog.text
    assert said[0].levelno == logging.WARNING and said[0].exc_info is None
    assert "run times not seeded from accounting (sacct --parsable2 exited 1: Slurm accounting storage is " \
           "disabled); learning them from jobs seen to end" in said[0].getMessage()
    runner.error, runner.text = None, "\n".join([HEADER, *_record(10, "bio", 0.25)])
    clock[0] = NOW + 2 * RETRY_S
    planner.tick()
    assert planner.runtimes.ratios() == (("bio", 0.25),)


@pytest.mark.parametrize(("text", "said"), [
    ("", "sacct: empty: the first line must name the fields"),
    ("JobID|Account|End\n", "sacct:1: the header names no Elapsed, Timelimit"),
    (HEADER + "\n" + _line("1", "bio", 60, 60, "01:00:00").replace("2026-11-27T01", "yesterday"),
     "sacct:2: End: 'yesterday:00:00' is not a time as sacct prints it"),
    (HEADER + "\n" + _line("1", "bio", 60, 60, "01:00:00").replace("|00:01:00|", "|a while|"),
     "sacct:2: Elapsed: 'a while' is not a Slurm time"),
    (HEADER + "\n" + _line("1", "bio", 60, 60, "01:00:00").replace("|60|", "|soon|"),
     "sacct:2: Timelimit: 'soon' is not a Slurm time"),
    (HEADER + "\n" + _line("1", "bio", 60, 60, "01:00:00").replace("|60|", "|\u0663\u0660|"),  # (int took it)
     "sacct:2: Timelimit: '\u0663\u0660' is not a Slurm time"),
    (HEADER + "\n" + _line("1", "bio", 60, 60, "01:00:00").replace("|60|", "|1:2:3:4|"),
     "sacct:2: Timelimit: '1:2:3:4' is not a Slurm time"),
    (HEADER + "\n1|bio|gpu\n", "sacct:2: 3 fields where the header names 9"),
])
def test_output_that_cannot_be_read_is_one_line_naming_where(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                             text: str, said: str) -> None:
    with pytest.raises(SacctError, match=said):
        ended_jobs(text, "gpu")
    planner = _planner(tmp_path, Sacct(text))
    planner.tick()
    (line,) = [r for r in caplog.records if "accounting" in r.getMessage()]
    assert said in line.getMessage() and line.exc_info is None and planner.runtimes.ratios() == ()


def test_history_is_a_knob_of_migd_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "migd.yaml"
    demand = ("schedule:\n  - {profile: night, at: \"00:00\"}\n"
              f"profiles_dir: {PROFILES}\nslurm:\n  node: gpu0\n  partition: gpu\n  demand:\n    mode: on\n"
              "    planner: gpu0\n    candidates: [day, night]\n")
    cfg.write_text(demand)
    assert load_config(cfg).slurm.demand.history_s == 7 * 86400.0  # type: ignore[union-attr]
    cfg.write_text(demand + "    history: 48h\n")
    assert load_config(cfg).slurm.demand.history_s == 48 * 3600.0  # type: ignore[union-attr]
    cfg.write_text(demand + "    history: 0\n")
    assert load_config(cfg).slurm.demand.history_s == 0.0  # type: ignore[union-attr]
    cfg.write_text(demand + "    history: a week\n")
    with pytest.raises(ValidationError, match="history"):
        load_config(cfg)


def test_a_job_without_a_limit_teaches_nothing() -> None:
    text = "\n".join([HEADER, _line("1", "bio", 60, 60, "01:00:00").replace("|60|", "|UNLIMITED|"),
                      _line("2", "bio", 60, 60, "02:00:00").replace("|60|", "|0|"),
                      _line("3", "bio", 60, 60, "03:00:00")])
    runtimes = RunTimes()
    assert seed(runtimes, ended_jobs(text, "gpu")).jobs == 1 and list(runtimes.seen["bio"]) == [60 / 3600]


def test_without_accounting_the_decision_says_every_account_runs_to_its_limits(tmp_path: Path) -> None:
    plan = _planner(tmp_path, Sacct(error=DISABLED)).tick()
    assert plan.run_share == {} and plan.seeded_jobs is None


def test_when_each_mig_type_was_last_seen_outlives_a_planner_restart(tmp_path: Path) -> None:
    """demand.json keeps when the planner last saw a job of each MIG type, so that ``keep_place`` holds a
    type's last place across a restart of the planner as it did before it."""
    atomic_write_json(tmp_path / "demand.json", History({}, {}, {}, {"2g.20gb": (NOW - 3600.0, 1.0)}))
    planner = _planner(tmp_path, Sacct(HEADER))
    (seen,) = planner.seen.seen(NOW)
    assert (seen.mig_type, seen.ago_s, seen.count) == ("2g.20gb", 3600.0, 1)


def test_a_damaged_number_in_demand_json_is_one_line_not_a_dead_planner(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "demand.json").write_text('{"schema": "migd.demand/v1", "switches": {}, '
                                          '"seen": {"2g.20gb": [1795000000.0, NaN]}}')
    with caplog.at_level(logging.ERROR):
        planner = _planner(tmp_path, Sacct(HEADER))
    assert planner.seen.seen(NOW) == () and planner.tick().error is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "demand.json" in line and "starting without what it learned" in line and "\n" not in line


def test_a_decision_says_the_run_times_even_when_slurm_cannot_be_read(tmp_path: Path) -> None:
    from migd.ctl.daemon_table import _run_times
    from migd.slurm.ctl import SlurmCtl

    def broken(argv: Sequence[str], timeout_s: float) -> str:
        raise SlurmError("scontrol exited 1: Unable to contact slurm controller")

    settings = DemandSettings(DemandMode.DRY_RUN, "gpu1", ("day", "night"), history_s=0)
    atomic_write_json(tmp_path / "demand.json", History({}, {}, {"nlp": (0.25,) * 10}))
    plan = Planner(settings, "gpu", "gpu1", SlurmCtl("gpu1", broken), {}, tmp_path / "demand.json", lambda: NOW).tick()
    assert plan.error is not None and plan.run_share == {"nlp": 0.25}
    older = PlanSummary(NOW, "on", (), (), {}, (), 0, 0)  # (from a migd that does not say its run times)
    assert older.run_share is None and _run_times(older) == []


def test_an_unreadable_slurm_is_logged_when_it_starts_changes_and_ends(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The planner logged "cannot read Slurm" at every interval (a line a minute while slurmctld is down);
    ``migd_demand_slurm_unreadable`` says it throughout, the log when it starts, changes and ends."""
    from migd.slurm.ctl import SlurmCtl
    why = ["scontrol exited 1: Unable to contact slurm controller"]

    def runner(argv: Sequence[str], timeout_s: float) -> str:
        if why[0]:
            raise SlurmError(why[0])
        return NO_JOBS if argv[0] == "squeue" else ""

    settings = DemandSettings(DemandMode.DRY_RUN, "gpu1", ("day", "night"), history_s=0)
    planner = Planner(settings, "gpu", "gpu1", SlurmCtl("gpu1", runner), {}, tmp_path / "demand.json", lambda: NOW)
    caplog.set_level(logging.INFO, logger="migd")
    for cause in (why[0], why[0], why[0], "squeue --json exited 1: Socket timed out", "", ""):
        why[0] = cause
        assert (planner.tick().error is None) == (not cause)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("demand: ")]
    unread = "cannot read Slurm, no decision"
    assert [s.split(":")[1].strip() for s in said] == [unread, unread, "Slurm can be read again"], said
    assert "Unable to contact" in said[0] and "Socket timed out" in said[1]


def test_a_lasting_condition_is_said_again_after_the_repeat_time() -> None:
    from migd.repeat import Said
    now = [0.0]
    said = Said(600.0, lambda: now[0])
    assert said.due("down") and not said.due("down")
    now[0] = 599.0
    assert not said.due("down") and said.due("other") and not said.due("other")
    now[0] = 1199.0
    assert said.due("other") and said.ended() and not said.ended() and said.due("other")
