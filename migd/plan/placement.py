"""The planner's search: one placement per wanted GPU instance, fewest operations.

Costs are integers (an operation is 1,000 units, moving a GI to another tenant 1, destroying an
instance with running processes 1,000,000), so ties are exact.  A layout's cost is what destroying
every existing GI would cost plus, per wanted instance, a ``delta``: creating it (GI and its CIs),
or, where an existing GI of its profile already sits at that start, changing that GI's CIs minus
the destroy it saves.  The search walks placements depth first over memory-slice bitmasks in a
fixed order (largest instances first, starts ascending, identical instances in ascending starts
only) and keeps the first layout of least cost; a branch whose cost so far plus a lower bound on
what the remaining instances add cannot beat the best layout found is cut.  Two bounds, both
valid, so the layout found is the same with either: the least deltas of each remaining instance
(blind to what is taken), and each one's fresh delta less the savings of the GIs to keep that the
slices taken so far still leave free (which sees an earlier instance sitting on a GI a later one
could keep).  With nothing to keep the first complete layout is optimal and everything after it
is cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache, partial
from operator import attrgetter
from typing import NamedTuple

from migd.catalog.models import CiProfile, GiProfile, Placement
from migd.hardware.types import GpuInstance
from migd.plan.firstfit import Fit
from migd.plan.requests import DesiredInstance

Busy = dict[int, dict[int, tuple[int, ...]]]  # GI id -> CI id -> pids running there
OP = 1000  # one create or destroy
OWNER = 1  # prefer keeping a GI for the tenant that already has it
BUSY = 1_000_000  # destroying an instance with processes: only when nothing else works
CiLayout = tuple[tuple[int, Placement], ...]  # (CI profile id, placement) per CI


@lru_cache(maxsize=4096)
def place_cis(want: tuple[CiProfile, ...], pinned: tuple[Placement, ...] | None, have: CiLayout) -> CiLayout | None:
    """CI placements inside one GI, keeping as many existing CIs as possible.  A pure function of
    hashable arguments, memoised: a search asks the same question for many placements."""
    if pinned is not None:
        return tuple((c.profile_id, p) for c, p in zip(want, pinned, strict=True))
    if not have:
        return fresh_cis(want)
    return _place_cis(want, have)


@lru_cache(maxsize=4096)
def fresh_cis(want: tuple[CiProfile, ...]) -> CiLayout | None:
    """CI placements inside an empty GI: a per-model table ("CI placements memoised per
    (GI profile, CI multiset)"), a function of the catalog alone, so ``forget`` keeps it."""
    return _place_cis(want, ())


def ci_multisets(gi: GiProfile) -> list[tuple[CiProfile, ...]]:
    """Every multiset of ``gi``'s CI profiles within its compute slices and CI caps (in the order
    of ``gi.ci_profiles``), whether or not a placement exists."""
    out: list[tuple[CiProfile, ...]] = []
    cps = gi.ci_profiles

    def walk(first: int, left: int, chosen: list[CiProfile]) -> None:
        for j in range(first, len(cps)):
            c = cps[j]
            if c.slices <= left and chosen.count(c) < c.instance_count:
                chosen.append(c)
                out.append(tuple(chosen))
                walk(j, left - c.slices, chosen)
                chosen.pop()
    walk(0, gi.slices, [])
    return out


def _place_cis(want: tuple[CiProfile, ...], have: CiLayout) -> CiLayout | None:
    order = sorted(range(len(want)), key=lambda i: -want[i].slices)
    best: list[tuple[int, list[Placement]]] = []
    most = min(len(want), len(have))  # no layout keeps more: the first that does is the answer

    def go(k: int, used: list[Placement], kept: int) -> bool:
        if k == len(order):
            if not best or kept > best[0][0]:
                best[:] = [(kept, list(used))]
            return kept == most
        ci = want[order[k]]
        for pl in ci.placements:
            if not any(pl.overlaps(u) for u in used) and \
                    go(k + 1, used + [pl], kept + ((ci.profile_id, pl) in have)):
                return True
        return False
    go(0, [], 0)
    if not best:
        return None
    placed = dict(zip(order, best[0][1], strict=True))
    return tuple(sorted((want[i].profile_id, placed[i]) for i in range(len(want))))


def ci_layout(gi: GpuInstance) -> CiLayout:
    """An existing GI's CIs as a sorted layout (the form place_cis answers in)."""
    cis = gi.compute_instances
    if len(cis) == 1:
        return ((cis[0].profile_id, cis[0].placement),)
    return tuple(sorted([(c.profile_id, c.placement) for c in cis]))


def destroy_cost(gi: GpuInstance, busy: Busy) -> int:
    return OP * (1 + len(gi.compute_instances)) + (BUSY if busy.get(gi.id) else 0)


def _ci_cost(gi: GpuInstance, cis: CiLayout, busy: Busy) -> int:
    have = {(c.profile_id, c.placement): c for c in gi.compute_instances}
    gone = sum(OP + (BUSY if c.id in busy.get(gi.id, {}) else 0) for key, c in have.items() if key not in cis)
    return gone + OP * sum(1 for key in cis if key not in have)


class Option(NamedTuple):
    """Where one wanted instance may go (a tuple: the search makes many of them)."""

    placement: Placement
    mask: int  # the memory slices it takes, as bits
    delta: int  # what choosing it adds to the layout's cost
    cis: CiLayout


_option = partial(tuple.__new__, Option)  # an Option from all its fields, without NamedTuple.__new__


class Solution(NamedTuple):
    """The layout a search chose (a tuple, as Option: built on every plan)."""

    items: tuple[DesiredInstance, ...]  # in ascending placement start (the order plans list them)
    options: tuple[Option, ...]  # the chosen option of each item


Existing = tuple[GpuInstance, CiLayout, int]  # an existing GI, its CIs as a sorted layout, what destroying it costs
Saving = tuple[int, int, int]  # a GI to keep: its mask, what keeping it saves, the last item that may keep it


def _fresh(d: DesiredInstance) -> tuple[Option, ...]:
    """Each placement of ``d`` on a GPU where nothing can be kept; none if its CIs fit no GI."""
    if d.placement is None and d.ci_placements is None:
        return fresh_options(d.gi, d.cis)
    # pinned: rollback and exact restores
    fresh = place_cis(d.cis, d.ci_placements, ())
    placements = d.gi.masks if d.placement is None else ((d.placement, _mask(d.placement)),)
    return () if fresh is None else tuple(_option((pl, mask, OP * (1 + len(fresh)), fresh)) for pl, mask in placements)


def _options(d: DesiredInstance, base: tuple[Option, ...], current: Mapping[int, Existing], busy: Busy,
             owners: Mapping[int, str], end: int, savings: list[Saving]) -> tuple[Option, ...]:
    """``d``'s fresh options ``base`` with what choosing each adds given the GIs of its profile that
    exist now (``current``, by placement start): keeping one where it sits saves its destroy and
    creates.  Without a fresh layout there is none keeping CIs either (pinned CIs always have one).
    Each option cheaper than a fresh one is added to ``savings`` (``end``: the last item that may
    take it, i.e. the last of ``d``'s twins)."""
    out = []
    for o in base:
        hit = current.get(o.placement.start)
        if hit is None:
            out.append(o)
            continue
        existing, have, destroy = hit
        # CIs as they would be created anew are already there: keeping them all is the answer
        cis = have if have == o.cis else place_cis(d.cis, d.ci_placements, have)
        if cis is None:
            continue
        change = 0 if cis == have else _ci_cost(existing, cis, busy)
        moved = OWNER if d.owner != owners.get(o.placement.start, d.owner) else 0
        delta = change + moved - destroy
        out.append(_option((o.placement, o.mask, delta, cis)))
        if delta < o.delta:
            savings.append((o.mask, o.delta - delta, end))
    return tuple(out)


@lru_cache(maxsize=4096)
def fresh_options(gi: GiProfile, cis: tuple[CiProfile, ...]) -> tuple[Option, ...]:
    """Every placement of a ``gi`` instance with CIs ``cis`` on a GPU where nothing can be kept, in
    placement order (none if the CIs do not fit): a per-model table, kept by ``forget``."""
    layout = fresh_cis(cis)
    if layout is None:
        return ()
    return tuple(_option((pl, mask, OP * (1 + len(layout)), layout)) for pl, mask in gi.masks)


def _reach(options: Sequence[Option]) -> int:
    reach = 0
    for o in options:
        reach |= o.mask
    return reach


def _mask(pl: Placement) -> int:
    return ((1 << pl.size) - 1) << pl.start


def _floors(options: Sequence[Sequence[Option]], twins: Sequence[bool],
            fresh: Sequence[Sequence[Option]]) -> list[int]:
    """The least the items from k on can add.  Identical items (twins, which share one tuple of
    options) take distinct placements, so r remaining twins add at least their options' r smallest
    deltas, not r times the smallest.  An item whose options are its ``fresh`` ones (nothing of
    its profile can be kept) adds the same whichever it takes: no sorting."""
    floor = [0] * (len(options) + 1)
    last = len(options) - 1  # the last item of a run of twins
    while last >= 0:
        first = last
        while twins[first]:
            first -= 1
        opts, after = options[last], floor[last + 1]
        deltas = [opts[0].delta] * len(opts) if opts is fresh[last] and opts else sorted([o.delta for o in opts])
        least = 0  # item k and the twins after it add at least the (last - k + 1) smallest deltas
        for k in range(last, first - 1, -1):
            if last - k < len(deltas):
                least += deltas[last - k]
            floor[k] = least + after
        last = first - 1
    return floor


def fresh_layout(table: Mapping[tuple[int, ...], Fit], items: Sequence[DesiredInstance],
                 sequence: tuple[int, ...]) -> Solution | None:
    """What ``search`` returns on an empty GPU for ``items`` (sorted by :data:`item_rank`; their
    GI profile ids are ``sequence``), looked up in the model's first-fit table (migd.plan.firstfit) and
    each instance's :func:`fresh_options`; None where the table cannot say (a pinned instance or CI
    layout, CIs that fit no GI, a sequence that does not fit): the search then decides."""
    fit = table.get(sequence)
    if fit is None:
        return None
    starts = fit.starts
    options = []
    for k in fit.by_start:
        d = items[k]
        if d.placement is not None or d.ci_placements is not None:
            return None
        fresh = fresh_options(d.gi, d.cis)  # in the order of d.gi.placements
        if not fresh:
            return None
        options.append(fresh[d.gi.start_index[starts[k]]])
    return Solution(tuple([items[k] for k in fit.by_start]), tuple(options))


item_rank = attrgetter("rank")  # the search order (DesiredInstance.rank): identical items are adjacent


class _Order(NamedTuple):
    """What a search needs of the wanted instances alone, kept per request (many plans share one)."""

    items: tuple[DesiredInstance, ...]  # in search order
    twins: tuple[bool, ...]  # item k is identical to item k-1
    later: tuple[int, ...]  # how many identical items follow item k
    reach: tuple[int, ...]  # the memory slices items k.. could take at all
    size: tuple[int, ...]  # how many memory slices items k.. need
    fresh: tuple[tuple[Option, ...], ...]  # each item's options on a GPU where nothing can be kept
    base: tuple[int, ...]  # what items k.. add on a GPU where nothing can be kept (each the same anywhere)
    profiles: frozenset[int]  # the GI profile ids wanted


@lru_cache(maxsize=512)
def search_order(items: tuple[DesiredInstance, ...]) -> _Order:
    """What the search needs of ``items`` (already sorted by :data:`item_rank`: the planner sorts
    a request once, for the first-fit table and the search alike)."""
    n = len(items)
    twins = [False] * n
    fresh: list[tuple[Option, ...]] = []
    for k, d in enumerate(items):  # twins have the same options
        if k and d.rank == items[k - 1].rank:
            twins[k] = True
            fresh.append(fresh[k - 1])
        else:
            fresh.append(_fresh(d))
    reach, size, later, base = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    for k in range(n - 1, -1, -1):
        d = items[k]
        reach[k] = reach[k + 1] | (d.gi.reach if d.placement is None and fresh[k] else _reach(fresh[k]))
        size[k] = size[k + 1] + d.gi.memory_slices
        later[k] = later[k + 1] + 1 if k + 1 < n and twins[k + 1] else 0
        base[k] = base[k + 1] + (fresh[k][0].delta if fresh[k] else 0)
    return _Order(items, tuple(twins), tuple(later), tuple(reach), tuple(size), tuple(fresh), tuple(base),
                  frozenset([d.gi.profile_id for d in items]))


_NONE = 1 << 62  # the cost of no layout: above any real one


def _priced(plan: _Order, current: Mapping[tuple[int, int], GpuInstance], busy: Busy, owners: Mapping[int, str],
            savings: list[Saving]) -> list[tuple[Option, ...]]:
    """Each item's options given the GIs that exist now (twins share theirs; an item of a profile
    with none is priced as fresh), adding the GIs to keep to ``savings``."""
    known: dict[int, dict[int, Existing]] = {}  # profile id -> start -> the GI there
    for (pid, start), g in current.items():
        if pid in plan.profiles:
            known.setdefault(pid, {})[start] = (g, ci_layout(g), destroy_cost(g, busy))
    options: list[tuple[Option, ...]] = []
    for k, d in enumerate(plan.items):
        pid = d.gi.profile_id
        if plan.twins[k]:
            options.append(options[k - 1])
        elif pid in known:
            options.append(_options(d, plan.fresh[k], known[pid], busy, owners, k + plan.later[k], savings))
        else:
            options.append(plan.fresh[k])
    return options


def search(want: tuple[DesiredInstance, ...], current: Mapping[tuple[int, int], GpuInstance], busy: Busy,
           owners: Mapping[int, str]) -> Solution | None:
    """The first layout of least cost in search order; None if no placement of ``want`` (sorted by
    :data:`item_rank`) exists.  ``current``: existing GIs by (profile id, placement start).

    Longer than 50 lines: the depth-first walk is one nested closure over local names, the planner's
    hottest code (docs/performance.md).  It stays whole until a split is measured no slower by
    bench/run.py's transition p99 (split, each step would pass the walk's state as arguments)."""
    plan = search_order(want)
    items, twins, later, reach, size = plan.items, plan.twins, plan.later, plan.reach, plan.size
    if not items:
        return Solution((), ())
    options: Sequence[tuple[Option, ...]] = plan.fresh
    base: Sequence[int] = plan.base  # nothing to keep: every item adds its fresh delta wherever it goes
    floor: Sequence[int] = base
    savings: list[Saving] = []  # for the second bound: the GIs to keep, which the slices taken may rule out
    if not plan.profiles.isdisjoint([key[0] for key in current]):  # some existing GI may be kept
        options = _priced(plan, current, busy, owners, savings)
        if not all(options):
            return None
        floor = _floors(options, twins, plan.fresh)
    elif not all(options):
        return None
    last = len(items) - 1
    best = _NONE
    pick: tuple[Option, ...] = ()
    chosen: list[Option] = []

    def go(k: int, used: int, spent: int, lo: int) -> None:
        """Place item k on the free slices ``used`` leaves; ``lo``: the mask its twin before it
        took (twins share a size, so ascending masks are ascending starts), else 0."""
        nonlocal best, pick
        if (reach[k] & ~used).bit_count() < size[k]:
            return  # the slices the remaining items could use are too few for them
        opts: Sequence[Option] = options[k]
        if k == last:  # a complete layout: kept only if cheaper than the best (an equal one loses the tie)
            for o in opts:
                if not used & o.mask and o.mask > lo and spent + o.delta < best:
                    best, pick = spent + o.delta, (*chosen, o)
            return
        if later[k]:
            # this item and its r later twins take distinct, ascending starts: it can only take one
            # of the first len(free) - r free places (a branch with no complete layout is cut at once)
            opts = [o for o in opts if not used & o.mask and o.mask > lo]
            opts = opts[:len(opts) - later[k]]
        twin, rest = twins[k + 1], floor[k + 1]
        for o in opts:
            mask = o.mask
            if used & mask or mask <= lo:
                continue
            total = spent + o.delta
            if total + rest >= best:
                continue  # cannot beat the best layout
            if savings:  # nor, once the GIs to keep that the slices taken rule out are priced fresh
                free, least = ~(used | mask), base[k + 1]
                for m, saved, end in savings:
                    if end > k and m & free == m:
                        least -= saved
                if total + least >= best:
                    continue
            chosen.append(o)
            go(k + 1, used | mask, total, mask if twin else 0)
            chosen.pop()
    go(0, 0, 0, 0)
    if not pick:
        return None
    by_start = sorted(range(len(items)), key=[o.placement.start for o in pick].__getitem__)
    return Solution(tuple([items[k] for k in by_start]), tuple([pick[k] for k in by_start]))
