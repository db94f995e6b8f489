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
from pathlib import Path
from typing import Any

from migd.yamlsrc import ValidationError


def atomic_write_json(path: Path, data: Any, mode: int = 0o600, *, sync_dir: bool = True) -> None:
    atomic_write_text(path, json.dumps(data, separators=(",", ":")), mode, sync_dir=sync_dir)


def atomic_write_text(path: Path, text: str, mode: int = 0o600, *, sync_dir: bool = True) -> None:
    """``sync_dir=False`` leaves the rename itself to the filesystem's own ordering: after a power
    loss the name then holds the new file or the previous one, each complete (the content was
    fsync'd before the rename).  Only for a file whose previous version is as safe to find."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
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
