"""Access by owner, kept true: each MIG instance's GI and CI capability nodes as its owner's grant
says (``policy.py``), every other capability of the GPU root's alone.

When: :meth:`close_gpu` before a GPU's layout changes (nothing of the old layout stays open for a
new instance that reuses an id), :meth:`open_gpu` once the GPU is settled (applied or rolled back:
read back from NVML, so only what exists is opened), :meth:`reconcile` at start and every reconcile
pass (a crash, a hand edit, a ``migctl apply --force-local``).  A crash between the two leaves the
GPU closed, never open: the next start's reconcile opens what the journal's recovery left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from migd.access.nodes import AccessError, Driver
from migd.access.policy import CLOSED, AccessPolicy, NodeMode
from migd.hardware.caps import caps_major, ci_cap, gi_cap, gpu_caps, read_minors, uses_devfs
from migd.hardware.inventory import survey
from migd.hardware.types import GpuInfo, GpuInstance, HardwareError

log = logging.getLogger(__name__)


class CapsReader(Protocol):
    """The narrow port access control needs: which GPUs, their minors and their instances."""

    def gpu_count(self) -> int: ...
    def gpu(self, index: int) -> GpuInfo: ...
    def minor_number(self, index: int) -> int: ...
    def list_gpu_instances(self, index: int) -> list[GpuInstance]: ...


@dataclass
class AccessControl:
    policy: AccessPolicy
    reader: CapsReader
    owners: Callable[[], Mapping[str, Mapping[int, str]]]  # GPU UUID -> GI placement start -> owner
    changes: int = 0  # capability nodes changed since start (metrics)
    errors: list[str] = field(default_factory=list)  # the last pass's failures (status)

    def _driver(self) -> tuple[Driver, dict[str, int]]:
        p = self.policy.paths
        try:
            minors = read_minors(p.mig_minors)
            devfs = uses_devfs(p)
            driver = Driver(p, devfs, caps_major(p.devices) if devfs else 0)
            if devfs:
                driver.check_dir()
        except OSError as e:
            raise AccessError(f"the driver's capabilities cannot be read: {e}") from None
        return driver, minors

    def wanted(self, index: int, uuid: str, gpu_minor: int,
               owners: Mapping[str, Mapping[int, str]]) -> dict[str, NodeMode]:
        """Every capability of the GPU that exists now, as its owner's grant says."""
        mine = owners.get(uuid, {})
        out: dict[str, NodeMode] = {}
        for gi in self.reader.list_gpu_instances(index):
            mode = self.policy.wanted(mine.get(gi.placement.start))
            out[gi_cap(gpu_minor, gi.id)] = mode
            for ci in gi.compute_instances:
                out[ci_cap(gpu_minor, gi.id, ci.id)] = mode
        return out

    def close_gpu(self, index: int) -> None:
        """Before a change: every capability of the GPU root's alone.  Raises HardwareError: a GPU
        whose capabilities cannot be closed is not changed (the old grants would reach new instances)."""
        try:
            self._close(*self._driver(), index)
        except (AccessError, OSError) as e:
            raise _not_closed(index, e) from None

    def _close(self, driver: Driver, minors: dict[str, int], index: int) -> None:
        gpu_minor = self.reader.minor_number(index)
        try:
            existing = set(self.wanted(index, self.reader.gpu(index).uuid, gpu_minor, self.owners()))
        except HardwareError:  # unreadable (lost): close every node; the /proc files are the driver's
            existing = set()
        for name, minor in gpu_caps(minors, gpu_minor).items():
            self._set(driver, name, minor, CLOSED, name in existing)

    def open_gpu(self, index: int) -> list[str]:
        """Once the GPU is settled: what exists as its owners' grants say, the rest root's.  Returns the
        failures (logged; a node left closed is safe, never open)."""
        try:
            driver, minors = self._driver()
        except AccessError as e:
            return [_failed(index, e)]
        return self._open(driver, minors, self.owners(), index)

    def _open(self, driver: Driver, minors: dict[str, int], owners: Mapping[str, Mapping[int, str]],
              index: int) -> list[str]:
        try:
            gpu_minor = self.reader.minor_number(index)
            wanted = self.wanted(index, self.reader.gpu(index).uuid, gpu_minor, owners)
            for name, minor in gpu_caps(minors, gpu_minor).items():
                self._set(driver, name, minor, wanted.get(name, CLOSED), name in wanted)
        except (AccessError, OSError, HardwareError) as e:
            return [_failed(index, e)]
        return []

    def reconcile(self) -> list[str]:
        """Every readable GPU as :meth:`open_gpu` leaves it; a GPU NVML cannot read is closed.  The
        driver's files and the owner labels are read once for the pass, not once per GPU."""
        found = survey(self.reader)
        try:
            driver, minors = self._driver()
        except AccessError as e:
            errors = [_failed(g.index, e) for g in found.gpus]
            errors += [str(_not_closed(u.index, e)) for u in found.unreadable]
        else:
            owners = self.owners()
            errors = [why for g in found.gpus for why in self._open(driver, minors, owners, g.index)]
            for u in found.unreadable:
                try:
                    self._close(driver, minors, u.index)
                except (AccessError, OSError) as e:
                    errors.append(str(_not_closed(u.index, e)))
        self.errors = errors
        return errors

    def _set(self, driver: Driver, name: str, minor: int, want: NodeMode, exists: bool) -> None:
        if driver.set(name, minor, want, exists):
            self.changes += 1
            log.debug("capability %s (minor %d): %s", name, minor, want.describe())


def _failed(index: int, e: Exception) -> str:
    """A GPU whose capabilities could not be opened as owned, said once (it stays closed: safe)."""
    why = f"GPU {index}: access control: {e}"
    log.error("%s (its instances stay closed to all but root)", why)
    return why


def _not_closed(index: int, e: Exception) -> HardwareError:
    return HardwareError(f"GPU {index}: access control: cannot close its instances' capabilities before the "
                         f"change ({e}); nothing was changed")
