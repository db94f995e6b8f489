"""The local control socket: how migctl asks the running daemon for status or hands it an apply.

A Unix stream socket (mode 0600, so root only by default), one JSON request line and one
JSON reply line per connection.  Nothing that changes a GPU is reachable over HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from migd.apply.result import ApplyResult
from migd.daemon.service import ManualApply
from migd.exits import EXPECTED, Exit, failure, for_result
from migd.netcap import CappedThreadingMixIn
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.report import apply_doc

log = logging.getLogger("migd.control")
MAX_REQUEST = 1 << 20


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer
    timeout = 10.0  # for the request line; the apply it asks for may take as long as it takes

    def handle(self) -> None:
        line = self.rfile.readline(MAX_REQUEST)
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("request must be a JSON object")
            reply = self.server.dispatch(req)
        except (ValueError, json.JSONDecodeError) as e:
            reply = {"ok": False, "exit": 2, "error": f"bad request: {e}"}
        except Exception as e:  # noqa: BLE001 - the client must always get an answer, never an empty line
            log.exception("control request failed")
            reply = {"ok": False, "exit": 1, "error": f"migd failed on this request: {type(e).__name__}: {e}"}
        self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")


class AlreadyRunning(Exception):
    """Another migd answers on the control socket."""


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


def claim(path: Path) -> None:
    """Make ``path`` free for this daemon: refuse if a migd answers there, clear a stale socket.

    A second migd must never delete a running daemon's socket: that one would go on changing GPUs
    while migctl, finding no socket, applied locally behind its back."""
    if not listening(path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a daemon that died: nobody listens
        return
    raise AlreadyRunning(f"another migd is running (its control socket {path} answers); not starting")


@dataclass(frozen=True)
class Handlers:
    """What the socket may ask of the daemon: one callable per request, nothing else."""

    status: Callable[[], dict[str, Any]]  # migd.daemon/v1
    reload: Callable[[], None]
    apply: Callable[[Profile, ManualApply], ApplyResult]
    isolation: Callable[[], dict[str, Any]]  # unhealthy, breaches, findings
    clear_fault: Callable[[str], list[str]]  # GPU index or UUID -> fault marks cleared


class ControlServer(CappedThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 turned concurrent migctl clients away (EAGAIN)
    max_connections = 64

    def __init__(self, path: Path, handlers: Handlers, mode: int = 0o600) -> None:
        self.cap = threading.BoundedSemaphore(self.max_connections)
        self.path = path
        self.handlers = handlers
        path.parent.mkdir(parents=True, exist_ok=True)
        claim(path)
        old = os.umask(0o177)  # never a window where the socket is world-connectable
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)

    def dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd, h = req.get("cmd"), self.handlers
        if cmd == "status":
            return {"ok": True, "exit": Exit.OK, "daemon": h.status()}
        if cmd == "reload":
            h.reload()
            return {"ok": True, "exit": Exit.OK}
        if cmd == "apply":
            return self._apply(req)
        if cmd == "isolation":
            return {"ok": True, "exit": Exit.OK, **h.isolation()}
        if cmd == "clear-fault":
            cleared = h.clear_fault(str(req.get("gpu", "")))
            return {"ok": bool(cleared), "exit": Exit.OK if cleared else Exit.NOT_APPLIED, "cleared": cleared}
        return {"ok": False, "exit": Exit.INVALID, "error": f"unknown command {cmd!r}"}

    def _apply(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            profile = load_profile(str(req["file"]), req.get("config"), text=req.get("text"), strict=True)
            opts = ManualApply.from_request(req)
            result = self.handlers.apply(profile, opts)
        except EXPECTED as e:
            f = failure(e)
            return {"ok": False, "exit": f.code, "error": f.message}
        return {"ok": result.ok, "exit": for_result(result), "result": apply_doc(result, opts.dry_run)}

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="migd-control", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


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


def request(path: str | Path, req: dict[str, Any], timeout_s: float = 3600.0) -> dict[str, Any] | None:
    """Send one request; None if no daemon is listening there."""
    s = _connect(Path(path), timeout_s)
    if s is None:
        return None
    with s, s.makefile("rwb") as f:
        f.write(json.dumps(req).encode() + b"\n")
        f.flush()
        line = f.readline()
    if not line:
        raise ConnectionError(f"migd closed the control socket {path} without answering; see its log")
    reply: dict[str, Any] = json.loads(line)
    return reply
