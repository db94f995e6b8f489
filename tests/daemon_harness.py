"""Start the real migd process against the simulator and watch it like systemd would."""

from __future__ import annotations

import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migd.ctl.client import request
from tests.helpers import PROFILES, Migctl

CONFIG = """\
timezone: Asia/Seoul
profiles_dir: profiles
schedule:
  - {{profile: day,   at: "08:30", days: mon-fri}}
  - {{profile: night, at: "19:00", days: mon-fri}}
  - {{profile: night-two, at: "00:00", days: sat}}
on_busy: {on_busy}
busy_timeout: {busy_timeout}
reconcile_interval: {reconcile_interval}
reconcile: {reconcile}
sample_interval: {sample_interval}
metrics: {{listen: "127.0.0.1:{port}"}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MigdProcess:
    def __init__(self, tmp: Path, fleet: str = "single-a100", **cfg: Any) -> None:
        self.tmp = tmp
        self.fleet = fleet
        self.migctl = Migctl(tmp, fleet)
        self.port = free_port()
        (tmp / "profiles").mkdir(exist_ok=True)
        for f in PROFILES.glob("*.yaml"):
            shutil.copy(f, tmp / "profiles" / f.name)
            os.chmod(tmp / "profiles" / f.name, 0o644)
        self.config = tmp / "migd.yaml"
        self.write_config(**cfg)
        self.notify_path = tmp / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.setblocking(False)  # poll_notify waits with select, then drains what is queued
        self.messages: list[str] = []
        self.cursor = 0  # messages before this were already matched by a wait_for
        self.proc: subprocess.Popen[str] | None = None
        self.log = tmp / "migd.log"

    def write_config(self, on_busy: str = "wait", busy_timeout: str = "30m", reconcile_interval: str = "60s",
                     reconcile: str = "correct", sample_interval: str = "1s") -> None:
        self.config.write_text(CONFIG.format(on_busy=on_busy, busy_timeout=busy_timeout, port=self.port,
                                             reconcile_interval=reconcile_interval, reconcile=reconcile,
                                             sample_interval=sample_interval))
        os.chmod(self.config, 0o644)

    @property
    def socket_path(self) -> Path:
        return self.migctl.state_dir / "control.sock"

    def start(self, now: str | None = None, time_scale: float = 1.0, watchdog_usec: int | None = None,
              nofile: int | None = None, extra: tuple[str, ...] = (), wrap: tuple[str, ...] = ()) -> None:
        """``nofile``: the daemon's file descriptor limit (systemd's default soft limit is 1024); ``wrap``:
        a command that runs migd's (``unshare ... sh -c '...; exec "$@"' sh``: a sandbox of its own)."""
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path), "PYTHONUNBUFFERED": "1"}
        env.pop("WATCHDOG_USEC", None)
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        argv = [sys.executable, "-m", "migd.daemon.main", "--config", str(self.config), "--sim", self.fleet,
                "--sim-state", str(self.migctl.state), "--state-dir", str(self.migctl.state_dir),
                "--time-scale", str(time_scale)]
        if now:
            argv += ["--now", now]
        argv = [*wrap, *argv, *extra]
        self.messages, self.cursor = [], 0
        with open(self.log, "a") as log:  # the child keeps its own copy of the descriptor
            limit = None if nofile is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                         cwd=str(Path(__file__).resolve().parents[1]), preexec_fn=limit)

    def poll_notify(self) -> None:
        """Wait up to 0.2 s for a message, then take only what is already queued.

        Draining until a quiet 0.2 s would never return while migd sends more often than that (the
        watchdog, a fast clock's passes).  The socket is non-blocking: on a socket with a timeout
        Python waits out that timeout even for MSG_DONTWAIT, which made this drain until migd paused.
        """
        if not select.select([self.notify], [], [], 0.2)[0]:
            return
        while True:
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except BlockingIOError:
                return

    def wait_for(self, pred: Callable[[str], bool], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll_notify()
            for k in range(self.cursor, len(self.messages)):
                if pred(self.messages[k]):
                    self.cursor = k + 1
                    return self.messages[k]
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"migd exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        raise AssertionError(f"no matching sd_notify message in {timeout}s; got {self.messages}\n"
                             f"{self.log.read_text()[-3000:]}")

    def wait_ready(self, timeout: float = 30.0) -> str:
        return self.wait_for(lambda m: "READY=1" in m and "MAINPID" in m, timeout)

    def wait_until(self, check: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise AssertionError(f"condition not met in {timeout}s\n{self.log.read_text()[-3000:]}")

    def control(self, req: dict[str, Any]) -> dict[str, Any]:
        reply = request(self.socket_path, req, timeout_s=60)
        assert reply is not None, "migd control socket not listening"
        return reply

    def daemon_doc(self) -> dict[str, Any]:
        """The running migd's migd.daemon/v1 document, as the control socket answers it."""
        doc: dict[str, Any] = self.control({"cmd": "status"})["daemon"]
        return doc

    def healthz(self) -> tuple[int, str]:
        """``/healthz``'s status and body (0 and the error where nothing answers)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def assert_no_traceback(self) -> None:
        assert "Traceback" not in self.log.read_text(), self.log.read_text()[-3000:]

    def assert_profile(self, name: str) -> bool:
        return self.migctl("assert", str(PROFILES / f"{name}.yaml")).code == 0

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()
