"""Text as it may reach a terminal, a log line or a page, in one place: what is unprintable, and how it is
shown instead.

Names an operator writes are refused at load when they hold an unprintable character
(``yamlsrc.Node.name``); text that cannot be checked at load (Slurm's node names and drain reasons,
NVML's strings, error messages that quote either) is passed through :func:`shown` wherever it is
written as text: migctl's tables and messages, migd's log lines, the page, the notify socket's STATUS.
Otherwise an ESC in a drain reason would reach every user's terminal through the read-only socket
(an escape sequence, or a forged line), and a newline would split one log record into two.  JSON is
left as it is: ``json.dumps`` writes control characters as escapes already.

Unprintable is what Python's ``str.isprintable`` says it is: control characters (C0, DEL, C1), format
characters (the bidi overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width ones), line
and paragraph separators (U+2028, U+2029), spaces other than the space itself, surrogates, private
use and unassigned code points.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable


def unprintable(text: str) -> str | None:
    """The first unprintable character of ``text``, or None when there is none."""
    if text.isprintable():
        return None
    return next(c for c in text if not c.isprintable())


def code(char: str) -> str:
    """A character as a reader looks it up: ``U+001B``."""
    return f"U+{ord(char):04X}"


def shown(text: object) -> str:
    """``text`` with each unprintable character written as Python's ``repr`` writes it, without the
    quotes (``\\x1b``, ``\\n``, ``\\u2028``); printable text is returned as it is.  Backslashes are kept
    as they are, so showing text already shown changes nothing (a log line of a message that was shown
    once is not shown twice)."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def clipped(text: str, keep: int = 37, unit: str | None = None) -> str:
    """``text`` as a message quotes it: whole, or past ``keep`` + 3 characters its first ``keep`` and
    ``...``, with ``unit`` how long it was (``12345... (5000 digits)``).  A value read from a hand-edited
    file or another program's output may be thousands of characters: a message names it, never holds it."""
    if len(text) <= keep + 3:
        return text
    return f"{text[:keep]}..." + (f" ({len(text)} {unit})" if unit else "")


def text_lines(lines: Iterable[str]) -> str:
    """A table or report as text: each line shown (a newline inside one is shown, never a line of its
    own), each ended by a newline."""
    return "".join(f"{shown(line)}\n" for line in lines)


class LineFormatter(logging.Formatter):
    """One log record, one line, whatever its message or its exception holds: a newline or an ESC from
    Slurm or NVML text is shown as its escape (a traceback reads as one line with ``\\n`` in it)."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))
