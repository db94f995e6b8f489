"""Schedules: weekday conventions, the active profile, and DST transitions in several zones."""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from migd.config.migdyaml import load_config
from migd.config.schedule import Entry, Schedule, ScheduleError, normalize_days
from migd.errors import ValidationError
from tests.helpers import PROFILES, REFERENCE

UTC = timezone.utc
SEOUL = ZoneInfo("Asia/Seoul")


def test_weekday_conventions() -> None:
    assert normalize_days("mon-fri") == "mon,tue,wed,thu,fri"
    assert normalize_days("1-5") == "mon,tue,wed,thu,fri"  # cron numbering, not APScheduler's Mon=0
    assert normalize_days("0") == normalize_days("7") == normalize_days("sun") == "sun"
    assert normalize_days("5-7") == normalize_days("fri-sun") == "sun,fri,sat"
    assert normalize_days("sat,sun") == "sun,sat"
    assert normalize_days("*/2") == "sun,tue,thu,sat"
    for bad in ("funday", "8", "fri-mon"):
        with pytest.raises(ScheduleError):
            normalize_days(bad)
    # a cron line and the at/days form agree, weekday numbers included
    start = datetime(2026, 11, 22, tzinfo=SEOUL)
    a = Schedule((Entry.at("night", "19:00", "mon-fri"),), SEOUL).fire_times(start, start + timedelta(days=14))
    b = Schedule((Entry.cron("night", "0 19 * * 1-5"),), SEOUL).fire_times(start, start + timedelta(days=14))
    assert a == b and len(a) == 10
    assert {t.astimezone(SEOUL).strftime("%a %H:%M") for t, _ in a} == {f"{d} 19:00" for d in
                                                                       ("Mon", "Tue", "Wed", "Thu", "Fri")}


def seoul_schedule() -> Schedule:
    return Schedule((Entry.at("day", "08:30", "mon-fri"), Entry.at("night", "19:00", "mon-fri"),
                     Entry.at("night", "00:00", "sat")), SEOUL)


@pytest.mark.parametrize("local,expected", [
    ("2026-11-23T08:29:59", "night"), ("2026-11-23T08:30:00", "day"), ("2026-11-23T18:59:59", "day"),
    ("2026-11-23T19:00:00", "night"), ("2026-11-28T12:00:00", "night"), ("2026-11-29T23:59:59", "night"),
    ("2026-11-27T08:30:00", "day"),
])
def test_active_profile(local: str, expected: str) -> None:
    now = datetime.fromisoformat(local).replace(tzinfo=SEOUL)
    entry = seoul_schedule().active(now)
    assert entry is not None and entry.profile == expected
    # the same instant expressed in another zone gives the same answer (comparisons are in UTC)
    assert seoul_schedule().active(now.astimezone(ZoneInfo("America/Los_Angeles"))) == entry


def test_tie_break_is_deterministic() -> None:
    s = Schedule((Entry.at("a", "12:00"), Entry.at("b", "12:00")), SEOUL)
    now = datetime(2026, 11, 23, 12, 0, 1, tzinfo=SEOUL)
    assert s.active(now).profile == "b"  # type: ignore[union-attr]
    assert s.next_fire(now - timedelta(seconds=2))[1].profile == "b"  # type: ignore[index]


# (zone, spring-forward local date, fall-back local date); two have their change at 00:00
ZONES = [
    ("America/New_York", date(2026, 3, 8), date(2026, 11, 1)),
    ("Europe/London", date(2026, 3, 29), date(2026, 10, 25)),
    ("America/Santiago", date(2026, 9, 6), date(2026, 4, 5)),  # 00:00 spring-forward
    ("Asia/Beirut", date(2026, 3, 29), date(2026, 10, 25)),   # 00:00 spring-forward
    ("America/Havana", date(2026, 3, 8), date(2026, 11, 1)),  # 00:00 spring-forward, 01:00 fall-back
]


@pytest.mark.parametrize("zone,spring,fall", ZONES)
@pytest.mark.parametrize("hhmm", ["00:00", "00:30", "01:30", "02:30", "08:30"])
def test_dst_never_skips_or_repeats(zone: str, spring: date, fall: date, hhmm: str) -> None:
    tz = ZoneInfo(zone)
    s = Schedule((Entry.at("p", hhmm),), tz)
    for change in (spring, fall):
        start = datetime.combine(change - timedelta(days=4), datetime.min.time(), tz)
        fires = s.fire_times(start, start + timedelta(days=9))
        times = [t for t, _ in fires]
        assert times == sorted(set(times))
        per_day = Counter(t.astimezone(tz).date() for t in times)
        # every local date fires exactly once; a wall time in a spring-forward gap fires when it ends
        assert all(n == 1 for n in per_day.values()), per_day
        expected = {change - timedelta(days=4) + timedelta(days=i) for i in range(9)}
        if hhmm == "00:00":
            expected.discard(change - timedelta(days=4))  # the start instant itself is excluded
        assert set(per_day) >= expected - {max(expected)}
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert all(timedelta(hours=22) <= g <= timedelta(hours=26) for g in gaps), gaps


@pytest.mark.parametrize("zone, wall, fires_local", [
    ("America/New_York", "2026-03-08T02:30", "2026-03-08T03:00:00-04:00"),
    ("Europe/Berlin", "2026-03-29T02:15", "2026-03-29T03:00:00+02:00"),
    ("Australia/Sydney", "2026-10-04T02:30", "2026-10-04T03:00:00+11:00"),
])
def test_a_time_in_a_dst_gap_fires_when_the_gap_ends(zone: str, wall: str, fires_local: str) -> None:
    """Not an hour late (03:30 in New York), as zoneinfo's fold=0 reading of the gap would have it."""
    tz = ZoneInfo(zone)
    hhmm = wall[11:16]
    s = Schedule((Entry.at("p", hhmm),), tz)
    day_before = datetime.fromisoformat(wall).replace(tzinfo=tz) - timedelta(hours=20)
    hit = s.next_fire(day_before)
    assert hit is not None and hit[0].astimezone(tz).isoformat() == fires_local


@pytest.mark.parametrize("expr", ["0 8 30 2 *", "0 8 31 4 *", "0 8 31 6,9,11 *"])
@pytest.mark.integration
def test_a_cron_date_that_never_comes_is_refused(expr: str) -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        Entry.cron("p", expr)
    Entry.cron("p", "0 8 29 2 *")  # leap days do come


@pytest.mark.parametrize("zone,spring,fall", ZONES)
@pytest.mark.integration
def test_a_year_of_weekday_transitions(zone: str, spring: date, fall: date) -> None:
    tz = ZoneInfo(zone)
    s = Schedule((Entry.at("day", "08:30", "mon-fri"), Entry.at("night", "00:00", "1-5")), tz)
    start = datetime(2026, 1, 1, 1, tzinfo=tz)
    fires = s.fire_times(start, start + timedelta(days=365))
    days = Counter(t.astimezone(tz).date() for t, _ in fires)
    weekdays = [start.date() + timedelta(days=i) for i in range(1, 365)]
    for d in weekdays:
        assert days[d] == (2 if d.weekday() < 5 else 0), d


def _cfg(tmp_path: Path, body: str) -> Path:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    for name in ("day", "night"):
        (tmp_path / "profiles" / f"{name}.yaml").write_text((PROFILES / f"{name}.yaml").read_text())
    p = tmp_path / "migd.yaml"
    p.write_text(body)
    return p


@pytest.mark.parametrize("body,needle,line", [
    ("schedule:\n  - {profile: day, at: '25:00'}\n", "not a time of day", 2),
    ("schedule:\n  - {profile: dya, at: '08:30'}\n", "no profile named 'dya'", 2),
    ("schedule:\n  - {profile: day, at: '08:30', days: 'mon-fry'}\n", "not a weekday", 2),
    ("schedule:\n  - {profile: day, cron: '0 19 * *'}\n", "5 fields", 2),
    ("schedule:\n  - {profile: day, at: '08:30'}\non_busy: sometimes\n", "not allowed", 3),
    ("schedule:\n  - {profile: day, at: '08:30'}\nbusy_timeout: soon\n", "not a duration", 3),
    ("schedule:\n  - {profile: day, at: '08:30'}\nmetrics: {listen: 'nope'}\n", "HOST:PORT", 3),
    ("schedule:\n  - {profile: day, at: '08:30'}\nhooks:\n  apply-start:\n    - {command: [rm, -rf]}\n",
     "absolute path", 5),
    ("schedule: []\n", "at least one", 1),
    # str.isdigit takes '²' and int refuses it: each was a traceback from `migd --check`
    ("schedule:\n  - {profile: day, at: '08:30', days: '²'}\n", "'²' is not a weekday", 2),
    ("schedule:\n  - {profile: day, at: '08:30', days: 'mon-²'}\n", "'²' is not a weekday", 2),
    ("schedule:\n  - {profile: day, at: '08:30', days: '*/²'}\n", "bad step in weekday field", 2),
    ("schedule:\n  - {profile: day, cron: '0 8 * * ²'}\n", "is not a cron expression: ASCII", 2),
    ("schedule:\n  - {profile: day, cron: '0 ٨ * * *'}\n", "is not a cron expression: ASCII", 2),
    ("schedule:\n  - {profile: day, at: '٠:٣٠'}\n", "not a time of day", 2),
    ("schedule:\n  - {profile: day, at: '08:30'}\nmetrics: {listen: '127.0.0.1:98²'}\n", "is not HOST:PORT", 3),
    ("schedule:\n  - {profile: day, at: '08:30'}\nmetrics: {listen: 'a..b:9835'}\n", "the host is not an IP", 3),
    # read as [::1]:9835 it was a guess: '::1:9835' is also the address 0:0:0:0:0:0:1:9835, no port given
    ("schedule:\n  - {profile: day, at: '08:30'}\nmetrics: {listen: '::1:9835'}\n", "in brackets", 3),
])
def test_config_errors_are_located(tmp_path: Path, body: str, needle: str, line: int) -> None:
    with pytest.raises(ValidationError) as e:
        load_config(_cfg(tmp_path, body))
    assert needle in str(e.value) and e.value.line == line and "migd.yaml" in e.value.file, str(e.value)


@pytest.mark.parametrize("listen", ["*:9835", "gpu_node1:9835", "[::]:9835", "localhost:0", "node1.lab.:9835"])
def test_listen_addresses_operators_write_are_taken(tmp_path: Path, listen: str) -> None:
    """``*`` binds every interface and host names may hold ``_`` (/etc/hosts): refusing them would stop a
    configuration that worked at its ``--check`` after an upgrade."""
    body = f"schedule:\n  - {{profile: day, at: '08:30'}}\nmetrics: {{listen: '{listen}'}}\n"
    cfg = load_config(_cfg(tmp_path, body))
    assert cfg.metrics_listen == listen


def test_config_loads(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "timezone: Asia/Seoul\nschedule:\n  - {profile: day, at: '08:30', days: "
                                     "mon-fri}\n  - {profile: night, cron: '0 19 * * 1-5'}\nbusy_timeout: 30m\n"))
    assert cfg.busy_timeout_s == 1800 and set(cfg.profiles) == {"day", "night"}
    now = datetime(2026, 11, 23, 20, tzinfo=SEOUL)
    assert cfg.schedule.active(now).profile == "night"  # type: ignore[union-attr]


@pytest.mark.integration
def test_a_schedule_names_configs_of_a_mig_parted_file(tmp_path: Path) -> None:
    """A site keeps NVIDIA's config-default.yaml as the source of truth: the schedule names
    FILE#CONFIG; configs for GPUs the catalog cannot check are an error only when scheduled."""
    cfg = _cfg(tmp_path, "schedule:\n  - {profile: 'config-default.yaml#all-1g.10gb', at: '08:30'}\n"
                         "  - {profile: 'config-default.yaml#all-disabled', at: '19:00'}\n")
    (tmp_path / "profiles" / "config-default.yaml").write_text(
        (REFERENCE / "mig-parted-config-default.yaml").read_text())
    c = load_config(cfg)
    assert c.profiles["config-default.yaml#all-1g.10gb"].kind == "mig-parted"
    assert "config-default.yaml#all-disabled" in c.profiles
    # Every config of NVIDIA's file plans on some catalog model (tests/test_config_default.py); a
    # site file with one that fits no GPU still loads, and fails only where the schedule names it.
    (tmp_path / "profiles" / "site.yaml").write_text(
        "version: v1\nmig-configs:\n  fits:\n    - devices: all\n      mig-enabled: true\n"
        "      mig-devices: {\"3g.40gb\": 2}\n  overfull:\n    - device-filter: \"0x20B210DE\"\n"
        "      devices: all\n      mig-enabled: true\n      mig-devices: {\"4g.40gb\": 1, \"3g.40gb\": 1, "
        "\"1g.10gb\": 1}\n")
    assert "site.yaml#fits" in load_config(cfg).profiles
    bad = _cfg(tmp_path, "schedule:\n  - {profile: 'site.yaml#overfull', at: '08:30'}\n")
    with pytest.raises(ValidationError, match="cannot be applied"):
        load_config(bad)


def test_a_day_s_fire_times_are_worked_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if asks the clock's layout every minute of a replay: a trigger built per question made a
    30-day record of two jobs take 39 s, most of it APScheduler.  The same day is worked out once."""
    import migd.config.schedule as schedule
    built: list[int] = []
    real = schedule.CronTrigger

    def counting(**kw: object) -> object:
        built.append(1)
        return real(**kw)  # type: ignore[arg-type]
    monkeypatch.setattr(schedule, "CronTrigger", counting)
    s = Schedule((Entry.cron("day", "17 8 * * mon-fri"), Entry.cron("night", "17 19 * * mon-fri")), SEOUL)
    start = datetime(2031, 3, 3, tzinfo=SEOUL)  # a Monday no other test asks about
    answers = [s.active(start + timedelta(minutes=m)) for m in range(0, 3 * 24 * 60, 7)]
    assert [e.profile if e else None for e in answers].count("day") > 0
    assert len(built) <= 2 * 10  # each entry, each day the scans touch: not one per question (~600)
    assert s.active(start + timedelta(hours=12)) == Entry.cron("day", "17 8 * * mon-fri")
