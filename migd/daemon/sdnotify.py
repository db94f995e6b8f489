"""systemd's notify protocol (sd_notify), written out: one datagram per message, no dependency."""

from __future__ import annotations

import os
import socket
import time

from migd.numeral import whole
from migd.printable import shown

PING_S = (0.1, 3600.0)  # the watchdog's pings, at least and at most this far apart


class Notifier:
    """Sends READY/STATUS/RELOADING/STOPPING/WATCHDOG to ``$NOTIFY_SOCKET`` when it is set."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        timeout_us = whole(usec) if usec is not None and (pid is None or pid == str(os.getpid())) else None
        # ping at half the timeout, within PING_S: a microsecond's timeout spun the watchdog thread at 40% of a
        # CPU, and one of years passed threading's TIMEOUT_MAX (an OverflowError killed the thread)
        half = timeout_us / 1e6 / 2 if timeout_us else None
        self.watchdog_interval_s = None if half is None else min(max(half, PING_S[0]), PING_S[1])

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> None:
        if not self.address:
            return
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
            try:
                s.sendto("\n".join(fields).encode(), addr)
            except OSError:
                # The service manager went away, or does not read: a unix datagram socket's queue holds
                # net.unix.max_dgram_qlen (10) messages, and a blocking send would then stall the daemon's
                # loop (no transition, no reconcile) until someone reads.  A STATUS dropped is harmless.
                pass

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={shown(status)}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        """``status`` may quote NVML or Slurm: a newline in it would end the field (and start another)."""
        self.send(f"STATUS={shown(status)}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self, status: str = "stopping") -> None:
        self.send("STOPPING=1", f"STATUS={shown(status)}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")
