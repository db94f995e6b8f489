"""The control socket as a client sees it: one JSON request line, one JSON reply line per connection.

migctl talks to migd through this alone; the server (``migd.daemon.server``) imports the same limits,
so neither side imports the other's machinery.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from migd.api.daemon import DaemonDoc, SimClock
from migd.api.override import HeldView
from migd.api.plan import ApplyDoc
from migd.api.status import StatusDoc
from migd.api.wire import WireError, from_json
from migd.apply.result import OnBusy
from migd.errors import ValidationError

MAX_REQUEST = 1 << 20  # bytes of one request line
MAX_REPLY = 16 << 20  # bytes of one reply line (a 64-GPU node's status is well under 1 MiB)
MAX_DEPTH = 32  # nesting of JSON arrays and objects, either way (migd's documents nest less than 10 deep)
T = TypeVar("T")
DAEMON_LOCK_TIMEOUT_S = 30.0  # how long migd's own applies wait for the apply lock (a migctl --local)


@dataclass(frozen=True)
class ManualApply:
    """What a client may choose for an apply migd does on its behalf (hooks stay the daemon's)."""

    on_busy: OnBusy = OnBusy.REFUSE
    dry_run: bool = False
    busy_timeout_s: float | None = None  # None: the daemon's busy_timeout
    lock_timeout_s: float = DAEMON_LOCK_TIMEOUT_S
    parallel: bool = True
    mode_only: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"on_busy": self.on_busy.value, "dry_run": self.dry_run, "busy_timeout_s": self.busy_timeout_s,
                "lock_timeout_s": self.lock_timeout_s, "parallel": self.parallel, "mode_only": self.mode_only}

    @classmethod
    def from_json(cls, req: dict[str, Any]) -> ManualApply:
        """Checked values from a control-socket request; ValueError names a bad one."""
        on_busy = OnBusy(req.get("on_busy", "refuse"))
        numbers = {k: req.get(k) for k in ("busy_timeout_s", "lock_timeout_s")}
        for k, v in numbers.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ValueError(f"{k} {v!r}")
        lock = numbers["lock_timeout_s"]
        return cls(on_busy=on_busy, dry_run=bool(req.get("dry_run")), busy_timeout_s=numbers["busy_timeout_s"],
                   lock_timeout_s=DAEMON_LOCK_TIMEOUT_S if lock is None else float(lock),
                   parallel=bool(req.get("parallel", True)), mode_only=bool(req.get("mode_only")))


@dataclass(frozen=True)
class ApplyRequest:
    """An apply handed to migd: the profile's text, read by the client as the user who runs it (migd,
    sandboxed, opens no client's path), the path for messages, and the options.  With
    ``withdraw_on_hangup`` (migctl's) the client closing its end cancels the apply."""

    file: str
    text: str
    config: str | None = None
    options: ManualApply = field(default_factory=ManualApply)
    withdraw_on_hangup: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"cmd": "apply", "file": self.file, "text": self.text, "config": self.config,
                **self.options.to_json(), "withdraw_on_hangup": self.withdraw_on_hangup}

    @classmethod
    def from_json(cls, req: dict[str, Any]) -> ApplyRequest:
        """A checked request: ValidationError (no text, a bad field) or ValueError (a bad option)."""
        file, text, config = req.get("file"), req.get("text"), req.get("config")
        if not isinstance(text, str):
            raise ValidationError(str(file), None, None, "", "the request carries no profile text; migd reads "
                                  "no client's files (a migctl of this version sends the text)")
        if not isinstance(file, str) or not (config is None or isinstance(config, str)):
            raise ValidationError("control request", None, None, "file" if not isinstance(file, str) else "config",
                                  "must be text")
        return cls(file, text, config, ManualApply.from_json(req), req.get("withdraw_on_hangup") is True)


def listening(path: Path) -> bool:
    """Whether a daemon answers on ``path`` (a socket file nobody listens on is stale)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        s.close()
    return True


def _connect(path: Path, timeout_s: float) -> socket.socket | None:
    """Connected, or None if nobody listens; a full backlog (EAGAIN) is waited out for up to 10 s."""
    deadline = time.monotonic() + min(timeout_s, 10.0)
    delay = 0.01
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(str(path))
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            return None
        except BlockingIOError:
            s.close()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"migd's control socket {path} stays busy (too many clients at once)") from None
            time.sleep(delay)
            delay = min(0.2, delay * 2)


class ControlError(ConnectionError):
    """Talking to migd failed (it died, or closed the socket): not the caller's own stdout."""


class BadJson(ValueError):
    """A line that is not JSON, nests deeper than MAX_DEPTH, or is not one JSON object."""


def _depth(doc: Any) -> int:
    """How deep ``doc``'s arrays and objects nest (without recursion: the limit is what it guards)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        value, level = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break
            todo.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def parse_object(line: bytes) -> dict[str, Any]:
    """One JSON object from a socket line, its nesting at most MAX_DEPTH; BadJson says what is wrong."""
    try:
        doc = json.loads(line)
    except RecursionError:
        raise BadJson(f"JSON nested deeper than {MAX_DEPTH}") from None
    except (ValueError, UnicodeDecodeError) as e:  # (json's JSONDecodeError is a ValueError)
        raise BadJson(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise BadJson(f"expected a JSON object, not {type(doc).__name__}")
    if _depth(doc) > MAX_DEPTH:
        raise BadJson(f"JSON nested deeper than {MAX_DEPTH}")
    return doc


@dataclass(frozen=True)
class Reply:
    """What every reply carries: whether migd did it, the exit code migctl ends with, and why not."""

    ok: bool
    exit: int
    error: str | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplyReply:
    """migd's answer to an apply: the result (also beside a refusal that had one), how long it holds,
    and migd's own clock when it runs on one."""

    ok: bool
    exit: int
    error: str | None = None
    warnings: tuple[str, ...] = ()
    result: ApplyDoc | None = None
    override: HeldView | None = None
    clock: SimClock | None = None


@dataclass(frozen=True)
class ResumeReply:
    """``resume`` done: whose hold was lifted (None: none was held), the scheduled profile (None: no entry
    has fired yet) and the apply back to it."""

    lifted: str | None
    profile: str | None
    result: ApplyDoc | None


@dataclass(frozen=True)
class ReloadReply:
    detail: str | None


@dataclass(frozen=True)
class ClearedReply:
    cleared: tuple[str, ...]


@dataclass(frozen=True)
class DaemonReply:
    daemon: DaemonDoc


@dataclass(frozen=True)
class LayoutReply:
    status: StatusDoc


def reply_as(cls: type[T], reply: dict[str, Any], where: str = "reply") -> T:
    """``reply`` (or a part of it) read through its wire type: a misfit is a WireError naming the field."""
    return from_json(cls, reply, where)


def request(path: str | Path, req: dict[str, Any], timeout_s: float = 3600.0,
            on_interrupt: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """Send one request; None if no daemon is listening there.

    The reply is bounded: at most MAX_REPLY bytes, within ``timeout_s`` from the connect, one JSON
    object nested at most MAX_DEPTH deep, whose ``ok``, ``exit`` and ``error`` fit :class:`Reply`;
    anything else (a server that is not migd, a migd of another version, a reply cut off) is a
    ControlError or a WireError, said in one line.

    ``on_interrupt``: a first Ctrl-C while waiting closes this end for writing, which tells migd the
    request is withdrawn (an apply is then cancelled and its GPUs put back), calls ``on_interrupt``
    and goes on waiting for migd's account of it; a second Ctrl-C raises KeyboardInterrupt."""
    deadline = time.monotonic() + timeout_s
    s = _connect(Path(path), timeout_s)
    if s is None:
        return None
    with s:
        try:
            s.sendall(json.dumps(req).encode() + b"\n")
            line = _read_line(s, on_interrupt, deadline)
        except TimeoutError:
            raise ControlError(f"migd's control socket {path}: no complete reply within {timeout_s:g}s") from None
        except OSError as e:
            raise ControlError(f"migd's control socket {path}: {e.strerror or e}") from None
    if not line:
        raise ControlError(f"migd closed the control socket {path} without answering; see its log")
    if not line.endswith(b"\n"):
        raise ControlError(f"migd's reply on {path} was cut off after {len(line)} bytes (migd stopped?); see its log")
    try:
        reply = parse_object(line)
    except BadJson as e:
        raise WireError("reply", str(e)) from None
    head = reply_as(Reply, reply)
    if not (1 if head.error is not None else 0) <= head.exit <= 255:
        raise WireError("reply.exit", f"{head.exit} is not an exit status{' for a refusal' if head.exit == 0 else ''}")
    return reply


def _read_line(s: socket.socket, on_interrupt: Callable[[], None] | None, deadline: float) -> bytes:
    """The reply line, or what came before end-of-file; TimeoutError at ``deadline``, ControlError past
    MAX_REPLY bytes."""
    buf = bytearray()
    withdrawn = False
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except KeyboardInterrupt:
            if on_interrupt is None or withdrawn:
                raise
            withdrawn = True
            s.shutdown(socket.SHUT_WR)
            on_interrupt()
            continue
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REPLY:
            raise ControlError(f"migd's reply is over {MAX_REPLY >> 20} MiB without ending (not migd?)")
    return bytes(buf)
