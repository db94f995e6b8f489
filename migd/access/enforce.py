"""Access by owner, kept true: each MIG instance's GI and CI capability nodes as its owner's grant
says (``policy.py``), every other capability of the GPU root's alone.

When: :meth:`close_gpu` before a GPU's layout or owners change (nothing of the old layout stays open
for a new instance that reuses an id, nor for the old owner of a relabelled one), :meth:`seal` right
after each instance the driver creates (``DeviceFileModify: 0`` before nvidia-modprobe, run by anyone's
CUDA program, can open its node), :meth:`open_gpu` once the GPU is settled (applied or rolled back:
read back from NVML, so only what exists is opened), :meth:`reconcile` at start and every pass (a
crash, a hand edit, a ``migctl apply --force-local``, a group deleted since).  A crash between close
and open leaves the GPU closed, never open: the next start's reconcile opens what recovery left.

Each node is set or refused on its own; one that cannot be set is named with why, and is said to be
left as it was (which may be open: nothing here claims more than it did).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from migd.access.holders import Holder, holders
from migd.access.nodes import AccessError, Driver
from migd.access.policy import CLOSED, AccessPolicy, NodeMode, Resolved
from migd.hardware.caps import caps_major, ci_cap, gi_cap, gpu_caps, read_minors, uses_devfs
from migd.hardware.inventory import survey
from migd.hardware.types import GpuInfo, GpuInstance, HardwareError

log = logging.getLogger(__name__)
PROC_INTERFACE = ("the driver offers only the deprecated /proc capability interface (nvidia.ko nv_cap_enable_devfs=0): "
                  "each new instance's /proc file is created world-readable, so another team could open it before "
                  "migd closes it; load the driver with nv_cap_enable_devfs=1 or remove migd's access: section")


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
    failures: dict[int, list[str]] = field(default_factory=dict)  # GPU index -> its nodes not set (now)
    holding: set[int] = field(default_factory=set)  # GPUs with an instance held back from its owner (_held_back)
    missing: Mapping[str, str] = field(default_factory=dict)  # owner -> its group or user that is gone

    @property
    def errors(self) -> list[str]:
        """What is not as the policy says, now: owners whose accounts are gone, nodes not set."""
        gone = [f"owner {o}: {why}: its instances are closed to all but root"
                for o, why in sorted(self.missing.items())]
        return gone + [why for i in sorted(self.failures) for why in self.failures[i]]

    def _driver(self) -> tuple[Driver, dict[str, int]]:
        p = self.policy.paths
        try:
            if not uses_devfs(p):
                raise AccessError(PROC_INTERFACE)
            driver = Driver(p, caps_major(p.devices))
            minors = read_minors(p.mig_minors)
            driver.check_dir()
        except OSError as e:
            raise AccessError(f"the driver's capabilities cannot be read: {e}") from None
        return driver, minors

    def _resolve(self) -> Resolved:
        """The owners' accounts, looked up now; a newly missing one is said once."""
        resolved = self.policy.resolve()
        for owner in sorted(set(resolved.missing) - set(self.missing)):
            log.error("access by owner: owner %s: %s: its instances are closed to all but root until it exists "
                      "again or the configuration changes", owner, resolved.missing[owner])
        self.missing = resolved.missing
        return resolved

    def wanted(self, index: int, gpu_minor: int, owners: Mapping[str, Mapping[int, str]],
               resolved: Resolved) -> dict[str, NodeMode]:
        """Every capability of the GPU that exists now, as its owner's grant says."""
        mine = owners.get(self.reader.gpu(index).uuid, {})
        out: dict[str, NodeMode] = {}
        for gi in self.reader.list_gpu_instances(index):
            mode = resolved.wanted(mine.get(gi.placement.start))
            out[gi_cap(gpu_minor, gi.id)] = mode
            for ci in gi.compute_instances:
                out[ci_cap(gpu_minor, gi.id, ci.id)] = mode
        return out

    def held(self, indices: Collection[int]) -> dict[int, dict[int, dict[int, tuple[int, ...]]]]:
        """These GPUs' instances whose capability nodes a process other than root holds open
        (``holders.py``): GPU index -> GI id -> CI id (-1: the GI's own capability) -> pids, from one
        read of /proc for all of them.  Such an instance is busy even when NVML lists no process on
        it: destroying it for one that may reuse its ids, or giving it to another owner, would leave
        that process a working handle on another team's instance.  Unreadable: none."""
        try:
            driver, minors = self._driver()
        except AccessError:
            return {}
        return {i: {gi: {ci: tuple(h.pid for h in hs) for ci, hs in by_ci.items()} for gi, by_ci in by_gi.items()}
                for i, by_gi in self._holders(driver, minors, indices).items()}

    def _holders(self, driver: Driver, minors: dict[str, int],
                 indices: Collection[int]) -> dict[int, dict[int, dict[int, tuple[Holder, ...]]]]:
        dev = {}
        for index in indices:
            try:
                gpu_minor = self.reader.minor_number(index)
                instances = self.reader.list_gpu_instances(index)
            except HardwareError:
                continue
            for gi in instances:
                dev[os.makedev(driver.major, minors[gi_cap(gpu_minor, gi.id)])] = (index, gi.id, -1)
                for ci in gi.compute_instances:
                    dev[os.makedev(driver.major, minors[ci_cap(gpu_minor, gi.id, ci.id)])] = (index, gi.id, ci.id)
        out: dict[int, dict[int, dict[int, tuple[Holder, ...]]]] = {}
        for rdev, found in holders(dev).items():
            index, gi_id, ci_id = dev[rdev]
            out.setdefault(index, {}).setdefault(gi_id, {})[ci_id] = found
        return out

    def close_gpu(self, index: int) -> None:
        """Before a change: every capability of the GPU root's alone.  Raises HardwareError when any
        node could not be closed: a GPU whose capabilities cannot all be closed is not changed (the
        old grants would reach new instances, or the old owner a relabelled one)."""
        try:
            driver, minors = self._driver()
            failed = self._set_all(driver, minors, self.reader.minor_number(index), {}, index)
        except (AccessError, OSError, HardwareError) as e:
            raise _not_closed(index, str(e)) from None
        if failed:
            raise _not_closed(index, "; ".join(failed))

    def seal(self, index: int) -> None:
        """Right after the driver made instances on the GPU (closed before the change): each new
        capability gets ``DeviceFileModify: 0`` and a root-only node before the next NVML call, so a
        CUDA program started meanwhile cannot have nvidia-modprobe open it (HardwareError: then the
        change fails and is rolled back)."""
        try:
            driver, minors = self._driver()
            gpu_minor = self.reader.minor_number(index)
            for name in driver.present(gpu_minor):  # (the /proc tree, not every minor of the GPU)
                if name in minors and driver.modify_on(name):
                    self._set(driver, name, minors[name], CLOSED)
        except (AccessError, OSError, HardwareError) as e:
            raise HardwareError(f"GPU {index}: access control: a new instance's capability could not be kept "
                                f"closed ({e})", gpu=index) from None

    def open_gpu(self, index: int) -> list[str]:
        """Once the GPU is settled: what exists as its owners' grants say, the rest root's.  Returns the
        failures (said in the log, ``migctl daemon`` and /metrics)."""
        try:
            driver, minors = self._driver()
        except AccessError as e:
            return self._failed(index, [f"GPU {index}: access control: {e}"])
        return self._open(driver, minors, self.owners(), self._resolve(), index)

    def _open(self, driver: Driver, minors: dict[str, int], owners: Mapping[str, Mapping[int, str]],
              resolved: Resolved, index: int) -> list[str]:
        try:
            gpu_minor = self.reader.minor_number(index)
            wanted = self.wanted(index, gpu_minor, owners, resolved)
        except HardwareError as e:
            return self._failed(index, [f"GPU {index}: access control: {e}"])
        waiting = self._held_back(driver, minors, gpu_minor, wanted, index)
        if waiting:
            self.holding.add(index)
        else:
            self.holding.discard(index)
        return self._failed(index, waiting + self._set_all(driver, minors, gpu_minor, wanted, index))

    def _held_back(self, driver: Driver, minors: dict[str, int], gpu_minor: int, wanted: dict[str, NodeMode],
                   index: int) -> list[str]:
        """An instance about to be opened to accounts its nodes do not admit now (a new instance, a
        relabel, an owner moved to another group by a reload) while a process those accounts do not
        include holds one of its nodes (a handle from before, or one nvidia-modprobe let through in the
        moment after the driver made the instance): that process would share the new owner's
        instance, so the instance stays closed to all but root until it lets go (``wanted`` is
        changed in place; said, with the pids)."""
        opening = {name for name, want in wanted.items()
                   if want != CLOSED and _current(driver.paths.node(minors[name])) != want}
        if not opening:
            return []
        out = []
        for gi, by_ci in self._holders(driver, minors, [index]).get(index, {}).items():
            names = {n for n in wanted if n.startswith(f"gpu{gpu_minor}/gi{gi}/")}
            want = wanted.get(gi_cap(gpu_minor, gi), CLOSED)
            strangers = sorted({h.pid for hs in by_ci.values() for h in hs if not h.admitted(want.uid, want.gid,
                                                                                             want.mode)})
            if names & opening and strangers:
                wanted.update(dict.fromkeys(names, CLOSED))
                out.append(f"GPU {index}: GI {gi}: pids {','.join(map(str, strangers))} hold its capability nodes "
                           "but are not among its owner's accounts: closed to all but root until they let go")
        return out

    def reconcile(self) -> list[str]:
        """Every readable GPU as :meth:`open_gpu` leaves it; a GPU NVML cannot read is closed.  The
        driver's files, the owner labels and the accounts are read once for the pass, not per GPU."""
        found = survey(self.reader)
        self.failures = {}
        try:
            driver, minors = self._driver()
        except AccessError as e:
            for index in [g.index for g in found.gpus] + [u.index for u in found.unreadable]:
                self._failed(index, [f"GPU {index}: access control: {e}"])
            return self.errors
        owners, resolved = self.owners(), self._resolve()
        for g in found.gpus:
            self._open(driver, minors, owners, resolved, g.index)
        for u in found.unreadable:
            try:
                self._failed(u.index, self._set_all(driver, minors, self.reader.minor_number(u.index), {}, u.index))
            except HardwareError as e:
                self._failed(u.index, [f"GPU {u.index}: access control: {e}"])
        return self.errors

    def _set_all(self, driver: Driver, minors: dict[str, int], gpu_minor: int, wanted: Mapping[str, NodeMode],
                 index: int) -> list[str]:
        """Every capability of the GPU as ``wanted`` says (closed where it says nothing), each node on
        its own: one that cannot be set does not stop the others.  Returns one line per refused node."""
        failed = []
        for name, minor in gpu_caps(minors, gpu_minor).items():
            try:
                self._set(driver, name, minor, wanted.get(name, CLOSED))
            except (AccessError, OSError) as e:
                failed.append(f"GPU {index}: capability {name}: {e}: left as it was")
        return failed

    def _failed(self, index: int, why: list[str]) -> list[str]:
        """This GPU's failures now (none clears them), each said when it is new."""
        old = set(self.failures.get(index, []))
        for line in why:
            if line not in old:
                log.error("access by owner: %s", line)
        self.failures[index] = why
        if not why:
            del self.failures[index]
        return why

    def _set(self, driver: Driver, name: str, minor: int, want: NodeMode) -> None:
        if driver.set(name, minor, want):
            self.changes += 1
            log.debug("capability %s (minor %d): %s", name, minor, want.describe())


def _current(node: Path) -> NodeMode | None:
    try:
        st = os.lstat(node)
    except FileNotFoundError:
        return None
    return NodeMode(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))


def _not_closed(index: int, why: str) -> HardwareError:
    return HardwareError(f"GPU {index}: access control: cannot close its instances' capabilities before the "
                         f"change ({why}); its layout and owners were not changed", gpu=index)
