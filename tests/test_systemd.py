"""The unit file: Type=notify, GPU device access under hardening, and systemd-analyze verify."""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

UNIT = REPO / "systemd" / "migd.service"
DROP_IN = REPO / "systemd" / "migd.service.d" / "slurm.conf"


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


@pytest.mark.integration
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """The unit and its Slurm drop-in verify clean with ExecStart where the README's install puts migd
    (/opt/migd, here a temp dir holding the installed console script)."""
    tool = shutil.which("systemd-analyze")
    migd = shutil.which("migd")
    if tool is None or migd is None:
        pytest.skip("systemd-analyze or the migd console script is not installed")
    venv = tmp_path / "opt" / "migd"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "migd").symlink_to(migd)
    unit = tmp_path / "migd.service"
    unit.write_text(UNIT.read_text().replace("/opt/migd/", f"{venv}/"))
    (tmp_path / "migd.service.d").mkdir()
    shutil.copy(DROP_IN, tmp_path / "migd.service.d" / "slurm.conf")
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "migd.service" not in r.stderr, r.stderr  # no warnings about our unit


def test_the_readme_install_steps_match_the_unit() -> None:
    """It ran /usr/local/bin/migd, which a pip install into a venv never creates (Debian 12 refuses a
    system-wide pip install), and named a Documentation= file nothing installed."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Installing on a real node", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert "sudo /usr/bin/python3 -m venv /opt/migd " in block
    cp = _unit()
    for key in ("ExecStart", "ExecStartPre"):
        assert cp["Service"][key].startswith("/opt/migd/bin/migd "), cp["Service"][key]
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    installed = {f"/opt/migd/{where}/{Path(f).name}" for where, files in shipped.items() for f in files}
    doc = cp["Unit"]["Documentation"].removeprefix("file://")
    assert doc in installed, doc
    for src in re.findall(r"(/opt/migd/share/\S+)", block):
        assert src in installed or any(fnmatch.fnmatch(i, src) for i in installed), src
    for src in installed:
        assert (REPO / shipped_source(shipped, src)).exists(), src


def shipped_source(shipped: dict[str, list[str]], installed: str) -> str:
    where, name = installed.removeprefix("/opt/migd/").rsplit("/", 1)
    return next(f for f in shipped[where] if Path(f).name == name)


def test_a_configuration_error_is_not_restarted_and_slurm_mode_may_write_its_config() -> None:
    cp = _unit()
    assert cp["Service"]["RestartPreventExitStatus"] == "2"  # exit 2: bad config; restarting cannot help
    assert "network-online.target" in cp["Unit"]["Wants"] and "network-online.target" in cp["Unit"]["After"]
    assert "ProtectSystem=strict" in UNIT.read_text()
    assert "ReadWritePaths=/etc/slurm" in DROP_IN.read_text().splitlines()


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(UNIT.read_text())
    return cp


def test_journald_priorities_one_line_per_event() -> None:
    import logging

    from migd.daemon.main import JournalFormatter
    f = JournalFormatter("%(message)s")
    rec = logging.LogRecord("migd", logging.ERROR, __file__, 1, "GPU %d: apply of %s failed:\nline2", (3, "night"),
                            None)
    assert f.format(rec) == "<3>GPU 3: apply of night failed:\\nline2"
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


def _install_blocks() -> list[str]:
    section = (REPO / "README.md").read_text().split("## Installing on a real node", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


@pytest.mark.integration
def test_the_readme_install_steps_run_and_the_unit_verifies(tmp_path: Path) -> None:
    """The README's install steps, as written (less `sudo` and `systemctl`), in a private mount namespace
    whose /etc, /opt and /usr/local are overlays: the venv, the unit, the drop-in and /etc/migd are
    made as on a node, `migd --check` passes, and `systemd-analyze verify` finds nothing in the unit."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("systemd-analyze") is None:
        if os.environ.get("MIGD_REQUIRE_ROOT") == "1":
            pytest.fail("needs root, unshare and systemd-analyze (.ci/run runs as root)")
        pytest.skip("needs root (mount namespaces), unshare and systemd-analyze")
    steps = [ln.removeprefix("sudo ") for block in _install_blocks() for ln in block.replace("\\\n", " ").splitlines()
             if ln.startswith("sudo ") and not ln.startswith("sudo systemctl")]  # (a user's line: test_fresh_clone)
    assert len(steps) >= 8 and steps[0].startswith("/usr/bin/python3 -m venv /opt/migd "), steps
    overlays = "\n".join(f"mkdir -p {tmp_path}/{d}.u {tmp_path}/{d}.w && mount -t overlay overlay -o "
                         f"lowerdir=/{d},upperdir={tmp_path}/{d}.u,workdir={tmp_path}/{d}.w /{d}"
                         for d in ("etc", "opt", "usr/local"))
    script = "\n".join(["set -e", overlays, f"cd {REPO}", *steps,  # (the checkout's top directory)
                        "systemd-analyze verify /etc/systemd/system/migd.service 2>&1"])
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "overlay" in r.stderr and "mount" in r.stderr:
        pytest.skip(f"no overlay mounts here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "/etc/migd/migd.yaml: ok (4 profile(s)" in r.stdout, r.stdout[-2000:]
    assert "migd.service" not in r.stdout.split("ok (4 profile(s)", 1)[1], r.stdout[-2000:]  # verify said nothing
    assert (tmp_path / "etc.u" / "systemd" / "system" / "migd.service.d" / "slurm.conf").exists()
    assert not Path("/etc/migd").exists() and not Path("/opt/migd").exists()  # the host is untouched
