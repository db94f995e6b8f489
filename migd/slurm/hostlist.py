"""Slurm's hostlists (``gpu1``, ``gpu[1-3,5]``, ``a1,b[2-3]``) as node names, bounded: one reader for every
list migd takes from Slurm's output or a what-if's record."""

from __future__ import annotations

import re

from migd.numeral import whole

MAX_HOSTLIST = 1 << 20  # names in one hostlist migd expands from Slurm's output: past any cluster's size, so
# that a list like n[1-99999999] (a misread line, a hand-made node range) cannot fill migd's memory


def hostnames(expr: str, most: int | None = None) -> set[str] | None:
    """A hostlist (``gpu1``, ``gpu[1-3,5]``, ``a1,b[2-3]``) as names; None if it is a form not read here.
    ``most``: a list naming more nodes is a ValueError, counted before any name is made (``n[1-99999999]``
    would otherwise fill memory)."""
    names: set[str] = set()
    counted = 0
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\]", part)
        if m is None:
            names.add(part)
            continue
        for r in m.group(2).split(","):
            lo, _, hi = r.partition("-")
            first, last = whole(lo), whole(hi or lo)
            if first is None or last is None:
                return None
            counted += max(0, last - first + 1)
            if most is not None and counted > most:
                raise ValueError(f"names more than {most} nodes")
            names.update(f"{m.group(1)}{n:0{len(lo)}d}" for n in range(first, last + 1))
    return names


def bounded_hostnames(expr: str) -> set[str] | None:
    """:func:`hostnames` of Slurm's output, None (not read here: its callers then assume the worst) for a
    list naming more than MAX_HOSTLIST nodes."""
    try:
        return hostnames(expr, most=MAX_HOSTLIST)
    except ValueError:
        return None
