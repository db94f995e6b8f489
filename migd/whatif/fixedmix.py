"""The fixed mixes migd is measured against: what an operator sizes from accounting, and the best one
found in hindsight.

Both assign each GPU of the fleet one candidate for the whole trace; the GPUs of each candidate are
laid over the nodes in the configured order (a node gets its eight from the next in line), so a node
may hold a per-GPU mix, as migd's nodes may.

- From accounting: the trace's slice-hours per MIG type (what last month's sacct says), and GPUs given
  one at a time to the candidate that most raises the worst-covered type's supply/demand ratio (then
  the next worst's): water-filling, as an operator would size a static partition.
- In hindsight: a hill climb over the GPU counts per candidate, evaluated by replaying the whole
  trace: from the accounting mix, move a node's worth of GPUs (then one GPU) from one candidate to
  another while that lowers the objective (metrics.objective); at most ``budget`` replays.  Its
  space is every split of the fleet's GPUs among the candidates (C(G+k-1, k-1): 3,276 for 8 nodes
  of 8 GPUs and 4 candidates); the climb sees a part of it, so "best" means best found, not proven.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from migd.demand.inputs import slices_of
from migd.demand.mix import mix_text
from migd.whatif.jobs import TraceJob
from migd.whatif.policies import Setup

Counts = tuple[int, ...]  # GPUs per candidate, in the configured order


def slice_hours(jobs: Sequence[TraceJob]) -> dict[str, float]:
    """Per MIG type, the slice-hours the jobs ran (a job over N nodes: its share on each)."""
    out: dict[str, float] = {}
    for j in jobs:
        out[j.gres] = out.get(j.gres, 0.0) + slices_of(j.gres) * j.count * j.nodes * j.duration_s / 3600
    return out


def accounting(setup: Setup, jobs: Sequence[TraceJob], nodes: int) -> Counts:
    """GPUs per candidate sized from the trace's slice-hours per type (water-filling)."""
    demand = slice_hours(jobs)
    per_gpu = [dict(lay.capacity) for lay in setup.candidates.per_gpu[0]]
    counts = [0] * len(per_gpu)
    supply = {t: 0.0 for t in demand}

    def coverage(extra: Mapping[str, int]) -> list[float]:
        return sorted((supply[t] + slices_of(t) * extra.get(t, 0)) / d for t, d in demand.items() if d > 0)
    for _ in range(nodes * setup.gpus):
        k = max(range(len(per_gpu)), key=lambda i: (coverage(per_gpu[i]), -i))
        counts[k] += 1
        for t, n in per_gpu[k].items():
            if t in supply:
                supply[t] += slices_of(t) * n
    return tuple(counts)


def spread(setup: Setup, counts: Counts) -> list[str]:
    """Each node's layout: the candidates' GPUs in configured order, eight to a node."""
    line = [name for name, n in zip(setup.candidates.names, counts, strict=True) for _ in range(n)]
    return [mix_text(line[i:i + setup.gpus]) for i in range(0, len(line), setup.gpus)]


def hindsight(setup: Setup, first: Counts, replay: Callable[[list[str]], dict[str, Any]],
              objective: Callable[[Mapping[str, Any]], tuple[float, float]],
              budget: int) -> tuple[Counts, dict[str, Any], int]:
    """The best split found (its counts, its replay's figures, replays made)."""
    seen: dict[Counts, dict[str, Any]] = {first: replay(spread(setup, first))}
    best = first
    improved = True
    while improved and len(seen) < budget:
        improved = False
        for step in (setup.gpus, 1):
            for nxt in _moves(best, step):
                if nxt in seen:
                    continue
                if len(seen) >= budget:
                    break
                seen[nxt] = replay(spread(setup, nxt))
                if objective(seen[nxt]) < objective(seen[best]):
                    best, improved = nxt, True
                    break
            if improved:
                break
    return best, seen[best], len(seen)


def _moves(counts: Counts, step: int) -> list[Counts]:
    out = []
    for a in range(len(counts)):
        for b in range(len(counts)):
            if a != b and counts[a] >= step:
                c = list(counts)
                c[a] -= step
                c[b] += step
                out.append(tuple(c))
    return out
