"""Crash recovery: what a process that died mid-apply left in the journal, put back.

Each unfinished GPU is found by UUID (indices change when a GPU is lost or re-enumerated) and rolled
back to the layout the journal recorded before the apply; the journal is removed only when every GPU
it names is settled.  A damaged journal is kept, with a ValidationError naming file and field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from migd.apply.journal import GpuEntry, Journal, Step
from migd.apply.result import GpuResult, GpuStatus
from migd.errors import ValidationError
from migd.hardware.inventory import survey
from migd.hardware.ports import GpuReader
from migd.hardware.types import GpuInfo
from migd.plan.requests import DesiredLayout

log = logging.getLogger(__name__)
T = TypeVar("T")
Rollback = Callable[[GpuInfo, DesiredLayout, dict[int, str], str, float], GpuResult]
Forward = Callable[[GpuInfo, dict[int, str]], GpuResult]  # a relabel finished: closed, then the new labels


DISCARD_HINT = "kept for the operator; after checking the GPUs by hand, `migctl recover --discard` sets it aside"


def _located(load: Callable[[], T], path: Path | None = None, field: str = "") -> T:
    """A journal value, or a ValidationError that names the file and field and says what to do."""
    try:
        return load()
    except ValidationError as e:
        raise ValidationError(e.file, e.line, e.column, e.field, f"{e.message}; {DISCARD_HINT}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValidationError(str(path), None, None, field, f"{e}; {DISCARD_HINT}") from None


def recover(journal: Journal, backend: GpuReader, rollback: Rollback, forward: Forward) -> list[GpuResult]:
    """Resolve a journal left by a process that died mid-apply: restore each unfinished GPU, found
    by UUID (indices change when a GPU is lost or re-enumerated); a relabel is finished instead
    (``relabel.py``: its layout never changed, and only forward is never the old owner's).  The journal
    is removed only when every GPU it names is settled; a damaged one is kept (ValidationError naming
    file and field)."""
    if not journal.exists():
        return []
    doc = _located(journal.load, journal.path)
    pending = doc.unfinished()
    if not pending:  # every GPU reached its old or new layout before the process ended
        log.info("the journal of an apply of %r by pid %s names no unfinished GPU: removed", doc.profile, doc.pid)
        journal.finish()
        return []
    inventory = survey(backend)
    by_uuid = {g.uuid: g for g in inventory.gpus}
    befores = _befores(journal.path, pending, by_uuid)
    log.warning("found an unfinished apply of %r by pid %s: restoring %d GPU(s) to their previous layout",
                doc.profile, doc.pid, len(pending))
    for u in inventory.unreadable:
        log.error("GPU %d cannot be read (%s): if the journal names it, its entry is kept", u.index, u.error)
    results = []
    for uuid, entry in pending.items():
        gpu = by_uuid.get(uuid)
        if gpu is None or gpu.model is None:
            why = "is not present (lost, or re-enumerated away)" if gpu is None else "is not a known MIG model"
            log.error("GPU %s %s: its journal entry is kept", uuid, why)
            results.append(GpuResult(entry.index, uuid, GpuStatus.FAILED, 0, f"{uuid} {why}"))
            continue
        if entry.status is Step.RELABELING:
            results.append(forward(gpu, dict(entry.owners_after or {})))
            continue
        results.append(rollback(gpu, befores[uuid], dict(entry.owners_before), "recovered after an interrupted apply",
                                time.monotonic()))
    if all(r.status in (GpuStatus.ROLLED_BACK, GpuStatus.APPLIED) for r in results):
        journal.finish()
    return results


def _befores(path: Path, pending: dict[str, GpuEntry], by_uuid: dict[str, GpuInfo]) -> dict[str, DesiredLayout]:
    """The layout to restore on each GPU present, every one checked against its model before the first GPU is
    changed: a hand-edited entry is one ValidationError with nothing changed, not some GPUs restored first."""
    out = {}
    for uuid, entry in pending.items():
        gpu = by_uuid.get(uuid)
        if gpu is not None and gpu.model is not None and entry.status is not Step.RELABELING:
            out[uuid] = _located(partial(entry.before.desired, gpu.model), path, f"gpus.{uuid}.before")
    return out
