"""What a replay gives for one policy's run (the what-if and bench/demand.py report it), and the
targets bench/demand.py checks (docs/demand.md).

Waits: from submission to start, to the model's 30-second step; a job still pending at the end waited
until then (censored, never dropped), and is counted in ``never_started``.  A reversal is a switch
that undoes at least half of the same node's previous switch (in slices moved between MIG types,
migd.demand.mix.moved_back) less than 6 hours after it.

Idle while jobs wait: slice-hours of serving nodes (not draining or switching) left idle while any job
is pending, whatever its type.  A layout wrong for the queue shows here (a fixed mix's 3g instances idle
while notebooks queue); it bounds what any other layouts could have run of the waiting work on the same
nodes, and a policy that changes layouts pays its drains on top (``drain_slice_hours``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from migd.demand.mix import moved_back
from migd.whatif.replay import Cluster, Job
from migd.whatif.shift import SHIFT_MIN, holds

REVERSAL_S = 6 * 3600.0


def pct(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def type_waits(by_type: Mapping[str, list[float]]) -> dict[str, Any]:
    """The wait figures every reference reports from waits per MIG type: p95 over all jobs, per type,
    and the worst type's (ties: the later name)."""
    types = {t: round(pct(w, 95)) for t, w in sorted(by_type.items())}
    worst = max(types.items(), key=lambda kv: (kv[1], kv[0]), default=("-", 0))
    return {"wait_p95_s": round(pct([w for ws in by_type.values() for w in ws], 95)), "worst_type": worst[0],
            "worst_type_p95_s": worst[1], "p95_by_type_s": types}


def measure(c: Cluster, end_s: float, days: float) -> dict[str, Any]:
    jobs = c.jobs()
    by_type: dict[str, list[float]] = {}
    by_account: dict[str, list[float]] = {}
    for j in jobs:
        wait = (j.start if j.start is not None else end_s) - j.spec.submit_s
        by_type.setdefault(j.spec.gres, []).append(wait)
        by_account.setdefault(j.spec.account, []).append(wait)
    every = [w for ws in by_type.values() for w in ws]
    switches = sum(len(n.history) for n in c.nodes)
    return {"wait_p50_s": round(pct(every, 50)), **type_waits(by_type),
            "jobs_by_type": {t: len(w) for t, w in sorted(by_type.items())},
            "p95_by_account_s": {a: round(pct(w, 95)) for a, w in sorted(by_account.items())},
            "never_started": sum(1 for j in jobs if j.start is None), "jobs_killed": killed(c, jobs),
            "changes": switches, "reversals_6h": reversals(c),
            "reconfigs_per_node_day": round(switches / len(c.nodes) / days, 2),
            "drain_slice_hours": round(c.drain_slice_s / 3600, 1),
            "idle_waiting_slice_hours": round(c.idle_waiting_slice_s / 3600, 1),
            "utilization": round(c.busy_slice_s / (sum(n.slices for n in c.nodes) * end_s), 4)}


def killed(c: Cluster, jobs: list[Job]) -> int:
    """Jobs a switch of one of their nodes cut short: a node switched after they started there and
    before they ended.  migd's Slurm mode drains a node and switches it only once it is empty, and the
    model does the same, so this must be 0; it is counted from the switches and the jobs, not assumed."""
    switched = {n.name: [t for t, _, _ in n.history] for n in c.nodes}
    return sum(1 for j in jobs if j.start is not None and any(
        j.start < t < j.end for name in j.nodes for t in switched.get(name, ())))


def reversals(c: Cluster) -> int:
    out = 0
    for n in c.nodes:
        for (t0, before, now), (t1, _, after) in zip(n.history, n.history[1:], strict=False):
            out += t1 - t0 < REVERSAL_S and moved_back(before, now, after)
    return out


def objective(r: Mapping[str, Any]) -> tuple[float, float]:
    """What the hindsight search minimizes: the larger of the overall and the worst type's p95, then the
    overall p95 (the two figures the targets weigh)."""
    return max(r["wait_p95_s"], r["worst_type_p95_s"]), r["wait_p95_s"]


def targets(results: Mapping[str, Mapping[str, Any]], clock_right: bool,
            pool: Mapping[str, Any] | None = None, shift: float | None = None) -> list[tuple[str, bool | None, str]]:
    """Each target as (what, met, the figures); met is None for a target that does not apply.  ``shift``:
    how far the trace's mix moves (migd/whatif/shift.py): the 0.85x-hindsight target is for demand that
    shifts, and where the mix holds the best fixed mix already offers each window what it asks (None:
    not measured, the target applies).  ``pool``: the figures of the fleet as one pool of slices
    (bench/demand_pool.py), whose p95 over all jobs no policy beats: a target below it is out of any
    policy's reach, and the figures say so.  Not its worst type's p95: the pool starts jobs in arrival
    order, passing one that does not fit, and can keep passing a large one."""
    m, acc, best, clk = results["migd"], results["fixed-accounting"], results.get("fixed-hindsight"), results["clock"]
    out: list[tuple[str, bool | None, str]] = [_at_most("p95 <= fixed mix from accounting", m, acc, 1.0)]
    if clock_right:
        out.append(_at_most("p95 <= 1.5x clock (the clock is right here)", m, clk, 1.5))
    elif best is not None:
        what, ok, figures = _at_most("p95 <= 0.85x best fixed mix in hindsight", m, best, 0.85)
        if not ok and pool is not None and pool["wait_p95_s"] > 0.85 * best["wait_p95_s"]:
            figures += (f"; out of any policy's reach: one pool of the fleet's slices waits {pool['wait_p95_s']} s "
                        "over all jobs")
        if shift is not None and holds(shift):
            out.append((what, None, f"does not apply: the trace's mix holds (distance {shift:.3f}, under "
                                    f"{SHIFT_MIN:.2f}); {figures}"))
        else:
            out.append((what, ok, figures))
    ratio = m["worst_type_p95_s"] / max(1, m["wait_p95_s"])
    out.append(("no type's p95 above 3x the overall p95", ratio <= 3,
                f"{m['worst_type']} {m['worst_type_p95_s']} s = {ratio:.1f}x {m['wait_p95_s']} s"))
    share = m["reversals_6h"] / max(1, m["changes"])
    out.append(("under 10% of changes reversed within 6 h", share < 0.10,
                f"{m['reversals_6h']} of {m['changes']} ({share:.0%})"))
    out.append(("0 jobs killed", m["jobs_killed"] == 0, str(m["jobs_killed"])))
    out.append(("at most 4 reconfigurations per node per day", m["reconfigs_per_node_day"] <= 4,
                f"{m['reconfigs_per_node_day']:.2f}"))
    return out


def _at_most(what: str, m: Mapping[str, Any], ref: Mapping[str, Any], k: float) -> tuple[str, bool, str]:
    ok = m["wait_p95_s"] <= k * ref["wait_p95_s"] and m["worst_type_p95_s"] <= k * ref["worst_type_p95_s"]
    return (what + " (all jobs / worst type)", ok, f"{m['wait_p95_s']} / {m['worst_type_p95_s']} s against "
            f"{k:g} x {ref['wait_p95_s']} / {ref['worst_type_p95_s']} s")


ROWS = (("wait p50", "wait_p50_s", "{} s"), ("wait p95", "wait_p95_s", "{} s"),
        ("worst type p95", "worst_type_p95_s", "{} s"), ("never started", "never_started", "{}"),
        ("changes", "changes", "{}"), ("reversed within 6 h", "reversals_6h", "{}"),
        ("reconfigs/node/day", "reconfigs_per_node_day", "{:.2f}"), ("drain slice-hours", "drain_slice_hours",
                                                                     "{:.1f}"),
        ("slice-hours idle, queued", "idle_waiting_slice_hours", "{:.1f}"),
        ("jobs killed", "jobs_killed", "{}"), ("utilization", "utilization", "{:.1%}"))


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Each policy a column, each figure a row, then the p95 of each MIG type and account."""
    names = list(results)
    out = [f"{'':24}" + "".join(f"{n:>18}" for n in names)]
    out += [f"{label:24}" + "".join(f"{fmt.format(results[n][key]):>18}" for n in names) for label, key, fmt in ROWS]
    for part, label in (("p95_by_type_s", "p95"), ("p95_by_account_s", "p95")):
        for k in sorted({k for r in results.values() for k in r[part]}):
            out.append(f"{label + ' ' + k:24}" + "".join(f"{results[n][part].get(k, 0):>16} s" for n in names))
    return "\n".join(out)
