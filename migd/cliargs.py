"""Command-line parsing shared by migd and migctl: a usage error is one line, exit code 2."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from migd.numeral import FIRST_YEAR, LAST_YEAR, MOST_DIGITS, whole
from migd.printable import clipped
from migd.yamlsrc import SECONDS_RANGE, parse_duration, parse_host_port, within_a_year

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument gets one line naming it (not the whole usage block), and a value that
    starts with a minus and a digit (``--busy-timeout -5m``) is the option's value, refused by its type in
    words, not an unknown option ("expected one argument")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\.?\d|inf|nan)", re.I)  # (no option of ours looks like -5)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


MIN_SCALE, MAX_SCALE = 1e-3, 1e5  # --time-scale: 1e5 runs a year in 5 minutes; past it the loop's waits are
# below a millisecond, and from year 9000 it would reach 9999 (the end of datetime) within days


def typed(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type=`` that turns the parser's ValueError into argparse's one-line usage error."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__  # argparse names the type in some messages
    return convert


_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?|[+-]?(?:inf|nan)", re.ASCII | re.I)


def _number(text: str, minimum: float, strict: bool) -> float:
    """A decimal number as a person types it: ASCII (``float`` also takes ``1_000`` and fullwidth digits)."""
    value = float(text) if _FLOAT.fullmatch(text.strip()) else math.nan
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise ValueError(f"must be a number {'above' if strict else 'of at least'} {minimum:g}, not {text!r}")
    return value


def _seconds(text: str) -> float:
    value = _number(text, 0.0, strict=False)
    if not within_a_year(value):
        raise ValueError(f"must be {SECONDS_RANGE}, not {text[:40]!r}")
    return value


def _count(text: str) -> int:
    number = whole(text.strip())
    if number is None or number < 1:
        raise ValueError(f"must be a whole number above 0 of at most {MOST_DIGITS} digits, not {clipped(text)!r}")
    return number


def count_upto(most: int, why: str) -> Callable[[str], int]:
    """A count of at most ``most``: more is refused in one line saying ``why``."""
    def count(text: str) -> int:
        value = _count(text)
        if value > most:
            raise ValueError(f"must be at most {most} ({why}), not {text.strip()!r}")
        return value
    return typed(count)


def _iso(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an ISO date-time (e.g. 2026-11-23T18:59:30): {clipped(text)!r}") from None
    if not FIRST_YEAR <= value.year <= LAST_YEAR:
        raise ValueError(f"{text!r} is outside the years {FIRST_YEAR} to {LAST_YEAR} (a schedule fires on Unix "
                         "time, and a clock past year 9999 stops)")
    return value


def _scale(text: str) -> float:
    value = _number(text, 0.0, strict=True)
    if not MIN_SCALE <= value <= MAX_SCALE:
        raise ValueError(f"must be from {MIN_SCALE:g} to {MAX_SCALE:g}, not {clipped(text)!r}")
    return value


def _duration(text: str) -> float:
    if text.strip().startswith("-"):
        raise ValueError(f"a duration cannot be negative, not {text!r} (0 or more: 90, 30s, 5m, 1h30m)")
    return parse_duration(text)


def _listen(text: str) -> str:
    parse_host_port(text)
    return text


# Every option value is parsed into its type where it is read: one line and exit 2, never a traceback.
duration = typed(_duration)  # 90, 30s, 5m, 1h30m -> seconds; never negative
seconds = typed(_seconds)  # finite, 0 to a year (what migd takes on its socket)
scale = typed(_scale)  # a clock's speed: MIN_SCALE to MAX_SCALE
count = typed(_count)  # 1, 2, ...
iso_time = typed(_iso)
host_port = typed(_listen)  # HOST:PORT, kept as text
