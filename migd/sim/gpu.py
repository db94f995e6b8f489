"""A simulated GPU and the MIG rules the driver enforces on it.

Every rule raises :class:`NvmlFail` with the code NVIDIA documents for it; the C entry
points (:mod:`migd.sim.entry_instances`, ...) turn that into the function's return value.
Sources: nvml.h function documentation (go-nvml's copy), NVIDIA's MIG user guide as
summarised in mig-facts.yaml (``rules:``), and the catalog built from that file.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

import pynvml

from migd.catalog.models import MODELS, GiProfile, GpuModel, media_conflict

MiB = 1024 * 1024


class NvmlFail(Exception):
    """An NVML return code other than NVML_SUCCESS, raised inside the simulated driver."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class SimCi:
    id: int
    serial: int
    profile_id: int
    start: int
    size: int


@dataclass
class SimGi:
    id: int
    serial: int
    profile_id: int
    start: int
    size: int
    cis: list[SimCi] = field(default_factory=list)
    faulted: bool = False  # an Xid hit this instance; its MIG devices stop answering

    def ci_by_id(self, ci_id: int) -> SimCi:
        """nvml.h nvmlGpuInstanceGetComputeInstanceById: NOT_FOUND for an id the GI lacks."""
        ci = next((c for c in self.cis if c.id == ci_id), None)
        if ci is None:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
        return ci


@dataclass
class SimProcess:
    pid: int
    gi: int | None  # None on a GPU in non-MIG mode
    ci: int | None
    used_mib: int | None  # None: the driver reports NVML_VALUE_NOT_AVAILABLE
    real: bool = False  # a real OS process: dropped from NVML once it exits
    started: int | None = None  # a real one's start time: the driver's context dies with the process,
    # so a later process that reuses the PID is not on the GPU


# A GPU released after migd's catalog was written: the simulated driver knows it, the catalog does
# not, so migd must plan on the table the driver reports (hardware/livetable.py).  Its table is
# an H100 80GB's under a device id and name no catalog entry has.
UNLISTED = {"unlisted-7slice": replace(MODELS["H100-SXM5-80GB"], key="unlisted-7slice",
                                                   nvml_name="NVIDIA X100 (simulated, not in the catalog)",
                                                   pci_device_id=0x2F0010DE)}


def sim_model(key: str) -> GpuModel:
    """The profile table the simulated driver serves for a GPU of this kind."""
    return MODELS[key] if key in MODELS else UNLISTED[key]


def gi_id_for(total_memory_slices: int, start: int, size: int) -> int:
    """The GPU-instance id the driver hands out for a placement.

    Observed ids follow the memory-slice tree: the whole GPU is 0, halves 1-2, quarters 3-6,
    eighths 7-14 (A100 7x1g -> GI 7..13, 3g at 4:4 -> GI 2; RTX PRO 1g.24gb x4 -> 3..6;
    mig-facts ``rules.placement``, [S2,S13]).  NVIDIA documents ids only as "driver-assigned"
    and facts note outputs where the same placement had another id, so this is an
    approximation: what matters is that ids are not 1, 2, 3... and migd never assumes so."""
    per_level = total_memory_slices // size
    return per_level - 1 + start // size


@dataclass
class SimGpu:
    index: int
    model: str
    uuid: str
    bus_id: str
    mig_current: bool = False
    mig_pending: bool = False
    gis: list[SimGi] = field(default_factory=list)
    processes: list[SimProcess] = field(default_factory=list)
    lost: bool = False
    # The GPU's device minor (``/dev/nvidia<minor>``, ``gpu<minor>`` of its capabilities): the driver
    # numbers GPUs in the order it probes them, NVML in PCI bus order, so the two may differ
    # (nvmlDeviceGetMinorNumber; fleets.py FLEET_MINORS).  -1: the same as the index (older state files).
    minor: int = -1

    def __post_init__(self) -> None:
        if self.minor < 0:
            self.minor = self.index

    @property
    def catalog(self) -> GpuModel:
        return sim_model(self.model)

    # Plain loops over a handful of instances, not next(genexpr): these run on nearly every
    # simulated call, and a generator costs more than the search.
    def gi(self, gi_id: int) -> SimGi | None:
        for g in self.gis:
            if g.id == gi_id:
                return g
        return None

    def gi_by_id(self, gi_id: int) -> SimGi:
        """nvml.h nvmlDeviceGetGpuInstanceById: NOT_SUPPORTED with MIG off, NOT_FOUND for an unknown id."""
        self.require_mig()
        gi = self.gi(gi_id)
        if gi is None:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
        return gi

    def mig_device(self, index: int) -> tuple[SimGi, SimCi]:
        """The ``index``-th MIG device (nvmlDeviceGetMigDeviceHandleByIndex): NOT_FOUND past the end."""
        self.require_mig()
        devs = self.mig_devices()
        if not 0 <= index < len(devs):
            raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
        return devs[index]

    def gi_by_serial(self, serial: int) -> SimGi:
        for gi in self.gis:
            if gi.serial == serial:
                return gi
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # nvml.h: a destroyed (or reset) GI's handle is invalid

    def ci_by_serial(self, gi_serial: int, ci_serial: int) -> tuple[SimGi, SimCi]:
        gi = self.gi_by_serial(gi_serial)
        for ci in gi.cis:
            if ci.serial == ci_serial:
                return gi, ci
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def require_mig(self) -> None:
        """nvml.h: instance calls answer NOT_SUPPORTED "if device doesn't have MIG mode enabled"."""
        if not self.mig_current:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def profile(self, profile_id: int) -> GiProfile:
        p = self.catalog.profile_by_id(profile_id)
        if p is None:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return p

    # -- MIG mode -------------------------------------------------------------------------------
    def set_mig_mode(self, want: bool, held_by_others: bool, passthrough: bool) -> int:
        """Request a MIG mode; returns the activationStatus nvmlDeviceSetMigMode reports.

        nvml.h (nvmlDeviceSetMigMode): the driver "may unbind or reset the device to activate the
        requested mode"; "if device unbind fails because the device isn't idle, NVML_ERROR_IN_USE";
        "on pass-through virtualization, where reset functionality may not be exposed directly",
        NVML_ERROR_RESET_REQUIRED.  MIG guide [S2]: on Hopper+ no reset is needed at all; on
        Ampere the mode stays *pending* while another client holds the GPU.  Unclear in the docs:
        whether Hopper+ refuses while processes run; the simulator answers IN_USE then, too."""
        if self.gis and not want:
            # Instances must be destroyed first (mig-parted destroys all before disabling).
            raise NvmlFail(pynvml.NVML_ERROR_IN_USE)
        self.mig_pending = want
        if self.mig_current == want:
            return int(pynvml.NVML_SUCCESS)
        if self.catalog.mode_change_needs_reset and passthrough:
            return int(pynvml.NVML_ERROR_RESET_REQUIRED)
        if self.processes or (held_by_others and self.catalog.mode_change_needs_reset):
            return int(pynvml.NVML_ERROR_IN_USE)
        self.mig_current = want
        return int(pynvml.NVML_SUCCESS)

    def reset(self) -> None:
        """GPU reset: a pending MIG mode takes effect and every GI/CI is lost (facts rules.mig_mode)."""
        self.mig_current = self.mig_pending
        self.gis = []
        self.lost = False

    # -- GPU instances --------------------------------------------------------------------------
    def free_starts(self, p: GiProfile) -> list[int]:
        """Placements of ``p`` that overlap no existing GI (nvml.h: creation fails on overlap)."""
        used = [(g.start, g.start + g.size) for g in self.gis]
        return [st for st in p.starts if all(st + p.memory_slices <= a or b <= st for a, b in used)]

    def remaining_capacity(self, p: GiProfile) -> int:
        # A profile's own placements never overlap each other, so free starts == room left.
        if media_conflict([p, *(self.profile(g.profile_id) for g in self.gis)]) is not None:
            return 0
        left = p.instance_count - sum(1 for g in self.gis if g.profile_id == p.profile_id)
        return max(0, min(left, len(self.free_starts(p))))

    def create_gi(self, p: GiProfile, start: int, serial: int) -> SimGi:
        """nvml.h: INSUFFICIENT_RESOURCES "if the requested GPU instance could not be created"."""
        self.require_mig()
        if self.remaining_capacity(p) == 0 or start not in self.free_starts(p):
            raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if media_conflict([p, *(self.profile(g.profile_id) for g in self.gis)]) is not None:
            raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)  # nvml.h *_SLICE_ALL_ME (see media_conflict)
        gi = SimGi(id=gi_id_for(self.catalog.memory_slices, start, p.memory_slices), serial=serial,
                   profile_id=p.profile_id, start=start, size=p.memory_slices)
        self.gis.append(gi)
        self.gis.sort(key=lambda g: g.id)
        return gi

    def auto_start(self, p: GiProfile) -> int:
        """Driver-chosen placement for nvmlDeviceCreateGpuInstance: undocumented (facts
        rules.placement, unconfirmed); this follows the observed H100 order 6,4,5,0,1,...
        for 1-slice profiles and the highest free start otherwise.  migd never relies on it."""
        free = self.free_starts(p)
        if not free:
            raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return (6 if 6 in free else min(free)) if p.memory_slices == 1 else max(free)

    def destroy_gi(self, gi: SimGi) -> None:
        """nvml.h: IN_USE "if processes ... or compute instances are active on the GPU instance"."""
        if gi.cis or any(p.gi == gi.id for p in self.processes):
            raise NvmlFail(pynvml.NVML_ERROR_IN_USE)
        self.gis.remove(gi)

    # -- compute instances ----------------------------------------------------------------------
    def create_ci(self, gi: SimGi, profile_id: int, start: int | None, serial: int) -> SimCi:
        c = self.profile(gi.profile_id).ci_by_id(profile_id)
        if c is None:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if start is not None and start not in c.starts:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        used = [(x.start, x.start + x.size) for x in gi.cis]
        free = [st for st in c.starts if all(st + c.slices <= a or b <= st for a, b in used)]
        chosen = start if start is not None else (free[0] if free else None)
        count = sum(1 for x in gi.cis if x.profile_id == profile_id)
        if chosen is None or chosen not in free or count >= c.instance_count:
            raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ids = {x.id for x in gi.cis}  # CI ids start at 0 inside each GI (facts rules.placement)
        ci = SimCi(id=next(i for i in range(64) if i not in ids), serial=serial, profile_id=profile_id,
                   start=chosen, size=c.slices)
        gi.cis.append(ci)
        gi.cis.sort(key=lambda x: x.id)
        return ci

    def destroy_ci(self, gi: SimGi, ci: SimCi) -> None:
        """nvml.h: nvmlComputeInstanceDestroy answers IN_USE if processes are active on the CI."""
        if any(p.gi == gi.id and p.ci == ci.id for p in self.processes):
            raise NvmlFail(pynvml.NVML_ERROR_IN_USE)
        gi.cis.remove(ci)

    # -- MIG devices ----------------------------------------------------------------------------
    def mig_devices(self) -> list[tuple[SimGi, SimCi]]:
        return [(gi, ci) for gi in self.gis for ci in gi.cis]

    def mig_memory_mib(self, gi: SimGi) -> int:
        """What a MIG device reports as total memory: not the profile's memorySizeMB.

        MIG guide [S2] (facts A100-SXM4-40GB notes): two 3g.20gb GIs whose profile says 19968 MiB
        showed 20096 MiB (at 0:4) and 20224 MiB (at 4:4).  The exact rule is undocumented; the
        simulator adds 128 MiB, and another 128 MiB for a GI that holds the last memory slice."""
        extra = 128 * (1 + int(gi.start + gi.size == self.catalog.memory_slices))
        return self.profile(gi.profile_id).memory_mib + extra

    def mig_uuid(self, gi: SimGi, ci: SimCi) -> str:
        return mig_uuid(self.uuid, gi.serial, ci.serial)

    def check_answers(self, gi: SimGi) -> None:
        if gi.faulted:  # an Xid broke this instance: its MIG devices stop answering
            raise NvmlFail(pynvml.NVML_ERROR_UNKNOWN)


def mig_uuid(gpu_uuid: str, gi_serial: int, ci_serial: int) -> str:
    """A MIG device's UUID: new for every created instance, like the driver's."""
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{gpu_uuid}/{gi_serial}/{ci_serial}"))
