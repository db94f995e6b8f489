"""A GPU model read from the driver, for a GPU migd's catalog does not know.

The live profile table is authoritative in production: nvml.h says the GPU-instance profile
info "is immutable throughout the lifetime of a MIG mode" and that possible placements are
returned "regardless of whether MIG is enabled".  From those two calls migd builds the same
typed model its catalog holds, so planning, apply and rollback work on a GPU released after
this version.  What NVML cannot tell without creating an instance (how a GI splits into
compute instances) is assumed as on every known model, and the model says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from migd.catalog.gpumodel import CI_LAYOUT, ROLE_ENUM, Family, GiProfile, GpuModel, Placement, ci_profiles_for

_ROLE_OF_ENUM = {v: k for k, v in ROLE_ENUM.items()}
_ATTR = {"+me": "+me", "+me.all": "+me.all", "-me": "-me", "+gfx": "+gfx"}


def profile_name(slices: int, memory_mib: int, total_mib: int, role: str) -> str:
    """The name NVIDIA's tooling gives a profile (go-nvlib mig_profile.go getMigMemorySizeGB [S6]):
    GB = round(ceil(memory/total x 8) / 8 x ceil(total in GiB)), then attributes from the role."""
    fraction = math.ceil(memory_mib / total_mib * 8) / 8
    gb = math.floor(fraction * math.ceil(total_mib / 1024) + 0.5)  # Go's math.Round: halves away from zero
    suffix = next((a for r, a in _ATTR.items() if role.endswith(r)), "")
    return f"{slices}g.{gb}gb{suffix}"


def live_model(name: str, pci_device_id: int, architecture: int, total_mib: int,
               table: Iterable[tuple[int, Any]], placements: Callable[[int], list[Placement]]) -> GpuModel | None:
    """A model from ``(enum, nvmlGpuInstanceProfileInfo_t)`` pairs and a placement query; None when
    the driver offers no table (MIG off on drivers that answer NOT_SUPPORTED then)."""
    profiles = []
    for enum, info in table:
        role = _ROLE_OF_ENUM.get(enum)
        slices = int(info.sliceCount)
        if role is None or slices not in CI_LAYOUT:
            continue  # a profile kind this version cannot name: never planned, never touched
        pls = sorted(placements(int(info.id)))
        if not pls:
            continue
        mem, sm = int(info.memorySizeMB), int(info.multiprocessorCount)
        gi_name = profile_name(slices, mem, total_mib, role)
        profiles.append(GiProfile(
            name=gi_name, role=role, nvml_enum=enum, profile_id=int(info.id), slices=slices,
            memory_slices=pls[0].size, instance_count=int(info.instanceCount), memory_mib=mem, sm=sm,
            ce=int(info.copyEngineCount), dec=int(info.decoderCount), enc=int(info.encoderCount),
            jpeg=int(info.jpegCount), ofa=int(info.ofaCount), starts=tuple(p.start for p in pls),
            ci_profiles=ci_profiles_for(gi_name, role, slices, sm, max(1, sm // slices), None)))
    if not profiles:
        return None
    return GpuModel(
        key=f"live-{pci_device_id:08X}", nvml_name=name, pci_device_id=pci_device_id, architecture=architecture,
        total_memory_mib=total_mib, sm_count=max(p.sm for p in profiles),
        memory_slices=max(s + p.memory_slices for p in profiles for s in p.starts),
        compute_slices=max(p.slices for p in profiles), profiles=tuple(profiles), family=Family.LIVE,
        unconfirmed=("not in migd's catalog: the profile table and placements were read from the driver",),
        ci_unconfirmed="compute-instance splits assumed as on the catalog's models (NVML shows them only "
                       "inside an existing GPU instance)")
