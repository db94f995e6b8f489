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
from pathlib import Path
from typing import Any

from migd.apply.executor import BusyError, GpuUnhealthy
from migd.apply.hooks import HookError
from migd.apply.lock import LockBusy
from migd.daemon.service import ManualApply
from migd.hardware.backend import HardwareError
from migd.planner import PlanError
from migd.profiles.loader import load_profile
from migd.report import apply_doc
from migd.yamlsrc import ValidationError

log = logging.getLogger("migd.control")
MAX_REQUEST = 1 << 20


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer

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


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, daemon: Any, mode: int = 0o600) -> None:
        self.path = path
        self.migd = daemon
        self.watch: Any = None  # the fault watch, for its breach log
        path.parent.mkdir(parents=True, exist_ok=True)
        claim(path)
        old = os.umask(0o177)  # never a window where the socket is world-connectable
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)

    def dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "status":
            return {"ok": True, "exit": 0, "daemon": self.migd.status.to_json()}
        if cmd == "reload":
            self.migd.reload_requested.set()
            self.migd.wake.set()
            return {"ok": True, "exit": 0}
        if cmd == "apply":
            return self._apply(req)
        if cmd == "isolation":
            return {"ok": True, "exit": 0, "unhealthy": dict(self.migd.status.unhealthy),
                    "breaches": list(self.watch.breaches) if self.watch else [],
                    "findings": [f.to_json() for f in self.migd.audit_findings]}
        if cmd == "clear-fault":
            gpu = str(req.get("gpu", ""))
            uuids = [g.uuid for g in self.migd.backend.list_gpus() if gpu in (str(g.index), g.uuid)]
            cleared = [u for u in uuids if self.migd.status.unhealthy.pop(u, None) is not None]
            log.warning("fault mark cleared on %s by an operator", ", ".join(cleared) or "nothing")
            return {"ok": bool(cleared), "exit": 0 if cleared else 1, "cleared": cleared}
        return {"ok": False, "exit": 2, "error": f"unknown command {cmd!r}"}

    def _apply(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            profile = load_profile(str(req["file"]), req.get("config"), text=req.get("text"), strict=True)
            opts = ManualApply.from_request(req)
            result = self.migd.manual_apply(profile, opts)
        except (ValidationError, PlanError) as e:
            return {"ok": False, "exit": 2, "error": str(e)}
        except BusyError as e:
            return {"ok": False, "exit": 3, "error": f"{e} (--on-busy wait or force changes them anyway)"}
        except (HardwareError, GpuUnhealthy) as e:
            return {"ok": False, "exit": 4, "error": str(e)}
        except (LockBusy, HookError) as e:
            return {"ok": False, "exit": 1, "error": str(e)}
        code = 0 if result.ok else 4 if any(r.status == "failed" for r in result.results) else 1
        return {"ok": result.ok, "exit": code, "result": apply_doc(result, opts.dry_run)}

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="migd-control", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def request(path: str | Path, req: dict[str, Any], timeout_s: float = 3600.0) -> dict[str, Any] | None:
    """Send one request; None if no daemon is listening there."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None
    with s, s.makefile("rwb") as f:
        f.write(json.dumps(req).encode() + b"\n")
        f.flush()
        line = f.readline()
    if not line:
        raise ConnectionError(f"migd closed the control socket {path} without answering; see its log")
    reply: dict[str, Any] = json.loads(line)
    return reply
