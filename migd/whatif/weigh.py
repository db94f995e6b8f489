"""One trace weighed three ways, from the same replay model and configuration: what migd's demand mode
would have given, what the current layout (the configuration's schedule, by the clock) gave, and the
best fixed mix found in hindsight (fixedmix.py).  What ``migctl what-if`` prints; bench/demand.py
replays through the same ``replayer``.

A record starts in the middle of a cluster's life: its nodes have held their layouts a while, so
here each has held it a day when the record starts (the bench's generated traces start as if every
node had just switched, which holds migd's rule for its minimum dwell first)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from migd.whatif import policies
from migd.whatif.figures import measure, objective
from migd.whatif.fixedmix import Counts, accounting, hindsight, spread
from migd.whatif.jobs import DAY, TraceJob
from migd.whatif.replay import run

Replay = Callable[[policies.Policy, "list[str] | None"], dict[str, Any]]
MIGD, CURRENT, BEST = "migd demand", "current schedule", "best fixed mix"


def replayer(setup: policies.Setup, jobs: Sequence[TraceJob], nodes: int, waves: int, end_s: float,
             days: float, settled_s: float = 0.0, reserve: bool = False) -> Replay:
    """A replay of ``jobs`` on ``nodes`` under a policy, from the clock's layout or the ``initial`` one
    per node (names of setup.layouts), held since ``settled_s`` before the start; its figures.
    ``reserve``: with Slurm's backfill reservations (Cluster.reserve), on the trace's own wall clock."""
    def replay(policy: policies.Policy, initial: list[str] | None = None) -> dict[str, Any]:
        first = [setup.layouts[n] for n in initial] if initial else None
        c = policies.cluster(setup, nodes, waves, first, settled_s)
        c.reserve, c.epoch_s = reserve, setup.start.timestamp()
        c.drain_lag_s = policy.lag_s if isinstance(policy, policies.Planner) else 0.0
        return measure(run(list(jobs), c, policy, end_s, decide_every_s=setup.interval_s), end_s, days)
    return replay


@dataclass(frozen=True)
class Weighed:
    results: dict[str, dict[str, Any]]  # MIGD, CURRENT, BEST -> figures
    accounting: Counts  # GPUs per candidate, sized from slice-hours (the climb's start)
    best: Counts  # GPUs per candidate of the best fixed mix found
    best_nodes: tuple[str, ...]  # the best fixed mix, each node's layout (a candidate or a per-GPU mix)
    replays: int


def weigh(setup: policies.Setup, jobs: Sequence[TraceJob], nodes: int, waves: int, end_s: float, days: float,
          budget: int, reserve: bool = False) -> Weighed:
    setup = setup.reserving(reserve, nodes)
    replay = replayer(setup, jobs, nodes, waves, end_s, days, settled_s=DAY, reserve=reserve)
    acc = accounting(setup, jobs, nodes)
    best, figures, replays = hindsight(setup, acc, lambda mix: replay(policies.fixed, mix), objective, budget)
    results = {MIGD: replay(policies.migd(setup), None), CURRENT: replay(policies.clock(setup), None), BEST: figures}
    return Weighed(results, acc, best, tuple(spread(setup, best)), replays)
