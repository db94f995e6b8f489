"""What one client of a control socket can hold: a connection slot, a share of them, and for how long.

Each connection is served by a thread of its own.  Without bounds, ~1,100 idle connections from any
local user exhausted the daemon's file descriptors; with a total cap alone, one user dripping a
byte every few seconds on 70 connections held every slot, and every other user's `migctl status`
failed.  So three bounds, each said in docs/daemon.md:

- ``total`` connections served at once; one more is closed as soon as it is accepted;
- ``per_user``: at most this many of them from one user (the peer's uid, from the kernel through
  SO_PEERCRED, so a client cannot claim another's), answered with one line saying so;
- ``request_s``: the whole request line must arrive within this long after the connect; a deadline
  per read instead (a socket timeout) is what a byte every few seconds defeats.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from migd.exits import Exit

ROOT = 0


@dataclass(frozen=True)
class Limits:
    total: int = 64
    per_user: int | None = 8  # None: no share (the root-only socket); root is never held to one
    request_s: float = 5.0


class Slots:
    """The count of connections served, in all and per uid; ``take`` says why one is refused."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._held: Counter[int] = Counter()
        self.refused = 0

    def take(self, uid: int) -> str | None:
        """None: the slot is taken; otherwise why not (the connection is then refused)."""
        with self._lock:
            share = self.limits.per_user
            if share is not None and uid != ROOT and self._held[uid] >= share:
                self.refused += 1
                return f"uid {uid} already has {share} connections open to this socket (each user's share)"
            if sum(self._held.values()) >= self.limits.total:
                self.refused += 1
                return f"{self.limits.total} connections open already"
            self._held[uid] += 1
            return None

    def give(self, uid: int) -> None:
        with self._lock:
            self._held[uid] -= 1
            if self._held[uid] <= 0:
                del self._held[uid]


def peer_uid(conn: socket.socket) -> int:
    """The connecting process's uid as the kernel recorded it at connect (struct ucred: pid, uid, gid)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class SlottedThreadingMixIn(socketserver.ThreadingMixIn):
    """A thread per connection within :class:`Slots`; the handler's ``client_address`` is the peer's uid."""

    slots: Slots  # set by the server before it starts serving
    shutdown_request: Callable[[Any], None]  # socketserver.BaseServer's, later in the MRO

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            uid = peer_uid(request)
        except OSError:  # gone already
            self.shutdown_request(request)
            return
        why = self.slots.take(uid)
        if why is not None:
            refuse(request, why)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, uid)
        except BaseException:
            self.slots.give(uid)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.give(client_address)


def refuse(conn: socket.socket, why: str) -> None:
    """One reply line, sent only if it fits at once: a refused client is never waited for."""
    line = json.dumps({"ok": False, "exit": Exit.NOT_APPLIED, "error": f"migd is busy: {why}; try again"}) + "\n"
    with contextlib.suppress(OSError):
        conn.send(line.encode(), socket.MSG_DONTWAIT)


class Late(Exception):
    """The request line did not arrive in time."""


def read_request(conn: socket.socket, limit: int, within_s: float) -> bytes:
    """The first line (up to ``limit`` bytes, newline included), or what came before end-of-file;
    Late once ``within_s`` has passed since this call, however the bytes trickle in."""
    deadline = time.monotonic() + within_s
    buf = bytearray()
    while b"\n" not in buf and len(buf) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Late(f"no complete request line within {within_s:g} s")
        conn.settimeout(left)
        try:
            chunk = conn.recv(min(65536, limit - len(buf)))
        except TimeoutError:
            raise Late(f"no complete request line within {within_s:g} s") from None
        if not chunk:
            break
        buf += chunk
    end = buf.find(b"\n")
    return bytes(buf if end < 0 else buf[:end + 1])
