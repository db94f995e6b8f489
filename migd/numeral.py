"""Whole numbers written as text by someone else (a configuration, a state file, Slurm's or the driver's
output, an environment variable, a command line), in one place.

``str.isdigit`` and ``str.isdecimal`` are not the test: ``'²'.isdigit()`` is true and ``int('²')`` raises,
and ``int`` takes ``'٣'`` (Arabic-Indic three), ``' 3 '`` and ``'+3'``, none of which any of these writers
means.  ``int`` also refuses text of 4,300 digits or more (``sys.get_int_max_str_digits``) with a
ValueError that names no file and no field.  So a number here is ASCII digits only, and few: a caller that
gets None says in its own words where the text came from and what it should have been.
"""

from __future__ import annotations

import re

MOST_DIGITS = 18  # below 2**63: every count, id and duration migd reads fits, and int() never refuses it
FIRST_YEAR, LAST_YEAR = 1970, 9000  # the years of a time migd reads (a user's --now, Slurm's records): Unix time
# (no schedule fires before 1970, Slurm records none), days to years either side still inside datetime (1-9999)

_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def whole(text: str, digits: int = MOST_DIGITS) -> int | None:
    """``text`` as a whole number when it is 1 to ``digits`` ASCII digits (no sign, no space, no
    underscore); None otherwise."""
    if len(text) > digits or _DIGITS.fullmatch(text) is None:
        return None
    return int(text)


def order(text: str) -> int:
    """A sort key for indexes kept as text (GPU ``"10"`` after ``"9"``): the number, -1 (first) for text that
    is none."""
    found = whole(text)
    return -1 if found is None else found


def is_whole(text: str, digits: int = MOST_DIGITS) -> bool:
    """Whether :func:`whole` reads ``text``."""
    return whole(text, digits) is not None
