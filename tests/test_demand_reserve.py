"""Slurm's whole-node reservations as the demand rule weighs them (migd/demand/reserve.py): who is ahead
of whom in Slurm's priority order, and what the older jobs of a node's other types leave of a type's
supply there."""

from __future__ import annotations

import pytest

from migd.demand.inputs import Layout, Pending
from migd.demand.reserve import BF_MAX_JOB_TEST, NONE, Ahead

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
