#!/usr/bin/env python3
"""How much a trace's mix of MIG types shifts: each window's share of slice-hours per type, and how far
it is from the whole trace's mix.

The target of 0.85x the best fixed mix in hindsight is for traces where demand shifts: a mix sized
for the whole trace is then wrong part of the time, and a layout that follows demand has room to beat
it.  Where every window asks the trace's own mix, the best fixed mix already offers it all along.
The distance of two mixes is their total variation distance (half the summed differences of the
shares: 0 the same mix, 1 no type in common); the figure to read is its mean over the windows,
weighted by each window's slice-hours (a quiet hour's odd mix counts for little).

    python3 bench/demand_shift.py                                   # the synthetic trace, 8 nodes, 4 days
    python3 bench/demand_shift.py --trace alibaba-week.csv --days 7
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from demand import load_trace  # noqa: E402
from demand_gen import GENERATED  # noqa: E402
from demand_trace import DAY, TraceError  # noqa: E402

from migd.whatif.fixedmix import slice_hours  # noqa: E402
from migd.whatif.jobs import TraceJob  # noqa: E402

Mix = dict[str, float]  # MIG type -> slice-hours


def windows(jobs: Iterable[TraceJob], window_s: float, end_s: float) -> list[Mix]:
    """Slice-hours asked per MIG type by the jobs submitted in each window of ``window_s`` before ``end_s``."""
    out: list[list[TraceJob]] = [[] for _ in range(max(1, int(-(-end_s // window_s))))]
    for j in jobs:
        if 0 <= j.submit_s < end_s:
            out[int(j.submit_s // window_s)].append(j)
    return [slice_hours(w) for w in out]


def distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Total variation distance of two mixes, each taken as shares of its own total (an empty one: 0)."""
    ta, tb = sum(a.values()), sum(b.values())
    if ta <= 0 or tb <= 0:
        return 0.0
    return sum(abs(a.get(t, 0.0) / ta - b.get(t, 0.0) / tb) for t in {*a, *b}) / 2


def shift(mixes: list[Mix]) -> float:
    """The windows' distance from the whole trace's mix, weighted by their slice-hours."""
    whole: Mix = defaultdict(float)
    for m in mixes:
        for t, v in m.items():
            whole[t] += v
    total = sum(whole.values())
    return sum(sum(m.values()) * distance(m, whole) for m in mixes) / total if total > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="synthetic", help=f"{', '.join(GENERATED)}, or a CSV as bench/demand.py reads")
    p.add_argument("--nodes", type=int, default=8, help="a generated trace's fleet (its demand scales with it)")
    p.add_argument("--seed", type=int, help="a generated trace's seed (default its own)")
    p.add_argument("--days", type=float, default=4.0)
    p.add_argument("--hours", type=float, default=6.0, help="the window (default 6 hours: day and night apart)")
    a = p.parse_args(argv)
    try:
        jobs = load_trace(argparse.Namespace(trace=a.trace, seed=a.seed, start=None), a.nodes, a.days).jobs
    except TraceError as e:
        print(f"demand_shift.py: {e}", file=sys.stderr)
        return 2
    mixes = windows(jobs, a.hours * 3600, a.days * DAY)
    types = sorted({t for m in mixes for t in m})
    print("window  slice-hours  " + "  ".join(f"{t:>8}" for t in types))
    for k, m in enumerate(mixes):
        total = sum(m.values())
        shares = "  ".join(f"{100 * m.get(t, 0.0) / total:7.0f}%" if total else f"{'-':>8}" for t in types)
        print(f"{k:>6}  {total:>11.0f}  {shares}")
    print(f"the windows' distance from the trace's mix, weighted by slice-hours: {shift(mixes):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
