#!/usr/bin/env python3
"""A short trace for real Slurm and the queue model, time-compressed (tests/test_slurm_replay.py).

    python3 bench/demand_replay.py                 # the trace and what the model says of it
    python3 bench/demand_replay.py --switch-s 4.5  # with a switch of 4.5 s (what real Slurm measured)
    python3 bench/demand_replay.py --switch-s 2.3 --release-s 0.4 --epoch-s 1795840000.4  # a run's figures

The trace is written in compressed time: one second of it is a minute of a working day
(``COMPRESSION``), so about two hours of demand (216 jobs) take under two minutes, and their queue about
three more. Everything in seconds is compressed alike, and both sides get the same figures: run times
and the arrival phases; the rule's knobs that migd.yaml has (``horizon`` 8 h -> 8 min, ``min_dwell`` 1 h
-> 1 min, ``interval`` 60 s -> 1 s, ``min_gain`` 7 slice-hours -> 0: an integer knob, and 7/60 rounds to
0); time limits are whole minutes, at least one, as Slurm keeps them (``sbatch -t`` rounds seconds up to
a minute), so a compressed job's limit is its run time padded as the generator pads it, then rounded up
to a minute. The rule's own figures that migd.yaml has no knob for (the switch time it reckons with, 180
s; the recent-arrival window, 1 h, and its 4 h lookahead; the 6 h reversal window) stay as they are on
both sides: the planner on real Slurm cannot be given others, and the model must decide as it does.

The model is migd/whatif/replay.py, the one bench/demand.py replays, run with the replay's figures:
a 1-second step (Slurm's scheduler here runs every 2 s and at each job's end, not every 30 s), the
planner's interval, the switch time real Slurm took (measured by the test from node states, passed
in here), Slurm's own backfill (``reserve``: migd/whatif/backfill.py, every pending job's whole-node
reservation from cons_tres's batched estimate, on the run's wall clock, ``epoch_s``), the time Slurm
took from a job's end to the next start on its instances (``release_s``, measured too), the
nodes named as on Slurm (the rule breaks ties by name) and starting with no switch history (as the
planner's nodes do: nothing held by the dwell at second 0).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import demand_policies as policies  # noqa: E402
from demand_gen import poisson  # noqa: E402
from demand_trace import TraceJob  # noqa: E402

from migd.whatif.figures import pct  # noqa: E402
from migd.whatif.policies import migd  # noqa: E402
from migd.whatif.replay import Cluster, Node, run  # noqa: E402

COMPRESSION = 60  # trace seconds per replay second
FLEET = "a100-vm"  # each node: two A100-SXM4-80GB (14 slices)
INITIAL = {"gpu1": "night", "gpu2": "day", "gpu3": "balanced"}  # the planner is gpu1
CANDIDATES = ("day", "night", "night-two", "balanced")
CATALOG = "gpu:1g.10gb:14,gpu:2g.20gb:4,gpu:3g.40gb:4,gpu:7g.80gb:2"  # every candidate mix's types, on two A100
INTERVAL_S = 1.0
DRAIN_LAG_S = 1.0  # the planner's want reaches the node's migd on its next pass (reconcile_interval 1 s)
HORIZON_S = 1800.0  # (8 h compressed is 480 s; see above)
DEMAND = f"""\
  demand:
    mode: on
    planner: gpu1
    candidates: [{", ".join(CANDIDATES)}]
    interval: {INTERVAL_S:g}s
    lease: 1h
    horizon: {HORIZON_S:g}s
    min_dwell: {3600 // COMPRESSION}s
    max_changes_per_day: 4
    min_gain: 0
"""
SCHEDULE = """\
timezone: UTC
schedule:
  - {profile: day,   at: "08:30", days: mon-fri}
  - {profile: night, at: "19:00", days: mon-fri}
"""


@dataclass(frozen=True)
class Phase:
    """Arrivals per replay second of each account's jobs from ``start_s`` on."""

    start_s: float
    rates: Mapping[str, float]


@dataclass(frozen=True)
class Stream:
    gres: str
    counts: tuple[int, ...]
    run_s: tuple[float, float]  # run time range, replay seconds
    nodes: tuple[int, ...] = (1,)  # how many nodes a job spans (``sbatch -N``), drawn from these


STREAMS = {"teaching": Stream("1g.10gb", (1,), (5, 20)), "serving": Stream("2g.20gb", (1,), (8, 22)),
           "vision": Stream("3g.40gb", (1, 2), (10, 25), (1, 1, 2)), "nlp": Stream("7g.80gb", (1,), (10, 25))}
PHASES = (  # notebooks first, then training: demand that moves off the initial layouts
    Phase(0, {"teaching": 3.06, "serving": 0.136, "vision": 0.085}),
    Phase(50, {"teaching": 0.51, "serving": 0.136, "vision": 0.085, "nlp": 0.425}),
)
LENGTH_S = 110.0
SEED = 7  # 216 jobs; every job started by about 200 s (python3 bench/demand_replay.py), 360 s with --two-node


def trace(seed: int = SEED, two_node: bool = False) -> tuple[TraceJob, ...]:
    """Poisson arrivals second by second in each phase (seeded: the same seed, the same jobs).  With
    ``two_node`` some jobs span two nodes (``Stream.nodes``), drawn apart (``spans``), so the jobs' times
    and sizes are those of the trace without: a variant measured by hand, not the test's default, as
    its waits vary too much from run to run for the test's 20% (docs/demand.md, runs K-O)."""
    rng, spans = random.Random(seed), random.Random(seed + 1)
    jobs = []
    for second in range(int(LENGTH_S)):
        phase = [p for p in PHASES if p.start_s <= second][-1]
        for account, rate in sorted(phase.rates.items()):
            for _ in range(poisson(rng, rate)):
                s = STREAMS[account]
                run_s = round(rng.uniform(*s.run_s))
                limit = max(60, math.ceil(run_s * rng.uniform(1.2, 2.0) / 60) * 60)
                jobs.append(TraceJob(round(second + rng.uniform(0, 1), 1), account, "main", s.gres,
                                     rng.choice(s.counts), run_s, limit,
                                     nodes=spans.choice(s.nodes) if two_node else 1))
    return tuple(sorted(jobs, key=lambda j: (j.submit_s, j.account)))


def setup(profiles: Path = ROOT / "profiles") -> policies.Setup:
    """The candidates resolved on FLEET's GPUs, with the replay's demand knobs, as a migd.yaml gives them."""
    with tempfile.TemporaryDirectory() as d:
        config = Path(d) / "migd.yaml"
        config.write_text(SCHEDULE + f"profiles_dir: {profiles}\nslurm:\n  node: gpu1\n  partition: main\n"
                          + DEMAND)
        return policies.Setup.load(config, FLEET, datetime(2026, 11, 23, 10), waves=1)


def model(jobs: Sequence[TraceJob], switch_s: float, end_s: float, release_s: float = 1.0,
          epoch_s: float = 0.0) -> Cluster:
    """The trace through the queue model with migd's rule, as the replay runs on real Slurm (``epoch_s``:
    the wall clock at its second 0, on which Slurm's backfill rounds its estimates)."""
    s = setup()
    nodes = [Node(name, s.layouts[layout], 7 * s.gpus, since=-1e9) for name, layout in INITIAL.items()]
    cluster = Cluster(nodes, s.layouts, switch_s=switch_s, max_in_maintenance=1, reserve=True,
                      release_s=release_s, epoch_s=epoch_s, drain_lag_s=DRAIN_LAG_S)
    return run(list(jobs), cluster, migd(s), end_s, step_s=1.0, decide_every_s=INTERVAL_S)


def waits(cluster: Cluster, end_s: float) -> dict[str, list[float]]:
    """Each MIG type's waits (a job never started waited until ``end_s``: censored, never dropped)."""
    out: dict[str, list[float]] = {}
    for j in cluster.jobs():
        out.setdefault(j.spec.gres, []).append((end_s if j.start is None else j.start) - j.spec.submit_s)
    return out


def figures(by_type: Mapping[str, list[float]]) -> dict[str, tuple[float, float, int]]:
    """Per MIG type: median and p95 wait (migd/whatif/figures.pct), and how many jobs."""
    return {t: (pct(w, 50), pct(w, 95), len(w)) for t, w in sorted(by_type.items())}


def spread(jobs: Sequence[TraceJob], draws: int, end_s: float) -> dict[str, list[tuple[float, float]]]:
    """Each type's (median, p95) over ``draws`` replays with their inputs nudged as real runs differ:
    submit times by up to 0.4 s, the switch 0.5-2.5 s, the release 0.4-0.6 s, any wall-clock phase (how
    far a real run may stray from one replay of the model by chance alone)."""
    rng, out = random.Random(5), {}
    for _ in range(draws):
        nudged = sorted((replace(j, submit_s=max(0.0, round(j.submit_s + rng.uniform(-0.4, 0.4), 1))) for j in jobs),
                        key=lambda j: j.submit_s)
        c = model(nudged, rng.uniform(0.5, 2.5), end_s, rng.choice((0.4, 0.5, 0.6)), rng.uniform(0, 60))
        for t, (p50, p95, _) in figures(waits(c, end_s)).items():
            out.setdefault(t, []).append((p50, p95))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switch-s", type=float, default=5.0, help="one switch's time in the model (replay seconds)")
    p.add_argument("--release-s", type=float, default=1.0, help="an ended job's instances serve again this "
                   "much later (what real Slurm measured)")
    p.add_argument("--epoch-s", type=float, default=0.0, help="the wall clock (epoch seconds) at the trace's "
                   "second 0: Slurm's backfill rounds its estimates on it (the test prints the run's)")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--two-node", action="store_true", help="a third of the 3g jobs over two nodes (sbatch -N 2)")
    p.add_argument("--spread", type=int, default=0, metavar="N", help="N replays with their inputs nudged: "
                   "each type's range of median and p95 (how far real runs may stray by chance)")
    args = p.parse_args(argv)
    jobs = trace(args.seed, args.two_node)
    end = LENGTH_S + 600
    if args.spread > 0:
        for t, got in spread(jobs, args.spread, end).items():
            p50, p95 = [g[0] for g in got], [g[1] for g in got]
            print(f"{t:10} median {min(p50):6.1f}-{max(p50):6.1f} s  p95 {min(p95):6.1f}-{max(p95):6.1f} s "
                  f"({len(got)} replays)")
        return 0
    c = model(jobs, args.switch_s, end, args.release_s, args.epoch_s)
    print(f"{len(jobs)} jobs over {LENGTH_S:g} s; switches: "
          + ", ".join(f"{n.name} {a.name}->{b.name} at {t:.0f}s" for n in c.nodes for t, a, b in n.history))
    for t, (p50, p95, k) in figures(waits(c, end)).items():
        print(f"{t:10} {k:4} jobs  median {p50:6.1f} s  p95 {p95:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
