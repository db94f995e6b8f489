"""Transactional apply, shared by ``migctl`` and the daemon.

Plan every GPU first (bad input or an impossible layout stops here, nothing touched);
refuse, wait for or (explicitly) stop processes on instances that would be destroyed;
journal the previous layout; change GPUs in parallel; verify; on any failure put that GPU
back to its previous layout.  A journal left by a crash is resolved before the next apply.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from migd.apply.hooks import Hooks
from migd.apply.journal import Journal, layout_from_json, layout_to_json
from migd.apply.lock import ApplyLock
from migd.apply.owners import Owners
from migd.hardware.backend import GpuBackend, GpuInfo, GpuInstance, HardwareError
from migd.planner import Busy, GpuPlan, Op, PlanError, layout_of, plan_gpu
from migd.profiles.model import Profile
from migd.profiles.resolve import DesiredLayout, resolve_section

log = logging.getLogger(__name__)


class BusyError(Exception):
    """Instances that would be destroyed have running processes."""

    def __init__(self, message: str, blocked: list[Op]) -> None:
        super().__init__(message)
        self.blocked = blocked


class GpuUnhealthy(Exception):
    pass


@dataclass
class ApplyOptions:
    on_busy: str = "refuse"  # refuse | wait | force
    busy_timeout_s: float = 300.0
    dry_run: bool = False
    parallel: bool = True
    hooks: Hooks = field(default_factory=Hooks)
    lock_timeout_s: float = 0.0
    poll_s: float = 1.0
    kill_grace_s: float = 10.0
    unhealthy: Callable[[], dict[str, str]] | None = None  # uuid -> reason: reconfiguration refused
    partial: bool = False  # GPUs busy instances block are left (status "blocked"); the others go ahead
    cancel: threading.Event | None = None  # set (SIGTERM): stop waiting; roll back the GPU being changed


@dataclass
class GpuResult:
    index: int
    uuid: str
    status: str  # unchanged | applied | rolled_back | failed | would_change | blocked
    ops: int = 0
    error: str | None = None
    seconds: float = 0.0


@dataclass
class ApplyResult:
    profile: str
    plans: list[GpuPlan]
    results: list[GpuResult]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.status in ("unchanged", "applied", "would_change") for r in self.results)


def _blocked_text(ops: list[Op]) -> str:
    return "; ".join(o.describe() for o in ops)


class Applier:
    """Plans and applies profiles on one node.  ``state_dir`` holds the lock, journal and owners."""

    def __init__(self, backend: GpuBackend, state_dir: Path) -> None:
        self.backend = backend
        self.state_dir = Path(state_dir)
        self.journal = Journal(self.state_dir / "journal.json")
        self.owners = Owners(self.state_dir / "owners.json")
        self._cancel: threading.Event | None = None

    def lock(self, timeout_s: float = 0.0) -> ApplyLock:
        return ApplyLock(self.state_dir / "apply.lock", timeout_s)

    # -- planning ---------------------------------------------------------------------------------
    def snapshot(self, gpu: GpuInfo) -> tuple[list[GpuInstance], Busy, tuple[int, ...]]:
        """Current GIs, busy map (GI -> CI -> pids) and non-MIG pids of one GPU."""
        i = gpu.index
        if not gpu.mig_current:
            return [], {}, tuple(sorted(p.pid for p in self.backend.gpu_processes(i)))
        busy: Busy = {}
        for d in self.backend.list_mig_devices(i):
            if d.processes:
                busy.setdefault(d.gi_id, {})[d.ci_id] = tuple(sorted(p.pid for p in d.processes))
        return self.backend.list_gpu_instances(i), busy, ()

    def plan(self, profile: Profile) -> list[GpuPlan]:
        plans = []
        for gpu in self.backend.list_gpus():
            section = profile.section_for(gpu)
            if section is None:
                continue
            if gpu.model is None:
                raise section.loc.error(f"selects GPU {gpu.index} ({gpu.name}), which is not a known MIG-capable "
                                        "model")
            desired = resolve_section(section, gpu.model)
            plans.append(self.plan_layout(gpu, desired, where=f"{profile.source}: "))
        return plans

    def plan_layout(self, gpu: GpuInfo, desired: DesiredLayout, where: str = "") -> GpuPlan:
        current, busy, pids = self.snapshot(gpu)
        try:
            return plan_gpu(gpu, desired, current, busy, self.owners.for_gpu(gpu.uuid), pids)
        except PlanError as e:
            raise PlanError(f"{where}GPU {gpu.index} ({gpu.model_key}): {e}") from None

    # -- applying ---------------------------------------------------------------------------------
    def apply(self, profile: Profile, opts: ApplyOptions | None = None) -> ApplyResult:
        opts = opts or ApplyOptions()
        with self.lock(opts.lock_timeout_s):
            self.recover_locked()
            return self._apply_locked(profile, opts)

    def _apply_locked(self, profile: Profile, opts: ApplyOptions) -> ApplyResult:
        t0 = time.monotonic()
        plans = self.plan(profile)
        if opts.dry_run:
            return ApplyResult(profile.name, plans, [
                GpuResult(p.gpu.index, p.gpu.uuid, "would_change" if p.changes else "unchanged", len(p.ops))
                for p in plans])
        plans, blocked = self._settle_busy(profile, plans, opts)
        changing = [p for p in plans if p.changes]
        unhealthy = opts.unhealthy() if opts.unhealthy else {}
        bad = [f"GPU {p.gpu.index}: {unhealthy[p.gpu.uuid]}" for p in changing if p.gpu.uuid in unhealthy]
        if bad:
            raise GpuUnhealthy("reconfiguration refused on unhealthy GPUs: " + "; ".join(bad))
        results = [GpuResult(p.gpu.index, p.gpu.uuid, "unchanged") for p in plans if not p.changes]
        results += [GpuResult(p.gpu.index, p.gpu.uuid, "blocked", len(p.ops), _blocked_text(p.blocked))
                    for p in blocked]
        if changing:
            results += self._run(profile, changing, opts)
        for p in plans:  # owner labels can change without any NVML operation
            if not p.changes and p.targets:
                self.owners.set_gpu(p.gpu.uuid, {t.placement.start: t.owner for t in p.targets if t.owner})
        results.sort(key=lambda r: r.index)
        return ApplyResult(profile.name, plans, results, time.monotonic() - t0)

    def _settle_busy(self, profile: Profile, plans: list[GpuPlan],
                     opts: ApplyOptions) -> tuple[list[GpuPlan], list[GpuPlan]]:
        """Wait for (or force) busy instances as ``opts`` says: (plans to run, plans left blocked).

        Without ``opts.partial`` any blocked GPU stops the whole apply (BusyError); with it, only that
        GPU waits and the others are applied now."""
        deadline = time.monotonic() + opts.busy_timeout_s
        killed = False
        while True:
            blocked = [o for p in plans for o in p.blocked]
            if not blocked:
                return plans, []
            stop = None
            if opts.cancel is not None and opts.cancel.is_set():
                stop = f"stopped while waiting for busy instances: {_blocked_text(blocked)}"
            elif opts.on_busy == "refuse":
                stop = f"instances with running processes would be destroyed: {_blocked_text(blocked)}"
            elif opts.on_busy == "wait" and time.monotonic() >= deadline:
                stop = f"instances still busy after {opts.busy_timeout_s:g}s: {_blocked_text(blocked)}"
            if stop is not None and opts.partial:
                return [p for p in plans if not p.blocked], [p for p in plans if p.blocked]
            if stop is not None:
                raise BusyError(stop, blocked)
            if opts.on_busy == "force" and not killed:
                self._stop_processes(sorted({pid for o in blocked for pid in o.busy_pids}), opts.kill_grace_s)
                killed = True
            elif opts.on_busy == "force" and time.monotonic() >= deadline:
                raise BusyError(f"instances still busy after SIGKILL: {_blocked_text(blocked)}", blocked)
            else:
                time.sleep(opts.poll_s)
            plans = self.plan(profile)

    def _stop_processes(self, pids: list[int], grace_s: float) -> None:
        """--on-busy force: SIGTERM, wait, then SIGKILL.  Logged loudly: this ends someone's work."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                log.warning("on-busy=force: sending %s to pid %d", sig.name, pid)
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                except PermissionError as e:
                    log.error("cannot signal pid %d: %s", pid, e)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                alive = {p.pid for g in self.backend.list_gpus() for p in self.backend.gpu_processes(g.index)}
                if not alive & set(pids):
                    return
                time.sleep(0.1)

    def _run(self, profile: Profile, plans: list[GpuPlan], opts: ApplyOptions) -> list[GpuResult]:
        env = {"MIGD_PROFILE": profile.name, "MIGD_GPUS": ",".join(str(p.gpu.index) for p in plans)}
        owners = self.owners.load()
        befores = [(self._before(p), owners.get(p.gpu.uuid, {})) for p in plans]  # what a rollback restores
        self.journal.begin(profile.name, {p.gpu.uuid: {
            "index": p.gpu.index, "status": "pending", "done": 0, "ops": len(p.ops),
            "before": layout_to_json(before),
            "owners_before": {str(k): v for k, v in owners_before.items()}}
            for p, (before, owners_before) in zip(plans, befores, strict=True)})
        results: list[GpuResult] = []
        self._cancel = opts.cancel
        try:
            opts.hooks.run("apply-start", env)
            if any(o.kind == "set_mig" for p in plans for o in p.ops):
                opts.hooks.run("pre-apply-mode", env)
            opts.hooks.run("pre-apply-config", env)
            if opts.parallel and len(plans) > 1:
                with ThreadPoolExecutor(max_workers=len(plans), thread_name_prefix="migd-gpu") as pool:
                    results = list(pool.map(self._run_gpu, plans, befores))
            else:
                results = [self._run_gpu(p, b) for p, b in zip(plans, befores, strict=True)]
        finally:
            # Keep the journal while any GPU is left half-way: the next start retries its rollback.
            settled = len(results) == len(plans) and all(r.status in ("applied", "rolled_back") for r in results)
            if settled or not results:  # (no results: a hook refused before any GPU was touched)
                self.journal.finish()
            ok = bool(results) and all(r.status == "applied" for r in results)
            opts.hooks.run("apply-exit", {**env, "MIGD_RESULT": "success" if ok else "failure"})
        return results

    @staticmethod
    def _before(p: GpuPlan) -> DesiredLayout:
        assert p.gpu.model is not None
        if not p.gpu.mig_current:
            return DesiredLayout(mig=False)
        return layout_of(p.gpu.model, p.current)

    def _exec(self, op: Op, gi_ids: dict[int, int]) -> bool:
        b, i = self.backend, op.gpu
        if op.kind == "destroy_ci":
            assert op.gi_id is not None and op.ci_id is not None
            b.destroy_compute_instance(i, op.gi_id, op.ci_id)
        elif op.kind == "destroy_gi":
            assert op.gi_id is not None
            b.destroy_gpu_instance(i, op.gi_id)
        elif op.kind == "set_mig":
            assert op.mig is not None
            return b.set_mig_mode(i, op.mig)
        elif op.kind == "reset":
            b.reset_gpu(i)
        elif op.kind == "create_gi":
            assert op.profile_id is not None and op.placement is not None and op.gi_start is not None
            gi_ids[op.gi_start] = b.create_gpu_instance(i, op.profile_id, op.placement)
        elif op.kind == "create_ci":
            assert op.profile_id is not None and op.gi_start is not None
            b.create_compute_instance(i, gi_ids[op.gi_start], op.profile_id, op.placement)
        return True

    def _execute_ops(self, plan: GpuPlan, journal_uuid: str | None = None) -> int:
        """Run a plan's operations; ``journal_uuid`` marks a forward apply (journaled, cancellable)."""
        gi_ids = {g.placement.start: g.id for g in plan.current}
        done, mode_applied = 0, False
        for op in plan.ops:
            if journal_uuid is not None and self._cancel is not None and self._cancel.is_set():
                raise HardwareError(f"GPU {op.gpu}: apply cancelled (migd is stopping)", gpu=op.gpu)
            if op.kind == "reset" and mode_applied:
                continue  # the mode change took effect without a reset (Hopper)
            applied = self._exec(op, gi_ids)
            if op.kind == "set_mig":
                mode_applied = applied
            done += 1
            if journal_uuid is not None:
                self.journal.update(journal_uuid, done=done, status="applying")
        self._verify(plan)
        return done

    def _verify(self, plan: GpuPlan) -> None:
        gpu = self.backend.gpu(plan.gpu.index)
        if gpu.mig_current != plan.desired.mig:
            raise HardwareError(f"GPU {gpu.index}: MIG mode is {'on' if gpu.mig_current else 'off'} after apply",
                                gpu=gpu.index)
        if not gpu.mig_current:
            return
        actual = sorted((g.profile_id, g.placement.start, tuple(sorted((c.profile_id, c.placement.start)
                                                                      for c in g.compute_instances)))
                        for g in self.backend.list_gpu_instances(gpu.index))
        want = sorted((t.gi_profile_id, t.placement.start, tuple(sorted((pid, pl.start) for pid, pl in t.ci)))
                      for t in plan.targets)
        if actual != want:
            raise HardwareError(f"GPU {gpu.index}: layout after apply differs from the plan: {actual} != {want}",
                                gpu=gpu.index)

    def _run_gpu(self, plan: GpuPlan, before: tuple[DesiredLayout, dict[int, str]]) -> GpuResult:
        t0 = time.monotonic()
        uuid, i = plan.gpu.uuid, plan.gpu.index
        try:
            done = self._execute_ops(plan, uuid)
        except HardwareError as e:
            log.error("GPU %d: apply failed (%s); rolling back to the previous layout", i, e)
            return self._rollback(plan.gpu, *before, str(e), t0)
        self.owners.set_gpu(uuid, {t.placement.start: t.owner for t in plan.targets if t.owner})
        self.journal.update(uuid, status="done")
        log.info("GPU %d: applied %d operations in %.2fs", i, done, time.monotonic() - t0)
        return GpuResult(i, uuid, "applied", done, None, time.monotonic() - t0)

    def _rollback(self, gpu: GpuInfo, before: DesiredLayout, owners_before: dict[int, str], why: str,
                  t0: float) -> GpuResult:
        try:
            plan = self.plan_layout(self.backend.gpu(gpu.index), before)
            self._execute_ops(plan)
        except (HardwareError, PlanError) as e2:
            msg = (f"{why}; ROLLBACK FAILED: {e2}. GPU {gpu.index} is in an intermediate layout; the journal "
                   "keeps the previous layout and the next apply or daemon start retries the rollback")
            log.critical("GPU %d: %s", gpu.index, msg)
            if self.journal.data:
                self.journal.update(gpu.uuid, status="failed", error=msg)
            return GpuResult(gpu.index, gpu.uuid, "failed", 0, msg, time.monotonic() - t0)
        self.owners.set_gpu(gpu.uuid, owners_before)
        if self.journal.data:
            self.journal.update(gpu.uuid, status="rolled_back", error=why)
        log.warning("GPU %d: rolled back to its previous layout", gpu.index)
        return GpuResult(gpu.index, gpu.uuid, "rolled_back", 0, why, time.monotonic() - t0)

    # -- crash recovery ---------------------------------------------------------------------------
    def recover(self) -> list[GpuResult]:
        with self.lock():
            return self.recover_locked()

    def recover_locked(self) -> list[GpuResult]:
        """Resolve a journal left by a process that died mid-apply: restore each unfinished GPU."""
        if not self.journal.exists():
            return []
        data = self.journal.load()
        log.warning("found an unfinished apply of %r by pid %s: restoring the previous layouts",
                    data.get("profile"), data.get("pid"))
        by_uuid = {g.uuid: g for g in self.backend.list_gpus()}
        results = []
        for uuid, entry in data["gpus"].items():
            if entry["status"] in ("done", "rolled_back") or uuid not in by_uuid:
                continue
            gpu = by_uuid[uuid]
            assert gpu.model is not None
            before = layout_from_json(gpu.model, entry["before"])
            owners = {int(k): v for k, v in entry.get("owners_before", {}).items()}
            results.append(self._rollback(gpu, before, owners, "recovered after an interrupted apply",
                                          time.monotonic()))
        if all(r.status == "rolled_back" for r in results):
            self.journal.finish()
        return results
