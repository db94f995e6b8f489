"""Offline catalog of MIG-capable GPU models and their instance profiles.

Every number here is transcribed from ``shared/reference/mig-facts.yaml`` (section and
source keys are cited per model).  In production migd reads the live profile table
from NVML; this catalog serves offline validation (``migctl validate``/``plan`` with no
GPU), the planner's placement tables and the simulator.  ``tests/test_catalog.py``
checks every entry against the facts file so a typo cannot hide here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# NVML_GPU_INSTANCE_PROFILE_* enum values (facts: nvml.gpu_instance_profile_enum [S5]).
GI_ENUM_1_SLICE = 0x0
GI_ENUM_2_SLICE = 0x1
GI_ENUM_3_SLICE = 0x2
GI_ENUM_4_SLICE = 0x3
GI_ENUM_7_SLICE = 0x4
GI_ENUM_1_SLICE_REV1 = 0x7  # "+me"
GI_ENUM_2_SLICE_REV1 = 0x8  # A30 2g+me
GI_ENUM_1_SLICE_REV2 = 0x9  # double-memory 1g
GI_ENUM_COUNT = 0x12

# NVML_COMPUTE_INSTANCE_PROFILE_* enum == CI profile id (facts: nvml.compute_instance_profile_id).
CI_ENUM_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}
CI_ENUM_COUNT = 0x9

ARCH_AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE
ARCH_HOPPER = 9  # NVML_DEVICE_ARCH_HOPPER


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

    @property
    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(s, self.slices) for s in self.starts)


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile of one GPU model (one row of ``nvidia-smi mig -lgip``)."""

    name: str  # e.g. "1g.10gb", "1g.5gb+me"
    role: str  # model-independent short form: 1g, 1g+me, 1g.2m, 2g, 2g+me, 3g, 4g, 7g
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

    @property
    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(s, self.memory_slices) for s in self.starts)

    def ci_by_id(self, profile_id: int) -> CiProfile | None:
        return next((c for c in self.ci_profiles if c.profile_id == profile_id), None)

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
    family: str  # "seven_slice" or "a30": picks the valid-combination rules

    @property
    def is_hopper_or_newer(self) -> bool:
        return self.architecture >= ARCH_HOPPER

    @property
    def mode_change_needs_reset(self) -> bool:
        """Ampere keeps a MIG mode change pending until a GPU reset; Hopper+ applies it at once."""
        return self.architecture < ARCH_HOPPER

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def profile_by_enum(self, nvml_enum: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.nvml_enum == nvml_enum), None)

    def profile_by_name(self, name: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def profile_by_role(self, role: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.role == role), None)


# CI structure per GI compute-slice count: (ci slices, instance count, starts).
# facts: gpus.A100-SXM4-40GB.compute_instance_profiles and its notes (go-nvml mock placements,
# unconfirmed); the same structure is assumed for H100/H200 (facts: H100 structure_unconfirmed).
_CI_LAYOUT: dict[int, tuple[tuple[int, int, tuple[int, ...]], ...]] = {
    1: ((1, 1, (0,)),),
    2: ((1, 2, (0, 1)), (2, 1, (0,))),
    3: ((1, 3, (0, 1, 2)), (2, 1, (0,)), (3, 1, (0,))),
    4: ((1, 4, (0, 1, 2, 3)), (2, 2, (0, 2)), (4, 1, (0,))),
    7: ((1, 7, tuple(range(7))), (2, 3, (0, 2, 4)), (3, 2, (0, 4)), (4, 1, (0,)), (7, 1, (0,))),
}


def _ci_profiles(gi_name: str, gi_slices: int, gi_sm: int, sm_per_slice: int) -> tuple[CiProfile, ...]:
    out = []
    for ci_slices, count, starts in _CI_LAYOUT[gi_slices]:
        full = ci_slices == gi_slices
        out.append(
            CiProfile(
                profile_id=CI_ENUM_BY_SLICES[ci_slices],
                slices=ci_slices,
                name=gi_name if full else f"{ci_slices}c.{gi_name}",
                instance_count=count,
                sm=gi_sm if full else sm_per_slice * ci_slices,
                starts=starts,
                default=full,
            )
        )
    return tuple(out)


# Row: name, role, enum, profile_id, slices, memory_slices, instances, memory MiB, SM, CE, DEC, ENC, JPEG, OFA
_Row = tuple[str, str, int, int, int, int, int, int, int, int, int, int, int, int]

# Placement starts by role (facts: placement_tables.seven_slice_8_memory_slices / a30_4_memory_slices).
_STARTS_7 = {"1g": (0, 1, 2, 3, 4, 5, 6), "1g+me": (0, 1, 2, 3, 4, 5, 6), "1g.2m": (0, 2, 4, 6),
             "2g": (0, 2, 4), "3g": (0, 4), "4g": (0,), "7g": (0,)}
_STARTS_A30 = {"1g": (0, 1, 2, 3), "1g+me": (0, 1, 2, 3), "2g": (0, 2), "2g+me": (0, 2), "4g": (0,)}


def _model(key: str, nvml_name: str, pci: int, arch: int, total_mib: int, sm_count: int,
           rows: Iterable[_Row], family: str = "seven_slice") -> GpuModel:
    starts = _STARTS_7 if family == "seven_slice" else _STARTS_A30
    rows = list(rows)
    sm_per_slice = next(r[8] for r in rows if r[1] == "1g")
    profiles = tuple(
        GiProfile(name=r[0], role=r[1], nvml_enum=r[2], profile_id=r[3], slices=r[4], memory_slices=r[5],
                  instance_count=r[6], memory_mib=r[7], sm=r[8], ce=r[9], dec=r[10], enc=r[11], jpeg=r[12],
                  ofa=r[13], starts=starts[r[1]], ci_profiles=_ci_profiles(r[0], r[4], r[8], sm_per_slice))
        for r in rows
    )
    mem_slices = 8 if family == "seven_slice" else 4
    compute_slices = 7 if family == "seven_slice" else 4
    return GpuModel(key=key, nvml_name=nvml_name, pci_device_id=pci, architecture=arch,
                    total_memory_mib=total_mib, sm_count=sm_count, memory_slices=mem_slices,
                    compute_slices=compute_slices, profiles=profiles, family=family)


E1, E2, E3, E4, E7 = GI_ENUM_1_SLICE, GI_ENUM_2_SLICE, GI_ENUM_3_SLICE, GI_ENUM_4_SLICE, GI_ENUM_7_SLICE
E1ME, E2ME, E1M2 = GI_ENUM_1_SLICE_REV1, GI_ENUM_2_SLICE_REV1, GI_ENUM_1_SLICE_REV2

# facts: gpus.A100-SXM4-40GB (lgip [S2,S13]; memory: first listed value, driver dependent)
_A100_40_ROWS: list[_Row] = [
    ("1g.5gb", "1g", E1, 19, 1, 1, 7, 4864, 14, 1, 0, 0, 0, 0),
    ("1g.5gb+me", "1g+me", E1ME, 20, 1, 1, 1, 4864, 14, 1, 1, 0, 1, 1),
    ("1g.10gb", "1g.2m", E1M2, 15, 1, 2, 4, 9856, 14, 1, 1, 0, 0, 0),
    ("2g.10gb", "2g", E2, 14, 2, 2, 3, 9856, 28, 2, 1, 0, 0, 0),
    ("3g.20gb", "3g", E3, 9, 3, 4, 2, 19968, 42, 3, 2, 0, 0, 0),
    ("4g.20gb", "4g", E4, 5, 4, 4, 1, 19968, 56, 4, 2, 0, 0, 0),
    ("7g.40gb", "7g", E7, 0, 7, 8, 1, 40192, 98, 7, 5, 0, 1, 1),
]
# facts: gpus.A100-SXM4-80GB (lgip driver 550.54.14 [S13]); A100 80GB PCIe is identical.
_A100_80_ROWS: list[_Row] = [
    ("1g.10gb", "1g", E1, 19, 1, 1, 7, 9728, 14, 1, 0, 0, 0, 0),
    ("1g.10gb+me", "1g+me", E1ME, 20, 1, 1, 1, 9728, 14, 1, 1, 0, 1, 1),
    ("1g.20gb", "1g.2m", E1M2, 15, 1, 2, 4, 19968, 14, 1, 1, 0, 0, 0),
    ("2g.20gb", "2g", E2, 14, 2, 2, 3, 19968, 28, 2, 1, 0, 0, 0),
    ("3g.40gb", "3g", E3, 9, 3, 4, 2, 40192, 42, 3, 2, 0, 0, 0),
    ("4g.40gb", "4g", E4, 5, 4, 4, 1, 40192, 56, 4, 2, 0, 0, 0),
    ("7g.80gb", "7g", E7, 0, 7, 8, 1, 80640, 98, 7, 5, 0, 1, 1),
]
# facts: gpus.A30-24GB (lgip/lgipp [S13])
_A30_ROWS: list[_Row] = [
    ("1g.6gb", "1g", E1, 14, 1, 1, 4, 5952, 14, 1, 1, 0, 0, 0),
    ("1g.6gb+me", "1g+me", E1ME, 21, 1, 1, 1, 5952, 14, 1, 1, 0, 1, 1),
    ("2g.12gb", "2g", E2, 5, 2, 2, 2, 11968, 28, 2, 2, 0, 0, 0),
    ("2g.12gb+me", "2g+me", E2ME, 6, 2, 2, 1, 11968, 28, 2, 2, 0, 1, 1),
    ("4g.24gb", "4g", E4, 0, 4, 4, 1, 24000, 56, 4, 4, 0, 1, 1),
]
# facts: gpus.H100-SXM5-80GB (lgip+lgipp [S13]); the PCIe part uses the same table [S1].
_H100_80_ROWS: list[_Row] = [
    ("1g.10gb", "1g", E1, 19, 1, 1, 7, 9984, 16, 1, 1, 0, 1, 0),
    ("1g.10gb+me", "1g+me", E1ME, 20, 1, 1, 1, 9984, 16, 1, 1, 0, 1, 1),
    ("1g.20gb", "1g.2m", E1M2, 15, 1, 2, 4, 20096, 26, 1, 1, 0, 1, 0),
    ("2g.20gb", "2g", E2, 14, 2, 2, 3, 20096, 32, 2, 2, 0, 2, 0),
    ("3g.40gb", "3g", E3, 9, 3, 4, 2, 40448, 60, 3, 3, 0, 3, 0),
    ("4g.40gb", "4g", E4, 5, 4, 4, 1, 40448, 64, 4, 4, 0, 4, 0),
    ("7g.80gb", "7g", E7, 0, 7, 8, 1, 81152, 132, 8, 7, 0, 7, 1),
]
# facts: gpus.H100-NVL-94GB (lgip + lgipp driver 560.35.03 [S13])
_H100_NVL_ROWS: list[_Row] = [
    ("1g.12gb", "1g", E1, 19, 1, 1, 7, 11008, 16, 1, 1, 0, 1, 0),
    ("1g.12gb+me", "1g+me", E1ME, 20, 1, 1, 1, 11008, 16, 1, 1, 0, 1, 1),
    ("1g.24gb", "1g.2m", E1M2, 15, 1, 2, 4, 22144, 26, 1, 1, 0, 1, 0),
    ("2g.24gb", "2g", E2, 14, 2, 2, 3, 22144, 32, 2, 2, 0, 2, 0),
    ("3g.47gb", "3g", E3, 9, 3, 4, 2, 47488, 60, 3, 3, 0, 3, 0),
    ("4g.47gb", "4g", E4, 5, 4, 4, 1, 47488, 64, 4, 4, 0, 4, 0),
    ("7g.94gb", "7g", E7, 0, 7, 8, 1, 95360, 132, 8, 7, 0, 7, 1),
]
# facts: gpus.H200-141GB (lgip from mig-parted#120 [S12]; placements assumed = 7-slice table)
_H200_ROWS: list[_Row] = [
    ("1g.18gb", "1g", E1, 19, 1, 1, 7, 16384, 16, 1, 1, 0, 1, 0),
    ("1g.18gb+me", "1g+me", E1ME, 20, 1, 1, 1, 16384, 16, 1, 1, 0, 1, 1),
    ("1g.35gb", "1g.2m", E1M2, 15, 1, 2, 4, 33024, 26, 1, 1, 0, 1, 0),
    ("2g.35gb", "2g", E2, 14, 2, 2, 3, 33024, 32, 2, 2, 0, 2, 0),
    ("3g.71gb", "3g", E3, 9, 3, 4, 2, 71168, 60, 3, 3, 0, 3, 0),
    ("4g.71gb", "4g", E4, 5, 4, 4, 1, 71168, 64, 4, 4, 0, 4, 0),
    ("7g.141gb", "7g", E7, 0, 7, 8, 1, 143104, 132, 8, 7, 0, 7, 1),
]

MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        # total memory / SM counts: facts gpus.<model>.total_memory_mib / sm_count_full_gpu
        _model("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 0x20B010DE, ARCH_AMPERE, 40960, 108, _A100_40_ROWS),
        _model("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 0x20F110DE, ARCH_AMPERE, 40960, 108, _A100_40_ROWS),
        _model("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 0x20B210DE, ARCH_AMPERE, 81920, 108, _A100_80_ROWS),
        _model("A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", 0x20B510DE, ARCH_AMPERE, 81920, 108, _A100_80_ROWS),
        _model("A30-24GB", "NVIDIA A30", 0x20B710DE, ARCH_AMPERE, 24576, 56, _A30_ROWS, family="a30"),
        _model("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 0x233010DE, ARCH_HOPPER, 81559, 132, _H100_80_ROWS),
        # H100 PCIe: SM counts of its MIG profiles were not observed (facts: unconfirmed); SXM values used.
        _model("H100-PCIe-80GB", "NVIDIA H100 PCIe", 0x233110DE, ARCH_HOPPER, 81559, 114, _H100_80_ROWS),
        _model("H100-NVL-94GB", "NVIDIA H100 NVL", 0x232110DE, ARCH_HOPPER, 95830, 132, _H100_NVL_ROWS),
        # H200 total memory is not in the facts file; 143771 MiB is what nvidia-smi showed on an H200.
        _model("H200-141GB", "NVIDIA H200", 0x233510DE, ARCH_HOPPER, 143771, 132, _H200_ROWS),
    )
}

_BY_PCI = {m.pci_device_id: m for m in MODELS.values()}
_BY_NAME = {m.nvml_name: m for m in MODELS.values()}


def model_for(name: str | None = None, pci_device_id: int | None = None) -> GpuModel | None:
    """Find a model by PCI device id (preferred: names vary by driver) or NVML name."""
    if pci_device_id is not None and pci_device_id in _BY_PCI:
        return _BY_PCI[pci_device_id]
    if name is not None:
        # Older drivers print names without the "NVIDIA " prefix (facts: A100-SXM4-40GB nvml_name).
        return _BY_NAME.get(name) or _BY_NAME.get(f"NVIDIA {name}")
    return None
