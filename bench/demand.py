#!/usr/bin/env python3
"""Layouts that follow demand: migd's rule against the clock and against fixed mixes, on one trace.

    python3 bench/demand.py                          # the synthetic trace, 64 nodes, Thursday to Sunday
    python3 bench/demand.py --short                  # 4 nodes, one weekday (CI)
    python3 bench/demand.py --trace shifting --nodes 8 --days 7
    python3 bench/demand.py --nodes 8 --seed 1          # the synthetic trace drawn again
    python3 bench/demand.py --nodes 8 --two-node 0.5    # half its even whole-GPU jobs over two nodes
    python3 bench/demand.py --trace jobs.csv --start 2026-11-02T00:00 --nodes 16 --json
    python3 bench/demand.py --config /etc/migd/migd.yaml --trace jobs.csv   # a site's own what-if
    python3 bench/demand.py --sacct tests/fixtures/slurm/sacct-parsable2.txt --fleet single-h100   # sacct's record
    python3 bench/demand.py --short --slurm-backfill  # with Slurm's backfill reservations in the model

Policies (migd/whatif/policies.py, migd/whatif/fixedmix.py): ``clock`` (the configuration's
schedule, by the calendar), ``greedy`` (nos-like), ``migd`` (migd.demand.rule over per-GPU mixes of
the configured candidates), ``fixed-accounting`` (a fixed mix sized from the trace's slice-hours per
MIG type) and ``fixed-hindsight`` (the best fixed mix a hill climb over replays finds).  All run
through the same queue model (migd/whatif/replay.py) with the same fleet waves, decide at the
configuration's planner interval (60 s by default; migd's changes reach their nodes half a
reconcile_interval later) and never kill a job.  Each figure is printed beside the others from the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import demand_policies as policies  # noqa: E402
from demand_gen import GENERATED, THURSDAY, over_two_nodes  # noqa: E402
from demand_pool import pool  # noqa: E402
from demand_trace import DAY, Trace, TraceError, read_csv  # noqa: E402

from migd.errors import ValidationError  # noqa: E402
from migd.sim.fleets import FLEETS  # noqa: E402
from migd.whatif.figures import objective, table, targets  # noqa: E402
from migd.whatif.fixedmix import accounting, hindsight, spread  # noqa: E402
from migd.whatif.sacct import SacctError, read_sacct  # noqa: E402
from migd.whatif.shift import SHIFT_MIN, of_trace  # noqa: E402
from migd.whatif.weigh import replayer  # noqa: E402

CONFIG = ROOT / "bench" / "demand.yaml"
BACKFILL = {False: "first come per type, with backfill", True: "Slurm's backfill with reservations"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG, help="a migd.yaml: its profiles, schedule and "
                   "slurm.demand.candidates (default bench/demand.yaml)")
    p.add_argument("--nodes", type=int, help="nodes in the cluster (default 64; 4 with --short)")
    p.add_argument("--fleet", default="dgx-h100", choices=sorted(FLEETS), help="each node's GPUs (a simulated fleet)")
    p.add_argument("--trace", default="synthetic", help=f"{', '.join(GENERATED)} (generated, seeded), or a CSV "
                   "(submit_s,account,partition,gres,count,duration_s,time_limit_s[,nodes])")
    p.add_argument("--sacct", metavar="FILE", help="a cluster's own accounting: sacct --parsable2 output "
                   "(migd/whatif/sacct.py); nodes default to those its NodeList names, days to its span")
    p.add_argument("--seed", type=int, help="a generated trace's seed (default each trace's own: synthetic 7, "
                   "shifting 11, clock-right 13): the same demand drawn again, to see what a figure owes to one draw")
    p.add_argument("--two-node", type=float, metavar="SHARE", help="that share (0-1) of the jobs asking an "
                   "even number of whole-GPU (7g) instances spread half on each of two nodes (sbatch -N 2): "
                   "the same work, started on both nodes at once")
    p.add_argument("--start", help="the date and time of the trace's second 0 (ISO; a CSV's default: "
                   f"{THURSDAY:%Y-%m-%d}, a Thursday)")
    p.add_argument("--days", type=float, help="days simulated (default: 4; 1 with --short)")
    p.add_argument("--search", type=int, help="replays the hindsight search may make (default 40; 6 with --short)")
    p.add_argument("--short", action="store_true", help="4 nodes, one weekday: what CI runs")
    p.add_argument("--slurm-backfill", action="store_true", help="every policy replayed with Slurm 22.05's "
                   "backfill reservations (Cluster.reserve, migd/whatif/backfill.py; the model the replay on "
                   "real Slurm checks), on the trace's wall clock; slower. Default: first come per type")
    p.add_argument("--json", action="store_true", help='one object {"policies": {"clock": {...}, ...}, "targets"}')
    return p.parse_args(argv)


def waves(nodes: int) -> int:
    """Nodes in maintenance at once, for every policy alike: one in eight (at least one)."""
    return max(1, nodes // 8)


def bad_share(share: float | None) -> str | None:
    """What is wrong with ``--two-node``'s share, if anything."""
    return None if share is None or 0 <= share <= 1 else f"--two-node {share:g}: a share is between 0 and 1"


def load_trace(args: argparse.Namespace, nodes: int, days: float) -> Trace:
    start = datetime.fromisoformat(args.start) if args.start else None
    if args.trace in GENERATED:
        kw: dict[str, Any] = {"start": start} if start else {}
        if args.seed is not None:
            kw["seed"] = args.seed
        return GENERATED[args.trace](nodes, int(days + 0.999), **kw)
    path = Path(args.trace)
    return Trace(path.name, tuple(read_csv(path)), start or THURSDAY)


def compare(trace: Trace, setup: policies.Setup, nodes: int, days: float, waves: int,
            budget: int, settled_s: float = 0.0, reserve: bool = False) -> tuple[dict[str, dict[str, Any]],
                                                                                 dict[str, Any]]:
    """``settled_s``: how long each node has held its layout at second 0 (a generated trace starts as if
    every node had just switched; a cluster's record, in the middle of its life: a day, as the what-if).
    ``reserve``: Slurm's backfill reservations in every replay (``--slurm-backfill``)."""
    end = days * DAY
    jobs = [j for j in trace.jobs if j.submit_s < end]
    setup = setup.reserving(reserve, nodes)
    replay = replayer(setup, jobs, nodes, waves, end, days, settled_s, reserve=reserve)
    results: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    timed: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("clock", lambda: replay(policies.clock(setup))), ("greedy", lambda: replay(policies.greedy(setup))),
        ("migd", lambda: replay(policies.migd(setup)))]
    for name, go in timed:
        t0 = time.process_time()
        results[name], seconds[name] = go(), time.process_time() - t0
    acc = accounting(setup, jobs, nodes)
    results["fixed-accounting"] = replay(policies.fixed, spread(setup, acc))
    t0 = time.process_time()
    best, figures, replays = hindsight(setup, acc, lambda mix: replay(policies.fixed, mix), objective, budget)
    results["fixed-hindsight"] = figures
    seconds["fixed-hindsight"] = time.process_time() - t0
    about = {"pool": pool(jobs, nodes * max(lay.slices for lay in setup.layouts.values()), end),
             "shift": of_trace(jobs, end),
             "accounting_gpus": dict(zip(setup.candidates.names, acc, strict=True)),
             "hindsight_gpus": dict(zip(setup.candidates.names, best, strict=True)), "hindsight_replays": replays,
             "cpu_seconds": {k: round(v, 1) for k, v in seconds.items()}}
    return results, about


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        record = read_sacct(args.sacct) if args.sacct else None
    except SacctError as e:
        print(f"demand.py: {e}", file=sys.stderr)
        return 2
    if args.seed is not None and (record or args.trace not in GENERATED):
        print(f"demand.py: --seed draws a generated trace ({', '.join(GENERATED)}); "
              f"{args.sacct or args.trace} is a record", file=sys.stderr)
        return 2
    nodes = args.nodes or (max(1, len(record.nodes)) if record else 4 if args.short else 64)
    days = args.days or (record.end_s / DAY if record else 1.0 if args.short else 4.0)
    if nodes < 1 or days <= 0:
        print("demand.py: --nodes and --days must be positive", file=sys.stderr)
        return 2
    why = bad_share(args.two_node)
    if why is not None:
        print(f"demand.py: {why}", file=sys.stderr)
        return 2
    fleet_waves = waves(nodes)
    try:
        trace = record.trace if record else load_trace(args, nodes, days)
        if args.two_node:
            trace = over_two_nodes(trace, args.two_node)
        setup = policies.Setup.load(args.config, args.fleet, trace.start, fleet_waves)
    except (TraceError, ValidationError, ValueError, OSError) as e:
        print(f"demand.py: {e}", file=sys.stderr)
        return 2
    budget = args.search or (6 if args.short else 40)
    results, about = compare(trace, setup, nodes, days, fleet_waves, budget, DAY if record else 0.0,
                             args.slurm_backfill)
    checks = targets(results, trace.clock_right, about["pool"], shift=about["shift"])
    if args.json:
        print(json.dumps({"policies": results, "nodes": nodes, "days": days, "jobs": len(trace.jobs),
                          "trace": trace.name, "seed": args.seed, "start": trace.start.isoformat(),
                          "slurm_backfill": args.slurm_backfill, **about,
                          "targets": [{"target": t, "met": ok, "figures": f} for t, ok, f in checks]}, indent=1))
        return 0
    print(f"demand bench: trace {trace.name} from {trace.start:%a %Y-%m-%d %H:%M}, {len(trace.jobs)} jobs, {nodes} "
          f"nodes of {args.fleet}, {days:g} days, waves of {fleet_waves}; "
          f"candidates {', '.join(setup.candidates.names)} "
          f"({args.config}); queue: {BACKFILL[args.slurm_backfill]}")
    print(table(results))
    print(f"fixed mix from accounting (GPUs): {about['accounting_gpus']}; best in hindsight: "
          f"{about['hindsight_gpus']} after {about['hindsight_replays']} replays")
    p = about["pool"]
    print(f"one pool of the fleet's slices, nothing partitioned or switched (what no policy reaches): p95 "
          f"{p['wait_p95_s']} s, worst type {p['worst_type_p95_s']} s ({p['worst_type']})")
    print("model CPU seconds: " + ", ".join(f"{n} {s}" for n, s in about["cpu_seconds"].items()))
    print(f"how far the trace's mix shifts (migd/whatif/shift.py; it shifts from {SHIFT_MIN:.2f}): "
          f"{about['shift']:.3f}")
    for t, ok, f in checks:
        print(f"target {'n/a    ' if ok is None else 'met    ' if ok else 'NOT MET'}  {t}: {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
