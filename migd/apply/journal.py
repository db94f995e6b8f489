"""A crash-safe record of an apply in progress.

Written atomically (temp file, fsync, rename; see statefile) before the first NVML mutation, with
every GPU's layout before, and once per GPU when its outcome is known (issue 16: not after every
step), so a process that dies mid-apply leaves enough behind for the next start to put every
unsettled GPU back to the layout it had before.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from migd.apply.statefile import (
    atomic_write_json,
    check_schema,
    conform,
    digits,
    mapping,
    of,
    optional,
    read_json,
    record,
)
from migd.catalog.models import GpuModel, Placement
from migd.errors import ValidationError
from migd.kinds import Word
from migd.plan.requests import DesiredInstance, DesiredLayout

SCHEMA = "migd.journal/v1"  # like mig-parted's api/checkpoint/v1: fields are only added within v1


def layout_to_json(layout: DesiredLayout) -> dict[str, Any]:
    return {"mig": layout.mig, "instances": [
        {"profile_id": d.gi.profile_id, "start": d.placement.start if d.placement else None, "owner": d.owner,
         "cis": [[c.profile_id, p.start] for c, p in zip(d.cis, d.ci_placements or (), strict=False)]}
        for d in layout.instances]}


def layout_from_json(model: GpuModel, raw: dict[str, Any]) -> DesiredLayout:
    out = []
    for d in raw["instances"]:
        gi = model.profile_by_id(d["profile_id"])
        if gi is None:
            raise ValueError(f"journal names GI profile {d['profile_id']} unknown on {model.key}")
        cis = tuple(gi.ci_by_id(pid) or gi.default_ci for pid, _ in d["cis"])
        out.append(DesiredInstance(gi=gi, cis=cis, owner=d.get("owner"),
                                   placement=Placement(d["start"], gi.memory_slices),
                                   ci_placements=tuple(Placement(st, c.slices)
                                                       for (_, st), c in zip(d["cis"], cis, strict=True))))
    return DesiredLayout(mig=raw["mig"], instances=tuple(out))


class Step(Word):
    """Where one GPU of a journaled apply stands (the journal's ``gpus.<uuid>.status``)."""

    PENDING = "pending"  # journaled, not touched yet
    APPLYING = "applying"  # changes under way: its before-layout is the truth
    DONE = "done"  # in the new layout
    ROLLED_BACK = "rolled_back"  # back in the old layout
    FAILED = "failed"  # neither: a rollback failed; recovery tries again
    RELABELING = "relabeling"  # same layout, owners changing: recovery finishes it (closed, then new labels)


STATUSES = tuple(Step)
_ENTRY = record(index=optional(of(int)), done=optional(of(int)), ops=optional(of(int)),
                owners_before=optional(mapping(of(str), keys=digits)),
                owners_after=optional(mapping(of(str), keys=digits)))
_OUTER = record(profile=optional(of(str)), pid=optional(of(int)), started=optional(of(int, float)),
                gpus=optional(mapping(_ENTRY)))  # (each entry's status and layout: _check_entry)
SETTLED = (Step.DONE, Step.ROLLED_BACK)  # the GPU is in the new or the old layout


def unfinished(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A validated journal's GPUs (by UUID) that may be half-way: neither done nor rolled back."""
    return {uuid: e for uuid, e in data["gpus"].items() if e["status"] not in SETTLED}


def _check_entry(path: Path, field: str, e: Any) -> None:
    def bad(where: str, message: str) -> ValidationError:
        return ValidationError(str(path), None, None, f"{field}{where}", message)
    if not isinstance(e, dict):
        raise bad("", "not a mapping")
    if e.get("status") not in STATUSES:
        raise bad(".status", f"{e.get('status')!r} is not one of {', '.join(STATUSES)}")
    before = e.get("before")
    if not isinstance(before, dict) or not isinstance(before.get("mig"), bool) or \
            not isinstance(before.get("instances"), list):
        raise bad(".before", "not a layout {mig: bool, instances: [...]}")
    for k, d in enumerate(before["instances"]):
        cis = d.get("cis") if isinstance(d, dict) else None
        if not isinstance(d, dict) or not isinstance(d.get("profile_id"), int) or \
                not isinstance(d.get("start"), int) or not isinstance(cis, list) or \
                not all(isinstance(c, list) and len(c) == 2 and all(isinstance(x, int) for x in c) for c in cis):
            raise bad(f".before.instances[{k}]", "not {profile_id, start, cis: [[CI profile id, start], ...]}")
    if not isinstance(e.get("owners_before", {}), dict):
        raise bad(".owners_before", "not a mapping")


def validate(path: Path, data: Any) -> dict[str, Any]:
    """A journal as written by this migd version, or a ValidationError naming the damaged field."""
    check_schema(path, data, SCHEMA)
    conform(path, data, _OUTER)
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        raise ValidationError(str(path), None, None, "gpus", "missing, or not a mapping of GPU UUID to entry")
    for uuid, entry in gpus.items():
        _check_entry(path, f"gpus.{uuid}", entry)
    return dict(data)


class Journal:
    """One JSON file: {"schema", "profile", "pid", "started", "gpus": {uuid: {...}}}.

    It is removed only when every GPU it names is known to be in the old or the new layout."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        self._lock = threading.Lock()  # GPUs are applied in parallel threads

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def load(self) -> dict[str, Any]:
        """The journal left behind; ValidationError (file, field) if it is damaged: kept for the operator."""
        self.data = validate(self.path, read_json(self.path))
        return self.data

    def begin(self, profile: str, gpus: dict[str, dict[str, Any]]) -> None:
        self.data = {"schema": SCHEMA, "profile": profile, "pid": os.getpid(), "started": time.time(), "gpus": gpus}
        self._save()

    def update(self, uuid: str, **fields: Any) -> None:
        """One GPU's outcome: the file is fsync'd, its directory not.  The name then holds this
        version or the one before it, and the one before names the GPU as still applying, which
        recovery rolls back: the same guarantee for one fsync instead of two (issue 16: <= 2 per
        GPU; ``begin`` syncs the directory, since before it there is no journal at all)."""
        with self._lock:
            self.data["gpus"][uuid].update(fields)
            self._save(sync_dir=False)

    def mark(self, uuid: str, **fields: Any) -> None:
        """Record progress in memory only: recovery needs the before-layout (written by ``begin``) and
        each GPU's outcome (``update``), not every step; an unsettled GPU is rolled back either way."""
        with self._lock:
            self.data["gpus"][uuid].update(fields)

    def touched(self) -> bool:
        """Whether any GPU it names may have been changed (a step ran, or its outcome is unknown)."""
        return any(e.get("done", 0) or e["status"] != "pending" for e in self.data.get("gpus", {}).values())

    def _save(self, sync_dir: bool = True) -> None:
        atomic_write_json(self.path, self.data, sync_dir=sync_dir)

    def finish(self) -> None:
        """Every GPU it names is in a consistent layout: the record is no longer needed."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.data = {}

    def discard(self) -> Path:
        """An operator checked the GPUs by hand: the journal is set aside (renamed, not deleted)."""
        kept = self.path.with_name(f"{self.path.name}.discarded-{int(time.time())}")
        os.replace(self.path, kept)
        self.data = {}
        return kept


def left_behind(path: Path) -> dict[str, Any] | None:
    """What ``migctl status`` says about a journal (None: there is none): the apply it records, the GPUs
    it names as unfinished and whether its process still runs (an apply in progress, not an interrupted
    one).  A damaged journal is reported with its error, never raised: status must still show the GPUs."""
    if not os.path.lexists(path):
        return None
    try:
        data = validate(path, read_json(path))
    except (OSError, ValueError, ValidationError) as e:
        return {"path": str(path), "profile": None, "pid": None, "running": False, "unfinished_gpus": [],
                "error": str(e)}
    pid = data.get("pid")
    return {"path": str(path), "profile": data.get("profile"), "pid": pid,
            "running": isinstance(pid, int) and _alive(pid),
            "unfinished_gpus": sorted(e.get("index", -1) for e in unfinished(data).values()),
            "error": None}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return pid != os.getpid()
