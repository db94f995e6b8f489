"""The unit file: Type=notify, GPU device access under hardening, and systemd-analyze verify."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

UNIT = REPO / "systemd" / "migd.service"


def test_unit_essentials() -> None:
    text = UNIT.read_text()
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(text)
    svc = cp["Service"]
    assert svc["Type"] == "notify" and "WatchdogSec" in svc
    assert "nvidia-persistenced.service" in cp["Unit"]["After"]
    assert "DeviceAllow=char-nvidia* rw" in text and "DevicePolicy=closed" in text
    assert "PrivateDevices" not in text  # it would hide /dev/nvidia*
    assert svc["ExecReload"].startswith("/bin/kill -HUP")


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    migd = shutil.which("migd")
    if tool is None or migd is None:
        pytest.skip("systemd-analyze or the migd console script is not installed")
    unit = tmp_path / "migd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/migd", migd))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "migd.service" not in r.stderr, r.stderr  # no warnings about our unit


def test_journald_priorities_one_line_per_event() -> None:
    import logging

    from migd.daemon.main import JournalFormatter
    f = JournalFormatter("%(message)s")
    rec = logging.LogRecord("migd", logging.ERROR, __file__, 1, "GPU %d: apply of %s failed:\nline2", (3, "night"),
                            None)
    assert f.format(rec) == "<3>GPU 3: apply of night failed: | line2"
    rec.levelno = logging.INFO
    assert f.format(rec).startswith("<6>")


def test_a_notify_socket_nobody_reads_never_stalls_the_daemon(tmp_path: Path) -> None:
    """A unix datagram socket queues 10 messages; a blocking send then waits for a reader, and the
    daemon's loop (which sends STATUS every pass) stopped switching layouts.  Sends never block."""
    import socket
    import threading

    from migd.daemon.sdnotify import Notifier
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))  # bound, never read
    notifier = Notifier(str(tmp_path / "notify.sock"))
    done = threading.Event()

    def chatter() -> None:
        for n in range(100):
            notifier.status(f"pass {n}")
        done.set()
    threading.Thread(target=chatter, daemon=True).start()
    try:
        assert done.wait(5), "Notifier.send blocked on a full notify socket"
    finally:
        sock.close()
