"""Stable, documented shapes of migctl's output (``-o json``/``yaml``); their tables are in ``migd.report_text``.

Schemas (docs/migctl.md "Output formats"): ``migd.status/v1``, ``migd.plan/v1``, ``migd.apply/v1``.
Fields are only ever added, never renamed or removed, within a schema version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from migd.apply.result import ApplyResult
from migd.doctor import Finding, Verdict
from migd.hardware.inventory import Unreadable, read_all
from migd.hardware.ports import GpuReader
from migd.hardware.types import GpuInfo, GpuInstance
from migd.plan.planner import GpuPlan


def _pl(p: Any) -> dict[str, int]:
    return {"start": p.start, "size": p.size}


def status_doc(backend: GpuReader, owners: dict[str, dict[int, str]],
               journal: dict[str, Any] | None = None) -> dict[str, Any]:
    """``migd.status/v1``; ``journal``: what an unfinished apply left (``apply.journal.left_behind``);
    ``unreadable``: GPUs NVML cannot read (lost), each with its state and NVML's error."""
    gpus, unreadable = read_all(backend, lambda g: _gpu_doc(backend, g, owners))
    return {"schema": "migd.status/v1", "gpus": gpus, "journal": journal,
            "unreadable": [u.to_json() for u in unreadable]}


def _gpu_doc(backend: GpuReader, g: GpuInfo, owners: dict[str, dict[int, str]]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "index": g.index, "uuid": g.uuid, "name": g.name, "model": g.model_key, "pci_bus_id": g.pci_bus_id,
        # after_reset names what NVML calls the pending mode; pending is kept for v1 readers
        "mig": {"current": g.mig_current, "pending": g.mig_pending, "after_reset": g.mig_pending},
        "instances": []}
    if g.mig_current:
        devs = {(d.gi_id, d.ci_id): d for d in backend.list_mig_devices(g.index)}
        for gi in backend.list_gpu_instances(g.index):
            entry["instances"].append(_instance_doc(g, gi, devs, owners.get(g.uuid, {})))
    else:
        entry["processes"] = [{"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
                              for p in backend.gpu_processes(g.index)]
    return entry


def _instance_doc(g: GpuInfo, gi: GpuInstance, devs: dict[tuple[int, int], Any], owners: dict[int, str]) -> \
        dict[str, Any]:
    prof = g.model.profile_by_id(gi.profile_id) if g.model else None
    cis = []
    for c in gi.compute_instances:
        cp = prof.ci_by_id(c.profile_id) if prof else None
        d = devs.get((gi.id, c.id))
        cis.append({"ci_id": c.id, "profile": cp.name if cp else str(c.profile_id), "profile_id": c.profile_id,
                    "placement": _pl(c.placement), "mig_uuid": d.uuid if d else None,
                    "memory_total_bytes": d.memory_total_bytes if d else None,
                    "memory_used_bytes": d.memory_used_bytes if d else None,
                    "processes": [{"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
                                  for p in (d.processes if d else ())]})
    return {"gi_id": gi.id, "profile": prof.name if prof else str(gi.profile_id), "profile_id": gi.profile_id,
            "placement": _pl(gi.placement), "owner": owners.get(gi.placement.start), "compute_instances": cis}


def plan_doc(profile: str, plans: list[GpuPlan], unreadable: Sequence[Unreadable] = ()) -> dict[str, Any]:
    """``migd.plan/v1``; ``unreadable``: GPUs the profile may select that NVML cannot read, left alone."""
    doc = {"schema": "migd.plan/v1", "profile": profile, "gpus": [{
        "index": p.gpu.index, "uuid": p.gpu.uuid, "model": p.gpu.model_key, "changes": p.changes, "kept": p.kept,
        "mig": p.desired.mig,
        "operations": [{"kind": o.kind.value, "description": o.describe(), "busy_pids": list(o.busy_pids)}
                       for o in p.ops],
        "target": [{"profile": t.name, "profile_id": t.gi_profile_id, "placement": _pl(t.placement),
                    "compute": [{"profile_id": pid, "placement": _pl(pl)} for pid, pl in t.ci],
                    "owner": t.owner} for t in p.targets]} for p in plans]}
    doc["unreadable"] = [u.to_json() for u in unreadable]
    return doc


def assert_doc(profile: str, plans: list[GpuPlan], unmatched: list[int],
               unreadable: Sequence[Unreadable] = ()) -> dict[str, Any]:
    """``migd.assert/v1``: whether each GPU the profile selects is as it asks (``unmatched``: GPUs a
    mig-parted file's entries do not match, which its assert counts as not applied; ``unreadable``:
    GPUs the profile may select that NVML cannot read, so nothing can be said of them)."""
    gpus = [{"index": p.gpu.index, "uuid": p.gpu.uuid, "model": p.gpu.model_key, "applied": not p.changes,
             "operations": len(p.ops)} for p in plans]
    return {"schema": "migd.assert/v1", "profile": profile, "ok": not unmatched and all(g["applied"] for g in gpus),
            "gpus": gpus, "unmatched": unmatched, "unreadable": [u.to_json() for u in unreadable]}


def apply_doc(result: ApplyResult, dry_run: bool) -> dict[str, Any]:
    doc = plan_doc(result.profile, result.plans, result.unreadable)
    doc["schema"] = "migd.apply/v1"
    doc["dry_run"] = dry_run
    doc["ok"] = result.ok
    doc["seconds"] = round(result.seconds, 3)
    doc["results"] = [{"index": r.index, "uuid": r.uuid, "status": r.status.value, "operations": r.ops,
                       "error": r.error, "seconds": round(r.seconds, 3)} for r in result.results]
    return doc


def dump(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2, sort_keys=False) + "\n"
    return str(yaml.safe_dump(doc, sort_keys=False))


def doctor_doc(findings: list[Finding]) -> dict[str, Any]:
    """``migd.doctor/v1``: one finding per check; ``ok`` is false when any differs from the catalog."""
    return {"schema": "migd.doctor/v1",
            "ok": not any(f.verdict in (Verdict.MISMATCH, Verdict.ERROR) for f in findings),
            "findings": [{"gpu": f.gpu, "check": f.check, "verdict": f.verdict.value, "detail": f.detail}
                         for f in findings]}
