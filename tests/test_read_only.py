"""Everyone can look, nobody but root can change: an ordinary user reaches migd's
read-only socket (mode 0666, beside the control socket) and sees what root sees with `migctl daemon`
and `migctl status`; nothing that changes a GPU is reachable that way."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.ctl.client import request
from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, migctl_as, need_root

pytestmark = pytest.mark.integration  # real migd daemons, forked users

NOBODY = 65534


def as_nobody(argv: list[str]) -> tuple[int, str, str]:
    return migctl_as(NOBODY, NOBODY, argv)


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[tuple[MigdProcess, Path]]:
    with viewed(tmp_path) as started:
        yield started


@contextlib.contextmanager
def viewed(tmp_path: Path) -> Iterator[tuple[MigdProcess, Path]]:
    """migd on the day layout, its control socket in a private directory and the read-only one beside it."""
    need_root("to become another user")
    run = Path(tempfile.mkdtemp(prefix="migd-run-", dir="/tmp"))  # like /run: open to look into
    run.chmod(0o755)
    (run / "migd").mkdir(mode=0o700)  # like /run/migd: the control socket's private directory
    m = MigdProcess(tmp_path, "single-a100")
    with m.config.open("a") as f:
        f.write(f"control_socket: {run / 'migd' / 'control.sock'}\n")
    assert m.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    m.start(now="2026-11-23T10:00:00")
    m.wait_ready()
    try:
        yield m, run
    finally:
        m.close()
        shutil.rmtree(run, ignore_errors=True)


def args(m: MigdProcess, run: Path, *cmd: str) -> list[str]:
    return ["--sim", m.fleet, "--sim-state", str(m.migctl.state), "--state-dir", str(m.migctl.state_dir),
            "--control-socket", str(run / "migd" / "control.sock"), *cmd]


def test_an_ordinary_user_sees_what_root_sees(migd: tuple[MigdProcess, Path]) -> None:
    m, run = migd
    assert stat.S_IMODE((run / "migd" / "control.sock").stat().st_mode) == 0o600
    assert stat.S_IMODE((run / "migd-view" / "status.sock").stat().st_mode) == 0o666
    assert stat.S_IMODE((run / "migd-view").stat().st_mode) == 0o755
    code, out, err = as_nobody(args(m, run, "daemon"))
    assert code == 0 and "active profile: day (schedule)" in out and err == "", (out, err)
    code, out, err = as_nobody(args(m, run, "status", "-v"))  # the simulator's state is root's: migd reads it
    assert code == 0 and out.count("owner notebooks") == 7 and err == "", (out, err)
    (head, rest), root = out.split("\n", 1), m.migctl("status", "-v").out.split("\n", 1)
    assert rest == root[1]  # what root reads itself, from migd's last reading, which the head line dates:
    assert re.fullmatch(re.escape(root[0]) + r"; as migd read it at \d\d:\d\d:\d\d", head), (head, root[0])
    code, out, err = as_nobody(args(m, run, "isolation"))  # migd's last audit of the active profile
    assert code == 0 and out == "audit: no findings\n" and err == "", (out, err)
    code, out, err = as_nobody(args(m, run, "isolation", "--probe"))  # a probe needs the GPUs read here
    assert code == 1 and err.startswith("not permitted: ") and len(err.strip().splitlines()) == 1, err


def test_nothing_that_changes_a_gpu_is_reachable_that_way(migd: tuple[MigdProcess, Path]) -> None:
    m, run = migd
    code, out, err = as_nobody(args(m, run, "apply", str(PROFILES / "night.yaml")))
    assert code == 1 and err.startswith("not permitted: ") and len(err.strip().splitlines()) == 1, err
    for cmd in ("reload", "resume"):  # (reload said "reload rejected, migd keeps its running configuration")
        code, out, err = as_nobody(args(m, run, cmd))
        sock = run / "migd" / "control.sock"
        assert (code, out, err) == (1, "", f"not permitted: `migctl {cmd}` asks migd through its control socket "
                                            f"{sock}, which only root may use (sudo migctl {cmd})\n"), (cmd, out, err)
    text = (PROFILES / "night.yaml").read_text()
    for req in ({"cmd": "apply", "file": "night.yaml", "text": text}, {"cmd": "resume"},
                {"cmd": "clear-fault", "gpu": "0"}, {"cmd": "reload"}):
        pid = os.fork()
        if pid == 0:  # a client that is not migctl, as nobody, on the open socket
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            reply = request(run / "migd-view" / "status.sock", req, timeout_s=30)
            os._exit(0 if reply and not reply["ok"] and reply["error"].startswith("not permitted: ") else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, req
    assert m.assert_profile("day")  # nothing changed


def test_an_ordinary_user_sees_a_fault_mark_by_gpu_index(migd: tuple[MigdProcess, Path]) -> None:
    """Through the read-only socket migd's isolation answer has no GPU list: the mark itself names the GPU,
    as `migctl daemon` does, and says how root clears it."""
    m, run = migd
    world.raise_xid(StateStore(m.migctl.state), 0, 79)
    view = run / "migd-view" / "status.sock"
    m.wait_until(lambda: bool((request(view, {"cmd": "isolation"}, timeout_s=30) or {}).get("unhealthy")))
    uuid = StateStore(m.migctl.state).read().gpus[0].uuid
    mark = (rf"GPU 0 \({uuid}\): Xid 79 \(GPU-wide\) at 2026-11-2\d \S+ UTC; reconfiguring it is refused until "
            r"`migctl clear-fault 0`$")
    code, out, err = as_nobody(args(m, run, "isolation"))
    assert code == 1 and re.search(rf"^UNHEALTHY {mark}", out, re.M) and err == "", (out, err)
    code, out, err = as_nobody(args(m, run, "daemon"))
    assert code == 0 and re.search(rf"^unhealthy: {mark}", out, re.M), (out, err)
