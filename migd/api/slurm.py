"""``migd.slurm/v1``: where a Slurm node's layout switch stands, as kept in the state dir, shown in
``migctl daemon`` and exported as metrics (``SlurmSnapshot``: the same, with the node's name)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from migd.apply.statefile import of, one_of, optional, record
from migd.kinds import Word

SCHEMA = "migd.slurm/v1"


class Phase(Word):
    SERVING = "serving"  # no switch in progress
    DRAINING = "draining"  # drained for a switch; jobs holding GPUs still run
    SWITCHING = "switching"  # applying the layout and publishing the GRES
    FAILED = "failed"  # the last switch failed; the node serves its old layout


_NUMBER = of(int, float)
STATE_SHAPE = record(schema=of(str), phase=one_of(*Phase), profile=optional(of(str)), was_serving=optional(of(bool)),
                reservation=optional(of(str)), reserved_for=optional(_NUMBER), jobs_waiting=optional(of(int)),
                gres_in_sync=optional(of(bool)), reason=optional(of(str)), since=optional(_NUMBER))


@dataclass
class SlurmState:
    phase: Phase = Phase.SERVING
    profile: str | None = None
    was_serving: bool = True  # resume after the switch only if it was serving when migd drained it
    reservation: str | None = None
    reserved_for: float | None = None  # the transition (epoch) the reservation is for
    jobs_waiting: int = 0
    gres_in_sync: bool | None = None
    reason: str = ""
    since: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"schema": SCHEMA, **asdict(self)}


@dataclass(frozen=True)
class SlurmSnapshot:
    """One node's switch state at one moment (a copy: the daemon's thread goes on changing its own)."""

    node: str
    state: SlurmState

    @classmethod
    def of(cls, node: str, state: SlurmState) -> SlurmSnapshot:
        return cls(node, replace(state))

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, **asdict(self.state)}
