"""Files migd keeps in its state dir: written atomically, never through a symlink, read with a
located error when damaged.

A write goes to a fresh temp file (``mkstemp``: O_EXCL, so a planted name is never opened),
is fsync'd, renamed over the target (``rename`` replaces a symlink, it does not follow it) and
the directory fsync'd (the journal's per-GPU outcomes skip the last: see Journal.update).  A
read refuses a symlink (O_NOFOLLOW) and says which file and field is wrong instead of a
traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from migd.errors import ValidationError


def atomic_write_json(path: Path, data: Any, mode: int = 0o600, *, sync_dir: bool = True) -> None:
    atomic_write_text(path, json.dumps(data, separators=(",", ":")), mode, sync_dir=sync_dir)


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
        os.replace(tmp, path)
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


def read_json(path: Path) -> Any:
    """The parsed file; FileNotFoundError if absent, ValidationError if a symlink or not JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValidationError(str(path), None, None, "", "is a symbolic link; migd never follows one in its "
                                  "state dir (someone planted it?)") from None
        raise
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if not text.strip():
        raise ValidationError(str(path), None, None, "", "is empty (a crash while it was first written?)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValidationError(str(path), e.lineno, e.colno, "", f"damaged, not JSON: {e.msg}") from None


def check_schema(path: Path, data: Any, schema: str) -> None:
    """A file migd wrote: an object of ``schema`` (or of no schema: written before versions existed)."""
    if not isinstance(data, dict):
        raise ValidationError(str(path), None, None, "schema", f"not a {schema} object")
    found = data.get("schema", schema)
    if found != schema:
        raise ValidationError(str(path), None, None, "schema", f"{found!r} is not {schema!r}, the version this "
                              "migd reads (written by a newer migd?)")


# -- the inner shape of a state file ----------------------------------------------------------------
# Each file migd keeps is checked field by field when read: a hand edit, a file of the right schema but
# the wrong inner shape, or a damaged one is refused with one line naming the file and the field,
# never a traceback at start-up (a restart loop under systemd) or in ``migctl status``.

Shape = Callable[[Any, str], None]  # raises Misfit(field, what it should be) if the value does not fit


class Misfit(Exception):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where


def conform(path: Path, data: Any, shape: Shape) -> Any:
    """``data`` if it fits ``shape``, else a ValidationError naming ``path`` and the field."""
    try:
        shape(data, "")
    except Misfit as e:
        raise ValidationError(str(path), None, None, e.where.lstrip("."), str(e)) from None
    return data


def of(*types: type) -> Shape:
    names = " or ".join("null" if t is type(None) else t.__name__ for t in types)

    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise Misfit(where, f"{_show(value)} is not {names}")
    return check


class optional:  # noqa: N801  (a shape, named as the others: record(x=optional(of(str))))
    """``shape``, or null, or absent from its record."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    def __call__(self, value: Any, where: str) -> None:
        if value is not None:
            self.shape(value, where)


def one_of(*choices: str) -> Shape:
    def check(value: Any, where: str) -> None:
        if value not in choices:
            raise Misfit(where, f"{_show(value)} is not one of {', '.join(choices)}")
    return check


def utc_time(value: Any, where: str) -> None:
    """An ISO date-time with its UTC offset: without one, Python cannot compare it with migd's clock."""
    of(str)(value, where)
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise Misfit(where, f"{_show(value)} is not an ISO date-time") from None
    if t.tzinfo is None:
        raise Misfit(where, f"{_show(value)} has no UTC offset (e.g. +00:00)")


def digits(value: Any, where: str) -> None:
    if not (isinstance(value, str) and value.isdigit()):
        raise Misfit(where, f"key {_show(value)} is not a number")


def mapping(values: Shape, keys: Shape | None = None) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise Misfit(where, f"{_show(value)} is not a mapping")
        for k, v in value.items():
            if keys is not None:
                keys(k, f"{where}.{k}")
            values(v, f"{where}.{k}")
    return check


def sequence(values: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise Misfit(where, f"{_show(value)} is not a list")
        for k, v in enumerate(value):
            values(v, f"{where}[{k}]")
    return check


def record(**fields: Shape) -> Shape:
    """A mapping with these fields (an ``optional`` one may be absent); others are allowed: fields are
    only ever added within a schema version."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise Misfit(where, f"{_show(value)} is not a mapping")
        for name, shape in fields.items():
            if name not in value and not isinstance(shape, optional):
                raise Misfit(f"{where}.{name}", "missing")
            shape(value.get(name), f"{where}.{name}")
    return check


def _show(value: Any) -> str:
    """A short view of what was found: the type, and a scalar's start (never a whole value)."""
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
