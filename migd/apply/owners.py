"""Tenant labels per instance.  NVML has no place for them, so migd keeps them on disk."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

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
from migd.errors import ValidationError

SCHEMA = "migd.owners/v1"
_BY_GPU = mapping(mapping(of(str), keys=digits))  # GPU UUID -> GI placement start -> owner
_V1 = record(schema=of(str), gpus=optional(_BY_GPU))
log = logging.getLogger(__name__)


class Owners:
    """{"schema", "gpus": {gpu uuid: {GI placement start: owner}}}; a GI is named by its start, which
    survives re-creation.  A file without "schema" is the unversioned map written before v1."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[int, str]]:
        try:
            raw = read_json(self.path)
            check_schema(self.path, raw, SCHEMA)
            conform(self.path, raw, _V1 if "schema" in raw else _BY_GPU)
        except FileNotFoundError:
            return {}
        except ValidationError as e:  # labels only: GPU work goes on; the next write replaces the file
            log.error("owner labels ignored: %s", e)
            return {}
        gpus = raw.get("gpus", {}) if "schema" in raw else raw
        return {u: {int(k): v for k, v in m.items()} for u, m in gpus.items()}

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
