"""Everyone may look, nobody may stall it: bad input on migd's sockets is the
client's mistake, answered in one line and never logged as migd's failure; and migctl reads every
reply through its wire type, bounded in size and time, so a server that is not migd (or a migd of
another version, or one cut off mid-reply) is one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.paths import listening, status_socket
from tests.daemon_harness import MigdProcess
from tests.helpers import PROFILES, Migctl

pytestmark = pytest.mark.integration  # real migd daemons, migctl as a program

DEEP = 50_000

BAD_REQUESTS = {
    "cmd a list": b'{"cmd": ["status"]}\n',
    "cmd an object": b'{"cmd": {"status": 1}}\n',
    "no cmd": b'{"gpu": "0"}\n',
    "deep array": b"[" * DEEP + b"]" * DEEP + b"\n",
    "deep object": b'{"cmd": "status", "x": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}\n",
    "not JSON": b"status please\n",
    "an array": b'["status"]\n',
    "not UTF-8": b'{"cmd": "\xff\xfe"}\n',
    "a number of 5000 digits": b'{"cmd": "status", "x": ' + b"9" * 5000 + b"}\n",
}


def _ask(path: Path, line: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(path))
        s.sendall(line)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    return buf


@pytest.fixture(scope="module")
def migd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path_factory.mktemp("migd"), "single-a100")
    m.start(now="2026-11-23T10:00:00")
    m.wait_ready()
    yield m
    m.close()


@pytest.mark.parametrize("which", ["control", "read-only"])
def test_a_malformed_request_is_one_line_bad_request_and_no_error_in_the_log(migd: MigdProcess, which: str) -> None:
    path = migd.socket_path if which == "control" else status_socket(migd.socket_path)
    assert path.exists(), migd.log.read_text()[-2000:]
    before = len(migd.log.read_text())
    for name, line in BAD_REQUESTS.items():
        raw = _ask(path, line)
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1, (name, raw[:200])
        reply = json.loads(raw)
        assert reply["ok"] is False and reply["exit"] == 2, (name, reply)
        assert reply["error"].startswith("bad request: "), (name, reply)
        assert "\n" not in reply["error"] and len(reply["error"]) < 300, (name, reply)
    assert json.loads(_ask(path, b'{"cmd": "status"}\n'))["ok"] is True  # and migd answers on
    logged = migd.log.read_text()[before:]
    assert "Traceback" not in logged and "ERROR" not in logged and "CRITICAL" not in logged, logged[-3000:]


@pytest.mark.parametrize("which", ["control", "read-only"])
def test_a_connection_that_sends_nothing_is_a_liveness_check_not_a_bad_request(migd: MigdProcess, which: str) -> None:
    """migctl asks whether migd runs (``apply --local`` is refused beside it) by connecting and closing:
    nobody's mistake, so nothing in migd's log says a client sent a bad request."""
    path = migd.socket_path if which == "control" else status_socket(migd.socket_path)
    before = len(migd.log.read_text())
    for _ in range(3):
        assert listening(path)
    assert json.loads(_ask(path, b'{"cmd": "status"}\n'))["ok"] is True
    time.sleep(1)  # (the probes' handler threads may log after that reply: time to, were it a bad request)
    logged = migd.log.read_text()[before:]
    assert "bad request" not in logged and "Traceback" not in logged, logged[-3000:]


@pytest.mark.parametrize("field, value", [("busy_timeout_s", "NaN"), ("busy_timeout_s", "Infinity"),
                                          ("lock_timeout_s", "1e308"), ("lock_timeout_s", "-1")])
def test_an_apply_whose_timeout_is_not_a_duration_is_a_bad_request(migd: MigdProcess, field: str, value: str) -> None:
    """NaN was taken: the apply waited "up to nans" for busy instances, for ever, holding the apply lock."""
    text = json.dumps((PROFILES / "night.yaml").read_text())
    line = f'{{"cmd": "apply", "file": "night.yaml", "text": {text}, "{field}": {value}}}\n'.encode()
    reply = json.loads(_ask(migd.socket_path, line))
    assert reply["ok"] is False and reply["exit"] == 2 and reply["error"].startswith("bad request: "), reply
    assert field in reply["error"] and migd.assert_profile("day"), reply


class FakeServer:
    """Not migd: answers each connection's request line with ``reply`` (bytes, or a callable writing to
    the connection), then closes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reply: bytes | object = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                buf = b""
                while not buf.endswith(b"\n") and (chunk := conn.recv(65536)):
                    buf += chunk
                if callable(self.reply):
                    self.reply(conn, self.stop)
                else:
                    assert isinstance(self.reply, bytes)
                    conn.sendall(self.reply)
            except OSError:
                pass  # migctl gave up on us: what it should do

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _drip(conn: socket.socket, stop: threading.Event) -> None:
    """A reply that never ends: a byte every 50 ms, never a newline."""
    conn.sendall(b'{"ok": true, "exit": 0, "detail": "')
    while not stop.is_set():
        conn.sendall(b"x")
        time.sleep(0.05)


def _huge(conn: socket.socket, stop: threading.Event) -> None:
    """64 MiB without a newline, then the connection held open."""
    block = b"x" * (1 << 20)
    for _ in range(64):
        conn.sendall(block)
    stop.wait(60)


BAD_REPLIES: dict[str, object] = {
    "not JSON": b"SSH-2.0-OpenSSH_9.6\r\n",
    "an array": b'[true, 0]\n',
    "wrong field names": b'{"success": true, "code": 0, "state": {}}\n',
    "exit as a word": b'{"ok": false, "exit": "busy", "error": "busy"}\n',
    "error with exit 0": b'{"ok": false, "exit": 0, "error": "no"}\n',
    "deep nesting": b'{"ok": true, "exit": 0, "daemon": ' + b"[" * DEEP + b"]" * DEEP + b"}\n",
    "truncated": b'{"ok": true, "exit": 0, "daem',
    "only ok and exit": b'{"ok": true, "exit": 0}\n',
    "fields of the wrong type": b'{"ok": true, "exit": 0, "lifted": 7, "profile": [], "result": "x", '
                                b'"cleared": "0", "daemon": [], "detail": 3}\n',
    "64 MiB": _huge,
    "a leading NUL": b'\x00{"ok": true, "exit": 0}\n',  # (json.loads took the bytes for UTF-16: said so)
    "a refusal without its reason": b'{"ok": false, "exit": 3}\n',  # (it said "...: None")
}
COMMANDS = {"daemon": ("daemon",), "resume": ("resume",), "reload": ("reload",), "clear-fault": ("clear-fault", "0"),
            "apply": ("apply", str(PROFILES / "day.yaml"))}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeServer]:
    server = FakeServer(tmp_path / "migd-fake.sock")
    yield server
    server.close()


def _one_line_failure(run: subprocess.CompletedProcess[str], what: str) -> None:
    err = run.stderr
    assert run.returncode != 0, (what, run.stdout, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (what, err)


CASES = [(command, reply) for reply in BAD_REPLIES for command in COMMANDS
         if reply != "64 MiB" or command in ("daemon", "resume")]  # (one command for each bound is enough)


@pytest.mark.parametrize(("command", "reply"), CASES)
def test_migctl_says_a_reply_it_cannot_read_in_one_line(tmp_path: Path, fake: FakeServer, reply: str,
                                                        command: str) -> None:
    fake.reply = BAD_REPLIES[reply]
    started = time.monotonic()
    run = Migctl(tmp_path, "single-a100").process("--control-socket", str(fake.path), *COMMANDS[command], timeout=60)
    _one_line_failure(run, f"{command} / {reply}")
    assert time.monotonic() - started < 30, (command, reply)


@pytest.mark.parametrize(("reply", "said"), [
    ("a leading NUL", "error talking to migd: its reply does not read as this migctl expects (a migd of another "
                      "version?): reply: not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("a refusal without its reason", "error talking to migd: migd did not answer with its state: no reason given "
                                     "(exit 3)"),  # (an apply's refusal may carry its result instead)
])
def test_a_reply_migctl_cannot_read_says_what_is_wrong_with_it(tmp_path: Path, fake: FakeServer, reply: str,
                                                               said: str) -> None:
    fake.reply = BAD_REPLIES[reply]
    run = Migctl(tmp_path, "single-a100").process("--control-socket", str(fake.path), "daemon", timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (1, "", said + "\n"), run


def test_a_reply_that_never_ends_stops_at_the_commands_timeout(tmp_path: Path, fake: FakeServer) -> None:
    fake.reply = _drip
    started = time.monotonic()
    run = Migctl(tmp_path, "single-a100").process("--control-socket", str(fake.path), "clear-fault", "0", timeout=40)
    took = time.monotonic() - started
    _one_line_failure(run, "clear-fault / a reply that never ends")
    assert "10s" in run.stderr and took < 25, (took, run.stderr)


def test_the_reply_bound_is_documented() -> None:
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "daemon.md").read_text().split())
    assert "a reply one line of at most 16 MiB" in doc and "nest at most 32 deep" in doc
