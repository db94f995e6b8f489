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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from migd.apply.statefile import atomic_write_json, load, set_aside
from migd.catalog.models import GpuModel, Placement
from migd.errors import ValidationError
from migd.kinds import Word
from migd.plan.requests import DesiredInstance, DesiredLayout
from migd.printable import clipped
from migd.wire import OMIT_NONE

SCHEMA = "migd.journal/v1"  # like mig-parted's api/checkpoint/v1: fields are only added within v1
PID_MAX = 4_194_303  # the highest pid: pids are below pid_max, whose largest is PID_MAX_LIMIT, 2**22 on 64-bit


@dataclass(frozen=True)
class InstanceDoc:
    """One GPU instance of a recorded layout: its GI profile, the slice it starts at, its owner and its
    compute instances as ``[CI profile id, start]``: all a restore needs to re-create it in place."""

    profile_id: int
    start: int
    owner: str | None = field(default=None, kw_only=True)  # (always written; left out, it reads as none)
    cis: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class LayoutDoc:
    """A GPU's layout as the journal (and a Slurm switch, ``migd.slurm/v2``'s ``before``) records it."""

    mig: bool
    instances: tuple[InstanceDoc, ...]

    @classmethod
    def of(cls, layout: DesiredLayout) -> LayoutDoc:
        """``layout`` as read from a GPU (``plan.planner.layout_of``: every instance pinned where it is)."""
        return cls(layout.mig, tuple(InstanceDoc(
            d.gi.profile_id, _start(d.placement), owner=d.owner,
            cis=tuple((c.profile_id, p.start) for c, p in zip(d.cis, d.ci_placements or (), strict=False)))
            for d in layout.instances))

    def desired(self, model: GpuModel) -> DesiredLayout:
        """The layout again, every instance pinned where it was; ValueError naming the field if a profile is
        not ``model``'s or a start lies outside its slices (a hand edit: a negative start was a traceback in
        the planner's bit masks, an unknown CI profile was quietly restored as the GI's default CI)."""
        return DesiredLayout(mig=self.mig, instances=tuple(
            _desired(d, model, f"instances[{i}]") for i, d in enumerate(self.instances)))


def _desired(d: InstanceDoc, model: GpuModel, at: str) -> DesiredInstance:
    """One recorded instance as it was, checked against ``model`` (``at``: where it is in the layout)."""
    gi = model.profile_by_id(d.profile_id)
    if gi is None:
        raise ValueError(f"{at}.profile_id: GI profile {d.profile_id} is unknown on {model.key}")
    _within(d.start, gi.memory_slices, model.memory_slices, at)
    cis = []
    for k, (pid, start) in enumerate(d.cis):
        ci = gi.ci_by_id(pid)
        if ci is None:
            raise ValueError(f"{at}.cis[{k}]: CI profile {pid} is unknown in {gi.name} on {model.key}")
        _within(start, ci.slices, gi.slices, f"{at}.cis[{k}]")
        cis.append(ci)
    return DesiredInstance(gi=gi, cis=tuple(cis), owner=d.owner, placement=Placement(d.start, gi.memory_slices),
                           ci_placements=tuple(Placement(st, c.slices) for (_, st), c in zip(d.cis, cis, strict=True)))


def _within(start: int, size: int, slices: int, at: str) -> None:
    """A span of ``size`` slices at ``start`` inside ``slices``; a ValueError naming ``at`` if not."""
    if not 0 <= start <= slices - size:
        raise ValueError(f"{at}: start {_shown(start)} is not one for {size} of {slices} slices (0 to {slices - size})")


def _shown(n: int) -> str:
    """A number as an error shows it: its start and length, when long (a hand edit's 4000 digits are no line)."""
    return clipped(str(n), 9, "digits")


def _start(placement: Placement | None) -> int:
    if placement is None:
        raise ValueError("only a layout read from a GPU, every instance placed, is recorded")
    return placement.start


class Step(Word):
    """Where one GPU of a journaled apply stands (the journal's ``gpus.<uuid>.status``)."""

    PENDING = "pending"  # journaled, not touched yet
    APPLYING = "applying"  # changes under way: its before-layout is the truth
    DONE = "done"  # in the new layout
    ROLLED_BACK = "rolled_back"  # back in the old layout
    FAILED = "failed"  # neither: a rollback failed; recovery tries again
    RELABELING = "relabeling"  # same layout, owners changing: recovery finishes it (closed, then new labels)


SETTLED = (Step.DONE, Step.ROLLED_BACK)  # the GPU is in the new or the old layout


@dataclass(frozen=True, kw_only=True)
class GpuEntry:
    """One GPU of a journaled apply: where it stands, its layout and owner labels (by GI start) before
    the apply, and, for a relabel, the labels after it; ``error``: why it was rolled back or failed."""

    index: int = -1
    status: Step
    done: int = 0  # steps run (in memory: the file is written once per GPU outcome)
    ops: int = 0
    before: LayoutDoc
    owners_before: dict[int, str] = field(default_factory=dict)
    owners_after: dict[int, str] | None = field(default=None, metadata=OMIT_NONE)
    error: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class JournalDoc:
    """``migd.journal/v1``: an apply in progress, by the process that runs it; a file without a schema
    is one written before versions existed, and reads the same."""

    SCHEMA: ClassVar[str] = SCHEMA
    READS: ClassVar[tuple[str | None, ...]] = (SCHEMA, None)
    profile: str | None = None
    pid: int | None = None
    started: float | None = None
    gpus: dict[str, GpuEntry]

    def __post_init__(self) -> None:
        """A pid that is no process's: 0 or -1 signal a process group (status called such an apply in
        progress), a huge one overflowed ``os.kill`` (a traceback in status)."""
        if self.pid is not None and not 1 <= self.pid <= PID_MAX:
            raise ValueError(f"pid: {_shown(self.pid)} is not a process id (1 to {PID_MAX})")

    def unfinished(self) -> dict[str, GpuEntry]:
        """The GPUs (by UUID) that may be half-way: neither done nor rolled back."""
        return {uuid: e for uuid, e in self.gpus.items() if e.status not in SETTLED}


class Journal:
    """One JSON file, a :class:`JournalDoc`, written before the first change and once per GPU outcome.

    It is removed only when every GPU it names is known to be in the old or the new layout."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc: JournalDoc | None = None  # the apply this process journals (None: none)
        self._lock = threading.Lock()  # GPUs are applied in parallel threads

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def load(self) -> JournalDoc:
        """The journal left behind; ValidationError (file, field) if it is damaged: kept for the operator."""
        self.doc = load(self.path, JournalDoc)
        return self.doc

    def begin(self, profile: str, gpus: dict[str, GpuEntry]) -> None:
        self.doc = JournalDoc(profile=profile, pid=os.getpid(), started=time.time(), gpus=dict(gpus))
        self._save()

    def update(self, uuid: str, **fields: Any) -> None:
        """One GPU's outcome: the file is fsync'd, its directory not.  The name then holds this
        version or the one before it, and the one before names the GPU as still applying, which
        recovery rolls back: the same guarantee for one fsync instead of two (issue 16: <= 2 per
        GPU; ``begin`` syncs the directory, since before it there is no journal at all)."""
        with self._lock:
            self._change(uuid, fields)
            self._save(sync_dir=False)

    def mark(self, uuid: str, **fields: Any) -> None:
        """Record progress in memory only: recovery needs the before-layout (written by ``begin``) and
        each GPU's outcome (``update``), not every step; an unsettled GPU is rolled back either way."""
        with self._lock:
            self._change(uuid, fields)

    def _change(self, uuid: str, fields: dict[str, Any]) -> None:
        assert self.doc is not None, "a journal entry changed before the journal was begun"
        self.doc.gpus[uuid] = replace(self.doc.gpus[uuid], **fields)  # (one GPU's thread each)

    def touched(self) -> bool:
        """Whether any GPU it names may have been changed (a step ran, or its outcome is unknown)."""
        return self.doc is not None and any(e.done or e.status is not Step.PENDING for e in self.doc.gpus.values())

    def _save(self, sync_dir: bool = True) -> None:
        atomic_write_json(self.path, self.doc, sync_dir=sync_dir)

    def finish(self) -> None:
        """Every GPU it names is in a consistent layout: the record is no longer needed."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.doc = None

    def discard(self) -> Path:
        """An operator checked the GPUs by hand: the journal is set aside (renamed, not deleted)."""
        kept = set_aside(self.path, "discarded")
        self.doc = None
        return kept


def left_behind(path: Path) -> dict[str, Any] | None:
    """What ``migctl status`` says about a journal (None: there is none): the apply it records, the GPUs
    it names as unfinished and whether its process still runs (an apply in progress, not an interrupted
    one).  A damaged journal is reported with its error, never raised: status must still show the GPUs."""
    if not os.path.lexists(path):
        return None
    try:
        doc = load(path, JournalDoc)
    except (OSError, ValueError, ValidationError) as e:
        return {"path": str(path), "profile": None, "pid": None, "running": False, "unfinished_gpus": [],
                "error": str(e)}
    return {"path": str(path), "profile": doc.profile, "pid": doc.pid,
            "running": doc.pid is not None and _alive(doc.pid),
            "unfinished_gpus": sorted(e.index for e in doc.unfinished().values()),
            "error": None}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return pid != os.getpid()
