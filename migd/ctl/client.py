"""migctl's end of the control socket: one request line out, one bounded reply line back.

What the lines hold is ``migd.api.commands``; this is only the talking: connecting (waiting out a full
backlog), the bounds on a reply (size, nesting, time), and Ctrl-C withdrawing a request.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migd.api.commands import MAX_REPLY, BadJson, Reply, parse_object, reply_as
from migd.wire import WireError, to_json


class ControlError(ConnectionError):
    """Talking to migd failed (it died, or closed the socket): not the caller's own stdout."""


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
        except PermissionError:  # (the caller may try the read-only socket)
            s.close()
            raise
        except OSError as e:  # a path through a file, one too long for a socket, ...: said with the path
            s.close()
            raise ControlError(f"migd's socket {path}: {e.strerror or e}") from None






def request(path: str | Path, req: object, timeout_s: float = 3600.0,
            on_interrupt: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """Send one request (a wire type of ``migd.api.commands``); None if no daemon is listening there.

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
            s.sendall(json.dumps(to_json(req)).encode() + b"\n")
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
