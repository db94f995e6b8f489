"""migd/whatif/shift.py and bench/demand_shift.py: how far each window's mix of MIG types is from the
whole trace's, the figure the bench reads to tell a trace whose demand shifts from one whose mix holds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from demand_shift import main  # noqa: E402
from demand_trace import TraceJob  # noqa: E402

from migd.whatif.shift import WINDOW_S, distance, of_trace, shift, windows  # noqa: E402


def job(submit_h: float, gres: str, hours: float = 1.0, count: int = 1) -> TraceJob:
    return TraceJob(submit_h * 3600, "a", "gpu", gres, count, hours * 3600, hours * 3600)


def test_slice_hours_are_binned_by_submission_window() -> None:
    jobs = [job(0.5, "1g.10gb"), job(1.5, "7g.80gb", hours=2, count=2), job(1.9, "1g.10gb"), job(9, "1g.10gb")]
    assert windows(jobs, 3600, 3 * 3600) == [{"1g.10gb": 1.0}, {"7g.80gb": 28.0, "1g.10gb": 1.0}, {}]


def test_the_same_mix_is_0_apart_and_disjoint_mixes_1() -> None:
    assert distance({"1g.10gb": 2.0, "7g.80gb": 6.0}, {"1g.10gb": 1.0, "7g.80gb": 3.0}) == 0.0
    assert distance({"1g.10gb": 2.0}, {"7g.80gb": 6.0}) == 1.0
    assert distance({"1g.10gb": 1.0, "7g.80gb": 3.0}, {"1g.10gb": 3.0, "7g.80gb": 1.0}) == 0.5
    assert distance({}, {"7g.80gb": 6.0}) == 0.0


def test_a_mix_that_turns_over_shifts_and_one_that_holds_does_not() -> None:
    turning = windows([job(0, "1g.10gb", hours=7), job(7, "7g.80gb")], 6 * 3600, 12 * 3600)  # 7 and 7 slice-hours
    assert shift(turning) == 0.5
    holding = windows([job(h, "1g.10gb") for h in range(12)] + [job(h, "7g.80gb") for h in range(12)],
                      6 * 3600, 12 * 3600)
    assert shift(holding) == 0.0


def test_the_bench_weighs_a_trace_over_windows_of_six_hours() -> None:
    """A mix that turns over every hour holds over six: of_trace, which decides whether the hindsight
    target applies, reads day and night apart, not each hour's own mix."""
    hourly = [job(h, "1g.10gb" if h % 2 else "7g.80gb", hours=1 / 7 if h % 2 else 1 / 49) for h in range(12)]
    assert WINDOW_S == 6 * 3600
    assert shift(windows(hourly, 3600, 12 * 3600)) == pytest.approx(0.5)
    assert of_trace(hourly, 12 * 3600) == shift(windows(hourly, WINDOW_S, 12 * 3600)) == pytest.approx(0.0)


def test_a_bad_trace_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("submit_s,account\n1,a\n")
    assert main(["--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"demand_shift.py: {bad}:1: the header must be") and err.count("\n") == 1


def test_the_synthetic_trace_shifts_more_than_a_steady_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "4", "--days", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["window", "slice-hours", "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"] and len(out) == 6
    assert float(out[-1].rsplit(" ", 1)[1]) > 0.2
