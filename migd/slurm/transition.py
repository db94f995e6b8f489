"""A MIG layout change on a Slurm node without killing a job.

gres.conf(5): "Drain a node before changing the count of records with the MultipleFiles
parameter ... Failure to do so will result in any job using those GRES being aborted."  So a
switch is: (ahead of time) a MAINT reservation, so no job starts that would run into the
switch; at the transition, drain with a reason naming it; wait until no job holds a GPU of the
node (the daemon's passes come back; nothing blocks); apply through the normal transactional
apply; write gres.conf and the node's Gres=; make Slurm take them; wait until the node has
registered with the new GRES; resume (only if it was serving before migd drained it); drop the
reservation.  If Slurm does not take the new GRES, the files are restored and the caller puts
the old layout back, so the node serves what it served before, never left INVALID.

The state (phase, whether the node was serving, the reservation) is kept in the state dir, so a
restarted migd finishes or undoes what it started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from migd.api.slurm import Phase, SlurmState, SwitchBefore
from migd.apply.result import OnBusy
from migd.apply.statefile import atomic_write_json, atomic_write_text, load
from migd.errors import ValidationError
from migd.hardware.caps import read_minors
from migd.hardware.types import GpuState
from migd.printable import clipped
from migd.slurm.ctl import NodeInfo, Runner, SlurmCtl, SlurmError
from migd.slurm.gres import GresError, GresRecord, gres_conf, node_gres, records, set_node_gres
from migd.slurm.slurmconf import GresUpdate, SlurmSettings

log = logging.getLogger(__name__)
_DRAINED = ("drain", "drained", "draining", "maint")
DRAIN_REASON = "migd: switching MIG layout to "  # how Slurm shows a drain migd made (scontrol show node)
POLL_S = 5.0  # one poll of slurmctld while waiting: a hung one delays a SIGTERM this long at most
BACKOFF_S, BACKOFF_MAX_S = 30.0, 1800.0  # after a failed switch: 30 s, 60 s, ... at most 30 minutes


class Interrupted(Exception):
    """migd is stopping (SIGTERM) while it waits on Slurm: the switch is left where its state file says,
    and the next start finishes it."""


@dataclass(frozen=True)
class GateHooks:
    """What the daemon lends the gate: ``progress`` marks each bounded Slurm step as progress for
    systemd's watchdog; ``stopping`` says migd was asked to stop (SIGTERM), ending a wait early."""

    progress: Callable[[], None] = lambda: None
    stopping: Callable[[], bool] = lambda: False


def load_state(path: Path) -> SlurmState:
    """The switch state a migd left (v1 or v2); a damaged file is said and read as "serving"."""
    try:
        return load(path, SlurmState)
    except FileNotFoundError:
        return SlurmState()
    except ValidationError as e:
        log.error("%s; starting from 'serving' (check the node with scontrol show node)", e)
        return SlurmState()


class SlurmGate:
    """What the daemon asks before and after an apply on a Slurm node."""

    def __init__(self, settings: SlurmSettings, ctl: SlurmCtl, run: Runner, minor_of: Callable[[int], int],
                 state_path: Path, now: Callable[[], datetime], hooks: GateHooks | None = None) -> None:
        self.s = settings
        hooks = hooks or GateHooks()
        self._progress, self._stopping = hooks.progress, hooks.stopping
        self._now = now  # the daemon's clock: reservations are for its transitions
        self.ctl = ctl
        self._run = run
        self._minor_of = minor_of
        self._path = state_path
        self.state = load_state(state_path)
        self._failures = 0  # switches failed in a row: the next waits BACKOFF_S * 2**(n-1), at most BACKOFF_MAX_S
        self._retry_at = 0.0  # (time.monotonic) no new drain before this

    # -- state ------------------------------------------------------------------------------------
    def _set(self, phase: Phase, reason: str) -> None:
        if phase is not self.state.phase:
            self.state.since = time.time()
        self.state.phase, self.state.reason = phase, reason
        atomic_write_json(self._path, self.state)

    # -- ahead of a transition --------------------------------------------------------------------
    def reserve_ahead(self, transition: datetime | None) -> None:
        """A MAINT reservation from the transition on, made ``maintenance_ahead`` before it: Slurm
        then starts no job whose time limit would run into the switch (slurm.conf: reservations)."""
        self._drop_stale_reservation()
        if transition is None or self.state.reservation is not None:
            return
        if (transition - self._now()).total_seconds() > self.s.maintenance_ahead_s:
            return
        name = f"migd-{self.s.node}-{int(transition.timestamp())}"
        self.ctl.reserve(name, transition, int(self.s.maintenance_window_s // 60))
        self.state.reservation, self.state.reserved_for = name, transition.timestamp()
        atomic_write_json(self._path, self.state)
        log.info("Slurm: MAINT reservation %s on %s from %s", name, self.s.node, transition.isoformat())

    def _drop_stale_reservation(self) -> None:
        """A reservation for a transition long past, left when its removal failed: removed (if Slurm still
        has it) and forgotten, or its name would keep every later switch from reserving ahead."""
        at = self.state.reserved_for
        idle = self.state.phase in (Phase.SERVING, Phase.FAILED)
        if self.state.reservation is None or at is None or not idle or at > self._now().timestamp() - 60:
            return
        try:
            if self.state.reservation in self.ctl.reservations():
                self.ctl.unreserve(self.state.reservation)
        except SlurmError as e:
            log.error("Slurm: cannot remove the stale reservation %s: %s", self.state.reservation, e)
            return
        log.info("Slurm: reservation %s (for a transition past) removed", self.state.reservation)
        self.state.reservation, self.state.reserved_for = None, None
        atomic_write_json(self._path, self.state)

    # -- the switch -------------------------------------------------------------------------------
    def ready(self, profile: str, policy: OnBusy = OnBusy.WAIT, force_after_s: float = float("inf")) -> bool:
        """Drain once, then True when no job holds a GPU of the node (the apply may start).

        ``policy`` is the busy policy of migd's apply: refuse (do not drain while GPU jobs run),
        wait (drain and wait for them), force (drain, wait ``force_after_s``, then requeue them:
        ``scontrol requeue`` puts a job back in the queue, it is not lost)."""
        if self.state.phase is Phase.RESUMING:
            return False  # (the last switch's resume is not confirmed, retried at each pass: no new drain before)
        if self.state.phase is Phase.FAILED and time.monotonic() < self._retry_at:
            return False  # (the reason says why it failed and when it tries again)
        if self.state.phase in (Phase.SERVING, Phase.FAILED):
            if not self._may_drain(policy):
                return False
            info = self.ctl.info()  # a drain with migd's own reason is migd's, left by a migd that died
            ours = info.drained and info.reason.startswith(DRAIN_REASON)  # before recording it
            self.state.was_serving = not info.drained or ours
            self.state.profile = profile
            if self.state.was_serving:  # an operator's drain, and its reason, stay the operator's
                self.ctl.drain(f"{DRAIN_REASON}{profile}")
            self._set(Phase.DRAINING, f"drained to switch to {profile}")
            log.info("Slurm: drained %s to switch to %s", self.s.node, profile)
        jobs = [j for j in self.ctl.jobs() if j.uses_gpus]
        if jobs and policy is OnBusy.FORCE and time.time() - self.state.since >= force_after_s:
            for j in jobs:
                self.ctl.requeue(j.id)
            log.warning("Slurm: requeued job(s) %s after waiting %.0fs (on_busy: force)",
                        ",".join(j.id for j in jobs), force_after_s)
            jobs = [j for j in self.ctl.jobs() if j.uses_gpus]
        self.state.jobs_waiting = len(jobs)
        if jobs:
            self._set(Phase.DRAINING, f"waiting for {len(jobs)} job(s) holding GPUs: "
                      + ",".join(j.id for j in jobs[:10]))
            return False
        if not self.ctl.info().drained:  # checked after the jobs: a drained node starts none in between
            why = (f"the node was resumed (by an operator?) while migd waited to switch to {profile}: not "
                   "switched, as a job may start on it any moment; migd drains it again at its next pass")
            log.warning("Slurm: %s", why)
            self._set(Phase.FAILED, why)
            return False
        self._set(Phase.SWITCHING, f"switching to {profile}")
        return True

    def _may_drain(self, policy: OnBusy) -> bool:
        slot = self._wave_slot()
        if slot is None and policy is OnBusy.REFUSE:
            jobs = [j for j in self.ctl.jobs() if j.uses_gpus]
            if jobs:
                slot = (f"refused: {len(jobs)} job(s) hold GPUs ({','.join(j.id for j in jobs[:10])}) and on_busy "
                        "is refuse; the node was not drained")
        if slot is not None:
            self.state.reason = slot
            log.info("Slurm: %s", slot)
            return False
        return True

    def _wave_slot(self) -> str | None:
        """None when this node may drain now; else why not (fleet waves, read from Slurm itself)."""
        if self.s.max_in_maintenance is None or self.s.partition is None:
            return None
        states = self.ctl.partition_states(self.s.partition)
        busy = sorted(n for n, st in states.items() if n != self.s.node and st.rstrip("*~#!%$@^-").lower()
                      in _DRAINED)
        if len(busy) < self.s.max_in_maintenance:
            return None
        return (f"waiting for a maintenance slot: {len(busy)} node(s) of partition {self.s.partition} are "
                f"drained ({','.join(busy[:5])}), max_in_maintenance is {self.s.max_in_maintenance}")

    def record_before(self, before: dict[str, SwitchBefore]) -> None:
        """The GPUs' layouts before the switch changes them, on disk before the first change: a failed
        publish puts them back, in this migd or in the next one."""
        self.state.before = before
        atomic_write_json(self._path, self.state)

    def publish(self, profile: str, states: Sequence[GpuState]) -> None:
        """Write the layout's GRES and make Slurm take it; on failure the old files are back (raises)."""
        recs = self._records(states)
        gres = node_gres(recs)
        old_gres = _read_conf(self.s.gres_conf) if self.s.gres_conf.exists() else None
        old_conf = _read_conf(self.s.slurm_conf)
        try:
            self._write(self.s.gres_conf, gres_conf(self.s.node, recs, profile, old_gres))
            self._write(self.s.slurm_conf, set_node_gres(old_conf, self.s.node, gres))
            self._take()
            self._await_registration(gres)
        except (SlurmError, GresError, OSError) as e:
            log.error("Slurm did not take the GRES of %s (%s); restoring the previous files", profile, e)
            self._restore(old_gres, old_conf)
            raise SlurmError(str(e)) from None
        self.state.gres_in_sync = True
        log.info("Slurm: %s registered with Gres=%s", self.s.node, gres)

    def _records(self, states: Sequence[GpuState]) -> list[GresRecord]:
        return records(states, self._minor_of, read_minors(self.s.mig_minors), self.s.device_dir)

    def check_sync(self, states: Sequence[GpuState]) -> None:
        """Whether Slurm's view of the node's GRES matches the layout there (someone may have edited
        slurm.conf, or a switch was interrupted): reported, never corrected behind Slurm's back."""
        try:
            want = node_gres(self._records(states))
            have = self.ctl.info().gres
        except (SlurmError, GresError, OSError) as e:
            log.warning("Slurm: cannot compare the node's GRES with its layout: %s", e)
            self.state.gres_in_sync = None
            return
        in_sync = _same_gres(have, want)
        if not in_sync and self.state.gres_in_sync is not False:
            log.error("Slurm: node %s has Gres=%s but its MIG layout is Gres=%s", self.s.node, have, want)
        self.state.gres_in_sync = in_sync

    def _restore(self, old_gres: str | None, old_conf: str) -> None:
        try:
            if old_gres is None:
                self.s.gres_conf.unlink(missing_ok=True)
            else:
                self._write(self.s.gres_conf, old_gres)
            self._write(self.s.slurm_conf, old_conf)
            self._take()
        except (SlurmError, OSError) as e:
            log.critical("Slurm: restoring the previous GRES files failed too: %s", e)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        atomic_write_text(path, text, mode, errors=_SLURM_BYTES)

    def _take(self) -> None:
        """Make Slurm read the files, the way this node's Slurm supports (settings.GresUpdate)."""
        if self.s.update is GresUpdate.RECONFIGURE:
            self._step(("scontrol", "reconfigure"))
            return
        self._step(self.s.stop_slurmd)
        try:
            if self.s.update is GresUpdate.DYNAMIC:
                self.ctl.delete_node()
            else:
                self._step(self.s.restart_slurmctld)
                self._until(lambda: self.ctl.ping(POLL_S), "slurmctld to answer")
        except BaseException:  # slurmd is started again whatever failed once it was stopped: never left down
            try:
                self._step(self.s.start_slurmd)
            except SlurmError as e:
                log.critical("Slurm: slurmd could not be started again: %s", e)
            raise
        self._step(self.s.start_slurmd)

    def _step(self, argv: Sequence[str]) -> None:
        self._progress()  # each command is bounded by command_timeout, below the watchdog's limit
        self._run(argv, self.s.command_timeout_s)

    def _await_registration(self, gres: str) -> None:
        last: list[NodeInfo] = []

        def registered() -> bool:
            try:
                info = self.ctl.info(POLL_S)
            except SlurmError:
                return False
            last[:] = [info]
            return info.registered and _same_gres(info.gres, gres)
        self._until(registered, f"{self.s.node} to register with Gres={gres}",
                    lambda: f" (last seen: state {'+'.join(sorted(last[0].states))}, Gres={last[0].gres})"
                    if last else "")

    def _until(self, ok: Callable[[], bool], what: str, detail: Callable[[], str] = lambda: "") -> None:
        """Poll until ``ok`` (bounded by register_timeout, below the watchdog's limit); SIGTERM ends it."""
        self._progress()
        deadline = time.monotonic() + self.s.register_timeout_s
        while not ok():
            if self._stopping():
                raise Interrupted(f"migd is stopping while waiting for {what}")
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out after {self.s.register_timeout_s:g}s waiting for {what}{detail()}")
            time.sleep(0.2)

    def _comment(self, ok: bool, reason: str, info: NodeInfo) -> None:
        """A failed switch leaves its reason on the node in Slurm (``scontrol show node``: Comment),
        since the resumed node has no drain Reason; a later success clears only migd's own comment."""
        if not ok:
            self.ctl.set_comment(_short(f"migd: {reason}"))
        elif info.comment.startswith("migd:"):
            self.ctl.set_comment("")

    def finish(self, ok: bool, reason: str, agree: bool = True) -> None:
        """The switch is over: resume the node (if it was serving) and drop the reservation, whatever the
        outcome; unless its GRES and its GPUs disagree (``agree`` False: the old layout could not be put
        back under the old GRES): then it stays drained, its reason naming the mismatch, until a switch
        that agrees.  The outcome is recorded first (phase ``resuming``); the steps are retried at each
        pass (``conclude``) until Slurm confirms them, and only then is the node called serving."""
        self._failures = 0 if ok else self._failures + 1
        if not ok:  # a persistent error (gres.conf not writable) must not drain and switch in a tight loop
            delay = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            reason = f"{reason}; next try in {delay:.0f}s"
        self.state.jobs_waiting = 0
        self.state.ended_ok, self.state.ended_reason, self.state.agree = ok, reason, agree
        self._set(Phase.RESUMING, f"{reason}; resuming the node")
        self.conclude()

    def conclude(self) -> bool:
        """The ended switch's Slurm steps, each confirmed by Slurm; False (retried at the next pass) while
        one fails (slurmctld down or restarting)."""
        if self.state.phase is not Phase.RESUMING:
            return True
        try:
            self._progress()
            info = self.ctl.info()  # one reading for the comment and the resume (a comment changes neither)
            self._comment(bool(self.state.ended_ok), self.state.ended_reason, info)
            if not self.state.agree:
                self._hold_drained()
            elif self.state.was_serving:
                self._resume(info)
            self._unreserve_due()
        except SlurmError as e:
            why = f"{self.state.ended_reason}; Slurm has not confirmed the node's resume: {e}; retried at each pass"
            if why != self.state.reason:
                log.error("Slurm: %s", why)
                self._set(Phase.RESUMING, why)
            return False
        ok = bool(self.state.ended_ok)
        self.state.before, self.state.ended_ok = {}, None
        self._set(Phase.SERVING if ok else Phase.FAILED, self.state.ended_reason)
        return True

    def _hold_drained(self) -> None:
        self.ctl.drain(_short(f"{DRAIN_REASON}{self.state.profile}: its GRES and its GPUs disagree after a "
                              "failed switch (migctl daemon says why)"))
        info = self.ctl.info()
        if not (info.drained and info.reason.startswith(DRAIN_REASON)):
            raise SlurmError(f"the node is not drained after scontrol update state=drain (State={_states(info)})")

    def _resume(self, info: NodeInfo) -> None:
        if info.drained and info.reason.startswith(DRAIN_REASON):  # (not an operator's drain made since)
            self.ctl.resume()
            info = self.ctl.info()
        if info.drained and info.reason.startswith(DRAIN_REASON):
            raise SlurmError(f"the node is still drained after scontrol update state=resume (State={_states(info)})")

    def _unreserve_due(self) -> None:
        due = self.state.reserved_for is not None and self.state.reserved_for <= self._now().timestamp() + 60
        if self.state.reservation is None or not due:  # (not one made for the next transition)
            return
        if self.state.reservation in self.ctl.reservations():
            self.ctl.unreserve(self.state.reservation)
        self.state.reservation, self.state.reserved_for = None, None


def _states(info: NodeInfo) -> str:
    return "+".join(sorted(info.states))


def _short(text: str) -> str:
    return clipped(text, 197)  # Slurm's reason and comment fields, kept to 200 characters


def _same_gres(a: str, b: str) -> bool:
    """Slurm may print the GRES with socket/index details (``gpu:1g.10gb:2(S:0)``): compare counts."""
    def norm(s: str) -> list[str]:
        return sorted(part.split("(")[0] for part in s.split(",") if part)
    return norm(a) == norm(b)


# slurm.conf and gres.conf are bytes to Slurm (its parser never decodes them), so an operator's
# Latin-1 comment must neither stop a switch nor be "fixed": any byte is read and written back as is.
_SLURM_BYTES = "surrogateescape"


def _read_conf(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors=_SLURM_BYTES)
