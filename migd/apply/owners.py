"""Tenant labels per instance.  NVML has no place for them, so migd keeps them on disk."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from migd.apply.journal import atomic_write_json, check_schema

SCHEMA = "migd.owners/v1"


class Owners:
    """{"schema", "gpus": {gpu uuid: {GI placement start: owner}}}; a GI is named by its start, which
    survives re-creation.  A file without "schema" is the unversioned map written before v1."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[int, str]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                raw = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        check_schema(self.path, raw, SCHEMA)
        gpus = raw.get("gpus", {}) if "schema" in raw else raw
        return {u: {int(k): v for k, v in m.items()} for u, m in gpus.items()}

    def for_gpu(self, uuid: str) -> dict[int, str]:
        return self.load().get(uuid, {})

    def set_gpu(self, uuid: str, owners: dict[int, str]) -> None:
        with self._lock:
            self._set(uuid, owners)

    def _set(self, uuid: str, owners: dict[int, str]) -> None:
        data = self.load()
        if data.get(uuid, {}) == owners:
            return  # nothing to write (an fsync'd write per GPU per apply adds up)
        data[uuid] = owners
        atomic_write_json(self.path, {"schema": SCHEMA, "gpus": {
            u: {str(k): v for k, v in m.items()} for u, m in data.items() if m}}, mode=0o644)
