"""Who may use NVML right now: every call shares the session, a GPU reset takes it alone.

NVIDIA documents that no client may hold a GPU while it is reset (``nvidia-smi -r`` refuses,
"in use by another process"), and NVIDIA's mig-parted shuts NVML down before a reset and
initialises it again after.  migd's sampler, fault watch and apply threads share one NVML
session; :meth:`SessionLock.exclusive` waits until none of them is inside NVML, keeps new
ones out (a waiting reset goes first), and lets the reset run with NVML shut down.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager


class SessionLock:
    """A reader-writer lock with writer preference; shared access is re-entrant per thread."""

    def __init__(self) -> None:
        # A plain lock (entered in C) under the condition: every NVML call takes it twice.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._local = threading.local()

    def held(self) -> bool:
        """Whether this thread is inside the session already (a nested call needs no bookkeeping)."""
        return bool(getattr(self._local, "depth", 0))

    def shared(self) -> AbstractContextManager[None]:
        """Shared, re-entrant use (a class, not a generator: every NVML call enters one)."""
        return _Shared(self)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            raise RuntimeError("exclusive NVML access asked for by a thread inside NVML")
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class _Shared:
    """One shared use (the lock's bookkeeping written here: every NVML call enters one)."""

    __slots__ = ("lock", "depth")

    def __init__(self, lock: SessionLock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        lock = self.lock
        self.depth = depth = getattr(lock._local, "depth", 0)
        if depth == 0:
            with lock._lock:
                while lock._writer or lock._writers_waiting:  # a waiting reset goes first
                    lock._cond.wait()
                lock._readers += 1
        lock._local.depth = depth + 1

    def __exit__(self, *_: object) -> None:
        lock, depth = self.lock, self.depth
        lock._local.depth = depth
        if depth == 0:
            with lock._lock:
                lock._readers -= 1
                if lock._readers == 0 and lock._writers_waiting:  # only a reset waits for no readers
                    lock._cond.notify_all()
