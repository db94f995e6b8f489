"""What the daemon answers the control socket, as typed values: a reload's verdict and what ``migctl
resume`` did (what a client asks is ``migd.api.commands``)."""

from __future__ import annotations

from dataclasses import dataclass

from migd.apply.result import ApplyResult


@dataclass(frozen=True)
class Reloaded:
    """A reload's outcome: ``error`` if rejected (the running configuration stays), else ``detail``."""

    error: str | None
    detail: str


@dataclass(frozen=True)
class Resumed:
    """What ``migctl resume`` did: the manual apply lifted (None: none held), the scheduled profile
    now active (None: no schedule entry has fired) and its apply (None: nothing was planned)."""

    lifted: str | None
    profile: str | None
    result: ApplyResult | None
