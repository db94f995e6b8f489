"""How long a manual apply holds: made at the apply, derived again whenever the schedule changes.

The override itself and its file are ``migd.state.override``."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime

from migd.profiles.model import Profile
from migd.state.override import Override, OverrideStore

log = logging.getLogger("migd")
NextFire = Callable[[datetime], "datetime | None"]  # the schedule's next transition after a time


def hold(store: OverrideStore, profile: Profile, next_fire: NextFire, now: datetime) -> Override:
    """A manual apply holds until the next scheduled transition, across restarts too."""
    ov = Override(profile, next_fire(now), now)
    try:
        store.save(ov)
    except OSError as e:
        log.error("the manual apply of %s holds, but cannot be kept across a restart: %s", profile.name, e)
    return ov


def rehold(store: OverrideStore, ov: Override, next_fire: NextFire, now: datetime) -> Override:
    """The hold derived again from the schedule as it is now (a reload, or a start with a changed config):
    until its next transition.  One whose end already passed is left to end."""
    if ov.until is not None and ov.until <= now:
        return ov
    new = dataclasses.replace(ov, until=next_fire(now))
    if new != ov:
        log.info("manual apply of %s now holds until %s (the schedule changed)", new.profile.name,
                 new.until.isoformat() if new.until else "no further scheduled transition")
        with contextlib.suppress(OSError):  # (held in memory; the next start derives it again)
            store.save(new)
    return new
