"""bench/run.py's verdict: each target it prints is judged on the row's own figures, and a missed one is
named on the last line (the table is wall-clock, so a miss is said, never an exit code)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import run as bench  # noqa: E402


def figures(busy_ms: float = 10.0, parallel_s: float = 0.4) -> list[bench.Row]:
    sampler = {"calls": 185, "ref_calls": 288, "cpu_ms": 4.1, "ref_cpu_ms": 3.9}
    cpu = {"cpu_pct": 0.5, "ref_cpu_pct": 0.4}
    scrape = {"bytes": 176128, "page_bytes": 21504, "p99_ms": 5.7, "ref_p99_ms": 5.9, "page_p99_ms": 4.0,
              "busy_p99_ms": busy_ms, "busy_ref_p99_ms": 10.0}
    apply = {"writes_sequential": 9, "fsyncs_sequential": 10, "writes_parallel": 9, "fsyncs_parallel": 10,
             "sequential": 2.79, "mig-parted": 2.82, "parallel": parallel_s}
    plan = {"empty_first_ms": 1.1, "empty_ref_ms": 5.2, "table_ms": 5.6, "empty_again_ms": 0.25,
            "trans_first_p99_us": 49, "trans_seen_p99_us": 41, "trans_again_p99_us": 3, "trans_ref_p99_us": 178}
    return bench.rows(sampler, cpu, scrape, apply, plan, 20.0)


def test_every_target_met_says_so() -> None:
    table = figures()
    assert {r[5] for r in table if r[4] != "-"} == {"met"} and all(r[5] == "" for r in table if r[4] == "-")
    assert bench.verdict(table) == "targets met: 13 of 13"


def test_a_missed_target_is_named_on_its_row_and_the_last_line() -> None:
    table = figures(busy_ms=15.4, parallel_s=0.5)  # 1.54x its reference; 5.6x faster, not 6x
    missed = [r[0] for r in table if r[5] == "NOT MET"]
    assert missed == ["/metrics p99 while 4 clients keep loading the page (ref: ... loading /metrics)",
                      "apply day->night, 8 GPUs, parallel (ref: mig-parted sequence replayed; 20 ms per mutation)"]
    line = bench.verdict(table)
    assert line.startswith("targets met: 11 of 13; NOT met: /metrics p99 while 4 clients") and "load average" in line


def test_targets_bound_the_ratio_or_the_figure() -> None:
    ratio, value = bench.Target(bench.On.RATIO, 1.2, ""), bench.Target(bench.On.VALUE, 2, "")
    assert ratio.met(12, 10) and not ratio.met(12.1, 10)
    assert value.met(2, 100) and not value.met(2.01, 0.5)
    assert bench.Target(bench.On.VALUE, 6, "", at_least=True).met(6, None)
    assert ratio.met(12, None) is None and ratio.met(12, 0) is None  # (no reference: not judged)
