"""GPU- and compute-instance profile tables, read once per GPU and MIG mode.

nvml.h (nvmlDeviceGetGpuInstanceProfileInfo): the profile information "is immutable throughout
the lifetime of a MIG mode"; a compute-instance profile's info belongs to its GPU-instance profile
the same way.  Listing a GPU's instances walks every profile index (as NVIDIA's go-nvlib and
mig-parted do), so without this a plan and its verify re-read 18 GI and, per GI, 9 CI profile
infos each time.  The tables are keyed by the MIG mode read just before, and dropped on a mode
change, a reset or a new NVML session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
Mode = tuple[bool, bool]  # (current, pending) MIG mode the table was read under


class ProfileTables:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gi: dict[tuple[int, Mode], list[tuple[int, Any]]] = {}
        self._ci: dict[tuple[int, Mode, int], list[Any]] = {}

    def gi(self, index: int, mode: Mode, read: Callable[[], list[tuple[int, Any]]]) -> list[tuple[int, Any]]:
        """(profile enum, info) of every GI profile the GPU offers under ``mode``."""
        return self._cached(self._gi, (index, mode), read)

    def ci(self, index: int, mode: Mode, gi_profile_id: int, read: Callable[[], list[Any]]) -> list[Any]:
        """The CI profile infos a GI of profile ``gi_profile_id`` offers."""
        return self._cached(self._ci, (index, mode, gi_profile_id), read)

    def _cached(self, tables: dict[Any, T], key: tuple[Any, ...], read: Callable[[], T]) -> T:
        with self._lock:
            table = tables.get(key)
        if table is None:
            table = read()  # NVML calls, outside the lock
            with self._lock:
                tables[key] = table
        return table

    def forget(self, index: int | None = None) -> None:
        """Drop one GPU's tables (a mode change, a reset), or all of them (a new NVML session)."""
        with self._lock:
            self._gi = {k: v for k, v in self._gi.items() if index is not None and k[0] != index}
            self._ci = {k: v for k, v in self._ci.items() if index is not None and k[0] != index}
