"""Static fault-isolation audit: the layout NVML reports must be one MIG can actually isolate.

Run after every apply and on every reconcile.  It does not trust the planner: it checks
what the driver says exists, so a hand-made instance, a firmware oddity or a bug in migd
itself shows up as a finding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from migd.catalog.models import GpuModel
from migd.hardware.inventory import Unreadable, read_all
from migd.hardware.ports import GpuReader, read_state
from migd.hardware.types import GpuInstance, GpuState
from migd.kinds import Word
from migd.plan.planner import GpuPlan, OpKind

# MIG-device memory differs from the profile's memorySizeMB by driver and placement: the MIG guide shows
# 3g.20gb (19968 MiB) as 20096 MiB at 0:4 and 20224 MiB at 4:4 (facts: A100-40GB notes), i.e. up to
# +256 MiB, which is 5% of a 1g.5gb.  Half the smallest profile step is still far from the next size.
MEMORY_TOLERANCE = 0.02
MEMORY_SLACK_MIB = 256


class Check(Word):
    OVERLAP = "overlap"
    PLACEMENT = "placement"
    CI_ORPHAN = "ci_orphan"
    CI_FIT = "ci_fit"
    CI_OVERLAP = "ci_overlap"
    DEVICE_MAP = "device_map"
    NO_CI = "no_ci"
    MEMORY = "memory"
    ORPHAN = "orphan"  # an instance the active profile does not want
    MISSING = "missing"  # an instance of the active profile that does not exist


class Severity(Word):
    ERROR = "error"  # fault isolation is not what MIG promises
    WARNING = "warning"


ERROR, WARNING = Severity.ERROR, Severity.WARNING
# Each check's severity, in one place (the metrics start every GPU's series at 0 with it).
SEVERITY = {Check.OVERLAP: ERROR, Check.PLACEMENT: ERROR, Check.CI_ORPHAN: ERROR, Check.CI_FIT: ERROR,
            Check.CI_OVERLAP: ERROR, Check.DEVICE_MAP: ERROR, Check.NO_CI: WARNING, Check.MEMORY: ERROR,
            Check.ORPHAN: WARNING, Check.MISSING: WARNING}


@dataclass(frozen=True)
class Finding:
    gpu: int
    check: Check
    severity: Severity
    message: str


Add = Callable[[Check, str], None]  # one finding on the GPU being audited


def audit_gpu(reading: GpuState, plan: GpuPlan | None = None, against: str = "the active profile") -> list[Finding]:
    """Findings on one reading of a GPU (``plan``: also what the active profile lacks or does not want)."""
    gpu = reading.gpu
    if not gpu.mig_current or gpu.model is None:
        return []
    i, model = gpu.index, gpu.model
    out: list[Finding] = []

    def add(check: Check, message: str) -> None:
        out.append(Finding(i, check, SEVERITY[check], f"GPU {i}: {message}"))

    _instances(reading.instances, model, add)
    _devices(reading, model, add)
    if plan is not None:
        for op in plan.ops:
            if op.kind is OpKind.DESTROY_GI:
                add(Check.ORPHAN, f"GI {op.gi_id} ({op.name}) at {op.placement} is not in {against}")
            elif op.kind is OpKind.CREATE_GI:
                add(Check.MISSING, f"{op.name} at {op.placement} from {against} does not exist")
    return out


def _instances(gis: tuple[GpuInstance, ...], model: GpuModel, add: Add) -> None:
    """GIs that share memory slices or sit off their profile's placements; CIs that do not fit."""
    for a_idx, a in enumerate(gis):
        for b in gis[a_idx + 1:]:
            if a.placement.overlaps(b.placement):
                add(Check.OVERLAP, f"GI {a.id} at {a.placement} and GI {b.id} at {b.placement} share memory "
                                   "slices: a fault in one can reach the other")
        prof = model.profile_by_id(a.profile_id)
        if prof is None or a.placement not in prof.placements:
            add(Check.PLACEMENT, f"GI {a.id} (profile id {a.profile_id}) sits at {a.placement}, not a legal "
                                 f"placement for {prof.name if prof else 'an unknown profile'} on {model.key}")
            continue
        if not a.compute_instances:
            add(Check.NO_CI, f"GI {a.id} ({prof.name}) has no compute instance: CUDA cannot use it")
        for c_idx, c in enumerate(a.compute_instances):
            if c.placement.end > prof.slices or prof.ci_by_id(c.profile_id) is None:
                add(Check.CI_FIT, f"CI {a.id}/{c.id} at {c.placement} does not fit GI {a.id} ({prof.name}, "
                                  f"{prof.slices} compute slices)")
            for other in a.compute_instances[c_idx + 1:]:
                if c.placement.overlaps(other.placement):
                    add(Check.CI_OVERLAP, f"CIs {a.id}/{c.id} and {a.id}/{other.id} share compute slices")


def _devices(reading: GpuState, model: GpuModel, add: Add) -> None:
    """Each CI has exactly one MIG device (one UUID for CUDA) with its profile's memory."""
    gis = reading.instances
    live = {(g.id, c.id) for g in gis for c in g.compute_instances}
    seen: dict[tuple[int, int], str] = {}
    uuids: dict[str, tuple[int, int]] = {}
    for d in reading.devices:
        key = (d.gi_id, d.ci_id)
        if key not in live:
            add(Check.CI_ORPHAN, f"MIG device {d.uuid} belongs to GI {d.gi_id}/CI {d.ci_id}, which does not exist")
        if key in seen:
            add(Check.DEVICE_MAP, f"GI {d.gi_id}/CI {d.ci_id} maps to two MIG devices ({seen[key]}, {d.uuid})")
        if d.uuid in uuids and uuids[d.uuid] != key:
            add(Check.DEVICE_MAP, f"MIG UUID {d.uuid} is shared by two instances")
        seen[key], uuids[d.uuid] = d.uuid, key
        gi = next((g for g in gis if g.id == d.gi_id), None)
        prof = model.profile_by_id(gi.profile_id) if gi else None
        if prof is not None:
            want = prof.memory_mib << 20
            if abs(d.memory_total_bytes - want) > MEMORY_TOLERANCE * want + (MEMORY_SLACK_MIB << 20):
                add(Check.MEMORY, f"MIG device {d.uuid} ({prof.name}) has {d.memory_total_bytes >> 20} MiB, the "
                                  f"profile says {prof.memory_mib} MiB")
    for key in sorted(live - set(seen)):
        add(Check.DEVICE_MAP, f"GI {key[0]}/CI {key[1]} has no MIG device (no UUID for CUDA)")


def audit_readings(readings: Iterable[GpuState], plans: dict[int, GpuPlan] | None = None,
                   against: str = "the active profile") -> list[Finding]:
    """``against``: what the plans were made for, as findings name it (migd: its active profile;
    ``migctl isolation --profile FILE``: that profile, which need not be active)."""
    out: list[Finding] = []
    for seen in readings:
        out += audit_gpu(seen, (plans or {}).get(seen.gpu.index), against)
    return out


def audit(backend: GpuReader, plans: dict[int, GpuPlan] | None = None,
          against: str = "the active profile") -> tuple[list[Finding], list[Unreadable]]:
    """Read every GPU now and audit it; the GPUs NVML cannot read (lost) are returned, not audited."""
    readings, unreadable = read_all(backend, lambda g: read_state(backend, g))
    return audit_readings(readings, plans, against), unreadable
