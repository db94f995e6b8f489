"""What the daemon says of an apply: the one log line of its outcome, the ``last_apply`` it shows, and a
manual apply while it waits inside migd for busy instances (``migctl daemon`` shows it, and its PIDs).

An apply in which some GPUs switched and one waits for busy work is counted ``blocked`` (its worst GPU,
as ``migd_applies_total`` has it), but said for what it is: N GPU(s) changed, GPU k waiting for PIDs ...
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from migd.api.daemon import Applying, LastApply, Outcome
from migd.apply.result import ApplyResult, BusyError, GpuStatus
from migd.daemon.progress import blocked_pids
from migd.profiles.model import Profile
from migd.report import signals
from migd.state.live import Status

log = logging.getLogger("migd")


def say(profile: str, result: ApplyResult, outcome: Outcome, trigger: str) -> None:
    """The apply's one line (a GPU that failed was said by Retries.done; a wait by the Tracker)."""
    manual = trigger == "manual"
    if outcome is Outcome.SUCCESS and trigger == "reconcile":
        log.info("drift corrected: profile %s restored in %.2fs", profile, result.seconds)
    elif outcome is Outcome.SUCCESS:
        log.info("applied profile %s (%s) in %.2fs", profile, trigger, result.seconds)
    elif outcome is Outcome.CANCELLED:
        log.warning("%s of %s cancelled: every GPU it changed is back on its previous layout",
                    "manual apply" if manual else "apply", profile)
    elif outcome is Outcome.UNCHANGED:
        log.info("profile %s (%s): every GPU already as asked, nothing to change", profile, trigger)
    elif outcome is Outcome.BLOCKED and manual:
        log.warning("manual apply of %s: %d GPU(s) changed; %s", profile, _changed(result), "; ".join(
            [f"GPU {i} waits for PIDs {', '.join(map(str, p))}" for i, p in blocked_pids(result).items()]
            + [f"GPU {r.index} not changed: {r.error}" for r in result.results if r.status is GpuStatus.FAULTED]))


def _changed(result: ApplyResult) -> int:
    return sum(1 for r in result.results if r.status is GpuStatus.APPLIED)


def last_apply(result: ApplyResult | None, outcome: Outcome, seconds: float, profile: str, trigger: str,
               refusal: Exception | None = None) -> LastApply:
    """``last_apply`` of ``migd.daemon/v1``: the outcome, and what it did per GPU (changed, waiting, the
    signals force sent); an apply refused for busy instances names them."""
    if result is None:
        waiting = busy_pids_of(refusal) if isinstance(refusal, BusyError) else {}
        return LastApply(time.time(), outcome, seconds, profile, trigger, None,
                         {str(i): p for i, p in waiting.items()} or None)
    return LastApply(time.time(), outcome, seconds, profile, trigger, _changed(result),
                     {str(i): p for i, p in blocked_pids(result).items()} or None, signals(result.signalled))


def busy_pids_of(e: BusyError) -> dict[int, tuple[int, ...]]:
    by_gpu: dict[int, set[int]] = {}
    for o in e.blocked:
        by_gpu.setdefault(o.gpu, set()).update(o.busy_pids)
    return {i: tuple(sorted(p)) for i, p in sorted(by_gpu.items())}


def in_flight(status: Status, profile: Profile, on_busy: str) -> Callable[[dict[int, tuple[int, ...]], float], None]:
    """What a manual apply's wait for busy instances publishes as it goes (``status.applying``, cleared
    by the caller when the apply ends): which GPUs wait for which PIDs, and until when."""
    since = time.time()

    def waiting(pids: dict[int, tuple[int, ...]], until: float) -> None:
        status.applying = Applying(profile.name, profile.source, since, on_busy,
                                   {str(i): p for i, p in sorted(pids.items())}, until)
    return waiting

