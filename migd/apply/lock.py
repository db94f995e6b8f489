"""One apply at a time per node: the daemon and migctl share this lock file."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path
from types import TracebackType

from migd.errors import ValidationError
from migd.trust import ensure_private_dir


class LockBusy(Exception):
    pass


def _open(path: Path) -> int:
    """The lock file, never through a symlink (a planted ``apply.lock -> /etc/...`` would have root
    truncate that file to write a PID) and only if it is a regular file of ours."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValidationError(str(path), None, None, "", "is a symbolic link; migd never follows one in its "
                                  "state dir (someone planted it?)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ValidationError(str(path), None, None, "", f"is not a regular file of uid {os.geteuid()}: "
                              "someone planted it; remove it")
    return fd


class ApplyLock:
    def __init__(self, path: Path, timeout_s: float = 0.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise.  Whatever fails after the open (a full disk refusing the PID, a
        signal) closes the descriptor, which drops the lock: a failed acquire never holds it."""
        ensure_private_dir(self.path.parent, "state dir")
        fd = _open(self.path)
        try:
            self._wait(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _wait(self, fd: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise LockBusy(f"another apply is in progress (lock {self.path} held by pid {holder})") from None
                time.sleep(0.05)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ApplyLock:
        self.acquire()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
