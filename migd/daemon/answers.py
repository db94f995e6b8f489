"""What the daemon answers the control socket, as typed values: a reload's verdict and what ``migctl
resume`` did (what a client asks is ``migd.api.commands``)."""

from __future__ import annotations

from dataclasses import dataclass

from migd.apply.result import ApplyResult
from migd.errors import ValidationError


@dataclass(frozen=True)
class Reloaded:
    """A reload's outcome: ``error`` if rejected (the running configuration stays), else ``detail``."""

    error: str | None
    detail: str


def rejection(e: Exception) -> str:
    """What a rejected reload says of ``e``: a file migd's readers fail on is still only a rejected reload
    (twice a value PyYAML read raised past the readers' checks, and the reload ended migd with a traceback)."""
    if isinstance(e, (ValidationError, OSError)):
        return str(e)
    return f"migd could not read it ({type(e).__name__}: {e}; a fault of migd's reader, worth a report)"


@dataclass(frozen=True)
class Resumed:
    """What ``migctl resume`` did: the manual apply lifted (None: none held), the scheduled profile
    now active (None: no schedule entry has fired) and its apply (None: nothing was planned)."""

    lifted: str | None
    profile: str | None
    result: ApplyResult | None
