"""The control socket's documents: one JSON request line, one JSON reply line per connection.

Every request and every reply is a wire type here, read and written by ``wire.py`` alone, so the
server (``migd.daemon.server``) and migctl (``migd.ctl.client``, ``migd.ctl.remote``) spell no field
of their own.  Fields are only ever added; a reader ignores fields it does not know (an older migd
takes a newer migctl's request).  The limits bound what either end reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from migd.api.checks import DaemonAudit
from migd.api.daemon import DaemonDoc, Fault, HeldView, SimClock
from migd.api.plan import ApplyDoc
from migd.api.status import StatusDoc
from migd.apply.result import OnBusy
from migd.errors import ValidationError
from migd.isolation.audit import Finding
from migd.kinds import Word
from migd.wire import OMIT_NONE, JsonError, JsonFault, from_json, loads
from migd.yamlsrc import SECONDS_RANGE, within_a_year

MAX_REQUEST = 1 << 20  # bytes of one request line
MAX_REPLY = 16 << 20  # bytes of one reply line (a 64-GPU node's status is well under 1 MiB)
T = TypeVar("T")
DAEMON_LOCK_TIMEOUT_S = 30.0  # how long migd's own applies wait for the apply lock (a migctl --local)


class Command(Word):
    """What a client may ask; the read-only socket answers those that only look."""

    STATUS = "status"  # the daemon's state: DaemonReply
    LAYOUT = "layout"  # the GPUs as migd's sampler last read them: LayoutReply
    ISOLATION = "isolation"  # migd's last audit and its fault marks: IsolationReply
    RELOAD = "reload"  # ReloadReply
    APPLY = "apply"  # ApplyRequest -> ApplyReply
    RESUME = "resume"  # ResumeReply
    CLEAR_FAULT = "clear-fault"  # ClearFault -> ClearedReply


@dataclass(frozen=True)
class Ask:
    """A request that is its command alone (every request's head)."""

    cmd: Command


@dataclass(frozen=True)
class ClearFault:
    cmd: Command
    gpu: str  # an index or a UUID


@dataclass(frozen=True)
class ManualApply:
    """What a client may choose for an apply migd does on its behalf (hooks stay the daemon's)."""

    on_busy: OnBusy = OnBusy.REFUSE
    dry_run: bool = False
    busy_timeout_s: float | None = None  # None: the daemon's busy_timeout
    lock_timeout_s: float = DAEMON_LOCK_TIMEOUT_S
    parallel: bool = True
    mode_only: bool = False

    def __post_init__(self) -> None:
        """The timeouts as a duration in migd.yaml may be: NaN or infinity (JSON from a client that is not
        migctl) made a manual apply wait for ever, holding the apply lock, while saying "up to nans"."""
        for name in ("busy_timeout_s", "lock_timeout_s"):
            value = getattr(self, name)
            if value is not None and not within_a_year(value):
                raise ValueError(f"{name} {value!r}: must be {SECONDS_RANGE}")


@dataclass(frozen=True)
class ApplyRequest:
    """An apply handed to migd: the profile's text, read by the client as the user who runs it (migd,
    sandboxed, opens no client's path), the path for messages, and the options, flat on the wire.
    With ``withdraw_on_hangup`` (migctl's) the client closing its end cancels the apply."""

    cmd: Command
    file: str
    text: str | None = None  # None: an older client that sent only the path
    config: str | None = None
    on_busy: OnBusy = OnBusy.REFUSE
    dry_run: bool = False
    busy_timeout_s: float | None = None
    lock_timeout_s: float = DAEMON_LOCK_TIMEOUT_S
    parallel: bool = True
    mode_only: bool = False
    withdraw_on_hangup: bool = False

    def __post_init__(self) -> None:
        self.options  # noqa: B018 - checks the numbers (ValueError), as they arrive

    @classmethod
    def of(cls, file: str, text: str, config: str | None, options: ManualApply,
           withdraw_on_hangup: bool = False) -> ApplyRequest:
        o = options
        return cls(Command.APPLY, file, text, config, o.on_busy, o.dry_run, o.busy_timeout_s, o.lock_timeout_s,
                   o.parallel, o.mode_only, withdraw_on_hangup)

    @property
    def options(self) -> ManualApply:
        return ManualApply(self.on_busy, self.dry_run, self.busy_timeout_s, self.lock_timeout_s, self.parallel,
                           self.mode_only)

    def profile_text(self) -> str:
        if self.text is None:
            raise ValidationError(self.file, None, None, "", "the request carries no profile text; migd reads "
                                  "no client's files (a migctl of this version sends the text)")
        try:
            self.text.encode("utf-8")  # (JSON carries a lone surrogate, "\udc80", which no file holds: it was
        except UnicodeEncodeError as e:  # "bad request: 'utf-8' codec can't encode ...", naming no file)
            raise ValidationError(self.file, None, None, "", f"the profile text is not UTF-8 (a lone surrogate at "
                                  f"character {e.start})") from None
        return self.text


# -- replies: each carries whether migd did it and the exit code migctl ends with ----------------------------


@dataclass(frozen=True)
class Reply:
    """What every reply carries (read first, whatever the command): ``error`` says why not."""

    ok: bool
    exit: int
    error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def why(self) -> str:
        """The refusal's reason as said to a user (a reply with none said ``None``)."""
        return self.error or f"no reason given (exit {self.exit})"


@dataclass(frozen=True)
class Refusal:
    """Any request migd did not do: bad input, not permitted, an expected failure."""

    ok: bool
    exit: int
    error: str


@dataclass(frozen=True)
class ApplyReply:
    """migd's answer to an apply: the result (also beside a refusal that had one), how long it holds,
    and migd's own clock when it runs on one."""

    ok: bool
    exit: int
    error: str | None = field(default=None, metadata=OMIT_NONE)
    warnings: tuple[str, ...] = ()
    result: ApplyDoc | None = field(default=None, metadata=OMIT_NONE)
    override: HeldView | None = field(default=None, metadata=OMIT_NONE)
    clock: SimClock | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class ResumeReply:
    """``resume`` done: whose hold was lifted (None: none was held), the scheduled profile (None: no entry
    has fired yet) and the apply back to it."""

    ok: bool
    exit: int
    lifted: str | None
    profile: str | None
    result: ApplyDoc | None


@dataclass(frozen=True)
class ReloadReply:
    ok: bool
    exit: int
    detail: str | None


@dataclass(frozen=True)
class ClearedReply:
    ok: bool
    exit: int
    cleared: tuple[str, ...]


@dataclass(frozen=True)
class DaemonReply:
    ok: bool
    exit: int
    daemon: DaemonDoc


@dataclass(frozen=True)
class LayoutReply:
    ok: bool
    exit: int
    status: StatusDoc


@dataclass(frozen=True)
class IsolationReply:
    """migd's last audit of the active profile and its fault marks (``DaemonAudit``'s fields, flat)."""

    ok: bool
    exit: int
    unhealthy: dict[str, str]
    breaches: tuple[str, ...]
    findings: tuple[Finding, ...]
    faults: dict[str, Fault] | None = field(default=None, metadata=OMIT_NONE)  # (added: DaemonMarks')
    clock: SimClock | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def of(cls, audit: DaemonAudit) -> IsolationReply:
        return cls(True, 0, audit.unhealthy, audit.breaches, audit.findings, audit.faults, audit.clock)

    @property
    def audit(self) -> DaemonAudit:
        return DaemonAudit(self.unhealthy, self.breaches, self.findings, self.faults, self.clock)


def reply_as(cls: type[T], reply: dict[str, Any], where: str = "reply") -> T:
    """``reply`` read through its wire type: a misfit is a WireError naming the field."""
    return from_json(cls, reply, where)


# -- reading a line ------------------------------------------------------------------------------------------


class BadJson(ValueError):
    """A line that is not JSON, nests deeper than MAX_DEPTH, or is not one JSON object."""


def parse_object(line: bytes) -> dict[str, Any]:
    """One JSON object from a socket line, its nesting at most MAX_DEPTH; BadJson says what is wrong."""
    try:
        doc = loads(line)
    except JsonError as e:
        lead = {JsonFault.NOT_JSON: "", JsonFault.TOO_DEEP: "JSON ", JsonFault.LONG_NUMBER: "JSON with "}[e.fault]
        raise BadJson(f"{lead}{e.what}") from None
    if not isinstance(doc, dict):
        raise BadJson(f"expected a JSON object, not {type(doc).__name__}")
    return doc
