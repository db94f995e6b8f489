"""Transactional apply, shared by ``migctl`` and the daemon.

Plan every GPU first (bad input or an impossible layout stops here, nothing touched);
refuse, wait for or (explicitly) stop processes on instances that would be destroyed;
journal the previous layout; change GPUs in parallel; verify; on any failure put that GPU
back to its previous layout.  A journal left by a crash is resolved before the next apply.

This module runs the transaction; each job it composes has a module of its own: ``planning``
(which GPUs, each read once and planned), ``busy`` (the busy policy), ``faults`` (the fault marks
when planned and right before the first change), ``steps`` (one operation, checked against fault
marks, and the read-back), ``recovery`` (what a crash left).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from migd.apply.busy import blocked_text, cancelled, settle_busy
from migd.apply.faults import marked_before_change, refused_when_planned
from migd.apply.force import stop_processes
from migd.apply.journal import GpuEntry, Journal, LayoutDoc, Step
from migd.apply.lock import ApplyLock
from migd.apply.owners import Owners
from migd.apply.planning import plan_each, plan_layout, touched
from migd.apply.recovery import recover
from migd.apply.relabel import labels_of, moves, owners_only, relabelled, settle_handover
from migd.apply.result import (
    AccessGate,
    ApplyOptions,
    ApplyResult,
    Cancelled,
    FaultGate,
    GpuFaulted,
    GpuResult,
    GpuStatus,
    Signalled,
)
from migd.apply.steps import guarded, verify
from migd.hardware.inventory import Unreadable, survey
from migd.hardware.ports import ApplyPort
from migd.hardware.types import GpuInfo, GpuState, HardwareError
from migd.paths import StateFile
from migd.plan.planner import GpuPlan, OpKind, PlanError, layout_of
from migd.plan.requests import DesiredLayout
from migd.profiles.model import Profile

log = logging.getLogger(__name__)


CANCELLED = "stopped on request (Ctrl-C or SIGTERM); put back as it was before the apply"
SETTLED_STATUS = (GpuStatus.APPLIED, GpuStatus.ROLLED_BACK, GpuStatus.CANCELLED)  # in the old or new layout


class Applier:
    """Plans and applies profiles on one node.  ``state_dir`` holds the lock, journal and owners."""

    def __init__(self, backend: ApplyPort, state_dir: Path) -> None:
        self.backend = backend
        self.state_dir = Path(state_dir)
        self.journal = Journal(StateFile.JOURNAL.at(self.state_dir))
        self.owners = Owners(StateFile.OWNERS.at(self.state_dir))
        self._stopping: Callable[[], bool] | None = None
        self._progress: Callable[[], None] | None = None
        self._faults: FaultGate | None = None
        self.access: AccessGate | None = None  # access by owner (migd's config): closed, changed, opened
        self._unnoted: list[str] = []  # journal updates that could not be written (said if the journal stays)

    def lock(self, timeout_s: float = 0.0) -> ApplyLock:
        return ApplyLock(StateFile.APPLY_LOCK.at(self.state_dir), timeout_s)

    # -- planning ---------------------------------------------------------------------------------
    def plan(self, profile: Profile, mode_only: bool = False) -> list[GpuPlan]:
        """One reading of every readable GPU the profile selects, and its plan (owners read once).
        ``mode_only``: only the MIG mode, as mig-parted's --mode-only (instances that exist are kept)."""
        return self.plan_each(profile, mode_only=mode_only, must_select=True)[0]

    def plan_each(self, profile: Profile, mode_only: bool = False,
                  must_select: bool = False) -> tuple[list[GpuPlan], list[Unreadable]]:
        """As :meth:`plan`, and the GPUs NVML cannot read (lost), set aside (``planning.plan_each``)."""
        return plan_each(self.backend, self.owners.load(), profile, mode_only, must_select,
                         self.access.held if self.access is not None else None)

    def plan_layout(self, gpu: GpuInfo, desired: DesiredLayout, owners: dict[int, str], where: str = "") -> GpuPlan:
        return plan_layout(self.backend, gpu, desired, owners, where,
                           self.access.held if self.access is not None else None)

    # -- applying ---------------------------------------------------------------------------------
    def apply(self, profile: Profile, opts: ApplyOptions | None = None) -> ApplyResult:
        opts = opts or ApplyOptions()
        with self.lock(opts.lock_timeout_s):
            self.resolve_journal()
            plans, unreadable = self.plan_each(profile, opts.mode_only, must_select=True)
            result = self.apply_plans(profile, plans, opts)
            result.unreadable = touched(profile, unreadable)
            return result

    def apply_plans(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions) -> ApplyResult:
        """Carry out ``plans``, made from readings taken under the apply lock that the caller still holds."""
        t0 = time.monotonic()
        owners_then = self.owners.load()
        moved = relabelled(plans, owners_then)  # owners change without any NVML operation
        if opts.dry_run:
            return ApplyResult(profile.name, plans, [
                GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.WOULD_CHANGE if p.changes or p in moved
                          else GpuStatus.UNCHANGED, len(p.ops)) for p in plans],
                owners_only=owners_only(plans, owners_then))
        faulted = refused_when_planned(plans, opts)  # (GpuUnhealthy without opts.partial)
        skip, sent = {f.plan.gpu.uuid for f in faulted}, list[Signalled]()  # sent: what force signalled, and when
        try:
            plans, blocked = settle_busy(self.backend, [p for p in plans if p.gpu.uuid not in skip], opts, lambda: [
                p for p in self.plan(profile, opts.mode_only) if p.gpu.uuid not in skip], self._holding, sent)
        except Cancelled as e:  # withdrawn while it waited: nothing touched
            return cancelled(profile.name, plans, str(e), time.monotonic() - t0, owners_only(plans, owners_then))
        late = marked_before_change(plans, opts)  # a fatal Xid while it waited: that GPU is left as it is
        faulted += late
        plans = [p for p in plans if p.gpu.uuid not in {f.plan.gpu.uuid for f in late}]
        changing = [p for p in plans if p.changes]
        results = [GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.UNCHANGED) for p in plans
                   if not p.changes and p not in moved]
        results += [GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.BLOCKED, len(p.ops), blocked_text(p.blocked))
                    for p in blocked]
        results += [f.result() for f in faulted]
        if changing:
            results += self._run(profile, changing, opts)
        moved = [p for p in moved if p in plans]  # (not one the busy policy set aside)
        if moved:
            asked = moved
            moved, waiting = settle_handover(moved, self.owners.load, opts, partial(self._replan, profile, opts),
                                             lambda pids: stop_processes(self.backend, pids, opts.kill_grace_s,
                                                                         self._holding, sent))
            results += [GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.BLOCKED, 0, waiting[p.gpu.uuid])
                        for p in plans if p.gpu.uuid in waiting]
            results += _gone(asked, moved, waiting)
            results += self._relabel(profile, moved)
        if self.access is not None:  # settled (applied, rolled back, untouched): open what exists, as owned
            for p in plans:
                self.access.open_gpu(p.gpu.index)
        results.sort(key=lambda r: r.index)
        every = sorted(plans + blocked + [f.plan for f in faulted], key=lambda p: p.gpu.index)
        return ApplyResult(profile.name, every, results, time.monotonic() - t0, signalled=sent,
                           owners_only=owners_only(every, owners_then))

    def restore(self, plans: list[GpuPlan], owners: Mapping[str, dict[int, str]], opts: ApplyOptions,
                name: str) -> ApplyResult:
        """Put every GPU these plans changed back as it was when planned (Slurm refused the new
        layout's GRES, say): a plan to the pinned old layout, applied like any other."""
        return self.restore_layouts({p.gpu.uuid: (before_of(p), dict(owners.get(p.gpu.uuid, {})))
                                     for p in plans if p.changes}, opts, name)

    def restore_layouts(self, befores: Mapping[str, tuple[DesiredLayout, dict[int, str]]], opts: ApplyOptions,
                        name: str) -> ApplyResult:
        """Put GPUs, found by UUID, back in recorded layouts (a restarted migd undoing a switch Slurm
        refused); a GPU no longer found fails the restore, said in its result."""
        gpus = {g.uuid: g for g in survey(self.backend).gpus}
        back = [self.plan_layout(gpus[u], layout, owners) for u, (layout, owners) in befores.items() if u in gpus]
        result = self.apply_plans(Profile(name=name, description="restore", sections=(), source=""), back, opts)
        result.results += [GpuResult(-1, u, GpuStatus.FAILED, 0, f"GPU {u} is not present")
                           for u in befores if u not in gpus]
        return result

    def _run(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions) -> list[GpuResult]:
        env = {"MIGD_PROFILE": profile.name, "MIGD_GPUS": ",".join(str(p.gpu.index) for p in plans),
               "MIG_PARTED_SELECTED_CONFIG": profile.name}  # what mig-parted's hooks.sh reads
        if self.journal.exists():  # unresolved (the daemon recovers, it does not refuse): never written over
            return self._unresolved(plans, "not changed")
        owners = self.owners.load()
        befores = [(before_of(p), owners.get(p.gpu.uuid, {})) for p in plans]  # what a rollback restores
        self.journal.begin(profile.name, {p.gpu.uuid: GpuEntry(
            index=p.gpu.index, status=Step.PENDING, ops=len(p.ops), before=LayoutDoc.of(before),
            owners_before=owners_before) for p, (before, owners_before) in zip(plans, befores, strict=True)})
        results: list[GpuResult] = []
        self._stopping, self._progress, self._faults = opts.stopping, opts.progress, opts.faults
        try:
            opts.hooks.run("apply-start", env)
            if any(o.kind is OpKind.SET_MIG for p in plans for o in p.ops):
                opts.hooks.run("pre-apply-mode", env)
            opts.hooks.run("pre-apply-config", env)
            if opts.parallel and len(plans) > 1:
                with ThreadPoolExecutor(max_workers=len(plans), thread_name_prefix="migd-gpu") as pool:
                    results = list(pool.map(self._run_gpu, plans, befores))
            else:
                results = [self._run_gpu(p, b) for p, b in zip(plans, befores, strict=True)]
            if opts.aborted:
                results = [self._undo(p, b, r) for p, b, r in zip(plans, befores, results, strict=True)]
        finally:
            # Keep the journal while any GPU may be half-way (a failed rollback, an interrupt, a write
            # error): the next start or `migctl recover` restores it.  Dropped only when every GPU is
            # in its old or new layout, or when no GPU was touched (a hook refused first).
            settled = len(results) == len(plans) and all(r.status in SETTLED_STATUS for r in results)
            if settled or not self.journal.touched():
                self.journal.finish()
            self._say_unnoted()
            ok = bool(results) and all(r.status is GpuStatus.APPLIED for r in results)
            opts.hooks.run("apply-exit", {**env, "MIGD_RESULT": "success" if ok else "failure"})
        return results

    def _unresolved(self, plans: list[GpuPlan], what: str) -> list[GpuResult]:
        """Each GPU refused: a journal recovery could not resolve is the only record it keeps."""
        return [GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.FAILED, 0, f"{what}: an interrupted apply's journal "
                          f"{self.journal.path} is unresolved (see migctl recover)") for p in plans]

    def _holding(self) -> set[int]:
        """Every process holding a capability node of this node's GPUs (none without access by owner)."""
        if self.access is None:
            return set()
        held = self.access.held([g.index for g in survey(self.backend).gpus])
        return {pid for by_gi in held.values() for by_ci in by_gi.values() for pids in by_ci.values() for pid in pids}

    def _replan(self, profile: Profile, opts: ApplyOptions, plans: list[GpuPlan]) -> list[GpuPlan]:
        """``plans``' GPUs read and planned again, those still only relabelled (a wait's next look)."""
        uuids = {p.gpu.uuid for p in plans}
        return relabelled([p for p in self.plan(profile, opts.mode_only) if p.gpu.uuid in uuids], self.owners.load())

    def _relabel(self, profile: Profile, plans: list[GpuPlan]) -> list[GpuResult]:
        """Owner-only changes, journalled (``relabel.py``): close, write the labels, then (the caller)
        open; a GPU that cannot be closed keeps its owners."""
        if self.journal.exists():  # an unsettled apply kept its record: nothing goes on top of it
            return self._unresolved(plans, "owners not changed")
        owners = self.owners.load()
        self.journal.begin(profile.name, {p.gpu.uuid: GpuEntry(
            index=p.gpu.index, status=Step.RELABELING, before=LayoutDoc.of(before_of(p)),
            owners_before=owners.get(p.gpu.uuid, {}), owners_after=labels_of(p)) for p in plans})
        results = []
        for p in plans:
            try:
                results.append(self._forward(p.gpu, labels_of(p), owners.get(p.gpu.uuid, {})))
            except (HardwareError, OSError) as e:
                why = str(e) if isinstance(e, HardwareError) else f"owner labels not written: {e.strerror or e}"
                self._note(p.gpu.uuid, status=Step.ROLLED_BACK, error=why)
                results.append(GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.ROLLED_BACK, 0, why))
        self.journal.finish()
        self._say_unnoted()
        return results

    def _forward(self, gpu: GpuInfo, after: dict[int, str], before: Mapping[int, str] | None = None) -> GpuResult:
        """One GPU's owners to ``after``: closed first, then the labels (the journal says done last)."""
        t0 = time.monotonic()
        if self.access is not None:
            self.access.close_gpu(gpu.index)
        self.owners.set_gpu(gpu.uuid, after)
        self._note(gpu.uuid, status=Step.DONE)
        log.info("GPU %d: owners changed (%s)", gpu.index, moves(before, after) if before is not None else "finished "
                 "after an interrupted owner change")
        return GpuResult(gpu.index, gpu.uuid, GpuStatus.APPLIED, 0, None, time.monotonic() - t0)

    def _recover_forward(self, gpu: GpuInfo, after: dict[int, str]) -> GpuResult:
        try:
            return self._forward(gpu, after)
        except (HardwareError, OSError) as e:
            log.error("GPU %d: an interrupted owner change cannot be finished yet: %s", gpu.index, e)
            return GpuResult(gpu.index, gpu.uuid, GpuStatus.FAILED, 0, str(e))

    def _execute_ops(self, plan: GpuPlan, journal_uuid: str | None = None) -> tuple[int, GpuState]:
        """Run a plan's operations and read the GPU back; ``journal_uuid`` marks a forward apply
        (journaled, cancellable)."""
        gi_ids = {g.placement.start: g.id for g in plan.current}
        done, mode_applied = 0, False
        if journal_uuid is not None:  # before the first step: an interrupt from here on keeps the journal
            self.journal.mark(journal_uuid, status=Step.APPLYING)
        for op in plan.ops:
            if journal_uuid is not None and self._stopping is not None and self._stopping():
                raise Cancelled(f"GPU {op.gpu}: {CANCELLED}")
            if op.kind is OpKind.RESET and mode_applied:
                continue  # the mode change took effect without a reset (Hopper)
            applied = guarded(self.backend, self._faults, plan.gpu.uuid, op, gi_ids)
            if self.access is not None and op.kind in (OpKind.CREATE_GI, OpKind.CREATE_CI):
                self.access.seal(op.gpu)  # closed before anyone's nvidia-modprobe can open it
            if op.kind is OpKind.SET_MIG:
                mode_applied = applied
                log.info("GPU %d: MIG mode %s%s", op.gpu, "enabled" if op.mig else "disabled",
                         "" if applied else " once the GPU is reset (the change is pending)")
            done += 1
            if journal_uuid is not None:
                self.journal.mark(journal_uuid, done=done)
            if self._progress is not None:
                self._progress()
        return done, verify(self.backend, plan)

    def _run_gpu(self, plan: GpuPlan, before: tuple[DesiredLayout, dict[int, str]]) -> GpuResult:
        t0 = time.monotonic()
        uuid, i = plan.gpu.uuid, plan.gpu.index
        try:
            if self.access is not None:  # nothing of the old layout stays open for an instance reusing an id
                self.access.close_gpu(i)
            done, seen = self._execute_ops(plan, uuid)
            # The new owners before the journal says done: a crash in between rolls the layout back
            # and puts the old labels back with it; after it, the labels already match the layout.
            self._set_owners(uuid, labels_of(plan))
            # The GPU's one journal write (<= 2 per GPU): what cannot be recorded as done is undone,
            # so the record on disk (this GPU's before-layout) stays the truth.
            self.journal.update(uuid, status=Step.DONE)
        except Cancelled:  # asked for: not an error, and said once by whoever asked
            return self._rollback(plan.gpu, *before, CANCELLED, t0, GpuStatus.CANCELLED)
        except (HardwareError, OSError) as e:  # OSError: the journal or labels cannot be written (disk full)
            why = str(e) if isinstance(e, HardwareError) else f"cannot write the journal: {e.strerror or e}"
            # DEBUG: the outcome (rolled back, or a CRITICAL failed rollback) is reported once, with its
            # cause, by whoever reports the apply (migctl's table, migd's one line per attempt)
            log.debug("GPU %d: apply failed (%s); rolling back to the previous layout", i, why)
            result = self._rollback(plan.gpu, *before, why, t0)
            if isinstance(e, GpuFaulted) and result.status is GpuStatus.ROLLED_BACK:
                result.status = GpuStatus.FAULTED  # stopped before a change: the GPU is as it was
            return result
        log.info("GPU %d: applied %d operations in %.2fs", i, done, time.monotonic() - t0)
        return GpuResult(i, uuid, GpuStatus.APPLIED, done, None, time.monotonic() - t0, seen)

    def _undo(self, plan: GpuPlan, before: tuple[DesiredLayout, dict[int, str]], result: GpuResult) -> GpuResult:
        """The requester withdrew after this GPU was done: put it back too, so a cancelled apply leaves
        every GPU as it found it."""
        if result.status is not GpuStatus.APPLIED:
            return result
        self._note(plan.gpu.uuid, status=Step.APPLYING)  # from here the journal's before-layout is the truth again
        return self._rollback(plan.gpu, *before, CANCELLED, time.monotonic(), GpuStatus.CANCELLED)

    def _rollback(self, gpu: GpuInfo, before: DesiredLayout, owners_before: dict[int, str], why: str,
                  t0: float, status: GpuStatus = GpuStatus.ROLLED_BACK) -> GpuResult:
        try:
            plan = self.plan_layout(self.backend.gpu(gpu.index), before, owners_before)
            self._execute_ops(plan)
        except (HardwareError, PlanError, OSError) as e2:
            msg = (f"{why}; ROLLBACK FAILED: {e2}. GPU {gpu.index} is in an intermediate layout; the journal "
                   "keeps the previous layout and the next apply or daemon start retries the rollback")
            log.critical("GPU %d: %s", gpu.index, msg)
            self._note(gpu.uuid, status=Step.FAILED, error=msg)
            return GpuResult(gpu.index, gpu.uuid, GpuStatus.FAILED, 0, msg, time.monotonic() - t0)
        try:
            self._set_owners(gpu.uuid, owners_before)
        except HardwareError as e:  # the journal keeps them: recovery writes them again
            log.error("GPU %d: %s", gpu.index, e)
            return GpuResult(gpu.index, gpu.uuid, GpuStatus.FAILED, 0, f"{why}; {e}", time.monotonic() - t0)
        self._note(gpu.uuid, status=Step.ROLLED_BACK, error=why)
        log.debug("GPU %d: back on its previous layout", gpu.index)
        return GpuResult(gpu.index, gpu.uuid, status, 0, why, time.monotonic() - t0)

    def _note(self, uuid: str, **fields: object) -> None:
        """Record a GPU's outcome in the journal.  A failed write matters only while the journal is kept
        (the file then names the GPU as it was before): it is said then (:meth:`_say_unnoted`), not when
        the apply settles and drops the journal (a full disk would otherwise add a line to every attempt)."""
        if self.journal.doc is None:
            return
        try:
            self.journal.update(uuid, **fields)
        except OSError as e:
            self._unnoted.append(f"cannot update the journal {self.journal.path}: {e}")

    def _say_unnoted(self) -> None:
        if self.journal.exists():
            for msg in self._unnoted:
                log.error("%s", msg)
        self._unnoted.clear()

    def _set_owners(self, uuid: str, owners: dict[int, str]) -> None:
        """HardwareError when they cannot be written: the change is then rolled back (its instances
        would otherwise be granted by the old layout's labels)."""
        try:
            self.owners.set_gpu(uuid, owners)
        except OSError as e:
            raise HardwareError(f"cannot write the owner labels {self.owners.path}: {e.strerror or e}") from None

    # -- crash recovery ---------------------------------------------------------------------------
    def recover(self) -> list[GpuResult]:
        with self.lock():
            return self.recover_locked()

    def resolve_journal(self) -> None:
        """Before an apply: restore what an interrupted one left; refuse while anything stays unresolved
        (applying on top would overwrite the only record of the previous layout)."""
        results = self.recover_locked()
        if self.journal.exists():
            left = "; ".join(f"GPU {r.index}: {r.error}" for r in results if r.status is not GpuStatus.ROLLED_BACK)
            raise HardwareError(f"an interrupted apply is not resolved ({left or 'see migctl recover'}); its journal "
                                f"{self.journal.path} is kept and nothing was changed")

    def recover_locked(self) -> list[GpuResult]:
        """Resolve a journal left by a process that died mid-apply (``recovery.recover``)."""
        try:
            return recover(self.journal, self.backend, self._rollback, self._recover_forward)
        finally:
            self._say_unnoted()


def _gone(asked: list[GpuPlan], left: list[GpuPlan], waiting: Mapping[str, str]) -> list[GpuResult]:
    """The owner changes a wait's replan dropped (the GPU's layout or owners changed meanwhile, by another
    hand): each still has a result, blocked, so that the apply accounts for every GPU it planned."""
    kept = {p.gpu.uuid for p in left} | set(waiting)
    return [GpuResult(p.gpu.index, p.gpu.uuid, GpuStatus.BLOCKED, 0, f"GPU {p.gpu.index}: its layout or owners changed "
                      "while its owner change waited: planned again on the next apply")
            for p in asked if p.gpu.uuid not in kept]


def before_of(p: GpuPlan) -> DesiredLayout:
    """The layout a plan's GPU had when it was planned: what a rollback restores."""
    if not p.gpu.mig_current or p.gpu.model is None:  # (planned GPUs always have a model)
        return DesiredLayout(mig=False)
    return layout_of(p.gpu.model, p.current)
