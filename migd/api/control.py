"""The control socket as a client sees it: one JSON request line, one JSON reply line per connection.

migctl talks to migd through this alone; the server (``migd.daemon.control``) imports the same limits,
so neither side imports the other's machinery.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migd.apply.result import OnBusy
from migd.errors import ValidationError

MAX_REQUEST = 1 << 20  # bytes of one request line
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


def request(path: str | Path, req: dict[str, Any], timeout_s: float = 3600.0,
            on_interrupt: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """Send one request; None if no daemon is listening there.

    ``on_interrupt``: a first Ctrl-C while waiting closes this end for writing, which tells migd the
    request is withdrawn (an apply is then cancelled and its GPUs put back), calls ``on_interrupt``
    and goes on waiting for migd's account of it; a second Ctrl-C raises KeyboardInterrupt."""
    s = _connect(Path(path), timeout_s)
    if s is None:
        return None
    with s:
        try:
            s.sendall(json.dumps(req).encode() + b"\n")
            line = _read_line(s, on_interrupt)
        except OSError as e:
            raise ControlError(f"migd's control socket {path}: {e.strerror or e}") from None
    if not line:
        raise ControlError(f"migd closed the control socket {path} without answering; see its log")
    reply: dict[str, Any] = json.loads(line)
    return reply


def _read_line(s: socket.socket, on_interrupt: Callable[[], None] | None) -> bytes:
    buf = b""
    withdrawn = False
    while not buf.endswith(b"\n"):
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
    return buf
