"""migctl's tables: the text rendering of each documented document (``migd.report``), in one place.

Each table leads with a one-line summary, shows problems first and groups GPUs that read the same
(``GPU 0-7 (A100-SXM4-80GB): ...``); ``verbose`` lists every GPU and every operation or check.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence

from migd.api.checks import DaemonMarks, DoctorDoc, IsolationDoc
from migd.api.plan import ApplyDoc, AssertDoc, AssertGpu, GpuPlan, Operation, PlanDoc
from migd.api.status import Gpu, JournalLeft, Reading, StatusDoc, Unreadable
from migd.apply.result import GpuStatus
from migd.ctl.daemon_table import RESUME_HINT as RESUME_HINT  # (re-exported: migctl's tables are all here)
from migd.ctl.daemon_table import When, clock_of, mark_text, signal_lines, utc
from migd.ctl.daemon_table import daemon_table as daemon_table
from migd.hardware.doctor import UNREADABLE_CHECK, Finding, Verdict
from migd.plan.planner import OpKind
from migd.printable import text_lines
from migd.profiles.model import index_ranges


def groups(items: Iterable[tuple[int, str]]) -> list[tuple[str, str]]:
    """``(gpu index, text)`` pairs as ``("GPU 0-3,5", text)``, one per distinct text, in first-seen order."""
    by_text: dict[str, list[int]] = {}
    for index, text in items:
        by_text.setdefault(text, []).append(index)
    return [(f"GPU {index_ranges(ix)}", text) for text, ix in by_text.items()]


def grouped(items: Iterable[tuple[int, str]]) -> list[str]:
    """``(gpu index, text)`` pairs as ``GPU 0-3,5 text`` lines, one per distinct text, in first-seen order."""
    return [f"{where} {text}" for where, text in groups(items)]


def _journal_line(j: JournalLeft) -> str:
    if j.error:
        return (f"journal {j.path} cannot be read ({j.error}): check the GPUs, then `migctl recover "
                "--discard` sets it aside")
    gpus = f"GPU {index_ranges(j.unfinished_gpus)}" if j.unfinished_gpus else "no GPU"
    if j.running:
        return f"an apply of {j.profile} is in progress (pid {j.pid}); {gpus} not finished yet"
    return (f"an interrupted apply of {j.profile} (pid {j.pid}) left {gpus} unfinished: `migctl recover` "
            f"restores the layout it had before (journal {j.path})")


_LEFT_ALONE = {Reading.LOST: "LOST (fallen off the bus; left alone until a GPU reset or a reboot brings it back)",
               Reading.UNREADABLE: "UNREADABLE (left alone; read again next time)"}


def unreadable_lines(lost: Iterable[Unreadable]) -> list[str]:
    """GPUs NVML cannot read (``unreadable`` of a status, plan, assert or apply document), first: a problem."""
    return [f"GPU {u.index}: {_LEFT_ALONE[u.state]}: {u.error}" for u in lost]


def status_table(doc: StatusDoc, verbose: bool = False) -> str:
    """``migctl status``: a one-line summary, what an interrupted apply left and the GPUs NVML cannot read,
    then the GPUs that read the same as one line each (``verbose``: every GPU and MIG device, with its MIG
    UUID, memory and processes)."""
    lines = [_status_head(doc, verbose)]
    lines += [_journal_line(doc.journal)] if doc.journal else []
    lines += unreadable_lines(doc.unreadable)
    if not verbose:
        return text_lines(lines + grouped((g.index, _gpu_reads(g)) for g in doc.gpus))
    for g in doc.gpus:
        lines.append(f"GPU {g.index}  {g.model}  {g.pci_bus_id}  MIG {_mode(g)}")
        for gi in g.instances:
            owner, at = gi.owner or "-", f"@{gi.placement.start}:{gi.placement.size}"
            if not gi.compute_instances:
                lines.append(f"  GI {gi.gi_id:>2} {gi.profile:<12} {at}  owner {owner}  (no compute instance)")
            for ci in gi.compute_instances:
                mem = f"{(ci.memory_used_bytes or 0) >> 20}/{(ci.memory_total_bytes or 0) >> 20} MiB"
                pids = ",".join(str(p.pid) for p in ci.processes) or "-"
                lines.append(f"  GI {gi.gi_id:>2} CI {ci.ci_id} {ci.profile:<14} {at}  owner {owner:<12} "
                             f"{ci.mig_uuid}  {mem}  pids {pids}")
    return text_lines(lines)


def _mode(g: Gpu) -> str:
    mode = "enabled" if g.mig.current else "disabled"
    if g.mig.after_reset != g.mig.current:
        mode += f" ({'enabled' if g.mig.after_reset else 'disabled'} after the next reset)"
    return mode


def _busy(g: Gpu) -> list[str]:
    """Where processes run on a GPU: each MIG device's, or the whole GPU's with MIG off."""
    busy = [f"GI {gi.gi_id} CI {ci.ci_id} pids {','.join(str(p.pid) for p in ci.processes)}"
            for gi in g.instances for ci in gi.compute_instances if ci.processes]
    return busy + ([f"pids {','.join(str(p.pid) for p in g.processes)}"] if g.processes else [])


def _status_head(doc: StatusDoc, verbose: bool) -> str:
    devices = sum(len(gi.compute_instances) for g in doc.gpus for gi in g.instances)
    busy = [g.index for g in doc.gpus if _busy(g)]
    head = (f"status: {len(doc.gpus)} GPU(s), MIG enabled on {sum(g.mig.current for g in doc.gpus)}, "
            f"{devices} MIG device(s); " + (f"processes on GPU {index_ranges(busy)}" if busy else "no processes"))
    if doc.unreadable:
        head += f"; GPU {index_ranges([u.index for u in doc.unreadable])} cannot be read"
    if doc.sampled_at is not None:  # from migd's read-only socket: its sampler's last reading
        head += f"; as migd read it at {time.strftime('%H:%M:%S', time.localtime(doc.sampled_at))}"
    return head + ("" if verbose else "; -v lists every MIG device with its UUID")


def _gpu_reads(g: Gpu) -> str:
    """One GPU as it reads without its UUIDs: model, MIG mode, instances with owners, where processes run."""
    text = f"({g.model}): MIG {_mode(g)}"
    if g.mig.current:
        kinds: Counter[tuple[str, str | None]] = Counter()
        for gi in g.instances:
            cis = [ci.profile for ci in gi.compute_instances]
            kinds[(gi.profile if cis == [gi.profile] else f"{gi.profile}[{'+'.join(cis) or 'no CI'}]", gi.owner)] += 1
        text += ": " + (" + ".join((f"{n}x{k}" if n > 1 else k) + (f" (owner {o})" if o else "")
                                   for (k, o), n in kinds.items()) or "no instances")
    busy = _busy(g)
    return text + (f"; processes: {', '.join(busy)}" if busy else "")


def _layout(g: GpuPlan) -> str:
    want = Counter(t.profile for t in g.target)
    layout = " + ".join(f"{n}x{k}" if n > 1 else k for k, n in want.items()) if g.mig else "MIG disabled"
    return layout or "MIG enabled, no instances"


_OP_WORDS = {OpKind.DESTROY_CI: "destroy {} CI", OpKind.DESTROY_GI: "destroy {} GI",
             OpKind.CREATE_GI: "create {} GI", OpKind.CREATE_CI: "create {} CI"}


def _op_summary(ops: Iterable[Operation]) -> str:
    """``enable MIG, create 7 GI, create 7 CI``: what a GPU's operations amount to."""
    kinds = Counter(o.kind for o in ops)
    words = []
    for kind, n in kinds.items():
        if kind is OpKind.SET_MIG:
            on = any(o.kind is kind and o.description.endswith("enabled") for o in ops)
            words.append("enable MIG" if on else "disable MIG")
        elif kind is OpKind.RESET:  # counted in the operations: named, so the words add up to the count
            words.append("reset if the mode change stays pending")
        elif kind in _OP_WORDS:
            words.append(_OP_WORDS[kind].format(n))
    return ", ".join(words)


def _gpu_line(g: GpuPlan) -> str:
    if not g.changes and g.owners_only:
        owners = sorted({t.owner for t in g.target if t.owner})
        return (f"({g.model}): {_layout(g)}: an owner change to {', '.join(owners) or 'none'} (instances kept, "
                "no MIG operation)")
    if not g.changes:
        return f"({g.model}): {_layout(g)}: already applied"
    return (f"({g.model}): {_layout(g)}: {len(g.operations)} operation(s) ({_op_summary(g.operations)}), "
            f"{g.kept} instance(s) kept")


def _plan_lines(gpus: Iterable[GpuPlan], verbose: bool) -> list[str]:
    if not verbose:
        return grouped((g.index, _gpu_line(g)) for g in gpus)
    lines = []
    for g in gpus:
        lines.append(f"GPU {g.index} {_gpu_line(g)}")
        lines += [f"  {o.description}" for o in g.operations] if g.changes else []
    return lines


def _plan_counts(gpus: Sequence[GpuPlan]) -> str:
    change = sum(1 for g in gpus if g.changes or g.owners_only)
    ops = sum(len(g.operations) for g in gpus)
    return f"{change} GPU(s) to change, {len(gpus) - change} already as asked, {ops} operation(s)"


def plan_table(doc: PlanDoc, verbose: bool = False) -> str:
    """A ``migd.plan/v1`` document: the summary, then each group of GPUs (``verbose``: each GPU and its
    operations)."""
    return text_lines([f"{doc.profile}: {_plan_counts(doc.gpus)}", *unreadable_lines(doc.unreadable),
                       *_plan_lines(doc.gpus, verbose)])


def assert_table(doc: AssertDoc, verbose: bool = False) -> str:
    """``migctl assert``: the verdict first, then each group of GPUs that is not as asked (``verbose``: every
    GPU, as asked or not), on stdout: what was asked is the output."""
    gpus, pending = doc.gpus, [g for g in doc.gpus if not g.applied]
    lost = unreadable_lines(doc.unreadable)
    if doc.ok:
        unchecked = f"; {len(lost)} GPU(s) it may select could not be read" if lost else ""
        lines = [f"{doc.profile}: applied on {len(gpus)} GPU(s){unchecked}"]
    else:
        lines = [f"{doc.profile}: NOT applied ({len(pending) + len(doc.unmatched)} of "
                 f"{len(gpus) + len(doc.unmatched)} GPU(s) differ)"]
    if verbose:
        lines += [f"GPU {g.index} ({g.model}): " + (f"as in {doc.profile}" if g.applied else _differs(doc, g))
                  for g in gpus]
    else:
        lines += [line.replace(" not as in", ": not as in", 1) for line in grouped(
            (g.index, _differs(doc, g)) for g in pending)]
    lines += [f"GPU {i}: matched by no entry of {doc.profile} (a mig-parted assert covers every GPU)"
              for i in doc.unmatched]
    return text_lines(lines + lost)


def _differs(doc: AssertDoc, g: AssertGpu) -> str:
    if g.owners_only:
        return f"not as in {doc.profile} (its instances are, their owners are not; no MIG operation needed)"
    return f"not as in {doc.profile} ({g.operations} operation(s) needed)"


_PROBLEM_WORDS = {GpuStatus.ROLLED_BACK: "ROLLED BACK", GpuStatus.FAILED: "FAILED", GpuStatus.FAULTED: "FAULTED",
                  GpuStatus.CANCELLED: "cancelled", GpuStatus.BLOCKED: "blocked"}


def apply_table(doc: ApplyDoc, by: str | None = None, verbose: bool = False, when: When = utc) -> str:
    """An apply's outcome from its ``migd.apply/v1`` document, whichever process did it (``by``): the
    outcome first, then what went wrong (rolled back, failed, faulted, cancelled and blocked GPUs, those
    with the same reason grouped), then the plan.  ``when``: times as the clock of whoever applied shows
    them (a migd on a clock of its own)."""
    if doc.dry_run:
        outcome = f"dry run, nothing changed; {_plan_counts(doc.gpus)}"
    else:
        statuses = Counter(r.status for r in doc.results)
        verdict = "applied" if doc.ok else "cancelled" if statuses[GpuStatus.CANCELLED] and \
            not statuses[GpuStatus.FAILED] + statuses[GpuStatus.ROLLED_BACK] else "NOT applied"
        if doc.ok and doc.unreadable:  # a GPU the profile may select was lost: left alone
            verdict = "partly applied" if doc.gpus else "NOT applied"
        outcome = f"{verdict} in {doc.seconds:.2f}s; {statuses[GpuStatus.APPLIED]} GPU(s) changed, " \
                  f"{statuses[GpuStatus.UNCHANGED]} already as asked"
    problems = grouped((r.index, f"{_PROBLEM_WORDS[r.status]}: {r.error}") for r in doc.results
                       if r.status in _PROBLEM_WORDS)
    head = f"{doc.profile}: {outcome}" + (f" (by {by})" if by else "")
    return text_lines([head, *unreadable_lines(doc.unreadable), *signal_lines(doc.signalled, when), *problems,
                       *_plan_lines(doc.gpus, verbose)])


def doctor_table(doc: DoctorDoc, verbose: bool = False) -> str:
    """``migctl doctor``: the verdict, then differences, then notes grouped across GPUs (``verbose``:
    every check of every GPU, passed ones included); the columns line up whatever the GPU ranges."""
    findings = doc.findings
    counts = Counter(f.verdict.value for f in findings)
    gpus = len({f.gpu for f in findings if f.gpu is not None})
    lost = [f.gpu for f in findings if f.check == UNREADABLE_CHECK and f.gpu is not None]  # no catalog matter
    bad = counts["mismatch"] + counts["error"] - len(lost)
    verdict = f"{bad} difference(s) from the catalog" if bad else "no differences from the catalog"
    if lost:
        verdict += f"; GPU {index_ranges(lost)} cannot be read"
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    head = f"doctor: {verdict} ({gpus} GPU(s), {len(findings)} checks: {tally}" + \
        ("" if verbose else "; -v lists every check") + ")"
    if verbose:
        rows = [("node" if f.gpu is None else f"GPU {f.gpu}", _finding(f)) for f in findings]
    else:
        order = (Verdict.MISMATCH, Verdict.ERROR, Verdict.INFO)
        rows = [("node", _finding(f)) for v in order for f in findings if f.gpu is None and f.verdict is v]
        rows += groups((f.gpu, _finding(f)) for v in order for f in findings if f.gpu is not None and f.verdict is v)
    width = max([6, *(len(where) for where, _ in rows)])  # ("GPU 0-7" and "node" in one column)
    return text_lines([head, *(f"{where:<{width}} {text}" for where, text in rows)])


def _finding(f: Finding) -> str:
    return f"{f.check:<14} {f.verdict.value:<8} {f.detail}"


def _unhealthy(marks: DaemonMarks) -> list[str]:
    """Each fault mark, its time on the daemon's clock (migd's own under ``--now``, as ``migctl daemon``
    shows it)."""
    when = clock_of(marks.clock)
    return [f"UNHEALTHY {mark_text(u, r, marks.faults, when)}" for u, r in marks.unhealthy.items()]


def isolation_table(doc: IsolationDoc, verbose: bool = False) -> str:
    """``migctl isolation``: a one-line verdict, the GPUs NVML cannot read, the audit's findings (those that
    read the same on several GPUs as one line; ``verbose``: each), then migd's fault marks and the probe."""
    found = doc.findings
    lost = [u.index for u in doc.unreadable]
    if found:
        sev = Counter(f.severity.value for f in found)
        head = (f"audit: {len(found)} finding(s) ({', '.join(f'{n} {s}' for s, n in sorted(sev.items()))}) on GPU "
                f"{index_ranges(sorted({f.gpu for f in found}))}")
    else:
        head = "audit: no findings"
    head += (f"; GPU {index_ranges(lost)} cannot be read" if lost else "") + \
        ("; -v lists each" if found and not verbose else "")
    lines = [head, *unreadable_lines(doc.unreadable)]
    if verbose:
        lines += [f"{f.severity.value.upper():7} {f.check.value:10} {f.message}" for f in found]
    else:
        by_text: dict[tuple[str, str, str], list[int]] = {}
        for f in found:
            by_text.setdefault((f.severity.value.upper(), f.check.value, f.message.removeprefix(f"GPU {f.gpu}: ")),
                               []).append(f.gpu)
        lines += [f"{sv:7} {ck:10} GPU {index_ranges(ix)}: {text}" for (sv, ck, text), ix in by_text.items()]
    if doc.daemon is not None:
        lines += _unhealthy(doc.daemon)
        lines += [f"BREACH  {b}" for b in doc.daemon.breaches]
    if doc.probe is not None:
        lines.append(f"probe: {doc.probe.status.value}: {doc.probe.detail}")
    return text_lines(lines)


def mine_table(doc: StatusDoc, uid: int, groups: Sequence[int]) -> str:
    """``migctl status --mine``: one line per MIG device this user may use, with what selects it."""
    lines = [f"GPU {g.index} GI {gi.gi_id} CI {ci.ci_id} {ci.profile} (owner {gi.owner or '-'}): "
             f"CUDA_VISIBLE_DEVICES={ci.mig_uuid}"
             for g in doc.gpus for gi in g.instances for ci in gi.compute_instances]
    if not lines:
        return (f"no MIG device of this node is open to you (uid {uid}, groups {','.join(map(str, groups)) or '-'}): "
                "`migctl daemon` says which group owns what\n")
    return text_lines(lines)
