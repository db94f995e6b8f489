"""Per-model table: where each sequence of GPU-instance profiles goes on an empty GPU.

On an empty GPU every placement of a wanted instance costs the same (create the GI and its CIs),
so the planner's search returns its first complete layout: the lexicographically least starts for
the instances in search order (largest first, then profile id; identical instances ascending).
That depends on the model's placement table alone, so it is solved once per model for every
sequence that fits, by one depth-first walk over memory-slice bitmasks, and a first-time plan on an
empty GPU looks its placements up instead of searching ("per-model precomputed tables
of feasible placement sets").  Instance caps, compute slices and media engines are not checked
here: the planner's feasibility check refuses those requests before it looks.

Why the first visit is the answer: the walk visits the assignments of one profile sequence in
lexicographic order of starts, and a run of one profile in ascending starts is the least of its
permutations, so the search (which tries starts ascending) finds the same layout first.  A test
compares the table with the search for every sequence of every model.
"""

from __future__ import annotations

from functools import cache
from operator import attrgetter
from typing import NamedTuple

from migd.catalog.models import GpuModel

Sequence = tuple[int, ...]  # GI profile ids in search order


class Fit(NamedTuple):
    """Where a profile sequence goes on an empty GPU."""

    starts: tuple[int, ...]  # the placement start of each instance, in search order
    by_start: tuple[int, ...]  # the instances' indexes in ascending start (the order plans list them)


@cache  # one entry per catalog model: bounded, never stale (the catalog is constant)
def first_fit(model: GpuModel) -> dict[Sequence, Fit]:
    """Every profile sequence that fits ``model``'s memory slices -> its first placement starts."""
    profiles = sorted(model.profiles, key=attrgetter("search_rank"))
    masks = [[(pl.start, mask) for pl, mask in p.masks] for p in profiles]
    table: dict[Sequence, Fit] = {}
    seq: list[int] = []
    starts: list[int] = []

    def walk(first: int, used: int, after: int) -> None:
        """Extend with profile index >= ``first``; the same profile again only after start ``after``."""
        for j in range(first, len(profiles)):
            pid = profiles[j].profile_id
            for start, mask in masks[j]:
                if used & mask or (j == first and start <= after):
                    continue
                seq.append(pid)
                starts.append(start)
                key = tuple(seq)
                if key not in table:
                    table[key] = Fit(tuple(starts), tuple(sorted(range(len(starts)), key=starts.__getitem__)))
                walk(j, used | mask, start)
                seq.pop()
                starts.pop()
    walk(0, 0, -1)
    return table
