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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from migd.api.audit import DaemonAudit
from migd.api.commands import MAX_REQUEST, ApplyRequest, BadJson, ManualApply, listening, parse_object
from migd.api.daemon import DaemonDoc
from migd.api.status import StatusDoc
from migd.api.wire import to_json
from migd.apply.result import ApplyResult, Flag
from migd.daemon.requests import Reloaded, Resumed
from migd.daemon.slots import Late, Limits, Slots, SlottedThreadingMixIn, read_request
from migd.exits import EXPECTED, Exit, failure, for_result
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.report import apply_doc

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
            reply: dict[str, Any] = {"ok": False, "exit": Exit.INVALID, "error": f"bad request: {e}"}
        else:
            self.connection.settimeout(self.timeout)
            reply = self._reply(line)
        try:
            self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client is gone (Ctrl-C, a probe): nothing to
            log.debug("control client left before the reply")  # tell it, and nothing wrong with migd

    def _reply(self, line: bytes) -> dict[str, Any]:
        """The reply to one request line.  Bad input (not JSON, nested too deep, no ``cmd`` word, a bad
        field) is the client's mistake: one line "bad request: ...", logged below WARNING, no traceback."""
        try:
            req = parse_object(line)
            if not isinstance(req.get("cmd"), str):
                raise BadJson(f"cmd must be a word, not {type(req.get('cmd')).__name__}")
            return self.server.dispatch(req, self.connection)
        except ValueError as e:  # (BadJson; a bad field of a request)
            log.info("control: bad request from a client: %s", e)
            return {"ok": False, "exit": Exit.INVALID, "error": f"bad request: {e}"}
        except Exception as e:  # noqa: BLE001 - the client must always get an answer, never an empty line
            log.exception("control request failed")
            return {"ok": False, "exit": 1, "error": f"migd failed on this request: {type(e).__name__}: {e}"}

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
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a daemon that died: nobody listens
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
    layout: Callable[[], StatusDoc] | None = None  # as `migctl status` prints it


READ_ONLY = frozenset({"status", "isolation", "layout"})  # all the read-only socket answers


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
        self.read_only = read_only
        path.parent.mkdir(parents=True, exist_ok=True)
        claim(path)
        old = os.umask(0o177)  # never a window where the socket is world-connectable
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)

    def dispatch(self, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        """One request's reply; an expected failure is a reply with its exit code, never a traceback."""
        try:
            return self._dispatch(req, conn)
        except EXPECTED as e:
            f = failure(e)
            return {"ok": False, "exit": f.code, "error": f.message}

    def _dispatch(self, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        cmd, h = req.get("cmd"), self.handlers
        if self.read_only and cmd not in READ_ONLY:
            return {"ok": False, "exit": Exit.NOT_APPLIED, "error": f"not permitted: {cmd!r} changes the node and "
                    f"needs root (this is migd's read-only socket {self.path}; it answers "
                    f"{', '.join(sorted(READ_ONLY))})"}
        if cmd == "layout" and h.layout is not None:
            return {"ok": True, "exit": Exit.OK, "status": to_json(h.layout())}
        if cmd == "status":
            return {"ok": True, "exit": Exit.OK, "daemon": to_json(h.status())}
        if cmd == "reload":
            done = h.reload()
            if done.error is not None:
                return {"ok": False, "exit": Exit.INVALID, "error": done.error}
            return {"ok": True, "exit": Exit.OK, "detail": done.detail}
        if cmd == "apply" and req.get("withdraw_on_hangup") is True:  # migctl: its Ctrl-C cancels the apply
            hangup = HangUp(conn)
            try:
                return self._apply(req, hangup)
            finally:
                hangup.close()
        if cmd == "apply":  # a client that closes its end after the request (nc -U) is not withdrawing it
            return self._apply(req, None)
        if cmd == "resume":
            return self._resume()
        if cmd == "isolation":
            return {"ok": True, "exit": Exit.OK, **to_json(h.isolation())}
        if cmd == "clear-fault":
            cleared = h.clear_fault(str(req.get("gpu", "")))
            return {"ok": bool(cleared), "exit": Exit.OK if cleared else Exit.NOT_APPLIED, "cleared": cleared}
        return {"ok": False, "exit": Exit.INVALID, "error": f"unknown command {cmd!r}"}

    def _apply(self, req: dict[str, Any], hangup: Flag | None) -> dict[str, Any]:
        asked = ApplyRequest.from_json(req)
        profile = load_profile(asked.file, asked.config, text=asked.text)
        opts = asked.options
        result = self.handlers.apply(profile, opts, hangup)
        reply = {"ok": result.ok, "exit": for_result(result), "result": to_json(apply_doc(result, opts.dry_run)),
                 "warnings": list(profile.warnings)}
        status = self.handlers.status()
        if result.ok and not opts.dry_run:
            reply["override"] = to_json(status.override)  # how long it holds, said at once
        if status.clock is not None:  # a clock of migd's own (--now): the times to show on it
            reply["clock"] = to_json(status.clock)
        return reply

    def _resume(self) -> dict[str, Any]:
        done = self.handlers.resume()
        result = done.result
        reply: dict[str, Any] = {"lifted": done.lifted, "profile": done.profile,
                                 "result": to_json(apply_doc(result, False)) if result is not None else None}
        if result is None or result.ok:
            return {"ok": True, "exit": Exit.OK, **reply}
        return {"ok": False, "exit": for_result(result), **reply}

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="migd-control", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
