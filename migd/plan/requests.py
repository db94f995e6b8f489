"""What a plan is asked to reach: the instances wanted on one GPU, resolved to its model's profiles."""

from __future__ import annotations

from dataclasses import dataclass, field

from migd.catalog.models import CiProfile, GiProfile, Placement


@dataclass(frozen=True)
class DesiredInstance:
    gi: GiProfile
    cis: tuple[CiProfile, ...]
    owner: str | None = None
    placement: Placement | None = None  # pinned: rollback and exact restores
    ci_placements: tuple[Placement, ...] | None = None
    # Derived once at construction, as the hash: a request is planned on every GPU of every pass.
    _hash: int = field(init=False, repr=False, compare=False)
    rank: tuple[object, ...] = field(init=False, repr=False, compare=False)  # see __post_init__
    label: str = field(init=False, repr=False, compare=False)  # how plans and status name it

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.gi, self.cis, self.owner, self.placement, self.ci_placements)))
        # The planner's search order: largest instances first, then profile, CIs, owner and pins,
        # so identical (interchangeable) instances are adjacent and placed in ascending starts only.
        pin = (self.placement.start, self.placement.size) if self.placement is not None else (-1, 0)
        ci_pins = tuple((p.start, p.size) for p in self.ci_placements) if self.ci_placements else ()
        object.__setattr__(self, "rank", (*self.gi.search_rank, tuple([c.profile_id for c in self.cis]),
                                          self.owner or "", pin, ci_pins))
        object.__setattr__(self, "label", _label(self.gi, self.cis))

    def __hash__(self) -> int:
        return self._hash


def _label(gi: GiProfile, cis: tuple[CiProfile, ...]) -> str:
    if len(cis) == 1 and cis[0].default:
        return gi.name
    if not cis:
        return f"{gi.name}[no CI]"
    return f"{gi.name}[{'+'.join(c.name.split('.')[0] for c in cis)}]"


@dataclass(frozen=True)
class DesiredLayout:
    mig: bool
    instances: tuple[DesiredInstance, ...] = ()
    mode_only: bool = False  # only the MIG mode is asked for: instances that exist are kept as they are
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # hashed once: plans are memoised by the layout they reach
        object.__setattr__(self, "_hash", hash((self.mig, self.instances, self.mode_only)))

    def __hash__(self) -> int:
        return self._hash
