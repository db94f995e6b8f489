"""Stable, documented shapes of migctl's output (``-o json``/``yaml``) and their tables.

Schemas (README "Output formats"): ``migd.status/v1``, ``migd.plan/v1``, ``migd.apply/v1``.
Fields are only ever added, never renamed or removed, within a schema version.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import yaml

from migd.apply.result import ApplyResult
from migd.doctor import Finding, Verdict
from migd.hardware.backend import GpuBackend, GpuInfo, GpuInstance
from migd.planner import GpuPlan


def _pl(p: Any) -> dict[str, int]:
    return {"start": p.start, "size": p.size}


def status_doc(backend: GpuBackend, owners: dict[str, dict[int, str]]) -> dict[str, Any]:
    gpus = []
    for g in backend.list_gpus():
        entry: dict[str, Any] = {
            "index": g.index, "uuid": g.uuid, "name": g.name, "model": g.model_key, "pci_bus_id": g.pci_bus_id,
            "mig": {"current": g.mig_current, "pending": g.mig_pending}, "instances": []}
        if g.mig_current:
            devs = {(d.gi_id, d.ci_id): d for d in backend.list_mig_devices(g.index)}
            for gi in backend.list_gpu_instances(g.index):
                entry["instances"].append(_instance_doc(g, gi, devs, owners.get(g.uuid, {})))
        else:
            entry["processes"] = [{"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
                                  for p in backend.gpu_processes(g.index)]
        gpus.append(entry)
    return {"schema": "migd.status/v1", "gpus": gpus}


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


def plan_doc(profile: str, plans: list[GpuPlan]) -> dict[str, Any]:
    return {"schema": "migd.plan/v1", "profile": profile, "gpus": [{
        "index": p.gpu.index, "uuid": p.gpu.uuid, "model": p.gpu.model_key, "changes": p.changes, "kept": p.kept,
        "mig": p.desired.mig,
        "operations": [{"kind": o.kind.value, "description": o.describe(), "busy_pids": list(o.busy_pids)}
                       for o in p.ops],
        "target": [{"profile": t.name, "profile_id": t.gi_profile_id, "placement": _pl(t.placement),
                    "compute": [{"profile_id": pid, "placement": _pl(pl)} for pid, pl in t.ci],
                    "owner": t.owner} for t in p.targets]} for p in plans]}


def apply_doc(result: ApplyResult, dry_run: bool) -> dict[str, Any]:
    doc = plan_doc(result.profile, result.plans)
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


def status_table(doc: dict[str, Any]) -> str:
    lines = []
    for g in doc["gpus"]:
        mode = "enabled" if g["mig"]["current"] else "disabled"
        if g["mig"]["pending"] != g["mig"]["current"]:
            mode += f" (pending {'enabled' if g['mig']['pending'] else 'disabled'}: reset needed)"
        lines.append(f"GPU {g['index']}  {g['model']}  {g['pci_bus_id']}  MIG {mode}")
        for gi in g["instances"]:
            for ci in gi["compute_instances"] or [None]:
                owner = gi["owner"] or "-"
                if ci is None:
                    lines.append(f"  GI {gi['gi_id']:>2} {gi['profile']:<12} @{gi['placement']['start']}:"
                                 f"{gi['placement']['size']}  owner {owner}  (no compute instance)")
                    continue
                mem = f"{(ci['memory_used_bytes'] or 0) >> 20}/{(ci['memory_total_bytes'] or 0) >> 20} MiB"
                pids = ",".join(str(p["pid"]) for p in ci["processes"]) or "-"
                lines.append(f"  GI {gi['gi_id']:>2} CI {ci['ci_id']} {ci['profile']:<14} @{gi['placement']['start']}:"
                             f"{gi['placement']['size']}  owner {owner:<12} {ci['mig_uuid']}  {mem}  pids {pids}")
    return "\n".join(lines) + "\n"


def plan_table(doc: dict[str, Any]) -> str:
    """The operations of a ``migd.plan/v1`` (or ``migd.apply/v1``) document, one GPU at a time."""
    lines = []
    for g in doc["gpus"]:
        want = Counter(t["profile"] for t in g["target"])
        layout = " + ".join(f"{n}x{k}" if n > 1 else k for k, n in want.items()) if g["mig"] else "MIG disabled"
        head = f"GPU {g['index']} ({g['model']}): {layout or 'MIG enabled, no instances'}"
        if not g["changes"]:
            lines.append(f"{head}: already applied")
            continue
        lines.append(f"{head}: {len(g['operations'])} operation(s), {g['kept']} instance(s) kept")
        lines += [f"  {o['description']}" for o in g["operations"]]
    return "\n".join(lines) + "\n"


def apply_table(doc: dict[str, Any], by: str | None = None) -> str:
    """An apply's outcome from its ``migd.apply/v1`` document, whichever process did it (``by``)."""
    lines = plan_table(doc)
    for r in doc["results"]:
        if r["status"] in ("rolled_back", "failed"):
            lines += f"GPU {r['index']}: {r['status'].upper().replace('_', ' ')}: {r['error']}\n"
    if doc["dry_run"]:
        outcome = "dry run, nothing changed"
    else:
        outcome = f"{'applied' if doc['ok'] else 'NOT applied'} in {doc['seconds']:.2f}s"
    return lines + f"{doc['profile']}: {outcome}" + (f" (by {by})" if by else "") + "\n"


def daemon_table(doc: dict[str, Any]) -> str:
    """``migctl daemon``: which profile holds and why, what comes next, what is in the way."""
    def when(epoch: float | None) -> str:
        return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if epoch else "-"
    lines = [f"migd running since {when(doc['started'])} (config {doc['config_path']}, timezone {doc['timezone']})"]
    active = doc["active"]
    if active is None:
        lines.append("active profile: none yet (no schedule entry has fired)")
    elif active["reason"] == "manual":
        until = active["until"] or "no further scheduled transition"
        lines.append(f"active profile: {active['profile']} (manual apply of {active['source']}, until {until})")
    else:
        lines.append(f"active profile: {active['profile']} (schedule)")
    drift = ", ".join(map(str, doc["drift_gpus"])) or "none"
    lines.append(f"applied profile: {doc['applied_profile'] or '-'}; GPUs drifted: {drift}")
    nxt = doc["next"]
    lines.append(f"next transition: {nxt['profile']} at {nxt['local']} ({nxt['at']})" if nxt else
                 "next transition: none")
    states = Counter(g["state"] for g in doc["gpus"].values())
    lines.append("GPUs: " + (", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none planned"))
    for i, g in doc["gpus"].items():
        if g["state"] != "converged":
            why = f": {g['reason']}" if g["reason"] else ""
            lines.append(f"  GPU {i}: {g['state']} since {when(g['since'])}{why}")
    last = doc["last_apply"]
    if last:
        lines.append(f"last apply: {last['profile']}: {last['result']} in {last['seconds']}s at {when(last['time'])}")
    for uuid, why in doc["unhealthy"].items():
        lines.append(f"unhealthy: {uuid}: {why}")
    if doc["last_reload_error"]:
        lines.append(f"last reload rejected: {doc['last_reload_error']}")
    if doc.get("restart_needed"):
        lines.append(f"restart needed: {', '.join(doc['restart_needed'])} changed since start")
    sl = doc.get("slurm")
    if sl:
        sync = {True: "in sync", False: "NOT in sync", None: "not checked yet"}[sl.get("gres_in_sync")]
        res = f"; reserved ({sl['reservation']})" if sl.get("reservation") else ""
        lines.append(f"slurm node {sl['node']}: {sl['phase']} since {when(sl.get('since'))}; GRES {sync}{res}"
                     + (f": {sl['reason']}" if sl.get("reason") else ""))
    return "\n".join(lines) + "\n"


def doctor_doc(findings: list[Finding]) -> dict[str, Any]:
    """``migd.doctor/v1``: one finding per check; ``ok`` is false when any differs from the catalog."""
    return {"schema": "migd.doctor/v1",
            "ok": not any(f.verdict in (Verdict.MISMATCH, Verdict.ERROR) for f in findings),
            "findings": [{"gpu": f.gpu, "check": f.check, "verdict": f.verdict.value, "detail": f.detail}
                         for f in findings]}


def doctor_table(doc: dict[str, Any]) -> str:
    lines = []
    for f in doc["findings"]:
        where = "node " if f["gpu"] is None else f"GPU {f['gpu']}"
        lines.append(f"{where:<6} {f['check']:<14} {f['verdict']:<8} {f['detail']}")
    mismatches = sum(1 for f in doc["findings"] if f["verdict"] in ("mismatch", "error"))
    lines.append("no differences from the catalog" if not mismatches else f"{mismatches} difference(s) found")
    return "\n".join(lines) + "\n"
