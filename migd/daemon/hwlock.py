"""The hardware lock: NVML's users take turns, and a wait on something else lets go of it.

The sampler and the fault watch read NVML under it; an apply holds it while it changes GPUs, so no
sample sees a layout half made.  A Slurm switch waits on slurmctld for minutes at worst (a hung or
restarting controller): holding this lock through that wait stopped the sampler for a minute and
delayed a fatal Xid's handling by 50 s.  So the daemon lends ``unheld`` to the Slurm step, which
waits with the lock let go and takes it back before touching a GPU again; an apply's wait for busy
instances (up to its ``busy_timeout``) lets go the same way (``ApplyOptions.unheld``).  The fault
watch never waits for it (``acquire(blocking=False)``): its reading of the next Xid must not queue
behind an apply's changes.  The daemon's decision lock (one pass, one manual apply at a time) stays
held throughout: nothing else decides meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class HardwareLock:
    """A re-entrant lock that its owner can let go of, whole, for the length of a wait."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True) -> bool:
        """As ``threading.RLock.acquire``: the fault watch takes it only when free (it never waits)."""
        if not self._lock.acquire(blocking):
            return False
        self._owner = threading.get_ident()
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def __enter__(self) -> HardwareLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    @contextmanager
    def unheld(self) -> Iterator[None]:
        """Let go for the block if this thread holds the lock (at any depth); taken back after it."""
        if self._owner != threading.get_ident():
            yield
            return
        depth, self._depth, self._owner = self._depth, 0, None
        for _ in range(depth):
            self._lock.release()
        try:
            yield
        finally:
            for _ in range(depth):
                self._lock.acquire()
            self._owner, self._depth = threading.get_ident(), depth
