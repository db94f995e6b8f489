"""``/etc/migd/migd.yaml``: validated as a whole, with file/line/field in every error.

A config is only ever replaced by a config that loaded completely (profiles included),
so a bad edit followed by SIGHUP leaves the daemon running on the old one.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from migd.access.accessconf import AccessSettings, parse_access
from migd.access.policy import Unowned
from migd.apply.hooks import Hooks, parse_hooks
from migd.apply.result import OnBusy
from migd.config.schedule import Entry, Schedule, ScheduleError
from migd.errors import ValidationError
from migd.kinds import Word
from migd.paths import socket_too_long
from migd.printable import code, unprintable
from migd.profiles.loader import load_profile, mig_parted_profiles
from migd.profiles.model import Profile
from migd.profiles.validate import check_profile
from migd.slurm.slurmconf import SlurmSettings, parse_slurm
from migd.trust import check_path, file_kind
from migd.yamlsrc import Node, excerpt, load, parse_host_port, read

log = logging.getLogger("migd")
KEYS = ["timezone", "profiles_dir", "schedule", "on_busy", "busy_timeout", "reconcile_interval", "reconcile",
        "metrics", "hooks", "control_socket", "state_dir", "strict_permissions", "sample_interval", "slurm", "access"]


class ReconcileMode(Word):
    """What a reconcile pass does about drift (a scheduled transition always applies)."""

    CORRECT = "correct"
    REPORT = "report"


@dataclass(frozen=True)
class Config:
    path: str
    timezone: ZoneInfo
    profiles_dir: Path
    schedule: Schedule
    profiles: dict[str, Profile]
    on_busy: OnBusy = OnBusy.WAIT
    busy_timeout_s: float = 1800.0
    reconcile_interval_s: float = 60.0
    reconcile: ReconcileMode = ReconcileMode.CORRECT
    metrics_listen: str | None = "127.0.0.1:9835"
    hooks: Hooks = field(default_factory=Hooks)
    control_socket: str | None = None
    state_dir: str | None = None
    sample_interval_s: float = 15.0
    slurm: SlurmSettings | None = None  # Slurm mode: drain, switch, publish GRES, resume
    access: AccessSettings | None = None  # access by owner: each team's instances to its Unix group

    @property
    def summary(self) -> str:
        """What a reload read, as said to the operator: the file, its profiles and transitions."""
        return f"{self.path}: {len(self.profiles)} profiles, {len(self.schedule.entries)} transitions"


def _schedule(node: Node, tz: ZoneInfo, profiles: dict[str, Profile],
              unusable: dict[str, ValidationError]) -> Schedule:
    entries = []
    for item in node.items():
        m = item.mapping(allowed=["profile", "at", "days", "cron"], required=["profile"])
        name = m["profile"].name()
        if name in unusable:
            raise m["profile"].error(f"{excerpt(name)} cannot be applied: {unusable[name]}")
        if name not in profiles:
            raise m["profile"].error(f"no profile named {excerpt(name)} in the profiles directory", sorted(profiles))
        try:
            if "cron" in m:
                if "at" in m or "days" in m:
                    raise item.error("use either cron or at/days, not both")
                entries.append(Entry.cron(name, m["cron"].str()))
            elif "at" in m:
                entries.append(Entry.at(name, m["at"].str(), m["days"].str() if "days" in m else "*"))
            else:
                raise item.error("needs at (with optional days) or cron")
        except ScheduleError as e:
            raise item.error(str(e)) from None
    if not entries:
        raise node.error("must list at least one transition")
    return Schedule(tuple(entries), tz)


class NotADirectory(ValidationError):
    """The profiles directory cannot be listed: said by :func:`load_config` where its file names it."""


def _profile_files(directory: Path) -> list[Path]:
    """The directory's ``*.yaml`` and ``*.yml``, listed: one it cannot list is said (glob found nothing in a
    directory this user may not read, and the schedule's profiles were then said not to exist)."""
    try:
        st = directory.stat()
        if not stat.S_ISDIR(st.st_mode):
            kind = file_kind(st.st_mode) or "a file"
            raise NotADirectory(str(directory), None, None, "", f"the profiles directory is {kind}, not a directory")
        names = os.listdir(directory)
    except OSError as e:  # (ENAMETOOLONG was a bare "[Errno 36] File name too long: '<the path>'")
        raise NotADirectory(str(directory), None, None, "", f"profiles directory cannot be read: "
                            f"{e.strerror or e}") from None
    return sorted(directory / n for n in names if n.endswith((".yaml", ".yml")) and not n.startswith("."))


def load_profiles(directory: Path, strict: bool) -> tuple[dict[str, Profile], dict[str, ValidationError]]:
    """Every ``*.yaml``/``*.yml`` in the directory, each fully validated offline.

    A mig-parted file gives one profile per config, named ``FILE#CONFIG`` (``config-default.yaml#
    all-balanced``), so a site keeps its mig-parted file as the source of truth.  Its configs for GPUs
    this node cannot take are only an error if the schedule names them (second dict)."""
    out: dict[str, Profile] = {}
    unusable: dict[str, ValidationError] = {}
    for f in _profile_files(directory):
        text = read(f, strict, "profile")  # (read once: the kind it is and the profiles are of one reading)
        top = load(f, text).mapping()
        found: list[tuple[str | None, Profile]] = []
        if "mig-configs" not in top:
            found.append((None, load_profile(f, text=text)))
        else:
            _printable_file_name(f)  # (its name is in each of its profiles' names)
            for config, loaded in mig_parted_profiles(f, text=text).items():
                if isinstance(loaded, ValidationError):
                    unusable[f"{f.name}#{config}"] = loaded
                else:
                    found.append((f"{f.name}#{config}", loaded))
        for key, p in found:
            for w in p.warnings:  # read as mig-parted reads it, and worth a look
                log.warning("%s", w)
            try:
                check_profile(p)
            except ValidationError as e:
                if key is None:
                    raise
                unusable[key] = e
                continue
            name = key or p.name
            if name in out:
                raise ValidationError(str(f), None, None, "name", f"profile name {excerpt(name)} is also used by "
                                      f"{out[name].source}")
            out[name] = p
    return out, unusable


def _printable_file_name(f: Path) -> None:
    char = unprintable(f.name)
    if char is not None:
        raise ValidationError(str(f), None, None, "", f"the file's name holds {code(char)}, an unprintable "
                              "character, and names its profiles (FILE#CONFIG): rename it")


def load_config(path: str | Path, text: str | None = None) -> Config:
    root = load(path, text)
    m = root.mapping(allowed=KEYS, required=["schedule"])
    strict = m["strict_permissions"].bool() if "strict_permissions" in m else True
    if text is None:  # always: no setting in a file may switch off the check of that very file
        check_path(path, "config file")
    tz_name = m["timezone"].str() if "timezone" in m else "UTC"
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise m["timezone"].error(f"unknown time zone {excerpt(tz_name)} (an IANA name like Asia/Seoul)") from None
    pdir = Path(path).parent / Path(m["profiles_dir"].str() if "profiles_dir" in m else "profiles")  # (beside
    # the config unless absolute: an absolute profiles_dir replaces the parent)
    try:
        profiles, unusable = load_profiles(pdir, strict)
    except NotADirectory as e:  # (said where the configuration names it, or where its default lies)
        raise (m["profiles_dir"].error(e.message) if "profiles_dir" in m else
               ValidationError(str(pdir), None, None, "", f"{e.message} (the default, beside {Path(path).name}; "
                               "profiles_dir: names another)")) from None
    metrics: str | None = "127.0.0.1:9835"
    if "metrics" in m:
        mm = m["metrics"].mapping(allowed=["listen", "enabled"])
        if "enabled" in mm and not mm["enabled"].bool():
            metrics = None
        elif "listen" in mm:
            metrics = mm["listen"].str()
            try:
                parse_host_port(metrics)
            except ValueError as e:
                raise mm["listen"].error(str(e)) from None
    return Config(
        path=str(path), timezone=tz, profiles_dir=pdir, profiles=profiles,
        schedule=_schedule(m["schedule"], tz, profiles, unusable),
        on_busy=OnBusy(m["on_busy"].str(choices=list(OnBusy))) if "on_busy" in m else OnBusy.WAIT,
        busy_timeout_s=m["busy_timeout"].duration() if "busy_timeout" in m else 1800.0,
        reconcile_interval_s=_at_least_1s(m["reconcile_interval"]) if "reconcile_interval" in m else 60.0,
        reconcile=ReconcileMode(m["reconcile"].str(choices=list(ReconcileMode))) if "reconcile" in m
        else ReconcileMode.CORRECT,
        metrics_listen=metrics,
        hooks=_hooks(m["hooks"], Path(path).parent, strict) if "hooks" in m else Hooks(),
        control_socket=_socket(m["control_socket"]) if "control_socket" in m else None,
        state_dir=m["state_dir"].str() if "state_dir" in m else None,
        sample_interval_s=_at_least_1s(m["sample_interval"]) if "sample_interval" in m else 15.0,
        slurm=parse_slurm(m["slurm"], profiles) if "slurm" in m else None,
        access=parse_access(m["access"]) if "access" in m else None,
    )


def _socket(n: Node) -> str:
    """The control socket's path: it, and the read-only one beside it, must fit a Unix socket's address."""
    path = n.arg()
    why = socket_too_long(Path(path))
    if why is not None:
        raise n.error(why)
    return path


def _at_least_1s(node: Node) -> float:
    """An interval of at least one second: a shorter one is an error, never quietly raised."""
    seconds = node.duration()
    if seconds < 1.0:
        raise node.error(f"{seconds:g}s is too short: at least 1s")
    return seconds


def _hooks(node: Node, base: Path, strict: bool) -> Hooks:
    """``hooks:`` as a mapping of phases, or the path of a mig-parted hooks file (``hooks: hooks-default.yaml``,
    relative to the config's directory; api/hooks/v1: ``version: v1`` and ``hooks:``), read as ``migctl apply
    --hooks`` reads it; others may not rewrite it (StrictModes), as for the config."""
    if not node.is_scalar():
        return parse_hooks(node, strict)
    path = Path(node.str())
    path = path if path.is_absolute() else base / path
    try:
        doc = load(path, strict=strict, what="hooks file").mapping(allowed=["version", "hooks"], required=["hooks"])
    except OSError as e:
        raise node.error(f"hooks file {path}: {e.strerror or e}") from None
    if "version" in doc:
        doc["version"].str(choices=["v1"])
    return parse_hooks(doc["hooks"], strict)


def unmapped_owners(config: Config) -> list[str]:
    """With access by owner: each profile's owners that have no access entry, and what that leaves them."""
    s = config.access
    if s is None or config.slurm is not None and not s.with_slurm:  # (off in Slurm mode unless asked for)
        return []
    where = "open to all" if s.policy.unowned is Unowned.OPEN else "root's only"
    out = []
    for name, p in sorted(config.profiles.items()):
        unmapped = sorted({i.owner for sec in p.sections for i in sec.instances if i.owner} - set(s.policy.owners))
        if unmapped:
            out.append(f"profile {name}: owner(s) {', '.join(unmapped)} have no access entry: their instances are "
                       f"{where}")
    return out


def restart_only(old: Config, new: Config) -> list[str]:
    """The settings read once at start-up (sockets, paths, threads) that differ: a reload can only report
    them."""
    return [name for name, was, now in (("metrics.listen", old.metrics_listen, new.metrics_listen),
                                        ("control_socket", old.control_socket, new.control_socket),
                                        ("state_dir", old.state_dir, new.state_dir),
                                        ("sample_interval", old.sample_interval_s, new.sample_interval_s),
                                        ("slurm", old.slurm, new.slurm)) if was != now]


def restart_note(stale: list[str]) -> str:
    """What a reload's answer adds for ``restart_only``'s settings ("" for none)."""
    return f"; restart needed for {', '.join(stale)}" if stale else ""
