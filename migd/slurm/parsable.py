"""``sacct --parsable2`` read as rows of named fields: the part shared by the demand planner, which seeds
its run times from accounting (slurm/history.py), and ``migctl what-if``, which replays a record
(whatif/sacct.py).  It lives here, below both, because the planner may not import the what-if.

The first non-empty line names the fields (any order, any more of them); each line after it is one
row, its fields separated by ``|`` (``--parsable``'s trailing ``|`` is read too).  Times are as sacct
prints them by default (ISO, ``2026-11-28T03:46:32``, the local time of whoever ran sacct, with no UTC offset);
Slurm times (``D-HH:MM:SS``, ``UNLIMITED``) as :func:`seconds` reads them.  A line that cannot be read is one
``SacctError``: ``source:line: field: what``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from migd.numeral import FIRST_YEAR, LAST_YEAR, whole

_NEVER = ("UNKNOWN", "NONE", "")
# (Slurm records Unix times, none before 1970; what reads them works days to a year or two either side of
# them, a replay's schedule and its tail, which must stay inside Python's datetime: years 1 to 9999)


def seconds(limit: str) -> float:
    """A Slurm time as sacct and scontrol print it (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``MM``;
    UNLIMITED: infinite)."""
    if limit.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT", ""):
        return float("inf")
    days, _, rest = limit.rpartition("-")
    found = [whole(x, 9) for x in rest.split(":")]
    parts = [x for x in found if x is not None]
    if len(parts) != len(found) or len(parts) > 3 or (days and whole(days, 9) is None):
        raise ValueError(f"{limit!r} is not a Slurm time")
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


class SacctError(ValueError):
    """One line: source, line, field and what is wrong."""


@dataclass(frozen=True)
class Row:
    where: str  # source:line
    fields: Mapping[str, str]  # lower-case field name -> its text

    def get(self, name: str) -> str:
        return self.fields.get(name.lower(), "").strip()

    def error(self, name: str, what: str) -> SacctError:
        return SacctError(f"{self.where}: {name}: {what}")

    def time(self, name: str) -> datetime | None:
        """An ISO time, or None for ``Unknown``/``None``/empty (not started, not ended)."""
        text = self.get(name)
        if text.upper() in _NEVER:
            return None
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise self.error(name, f"{text!r} is not a time as sacct prints it (2026-11-28T03:46:32; "
                             "unset SLURM_TIME_FORMAT)") from None
        if value.tzinfo is not None:  # beside sacct's own naive times it could be compared with none
            raise self.error(name, f"{text!r} has a UTC offset: sacct prints its caller's local time without "
                             "one (2026-11-28T03:46:32; unset SLURM_TIME_FORMAT)")
        if not FIRST_YEAR <= value.year <= LAST_YEAR:
            raise self.error(name, f"{text!r} is no time a cluster ran at (Slurm records Unix times: years "
                             f"{FIRST_YEAR} to {LAST_YEAR} are read)")
        return value

    def duration(self, name: str) -> float:
        """A positive Slurm time in seconds (``UNLIMITED``, ``Partition_Limit``: infinite)."""
        text = self.get(name)
        try:
            value = seconds(text)
        except ValueError:
            raise self.error(name, f"{text!r} is not a Slurm time (D-HH:MM:SS, HH:MM:SS, MM:SS, UNLIMITED, "
                             "Partition_Limit)") from None
        if value <= 0:
            raise self.error(name, f"{text!r} is not a positive time")
        return value


def read_rows(source: str, text: str, needed: Sequence[str], hint: str,
              any_of: Sequence[str] = ()) -> list[Row]:
    """The rows of ``text`` under its header, which must name every field of ``needed`` and, when
    ``any_of`` is given, one of those; ``hint`` says the command that prints such a record."""
    lines = text.splitlines()
    number, header = next(((n, h) for n, h in enumerate(lines, 1) if h.strip()), (0, ""))
    if not header:
        raise SacctError(f"{source}: empty: the first line must name the fields ({hint})")
    names = _split(header)
    missing = [f for f in needed if f.lower() not in names]
    if any_of and not {f.lower() for f in any_of} & set(names):
        missing = missing or [" or ".join(any_of)]
    if missing:
        raise SacctError(f"{source}:{number}: the header names no {', '.join(missing)} ({hint}; "
                         "a header is needed: no --noheader)")
    return [Row(f"{source}:{n}", dict(zip(names, _fields(source, n, line, len(names)), strict=True)))
            for n, line in enumerate(lines[number:], number + 1) if line.strip()]


def is_step(row: Row) -> bool:
    """A job step (``123.batch``, ``123.0``; without JobID, a line with neither Partition nor Timelimit,
    as sacct prints steps): it runs inside its job's allocation, and is no job of its own."""
    if "jobid" in row.fields:
        return "." in row.get("JobID")
    return not row.get("Partition") and not row.get("Timelimit")


def _split(line: str) -> list[str]:
    parts = line.rstrip("\n").split("|")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # --parsable ends each line with a |
    return [p.strip().lower() for p in parts]


def _fields(source: str, number: int, line: str, count: int) -> list[str]:
    parts = line.split("|")
    if len(parts) == count + 1 and parts[-1] == "":
        parts.pop()
    if len(parts) != count:
        raise SacctError(f"{source}:{number}: {len(parts)} fields where the header names {count} (a '|' inside a "
                         "field? sacct --parsable2 separates with '|')")
    return parts
