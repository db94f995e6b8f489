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
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._local = threading.local()

    def shared(self) -> AbstractContextManager[None]:
        """Shared, re-entrant use (a class, not a generator: every NVML call enters one)."""
        return _Shared(self)

    def _enter_shared(self) -> int:
        depth: int = getattr(self._local, "depth", 0)
        if depth == 0:
            with self._cond:
                while self._writer or self._writers_waiting:
                    self._cond.wait()
                self._readers += 1
        self._local.depth = depth + 1
        return depth

    def _exit_shared(self, depth: int) -> None:
        self._local.depth = depth
        if depth == 0:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

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
    __slots__ = ("lock", "depth")

    def __init__(self, lock: SessionLock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        self.depth = self.lock._enter_shared()

    def __exit__(self, *_: object) -> None:
        self.lock._exit_shared(self.depth)
