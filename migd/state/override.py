"""``migd.override/v1``: a manual apply holding until the next scheduled transition, and its file.

The file holds the profile's own text (not a path to it), so what comes back after a restart is
what was applied, even if the file it came from was edited or removed since.  Shown by ``migctl
daemon`` and the metrics; ``migctl resume`` without a running migd drops the file, and a local
``migctl apply`` made while migd is stopped takes its place (:func:`supersede`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from migd.api.daemon import HeldView
from migd.apply.statefile import atomic_write_json, load, set_aside
from migd.errors import ValidationError
from migd.printable import clipped
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.wire import Value

SCHEMA = "migd.override/v1"
log = logging.getLogger("migd")


@dataclass(frozen=True)
class UtcTime(Value):
    """An ISO date-time with its UTC offset: without one, Python cannot compare it with migd's clock (a hand
    edit without one crashed migd's start: a restart loop under systemd)."""

    text: str

    def __post_init__(self) -> None:
        try:
            t = datetime.fromisoformat(self.text)
        except ValueError:
            raise ValueError(f"{_short(self.text)} is not an ISO date-time") from None
        if t.tzinfo is None:
            raise ValueError(f"{_short(self.text)} has no UTC offset (e.g. +00:00)")

    @classmethod
    def of(cls, t: datetime) -> UtcTime:
        return cls(t.isoformat())

    @property
    def time(self) -> datetime:
        return datetime.fromisoformat(self.text)


def _short(text: str) -> str:
    """A value's start, quoted (never a whole hand-edited line)."""
    return clipped(repr(text))


@dataclass(frozen=True, kw_only=True)
class OverrideDoc:
    """``override.json``: the hold as ``migd.daemon/v1`` shows it (:class:`HeldView`'s fields, times
    checked), then what brings the profile back: its mig-configs entry and its own text."""

    SCHEMA: ClassVar[str] = SCHEMA
    profile: str
    source: str
    until: UtcTime | None = None  # None: no more transitions
    since: UtcTime
    config: str | None = None
    text: str


@dataclass(frozen=True)
class Override:
    """A manual apply, holding until the next scheduled transition (``until``; None: no more)."""

    profile: Profile  # as applied, even if a configured profile has its name
    until: datetime | None
    since: datetime

    def view(self) -> HeldView:
        return HeldView(self.profile.name, self.profile.source, self.until.isoformat() if self.until else None,
                        self.since.isoformat())


class OverrideStore:
    """``override.json`` in the state dir (written atomically, mode 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, ov: Override) -> None:
        p, until = ov.profile, UtcTime.of(ov.until) if ov.until else None
        atomic_write_json(self.path, OverrideDoc(profile=p.name, source=p.source, until=until,
                                                 since=UtcTime.of(ov.since), config=p.config, text=p.text))

    def clear(self) -> Path | None:
        """The kept apply gone; a directory in its place (which ``unlink`` refuses and no save could replace)
        is set aside instead, and its new name returned."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            return set_aside(self.path, "unreadable")
        return None

    def load(self) -> Override | None:
        """The kept override; a damaged one is reported, removed and ignored (the schedule holds)."""
        try:
            doc = load(self.path, OverrideDoc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
            self._ignored(e)
            return None
        try:
            profile = load_profile(doc.source, doc.config, text=doc.text)
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:  # (its line and column are
            # the kept text's, not the file's as it may read now)
            self._ignored(f"the copy of {doc.source} it keeps (its text) is not a valid profile: {e}")
            return None
        return Override(profile, doc.until.time if doc.until else None, doc.since.time)

    def _ignored(self, why: object) -> None:
        aside = self.clear()
        log.error("ignoring the kept manual override %s, which cannot be read: %s%s", self.path, why,
                  f"; set aside as {aside}" if aside else "")


def supersede(store: OverrideStore, kept: Override, profile: Profile, now: datetime) -> Override:
    """A local apply made while migd is stopped, in place of the manual apply kept on disk: it holds until
    the same transition (the next one after the kept apply, which had not come when it was kept: so the
    next one after this apply too, the schedule unchanged; migd derives it again from its schedule at
    start and ends a hold whose transition passed).  Without this, migd's next start put the older apply
    back over the GPUs' newer layout."""
    new = Override(profile, kept.until, now)
    store.save(new)
    return new
