"""Every transition between the 127 feasible A100-80GB layouts (127 x 127) plans the fewest
operations: each plan's op count equals a brute-force minimum computed independently here
(the planner may get faster, its plans must not get worse)."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from migd.catalog.models import MODELS, GiProfile, Placement
from migd.hardware.types import ComputeInstance, GpuInstance
from migd.plan.offline import fake_gpu
from migd.plan.planner import plan_gpu
from migd.plan.requests import DesiredInstance, DesiredLayout
from tests.test_catalog import ROLE_NAMES, feasible_multisets

pytestmark = pytest.mark.integration  # seconds each, in-process

MODEL = MODELS["A100-SXM4-80GB"]
GOLDEN = Path(__file__).parent / "golden"


def _mask(pl: Placement) -> int:
    return ((1 << pl.size) - 1) << pl.start


def _layouts() -> list[tuple[GiProfile, ...]]:
    by_role = {p.role: p for p in MODEL.profiles}
    out = []
    for multiset in sorted(feasible_multisets(MODEL, list(ROLE_NAMES))):
        out.append(tuple(by_role[r] for r, n in sorted(multiset, key=lambda x: -by_role[x[0]].memory_slices)
                         for _ in range(n)))
    return out


def _desired(gis: tuple[GiProfile, ...]) -> DesiredLayout:
    return DesiredLayout(mig=True, instances=tuple(DesiredInstance(gi=p, cis=(p.default_ci,)) for p in gis))


def _instances(gis: tuple[GiProfile, ...]) -> tuple[GpuInstance, ...]:
    """The layout as the planner would create it from an empty GPU (what a GPU holds after an apply)."""
    plan = plan_gpu(fake_gpu(MODEL), _desired(gis), [])
    return tuple(GpuInstance(id=n + 1, profile_id=t.gi_profile_id, placement=t.placement,
                             compute_instances=tuple(ComputeInstance(i, pid, pl) for i, (pid, pl) in enumerate(t.ci)))
                 for n, t in enumerate(plan.targets))


def brute_force_ops(current: tuple[GpuInstance, ...], want: tuple[GiProfile, ...]) -> int:
    """Fewest operations, by trying every non-overlapping placement of ``want``: an instance of the
    same profile at the same start is kept (its full CI matches); everything else is created
    (GI + CI) and every existing GI not kept is destroyed (CI + GI)."""
    existing = {(g.profile_id, g.placement.start) for g in current}
    best = [10**9]

    def go(k: int, used: int, kept: frozenset[tuple[int, int]], cost: int, last_start: int) -> None:
        if k == len(want):
            best[0] = min(best[0], cost + 2 * len(existing - kept))
            return
        p = want[k]
        same_as_previous = k > 0 and want[k - 1] == p
        for pl in p.placements:
            if (same_as_previous and pl.start < last_start) or used & _mask(pl):
                continue
            key = (p.profile_id, pl.start)
            if key in existing and key not in kept:
                go(k + 1, used | _mask(pl), kept | {key}, cost, pl.start)
            go(k + 1, used | _mask(pl), kept, cost + 2, pl.start)
    go(0, 0, frozenset(), 0, -1)
    return best[0]


@cache
def _all() -> tuple[list[tuple[GiProfile, ...]], list[tuple[GpuInstance, ...]]]:
    layouts = _layouts()
    return layouts, [_instances(gis) for gis in layouts]


def test_127_layouts() -> None:
    layouts, _ = _all()
    assert len(layouts) == 127


def test_every_transition_plans_the_fewest_operations() -> None:
    layouts, current = _all()
    gpu = fake_gpu(MODEL)
    worse = []
    for (a, have), b in itertools.product(zip(layouts, current, strict=True), layouts):
        ops = len(plan_gpu(gpu, _desired(b), list(have)).ops)
        best = brute_force_ops(have, b)
        if ops != best:
            worse.append((Counter(p.name for p in a), Counter(p.name for p in b), ops, best))
    assert not worse, f"{len(worse)} transitions plan more than the minimum, e.g. {worse[:3]}"


def plans_digest(layouts: list[tuple[GiProfile, ...]], current: list[tuple[GpuInstance, ...]]) -> str:
    """SHA-256 of every plan (operations and targets, one line each, sorted) from an empty GPU and
    between every two layouts."""
    gpu = fake_gpu(MODEL)
    lines = []
    for have, b in itertools.product([(), *current], layouts):
        p = plan_gpu(gpu, _desired(b), list(have))
        targets = [(t.gi_profile_id, t.placement.start, t.placement.size,
                    tuple((pid, pl.start, pl.size) for pid, pl in t.ci), t.name, t.owner) for t in p.targets]
        lines.append(" | ".join(o.describe() for o in p.ops) + f" # {targets} # kept {p.kept}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def test_the_plans_are_the_ones_recorded_before_the_planner_got_faster() -> None:
    """Issue 16: "The plans must stay exactly what they are today."  The digest was recorded with
    the planner of commit 66137e1, before the first-fit table, the pruning and the NamedTuples."""
    layouts, current = _all()
    recorded = (GOLDEN / "plans-a100-80gb.sha256").read_text().split()[0]
    assert plans_digest(layouts, current) == recorded
