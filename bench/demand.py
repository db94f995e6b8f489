#!/usr/bin/env python3
"""Layouts that follow demand (issue 33): three policies on the same job trace, side by side.

    python3 bench/demand.py                    # 64 nodes, Thursday to Sunday, synthetic
    python3 bench/demand.py --short            # 4 nodes, one weekday (CI: under a minute)
    python3 bench/demand.py --trace jobs.csv --nodes 16 --json

Policies: ``static`` (the clock: day 08:30-19:00 on weekdays, night otherwise, night-two at the
weekend, as profiles/ and the example schedule); ``greedy`` (in the manner of nebuly's nos: at each
decision every node takes the candidate layout that fits the most pending jobs, no drain cost, no
hysteresis); ``migd`` (migd.demand.rule, docs/demand.md).  All three run through the same queue
model (bench/demand_model.py) with the same fleet waves, decide every 5 minutes and never kill a
job.  Candidate layouts: profiles/{day,night,night-two,balanced}.yaml resolved on --fleet's GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from demand_model import Cluster, Job, Node, run  # noqa: E402
from demand_trace import DAY, TraceError, read_csv, synthetic  # noqa: E402

from migd.catalog.models import MODELS  # noqa: E402
from migd.demand.capacity import node_layout  # noqa: E402
from migd.demand.model import Layout, NodeView, Pending, Running, Snapshot  # noqa: E402
from migd.demand.rule import Params, decide  # noqa: E402
from migd.profiles.loader import load_profile  # noqa: E402
from migd.sim.fleets import FLEETS  # noqa: E402

CANDIDATES = ("day", "night", "night-two", "balanced")
GREEDY_LOOK = 500  # pending jobs per type the greedy rule tries to fit (a node fits at most 56)
TARGETS = "targets (64 nodes): migd p95 wait <= static/2, utilization above both, drain < greedy, 0 killed, " \
          "<= 4 reconfigs/node/day"


def static(now: float, c: Cluster) -> dict[str, Layout]:
    day, hour = int(now // DAY), (now % DAY) / 3600
    name = "night-two" if day >= 2 else ("day" if 8.5 <= hour < 19 else "night")
    return {n.name: c.layouts[name] for n in c.nodes if n.layout.name != name and n.target is None}


def greedy(now: float, c: Cluster) -> dict[str, Layout]:
    """Each node in turn takes the layout that starts the most still-unclaimed pending jobs."""
    left = {t: [j.spec.count for j in q[:GREEDY_LOOK]] for t, q in c.pending.items() if q}
    out: dict[str, Layout] = {}
    for n in c.nodes:
        if n.target is not None or n.ready_at is not None:
            continue
        here = _fits({t: n.free(t) for t in left}, left)
        best, fits = None, here[0]
        for name in CANDIDATES:
            trial = _fits({t: c.layouts[name].count(t) for t in left}, left)
            if name != n.layout.name and trial[0] > fits:
                best, fits = name, trial[0]
        claim = here if best is None else _fits({t: c.layouts[best].count(t) for t in left}, left)
        left = claim[1]
        if best is not None:
            out[n.name] = c.layouts[best]
    return out


def _fits(free: Mapping[str, int], left: Mapping[str, list[int]]) -> tuple[int, dict[str, list[int]]]:
    started, rest = 0, {}
    for t, counts in left.items():
        room, keep = free.get(t, 0), []
        for k in counts:
            if k <= room:
                room -= k
                started += 1
            else:
                keep.append(k)
        rest[t] = keep
    return started, rest


def migd_policy(params: Params) -> Any:
    def policy(now: float, c: Cluster) -> dict[str, Layout]:
        snap = Snapshot(tuple(Pending(str(id(j)), j.spec.account, j.spec.gres, j.spec.count, j.spec.time_limit_s,
                                      age_s=now - j.spec.submit_s) for q in c.pending.values() for j in q),
                        tuple(_view(n, now) for n in c.nodes))
        return {ch.node: c.layouts[ch.new] for ch in decide(snap, c.layouts, params).changes}
    return policy


def _view(n: Node, now: float) -> NodeView:
    running = tuple(Running(str(id(j)), j.spec.gres, j.spec.count, (j.start or 0) + j.spec.time_limit_s - now,
                            j.spec.account, now - j.spec.submit_s, j.spec.time_limit_s) for j in n.running)
    draining = n.target is not None or n.ready_at is not None
    return NodeView(n.name, (n.target or n.layout).name, now - n.since, running, draining,
                    sum(1 for s in n.switches if s > now - DAY))


def cluster(nodes: int, fleet: str, waves: int) -> Cluster:
    models = [MODELS[k] for k in FLEETS[fleet]]
    layouts = {n: node_layout(load_profile(ROOT / "profiles" / f"{n}.yaml"), models) for n in CANDIDATES}
    slices = 7 * len(models)
    return Cluster([Node(f"gpu{i:03d}", layouts["night"], slices) for i in range(nodes)], layouts,
                   max_in_maintenance=waves)


def measure(c: Cluster, end_s: float, days: float) -> dict[str, Any]:
    jobs: list[Job] = c.done + [j for n in c.nodes for j in n.running] + [j for q in c.pending.values() for j in q]
    waits: dict[str, list[float]] = {}
    for j in jobs:  # a job still pending at the end waited until then (censored, never dropped)
        waits.setdefault(j.spec.gres, []).append((j.start if j.start is not None else end_s) - j.spec.submit_s)
    total = sum(n.slices for n in c.nodes) * end_s
    every = [w for ws in waits.values() for w in ws]
    return {"utilization": round(c.busy_slice_s / total, 4),
            "wait_p50_s": round(_pct(every, 50)), "wait_p95_s": round(_pct(every, 95)),
            "wait_by_type": {t: {"p50_s": round(_pct(w, 50)), "p95_s": round(_pct(w, 95)), "jobs": len(w)}
                             for t, w in sorted(waits.items())},
            "jobs_killed": c.killed, "never_started": sum(1 for j in jobs if j.start is None),
            "reconfigs_per_node_day": round(sum(len(n.switches) for n in c.nodes) / len(c.nodes) / days, 2),
            "drain_slice_hours": round(c.drain_slice_s / 3600, 1)}


def _pct(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [("utilization", "utilization", "{:.1%}"), ("wait p50", "wait_p50_s", "{:.0f} s"),
            ("wait p95", "wait_p95_s", "{:.0f} s"), ("jobs killed", "jobs_killed", "{}"),
            ("never started", "never_started", "{}"), ("reconfigs/node/day", "reconfigs_per_node_day", "{:.2f}"),
            ("drain slice-hours", "drain_slice_hours", "{:.1f}")]
    names = list(results)
    out = [f"{'':22}" + "".join(f"{n:>14}" for n in names)]
    out += [f"{label:22}" + "".join(f"{fmt.format(results[n][key]):>14}" for n in names) for label, key, fmt in rows]
    types = sorted({t for r in results.values() for t in r["wait_by_type"]})
    for t in types:
        out.append(f"{'p95 wait ' + t:22}" + "".join(
            f"{results[n]['wait_by_type'].get(t, {}).get('p95_s', 0):>12} s" for n in names))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, help="nodes in the cluster (default 64; 4 with --short)")
    p.add_argument("--fleet", default="dgx-h100", choices=sorted(FLEETS), help="each node's GPUs (a simulated fleet)")
    p.add_argument("--trace", type=Path, help="replay this CSV (submit_s,account,partition,gres,count,duration_s,"
                   "time_limit_s) instead of the synthetic trace")
    p.add_argument("--days", type=float, help="days simulated (default: 4, Thursday to Sunday; 1 with --short)")
    p.add_argument("--short", action="store_true", help="4 nodes, one weekday: what CI runs")
    p.add_argument("--json", action="store_true", help='one object {"policies": {"static": {...}, ...}}')
    args = p.parse_args(argv)
    nodes = args.nodes or (4 if args.short else 64)
    days = args.days or (1.0 if args.short else 4.0)
    if nodes < 1 or days <= 0:
        print("demand.py: --nodes and --days must be positive", file=sys.stderr)
        return 2
    try:
        trace = read_csv(args.trace) if args.trace else synthetic(nodes, int(days + 0.999))
    except TraceError as e:
        print(f"demand.py: {e}", file=sys.stderr)
        return 2
    waves = max(1, nodes // 8)
    params = Params(max_in_maintenance=waves)
    results, seconds = {}, {}
    for name, policy in (("static", static), ("greedy", greedy), ("migd", migd_policy(params))):
        t0 = time.process_time()
        c = run(trace, cluster(nodes, args.fleet, waves), policy, days * DAY)
        results[name], seconds[name] = measure(c, days * DAY, days), time.process_time() - t0
    if args.json:
        print(json.dumps({"policies": results, "nodes": nodes, "days": days, "jobs": len(trace)}, indent=1))
        return 0
    print(f"demand bench: {len(trace)} jobs, {nodes} nodes of {args.fleet}, {days:g} days, waves of {waves}; "
          f"{'trace ' + str(args.trace) if args.trace else 'synthetic trace (bench/demand_trace.py)'}")
    print(table(results))
    print("model CPU seconds: " + ", ".join(f"{n} {s:.1f}" for n, s in seconds.items()))
    print(TARGETS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
