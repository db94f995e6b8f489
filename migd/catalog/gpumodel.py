"""Typed MIG profile tables: what one GPU model offers and the rules its layouts obey.

The numbers live in ``migd/hardware/tables.py``; this module turns a table into frozen
objects and holds the hardware rules that are not plain placement overlap (the media-engine
exclusivity of the ``+me.all`` profiles).  Every rule cites its source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from migd.kinds import Word

# NVML_GPU_INSTANCE_PROFILE_COUNT in pynvml's header (facts: nvml.gpu_instance_profile_enum [S5]).
GI_ENUM_COUNT = 0x12
# NVML_COMPUTE_INSTANCE_PROFILE_* enum == CI profile id (facts: nvml.compute_instance_profile_id).
CI_ENUM_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}
CI_ENUM_1_SLICE_REV1 = 0x7
CI_ENUM_COUNT = 0x9

ARCH_AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE
ARCH_HOPPER = 9  # NVML_DEVICE_ARCH_HOPPER
ARCH_BLACKWELL = 10  # NVML_DEVICE_ARCH_BLACKWELL

# Role -> NVML_GPU_INSTANCE_PROFILE_* enum (facts: nvml.gpu_instance_profile_enum [S5]; the +gfx,
# -me and +me.all pairings are derived from the profile semantics, facts RTX-PRO-6000 notes).
ROLE_ENUM = {"1g": 0x0, "2g": 0x1, "3g": 0x2, "4g": 0x3, "7g": 0x4, "1g+me": 0x7, "2g+me": 0x8,
             "1g.2m": 0x9, "1g+gfx": 0xA, "2g+gfx": 0xB, "4g+gfx": 0xC, "1g-me": 0xD, "2g-me": 0xE,
             "1g+me.all": 0xF, "2g+me.all": 0x10}


class Family(Word):
    """Memory-slice geometry shared by several models (facts: placement_tables, RTX PRO 6000 lgipp)."""

    SEVEN_SLICE = "seven_slice"  # GA100/GH100/GB100: 8 memory slices, 7 compute slices
    A30 = "a30"  # 4 memory slices, 4 compute slices
    GB202 = "gb202"  # RTX PRO 6000 Blackwell: 12 placement units, 4 compute slices
    LIVE = "live"  # not in the catalog: geometry as the driver's placements say (livetable.py)


class Media(Word):
    """The media-engine attribute a profile name carries (MIG guide 'Supported MIG Profiles' [S1])."""

    SHARED = ""
    ME = "+me"
    ME_ALL = "+me.all"
    NO_ME = "-me"
    GFX = "+gfx"


# (memory slices, placement starts) per role and family.  seven_slice and a30: `nvidia-smi mig
# -lgipp` (facts placement_tables); gb202: -lgipp on an RTX PRO 6000 [S19].
_GEOMETRY: dict[Family, dict[str, tuple[int, tuple[int, ...]]]] = {
    Family.SEVEN_SLICE: {"1g": (1, (0, 1, 2, 3, 4, 5, 6)), "1g+me": (1, (0, 1, 2, 3, 4, 5, 6)),
                         "1g.2m": (2, (0, 2, 4, 6)), "2g": (2, (0, 2, 4)), "3g": (4, (0, 4)), "4g": (4, (0,)),
                         "7g": (8, (0,))},
    Family.A30: {"1g": (1, (0, 1, 2, 3)), "1g+me": (1, (0, 1, 2, 3)), "2g": (2, (0, 2)), "2g+me": (2, (0, 2)),
                 "4g": (4, (0,))},
    Family.GB202: {**{r: (3, (0, 3, 6, 9)) for r in ("1g", "1g+me", "1g+gfx", "1g+me.all", "1g-me")},
                   **{r: (6, (0, 6)) for r in ("2g", "2g+gfx", "2g+me.all", "2g-me")},
                   **{r: (12, (0,)) for r in ("4g", "4g+gfx")}},
}
_SIZE = {Family.SEVEN_SLICE: (8, 7), Family.A30: (4, 4), Family.GB202: (12, 4)}

# CI structure per GI compute-slice count: (ci slices, instance count, starts).
# facts: gpus.A100-SXM4-40GB.compute_instance_profiles and its notes (go-nvml mock placements,
# unconfirmed); the same structure is assumed for every other model (facts: H100 structure_unconfirmed).
CI_LAYOUT: dict[int, tuple[tuple[int, int, tuple[int, ...]], ...]] = {
    1: ((1, 1, (0,)),),
    2: ((1, 2, (0, 1)), (2, 1, (0,))),
    3: ((1, 3, (0, 1, 2)), (2, 1, (0,)), (3, 1, (0,))),
    4: ((1, 4, (0, 1, 2, 3)), (2, 2, (0, 2)), (4, 1, (0,))),
    7: ((1, 7, tuple(range(7))), (2, 3, (0, 2, 4)), (3, 2, (0, 4)), (4, 1, (0,)), (7, 1, (0,))),
}


@dataclass(frozen=True, order=True)
class Placement:
    """A span of memory slices (GI) or compute slices (CI): [start, start+size)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class CiProfile:
    """A compute-instance profile inside one GI profile."""

    profile_id: int  # == NVML_COMPUTE_INSTANCE_PROFILE_* enum
    slices: int  # compute slices
    name: str  # e.g. "1c.3g.20gb" or, for the full-GI CI, the GI name
    instance_count: int
    sm: int
    starts: tuple[int, ...]
    default: bool = False

    @cached_property  # frozen: computed once, kept in __dict__
    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(s, self.slices) for s in self.starts)

    @cached_property
    def _hash(self) -> int:
        return hash((self.profile_id, self.name))

    def __hash__(self) -> int:  # computed once (plans are memoised by their inputs); equality compares all
        return self._hash


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile of one GPU model (one row of ``nvidia-smi mig -lgip``)."""

    name: str  # e.g. "1g.10gb", "1g.5gb+me"
    role: str  # model-independent short form: 1g, 1g+me, 1g.2m, 2g, 3g, 4g, 7g, 1g+gfx, 2g-me, ...
    nvml_enum: int
    profile_id: int
    slices: int  # compute slices (NVML sliceCount)
    memory_slices: int  # placement size
    instance_count: int
    memory_mib: int
    sm: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]
    ci_profiles: tuple[CiProfile, ...] = field(default=(), compare=False)
    unconfirmed: str = field(default="", compare=False)  # which of these numbers nobody has observed

    @cached_property  # frozen: computed once, kept in __dict__
    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(s, self.memory_slices) for s in self.starts)

    @cached_property
    def _hash(self) -> int:
        return hash((self.profile_id, self.name, self.memory_mib))

    def __hash__(self) -> int:  # computed once (plans are memoised by their inputs); equality compares all
        return self._hash

    @cached_property
    def masks(self) -> tuple[tuple[Placement, int], ...]:
        """Each placement with the memory slices it takes as bits (the planner's search works on these)."""
        return tuple((p, ((1 << p.size) - 1) << p.start) for p in self.placements)

    @cached_property
    def reach(self) -> int:
        """Every memory slice some placement of this profile takes, as bits."""
        reach = 0
        for _, mask in self.masks:
            reach |= mask
        return reach

    @cached_property
    def search_rank(self) -> tuple[int, int]:
        """The planner's search order of profiles: most memory slices first, then profile id
        (migd.plan.placement searches in it, migd.plan.firstfit tabulates it, requests sort by it)."""
        return -self.memory_slices, self.profile_id

    @cached_property
    def start_index(self) -> dict[int, int]:
        """Placement start -> its index in :attr:`placements` (the first-fit table names placements
        by start)."""
        return {p.start: i for i, p in enumerate(self.placements)}

    @cached_property  # frozen: computed once, kept in __dict__
    def media(self) -> Media:
        for m in (Media.ME_ALL, Media.ME, Media.NO_ME, Media.GFX):
            if self.role.endswith(m.value):
                return m
        return Media.SHARED

    @cached_property
    def _ci_index(self) -> dict[int, CiProfile]:
        return {c.profile_id: c for c in self.ci_profiles}

    @cached_property
    def ci_names(self) -> dict[int, str]:
        """CI profile id -> name (plans name every CI they create)."""
        return {c.profile_id: c.name for c in self.ci_profiles}

    def ci_by_id(self, profile_id: int) -> CiProfile | None:
        return self._ci_index.get(profile_id)

    def ci_by_name(self, name: str) -> CiProfile | None:
        return next((c for c in self.ci_profiles if c.name == name), None)

    @property
    def default_ci(self) -> CiProfile:
        return next(c for c in self.ci_profiles if c.default)


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: identity as NVML reports it plus its MIG profile table."""

    key: str
    nvml_name: str
    pci_device_id: int
    architecture: int
    total_memory_mib: int
    sm_count: int
    memory_slices: int
    compute_slices: int
    profiles: tuple[GiProfile, ...]
    family: Family
    alt_names: tuple[str, ...] = ()  # other names NVML gives the same device id (subsystem, driver)
    unconfirmed: tuple[str, ...] = field(default=(), compare=False)  # model-wide facts nobody observed
    ci_unconfirmed: str = field(default="", compare=False)  # the split of a GI into several CIs, if unobserved
    identity_unconfirmed: str = field(default="", compare=False)  # NVML name, memory or architecture unobserved

    @cached_property
    def _hash(self) -> int:
        return hash((self.key, self.pci_device_id, self.total_memory_mib))

    def __hash__(self) -> int:  # computed once (plans are memoised by their inputs); equality compares all
        return self._hash

    @property
    def is_hopper_or_newer(self) -> bool:
        return self.architecture >= ARCH_HOPPER

    @property
    def mode_change_needs_reset(self) -> bool:
        """Ampere keeps a MIG mode change pending until a GPU reset; Hopper+ applies it at once."""
        return self.architecture < ARCH_HOPPER

    @cached_property
    def by_id(self) -> dict[int, GiProfile]:
        return {p.profile_id: p for p in self.profiles}

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        return self.by_id.get(profile_id)

    def profile_by_enum(self, nvml_enum: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.nvml_enum == nvml_enum), None)

    def profile_by_name(self, name: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def profile_by_role(self, role: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.role == role), None)

    def usable_slices(self, taken: Iterable[Placement], compute_free: int) -> set[int]:
        """The memory slices some GPU instance could still be made on beside the instances ``taken``:
        a placement of a profile whose slices are all untaken, with enough compute slices left.  An
        8-slice GPU has 7 compute slices: beside seven 1g instances its eighth memory slice is free
        but unusable (only larger placements take it: 1g.20gb at 6:2, 3g at 4:4, 7g at 0:8)."""
        held = list(taken)
        usable: set[int] = set()
        for prof in self.profiles:
            if prof.slices > compute_free:
                continue
            for pl in prof.placements:
                if not any(pl.overlaps(h) for h in held):
                    usable.update(range(pl.start, pl.end))
        return usable

    def caveats(self, used: Iterable[GiProfile] = (), split_cis: bool = False) -> list[str]:
        """The unconfirmed facts a layout of ``used`` profiles relies on (for warnings);
        ``split_cis``: the layout splits a GI into several compute instances."""
        rows = sorted({p.name: p.unconfirmed for p in used if p.unconfirmed}.items())
        ci = [self.ci_unconfirmed] if split_cis and self.ci_unconfirmed else []
        return list(self.unconfirmed) + [f"{name}: {note}" for name, note in rows] + ci


def media_conflict(profiles: Iterable[GiProfile]) -> str | None:
    """nvml.h on NVML_GPU_INSTANCE_PROFILE_*_SLICE_ALL_ME: "Allocation of instance of this profile
    prevents allocation of all but _NO_ME profiles."  The reverse (a +me.all GI refused while a GI
    holding a media engine exists) is derived: +me.all takes every engine (facts RTX PRO 6000)."""
    ps = list(profiles)
    hog = next((p for p in ps if p.media is Media.ME_ALL), None)
    if hog is None:
        return None
    other = next((p for p in ps if p is not hog and p.media is not Media.NO_ME), None)
    if other is None:
        return None
    return f"{hog.name} takes every media engine: only -me profiles may sit beside it, not {other.name} " \
           "(nvml.h, NVML_GPU_INSTANCE_PROFILE_*_SLICE_ALL_ME)"


@dataclass(frozen=True)
class Row:
    """One ``nvidia-smi mig -lgip`` row as a table writes it; geometry comes from the family."""

    name: str
    role: str
    profile_id: int
    instances: int
    memory_mib: int
    sm: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    unconfirmed: str = ""


def ci_profiles_for(gi_name: str, role: str, gi_slices: int, gi_sm: int, sm_per_slice: int,
                 rev2_ci_enum: int | None) -> tuple[CiProfile, ...]:
    out = []
    for ci_slices, count, starts in CI_LAYOUT[gi_slices]:
        full = ci_slices == gi_slices
        pid = CI_ENUM_BY_SLICES[ci_slices]
        if full and role == "1g.2m" and rev2_ci_enum is not None:
            pid = rev2_ci_enum
        out.append(CiProfile(profile_id=pid, slices=ci_slices, name=gi_name if full else f"{ci_slices}c.{gi_name}",
                             instance_count=count, sm=gi_sm if full else sm_per_slice * ci_slices, starts=starts,
                             default=full))
    return tuple(out)


def build_model(key: str, nvml_name: str, pci: int, arch: int, total_mib: int, sm_count: int,
                rows: Iterable[Row], family: Family = Family.SEVEN_SLICE, *, alt_names: tuple[str, ...] = (),
                unconfirmed: tuple[str, ...] = (), ci_unconfirmed: str = "", identity_unconfirmed: str = "",
                rev2_ci_enum: int | None = None) -> GpuModel:
    """A model from its rows; ``rev2_ci_enum``: the full CI of the double-memory 1g GI where it was
    observed not to be CI profile 0 (GH200: 1_SLICE_REV1, facts GH200-96GB [S23])."""
    rows = list(rows)
    geometry = _GEOMETRY[family]
    sm_per_slice = next(r.sm for r in rows if r.role == "1g")
    profiles = []
    for r in rows:
        size, starts = geometry[r.role]
        slices = int(r.role[0])
        profiles.append(GiProfile(
            name=r.name, role=r.role, nvml_enum=ROLE_ENUM[r.role], profile_id=r.profile_id, slices=slices,
            memory_slices=size, instance_count=r.instances, memory_mib=r.memory_mib, sm=r.sm, ce=r.ce, dec=r.dec,
            enc=r.enc, jpeg=r.jpeg, ofa=r.ofa, starts=starts, unconfirmed=r.unconfirmed,
            ci_profiles=ci_profiles_for(r.name, r.role, slices, r.sm, sm_per_slice, rev2_ci_enum)))
    mem, comp = _SIZE[family]
    return GpuModel(key=key, nvml_name=nvml_name, pci_device_id=pci, architecture=arch, total_memory_mib=total_mib,
                    sm_count=sm_count, memory_slices=mem, compute_slices=comp, profiles=tuple(profiles),
                    family=family, alt_names=alt_names, unconfirmed=unconfirmed, ci_unconfirmed=ci_unconfirmed,
                    identity_unconfirmed=identity_unconfirmed)
