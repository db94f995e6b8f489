"""migctl's tables: the text rendering of each documented document (``migd.report``), in one place.

Each table leads with a one-line summary, shows problems first and groups GPUs that read the same
(``GPU 0-7 (A100-SXM4-80GB): ...``); ``verbose`` lists every GPU and every operation or check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

from migd.doctor import UNREADABLE_CHECK
from migd.profiles.model import index_ranges

RESUME_HINT = "`migctl resume` returns to the schedule now"


def grouped(items: Iterable[tuple[int, str]]) -> list[str]:
    """``(gpu index, text)`` pairs as ``GPU 0-3,5 text`` lines, one per distinct text, in first-seen order."""
    by_text: dict[str, list[int]] = {}
    for index, text in items:
        by_text.setdefault(text, []).append(index)
    return [f"GPU {index_ranges(ix)} {text}" for text, ix in by_text.items()]


def _journal_line(j: dict[str, Any]) -> str:
    if j["error"]:
        return (f"journal {j['path']} cannot be read ({j['error']}): check the GPUs, then `migctl recover "
                "--discard` sets it aside")
    gpus = f"GPU {index_ranges(j['unfinished_gpus'])}" if j["unfinished_gpus"] else "no GPU"
    if j["running"]:
        return f"an apply of {j['profile']} is in progress (pid {j['pid']}); {gpus} not finished yet"
    return (f"an interrupted apply of {j['profile']} (pid {j['pid']}) left {gpus} unfinished: `migctl recover` "
            f"restores the layout it had before (journal {j['path']})")


_LEFT_ALONE = {"lost": "LOST (fallen off the bus; left alone until a GPU reset or a reboot brings it back)",
               "unreadable": "UNREADABLE (left alone; read again next time)"}


def unreadable_lines(doc: dict[str, Any]) -> list[str]:
    """GPUs NVML cannot read (``unreadable`` of a status, plan, assert or apply document), first: a problem."""
    return [f"GPU {u['index']}: {_LEFT_ALONE[u['state']]}: {u['error']}" for u in doc.get("unreadable", [])]


def status_table(doc: dict[str, Any]) -> str:
    lines = [_journal_line(doc["journal"])] if doc.get("journal") else []
    lines += unreadable_lines(doc)
    for g in doc["gpus"]:
        mode = "enabled" if g["mig"]["current"] else "disabled"
        if g["mig"]["after_reset"] != g["mig"]["current"]:
            mode += f" ({'enabled' if g['mig']['after_reset'] else 'disabled'} after the next reset)"
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


def _layout(g: dict[str, Any]) -> str:
    want = Counter(t["profile"] for t in g["target"])
    layout = " + ".join(f"{n}x{k}" if n > 1 else k for k, n in want.items()) if g["mig"] else "MIG disabled"
    return layout or "MIG enabled, no instances"


_OP_WORDS = {"destroy_ci": "destroy {} CI", "destroy_gi": "destroy {} GI", "create_gi": "create {} GI",
             "create_ci": "create {} CI"}


def _op_summary(ops: list[dict[str, Any]]) -> str:
    """``enable MIG, create 7 GI, create 7 CI``: what a GPU's operations amount to."""
    kinds = Counter(o["kind"] for o in ops)
    words = []
    for kind, n in kinds.items():
        if kind == "set_mig":
            on = any(o["kind"] == kind and o["description"].endswith("enabled") for o in ops)
            words.append("enable MIG" if on else "disable MIG")
        elif kind in _OP_WORDS:
            words.append(_OP_WORDS[kind].format(n))
    return ", ".join(words)


def _gpu_line(g: dict[str, Any]) -> str:
    if not g["changes"]:
        return f"({g['model']}): {_layout(g)}: already applied"
    n = len(g["operations"])
    return (f"({g['model']}): {_layout(g)}: {n} operation(s) ({_op_summary(g['operations'])}), "
            f"{g['kept']} instance(s) kept")


def _plan_lines(doc: dict[str, Any], verbose: bool) -> list[str]:
    if not verbose:
        return grouped((g["index"], _gpu_line(g)) for g in doc["gpus"])
    lines = []
    for g in doc["gpus"]:
        lines.append(f"GPU {g['index']} {_gpu_line(g)}")
        lines += [f"  {o['description']}" for o in g["operations"]] if g["changes"] else []
    return lines


def _plan_counts(doc: dict[str, Any]) -> str:
    change = sum(1 for g in doc["gpus"] if g["changes"])
    ops = sum(len(g["operations"]) for g in doc["gpus"])
    return f"{change} GPU(s) to change, {len(doc['gpus']) - change} already as asked, {ops} operation(s)"


def plan_table(doc: dict[str, Any], verbose: bool = False) -> str:
    """A ``migd.plan/v1`` document: the summary, then each group of GPUs (``verbose``: each GPU and its
    operations)."""
    return "\n".join([f"{doc['profile']}: {_plan_counts(doc)}", *unreadable_lines(doc),
                      *_plan_lines(doc, verbose)]) + "\n"


def assert_table(doc: dict[str, Any]) -> str:
    """``migctl assert``: the verdict first, then each GPU that is not as asked (on stdout: what was asked
    is the output)."""
    gpus, pending = doc["gpus"], [g for g in doc["gpus"] if not g["applied"]]
    lost = unreadable_lines(doc)
    if doc["ok"]:
        unchecked = f"; {len(lost)} GPU(s) it may select could not be read" if lost else ""
        return "\n".join([f"{doc['profile']}: applied on {len(gpus)} GPU(s){unchecked}", *lost]) + "\n"
    lines = [f"{doc['profile']}: NOT applied ({len(pending) + len(doc['unmatched'])} of "
             f"{len(gpus) + len(doc['unmatched'])} GPU(s) differ)"]
    lines += [line.replace(" not as in", ": not as in", 1) for line in grouped(
        (g["index"], f"not as in {doc['profile']} ({g['operations']} operation(s) needed)") for g in pending)]
    lines += [f"GPU {i}: matched by no entry of {doc['profile']} (a mig-parted assert covers every GPU)"
              for i in doc["unmatched"]]
    lines += lost
    return "\n".join(lines) + "\n"


def _problems(results: list[dict[str, Any]]) -> list[str]:
    """Rolled-back, failed, faulted, cancelled and blocked GPUs, those with the same reason grouped."""
    words = {"rolled_back": "ROLLED BACK", "failed": "FAILED", "faulted": "FAULTED", "cancelled": "cancelled",
             "blocked": "blocked"}
    return grouped((r["index"], f"{words[r['status']]}: {r['error']}") for r in results if r["status"] in words)


def apply_table(doc: dict[str, Any], by: str | None = None, verbose: bool = False) -> str:
    """An apply's outcome from its ``migd.apply/v1`` document, whichever process did it (``by``): the
    outcome first, then what went wrong, then the plan."""
    if doc["dry_run"]:
        outcome = f"dry run, nothing changed; {_plan_counts(doc)}"
    else:
        changed = sum(1 for r in doc["results"] if r["status"] == "applied")
        statuses = {r["status"] for r in doc["results"]}
        verdict = "applied" if doc["ok"] else "cancelled" if "cancelled" in statuses and \
            not statuses & {"failed", "rolled_back"} else "NOT applied"
        if doc["ok"] and doc.get("unreadable"):  # a GPU the profile may select was lost: left alone
            verdict = "partly applied" if doc["gpus"] else "NOT applied"
        outcome = f"{verdict} in {doc['seconds']:.2f}s; {changed} GPU(s) changed, " \
                  f"{sum(1 for r in doc['results'] if r['status'] == 'unchanged')} already as asked"
    head = f"{doc['profile']}: {outcome}" + (f" (by {by})" if by else "")
    return "\n".join([head, *unreadable_lines(doc), *_problems(doc["results"]), *_plan_lines(doc, verbose)]) + "\n"


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
        lines.append(f"active profile: {active['profile']} (manual apply of {active['source']}, until {until}; "
                     f"{RESUME_HINT})")
    elif active["reason"] == "demand":
        lines.append(f"active profile: {active['profile']} (demand: wanted by planner {active['source']} until "
                     f"{when(active['until'])})")
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
    return "\n".join(lines + _demand_lines(doc.get("demand"), when)) + "\n"


def _demand_lines(dm: dict[str, Any] | None, when: Callable[[float | None], str]) -> list[str]:
    """The demand mode: what this node follows and why; on the planner, its last decision."""
    if not dm:
        return []
    lines = [f"demand ({dm['mode']}, planner {dm['planner']}): {dm['source']}: {dm['why']}"]
    plan = dm.get("plan")
    if plan:
        wanted = ", ".join(f"{t} {v:g}" for t, v in plan["wanted_slice_h"].items()) or "none"
        lines.append(f"  last decision at {when(plan['at'])}: wanted slice-hours {wanted}; {plan['writes']} write(s)"
                     + (f"; Slurm not read: {plan['error']}" if plan.get("error") else ""))
        lines += [f"  change {c}" for c in plan["changes"]] + [f"  held {h}" for h in plan["held"]]
        lines += [f"  skipped {s}" for s in plan["skipped"]]
    return lines


def doctor_table(doc: dict[str, Any], verbose: bool = False) -> str:
    """``migctl doctor``: the verdict, then differences, then notes grouped across GPUs (``verbose``:
    every check of every GPU, passed ones included)."""
    findings = doc["findings"]
    counts = Counter(f["verdict"] for f in findings)
    gpus = len({f["gpu"] for f in findings if f["gpu"] is not None})
    lost = [f["gpu"] for f in findings if f["check"] == UNREADABLE_CHECK]  # no catalog matter
    bad = counts["mismatch"] + counts["error"] - len(lost)
    verdict = f"{bad} difference(s) from the catalog" if bad else "no differences from the catalog"
    if lost:
        verdict += f"; GPU {index_ranges(lost)} cannot be read"
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    head = f"doctor: {verdict} ({gpus} GPU(s), {len(findings)} checks: {tally}" + \
        ("" if verbose else "; -v lists every check") + ")"
    if verbose:
        return "\n".join([head, *(_finding(f) for f in findings)]) + "\n"
    order = ("mismatch", "error", "info")
    node = [_finding(f) for v in order for f in findings if f["gpu"] is None and f["verdict"] == v]
    per_gpu = grouped((f["gpu"], f"{f['check']:<14} {f['verdict']:<8} {f['detail']}")
                      for v in order for f in findings if f["gpu"] is not None and f["verdict"] == v)
    return "\n".join([head, *node, *per_gpu]) + "\n"


def _finding(f: dict[str, Any]) -> str:
    where = "node " if f["gpu"] is None else f"GPU {f['gpu']}"
    return f"{where:<6} {f['check']:<14} {f['verdict']:<8} {f['detail']}"
