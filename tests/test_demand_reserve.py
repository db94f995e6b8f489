"""Slurm's whole-node reservations as the demand rule weighs them (migd/demand/reserve.py): who is ahead
of whom in Slurm's priority order, and what the older jobs of a node's other types leave of a type's
supply there."""

from __future__ import annotations

from dataclasses import replace

import pytest

from migd.demand.inputs import Layout, Pending
from migd.demand.reserve import BF_MAX_JOB_TEST, NONE, Ahead
from migd.demand.scoring import Fleet, Part, Queue

MIXED = Layout.of("night*7/balanced", {"7g.80gb": 7, "1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
BALANCED = Layout.of("balanced", {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8})


def job(name: str, mig_type: str, age_s: float) -> Pending:
    return Pending(name, "acct", mig_type, 1, 3600, age_s=age_s)


def hours(p: Pending) -> float:  # each job's work: one slice-hour per slice
    return float(p.mig_type[0])


def test_what_is_ahead_of_a_type_is_the_other_types_older_jobs() -> None:
    """Slurm tests pending jobs oldest first (priority/basic: submission order): a type's oldest job has
    ahead of it the older jobs of every other type; a type with none pending has every job ahead."""
    ahead = Ahead.of([job("a", "7g.80gb", 300), job("b", "2g.20gb", 200), job("c", "7g.80gb", 250),
                      job("d", "7g.80gb", 100), job("e", "3g.40gb", 400)], hours)
    assert ahead.before == {"3g.40gb": {}, "7g.80gb": {"3g.40gb": (3.0, 1)},
                            "2g.20gb": {"3g.40gb": (3.0, 1), "7g.80gb": (14.0, 2)}}
    assert ahead.everyone == {"3g.40gb": (3.0, 1), "7g.80gb": (21.0, 3), "2g.20gb": (2.0, 1)}


def test_slurms_order_is_priority_then_submission_then_job_id() -> None:
    """Slurm tests a higher priority first, then the older job, then the lower job id (compared as
    numbers: 999 before 1000; array tasks 12_2 before 12_10); a job waiting on a dependency or its
    begin time is not tested."""
    def first(*jobs: Pending) -> str:
        (t,) = [t for t, ahead in Ahead.of(jobs, hours).before.items() if not ahead]
        return t

    assert first(job("a", "2g.20gb", 100), job("b", "7g.80gb", 900)) == "7g.80gb"
    assert first(job("a", "2g.20gb", 100), replace(job("b", "7g.80gb", 900), priority=-1)) == "2g.20gb"
    assert first(job("1000", "2g.20gb", 100), job("999", "7g.80gb", 100)) == "7g.80gb"
    assert first(job("12_10", "2g.20gb", 100), job("12_2", "7g.80gb", 100)) == "7g.80gb"
    waiting = replace(job("b", "7g.80gb", 900), startable=False)
    assert Ahead.of([job("a", "2g.20gb", 100), waiting], hours).before == {"2g.20gb": {}}


def test_only_the_jobs_slurm_tests_reserve() -> None:
    """bf_max_job_test (500 by default): a job past it reserves nothing, so it holds no node."""
    queue = [job(f"t{i}", "7g.80gb", 10_000 - i) for i in range(BF_MAX_JOB_TEST + 100)]
    ahead = Ahead.of([*queue, job("s", "2g.20gb", 0)], hours)
    assert ahead.everyone == {"7g.80gb": (7.0 * BF_MAX_JOB_TEST, BF_MAX_JOB_TEST)} and "2g.20gb" not in ahead.before


def test_a_minority_on_a_mixed_node_gets_what_the_majoritys_older_work_leaves() -> None:
    """The 7g jobs ahead of the 2g job that the fleet's free 7g instances cannot start at once reserve a
    night*7/balanced node, and hold it for the part of the horizon the fleet's 7g supply takes to run
    them; a job that starts at once reserves nothing; a balanced node offers no 7g, so they hold none of
    it."""
    ahead = Ahead.of([job("t", "7g.80gb", 500), job("u", "7g.80gb", 400), job("s", "2g.20gb", 100)], hours)
    assert ahead.share(MIXED, "2g.20gb", {"7g.80gb": 56.0}, {}) == pytest.approx(1 - 14 / 56)
    assert ahead.share(MIXED, "2g.20gb", {"7g.80gb": 56.0}, {"7g.80gb": 1}) == pytest.approx(1 - 7 / 56)
    assert ahead.share(MIXED, "2g.20gb", {"7g.80gb": 56.0}, {"7g.80gb": 2}) == 1.0  # (both start at once)
    assert ahead.share(MIXED, "2g.20gb", {"7g.80gb": 7.0}, {}) == 0.0  # (more than the fleet runs: held throughout)
    assert ahead.share(MIXED, "2g.20gb", {}, {}) == 0.0  # (no 7g supply at all: they wait and hold it)
    assert ahead.share(BALANCED, "2g.20gb", {"7g.80gb": 7.0}, {}) == 1.0
    assert ahead.share(MIXED, "7g.80gb", {"2g.20gb": 1.0}, {}) == 1.0  # (the 2g job is younger: nothing ahead)
    assert NONE.share(MIXED, "2g.20gb", {}, {}) == 1.0  # (the plain model: nothing reserves)


def test_a_trial_weighed_exactly_scores_what_taking_it_gives() -> None:
    """A change moves the fleet's supply and free instances of its types, and so how long their older jobs
    hold every other node offering them: weighed exactly, a trial scores what ``put`` then gives; the
    search's cheaper ranking keeps the other nodes as they stand, and can differ."""
    night = Layout.of("night", {"7g.80gb": 8})
    day = Layout.of("day", {"1g.10gb": 56})
    pending = ([job(f"t{i:02d}", "7g.80gb", 9000) for i in range(30)] + [job(f"s{i:02d}", "2g.20gb", 8000)
                                                                        for i in range(20)]
               + [job(f"n{i:02d}", "1g.10gb", 100) for i in range(50)])
    demand = {t: {"acct": 50.0} for t in ("7g.80gb", "2g.20gb", "1g.10gb")}

    def fleet() -> Fleet:
        f = Fleet(Queue(demand, {"7g.80gb": 1, "2g.20gb": 1, "1g.10gb": 1}, {}, {}, Ahead.of(pending, hours)), 8 * 3600)
        f.put({n: Part({t: 8.0 * k * int(t[0]) for t, k in lay.capacity}, lay, dict(lay.capacity))
               for n, lay in (("a", MIXED), ("b", night), ("c", night))})
        return f

    trial = Part({"1g.10gb": 8.0 * 56}, day, dict(day.capacity))
    f = fleet()
    exact, ranked = f.score("b", trial, exact=True), f.score("b", trial)
    f.put({"b": trial})
    assert exact == f.score()
    assert ranked != exact  # (a's 2g, behind the 7g jobs that lose b's instances, is held longer)


def test_an_arrays_tasks_past_bf_max_job_array_resv_reserve_nothing() -> None:
    """Slurm's backfill tries at most ``bf_max_job_array_resv`` (20) tasks of one pending array in a pass
    (backfill.c); a thousand-task array was read as a thousand reservations ahead of every younger type."""
    array = [job(f"7_{i}", "7g.80gb", 500) for i in range(1000)]
    ahead = Ahead.of([*array, job("8", "7g.80gb", 400), job("9", "2g.20gb", 300)], hours)
    assert ahead.before["2g.20gb"] == {"7g.80gb": (7.0 * 21, 21)}  # (20 of the array, and job 8)
    assert ahead.everyone["7g.80gb"] == (7.0 * 21, 21)
    wide = [job(f"7_{i}", "7g.80gb", 500) for i in range(30) for _ in range(2)]  # each task over two nodes
    assert Ahead.of(wide, hours).everyone["7g.80gb"] == (7.0 * 40, 40)  # (20 tasks, not 10)


def test_a_job_over_several_nodes_is_one_of_the_jobs_backfill_tests() -> None:
    """A pending job over N nodes is read as N requests of one node (queue.py); Slurm tests it once against
    ``bf_max_job_test``, so the 500th job's requests and no more are ahead of a younger type."""
    wide = [job(f"{i}", "7g.80gb", 1000 - i) for i in range(BF_MAX_JOB_TEST - 1) for _ in range(2)]
    ahead = Ahead.of([*wide, job("x", "3g.40gb", 100), job("y", "2g.20gb", 50)], hours)
    assert ahead.before["3g.40gb"] == {"7g.80gb": (7.0 * 998, 998)}
    assert "2g.20gb" not in ahead.before  # (the 501st job)


def test_job_ids_past_18_digits_are_ordered_as_numbers() -> None:
    """Their digit runs were read as text past 18 digits and compared with numbers: TypeError in the rule."""
    from migd.demand.reserve import tested
    big = [job("9223372036854775808_0", "1g.10gb", 60), job("5", "1g.10gb", 60), job("10_2", "1g.10gb", 60)]
    assert [p.job for p in tested(big)] == ["5", "10_2", "9223372036854775808_0"]
