#!/usr/bin/env python3
"""The demand bench over many draws of one generated trace: how often migd meets each target.

    python3 bench/demand_seeds.py --nodes 8 --seeds 1-8 --search 16
    python3 bench/demand_seeds.py --nodes 4 --seeds 1-8 --search 16 --slurm-backfill
    python3 bench/demand_seeds.py --nodes 4 --seeds 1-5,7 --search 1 --two-node 0.5

A rule like migd's moves a whole trace's figures by tens of percent on a small change (docs/demand-tried.md),
so one draw cannot rank two rules: each seed here is bench/demand.py's replay of the same generator
drawn again (its ``--seed``), every policy as that bench replays it; one row per seed (migd, the fixed
mix from accounting, the best fixed mix in hindsight, migd's ratios to each, the targets it missed), then
for each target on how many seeds it was met, and the geometric mean of migd's ratios.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import demand_policies as policies  # noqa: E402
from demand import CONFIG, bad_share, compare, waves  # noqa: E402
from demand_gen import GENERATED, over_two_nodes  # noqa: E402

from migd.whatif.figures import targets  # noqa: E402

ACC, BEST = "fixed-accounting", "fixed-hindsight"


def seeds(text: str) -> list[int]:
    """``1-8`` or ``1,3,7``: the seeds drawn."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: seeds are N, N-M or a comma list of them") from None
        if last < first:
            raise argparse.ArgumentTypeError(f"{part!r}: the range ends before it starts")
        out += range(first, last + 1)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=CONFIG, help="a migd.yaml (default bench/demand.yaml)")
    p.add_argument("--trace", default="synthetic", choices=sorted(GENERATED), help="the generated trace")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--seeds", type=seeds, default=seeds("1-8"), help="N-M or a comma list (default 1-8)")
    p.add_argument("--search", type=int, default=16, help="replays the hindsight search may make per seed")
    p.add_argument("--slurm-backfill", action="store_true", help="with Slurm's backfill reservations in the model")
    p.add_argument("--two-node", type=float, metavar="SHARE", help="that share of the even whole-GPU jobs over "
                   "two nodes, as bench/demand.py's --two-node")
    return p.parse_args(argv)


def ratio(m: dict[str, float], ref: dict[str, float]) -> tuple[float, float]:
    """migd's p95 over all jobs and worst type's p95 over ``ref``'s (one step where ``ref`` waits none)."""
    return (m["wait_p95_s"] / max(30, ref["wait_p95_s"]), m["worst_type_p95_s"] / max(30, ref["worst_type_p95_s"]))


def tally(met: dict[str, list[int]], checks: list[tuple[str, bool | None, str]]) -> list[str]:
    """Count one seed's targets into ``met`` (target -> [seeds met, seeds it applies to]); the names of
    those it missed.  A target that does not apply (None) counts for neither."""
    missed = []
    for what, ok, _ in checks:
        got = met.setdefault(what, [0, 0])
        got[0] += ok is True
        got[1] += ok is not None
        if ok is False:
            missed.append(what.split(" (")[0])
    return missed


def summary(what: str, met: int, applies: int, seeds: int) -> str:
    if applies == 0:
        return f"applies to no seed of {seeds}: {what}"
    where = "" if applies == seeds else f" (it applies to {applies} of {seeds})"
    return f"met on {met} of {applies} seeds: {what}{where}"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    why = bad_share(args.two_node)
    if why is not None:
        print(f"demand_seeds.py: {why}", file=sys.stderr)
        return 2
    met: dict[str, list[int]] = {}  # target -> [seeds met, seeds it applies to]
    logs: dict[str, list[float]] = {"accounting": [], "hindsight": []}
    print(f"{'seed':>4}  {'migd':>15}  {'from accounting':>15}  {'best in hindsight':>17}  "
          f"{'/ accounting':>12}  {'/ hindsight':>12}  targets missed")
    fleet_waves = waves(args.nodes)
    for seed in args.seeds:
        trace = GENERATED[args.trace](args.nodes, args.days, seed=seed)
        if args.two_node:
            trace = over_two_nodes(trace, args.two_node)
        setup = policies.Setup.load(args.config, "dgx-h100", trace.start, fleet_waves)
        results, about = compare(trace, setup, args.nodes, args.days, fleet_waves, args.search, 0.0,
                                 args.slurm_backfill)
        m, acc, best = results["migd"], results[ACC], results[BEST]
        ra, rb = ratio(m, acc), ratio(m, best)
        logs["accounting"] += [math.log(r) for r in ra]
        logs["hindsight"] += [math.log(r) for r in rb]
        missed = tally(met, targets(results, trace.clock_right, shift=about["shift"]))
        fig = "{wait_p95_s:>7} / {worst_type_p95_s:<7}".format
        print(f"{seed:>4}  {fig(**m)}  {fig(**acc)}  {fig(**best):>17}  {ra[0]:5.2f} / {ra[1]:4.2f}  "
              f"{rb[0]:5.2f} / {rb[1]:4.2f}  {'; '.join(missed) or '-'}", flush=True)
    for what, (k, n) in met.items():
        print(summary(what, k, n, len(args.seeds)))
    for ref, xs in logs.items():
        print(f"geometric mean of migd's ratios to the {ref} mix (all jobs and worst type together): "
              f"{math.exp(sum(xs) / len(xs)):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
