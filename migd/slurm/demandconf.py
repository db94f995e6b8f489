"""The ``slurm.demand`` section: layouts chosen from Slurm's queue instead of the clock (docs/demand.md).

    slurm:
      partition: gpu
      max_in_maintenance: 4
      demand:
        mode: dry-run              # on | dry-run (decide, log and report; change nothing)
        planner: gpu001            # the one node whose migd plans for the partition
        candidates: [day, night, night-two, balanced]
        interval: 60s              # how often the planner reads the queue
        lease: 2h                  # a wanted layout holds this long unless renewed; then the schedule
        history: 168h              # at start, run times from the jobs accounting saw end this long back; 0: off
        mixes: auto                # whole nodes (mixes only on small fleets of the plain model); true | false
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from migd.demand.rule import Params
from migd.kinds import Word
from migd.yamlsrc import Node

KEYS = ["mode", "planner", "candidates", "interval", "lease", "horizon", "min_dwell", "max_changes_per_day",
        "min_gain", "switch_time", "reversal_window", "keep_place", "history", "mixes"]
HISTORY_S = 7 * 86400.0  # a week of ended jobs: every account's newest 200, on most clusters


class Mixes(Word):
    """Whether a change may give a node a per-GPU mix of the candidates (demand/mix.py).  Under Slurm's
    backfill every pending job that cannot start reserves a whole node, so on a node mixed for a
    minority the majority's older jobs keep the minority off its GPU (demand/reserve.py).  Where nothing
    reserves (the bench's plain model) a node mixed for every type runs long jobs of some type on some
    GPU, and Slurm starts each job on the busiest node of a set (whatif/place.py), so no change of it is
    cheap again; only a fleet with fewer nodes than candidates needs mixes to offer every candidate at
    once.  Measured over the bench's traces, whole nodes wait less with reservations, and without them on
    4 nodes and more; mixes on 1 and 2 (docs/demand-tried.md)."""

    AUTO = "auto"  # whole nodes where older jobs hold whole nodes (every Slurm) and, where none do (the
    # bench's plain model), on a fleet of at least as many nodes as candidates; mixes on a smaller one
    ON = "true"
    OFF = "false"

    def whole(self, reserves: bool, nodes: int | None = None, candidates: int = 0) -> bool:
        """Whether each change takes a node whole into one candidate, on a cluster whose scheduler
        reserves whole nodes for pending jobs (``reserves``) or not, of ``nodes`` nodes (None: unknown)
        choosing among ``candidates``."""
        if self is not Mixes.AUTO:
            return self is Mixes.OFF
        return reserves or (nodes is not None and nodes >= candidates)

    @classmethod
    def read(cls, n: Node) -> Mixes:
        if n.is_bool():
            return cls.ON if n.bool() else cls.OFF
        return cls(n.str(choices=[cls.AUTO.value, cls.ON.value, cls.OFF.value]))


class DemandMode(Word):
    ON = "on"
    DRY_RUN = "dry-run"  # the planner decides, logs and exports; it writes nothing to Slurm


@dataclass(frozen=True)
class DemandSettings:
    mode: DemandMode
    planner: str
    candidates: tuple[str, ...]
    interval_s: float = 60.0
    lease_s: float = 7200.0
    history_s: float = HISTORY_S  # accounting read at the planner's start (slurm/history.py); 0: not read
    mixes: Mixes = Mixes.AUTO
    params: Params = field(default_factory=Params)


def parse_demand(n: Node, profiles: Collection[str], partition: str | None,
                 max_in_maintenance: int | None) -> DemandSettings:
    m = n.mapping(allowed=KEYS, required=["mode", "planner", "candidates"])
    if partition is None:
        raise n.error("needs slurm.partition: the planner reads that partition's queue and nodes")
    candidates = []
    for c in m["candidates"].items():
        name = c.name()
        if name not in profiles:
            raise c.error(f"no profile named {name!r}", allowed=sorted(profiles))
        candidates.append(name)
    if len(candidates) < 2:
        raise m["candidates"].error("needs at least two profiles to choose between")
    kw: dict[str, float | int] = {}
    for key, attr in (("horizon", "horizon_s"), ("min_dwell", "min_dwell_s"), ("switch_time", "switch_s"),
                      ("reversal_window", "reverse_s"), ("keep_place", "keep_place_s")):
        if key in m:
            kw[attr] = m[key].duration()
    if "max_changes_per_day" in m:
        kw["max_changes_per_day"] = m["max_changes_per_day"].int(minimum=1)
    if "min_gain" in m:
        kw["min_gain_slice_h"] = m["min_gain"].int(minimum=0)
    interval = m["interval"].duration() if "interval" in m else 60.0
    lease = m["lease"].duration() if "lease" in m else 7200.0
    if lease < 3 * interval:
        raise m.get("lease", n).error(
            f"lease ({lease:g}s) must be at least three planner intervals ({interval:g}s): it is renewed "
            "at half its length, and one missed renewal must not hand the node back to the schedule")
    history = m["history"].duration() if "history" in m else HISTORY_S
    mixes = Mixes.read(m["mixes"]) if "mixes" in m else Mixes.AUTO
    return DemandSettings(DemandMode(m["mode"].str(choices=list(DemandMode))), m["planner"].name(), tuple(candidates),
                          interval, lease, history, mixes,
                          Params(max_in_maintenance=max_in_maintenance, **kw))  # type: ignore[arg-type]
