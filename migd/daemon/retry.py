"""Which GPUs a pass changes: drift, a failed change's next try, or none while it waits out its backoff.

The loop is level-triggered: each pass plans every GPU against the active profile, so a GPU that an
apply has just rolled back differs from the profile exactly as a hand-made change would, and its own
MIG-config-change events bring the next pass at once.  Taken for drift, such a GPU was destroyed,
failed, rolled back and re-created about a dozen times a second for as long as the cause lasted (a
full state directory, an NVML error, a hook that fails).  Here a GPU whose change failed (rolled back,
failed, or the apply refused after it was planned: a hook, the journal) is "failed", not "drifted":
it is left alone for ``BACKOFF_S``, doubling with each failed attempt in a row up to
``BACKOFF_MAX_S``, counted in the daemon's clock as ``reconcile_interval`` and ``busy_timeout`` are.
A success on the GPU, the GPU found as asked, or a desired layout other than the one that failed ends
the backoff; a manual apply does not wait for it (its success ends it too).  Each attempt is logged
once, with its cause; the same cause again is counted in that line, not repeated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from migd.api.daemon import Progress
from migd.apply.relabel import relabelled
from migd.apply.result import ApplyResult, GpuStatus
from migd.plan.planner import GpuPlan, layout_text, summary
from migd.plan.requests import DesiredLayout
from migd.state.live import Status

log = logging.getLogger("migd")
BACKOFF_S, BACKOFF_MAX_S = 10.0, 600.0  # in the daemon's clock: 10 s, 20 s, 40 s, ... at most 10 minutes
_WORDS = {GpuStatus.ROLLED_BACK: "rolled back", GpuStatus.FAILED: "failed"}
REFUSED = "refused"


def log_drift(profile: str, plans: Iterable[GpuPlan], then: str) -> None:
    """Drift said as drift, with what changed: what each GPU holds and what the profile wants."""
    for p in plans:
        if p.changes:
            log.warning("drift on GPU %d: it holds %s, profile %s wants %s; %s", p.gpu.index, layout_text(p.current,
                        p.gpu), profile, summary(p.desired.instances) if p.desired.mig else "MIG disabled", then)


@dataclass
class Failure:
    """A GPU's change that failed, attempt after attempt: Unix times to show, a monotonic one decides."""

    index: int
    desired: DesiredLayout  # the layout that failed: another one is tried at once
    cause: str
    count: int  # attempts in a row that failed
    last: float  # Unix time of the latest
    next_try: float  # Unix time of the next
    due: float  # the same moment on time.monotonic()
    same: int = 1  # of them, the latest in a row with this very cause


@dataclass(frozen=True)
class Choice:
    """What a pass applies (``plans``; ``pending``: those that change something) and why."""

    plans: list[GpuPlan]
    pending: list[GpuPlan]
    reason: str


class Retries:
    """Each GPU's failed change (by UUID) and when it is tried again; ``real`` turns the daemon's
    seconds into real ones (``Clock.real``)."""

    def __init__(self, real: Callable[[float], float]) -> None:
        self._real = real
        # Replaced, never changed in place: the loop's thread reads it while a manual apply's thread records
        self.failures: dict[str, Failure] = {}
        self._looked = 0.0  # (time.monotonic) the last pass: a retry due before it was looked at

    def failure(self, plan: GpuPlan) -> Failure | None:
        """The GPU's failed change to this very layout (None: none, or the profile now asks another)."""
        f = self.failures.get(plan.gpu.uuid)
        return f if f is not None and f.desired == plan.desired else None

    def held(self, plan: GpuPlan) -> bool:
        f = self.failure(plan)
        return f is not None and time.monotonic() < f.due

    def due_in_s(self) -> float | None:
        """Real seconds until a retry comes due that no pass has begun after (0: one is due now; None:
        none waits), so a retry wakes the loop once, whatever that pass then does."""
        now = time.monotonic()
        return min((max(0.0, f.due - now) for f in self.failures.values() if f.due > self._looked), default=None)

    def woke(self) -> None:
        """A pass begins: every retry already due is its to try."""
        self._looked = time.monotonic()

    def look(self, plans: list[GpuPlan], pending: Collection[str]) -> None:
        """A pass planned ``plans`` (``pending``: the UUIDs of those that change something): a GPU found as
        asked, not planned, or asked for another layout now starts afresh."""
        asked = {p.gpu.uuid: p.desired for p in plans if p.gpu.uuid in pending}
        self.failures = {u: f for u, f in self.failures.items() if asked.get(u) == f.desired}

    def done(self, profile: str, result: ApplyResult, manual: bool = False) -> None:
        """Count an apply's outcome per GPU: a success ends a backoff, a failure starts or doubles it (a
        manual apply's failure is said, and leaves the schedule's backoff as it was)."""
        plans = {p.gpu.uuid: p for p in result.plans}
        failed: list[tuple[GpuPlan, str, str]] = []
        for r in result.results:
            if r.status in (GpuStatus.APPLIED, GpuStatus.UNCHANGED):
                f = self.failures.get(r.uuid)
                self.failures = {u: old for u, old in self.failures.items() if u != r.uuid}
                if f is not None and r.status is GpuStatus.APPLIED:
                    log.info("GPU %d: %s applied after %d failed attempt(s)", r.index, profile, f.count)
            elif r.status in _WORDS and r.uuid in plans:
                failed.append((plans[r.uuid], _WORDS[r.status], r.error or "no reason given"))
        if manual:
            for p, word, cause in failed:
                log.error("GPU %d: manual apply of %s %s: %s", p.gpu.index, profile, word, cause)
        else:
            self._failed(profile, failed)

    def refused(self, profile: str, plans: list[GpuPlan], cause: str) -> None:
        """The apply was refused after these GPUs were planned (a hook, the journal): each failed."""
        self._failed(profile, [(p, REFUSED, cause) for p in plans])

    def _failed(self, profile: str, failed: list[tuple[GpuPlan, str, str]]) -> None:
        lines: dict[tuple[str, str, int, float], list[int]] = {}  # one line per cause, naming its GPUs
        for p, word, cause in failed:
            f = self._count(p, cause)
            said = cause.removeprefix(f"GPU {p.gpu.index}: ")  # (the line names its GPUs)
            key = (word, said if f.same == 1 else "", f.same, self._delay(f.count))
            lines.setdefault(key, []).append(p.gpu.index)
        for (word, cause, same, delay), gpus in lines.items():
            who = ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, sorted(gpus)))
            if cause:
                log.error("%s: change to %s %s: %s; next try in %gs", who, profile, word, cause, delay)
            else:
                log.warning("%s: change to %s %s again, same cause (%d attempts in a row); next try in %gs", who,
                            profile, word, same, delay)

    def _count(self, p: GpuPlan, cause: str) -> Failure:
        old = self.failure(p)
        count = old.count + 1 if old else 1
        same = old.same + 1 if old and old.cause == cause else 1
        delay, now = self._real(self._delay(count)), time.time()
        f = Failure(p.gpu.index, p.desired, cause, count, now, now + delay, time.monotonic() + delay, same)
        self.failures = {**self.failures, p.gpu.uuid: f}
        return f

    @staticmethod
    def _delay(count: int) -> float:
        return min(BACKOFF_MAX_S, BACKOFF_S * (1 << min(count - 1, 16)))


def choose(retries: Retries, status: Status, plans: list[GpuPlan], owners: Mapping[str, Mapping[int, str]],
           profile: str, reason: str, correct: bool, manual: bool = False) -> Choice:
    """What a pass applies.  A manual apply: every plan, at once.  A scheduled pass: a GPU whose failed
    change waits out its backoff is left alone, one whose next try is due is tried again, one that waits
    for busy instances looks again; drift is said, and corrected or only reported, only of the GPUs
    changed behind migd's back.  ``owners``: the labels now (a GPU whose owners alone change is applied)."""
    pending = {p.gpu.uuid for p in plans if p.changes} | {p.gpu.uuid for p in relabelled(plans, owners)}
    if manual:
        return Choice(plans, [p for p in plans if p.gpu.uuid in pending], reason)
    retries.look(plans, pending)
    free = [p for p in plans if not retries.held(p)]
    # A GPU waiting for busy instances is migd's own change under way, not drift, in report mode too: it
    # is looked at again (and switched once they end), never said or left as drifted.  So is one a fault
    # mark holds where it is (and, once the mark is cleared, its change to the profile).
    held_back = {g.uuid for g in status.with_progress(Progress.WAITING, Progress.FAULTED).values()}
    ours = {p.gpu.uuid for p in free if retries.failure(p)} | held_back | set(status.unhealthy.snapshot())
    drift = [p for p in free if p.changes and p.gpu.uuid not in ours]
    if not correct:
        log_drift(profile, drift, "reconcile: report, not corrected")
        free = [p for p in free if not p.changes or p.gpu.uuid in ours]
    elif reason == "reconcile":
        log_drift(profile, drift, "correcting it")
    if reason == "reconcile" and not (correct and drift) and any(p.gpu.uuid in ours for p in free):
        reason = "retry"  # (said as such: "drift corrected" only of drift)
    return Choice(free, [p for p in free if p.gpu.uuid in pending], reason)
