"""Files migd keeps in its state dir: written atomically, never through a symlink, read with a
located error when damaged.

A write goes to a fresh temp file (``mkstemp``: O_EXCL, so a planted name is never opened),
is fsync'd, renamed over the target (``rename`` replaces a symlink, it does not follow it) and
the directory fsync'd (the journal's per-GPU outcomes skip the last: see Journal.update).  A
read refuses a symlink (O_NOFOLLOW), anything but a regular file, and JSON nested deeper than
MAX_DEPTH or holding a number Python will not convert, and says which file and field is wrong
instead of a traceback.  A directory in a file's place is set aside (:func:`set_aside`): no file
can be renamed over it.

Each file is a wire type (``migd.wire``), written as ``to_json`` makes it (:func:`atomic_write_json`)
and read back through ``from_json`` (:func:`load`), which checks every field against its type: a hand
edit, a file of the right schema but the wrong inner shape, or a damaged one is one line naming the
file and the field, never a traceback at start-up (a restart loop under systemd) or in ``migctl
status``.  One reader, one writer: no file has a checker of its own.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, TypeVar

from migd.errors import ValidationError
from migd.trust import open_regular
from migd.wire import JsonError, JsonFault, WireError, from_json, loads, to_json

T = TypeVar("T")
log = logging.getLogger("migd")


def atomic_write_json(path: Path, doc: Any, mode: int = 0o600, *, sync_dir: bool = True) -> None:
    """``doc``, a wire value, written as ``to_json`` makes it (what :func:`load` reads back)."""
    atomic_write_text(path, json.dumps(to_json(doc), separators=(",", ":")), mode, sync_dir=sync_dir)


def atomic_write_text(path: Path, text: str, mode: int = 0o600, *, sync_dir: bool = True,
                      errors: str = "strict") -> None:
    """``sync_dir=False`` leaves the rename itself to the filesystem's own ordering: after a power
    loss the name then holds the new file or the previous one, each complete (the content was
    fsync'd before the rename).  Only for a file whose previous version is as safe to find.
    ``errors``: how ``text`` is encoded to UTF-8 (``surrogateescape`` gives back bytes read so)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", errors=errors) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not sync_dir:
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _replace(tmp: str, path: Path) -> None:
    """``tmp`` renamed over ``path``; a directory in its place (no rename puts a file over one) is set
    aside first and said: every state file's write, in one place, so none stops an apply."""
    try:
        os.replace(tmp, path)
    except IsADirectoryError:
        log.error("%s is a directory, where migd keeps a file: set aside as %s", path, set_aside(path, "unreadable"))
        os.replace(tmp, path)


def set_aside(path: Path, why: str) -> Path:
    """``path`` renamed ``<name>.<why>-<unix time>`` beside it: kept for the operator, out of migd's way (a
    directory where a state file belongs: ``rename`` puts no file over one, ``unlink`` removes none)."""
    kept = path.with_name(f"{path.name}.{why}-{int(time.time())}")
    os.replace(path, kept)
    return kept


def read_json(path: Path) -> Any:
    """The parsed file; FileNotFoundError if absent, ValidationError if a symlink, not a regular file or
    not JSON migd reads (see :func:`parse`).  A directory read named a descriptor number, not the file
    ("[Errno 21] Is a directory: 6"), and stopped status; a FIFO blocks an open without O_NONBLOCK."""
    try:
        fd, _ = open_regular(path, os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValidationError(str(path), None, None, "", "is a symbolic link; migd never follows one in its "
                                  "state dir (someone planted it?)") from None
        raise
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if not text.strip():
        raise ValidationError(str(path), None, None, "", "is empty (a crash while it was first written?)")
    return parse(path, text)


def parse(path: Path, text: str) -> Any:
    """``text`` as JSON, nested at most MAX_DEPTH deep, or a ValidationError naming ``path``: json's own
    recursion (a file nested 100,000 deep) and Python's limit on an integer's digits raise, not a
    JSONDecodeError, and a traceback at start-up is a restart loop under systemd."""
    try:
        return loads(text)
    except JsonError as e:
        why = f"damaged, not JSON: {e.reason}" if e.fault is JsonFault.NOT_JSON else f"damaged: {e.what}"
        raise ValidationError(str(path), e.line, e.column, "", why) from None


def load(path: Path, cls: type[T]) -> T:
    """The file read as ``cls``: FileNotFoundError if absent, else a ValidationError naming the file
    (and the field) if it is a symlink, not JSON, or does not fit."""
    return fit(path, cls, read_json(path))


def fit(path: Path, cls: type[T], data: Any) -> T:
    """``data``, read from ``path``, as ``cls``; a misfit is a ValidationError naming the file and field."""
    try:
        return from_json(cls, data)
    except WireError as e:
        raise ValidationError(str(path), None, None, e.where, e.message) from None
