"""Which processes hold a capability node open: ``/proc/<pid>/fd``, as ``fuser`` reads it.

Why it matters: the driver checks a process's right to a MIG instance when it opens the capability,
never again.  nv-caps.c ``nv_cap_validate_and_dup_fd`` accepts any fd that is the capability device
with the capability's minor, and the minor is a function of (GPU minor, GI id, CI id) alone
(``/proc/driver/nvidia-caps/mig-minors``), so an fd opened while an instance was one team's stays
good for whatever instance later has the same ids, whoever owns it then; chmod and chown on the node
revoke nothing.  Before an instance passes to another owner, or is destroyed for a new one that may
reuse its ids, migd therefore asks who holds its nodes and treats those processes as busy work.

What this cannot see: a handle passed to another process over a Unix socket shows in that process's
``/proc/<pid>/fd`` like any other (seen); a process in another PID namespace is seen from the host's
/proc; a process hidden from this migd's /proc (``hidepid``, a container's own /proc) is not.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path


def holders(devices: Collection[int], proc: Path = Path("/proc")) -> dict[int, tuple[int, ...]]:
    """Device number (``st_rdev``) -> pids holding an open character device with that number, for
    ``devices`` only; this process is left out.  A process that ends or hides while being read is
    skipped: what is read is a snapshot, as fuser's."""
    want = set(devices)
    found: dict[int, set[int]] = {}
    if not want:
        return {}
    me = os.getpid()
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = os.scandir(f"{entry.path}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    st = os.stat(fd.path)  # the open file itself, even if its path was unlinked since
                except OSError:
                    continue
                if stat.S_ISCHR(st.st_mode) and st.st_rdev in want:
                    found.setdefault(st.st_rdev, set()).add(int(entry.name))
    return {dev: tuple(sorted(pids)) for dev, pids in found.items()}
