"""Issue 39, second pass, item 1: a driver not loaded yet is a hardware condition, not a configuration
error.  migd exited 2 when NVML could not be opened, which the unit does not restart, so after a reboot
where the driver came up late migd stayed down for good.  Through the real migd against the simulator,
whose nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED until the test loads the driver."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.paths import listening
from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import migctl_as, need_root

NOBODY = 65534

pytestmark = pytest.mark.integration  # real migd daemons


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path)
    yield m
    m.close()


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100", reconcile_interval="1s", busy_timeout="30m")
    yield m
    m.close()


# -- 1: a driver that is not loaded yet ----------------------------------------------------------------
def test_a_driver_not_loaded_yet_is_waited_for_not_a_configuration_error(migd: MigdProcess) -> None:
    """It exited 2 (which the unit does not restart) and stayed down.  Now it waits, says so in the log,
    in STATUS= and on /healthz, and serves the GPUs once NVML opens, without a restart."""
    assert migd.migctl("status").code == 0  # the node exists; then its driver goes away
    store = StateStore(migd.migctl.state)
    world.driver_not_loaded(store, 10_000)
    migd.start(now="2026-11-23T10:00:00", time_scale=4.0)  # tries at 0.25 s, 0.5 s, 1 s, ... real
    status = migd.wait_for(lambda s: "STATUS=waiting for the NVIDIA driver" in s, timeout=30)
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in status and "READY=1" not in status
    migd.wait_until(lambda: migd.healthz()[0] == 503, timeout=20)
    code, body = migd.healthz()
    assert body.startswith("waiting for the NVIDIA driver: ") and "DRIVER_NOT_LOADED" in body, (code, body)
    time.sleep(2)  # several more tries: still waiting, said once
    assert migd.proc is not None and migd.proc.poll() is None, migd.log.read_text()
    assert not any("READY=1" in m for m in migd.messages)
    waits = [ln for ln in migd.log.read_text().splitlines() if "waiting for the NVIDIA driver" in ln]
    assert len(waits) == 1 and "WARNING" in waits[0], waits
    world.driver_not_loaded(store, 0)  # the module is loaded
    migd.wait_ready(timeout=60)
    assert migd.assert_profile("day")
    migd.wait_until(lambda: migd.healthz()[0] == 200, timeout=30)
    assert "NVML opened after waiting" in migd.log.read_text()
    assert migd.stop() == 0
    migd.assert_no_traceback()


def test_migctl_is_told_migd_waits_for_the_driver_not_that_no_migd_listens(tmp_path: Path) -> None:
    """While migd waited for the driver its sockets were not bound: `migctl daemon` said "no migd is
    listening" of a migd that ran, and a second migd started beside it.  Now both sockets answer every
    request with the wait's line (exit 4, a hardware condition), for root and for an ordinary user, a
    second migd is refused as at any time, and once NVML opens migd's own sockets answer."""
    need_root("to become another user")
    run = Path(tempfile.mkdtemp(prefix="migd-run-", dir="/tmp"))  # like /run: open to look into
    run.chmod(0o755)
    (run / "migd").mkdir(mode=0o700)
    m = MigdProcess(tmp_path)
    try:
        with m.config.open("a") as f:
            f.write(f"control_socket: {run / 'migd' / 'control.sock'}\n")
        assert m.migctl("status").code == 0
        store = StateStore(m.migctl.state)
        world.driver_not_loaded(store, 10_000)
        m.start(now="2026-11-23T10:00:00")
        m.wait_for(lambda s: "STATUS=waiting for the NVIDIA driver" in s, timeout=30)
        argv = ["--sim", m.fleet, "--sim-state", str(m.migctl.state), "--state-dir", str(m.migctl.state_dir),
                "--control-socket", str(run / "migd" / "control.sock")]
        waits = re.compile(r"hardware error: migd is waiting for the NVIDIA driver \(\d+ s so far; it serves the "
                           r"GPUs once NVML opens\): .*DRIVER_NOT_LOADED.*\n")
        for who, cmd in (("root", "daemon"), ("nobody", "daemon"), ("nobody", "status"), ("nobody", "isolation")):
            code, out, err = migctl_as(0 if who == "root" else NOBODY, 0 if who == "root" else NOBODY, [*argv, cmd])
            assert (code, out) == (4, "") and waits.fullmatch(err), (who, cmd, code, out, err)
        for cmd in ("resume", "clear-fault"):  # (requests that would change: migd's refusal, its exit)
            code, out, err = migctl_as(0, 0, [*argv, cmd, *(["0"] if cmd == "clear-fault" else [])])
            assert (code, out) == (4, "") and err.startswith("error (from migd): migd is waiting for the NVIDIA "
                                                             "driver ("), (cmd, code, out, err)
        code, out, err = migctl_as(0, 0, [*argv, "apply", str(tmp_path / "profiles" / "night.yaml")])
        assert (code, out) == (4, "") and re.fullmatch(r"hardware error: .*DRIVER_NOT_LOADED.*\n", err), err
        reload_while_waiting(m, [*argv, "reload"])
        second = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(m.config), "--sim", m.fleet,
                                 "--sim-state", str(m.migctl.state), "--state-dir", str(m.migctl.state_dir)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "another migd is running" in second.stderr, second.stderr
        gaps: list[float] = []  # a moment where nothing listened: a second migd could claim the socket
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                if not listening(run / "migd" / "control.sock"):
                    gaps.append(time.monotonic())
                time.sleep(0.005)
        watcher = threading.Thread(target=watch)
        watcher.start()
        world.driver_not_loaded(store, 0)
        try:
            m.wait_ready(timeout=60)
            m.wait_until(lambda: migctl_as(0, 0, [*argv, "daemon"])[0] == 0, timeout=30)
        finally:
            done.set()
            watcher.join()
        assert not gaps, f"the control socket did not listen for {len(gaps)} look(s) at the hand-over"
        code, out, err = migctl_as(NOBODY, NOBODY, [*argv, "daemon"])
        assert code == 0 and "active profile: night" in out and err == "", (out, err)  # (the reload's schedule)
        assert m.stop() == 0
        m.assert_no_traceback()
    finally:
        m.close()
        shutil.rmtree(run, ignore_errors=True)


def reload_while_waiting(m: MigdProcess, reload: list[str]) -> None:
    """`migctl reload` while migd waits: refused as "reload rejected, migd keeps its running configuration"
    with the wait's line, though a SIGHUP then was kept.  Now the file is read and checked at once (a bad
    one rejected, exit 2, dropping any reload kept before it) and kept for when migd serves the GPUs, as a
    SIGHUP is, with what only a restart changes said."""
    good = m.config.read_text()
    m.config.write_text(good + "schedule: [\n")
    code, out, err = migctl_as(0, 0, reload)
    assert code == 2 and out == "" and err.startswith("error: reload rejected, migd keeps its running configura"
                                                      f"tion: {m.config}:"), (code, out, err)
    nights = good.replace('{profile: day,   at: "08:30"', '{profile: night, at: "08:30"')
    assert nights != good and "sample_interval: 1s\n" in nights
    m.config.write_text(nights.replace("sample_interval: 1s\n", "sample_interval: 2s\n"))
    code, out, err = migctl_as(0, 0, reload)  # (migd started on `day` at 10:00 Monday: now it should serve `night`)
    assert (code, err) == (0, "") and out == (f"reloaded: {m.config}: 4 profiles, 3 transitions; migd reads it again "
                                              "and serves the GPUs with it once NVML opens (it waits for the NVIDIA "
                                              "driver); restart needed for sample_interval\n"), out


def test_healthz_while_waiting_for_the_driver_holds_no_thread_and_logs_no_traceback(migd: MigdProcess) -> None:
    """The wait's /healthz (http.server) printed a traceback into migd's log per client that reset its
    connection, and a client that sent half a request held a thread for ever."""
    assert migd.migctl("status").code == 0
    world.driver_not_loaded(StateStore(migd.migctl.state), 10_000)
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_until(lambda: migd.healthz()[0] == 503, timeout=30)
    assert migd.proc is not None
    tasks = Path(f"/proc/{migd.proc.pid}/task")
    idle = len(list(tasks.iterdir()))
    for _ in range(30):  # answered, then reset before the answer is read
        with socket.create_connection(("127.0.0.1", migd.port), timeout=5) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    halves = [socket.create_connection(("127.0.0.1", migd.port), timeout=5) for _ in range(20)]
    for s in halves:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
    try:
        migd.wait_until(lambda: len(list(tasks.iterdir())) >= idle + 15, timeout=10)  # a thread each, for now
        migd.wait_until(lambda: len(list(tasks.iterdir())) <= idle + 2, timeout=30)  # each let go in 5 s
    finally:
        for s in halves:
            s.close()
    assert migd.healthz()[0] == 503
    assert migd.stop() == 0
    migd.assert_no_traceback()


def test_sigterm_while_waiting_for_the_driver_stops_cleanly(migd: MigdProcess) -> None:
    """A node stopped before its driver came (or a library NVML cannot read at all): exit 0, one line."""
    migd.migctl.state.write_text("{not json")  # what a broken libnvidia-ml is to the simulated node
    migd.start()
    migd.wait_for(lambda s: "STATUS=waiting for the NVIDIA driver" in s, timeout=30)
    assert migd.stop() == 0
    log = migd.log.read_text()
    assert "stopped while waiting for the NVIDIA driver" in log and "not starting" not in log, log
    migd.assert_no_traceback()




def test_sighup_from_the_wait_to_the_daemon_never_ends_migd(migd: MigdProcess) -> None:
    """Between the driver wait and the daemon's own handlers SIGHUP had its default action: a `systemctl
    reload` as NVML opened ended migd.  One relay now serves the whole run; what came before the daemon
    served is handed to it."""
    assert migd.migctl("status").code == 0
    store = StateStore(migd.migctl.state)
    world.driver_not_loaded(store, 10_000)
    migd.start(now="2026-11-23T10:00:00", time_scale=4.0)
    migd.wait_for(lambda s: "STATUS=waiting for the NVIDIA driver" in s, timeout=30)
    assert migd.proc is not None
    proc, done, sent = migd.proc, threading.Event(), [0]

    def hup() -> None:
        while not done.wait(0.01) and proc.poll() is None:  # (through the hand-over, every 10 ms)
            proc.send_signal(signal.SIGHUP)
            sent[0] += 1
    def over() -> bool:
        migd.poll_notify()
        return proc.poll() is not None or any("READY=1" in s and "MAINPID" in s for s in migd.messages)
    sender = threading.Thread(target=hup)
    sender.start()
    try:
        world.driver_not_loaded(store, 0)
        migd.wait_until(over, timeout=60)
    finally:
        done.set()
        sender.join()
    assert proc.poll() is None, f"migd ended after {sent[0]} SIGHUPs: {migd.log.read_text()[-2000:]}"
    assert sent[0] > 10, sent  # (it was signalled through the start, not only before it)
    migd.wait_until(lambda: "configuration reloaded" in migd.log.read_text(), timeout=30)
    assert migd.stop() == 0
    migd.assert_no_traceback()


SIGHUP_AS_IT_LOADS = """
import os, signal, sys
from migd.daemon import main as m
real, sent = m.load_config, []
def loading(*args, **kw):
    if not sent:  # (the first read: the configuration migd starts on)
        sent.append(os.kill(os.getpid(), signal.SIGHUP))
    return real(*args, **kw)
m.load_config = loading
sys.exit(m.main(sys.argv[4:]))
"""


def test_sighup_while_migd_reads_its_configuration_is_a_reload(migd: MigdProcess) -> None:
    """A SIGHUP before migd's relay took signals (it read its configuration first) had the default
    action and ended migd.  The relay now comes first: the SIGHUP is kept and is a reload once it serves."""
    migd.start(now="2026-11-23T10:00:00", wrap=(sys.executable, "-c", SIGHUP_AS_IT_LOADS))
    migd.wait_ready(timeout=60)
    migd.wait_until(lambda: "configuration reloaded" in migd.log.read_text(), timeout=30)
    assert migd.proc is not None and migd.proc.poll() is None
    assert migd.stop() == 0
    migd.assert_no_traceback()
