"""Which processes hold a capability node open: ``/proc/<pid>/fd``, as ``fuser`` reads it.

Why it matters: the driver checks a process's right to a MIG instance when it opens the capability,
never again.  nv-caps.c ``nv_cap_validate_and_dup_fd`` accepts any fd that is the capability device
with the capability's minor, and the minor is a function of (GPU minor, GI id, CI id) alone
(``/proc/driver/nvidia-caps/mig-minors``), so an fd opened while an instance was one team's stays
good for whatever instance later has the same ids, whoever owns it then; chmod and chown on the node
revoke nothing.  Before an instance passes to another owner, or is destroyed for a new one that may
reuse its ids, migd therefore asks who holds its nodes and treats those processes as busy work.

Root's processes are left out: root may open every capability whatever its node says (the MIG user
guide: CAP_SYS_ADMIN), so a root monitor holding nodes crosses no team.

What this cannot see: a handle passed to another process over a Unix socket shows in that process's
``/proc/<pid>/fd`` like any other (seen); a process in another PID namespace is seen from the host's
/proc; a process hidden from this migd's /proc (``hidepid``, a container's own /proc) is not.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from migd.numeral import whole


@dataclass(frozen=True)
class Holder:
    """A process holding a capability node, with the ids the kernel checked its open with."""

    pid: int
    uid: int  # effective
    gids: frozenset[int]  # effective and supplementary

    def admitted(self, uid: int, gid: int, mode: int) -> bool:
        """Whether a node ``uid``:``gid`` ``mode`` lets this process open it (the kernel's rule)."""
        if self.uid == uid:
            return bool(mode & stat.S_IRUSR)
        return bool(mode & stat.S_IRGRP) if gid in self.gids else bool(mode & stat.S_IROTH)


def holders(devices: Collection[int], proc: Path = Path("/proc")) -> dict[int, tuple[Holder, ...]]:
    """Device number (``st_rdev``) -> the processes other than root holding an open character device
    with that number, for ``devices`` only (root may open every capability anyway; this process is
    left out).  A process that ends or hides while being read is skipped: what is read is a
    snapshot, as fuser's."""
    want = set(devices)
    found: dict[int, dict[int, Holder]] = {}
    if not want:
        return {}
    me = os.getpid()
    for entry in os.scandir(proc):
        if whole(entry.name, 7) in (None, me):
            continue
        for rdev in _held(entry.path, want):
            who = _credentials(entry.path, int(entry.name))
            if who is not None and who.uid != 0:
                found.setdefault(rdev, {})[who.pid] = who
    return {dev: tuple(by_pid[p] for p in sorted(by_pid)) for dev, by_pid in found.items()}


def _held(process: str, want: set[int]) -> set[int]:
    try:
        fds = os.scandir(f"{process}/fd")
    except OSError:
        return set()
    out = set()
    with fds:
        for fd in fds:
            try:
                st = os.stat(fd.path)  # the open file itself, even if its path was unlinked since
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_rdev in want:
                out.add(st.st_rdev)
    return out


def _credentials(process: str, pid: int) -> Holder | None:
    ids: dict[str, list[int]] = {}
    try:
        with open(f"{process}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Uid", "Gid", "Groups"):
                    ids[key] = [int(x) for x in value.split()]
        return Holder(pid, ids["Uid"][1], frozenset([ids["Gid"][1], *ids.get("Groups", [])]))
    except (OSError, KeyError, IndexError, ValueError):
        return None
