"""Which profile should be active at a given instant, and when the next transition is.

APScheduler 3.x's ``CronTrigger`` does the cron field arithmetic, but in a DST zone it
skips days around spring-forward (a 00:00 trigger in America/New_York jumps from
2026-03-08 to 2026-03-10).  So triggers run in a fixed-offset zone, where they have no
DST to get wrong, producing local wall-clock fire times; each is then placed on the real
timeline with ``zoneinfo`` (fold=0): a wall time that does not exist (spring-forward
gap) fires when the gap ends, an ambiguous one (fall-back) fires once, at its first
occurrence.  Every comparison is between aware UTC datetimes.

Weekdays: names (``mon-fri``) are preferred; numbers follow cron (0 and 7 are Sunday,
so ``1-5`` is Monday to Friday), never APScheduler's Monday=0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

from migd.numeral import whole
from migd.yamlsrc import excerpt

UTC = timezone.utc
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_HHMM = re.compile(r"^([01]?[0-9]|2[0-3]):([0-5][0-9])$", re.ASCII)
SCAN_DAYS = 400  # enough for any yearly cron expression
MAX_CRON = 200  # characters; APScheduler reads digits as int does, '٨' as 8, so a cron line is ASCII


class ScheduleError(ValueError):
    pass


def _day_number(token: str) -> int:
    t = token.strip().lower()[:3]
    if t in DAY_NAMES:
        return DAY_NAMES.index(t)
    number = whole(t, 1)
    if number is not None and number <= 7:
        return number % 7  # cron: 0 and 7 are Sunday
    raise ScheduleError(f"{excerpt(token)} is not a weekday (use mon..sun, or cron numbers 0-7 with 0/7 = Sunday)")


def normalize_days(spec: str) -> str:
    """Cron-style weekday field -> explicit APScheduler name list (no numeric ambiguity)."""
    spec = spec.strip().lower()
    if spec in ("*", "", "daily", "every day"):
        return "*"
    days: set[int] = set()
    for part in spec.split(","):
        step = 1
        if "/" in part:
            part, s = part.split("/", 1)
            step = whole(s, 1) or 0
            if step < 1:
                raise ScheduleError(f"bad step in weekday field {excerpt(spec)}")
        if part in ("*", ""):
            lo, hi = 0, 6
        elif "-" in part:
            a, b = part.split("-", 1)
            lo, hi = _day_number(a), _day_number(b)
            if b.strip() == "7" or (hi < lo and b.strip()[:3] == "sun"):
                hi = 7  # "5-7" / "fri-sun": through Sunday
            if hi < lo:
                raise ScheduleError(f"weekday range {excerpt(part)} runs backwards")
        else:
            lo = hi = _day_number(part)
        days.update(d % 7 for d in range(lo, hi + 1, step))
    return ",".join(DAY_NAMES[d] for d in sorted(days))


def place(wall: datetime, tz: ZoneInfo) -> datetime:
    """The real instant (UTC) of local wall time ``wall``: an ambiguous one (fall-back) at its first
    occurrence; one that does not exist (spring-forward gap) when the gap ends, i.e. at the
    transition itself (New York 02:30 on 2026-03-08 fires at 03:00 EDT, not 03:30)."""
    t = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if t.astimezone(tz).replace(tzinfo=None) == wall:
        return t
    lo, hi = wall.replace(tzinfo=tz, fold=1).astimezone(UTC), t  # the transition lies between
    after = hi.astimezone(tz).utcoffset()
    while hi - lo > timedelta(microseconds=1):  # ~33 halvings; transitions fall on whole seconds
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


@dataclass(frozen=True)
class Entry:
    """One schedule line: ``profile`` becomes active at every fire time of the trigger."""

    profile: str
    fields: tuple[tuple[str, str], ...]  # CronTrigger keyword fields
    text: str  # as written, for messages

    @classmethod
    def at(cls, profile: str, hhmm: str, days: str = "*") -> Entry:
        m = _HHMM.match(hhmm.strip())
        if not m:
            raise ScheduleError(f"{excerpt(hhmm)} is not a time of day HH:MM")
        fields = (("minute", str(int(m.group(2)))), ("hour", str(int(m.group(1)))),
                  ("day_of_week", normalize_days(days)))
        _ = CronTrigger(**dict(fields), timezone=UTC)
        return cls(profile, fields, f"{profile} at {hhmm} on {days}")

    @classmethod
    def cron(cls, profile: str, expr: str) -> Entry:
        if not expr.isascii() or len(expr) > MAX_CRON:
            raise ScheduleError(f"{excerpt(expr)} is not a cron expression: ASCII, at most {MAX_CRON} characters")
        parts = expr.split()
        if len(parts) != 5:
            raise ScheduleError(f"{excerpt(expr)}: a cron expression has 5 fields (minute hour day month weekday)")
        fields = (("minute", parts[0]), ("hour", parts[1]), ("day", parts[2]), ("month", parts[3]),
                  ("day_of_week", normalize_days(parts[4])))
        try:
            trigger = CronTrigger(**dict(fields), timezone=UTC)
        except ValueError as e:
            raise ScheduleError(f"{excerpt(expr)}: {e}") from None
        if trigger.get_next_fire_time(None, datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise ScheduleError(f"{excerpt(expr)} never fires (no such date, e.g. February 30)")
        return cls(profile, fields, f"{profile} at cron {expr!r}")

    def fires_on(self, day: date, tz: ZoneInfo) -> tuple[datetime, ...]:
        """Real instants (UTC) this entry fires at whose local wall-clock date is ``day``."""
        return _fires_on(self.fields, day, tz)


@lru_cache(maxsize=4096)
def _fires_on(fields: tuple[tuple[str, str], ...], day: date, tz: ZoneInfo) -> tuple[datetime, ...]:
    """Memoized: the answer depends on its arguments alone, and a replay or a scan back over a yearly
    cron expression asks the same days thousands of times (a CronTrigger costs about 0.1 ms to build)."""
    fixed = timezone(tz.utcoffset(datetime.combine(day, time(12))) or timedelta(0))
    trig = CronTrigger(**dict(fields), timezone=fixed)
    out = []
    f = trig.get_next_fire_time(None, datetime.combine(day, time(0), fixed))
    while f is not None and f.date() == day:
        out.append(place(f.replace(tzinfo=None), tz))
        f = trig.get_next_fire_time(f, f + timedelta(microseconds=1))
    return tuple(out)


@dataclass(frozen=True)
class Schedule:
    entries: tuple[Entry, ...]
    tz: ZoneInfo

    def _fires(self, day: date) -> list[tuple[datetime, int]]:
        return [(t, i) for i, e in enumerate(self.entries) for t in e.fires_on(day, self.tz)]

    def last_fire(self, now: datetime) -> tuple[datetime, Entry] | None:
        """The latest fire time <= ``now``; at equal instants the later-listed entry wins."""
        now = now.astimezone(UTC)
        local = now.astimezone(self.tz).date()
        for back in range(-1, SCAN_DAYS):  # -1: a gap shift can move a wall time to the next date
            hits = [(t, i) for t, i in self._fires(local - timedelta(days=back)) if t <= now]
            if hits:
                t, i = max(hits)
                return t, self.entries[i]
        return None

    def active(self, now: datetime) -> Entry | None:
        hit = self.last_fire(now)
        return hit[1] if hit else None

    def next_fire(self, now: datetime) -> tuple[datetime, Entry] | None:
        """The earliest fire time strictly after ``now``."""
        now = now.astimezone(UTC)
        local = now.astimezone(self.tz).date()
        for ahead in range(-1, SCAN_DAYS):
            hits = [(t, i) for t, i in self._fires(local + timedelta(days=ahead)) if t > now]
            if hits:
                t, i = min(hits, key=lambda x: (x[0], -x[1]))
                return t, self.entries[i]
        return None

    def fire_times(self, start: datetime, end: datetime) -> list[tuple[datetime, str]]:
        """Every transition in (start, end], in order (for tests and ``migd --explain``)."""
        out: list[tuple[datetime, str]] = []
        t = start
        while True:
            hit = self.next_fire(t)
            if hit is None or hit[0] > end:
                return out
            out.append((hit[0], hit[1].profile))
            t = hit[0]
