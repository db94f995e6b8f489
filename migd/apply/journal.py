"""A crash-safe record of an apply in progress.

Written atomically (temp file, fsync, rename) before the first NVML mutation and after
every step, so a process that dies mid-apply leaves enough behind for the next start to
put every GPU back to the layout it had before.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from migd.hardware.catalog import GpuModel, Placement
from migd.profiles.resolve import DesiredInstance, DesiredLayout
from migd.yamlsrc import ValidationError

SCHEMA = "migd.journal/v1"  # like mig-parted's api/checkpoint/v1: fields are only added within v1


def atomic_write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, separators=(",", ":")))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


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


def check_schema(path: Path, data: Any, schema: str) -> None:
    """A file migd wrote: an object of ``schema`` (or of no schema: written before versions existed)."""
    if not isinstance(data, dict):
        raise ValidationError(str(path), None, None, "schema", f"not a {schema} object")
    found = data.get("schema", schema)
    if found != schema:
        raise ValidationError(str(path), None, None, "schema", f"{found!r} is not {schema!r}, the version this "
                              "migd reads (written by a newer migd?)")


class Journal:
    """One JSON file: {"schema", "profile", "pid", "started", "gpus": {uuid: {...}}}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        self._lock = threading.Lock()  # GPUs are applied in parallel threads

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> dict[str, Any]:
        with open(self.path, encoding="utf-8") as f:
            data = json.load(f)
        check_schema(self.path, data, SCHEMA)
        self.data = data
        return self.data

    def begin(self, profile: str, gpus: dict[str, dict[str, Any]]) -> None:
        self.data = {"schema": SCHEMA, "profile": profile, "pid": os.getpid(), "started": time.time(), "gpus": gpus}
        self._save()

    def update(self, uuid: str, **fields: Any) -> None:
        with self._lock:
            self.data["gpus"][uuid].update(fields)
            self._save()

    def _save(self) -> None:
        atomic_write_json(self.path, self.data)

    def finish(self) -> None:
        """All GPUs ended in a consistent layout: the record is no longer needed."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.data = {}
