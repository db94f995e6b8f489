"""Everyone may look, nobody may stall it: migd's read-only socket as an ordinary user can push it.

A user holds at most a share of its connections, and only for as long as one request line may take
to arrive (a byte every second does not keep a slot); what it answers comes from the sampler's last
reading, so no number of unprivileged requests reaches NVML.  Bounds: docs/daemon.md."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import select
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from migd.ctl.client import request
from migd.daemon.slots import Limits
from tests.helpers import PROFILES, migctl_as, need_root
from tests.test_read_only import NOBODY, args, viewed
from tests.test_socket_input import FakeServer

pytestmark = pytest.mark.integration  # real migd daemons, forked users

OTHER = 65533  # a second ordinary user
SHARE = Limits().per_user


def _fork_as(uid: int, work: Callable[[], dict[str, object]]) -> tuple[int, int]:
    """``work()`` in a child that became ``uid``: its pid and the pipe its JSON result (or error) comes on."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgroups([uid])
            os.setgid(uid)
            os.setuid(uid)
            result = work()
            code = 0
        except BaseException as e:  # noqa: BLE001 - said to the parent, which fails the test with it
            result = {"error": repr(e)}
        finally:
            os.write(w, json.dumps(result).encode())
            os._exit(code)
    os.close(w)
    return pid, r


def _result(pid: int, r: int) -> dict[str, object]:
    with os.fdopen(r) as f:
        text = f.read()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, text
    return dict(json.loads(text))


def _as_user(uid: int, work: Callable[[], dict[str, object]]) -> dict[str, object]:
    return _result(*_fork_as(uid, work))


class Drip:
    """``n`` connections that each send '{' and then one byte a second, until migd closes them (or
    ``give_up_s`` passes, which only bounds a hang): what migd said on each, in connection order."""

    def __init__(self, path: Path, n: int, ready: int, give_up_s: float = 120.0) -> None:
        self.path, self.n, self.ready, self.give_up_s = path, n, ready, give_up_s

    def __call__(self) -> dict[str, object]:
        conns = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(self.n)]
        for c in conns:
            c.connect(str(self.path))
            with contextlib.suppress(OSError):  # (refused at once)
                c.send(b"{")
        os.write(self.ready, b"x")  # every connection is in: the other user may go
        said = {i: b"" for i in range(self.n)}
        open_ = set(said)
        end = time.monotonic() + self.give_up_s
        while open_ and time.monotonic() < end:
            readable, _, _ = select.select([conns[i] for i in open_], [], [], 1.0)
            for c in readable:
                i = conns.index(c)
                try:
                    data = c.recv(65536)
                except OSError:
                    data = b""
                said[i] += data
                if not data:
                    open_.discard(i)
            for i in open_:
                with contextlib.suppress(OSError):
                    conns[i].send(b" ")
        return {"replies": [said[i].decode() for i in range(self.n)], "still_open": len(open_)}


def test_a_dripping_user_holds_only_a_share_and_only_for_a_while(tmp_path: Path) -> None:
    with viewed(tmp_path) as (m, run):
        ready_r, ready_w = os.pipe()  # nobody drips on 70 connections (more than the 64 migd serves at once)
        child = _fork_as(NOBODY, Drip(run / "migd-view" / "status.sock", 70, ready_w))
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"x"
        # Another ordinary user is served meanwhile: status (the layout) and daemon both answer.
        code, out, err = migctl_as(OTHER, OTHER, args(m, run, "status"))
        assert code == 0 and "MIG enabled on 1" in out and err == "", (out, err)
        code, out, err = migctl_as(OTHER, OTHER, args(m, run, "daemon"))
        assert code == 0 and "active profile: day" in out and err == "", (out, err)
        drip = _result(*child)
        replies = [json.loads(r) for r in drip["replies"]]
        assert drip["still_open"] == 0  # migd closed every one of them, however they dripped
        busy = [r for r in replies if "already has" in r["error"]]
        late = [r for r in replies if "no complete request line within 5 s" in r["error"]]
        assert len(busy) == 70 - SHARE and len(late) == SHARE, replies
        assert all(r["ok"] is False and r["exit"] == 1 for r in busy)
        assert busy[0]["error"] == (f"migd is busy: uid {NOBODY} already has {SHARE} connections open to this "
                                    f"socket (each user's share); try again")
        m.assert_no_traceback()
        assert not [line for line in m.log.read_text().splitlines() if " WARNING " in line or " ERROR " in line]


def test_no_unprivileged_request_reaches_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "nvml-calls.log"
    monkeypatch.setenv("MIGD_SIM_CALL_LOG", str(calls))
    with viewed(tmp_path) as (m, run):
        m.wait_until(lambda: "migd-sampler\t" in calls.read_text())  # the log sees migd's own reads
        path = str(run / "migd-view" / "status.sock")

        def flood() -> dict[str, object]:  # as nobody: SHARE clients at once, 8 layouts each
            def eight(_: int) -> list[bool]:
                return [bool((request(path, {"cmd": "layout"}, timeout_s=60) or {}).get("ok")) for _ in range(8)]
            with concurrent.futures.ThreadPoolExecutor(SHARE) as pool:
                return {"ok": [ok for oks in pool.map(eight, range(SHARE)) for ok in oks]}
        answered = _as_user(NOBODY, flood)
        assert answered["ok"] == [True] * 8 * SHARE
        threads = {line.split("\t")[0] for line in calls.read_text().splitlines()}
        assert not [t for t in threads if "process_request" in t or t == "migd-http"], threads
        # Root's apply is what the next look shows: the reading after an apply waits for its layout.
        sock = str(run / "migd" / "control.sock")
        applied = m.migctl("--control-socket", sock, "apply", str(PROFILES / "night.yaml"))
        assert applied.code == 0 and "(by migd)" in applied.out, applied
        code, out, err = migctl_as(NOBODY, NOBODY, args(m, run, "status", "-v"))
        assert code == 0 and out.count(" GI ") == m.migctl("status", "-v").out.count(" GI "), (out, err)
        assert "owner notebooks" not in out


@pytest.mark.parametrize("command", ["status", "isolation"])
def test_a_busy_answer_is_said_as_such(tmp_path: Path, command: str) -> None:
    """A user past their share is told migd is busy (one line, exit 1), not that migd is absent or
    that they may not look."""
    need_root("to become another user")
    run = Path(tempfile.mkdtemp(prefix="migd-run-", dir="/tmp"))
    try:
        run.chmod(0o755)
        (run / "migd").mkdir(mode=0o700)
        (run / "migd-view").mkdir(mode=0o755)
        fake = FakeServer(run / "migd-view" / "status.sock")
        (run / "migd-view" / "status.sock").chmod(0o666)
        busy = f"migd is busy: uid {NOBODY} already has {SHARE} connections open to this socket (each user's share)"
        fake.reply = json.dumps({"ok": False, "exit": 1, "error": f"{busy}; try again"}).encode() + b"\n"
        try:
            code, out, err = migctl_as(NOBODY, NOBODY, ["--sim", "single-a100", "--sim-state", str(tmp_path / "s.json"),
                                                        "--control-socket", str(run / "migd" / "control.sock"),
                                                        command])
        finally:
            fake.close()
        assert code == 1 and busy in err and len(err.strip().splitlines()) == 1 and out == "", (out, err)
    finally:
        shutil.rmtree(run, ignore_errors=True)
