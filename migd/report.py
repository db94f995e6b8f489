"""migctl's documents (``-o json``/``yaml``) built from what migd read and decided: the wire types of
``migd.api`` (status, plan, assert, apply, doctor); their tables are in ``migd.ctl.text``.

Schemas (docs/migctl.md "Output formats"): fields are only ever added, never renamed or removed,
within a schema version.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

import yaml

from migd.api import plan as wp
from migd.api import status as ws
from migd.api.checks import DoctorDoc
from migd.apply.result import ApplyResult, Signalled
from migd.catalog.models import Placement
from migd.hardware.doctor import Finding, Verdict
from migd.hardware.inventory import Unreadable, read_all
from migd.hardware.ports import GpuReader
from migd.hardware.types import GpuInfo, GpuInstance, MigDevice, ProcessInfo
from migd.plan.planner import GpuPlan
from migd.wire import from_json, to_json


def _pl(p: Placement) -> ws.Placement:
    return ws.Placement(p.start, p.size)


def unreadable(items: Sequence[Unreadable]) -> tuple[ws.Unreadable, ...]:
    return tuple(ws.Unreadable(u.index, ws.Reading(u.state), u.error) for u in items)


def status_doc(backend: GpuReader, owners: dict[str, dict[int, str]],
               journal: dict[str, Any] | None = None) -> ws.StatusDoc:
    """``migd.status/v1``; ``journal``: what an unfinished apply left (``apply.journal.left_behind``);
    ``unreadable``: GPUs NVML cannot read (lost), each with its state and NVML's error."""
    def read(g: GpuInfo) -> ws.Gpu:
        if not g.mig_current:
            return gpu_doc(g, (), (), backend.gpu_processes(g.index), {})
        return gpu_doc(g, backend.list_gpu_instances(g.index), backend.list_mig_devices(g.index), (),
                       owners.get(g.uuid, {}))
    gpus, lost = read_all(backend, read)
    return ws.StatusDoc(tuple(gpus), journal_doc(journal), unreadable(lost))


def journal_doc(journal: dict[str, Any] | None) -> ws.JournalLeft | None:
    return None if journal is None else from_json(ws.JournalLeft, journal, "journal")


def gpu_doc(g: GpuInfo, gis: Sequence[GpuInstance], devices: Sequence[MigDevice], processes: Sequence[ProcessInfo],
            owners: dict[int, str]) -> ws.Gpu:
    """One GPU of ``migd.status/v1`` from what was read of it, by migctl now or by migd's sampler:
    its GPU instances and MIG devices (MIG on), or its processes (MIG off); ``owners`` by GI start."""
    devs = {(d.gi_id, d.ci_id): d for d in devices}
    instances = tuple(_instance_doc(g, gi, devs, owners) for gi in gis) if g.mig_current else ()
    procs = None if g.mig_current else tuple(ws.Process(p.pid, p.used_memory_bytes) for p in processes)
    # after_reset names what NVML calls the pending mode; pending is kept for v1 readers
    return ws.Gpu(g.index, g.uuid, g.name, g.model_key, g.pci_bus_id,
                  ws.MigMode(g.mig_current, g.mig_pending, g.mig_pending), instances, procs)


def _instance_doc(g: GpuInfo, gi: GpuInstance, devs: dict[tuple[int, int], MigDevice],
                  owners: dict[int, str]) -> ws.Instance:
    prof = g.model.profile_by_id(gi.profile_id) if g.model else None
    cis = []
    for c in gi.compute_instances:
        cp = prof.ci_by_id(c.profile_id) if prof else None
        d = devs.get((gi.id, c.id))
        cis.append(ws.ComputeInstance(
            c.id, cp.name if cp else str(c.profile_id), c.profile_id, _pl(c.placement), d.uuid if d else None,
            d.memory_total_bytes if d else None, d.memory_used_bytes if d else None,
            tuple(ws.Process(p.pid, p.used_memory_bytes) for p in (d.processes if d else ()))))
    return ws.Instance(gi.id, prof.name if prof else str(gi.profile_id), gi.profile_id, _pl(gi.placement),
                       owners.get(gi.placement.start), tuple(cis))


def _gpu_plan(p: GpuPlan, owners_only: Collection[int]) -> wp.GpuPlan:
    return wp.GpuPlan(
        p.gpu.index, p.gpu.uuid, p.gpu.model_key, p.changes, p.kept, p.desired.mig,
        tuple(wp.Operation(o.kind, o.describe(), tuple(o.busy_pids)) for o in p.ops),
        tuple(wp.Target(t.name, t.gi_profile_id, _pl(t.placement),
                        tuple(wp.ComputeTarget(pid, _pl(pl)) for pid, pl in t.ci), t.owner) for t in p.targets),
        True if p.gpu.index in owners_only else None)


def plan_doc(profile: str, plans: list[GpuPlan], lost: Sequence[Unreadable] = (),
             owners_only: Collection[int] = ()) -> wp.PlanDoc:
    """``migd.plan/v1``; ``unreadable``: GPUs the profile may select that NVML cannot read, left alone;
    ``owners_only``: GPUs whose instances stay and whose owners change."""
    return wp.PlanDoc(profile, tuple(_gpu_plan(p, owners_only) for p in plans), unreadable(lost))


def assert_doc(profile: str, plans: list[GpuPlan], unmatched: list[int],
               lost: Sequence[Unreadable] = (), owners_only: Collection[int] = ()) -> wp.AssertDoc:
    """``migd.assert/v1``: whether each GPU the profile selects is as it asks (``unmatched``: GPUs a
    mig-parted file's entries do not match, which its assert counts as not applied; ``unreadable``: GPUs
    the profile may select that NVML cannot read, so nothing can be said of them; ``owners_only``: GPUs
    whose instances are as asked and whose owners are not, so that a migd profile's assert passes exactly
    when its apply would change nothing; migctl gives none for a mig-parted file, asserted as mig-parted
    asserts, by its layout)."""
    gpus = tuple(wp.AssertGpu(p.gpu.index, p.gpu.uuid, p.gpu.model_key, not p.changes and p.gpu.index not in
                              owners_only, len(p.ops), True if p.gpu.index in owners_only else None) for p in plans)
    return wp.AssertDoc(profile, not unmatched and all(g.applied for g in gpus), gpus, tuple(unmatched),
                        unreadable(lost))


def apply_doc(result: ApplyResult, dry_run: bool) -> wp.ApplyDoc:
    return wp.ApplyDoc(
        result.profile, tuple(_gpu_plan(p, result.owners_only) for p in result.plans), unreadable(result.unreadable),
        dry_run,
        result.ok, round(result.seconds, 3),
        tuple(wp.GpuResult(r.index, r.uuid, r.status, r.ops, r.error, round(r.seconds, 3)) for r in result.results),
        signalled=signals(result.signalled))


def signals(sent: Sequence[Signalled]) -> tuple[wp.SignalSent, ...] | None:
    """What the busy policy force signalled (None: nothing, and the field is left out)."""
    return tuple(wp.SignalSent(s.pid, s.signal, round(s.at, 3), s.gpu) for s in sent) or None


def refused_doc(profile: str, plans: list[GpuPlan], lost: Sequence[Unreadable], dry_run: bool,
                why: str, owners_only: Collection[int] = ()) -> wp.ApplyDoc:
    """``migd.apply/v1`` of an apply refused before it touched a GPU (busy instances): the plan it refused,
    no results, and ``error`` saying why."""
    gpus = tuple(_gpu_plan(p, owners_only) for p in plans)
    return wp.ApplyDoc(profile, gpus, unreadable(lost), dry_run, False, 0.0, (), why)


def doctor_doc(findings: list[Finding]) -> DoctorDoc:
    """``migd.doctor/v1``: one finding per check; ``ok`` is false when any differs from the catalog."""
    return DoctorDoc(not any(f.verdict in (Verdict.MISMATCH, Verdict.ERROR) for f in findings), tuple(findings))


def dump(doc: object, fmt: str) -> str:
    """A document (a wire type, or JSON-ready data) as ``json`` or ``yaml``."""
    data = to_json(doc)
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False) + "\n"
    return str(yaml.safe_dump(data, sort_keys=False))
