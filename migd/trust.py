"""StrictModes, as sshd checks a user's files: what root runs or applies must be rewritable by
nobody else.

A file is trusted when it is owned by root (or by the user migd runs as), is not writable by
group or others, and every directory above it is owned the same way and not writable by group or
others (a sticky world-writable directory such as /tmp is allowed: others cannot replace what
they do not own there).  Each check names the file and what to fix.
"""

from __future__ import annotations

import os
import select
import stat
from pathlib import Path

from migd.errors import ValidationError


def _owners() -> tuple[int, ...]:
    return (0, os.geteuid())


def refuse_untrusted(name: str, st: os.stat_result, what: str) -> None:
    """Refuse ``name`` (already stat'ed, ideally through its open descriptor) unless trusted."""
    if st.st_uid not in _owners():
        raise ValidationError(name, None, None, "", f"{what} is owned by uid {st.st_uid}, not root: whoever owns it "
                              "could reconfigure every GPU; fix with chown root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValidationError(name, None, None, "", f"{what} is writable by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}); fix with chmod go-w")
    check_above(Path(name), what)


def check_above(path: Path, what: str) -> None:
    """Every directory above ``path`` root's (or ours) and writable by nobody else, a sticky one aside:
    else whoever may write one could swap ``path``."""
    name = str(path)
    for d in Path(os.path.abspath(path)).parents:
        ds = os.stat(d)
        if ds.st_uid not in _owners():
            raise ValidationError(name, None, None, "", f"directory {d} above the {what} is owned by uid "
                                  f"{ds.st_uid}: its owner could swap the file; fix with chown root")
        if ds.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not ds.st_mode & stat.S_ISVTX:
            raise ValidationError(name, None, None, "", f"directory {d} above the {what} is writable by group "
                                  f"or others (mode {stat.S_IMODE(ds.st_mode):04o}): anyone could swap the file; "
                                  "fix with chmod go-w")


def check_path(path: str | Path, what: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValidationError(str(path), None, None, "", f"cannot read {what}: {e.strerror}") from None
    refuse_untrusted(str(path), st, what)


def ensure_private_dir(path: Path, what: str) -> None:
    """Create ``path`` (mode 0700) or check it: a directory (not a symlink), owned by root or us, mode 0700."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError):  # (a file in its place, or on its way)
        raise ValidationError(str(path), None, None, "", f"{what} is not a directory") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ValidationError(str(path), None, None, "", f"{what} is not a directory (a symlink?)")
    if st.st_uid not in _owners():
        raise ValidationError(str(path), None, None, "", f"{what} is owned by uid {st.st_uid}; fix with chown root")
    if st.st_mode & 0o077:  # (systemd's StateDirectoryMode and RuntimeDirectoryMode in the unit: 0700)
        raise ValidationError(str(path), None, None, "", f"{what} is open to group or others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}): others could read the journal or plant files "
                              "there; fix with chmod 0700")


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words ("" for a regular file): the one wording of
    every reader that refuses one (a profile, a config, a state file)."""
    if stat.S_ISREG(mode):
        return ""
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a file"


PIPE_WRITER_S = 5.0  # how long a FIFO's reader waits for a writer to open it


def _first_writer(fd: int) -> None:
    """Until a writer has opened the FIFO ``fd`` and written or closed, ``PIPE_WRITER_S`` at most.  Read at
    once, a FIFO whose writer had not opened it yet was an empty file (a what-if of no jobs, one time in
    several under load).  Linux's pipe_poll reports no POLLHUP before a first writer (fs/pipe.c: only once
    ``w_counter`` moved past what the reader saw at its open), so poll waits for one."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    p.poll(int(PIPE_WRITER_S * 1000))


def open_regular(path: str | Path, flags: int = 0, lead: str = "", pipes: bool = False) -> tuple[int, os.stat_result]:
    """``path`` opened for reading (``flags`` added: O_NOFOLLOW, say), and its status, if it is a regular
    file: anything else is refused before a byte is read (a FIFO would block the reader, ``/dev/zero``
    never end, a directory be named by a descriptor number), as ``{lead}is a FIFO, not a regular file``.
    ``pipes``: a FIFO is read too (a command's output, ``--sacct <(sacct ...)``): opened without waiting for
    a writer, whose own open may come a moment later (``mkfifo p; sacct ... > p &``), so its first is
    waited for, ``PIPE_WRITER_S`` at most; one that has none by then reads as empty, never blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | flags)
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if pipes and stat.S_ISFIFO(st.st_mode):
            _first_writer(fd)
            os.set_blocking(fd, True)  # (a writer's bytes are waited for; with none, end of file)
            kind = ""
        if kind:
            raise ValidationError(str(path), None, None, "", f"{lead}is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st
