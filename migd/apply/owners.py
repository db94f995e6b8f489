"""Tenant labels per instance.  NVML has no place for them, so migd keeps them on disk."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from migd.apply.statefile import atomic_write_json, fit, read_json
from migd.errors import ValidationError

SCHEMA = "migd.owners/v1"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OwnersDoc:
    """``owners.json``: {gpu uuid: {GI placement start: owner}}; a GI is named by its start, which survives
    re-creation."""

    SCHEMA: ClassVar[str] = SCHEMA
    gpus: dict[str, dict[int, str]] = field(default_factory=dict)


class Owners:
    """The labels' file.  A file without "schema" is the unversioned map written before v1 (``gpus`` alone)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[int, str]]:
        try:
            raw = read_json(self.path)
            if isinstance(raw, dict) and "schema" not in raw:
                return dict(fit(self.path, dict[str, dict[int, str]], raw))
            return dict(fit(self.path, OwnersDoc, raw).gpus)
        except FileNotFoundError:
            return {}
        except ValidationError as e:  # labels only: GPU work goes on; the next write replaces the file
            log.error("owner labels ignored: %s", e)
            return {}

    def set_gpu(self, uuid: str, owners: dict[int, str]) -> None:
        with self._lock:
            self._set(uuid, owners)

    def _set(self, uuid: str, owners: dict[int, str]) -> None:
        data = self.load()
        if data.get(uuid, {}) == owners:
            return  # nothing to write (an fsync'd write per GPU per apply adds up)
        data[uuid] = owners
        doc = OwnersDoc({u: m for u, m in data.items() if m})
        atomic_write_json(self.path, doc, mode=0o644)  # (a directory in its place is set aside there)
