"""The fleet as the demand rule scores it: supply per MIG type over the nodes against the demand per type
and account, and the places each type with pending work has, with one node's part swappable so that a
trial change costs O(types x accounts).

A node's supply of a type is what Slurm's reservations leave of it (migd/demand/reserve.py): older
pending jobs of the node's other types reserve the whole node.  How long they hold it depends on the
fleet's supply and free instances of those types, which a change moves for every node offering them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from migd.demand.inputs import Layout
from migd.demand.reserve import Ahead
from migd.demand.supply import Supply

WAIT_CAP = 10.0  # horizons: the expected wait of a type its supply would take longer to serve, or never


@dataclass(frozen=True)
class Score:
    unplaced: tuple[str, ...]  # MIG types with pending work short of places: each once per place it lacks
    worst: float  # the worst-served account's fraction of its work that can run
    served: float  # slice-hours of work that can run
    unkept: tuple[str, ...] = ()  # MIG types seen lately (none pending) that no node's layout can start
    waits: tuple[tuple[str, float], ...] = ()  # each MIG type's expected wait (Fleet.score)

    @property
    def wait_s(self) -> float:
        """The longest expected wait of a MIG type (0 where none waits)."""
        return self._longest[0]

    @property
    def wait_type(self) -> str:
        """The type it is of ("-" where none waits)."""
        return self._longest[1]

    @property
    def _longest(self) -> tuple[float, str]:
        return max([(0.0, "-"), *((w, t) for t, w in self.waits)])


@dataclass(frozen=True)
class Queue:
    """What the fleet's supply is weighed against: demand (type -> account -> slice-hours), the
    instances the smallest pending job of each type asks on one node (``need``), the types seen lately
    with none pending (``keep``), each type's oldest pending job's age, who is ahead of whom in Slurm's
    reservations, and the places (nodes that can start its share) each type needs: as many as the nodes
    its first pending job in Slurm's order spans (``spread``; one where absent).  Slurm starts a job over N nodes
    on all at once, so with fewer places than that it never starts."""

    demand: Mapping[str, Mapping[str, float]]
    need: Mapping[str, int]
    oldest: Mapping[str, float]
    keep: Mapping[str, int]
    ahead: Ahead
    spread: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    """One node's part: its supply before reservations, in its layout, and its instances free now.  A node
    changing (a trial, or draining) counts all of its new layout's instances free: jobs that would
    start on them once it is ready reserve nothing elsewhere meanwhile, a simplification the estimate of
    reserve.py carries (it is an expectation over the horizon, not a timeline; counting a trial's
    instances free only when it is ready within minutes moved no figure of the bench's `--short`,
    8-node and shifting replays with reservations beyond 0.1%, 2026-11-28)."""

    supply: Supply
    layout: Layout
    free: Mapping[str, int]


class Fleet:
    """Each node's part, the fleet's totals over them, and the places each type has; ``score`` weighs
    the fleet as it stands or with one node's part replaced by a trial, ``put`` takes parts."""

    def __init__(self, queue: Queue, horizon_s: float) -> None:
        self.demand = queue.demand
        self.oldest = queue.oldest
        self.ahead = queue.ahead
        self.horizon_s = horizon_s
        self.need = dict(sorted(queue.need.items()))
        self.spread = queue.spread
        self.keep = {t: k for t, k in sorted(queue.keep.items()) if t not in self.need}  # none pending
        self.by_type = {t: sum(a.values()) for t, a in queue.demand.items()}
        # all of it: no trial serves more (summed in score's order, so the bound is exact)
        self.work = sum(self.by_type.values(), 0.0)
        self.asked: dict[str, float] = defaultdict(float)
        for per in queue.demand.values():
            for account, work in per.items():
                self.asked[account] += work
        self.raw: dict[str, Part] = {}
        self.offer: Counter[str] = Counter()  # the fleet's supply before reservations, per type
        self.free: Counter[str] = Counter()  # the fleet's free instances, per type
        self.total: Supply = {}
        self.places: dict[str, int] = defaultdict(int)
        self.part: dict[str, Supply] = {}  # node -> its supply as reservations leave it
        self._placing: dict[Layout, frozenset[str]] = {}  # _placed, per layout (need and keep are fixed)

    def put(self, parts: Mapping[str, Part]) -> None:
        """Each node of ``parts`` now offers its part; every node's is weighed again (the fleet's supply
        and free instances of a type set how long its older jobs hold each node)."""
        self.raw.update(parts)
        self.offer, self.free = Counter(), Counter()
        for p in self.raw.values():
            self.offer.update(p.supply)
            self.free.update(p.free)
        self.part = self._weigh(self.raw, self.offer, self.free)
        self.total = _summed(self.part.values())
        self.places.clear()
        for p in self.raw.values():
            for t in self._placed(p.layout):
                self.places[t] += 1

    def _weigh(self, parts: Mapping[str, Part], offer: Mapping[str, float],
               free: Mapping[str, int]) -> dict[str, Supply]:
        """Each node's supply as reservations leave it, the fleet's supply and free instances being these."""
        return {name: self._left(p.supply, p.layout, offer, free) for name, p in parts.items()}

    def _left(self, supply: Supply, layout: Layout, offer: Mapping[str, float], free: Mapping[str, int]) -> Supply:
        return {t: n * self.ahead.share(layout, t, offer, free) for t, n in supply.items()}

    def _placed(self, layout: Layout) -> frozenset[str]:
        """The types with pending work (or seen lately) ``layout`` can start."""
        got = self._placing.get(layout)
        if got is None:
            got = self._placing[layout] = frozenset(
                t for t, k in (*self.need.items(), *self.keep.items()) if layout.count(t) >= k)
        return got

    def held(self, node: str, trial: Part, mig_type: str) -> float:
        """The part of the horizon ``node`` in ``trial`` is held for older jobs of its other types before
        it serves ``mig_type`` (reserve.py): how much later a place there opens than the node is ready."""
        return 1.0 - self.ahead.share(trial.layout, mig_type, *self._with(node, trial))

    def _with(self, node: str, trial: Part) -> tuple[Counter[str], Counter[str]]:
        """The fleet's supply before reservations and its free instances with ``node``'s part replaced
        by ``trial``."""
        offer, free = Counter(self.offer), Counter(self.free)
        offer.subtract(self.raw[node].supply)
        offer.update(trial.supply)
        free.subtract(self.raw[node].free)
        free.update(trial.free)
        return offer, free

    def _weighed(self, node: str, trial: Part) -> Supply:
        """The fleet's supply per type as reservations leave it with ``node``'s part replaced by ``trial``.
        The trial moves the fleet's supply and free instances of its types, and so how long their older
        jobs hold every other node offering them: each node is weighed again, so that a trial scores
        exactly what taking it (``put``) gives."""
        return _summed(self._weigh({**self.raw, node: trial}, *self._with(node, trial)).values())

    def score(self, node: str | None = None, trial: Part | None = None, exact: bool = False) -> Score:
        """The fleet's score with ``node``'s part replaced by ``trial``: ``exact``, every node weighed again
        (what taking the trial gives), else the other nodes as the fleet stands (cheaper: what the search
        ranks trials by; the change it picks is checked exactly before it is taken).  An account's share
        of a type's supply is its share of that type's demand.  A type's expected wait is its oldest
        pending job's age plus the time its supply takes to run its work (``horizon x demand / supply``,
        at most ``WAIT_CAP`` horizons: a type offered nothing waits that long)."""
        old: Supply = {}
        new: Supply = {}
        base = self.total
        if node is not None and trial is not None:
            if exact and self.ahead.holds:
                base = self._weighed(node, trial)
            elif self.ahead.holds:  # (the other nodes as the fleet stands: what the search ranks trials by)
                old, new = self.part[node], self._left(trial.supply, trial.layout, *self._with(node, trial))
            else:  # (nothing reserves: a part is its supply)
                old, new = self.part[node], trial.supply
        got = dict.fromkeys(self.asked, 0.0)
        total = 0.0
        waits: list[tuple[str, float]] = []
        for t, d in self.by_type.items():
            offered = base.get(t, 0.0) - old.get(t, 0.0) + new.get(t, 0.0)
            clear = self.horizon_s * min(WAIT_CAP, d / offered if offered > 0 else WAIT_CAP)
            waits.append((t, self.oldest.get(t, 0.0) + clear))
            run = d if offered >= d else offered
            total += run
            share = run / d
            for account, work in self.demand[t].items():
                got[account] += share * work
        worst = min((got[a] / w for a, w in self.asked.items() if w > 0), default=1.0)
        gone: frozenset[str] = frozenset()
        came: frozenset[str] = frozenset()
        if node is not None and trial is not None:
            gone, came = self._placed(self.raw[node].layout), self._placed(trial.layout)

        def lacks(t: str) -> int:
            return max(0, self.spread.get(t, 1) - self.places.get(t, 0) + (t in gone) - (t in came))
        unplaced = tuple(t for t in self.need for _ in range(lacks(t)))
        unkept = tuple(t for t in self.keep if lacks(t))
        return Score(unplaced, worst, total, unkept, tuple(waits))


def _summed(parts: Iterable[Supply]) -> Supply:
    """Supplies added up per type."""
    out: dict[str, float] = defaultdict(float)
    for part in parts:
        for t, n in part.items():
            out[t] += n
    return out
