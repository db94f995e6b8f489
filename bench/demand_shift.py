#!/usr/bin/env python3
"""How much a trace's mix of MIG types shifts (migd/whatif/shift.py): each window's share of
slice-hours per type, and the windows' distance from the whole trace's mix, the figure bench/demand.py
reads to tell whether the target of 0.85x the best fixed mix in hindsight applies.

    python3 bench/demand_shift.py                                   # the synthetic trace, 8 nodes, 4 days
    python3 bench/demand_shift.py --trace alibaba-week.csv --days 7
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from demand import load_trace  # noqa: E402
from demand_gen import GENERATED  # noqa: E402
from demand_trace import DAY, TraceError  # noqa: E402

from migd.whatif.shift import WINDOW_S, shift, windows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="synthetic", help=f"{', '.join(GENERATED)}, or a CSV as bench/demand.py reads")
    p.add_argument("--nodes", type=int, default=8, help="a generated trace's fleet (its demand scales with it)")
    p.add_argument("--seed", type=int, help="a generated trace's seed (default its own)")
    p.add_argument("--days", type=float, default=4.0)
    p.add_argument("--hours", type=float, default=WINDOW_S / 3600,
                   help=f"the window (default {WINDOW_S / 3600:g} hours: day and night apart)")
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
