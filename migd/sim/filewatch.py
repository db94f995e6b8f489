"""Block until a file is written, without polling it (Linux inotify through libc).

The simulated library's ``nvmlEventSetWait`` sleeps until the shared state changes: a process
that raises an Xid bumps the generation kept in the lock file, and inotify wakes the waiter.
Where inotify cannot be had (no libc symbol, limits reached) the caller falls back to a short
poll of the 8-byte generation, never of the state file itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import weakref
from functools import lru_cache
from typing import Any

# <sys/inotify.h>
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x2, 0x4, 0x8, 0x400, 0x800
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF


@lru_cache(maxsize=1)
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


class FileWatch:
    """One inotify instance watching one file; ``wait`` returns when it was written (or at timeout).
    Meant to be kept and reused: closing an inotify descriptor is slow (the kernel waits for an RCU
    grace period), so a waiter that made a new one per wait would spend its time closing them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.fd = -1
        self._finalizer: Any = None  # weakref.finalize closing the descriptor
        libc = _libc()
        if libc is None:
            return
        fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(path), _MASK) < 0:
            os.close(fd)
            return
        self.fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)  # closed when dropped, if not before

    @property
    def works(self) -> bool:
        return self.fd >= 0

    def wait(self, timeout_s: float) -> None:
        """Sleep until the file changes or ``timeout_s`` passes; pending notifications are consumed."""
        if select.select([self.fd], [], [], max(0.0, timeout_s))[0]:
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.fd = -1

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
