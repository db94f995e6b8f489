"""The demand planner: one migd per partition reads Slurm's queue and nodes, runs the demand rule
and records each node's wanted layout in that node's Slurm record (slurm/want.py).

Safe by construction: it writes only nodes whose Extra is empty, its own, or a want whose lease
ended (a second planner's live wants are left alone, so two planners never give one node two
layouts); a Slurm it cannot read means no decision, not a guess; dry-run writes nothing.  Every
node it plans for holds a want (a pin to its current layout when nothing changes), renewed at half
the lease, so the schedule takes over only when the planner is gone.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from migd.api.demand import PlanSummary
from migd.apply.statefile import atomic_write_json, load
from migd.demand.inputs import Layout, NodeView, Running, Shapes, Snapshot
from migd.demand.rule import Decision, decide
from migd.demand.runtime import RunTimes
from migd.demand.seen import LastSeen
from migd.errors import ValidationError
from migd.numeral import whole
from migd.repeat import Said
from migd.slurm.ctl import NodeInfo, SlurmCtl, SlurmError
from migd.slurm.demandconf import DemandMode, DemandSettings
from migd.slurm.history import Accounting
from migd.slurm.queue import Queue, read_queue
from migd.slurm.transition import DRAIN_REASON
from migd.slurm.want import Want, stamp

log = logging.getLogger(__name__)
DAY_S = 86400.0
SAVE_EVERY_S = 600.0  # demand.json is written on a switch, and at least this often (what it learned)
HISTORY_SCHEMA = "migd.demand/v1"


@dataclass(frozen=True)
class History:
    """``demand.json``: what the planner keeps across restarts: each node's switches (epoch, newest last,
    the last day's), the layout each node held before its last switch, per account how much of its
    time limits ended jobs ran (``demand.runtime``), and per MIG type when a job of it was last seen and
    the fewest instances one asked (``demand.seen``: a type used lately keeps its last place)."""

    SCHEMA: ClassVar[str] = HISTORY_SCHEMA
    switches: dict[str, tuple[float, ...]]
    left: dict[str, str] = field(default_factory=dict)
    runtimes: dict[str, tuple[float, ...]] = field(default_factory=dict)
    seen: dict[str, tuple[float, float]] = field(default_factory=dict)


def layout_of(gres: str, layouts: Mapping[str, Layout]) -> str | None:
    """The candidate whose instances a node's ``Gres=`` lists (``gpu:1g.10gb:56(S:0-1)``)."""
    have: Counter[str] = Counter()
    for part in gres.split(","):
        bits = part.split("(")[0].split(":")
        count = whole(bits[2], 9) if len(bits) == 3 and bits[0] == "gpu" else None
        if count is not None:
            have[bits[1]] += count
    return next((n for n, lay in sorted(layouts.items()) if Counter(dict(lay.capacity)) == +have), None)


class Planner:
    def __init__(self, settings: DemandSettings, partition: str, me: str, ctl: SlurmCtl,
                 layouts: Mapping[str, Layout] | Shapes, history: Path, clock: Callable[[], float] = time.time) -> None:
        """``layouts``: every layout a node may take (the candidates and their per-GPU mixes, by name), or
        Shapes: those and, for nodes of other GPU counts, theirs."""
        self.s, self.partition, self.me, self.ctl = settings, partition, me, ctl
        self.shapes = layouts if isinstance(layouts, Shapes) else Shapes(layouts)
        self.left: dict[str, str] = {}  # node -> the layout it held before its last switch
        self.runtimes = RunTimes()  # per account: how much of its time limit a job runs
        self.seen = LastSeen()  # per MIG type: when a job of it was last pending or running
        self._watched: dict[str, tuple[str, float, float]] = {}  # running job -> (account, started, limit)
        self.accounting = Accounting(ctl, partition, settings.history_s)  # run times at start, from slurmdbd
        self._history_path = history
        self._clock = clock
        self._last = 0.0
        self._current: dict[str, Want] = {}  # this planner's live wants, as read at the last tick
        self._coming: dict[str, tuple[str, float]] = {}  # node -> (layout changed to, since when it was wanted)
        self.capacity_count, self.capacity_sum = 0, 0.0  # time to capacity: observations and their sum
        self.capacity_last: float | None = None
        self.history: dict[str, list[float]] = self._load()  # node -> its switches (epoch), newest last
        self._saved = 0.0  # when demand.json was last written
        self._shape: dict[str, str] = {}  # node -> the shape its Gres= last matched
        self._unreadable = Said()  # (logged when it starts or changes, then every 10 min)

    def _load(self) -> dict[str, list[float]]:
        try:
            doc = load(self._history_path, History)
        except FileNotFoundError:
            return {}
        except (OSError, ValidationError) as e:
            log.error("demand: %s; starting without switch history", e)
            return {}
        self.left = dict(doc.left)
        try:
            self.runtimes.load(doc.runtimes)
            self.seen.load(doc.seen)
        except (ValueError, OverflowError) as e:  # (a number the schema lets through, e.g. NaN)
            log.error("demand: %s: %s; starting without what it learned", self._history_path, e)
        return {n: [float(t) for t in ts] for n, ts in doc.switches.items()}

    def due(self) -> bool:
        return self._clock() - self._last >= self.s.interval_s

    def tick(self) -> PlanSummary:
        """Read, decide and (mode on) write; Slurm unreadable: nothing decided, said in ``error``."""
        now = self._last = self._clock()
        if self.accounting.due(now):
            self.accounting.seed(self.runtimes, now)
        try:
            nodes = [n for n in self.ctl.nodes() if self.partition in n.partitions]
            queue = read_queue(self.ctl.all_jobs(), self.partition, now)
        except SlurmError as e:
            if self._unreadable.due(str(e)):
                log.error("demand: cannot read Slurm, no decision: %s (said again every %.0f min while it lasts)",
                          e, self._unreadable.repeat_s / 60)
            return PlanSummary(now, self.s.mode.value, (), (), {}, (), 0, 0, str(e),
                               run_share=dict(self.runtimes.ratios()))
        if self._unreadable.ended():
            log.info("demand: Slurm can be read again")
        self._learn(queue.running, now)
        running = [r for rs in queue.running.values() for r in rs]
        self.seen.observe(now, [(p.mig_type, p.count) for p in queue.pending] + [(r.mig_type, r.count)
                                                                                 for r in running])
        views, skipped = self._views(nodes, queue, now)
        decision = decide(Snapshot(queue.pending, tuple(views), self.runtimes.ratios(), self.seen.seen(now)),
                          self.shapes, self.s.params)
        writes = self._write(decision, views, now) if self.s.mode is DemandMode.ON else 0
        if (decision.changes and self.s.mode is DemandMode.ON) or now - self._saved >= SAVE_EVERY_S:
            self._save(now)
        for c in decision.changes:
            log.info("demand%s: %s", " (dry-run)" if self.s.mode is DemandMode.DRY_RUN else "", c.reason)
        view = {v.name: v for v in views}
        for c in decision.changes if self.s.mode is DemandMode.ON else ():
            ages = [p.age_s for p in queue.pending if self.shapes.of(view[c.node])[c.new].count(p.mig_type)]
            self._coming[c.node] = (c.new, now - max(ages, default=0.0))
        return PlanSummary(now, self.s.mode.value, tuple(c.reason for c in decision.changes),
                           tuple(why for _, why in decision.held),  # (each reason names its node)
                           {t: round(v, 1) for t, v in decision.demand}, tuple(skipped),
                           writes, queue.untyped, None, self.capacity_count, self.capacity_sum, self.capacity_last,
                           dict(self.runtimes.ratios()),
                           self.accounting.seeded.jobs if self.accounting.seeded is not None else None,
                           _unoffered(queue, decision.unservable) or None)

    def _served(self, node: NodeInfo, current: str | None, now: float) -> None:
        """A node changed for pending work now serves its new layout: its time to capacity is observed."""
        coming = self._coming.get(node.name)
        if coming is not None and current == coming[0] and not node.drained:
            del self._coming[node.name]
            self.capacity_last = now - coming[1]
            self.capacity_count += 1
            self.capacity_sum += self.capacity_last
            log.info("demand: %s serves %s, %.0fs after the work it was changed for was first pending", node.name,
                     coming[0], self.capacity_last)

    def _views(self, nodes: list[NodeInfo], queue: Queue, now: float) -> tuple[list[NodeView], list[str]]:
        views, skipped = [], []
        self._current = {}
        for n in sorted(nodes, key=lambda n: n.name):
            if "FUTURE" in n.states:  # (a catalog node declaring MIG types so their jobs can queue)
                continue
            want = Want.parse(n.extra)
            ours = want is not None and want.holds(self.me, now, self.s.lease_s)
            if ours and want is not None:
                self._current[n.name] = want
            if want is not None and not ours and now < want.until and want.planner != self.me:
                skipped.append(f"{n.name}: follows planner {want.planner} until {stamp(want.until)}")
                continue  # (a want of its own beyond its lease, e.g. until= in milliseconds, is rewritten)
            if n.drained and not n.reason.startswith(DRAIN_REASON):
                skipped.append(f"{n.name}: drained by an operator ({n.reason})")
                continue
            shape, current = self._shape_of(n.name, n.gres)
            self._served(n, current, now)
            wanted = want.layout if ours and want is not None else current
            if shape is None or wanted is None or wanted not in self.shapes.named(shape):
                skipped.append(f"{n.name}: Gres={n.gres or '(none)'} is none of the candidate layouts or their mixes"
                               " on this planner's GPU model")
                continue
            switches = self.history.get(n.name, [])
            since = switches[-1] if switches else 0.0
            views.append(NodeView(n.name, wanted, now - since, queue.running.get(n.name, ()),
                                  draining=wanted != current or n.drained,
                                  changes_today=sum(1 for t in switches if t > now - DAY_S),
                                  left=self.left.get(n.name), shape=shape))
        return views, skipped

    def _shape_of(self, node: str, gres: str) -> tuple[str | None, str | None]:
        """Which of the planner's layouts a node's ``Gres=`` is, and of which shape ("": the planner's own
        GPUs, tried first).  A ``Gres=`` that is none (a node mid-switch) keeps the shape it last matched;
        never matched, and with other shapes possible: (None, None), its GPU count is not known."""
        for shape, layouts in (("", self.shapes.own), *sorted(self.shapes.other.items())):
            name = layout_of(gres, layouts)
            if name is not None:
                self._shape[node] = shape
                return shape, name
        return self._shape.get(node, None if self.shapes.other else ""), None

    def _write(self, decision: Decision, views: list[NodeView], now: float) -> int:
        """The changes, then a pin or a renewal for every other node planned for (each one scontrol call)."""
        changed = {c.node: c.new for c in decision.changes}
        writes = 0
        for v in views:
            layout = changed.get(v.name, v.layout)
            want = Want(layout, self.me, now, now + self.s.lease_s)
            current = self._current.get(v.name)
            if v.name not in changed and current is not None and current.layout == layout \
                    and current.until - now > self.s.lease_s / 2:
                continue  # (its want holds and is not half spent)
            try:
                self.ctl.set_extra(v.name, want.text())
            except SlurmError as e:
                log.error("demand: cannot record %s's wanted layout %s: %s", v.name, layout, e)
                continue
            writes += 1
            self._current[v.name] = want
            if v.name in changed:
                self.history[v.name] = [t for t in self.history.get(v.name, []) if t > now - DAY_S] + [now]
                self.left[v.name] = v.layout
        return writes

    def _save(self, now: float) -> None:
        """demand.json: the switches, the layouts left, the run times and when each MIG type was seen."""
        try:
            atomic_write_json(self._history_path, History({n: tuple(ts) for n, ts in self.history.items()},
                                                          dict(self.left),
                                                          {a: tuple(v) for a, v in self.runtimes.to_json().items()},
                                                          self.seen.to_json()))
        except OSError as e:
            log.error("demand: cannot write %s: %s", self._history_path, e)
            return
        self._saved = now

    def _learn(self, running: Mapping[str, tuple[Running, ...]], now: float) -> None:
        """A job seen running at the last tick and gone now has ended: it ran from its start (its limit
        less what was left of it) until at most now (one interval's error, on the long side)."""
        seen = {r.job: (r.account, now - (r.limit_s - r.ends_in_s), r.limit_s)
                for rs in running.values() for r in rs if r.limit_s < float("inf")}
        for job, (account, started, limit) in self._watched.items():
            if job not in seen:
                self.runtimes.observe(account, now - started, limit)
        self._watched = seen


def _unoffered(queue: Queue, types: tuple[str, ...]) -> dict[str, int]:
    """Pending jobs (an array's each task) per GPU type no candidate layout offers: the MIG types among
    ``types`` (the rule's), and every type that is no MIG type; a job over N nodes once."""
    mig = Counter(t for t, _ in {(p.mig_type, p.job) for p in queue.pending if p.mig_type in types})
    return dict(sorted((mig + Counter(queue.others)).items()))
