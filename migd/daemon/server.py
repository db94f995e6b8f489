"""The local control socket: how migctl asks the running daemon for status or hands it an apply.

A Unix stream socket (mode 0600, so root only by default), one JSON request line and one
JSON reply line per connection.  Nothing that changes a GPU is reachable over HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import socketserver
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from migd.api.checks import DaemonAudit
from migd.api.commands import (
    MAX_REQUEST,
    ApplyReply,
    ApplyRequest,
    Ask,
    ClearedReply,
    ClearFault,
    Command,
    DaemonReply,
    IsolationReply,
    LayoutReply,
    ManualApply,
    Refusal,
    ReloadReply,
    ResumeReply,
    parse_object,
)
from migd.api.daemon import DaemonDoc
from migd.api.status import StatusDoc
from migd.apply.result import ApplyResult, Flag
from migd.daemon.answers import Reloaded, Resumed
from migd.daemon.slots import Late, Limits, Slots, SlottedThreadingMixIn, read_request
from migd.errors import ValidationError
from migd.exits import EXPECTED, Exit, failure, for_result
from migd.hardware.types import HardwareError
from migd.paths import listening
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.report import apply_doc
from migd.wire import from_json, to_json

log = logging.getLogger("migd.control")


class HangUp:
    """Set once the client has closed its end (EOF on the connection): a client's Ctrl-C withdraws the
    request it is waiting on.  Watched by a thread of its own while the request runs."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._hung_up = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="migd-control-hangup", daemon=True)
        self._thread.start()

    def is_set(self) -> bool:
        return self._hung_up.is_set()

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._conn, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not self._done.is_set():
            if not poller.poll(100):
                continue
            try:
                data = self._conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._hung_up.set()
            return  # EOF, or bytes after the one request line (ignored)

    def close(self) -> None:
        self._done.set()
        self._thread.join()


class _Handler(socketserver.StreamRequestHandler):
    """One connection: its request line within the server's ``request_s``, then the reply (the apply it
    asks for may take as long as it takes).  ``client_address`` is the peer's uid (slots.py)."""

    server: ControlServer
    timeout = 10.0  # for writing the reply

    def handle(self) -> None:
        try:
            line = read_request(self.connection, MAX_REQUEST, self.server.slots.limits.request_s)
        except Late as e:  # a slow or silent client: its slot is given back, and it is told if it listens
            log.debug("control: uid %s: %s", self.client_address, e)
            reply: object = Refusal(False, Exit.INVALID, f"bad request: {e}")
        else:
            if not line:  # connected and left without a byte: a check that migd runs (migctl's), no request
                return
            self.connection.settimeout(self.timeout)
            reply = self._reply(line)
        try:
            self.wfile.write(json.dumps(to_json(reply)).encode() + b"\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client is gone (Ctrl-C, a probe): nothing to
            log.debug("control client left before the reply")  # tell it, and nothing wrong with migd

    def _reply(self, line: bytes) -> object:
        """The reply to one request line.  Bad input (not JSON, nested too deep, no ``cmd`` word, a bad
        field) is the client's mistake: one line "bad request: ...", logged below WARNING, no traceback."""
        try:
            return self.server.dispatch(parse_object(line), self.connection)
        except ValueError as e:  # (BadJson; WireError: a request that does not fit its type; a bad option)
            log.info("control: bad request from a client: %s", e)
            return Refusal(False, Exit.INVALID, f"bad request: {e}")
        except Exception as e:  # noqa: BLE001 - the client must always get an answer, never an empty line
            log.exception("control request failed")
            return Refusal(False, Exit.NOT_APPLIED, f"migd failed on this request: {type(e).__name__}: {e}")

    def finish(self) -> None:
        try:
            super().finish()
        except (BrokenPipeError, ConnectionResetError):  # socketserver flushes once more on the way out
            pass


class AlreadyRunning(Exception):
    """Another migd answers on the control socket."""


def claim(path: Path) -> None:
    """Make ``path`` free for this daemon: refuse if a migd answers there, clear a stale socket.

    A second migd must never delete a running daemon's socket: that one would go on changing GPUs
    while migctl, finding no socket, applied locally behind its back."""
    if not listening(path):
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode):  # (a file there is someone's: never removed)
                raise ValidationError(str(path), None, None, "", "is not a socket: migd puts its control socket "
                                      "there and removes only a stale socket (remove it, or name another path)")
            path.unlink()  # left by a daemon that died: nobody listens
        except FileNotFoundError:
            pass
        return
    raise AlreadyRunning(f"another migd is running (its control socket {path} answers)")


@dataclass(frozen=True)
class Handlers:
    """What the socket may ask of the daemon: one callable per request, nothing else."""

    status: Callable[[], DaemonDoc]
    reload: Callable[[], Reloaded]  # done before the reply: accepted, or rejected and why
    apply: Callable[[Profile, ManualApply, Flag | None], ApplyResult]  # (Flag: the client withdrew)
    isolation: Callable[[], DaemonAudit]
    clear_fault: Callable[[str], list[str]]  # GPU index or UUID -> fault marks cleared
    resume: Callable[[], Resumed]  # lift a manual apply's hold: back to the schedule now
    layout: Callable[[], StatusDoc]  # as `migctl status` prints it


def refusing(said: Callable[[], str], reload: Callable[[], Reloaded]) -> Handlers:
    """Handlers that refuse every request with ``said()``, a hardware condition (exit 4): migd runs and
    cannot serve the GPUs yet (it waits for the NVIDIA driver); but ``reload`` answers reloads (kept for
    when it serves, as a SIGHUP then is)."""
    def refuse(*_: object) -> NoReturn:
        raise HardwareError(said())
    return Handlers(refuse, reload, refuse, refuse, refuse, refuse, refuse)


@dataclass(frozen=True)
class Route:
    """One command: the wire type its request is read as, who answers it, and whether the read-only
    socket (every local user's) may ask it."""

    request: type[Any]
    answer: Callable[[Any, socket.socket], object]
    read_only: bool = False


class ControlServer(SlottedThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 turned concurrent migctl clients away (EAGAIN)

    def __init__(self, path: Path, handlers: Handlers, mode: int = 0o600, read_only: bool = False,
                 limits: Limits | None = None) -> None:
        """``read_only``: the socket every local user may reach (mode 0666): it answers READ_ONLY only, and
        holds each user to a share of its connections (root's own socket has no share: only root reaches it)."""
        self.slots = Slots(limits or (Limits() if read_only else Limits(per_user=None)))
        self.path = path
        self.handlers = handlers
        self.routes = self._routes()
        self.read_only = read_only
        path.parent.mkdir(parents=True, exist_ok=True)
        claim(path)
        old = os.umask(0o177)  # never a window where the socket is world-connectable
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)

    def take(self, handlers: Handlers) -> None:
        """Answer with ``handlers`` from now on, on the socket already bound: the wait for the driver hands
        over to the daemon with no moment where nobody listens (a second migd started in one)."""
        self.handlers = handlers
        self.routes = self._routes()

    def dispatch(self, req: dict[str, Any], conn: socket.socket) -> object:
        """One request's reply (a wire type of ``migd.api.commands``); an expected failure is a Refusal
        with its exit code, never a traceback; a request that does not fit its type is a ValueError."""
        cmd = from_json(Ask, req).cmd
        route = self.routes[cmd]
        if self.read_only and not route.read_only:
            looks = ", ".join(c.value for c, r in self.routes.items() if r.read_only)
            return Refusal(False, Exit.NOT_APPLIED, f"not permitted: {cmd.value!r} changes the node and needs root "
                           f"(this is migd's read-only socket {self.path}; it answers {looks})")
        asked = from_json(route.request, req)
        try:
            return route.answer(asked, conn)
        except EXPECTED as e:
            f = failure(e)
            return Refusal(False, f.code, f.message)

    def _routes(self) -> dict[Command, Route]:
        """Each command: what its request is read as, who answers it, and whether the read-only socket
        may ask it (only what looks, and nothing that calls NVML: see main._handlers)."""
        h = self.handlers
        return {
            Command.STATUS: Route(Ask, lambda _, __: DaemonReply(True, Exit.OK, h.status()), read_only=True),
            Command.LAYOUT: Route(Ask, lambda _, __: LayoutReply(True, Exit.OK, h.layout()), read_only=True),
            Command.ISOLATION: Route(Ask, lambda _, __: IsolationReply.of(h.isolation()), read_only=True),
            Command.RELOAD: Route(Ask, lambda _, __: self._reload()),
            Command.APPLY: Route(ApplyRequest, self._apply),
            Command.RESUME: Route(Ask, lambda _, __: self._resume()),
            Command.CLEAR_FAULT: Route(ClearFault, lambda req, _: self._clear_fault(req)),
        }

    def _reload(self) -> ReloadReply | Refusal:
        done = self.handlers.reload()
        if done.error is not None:
            return Refusal(False, Exit.INVALID, done.error)
        return ReloadReply(True, Exit.OK, done.detail)

    def _clear_fault(self, req: ClearFault) -> ClearedReply:
        cleared = tuple(self.handlers.clear_fault(req.gpu))
        return ClearedReply(bool(cleared), Exit.OK if cleared else Exit.NOT_APPLIED, cleared)

    def _apply(self, req: ApplyRequest, conn: socket.socket) -> ApplyReply:
        """``withdraw_on_hangup`` (migctl's): the client closing its end cancels the apply; a client that
        closes its end after the request (nc -U) is not withdrawing it."""
        hangup = HangUp(conn) if req.withdraw_on_hangup else None
        try:
            profile = load_profile(req.file, req.config, text=req.profile_text())
            opts = req.options
            result = self.handlers.apply(profile, opts, hangup)
        finally:
            if hangup is not None:
                hangup.close()
        status = self.handlers.status()
        return ApplyReply(
            result.ok, for_result(result), None, tuple(profile.warnings), apply_doc(result, opts.dry_run),
            status.override if result.ok and not opts.dry_run else None,  # how long it holds, said at once
            status.clock)  # a clock of migd's own (--now): the times to show on it

    def _resume(self) -> ResumeReply:
        done = self.handlers.resume()
        result = done.result
        ok = result is None or result.ok
        return ResumeReply(ok, Exit.OK if ok else for_result(result), done.lifted, done.profile,  # type: ignore[arg-type]
                           apply_doc(result, False) if result is not None else None)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="migd-control", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
