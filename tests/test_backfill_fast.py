"""The queue model's Slurm backfill pass (migd/whatif/backfill.py) is fast (reservations kept sorted and
bisected, cons_tres's estimates kept while no job starts, a pass skipped while nothing it reads has
changed and the clock has reached none of its turning points) and decides exactly as the pass written
plainly: the same start, on the same node, for every job of seeded traces with layout switches, drains,
overrunning jobs and a release delay."""

from __future__ import annotations

import json
import math
import random
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from migd.catalog.models import MODELS
from migd.config.migdyaml import load_config
from migd.ctl.migctl import main as migctl
from migd.demand.inputs import Layout
from migd.demand.reserve import BF_MAX_JOB_TEST
from migd.whatif import weigh
from migd.whatif.backfill import YEAR_S, Backfill, backfill, overlaps, will_run
from migd.whatif.jobs import TraceJob
from migd.whatif.policies import Setup, fixed
from migd.whatif.replay import Cluster, Job, Node, Policy, run

REPO = Path(__file__).resolve().parents[1]

SMALL = Layout.of("small", {"1g.10gb": 3})
BALANCED = Layout.of("balanced", {"1g.10gb": 2, "2g.20gb": 1})
WHOLE = Layout.of("whole", {"7g.80gb": 1, "2g.20gb": 1})
LAYOUTS = (SMALL, BALANCED, WHOLE)
TYPES = ("1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb", "7g.80gb")


def plain(nodes: list[Node], pending: dict[str, list[Job]], now: float, epoch_s: float) -> None:
    """The pass as first written: every window list scanned, every estimate made afresh, every step."""
    plan: dict[str, list[tuple[float, float]]] = {n.name: [] for n in nodes}
    usable = [n for n in nodes if n.target is None and n.ready_at is None]
    for job in sorted((j for q in pending.values() for j in q), key=lambda j: j.spec.submit_s)[:BF_MAX_JOB_TEST]:
        limit, s = job.spec.time_limit_s, now
        for _ in range(64):
            ends = [e for n in usable for b, e in plan[n.name] if b <= s + limit and e > s]
            free = [n for n in usable if not overlaps(plan[n.name], s, s + limit)]
            got = will_run(nodes, free, job.spec.gres, job.spec.count, now, epoch_s, wanted=job.spec.nodes)
            if got is None and not ends:
                break
            if got is None or (ends and max(s, got[0]) > min(ends)):
                s = min(ends)
            elif max(s, got[0]) <= now:
                job.start, job.nodes = now, tuple(n.name for n in got[1])
                for n in got[1]:
                    n.running.append(job)
                pending[job.spec.gres] = [j for j in pending[job.spec.gres] if j is not job]
                break
            elif any(overlaps(plan[n.name], max(s, got[0]), max(s, got[0]) + limit) for n in got[1]):
                s = max(s, got[0])
            else:
                for n in got[1]:
                    plan[n.name].append((max(s, got[0]), max(s, got[0]) + limit))
                break


def trace(rng: random.Random, jobs: int, span_s: float) -> list[TraceJob]:
    """Jobs of every type, limits from exact to twice the run time, a few running past their limit, some
    over two or three nodes."""
    out = []
    for _ in range(jobs):
        run_s = rng.choice((30.0, 60.0, 90.0)) * rng.randint(1, 20)
        limit = rng.choice((run_s, run_s * 1.5, run_s * 2, max(30.0, run_s - 60)))
        gres = rng.choice(TYPES)
        out.append(TraceJob(round(rng.uniform(0, span_s)), rng.choice("ab"), "main", gres,
                            rng.choice((1, 1, 2)) if gres == "1g.10gb" else 1, run_s, limit,
                            nodes=rng.choice((1, 1, 1, 1, 2, 3))))
    return sorted(out, key=lambda j: j.submit_s)


def switching(rng: random.Random) -> Policy:
    """A policy that now and then orders a node to another layout (the model drains and switches it)."""
    def policy(now: float, c: Cluster) -> dict[str, Layout]:
        if rng.random() < 0.3:
            n = rng.choice(c.nodes)
            return {n.name: rng.choice([lay for lay in LAYOUTS if lay.name != n.layout.name])}
        return {}
    return policy


def replayed(seed: int, step_s: float, reference: bool) -> list[tuple[float | None, str | None]]:
    rng = random.Random(seed)
    jobs = trace(rng, 160, 6 * 3600)
    nodes = [Node(f"gpu{i}", rng.choice(LAYOUTS), 7) for i in range(rng.randint(2, 4))]
    c = Cluster(nodes, {lay.name: lay for lay in LAYOUTS}, switch_s=120.0, reserve=True,
                release_s=rng.choice((0.0, 1.0, 30.0)), epoch_s=rng.uniform(0, 60), drain_lag_s=rng.choice((0.0, 30.0)))
    if reference:
        c.backfill = plain
    run(jobs, c, switching(random.Random(seed + 1000)), 12 * 3600, step_s=step_s, decide_every_s=600.0)
    job = {id(j.spec): j for j in c.jobs()}
    return [(job[id(t)].start, job[id(t)].node) for t in jobs]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("step_s", [30.0, 10.0])
def test_the_fast_pass_starts_every_job_when_and_where_the_plain_pass_does(seed: int, step_s: float) -> None:
    fast = replayed(seed, step_s, reference=False)
    assert fast == replayed(seed, step_s, reference=True)
    assert sum(1 for at, _ in fast if at is not None) > 40  # (the trace keeps the queue busy)


def deep(seed: int) -> tuple[list[Node], dict[str, list[Job]]]:
    """Nodes part full, some draining, some jobs past their limit's end; a deep queue of few shapes."""
    rng = random.Random(seed)
    nodes = [Node(f"gpu{i}", rng.choice(LAYOUTS), 7, target=SMALL if rng.random() < 0.15 else None)
             for i in range(rng.randint(2, 5))]
    for n in nodes:
        for mig_type, room in n.layout.capacity:
            for _ in range(rng.randint(0, room)):
                start, limit = rng.uniform(-3000, 0), rng.choice((600.0, 1800.0, 3600.0))
                n.running.append(Job(TraceJob(start, "a", "main", mig_type, 1, limit, limit), start=start,
                                     nodes=(n.name,)))
    pending: dict[str, list[Job]] = {}
    for at in sorted(rng.uniform(-6000, 0) for _ in range(rng.randint(60, 160))):
        mig_type = rng.choice(TYPES)
        pending.setdefault(mig_type, []).append(Job(TraceJob(at, "a", "main", mig_type, rng.choice((1, 1, 2)), 60,
                                                             rng.choice((600.0, 1800.0, 3600.0)))))
    return nodes, pending


@pytest.mark.parametrize("seed", range(16))
def test_one_pass_over_a_deep_queue_decides_as_the_plain_pass(seed: int) -> None:
    """Many jobs alike behind each other: most find a reservation only far out, many none in their 64
    tries, so the pass's shortcuts (a shape that found no place) are taken often."""
    fast, ref = deep(seed), deep(seed)
    epoch = random.Random(seed).uniform(0, 60)
    backfill(*fast, 0.0, epoch)
    plain(*ref, 0.0, epoch)
    assert [[(j.start, j.node) for j in n.running] for n in fast[0]] == [[(j.start, j.node) for j in n.running]
                                                                        for n in ref[0]]
    assert {t: len(q) for t, q in fast[1].items()} == {t: len(q) for t, q in ref[1].items()}


def test_a_pass_is_skipped_while_nothing_it_reads_changes_and_run_again_when_a_reservation_turns() -> None:
    """Two nodes full (limits ending at 900); a 1g job waits, reserving a node from the batch's
    estimate, 900.  While nothing changes no pass's work is done again, until a job arrives or the clock
    reaches a moment that turns one of the pass's comparisons (here that expected start)."""
    a, b = Node("gpu1", SMALL, 7), Node("gpu2", SMALL, 7)
    for n in (a, b):
        for _ in range(3):
            n.running.append(Job(TraceJob(0, "a", "main", "1g.10gb", 1, 600, 900), start=0, nodes=(n.name,)))
    waiting = Job(TraceJob(10, "a", "main", "1g.10gb", 1, 60, 600))
    pending = {"1g.10gb": [waiting]}
    bf = Backfill()
    for now in (10.0, 40.0, 70.0, 850.0):
        bf([a, b], pending, now, 0.0)
    assert bf.passes == 1
    pending["2g.20gb"] = [Job(TraceJob(851, "a", "main", "2g.20gb", 1, 60, 600))]
    bf([a, b], pending, 860.0, 0.0)
    bf([a, b], pending, 890.0, 0.0)
    assert bf.passes == 2 and waiting.start is None
    bf([a, b], pending, 900.0, 0.0)
    assert bf.passes == 3


def test_with_reservations_a_younger_job_waits_for_an_older_ones_node() -> None:
    """One H100 in balanced (one 2g): a 2g job runs, a second waits and reserves the node from the first's
    limit; a 1g job with a long limit then starts at once first come per type, and with Slurm's
    reservations (what --slurm-backfill replays) waits until the 2g job has started."""
    cfg_text = (REPO / "bench" / "demand.yaml").read_text().replace("profiles_dir: ../profiles",
                                                                     f"profiles_dir: {REPO / 'profiles'}")
    setup = Setup.of(load_config(REPO / "migd.yaml", cfg_text), [MODELS["H100-SXM5-80GB"]], datetime(2026, 11, 28), 1)
    jobs = [TraceJob(0, "a", "main", "2g.20gb", 1, 3600, 7200), TraceJob(60, "a", "main", "2g.20gb", 1, 600, 3600),
            TraceJob(120, "a", "main", "1g.10gb", 1, 600, 36000)]
    waits = {r: weigh.replayer(setup, jobs, 1, 1, 4 * 3600, 1 / 6, reserve=r)(fixed, ["balanced"])["p95_by_type_s"]
             for r in (False, True)}
    assert waits[False]["1g.10gb"] == 0 and waits[True]["1g.10gb"] == 3600 - 120


def test_the_flag_reaches_the_model_from_the_bench_and_from_migctl_what_if(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[bool] = []

    def spy(real: Any) -> Any:
        def call(*args: Any, reserve: bool = False, **kw: Any) -> Any:
            asked.append(reserve)
            return real(*args, reserve=reserve, **kw)
        return call

    monkeypatch.setattr("migd.ctl.whatif.weigh", spy(weigh.weigh))
    cfg = tmp_path / "migd.yaml"
    cfg.write_text((REPO / "bench" / "demand.yaml").read_text().replace("profiles_dir: ../profiles",
                                                                        f"profiles_dir: {REPO / 'profiles'}"))
    sacct = str(REPO / "tests" / "fixtures" / "slurm" / "sacct-parsable2.txt")
    for flag in ([], ["--slurm-backfill"]):
        assert migctl(["what-if", "--sacct", sacct, "--config", str(cfg), "--search", "2", "-o", "json", *flag]) == 0
        assert json.loads(capsys.readouterr().out)["slurm_backfill"] == bool(flag)
    sys.path.insert(0, str(REPO / "bench"))
    import demand

    monkeypatch.setattr(demand, "replayer", spy(weigh.replayer))
    assert demand.main(["--nodes", "1", "--days", "0.05", "--search", "1", "--slurm-backfill"]) == 0
    assert "queue: Slurm's backfill with reservations" in capsys.readouterr().out
    assert asked == [False, True, True]


def test_a_skipped_pass_runs_again_when_a_reservation_comes_within_a_jobs_limit() -> None:
    """At 0 nothing starts: O reserves gpuA's 2g from 870; Z (2 x 1g, limit 600) still sees gpuA free
    over its limit, so its estimate over both nodes puts it on gpuB from 1020; Y (1g, limit 1100)
    could start on gpuB's free 1g but its limit reaches Z's reservation.  At 300, with nothing
    changed, O's reservation lies within Z's limit (870 <= 300 + 600): Z's estimate over gpuB alone
    moves it to gpuB from 1470, past Y's limit, and Y starts.  The pass at 300 must be run, not skipped."""
    def state() -> tuple[list[Node], dict[str, list[Job]]]:
        a, b = Node("gpuA", BALANCED, 7), Node("gpuB", SMALL, 7)
        for node, gres, end in ((a, "2g.20gb", 870.0), (a, "1g.10gb", 1010.0), (a, "1g.10gb", 1020.0),
                                (b, "1g.10gb", 1000.0), (b, "1g.10gb", 5000.0)):
            node.running.append(Job(TraceJob(-10, "a", "main", gres, 1, end, end), start=0.0, nodes=(node.name,)))
        return [b, a], {"2g.20gb": [Job(TraceJob(-3, "a", "main", "2g.20gb", 1, 60, 600))],  # O
                        "1g.10gb": [Job(TraceJob(-2, "a", "main", "1g.10gb", 2, 60, 600)),  # Z
                                    Job(TraceJob(-1, "a", "main", "1g.10gb", 1, 60, 1100))]}  # Y

    nodes, pending = state()
    y = pending["1g.10gb"][1]
    bf = Backfill()
    bf(nodes, pending, 0.0, 0.0)
    assert all(j.start is None for q in pending.values() for j in q) and len(pending["1g.10gb"]) == 2
    bf(nodes, pending, 300.0, 0.0)
    assert (y.start, y.node, bf.passes) == (300.0, "gpuB", 2)
    ref_nodes, ref_pending = state()
    plain(ref_nodes, ref_pending, 300.0, 0.0)
    assert [(j.spec.time_limit_s, j.start) for j in ref_nodes[0].running[2:]] == [(1100, 300.0)]


def test_a_running_job_with_no_time_limit_is_expected_to_end_a_year_after_its_start() -> None:
    """sacct's UNLIMITED: Slurm reckons such a job's end a year on, so a job waiting for its instance
    reserves the node from then (the pass no longer fails on an infinite end)."""
    node = Node("gpu1", Layout.of("one", {"1g.10gb": 1}), 7)
    node.running.append(Job(TraceJob(0, "a", "main", "1g.10gb", 1, 100, math.inf), start=0.0, nodes=("gpu1",)))
    got = will_run([node], [node], "1g.10gb", 1, now=10.0, epoch_s=0.0)
    assert got is not None and got[0] == YEAR_S
    waiting = Job(TraceJob(1, "a", "main", "1g.10gb", 1, 10, 60))
    backfill([node], {"1g.10gb": [waiting]}, 10.0, 0.0)
    assert waiting.start is None
