"""bench/demand.py: its queue model behaves as the real-Slurm tests show Slurm does, its clock follows
the calendar, its baselines are sized as documented, its trace CSV is read or refused as documented,
and its report has the promised shape."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration  # the bench as a program

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import demand_policies as policies  # noqa: E402
from demand_alibaba import mig_type  # noqa: E402
from demand_gen import THURSDAY, clock_right, over_two_nodes, shifting, synthetic  # noqa: E402
from demand_pool import pool  # noqa: E402
from demand_trace import DAY, TraceJob, read_csv, write_csv  # noqa: E402

from migd.demand.inputs import Layout  # noqa: E402
from migd.whatif.figures import killed, pct, reversals, targets  # noqa: E402
from migd.whatif.fixedmix import accounting, hindsight, slice_hours, spread  # noqa: E402
from migd.whatif.replay import Cluster, run  # noqa: E402
from migd.whatif.shift import SHIFT_MIN  # noqa: E402

CONFIG = REPO / "bench" / "demand.yaml"
SETUP = policies.Setup.load(CONFIG, "dgx-h100", THURSDAY, 1)


def one_node(layout: str = "day") -> Cluster:
    return policies.cluster(SETUP, 1, 1, [SETUP.layouts[layout]])


def job(at: float, gres: str, run_s: float, count: int = 1) -> TraceJob:
    return TraceJob(at, "a", "gpu", gres, count, run_s, run_s * 2)


def test_a_running_job_is_not_cut_short_and_the_switch_waits_for_it() -> None:
    """As tests/test_slurm.py shows on real Slurm: drained, the node starts nothing new, its job runs to
    its end, then the layout changes (after the switch's own time)."""
    c = one_node("day")
    night = c.layouts["night"]
    trace = [job(0, "1g.10gb", 600), job(60, "1g.10gb", 60)]

    def policy(now: float, cl: Cluster) -> dict[str, Layout]:
        return {"gpu000": night} if now == 300 else {}
    run(trace, c, policy, 3600, decide_every_s=300)
    node = c.nodes[0]
    assert node.layout.name == "night" and node.switches == [600.0]  # when the job ended, not at 300
    assert killed(c, c.jobs()) == 0 and len(c.done) == 2
    node.history.append((30.0, night, c.layouts["day"]))  # (a switch while the first job ran: it is counted)
    assert killed(c, c.jobs()) == 1
    assert c.drain_slice_s == pytest.approx((56 - 1) * 300 + 56 * 180)  # drain with one busy slice, then the switch


def test_a_job_for_a_type_the_layout_lacks_waits_for_that_layout() -> None:
    """As on real Slurm: a job queued for the day layout stays pending through the night."""
    c = one_node("night")
    run([job(0, "1g.10gb", 60)], c, lambda now, cl: {}, 3600)
    assert c.done == [] and len(c.pending["1g.10gb"]) == 1


def test_slices_idle_while_a_job_waits_are_counted_apart_from_the_drain() -> None:
    """A 1g job waits on a night node from 0 to 300 s: every slice idles while it waits; then the node
    drains (nothing running: the switch's 180 s are drain, not idle-while-waiting); once the day layout
    serves, the job starts and nothing waits (idle slices then count nowhere)."""
    c = one_node("night")
    day = c.layouts["day"]
    run([job(0, "1g.10gb", 60)], c, lambda now, cl: {"gpu000": day} if now == 300 else {}, 3600,
        decide_every_s=300)
    assert [j.start for j in c.done] == [480.0]  # switched at 300, ready after the switch's 180 s
    assert c.idle_waiting_slice_s == pytest.approx(56 * 300)
    assert c.drain_slice_s == pytest.approx(56 * 180)


def test_the_clock_follows_the_calendar_from_the_traces_start() -> None:
    """Thursday 00:00 is second 0: Friday 10:00 is day, Saturday and Sunday night-two, and Monday 10:00
    is day again (a trace longer than four days is not one long weekend)."""
    at = {d: SETUP.scheduled(d * DAY + 10 * 3600).name for d in range(7)}
    assert at == {0: "day", 1: "day", 2: "night-two", 3: "night-two", 4: "day", 5: "day", 6: "day"}
    assert SETUP.scheduled(4 * DAY + 20 * 3600).name == "night"
    monday = policies.Setup.load(CONFIG, "dgx-h100", datetime(2026, 11, 30), 1)
    assert monday.scheduled(10 * 3600).name == "day" and monday.scheduled(5 * DAY + 10 * 3600).name == "night-two"


def test_generated_traces_follow_the_calendar_and_are_seeded() -> None:
    week = synthetic(1, 7)
    busy = {d: sum(1 for j in week.jobs if d * DAY <= j.submit_s < (d + 1) * DAY) for d in range(7)}
    assert busy[4] > 3 * busy[2] and busy[4] > 3 * busy[3]  # Monday is a working day again
    assert synthetic(1, 7) == week and shifting(2, 3) == shifting(2, 3) and clock_right(1, 2).clock_right
    night = [j for j in clock_right(2, 5).jobs if j.gres == "7g.80gb"]
    assert night and all((j.submit_s % DAY) / 3600 >= 19 or (j.submit_s % DAY) / 3600 < 6 for j in night)


def test_two_node_spreads_a_share_of_the_even_whole_gpu_jobs_over_two_nodes_with_the_same_work(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--two-node SHARE: that share of the jobs asking an even number of 7g instances asks half on each
    of two nodes; every other job, and every job's times, are as in the trace without; the share is
    drawn from its own seeded stream; a share outside 0-1 is one line and exit 2."""
    import demand

    plain = synthetic(8, 4)
    even = [i for i, j in enumerate(plain.jobs) if j.gres == "7g.80gb" and j.count % 2 == 0]
    half, every = over_two_nodes(plain, 0.5), over_two_nodes(plain, 1.0)
    assert over_two_nodes(plain, 0.0).jobs == plain.jobs and over_two_nodes(plain, 0.5) == half
    assert [i for i, j in enumerate(every.jobs) if j.nodes == 2] == even
    spread = [i for i, j in enumerate(half.jobs) if j.nodes == 2]
    assert 0.3 * len(even) < len(spread) < 0.7 * len(even) and set(spread) <= set(even)
    for a, b in zip(plain.jobs, half.jobs, strict=True):
        assert b == (replace(a, count=a.count // 2, nodes=2) if b.nodes == 2 else a)
    assert demand.main(["--two-node", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err == "demand.py: --two-node 1.5: a share is between 0 and 1\n"


def test_seed_draws_the_generated_trace_again_and_a_record_refuses_it(tmp_path: Path) -> None:
    """--seed: the same generator, another draw (how much a figure owes to one draw); the default is the
    trace's own seed; a CSV or sacct record has no seed to draw: one line, exit 2."""
    import demand

    again = demand.load_trace(demand.parse(["--seed", "1"]), 2, 1.0)
    assert again.jobs == synthetic(2, 1, seed=1).jobs != demand.load_trace(demand.parse([]), 2, 1.0).jobs
    assert demand.load_trace(demand.parse([]), 2, 1.0).jobs == synthetic(2, 1).jobs
    assert demand.load_trace(demand.parse(["--trace", "shifting", "--seed", "5"]), 2, 1.0) == shifting(2, 1, seed=5)
    path = tmp_path / "jobs.csv"
    write_csv(path, list(synthetic(1, 1).jobs[:5]))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path), "--seed", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--seed" in r.stderr and "jobs.csv" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_accounting_mix_is_sized_from_slice_hours_per_type() -> None:
    """Only whole-GPU work: every GPU night.  Equal slice-hours of 1g and 7g work: GPUs split between
    day and night, none to layouts that serve neither."""
    assert accounting(SETUP, [job(0, "7g.80gb", 3600)], 2) == (0, 16, 0, 0)
    half = accounting(SETUP, [job(0, "7g.80gb", 3600), job(0, "1g.10gb", 7 * 3600)], 2)
    assert half == (8, 8, 0, 0)
    wide = replace(job(0, "7g.80gb", 3600), nodes=2)  # (its share on each of two nodes: twice the work)
    assert accounting(SETUP, [wide, job(0, "1g.10gb", 14 * 3600)], 2) == half
    assert slice_hours([wide]) == {"7g.80gb": 14.0}
    assert spread(SETUP, (4, 11, 0, 1)) == ["day*4/night*4", "night*7/balanced"]


def test_the_hindsight_search_climbs_to_the_best_split_it_can_reach() -> None:
    """A replay whose objective is the distance to a known best split: the climb reaches it, from the
    accounting mix, within its budget, and says how many replays it made."""
    goal = (3, 10, 0, 3)

    seen: list[tuple[int, ...]] = []

    def replay_counts(mix: list[str]) -> dict[str, Any]:
        line = [part.split("*")[0] for m in mix for part in m.split("/")
                for _ in range(int(part.split("*")[1]) if "*" in part else (8 if "/" not in m else 1))]
        counts = tuple(line.count(n) for n in SETUP.candidates.names)
        seen.append(counts)
        return {"distance": sum(abs(a - b) for a, b in zip(counts, goal, strict=True))}
    best, figures, replays = hindsight(SETUP, (0, 16, 0, 0), replay_counts, lambda r: (r["distance"], 0), 200)
    assert best == goal and figures["distance"] == 0 and replays == len(seen) <= 200
    _, _, capped = hindsight(SETUP, (0, 16, 0, 0), replay_counts, lambda r: (r["distance"], 0), 5)
    assert capped == 5


def test_a_switch_undoing_the_previous_within_6_hours_is_a_reversal() -> None:
    c = one_node("night")
    day, night, mix = (c.layouts[n] for n in ("day", "night", "day*4/night*4"))
    c.nodes[0].history = [(0.0, night, day), (3600.0, day, night)]
    assert reversals(c) == 1
    c.nodes[0].history = [(0.0, night, day), (7 * 3600.0, day, night)]  # after 7 hours: a new turn of demand
    assert reversals(c) == 0
    c.nodes[0].history = [(0.0, night, day), (3600.0, day, mix)]  # half of it undone
    assert reversals(c) == 1


@pytest.mark.parametrize("milli,gpus,asked", [(100, 1, ("1g.10gb", 1)), (250, 1, ("2g.20gb", 1)),
                                              (429, 1, ("3g.40gb", 1)), (460, 1, ("7g.80gb", 1)),
                                              (1000, 4, ("7g.80gb", 4)), (0, 0, None)])
def test_a_gpu_sharing_pod_maps_to_the_smallest_mig_type_covering_its_share(milli: int, gpus: int,
                                                                          asked: tuple[str, int] | None) -> None:
    assert mig_type(gpus, milli) == asked


def short(*extra: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--short", "--json", *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_the_short_bench_reports_every_policy_and_target() -> None:
    doc = short()
    keys = {"wait_p50_s", "wait_p95_s", "worst_type", "worst_type_p95_s", "p95_by_type_s", "p95_by_account_s",
            "never_started", "reversals_6h", "reconfigs_per_node_day", "drain_slice_hours", "idle_waiting_slice_hours",
            "jobs_killed"}
    assert set(doc["policies"]) == {"clock", "greedy", "migd", "fixed-accounting", "fixed-hindsight"}
    for p in doc["policies"].values():
        assert keys <= set(p) and p["jobs_killed"] == 0 and 0 < p["utilization"] < 1
        assert p["worst_type_p95_s"] == max(p["p95_by_type_s"].values())
    assert doc["start"].startswith("2026-11-26T00:00") and doc["hindsight_replays"] <= 6
    assert {t["target"].split(" (")[0] for t in doc["targets"]} >= {
        "p95 <= fixed mix from accounting", "0 jobs killed", "under 10% of changes reversed within 6 h"}
    assert set(doc["pool"]) >= {"wait_p95_s", "worst_type_p95_s", "p95_by_type_s", "never_started"}
    assert all(doc["pool"]["wait_p95_s"] <= p["wait_p95_s"] for p in doc["policies"].values())  # none reaches it


def fig(p95: int, worst: int) -> dict[str, Any]:
    """A policy's figures as targets() reads them: p95 over all jobs and the worst type's, the rest met."""
    return {"wait_p95_s": p95, "worst_type_p95_s": worst, "worst_type": "7g.80gb", "reversals_6h": 0,
            "changes": 5, "jobs_killed": 0, "reconfigs_per_node_day": 0.1}


def test_a_hindsight_target_below_the_pool_is_said_to_be_out_of_any_policys_reach() -> None:
    """A week whose best fixed mix waits 28 s, the model's floor (it moves in 30-s steps), cannot be waited
    0.85x of: the pool of the fleet's slices, whose p95 no policy beats, waits as long.  The target stays
    not met, and says why; where the pool waits less over all jobs (its worst type may wait longer: it
    passes a large job), a miss is only a miss."""
    results = {"migd": fig(28, 28), "fixed-accounting": fig(28, 3178), "fixed-hindsight": fig(28, 28),
               "clock": fig(9999, 9999)}

    def hindsight_target(pool: dict[str, Any] | None) -> tuple[bool, str]:
        (_, ok, figures), = [t for t in targets(results, False, pool) if "hindsight" in t[0]]
        return ok, figures
    ok, figures = hindsight_target(fig(28, 28))
    assert not ok and figures == ("28 / 28 s against 0.85 x 28 / 28 s; out of any policy's reach: one pool of "
                                  "the fleet's slices waits 28 s over all jobs")
    for below in (fig(10, 12), fig(20, 900), None):
        ok, figures = hindsight_target(below)
        assert not ok and figures == "28 / 28 s against 0.85 x 28 / 28 s"


def test_the_hindsight_target_does_not_apply_where_the_traces_mix_holds() -> None:
    """The 0.85x-hindsight target is for demand that shifts: below SHIFT_MIN (migd/whatif/shift.py) it is
    said not to apply (met None) with its figures, at SHIFT_MIN or above, or unmeasured, it is weighed."""
    results = {"migd": fig(28, 28), "fixed-accounting": fig(28, 3178), "fixed-hindsight": fig(28, 28),
               "clock": fig(9999, 9999)}

    def hindsight_target(shift: float | None) -> tuple[bool | None, str]:
        (_, ok, figures), = [t for t in targets(results, False, None, shift) if "hindsight" in t[0]]
        return ok, figures
    assert hindsight_target(0.03) == (None, f"does not apply: the trace's mix holds (distance 0.030, under "
                                            f"{SHIFT_MIN:.2f}); 28 / 28 s against 0.85 x 28 / 28 s")
    assert hindsight_target(SHIFT_MIN - 0.0004)[0] is None  # (the measure itself decides, not its rounding)
    for weighed in (SHIFT_MIN, 0.4, None):
        assert hindsight_target(weighed) == (False, "28 / 28 s against 0.85 x 28 / 28 s")
    results["migd"] = fig(20, 20)
    assert hindsight_target(0.2) == (True, "20 / 20 s against 0.85 x 28 / 28 s")


def test_the_bench_says_the_hindsight_target_does_not_apply_to_a_steady_trace(tmp_path: Path) -> None:
    """A trace asking the same mix every hour: bench/demand.py measures its shift (0) and prints the
    hindsight target as not applying, in its text and its JSON (met null), the other targets weighed."""
    path = tmp_path / "steady.csv"
    write_csv(path, [TraceJob(h * 1800.0 + k, "a", "gpu", gres, 1, 1500.0, 3600.0)
                     for h in range(40) for k, gres in enumerate(("1g.10gb", "7g.80gb"))])
    args = [sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path), "--nodes", "1", "--days", "1",
            "--search", "1"]
    doc = json.loads(subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert doc["shift"] == pytest.approx(0.0, abs=1e-9)
    (hind,) = [t for t in doc["targets"] if "hindsight" in t["target"]]
    assert hind["met"] is None and hind["figures"].startswith("does not apply: the trace's mix holds (distance 0.000")
    assert all(isinstance(t["met"], bool) for t in doc["targets"] if t is not hind)
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert f"how far the trace's mix shifts (migd/whatif/shift.py; it shifts from {SHIFT_MIN:.2f}): 0.000" in out
    assert [x for x in out if x.startswith("target n/a")] == [
        f"target n/a      p95 <= 0.85x best fixed mix in hindsight (all jobs / worst type): {hind['figures']}"]


def test_the_seeds_bench_counts_a_target_only_where_it_applies() -> None:
    """A target that does not apply to a seed (met None) is neither met nor missed there: it counts in
    neither figure of its line, and the line says on how many seeds it applied."""
    import demand_seeds

    met: dict[str, list[int]] = {}
    hind = "p95 <= 0.85x best fixed mix in hindsight (all jobs / worst type)"
    for ok in (True, None, False):
        missed = demand_seeds.tally(met, [(hind, ok, ""), ("0 jobs killed", True, "0")])
        assert missed == (["p95 <= 0.85x best fixed mix in hindsight"] if ok is False else [])
    assert met == {hind: [1, 2], "0 jobs killed": [3, 3]}
    assert demand_seeds.summary(hind, 1, 2, 3) == f"met on 1 of 2 seeds: {hind} (it applies to 2 of 3)"
    assert demand_seeds.summary("0 jobs killed", 3, 3, 3) == "met on 3 of 3 seeds: 0 jobs killed"
    assert demand_seeds.summary(hind, 0, 0, 3) == f"applies to no seed of 3: {hind}"


def test_the_pool_starts_a_job_on_any_free_slices_in_arrival_order_passing_one_that_does_not_fit() -> None:
    """Seven slices pooled: a 7g job runs; a 1g job behind it waits for its end, whatever the types; then
    a 7g job that cannot fit beside the 1g waits while a later 2g job that fits starts at once."""
    jobs = [job(0, "7g.80gb", 600), job(30, "1g.10gb", 900), job(720, "7g.80gb", 300), job(750, "2g.20gb", 60)]
    got = pool(jobs, 7, 3600)
    assert got["p95_by_type_s"] == {"1g.10gb": 570, "2g.20gb": 0, "7g.80gb": round(pct([0.0, 780.0], 95))}
    assert got["never_started"] == 0
    assert pool([job(0, "7g.80gb", 600)], 6, 300)["never_started"] == 1  # more than the pool: never, censored
    wide = replace(job(0, "7g.80gb", 600), nodes=2)  # (its share on each of two nodes: 14 slices)
    assert pool([wide], 13, 300)["never_started"] == 1 and pool([wide], 14, 300)["never_started"] == 0


def test_the_candidates_come_from_the_configuration(tmp_path: Path) -> None:
    """A site whose migd.yaml offers only day and night: the bench weighs those two, no other."""
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(CONFIG.read_text().replace("candidates: [day, night, night-two, balanced]",
                                              "candidates: [day, night]").replace(
        "profiles_dir: ../profiles", f"profiles_dir: {REPO / 'profiles'}"))
    doc = short("--config", str(cfg), "--search", "2")
    assert set(doc["accounting_gpus"]) == {"day", "night"}
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--config", str(tmp_path / "none.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "none.yaml" in r.stderr and "Traceback" not in r.stderr


def test_a_trace_replays_from_csv(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    jobs = list(synthetic(2, 1).jobs[:50])
    write_csv(path, jobs)
    assert read_csv(path) == jobs
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path), "--nodes", "2",
                        "--days", "0.5", "--search", "2", "--start", "2026-11-30T00:00", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["jobs"] == 50 and doc["start"].startswith("2026-11-30")


def test_a_job_over_several_nodes_keeps_its_nodes_through_the_csv(tmp_path: Path) -> None:
    """The column is written only where a job spans several nodes, and read where it is there."""
    path = tmp_path / "jobs.csv"
    jobs = [job(0, "3g.40gb", 600), replace(job(10, "3g.40gb", 600), nodes=2)]
    write_csv(path, jobs)
    assert path.read_text().splitlines()[0].endswith(",time_limit_s,nodes") and read_csv(path) == jobs
    write_csv(path, jobs[:1])
    assert path.read_text().splitlines()[0].endswith(",time_limit_s") and read_csv(path) == jobs[:1]
    path.write_text("submit_s,account,partition,gres,count,duration_s,time_limit_s,nodes\n10,a,gpu,1g.10gb,1,6,9,1.5\n")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "jobs.csv:2: nodes: 1.5 is not a whole number of nodes" in r.stderr, r.stderr
    path.write_text("submit_s,account,partition,gres,count,duration_s,time_limit_s,nodes\n10,a,gpu,1g.10gb,1,6,9\n")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "jobs.csv:2: nodes: None is not a number" in r.stderr, r.stderr


def test_a_header_with_spaces_is_read_as_it_is_checked(tmp_path: Path) -> None:
    """The header was checked with its names stripped and read without: ``KeyError`` on the first row."""
    path = tmp_path / "jobs.csv"
    path.write_text(" submit_s, account,partition,gres,count,duration_s,time_limit_s\n10, a,gpu,1g.10gb,1,600,900\n"
                    "\n20,b,gpu,2g.20gb,1,60,90\n\n")  # (blank lines: no rows)
    assert [(j.submit_s, j.account, j.count) for j in read_csv(path)] == [(10, "a", 1), (20, "b", 1)]


@pytest.mark.parametrize("row,said", [
    ("10,a,gpu,1g.10gb,1,600,300", "jobs.csv:2: time_limit_s: 300 is shorter than duration_s 600"),
    ("10,a,gpu,gpu:1g,1,600,900", "jobs.csv:2: gres: 'gpu:1g' is not a MIG type"),
    ("ten,a,gpu,1g.10gb,1,600,900", "jobs.csv:2: submit_s: 'ten' is not a number"),
    ("10,a,gpu,1g.10gb,1.5,600,900", "jobs.csv:2: count: 1.5 is not a whole number"),
    ("10,a,gpu,1g.10gb,inf,600,900", "jobs.csv:2: count: inf is above 4,096"),  # (OverflowError: a traceback)
    ("10,a,gpu,1g.10gb,1,inf,inf", "jobs.csv:2: duration_s: inf is above 31,622,400"),  # (taken, for ever)
    ("10,\xff,gpu,1g.10gb,1,600,900", "jobs.csv: cannot read: not UTF-8 text"),  # (the file was not named)
])
def test_a_bad_trace_row_is_one_line_and_exit_2(tmp_path: Path, row: str, said: str) -> None:
    path = tmp_path / "jobs.csv"
    path.write_bytes(("submit_s,account,partition,gres,count,duration_s,time_limit_s\n" + row + "\n")
                     .encode("latin-1"))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--trace", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_clusters_sacct_replays_in_the_bench(tmp_path: Path) -> None:
    """--sacct: the recorded slurmdbd output (tests/fixtures/slurm/SOURCES.md), its one node and its span;
    a file that is not sacct's is one line, exit 2."""
    rec = REPO / "tests" / "fixtures" / "slurm" / "sacct-parsable2.txt"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--sacct", str(rec), "--search", "4",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["jobs"] == 7 and doc["nodes"] == 1 and doc["start"] == "2026-11-28T03:52:44"
    assert doc["policies"]["clock"]["p95_by_type_s"]["1g.10gb"] > doc["policies"]["migd"]["p95_by_type_s"]["1g.10gb"]
    bad = tmp_path / "jobs.sacct"
    bad.write_text("JobID|Submit|Start|End|Timelimit|AllocTRES\n1|2026-11-28T10:00:00|x|y|5|gres/gpu:1g.10gb=1\n")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--sacct", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "jobs.sacct:2: Start: 'x' is not a time" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_seeds_bench_spreads_jobs_over_two_nodes_as_the_bench_does(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/demand_seeds.py --two-node: each draw's row is bench/demand.py's with the same --two-node."""
    import demand_seeds

    argv = ["--nodes", "2", "--days", "1", "--search", "1", "--two-node", "1"]
    assert demand_seeds.main([*argv, "--seeds", "3"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), *argv, "--seed", "3", "--json"],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    assert "over two nodes" in doc["trace"]
    assert demand_seeds.main(["--two-node", "-0.5"]) == 2
    assert capsys.readouterr().err == "demand_seeds.py: --two-node -0.5: a share is between 0 and 1\n"
    assert [int(x) for x in row.split()[1:12] if x.isdigit()] == [
        doc["policies"][p][k] for p in ("migd", "fixed-accounting", "fixed-hindsight")
        for k in ("wait_p95_s", "worst_type_p95_s")]


def test_the_seeds_bench_gives_each_draw_as_the_bench_does_and_counts_the_targets_met(
        capsys: pytest.CaptureFixture[str]) -> None:
    """bench/demand_seeds.py: one row per seed with migd's, the accounting mix's and the hindsight mix's
    figures exactly as bench/demand.py --seed N prints them, and each target met on as many seeds as
    the rows do not list it missed; a bad --seeds is one line, exit 2."""
    import demand_seeds

    assert demand_seeds.main(["--nodes", "2", "--days", "1", "--seeds", "1,2", "--search", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {int(line.split()[0]): line for line in lines[1:3]}
    for seed, row in rows.items():
        r = subprocess.run([sys.executable, str(REPO / "bench" / "demand.py"), "--nodes", "2", "--days", "1",
                            "--seed", str(seed), "--search", "1", "--json"],
                           capture_output=True, text=True, timeout=120)
        doc = json.loads(r.stdout)
        figures = [int(x) for x in row.split()[1:12] if x.isdigit()]
        assert figures == [doc["policies"][p][k] for p in ("migd", "fixed-accounting", "fixed-hindsight")
                           for k in ("wait_p95_s", "worst_type_p95_s")]
        missed = {t["target"].split(" (")[0] for t in doc["targets"] if t["met"] is False}
        assert {m for m in row.split("  ")[-1].split("; ") if m != "-"} == missed
    counts = [line.split(" seeds: ") for line in lines if line.startswith("met on ")]
    assert len(counts) >= 4
    for head, target in counts:
        assert head == f"met on {sum(1 for row in rows.values() if target.split(' (')[0] not in row)} of 2"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "demand_seeds.py"), "--seeds", "5-2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "'5-2': the range ends before it starts" in r.stderr and "Traceback" not in r.stderr


def test_greedy_gives_a_job_over_two_nodes_a_share_on_each() -> None:
    """Two night nodes and a 2g job over both: greedy (nos places pods, each on one node) takes the job as
    two shares, one for each node to claim, so both nodes change and the job starts; as one share, one
    node changed and the job never started."""
    c = policies.cluster(SETUP, 2, 2, [SETUP.layouts["night"]] * 2)
    wide = replace(job(0, "2g.20gb", 600), nodes=2)
    run([wide], c, policies.greedy(SETUP), 3600, decide_every_s=300)
    (j,) = c.jobs()
    assert [n.layout.count("2g.20gb") > 0 for n in c.nodes] == [True, True] and j.start is not None
    assert len(j.nodes) == 2
