"""The what-if without Slurm: sacct's output as recorded from Slurm 22.05's slurmdbd
(tests/fixtures/slurm/SOURCES.md) is read as its jobs, a bad line is one located line, the three
policies are weighed side by side, and the suggested mix is a configuration migd's loader takes."""

from __future__ import annotations

import io
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from migd.catalog.models import MODELS
from migd.config.migdyaml import Config, load_config
from migd.ctl.migctl import main as migctl
from migd.demand.capacity import node_layout
from migd.demand.inputs import Snapshot
from migd.demand.rule import decide as rule_decide
from migd.profiles.loader import load_profile
from migd.whatif import policies
from migd.whatif.jobs import TraceJob
from migd.whatif.policies import Setup
from migd.whatif.replay import run
from migd.whatif.sacct import SacctError, read_sacct
from migd.whatif.suggest import write_mig_parted, write_suggestion
from migd.whatif.weigh import BEST, CURRENT, MIGD, replayer, weigh
from tests.helpers import check_golden

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "slurm"
RECORDED = FIX / "sacct-parsable2.txt"
HEADER = "JobID|Submit|Start|End|Account|Partition|Timelimit|AllocTRES|ReqTRES|NNodes|NodeList|State"
OK = "9|2026-11-28T10:00:00|2026-11-28T10:01:00|2026-11-28T10:11:00|phys|main|01:00:00|gres/gpu:1g.10gb=1|" \
     "gres/gpu:1g.10gb=1|1|gpu1|COMPLETED"


def sacct(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    path = tmp_path / "jobs.sacct"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def test_the_recorded_sacct_is_read_as_the_jobs_that_ran() -> None:
    """Seven jobs: two 1g at once, two 1g, a 3g, a plain gpu:1 that got a 3g, two array tasks of 1g, a 7g
    still pending (replayed to its 30-minute limit), and a cancelled one (not replayed)."""
    rec = read_sacct(RECORDED)
    got = sorted((j.account, j.gres, j.count, j.time_limit_s) for j in rec.trace.jobs)
    assert got == sorted([("physics", "1g.10gb", 1, 300), ("bio", "1g.10gb", 2, 86400), ("bio", "3g.40gb", 1, 600),
                          ("physics", "7g.80gb", 1, 1800), ("bio", "3g.40gb", 1, 1200),
                          ("physics", "1g.10gb", 1, 900), ("physics", "1g.10gb", 1, 900)])
    assert rec.skipped == {"ended before starting": 1} and rec.nodes == {"gpu1"}
    assert rec.trace.start.isoformat() == "2026-11-28T03:52:44"
    assert [j.duration_s for j in rec.trace.jobs if j.gres == "7g.80gb"] == [1800]
    assert sorted(j.duration_s for j in rec.trace.jobs if j.gres != "7g.80gb") == [1, 1, 1, 1, 2, 3]
    assert rec.end_s == 10 + 3600  # the last end, 10 s in, and an hour for what is still waiting


def test_job_steps_are_skipped_and_the_jobs_kept() -> None:
    steps = (FIX / "sacct-parsable2-steps.txt").read_text()
    assert ".batch|" in steps
    assert read_sacct("steps", steps).trace.jobs == read_sacct(RECORDED).trace.jobs


def test_without_jobid_a_line_with_no_partition_and_no_limit_is_a_step(tmp_path: Path) -> None:
    header = "Submit|Start|End|Partition|Timelimit|AllocTRES"
    job = "2026-11-28T10:00:00|2026-11-28T10:00:00|2026-11-28T10:10:00|main|20:00|gres/gpu:2g.20gb=1"
    step = "2026-11-28T10:00:00|2026-11-28T10:00:00|2026-11-28T10:10:00|||gres/gpu:2g.20gb=1"
    rec = read_sacct(sacct(tmp_path, job, step, header=header))
    assert [(j.gres, j.duration_s, j.time_limit_s, j.account) for j in rec.trace.jobs] == [("2g.20gb", 600, 1200, "-")]


@pytest.mark.parametrize("limit,seconds", [("UNLIMITED", math.inf), ("Partition_Limit", math.inf),
                                           ("2-01:00:00", 49 * 3600), ("45:30", 45 * 60 + 30), ("01:00:00", 3600)])
def test_time_limits_as_slurm_prints_them(tmp_path: Path, limit: str, seconds: float) -> None:
    rec = read_sacct(sacct(tmp_path, OK.replace("|01:00:00|", f"|{limit}|")))
    assert rec.trace.jobs[0].time_limit_s == seconds


def test_a_job_on_two_nodes_is_one_job_over_both_with_its_share_on_each_and_two_types_are_two_jobs(
        tmp_path: Path) -> None:
    line = OK.replace("gres/gpu:1g.10gb=1|gres/gpu:1g.10gb=1|1|gpu1",
                      "gres/gpu:1g.10gb=3,gres/gpu:2g.20gb=2,gres/gpu=5|gres/gpu=5|2|gpu[1-2]")
    rec = read_sacct(sacct(tmp_path, line))
    assert sorted((j.gres, j.count, j.nodes) for j in rec.trace.jobs) == [("1g.10gb", 2, 2), ("2g.20gb", 1, 2)]
    assert {j.job for j in rec.trace.jobs} == {"9"}  # (one of the jobs Slurm's backfill tests)
    assert rec.nodes == {"gpu1", "gpu2"}


def test_what_cannot_be_placed_is_counted_not_replayed(tmp_path: Path) -> None:
    rows = [OK,
            OK.replace("gres/gpu:1g.10gb=1|gres/gpu:1g.10gb=1", "gres/gpu=1|gres/gpu=1"),  # no type tracked
            OK.replace("gres/gpu:1g.10gb=1|gres/gpu:1g.10gb=1", "gres/gpu:a100=1|gres/gpu:a100=1"),  # a whole GPU
            OK.replace("gres/gpu:1g.10gb=1|gres/gpu:1g.10gb=1", "cpu=4,mem=1G|cpu=4"),  # no GPU
            OK.replace("2026-11-28T10:01:00|2026-11-28T10:11:00", "Unknown|Unknown").replace("|01:00:00|",
                                                                                              "|UNLIMITED|"),
            OK.replace("|main|", "|cpu|")]
    rec = read_sacct(sacct(tmp_path, *rows), partition="main")
    assert len(rec.trace.jobs) == 1
    assert rec.skipped == {"untyped (gres/gpu=N: no MIG type asked or tracked)": 1,
                           "asking a GPU type that is not a MIG type": 1, "without a GPU": 1,
                           "still pending with no time limit": 1, "not in partition main": 1}


def test_a_job_that_ended_before_it_started_is_counted_not_replayed_and_the_rest_are(tmp_path: Path) -> None:
    """A clock stepped back leaves sacct a record whose End is before its Start (Elapsed ``INVALID``): it is
    Slurm's own output, so one such job is left out and counted, not the whole month refused."""
    stepped = OK.replace("2026-11-28T10:11:00", "2026-11-28T09:00:00")
    rec = read_sacct(sacct(tmp_path, OK, stepped, OK))
    assert len(rec.trace.jobs) == 2
    assert rec.skipped == {"End before Start (a clock stepped back: sacct's Elapsed INVALID)": 1}


def test_bytes_that_are_not_utf8_are_read(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sacct"
    path.write_bytes((HEADER + "\n" + OK.replace("phys", "f\xfcr")).encode("latin-1"))
    assert read_sacct(path).trace.jobs[0].account == "f\ufffdr"


@pytest.mark.parametrize("lines,said", [
    ((), "jobs.sacct: no job to replay (no job lines)"),
    ((OK.replace("|gpu1|COMPLETED", "|gpu1"),), "jobs.sacct:2: 11 fields where the header names 12"),
    ((OK.replace("2026-11-28T10:00:00", "11/28 10:00"),), "jobs.sacct:2: Submit: '11/28 10:00' is not a time"),
    ((OK.replace("|01:00:00|", "|soon|"),), "jobs.sacct:2: Timelimit: 'soon' is not a Slurm time"),
    ((OK.replace("|1|gpu1|", "|two|gpu1|"),), "jobs.sacct:2: NNodes: 'two' is not a count of nodes"),
])
def test_a_bad_line_is_named_by_file_line_and_field(tmp_path: Path, lines: tuple[str, ...], said: str) -> None:
    with pytest.raises(SacctError) as e:
        read_sacct(sacct(tmp_path, *lines))
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_header_without_the_times_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SacctError, match=r"jobs.sacct:1: the header names no Start, End"):
        read_sacct(sacct(tmp_path, header="JobID|Submit|AllocTRES|Timelimit"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SacctError, match="empty: the first line must name the fields"):
        read_sacct(tmp_path / "empty")


def test_parsable_with_its_trailing_bar_is_read(tmp_path: Path) -> None:
    rec = read_sacct(sacct(tmp_path, OK + "|", header=HEADER + "|"))
    assert [j.gres for j in rec.trace.jobs] == ["1g.10gb"]


def _setup(tmp_path: Path, start: datetime, top: str = "", demand: str = "") -> tuple[Config, Setup]:
    """bench/demand.yaml, with ``top`` put before it and ``demand`` after (its slurm.demand section is last)."""
    cfg_path = tmp_path / "migd.yaml"
    cfg_path.write_text(top + (REPO / "bench" / "demand.yaml").read_text().replace(
        "profiles_dir: ../profiles", f"profiles_dir: {REPO / 'profiles'}") + demand)
    cfg = load_config(cfg_path, cfg_path.read_text())
    return cfg, Setup.of(cfg, [MODELS["H100-SXM5-80GB"]] * 2, start, 1)


def test_the_three_are_weighed_and_the_best_fixed_mix_loads_in_migd(tmp_path: Path) -> None:
    """On the recorded jobs (a Saturday: the schedule holds night, 7g only), the best fixed mix found
    starts the 1g and 3g jobs the schedule leaves waiting; written out, it is a configuration migd's
    own loader takes, whose schedule holds that mix."""
    rec = read_sacct(RECORDED)
    cfg, setup = _setup(tmp_path, rec.trace.start)
    w = weigh(setup, rec.trace.jobs, 1, 1, rec.end_s, rec.end_s / 86400, 6)
    assert set(w.results) == {MIGD, CURRENT, BEST}
    assert w.results[CURRENT]["p95_by_type_s"]["1g.10gb"] > 3000  # night all weekend: no 1g until the end
    assert w.results[BEST]["p95_by_type_s"]["1g.10gb"] < 120
    written = write_suggestion(tmp_path / "out", w.best_nodes, cfg.profiles, setup.candidates.names, "UTC", "test")
    assert [x.layout for x in written] == list(w.best_nodes)
    loaded = load_config(written[0].config_file)
    assert [e.profile for e in loaded.schedule.entries] == ["whatif-1"]
    held = node_layout(loaded.profiles["whatif-1"], [MODELS["H100-SXM5-80GB"]] * 2)
    assert held.capacity == setup.mixes[w.best_nodes[0]].capacity
    write_mig_parted(tmp_path / "mig-parted.yaml", written, setup.candidates, "test")
    parted = load_profile(tmp_path / "mig-parted.yaml", config="whatif-1")  # as migd reads a mig-parted file
    assert node_layout(parted, [MODELS["H100-SXM5-80GB"]] * 2).capacity == held.capacity


@pytest.mark.parametrize("top,demand,wait", [
    ("", "", 260.0),  # decided at 180 s, read by the node at 210 s, switched by 390 s
    ("reconcile_interval: 40s\n", "    interval: 2m\n", 320.0),  # decided at 240 s, read at 260 s (the 270 s step)
])
def test_migd_is_replayed_deciding_at_the_planners_interval_and_read_by_its_node_a_half_pass_later(
        tmp_path: Path, top: str, demand: str, wait: float) -> None:
    """A 2g job at 130 s on a node in night-two (no 2g): the planner decides at its ``interval`` (60 s by
    default, as the daemon), the node's migd reads the want on its next pass (on average half a
    ``reconcile_interval`` later), then the switch's 180 s: the job's wait says all three (the model's
    steps are 30 s)."""
    _, setup = _setup(tmp_path, datetime(2026, 11, 28), top, demand)  # a Saturday: night-two
    assert setup.scheduled(0.0).name == "night-two"
    jobs = [TraceJob(130.0, "bio", "gpu", "2g.20gb", 2, 1800.0, 4 * 3600.0)]
    figures = replayer(setup, jobs, 1, 1, 3 * 3600.0, 0.125, settled_s=86400.0)(policies.migd(setup), None)
    assert figures["p95_by_type_s"]["2g.20gb"] == wait


def test_a_want_its_node_has_not_read_yet_counts_as_a_change_under_way(tmp_path: Path) -> None:
    """With passes of 10 minutes a want waits 5 minutes for its node (on average), and the node takes
    jobs meanwhile: a 3g job starts on gpu000 after the planner wanted it balanced for a 2g job.  The
    planner, deciding every minute, reads that want back as a change under way (the 2g job's place), as
    the real planner reads its wants, and does not change gpu001 too; gpu000 switches when the 3g job
    has run."""
    _, setup = _setup(tmp_path, datetime(2026, 11, 28), "reconcile_interval: 10m\n")
    assert (setup.interval_s, setup.lag_s) == (60.0, 300.0)
    jobs = [TraceJob(130.0, "bio", "gpu", "2g.20gb", 2, 1800.0, 4 * 3600.0),
            TraceJob(200.0, "cv", "gpu", "3g.40gb", 2, 7200.0, 4 * 3600.0)]
    c = policies.cluster(setup, 2, 2, None, 86400.0)
    c.drain_lag_s = setup.lag_s
    run(jobs, c, policies.migd(setup), 3 * 3600.0, decide_every_s=setup.interval_s)
    assert [[(t, a.name, b.name) for t, a, b in n.history] for n in c.nodes] == [
        [(210.0 + 7200.0, "night-two", "balanced")], []]  # (the 3g job started at the 210 s step)


@pytest.mark.parametrize("over", [2, 3])
def test_a_job_over_several_nodes_of_a_type_no_node_offers_gets_its_nodes_and_starts_on_all_at_once(
        tmp_path: Path, over: int) -> None:
    """A 2g job over two (three) nodes on a Saturday's night-two (no 2g): its type needs as many places as
    its nodes, and the rule changes a node per wave, one after another; the job starts only when the
    last of its nodes has switched, on all of them at once (Slurm's select_nodes), not its first share
    on the first node ready."""
    _, setup = _setup(tmp_path, datetime(2026, 11, 28))
    jobs = [TraceJob(130.0, "bio", "gpu", "2g.20gb", 2, 1800.0, 4 * 3600.0, job="5", nodes=over)]
    c = policies.cluster(setup, 3, 1, None, 86400.0)
    c.drain_lag_s = setup.lag_s
    run(jobs, c, policies.migd(setup), 3 * 3600.0, decide_every_s=setup.interval_s)
    switched = [n.history[0][0] for n in c.nodes if n.history]
    assert len(switched) == over and [n.history[0][2].name for n in c.nodes if n.history] == ["balanced"] * over
    (job,) = c.jobs()
    assert job.start == max(switched) + setup.params.switch_s
    assert c.done == [job]  # (ended on all its nodes as one job)


def test_two_replays_of_one_trace_decide_alike_to_the_last_digit(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule orders jobs by their ids, and sums in that order: the replay names each job by when it
    first saw it, not by ``id()`` (another in every run), so the same trace gives the same figures."""
    _, setup = _setup(tmp_path, datetime(2026, 11, 26))
    jobs = [TraceJob(60.0 * i, f"a{i % 3}", "gpu", ("1g.10gb", "2g.20gb", "3g.40gb")[i % 3], 1 + i % 2,
                     600.0 + 37.0 * i, 3600.0) for i in range(120)]
    seen: list[list[tuple[str, str, float, float]]] = []
    named: set[str] = set()

    def decide(snap: Snapshot, *args: Any, **kwargs: Any) -> Any:
        named.update(p.job for p in snap.pending)
        d = rule_decide(snap, *args, **kwargs)
        seen[-1].extend((c.node, c.new, c.benefit_slice_h, c.cost_slice_h) for c in d.changes)
        return d
    monkeypatch.setattr(policies, "decide", decide)
    for _ in range(2):
        seen.append([])
        replayer(setup, jobs, 2, 1, 4 * 3600.0, 1 / 6)(policies.migd(setup), None)
    assert seen[0] and seen[0] == seen[1]
    assert named == {str(i) for i in range(len(named))}  # numbered as first seen, not by id()


def test_migctl_what_if_prints_the_three_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "migd.yaml"
    cfg.write_text((REPO / "bench" / "demand.yaml").read_text().replace(
        "profiles_dir: ../profiles", f"profiles_dir: {REPO / 'profiles'}"))
    code = migctl(["what-if", "--sacct", str(RECORDED), "--config", str(cfg), "--gpus", "2", "--search", "4"])
    out = capsys.readouterr().out
    assert code == 0
    head = next(line for line in out.splitlines() if "migd demand" in line)
    assert head.split() == ["migd", "demand", "current", "schedule", "best", "fixed", "mix"]
    assert {"wait p50", "wait p95", "worst type p95", "p95 1g.10gb", "p95 3g.40gb", "p95 7g.80gb"} <= {
        line[:24].strip() for line in out.splitlines()}
    assert "7 jobs replayed; not replayed: 1 ended before starting" in out
    assert ", 1 node of 2 x H100-SXM5-80GB, " in out  # the record's one node, not "1 nodes"


def test_the_documented_what_if_of_the_recording_is_what_migctl_prints(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/demand.md's what-if of the recorded sacct is what its command prints, pinned (the replay is
    deterministic: nothing to mask)."""
    monkeypatch.chdir(REPO)
    code = migctl(["what-if", "--sacct", "tests/fixtures/slurm/sacct-parsable2.txt", "--config", "bench/demand.yaml"])
    assert code == 0
    out = capsys.readouterr().out
    check_golden("whatif-recorded.txt", out)
    assert f"```\n{out}```\n" in (REPO / "docs" / "demand.md").read_text()  # as the docs show it


@pytest.mark.parametrize("argv,said", [
    (["--sacct", "/nonexistent.sacct"], "error: /nonexistent.sacct: cannot read: No such file or directory"),
    (["--sacct", str(RECORDED), "--config", "/nonexistent.yaml"], "error: "),
])
def test_migctl_what_if_refuses_in_one_line(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert migctl(["what-if", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_migctl_what_if_reads_sacct_from_standard_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "migd.yaml"
    cfg.write_text((REPO / "bench" / "demand.yaml").read_text().replace(
        "profiles_dir: ../profiles", f"profiles_dir: {REPO / 'profiles'}"))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(RECORDED.read_bytes())))
    assert migctl(["what-if", "--sacct", "-", "--config", str(cfg), "--search", "2", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sacct"] == "-" and doc["jobs"] == 7 and doc["nodes"] == 1
