"""``migd.override/v1``: a manual apply holding until the next scheduled transition, and its file.

The file holds the profile's own text (not a path to it), so what comes back after a restart is
what was applied, even if the file it came from was edited or removed since.  Shown by ``migctl
daemon`` and the metrics; ``migctl resume`` without a running migd drops the file, and a local
``migctl apply`` made while migd is stopped takes its place (:func:`supersede`).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from migd.api.daemon import HeldView
from migd.apply.statefile import atomic_write_json, check_schema, conform, of, optional, read_json, record, utc_time
from migd.errors import ValidationError
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.wire import to_json

SCHEMA = "migd.override/v1"
_SHAPE = record(schema=of(str), profile=of(str), source=of(str), config=optional(of(str)), text=of(str),
                until=optional(utc_time), since=utc_time)
log = logging.getLogger("migd")


@dataclass(frozen=True)
class Override:
    """A manual apply, holding until the next scheduled transition (``until``; None: no more)."""

    profile: Profile  # as applied, even if a configured profile has its name
    until: datetime | None
    since: datetime

    def view(self) -> HeldView:
        return HeldView(self.profile.name, self.profile.source, self.until.isoformat() if self.until else None,
                        self.since.isoformat())

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = to_json(self.view())
        return doc


class OverrideStore:
    """``override.json`` in the state dir (written atomically, mode 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, ov: Override) -> None:
        atomic_write_json(self.path, {"schema": SCHEMA, **ov.to_json(), "config": ov.profile.config,
                                      "text": ov.profile.text})

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def load(self) -> Override | None:
        """The kept override; a damaged one is reported, removed and ignored (the schedule holds)."""
        try:
            raw = read_json(self.path)
            check_schema(self.path, raw, SCHEMA)
            conform(self.path, raw, _SHAPE)
            profile = load_profile(raw["source"], raw["config"], text=raw["text"])
            until = datetime.fromisoformat(raw["until"]) if raw["until"] else None
            return Override(profile, until, datetime.fromisoformat(raw["since"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
            log.error("ignoring the kept manual override %s, which cannot be read: %s", self.path, e)
            self.clear()
            return None


def supersede(store: OverrideStore, kept: Override, profile: Profile, now: datetime) -> Override:
    """A local apply made while migd is stopped, in place of the manual apply kept on disk: it holds until
    the same transition (the next one after the kept apply, which had not come when it was kept: so the
    next one after this apply too, the schedule unchanged; migd derives it again from its schedule at
    start and ends a hold whose transition passed).  Without this, migd's next start put the older apply
    back over the GPUs' newer layout."""
    new = Override(profile, kept.until, now)
    store.save(new)
    return new
