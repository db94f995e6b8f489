"""What migctl and migd tell the operator is what they did: each message, exit code and override
checked from the user's side, through the real daemon where one is involved."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from migd.apply.journal import Journal
from migd.ctl.migctl import main
from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES, Migctl

pytestmark = pytest.mark.integration  # real migd daemons, migctl as a program

TYPOS = {
    "index": "select: {index: [12]}",
    "model": "select: {model: [A10O*]}",
}
PROFILE = """\
apiVersion: migd/v1
kind: Profile
name: typo
gpus:
  - {select}
    instances:
      - {{profile: 7g, count: 1}}
"""


def _typo(tmp: Path, kind: str) -> Path:
    path = tmp / f"typo-{kind}.yaml"
    path.write_text(PROFILE.format(select=TYPOS[kind]))
    path.chmod(0o644)
    return path


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100")
    yield m
    m.close()


def migctl(migd: MigdProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """migctl as the user runs it: its own process, bound to the daemon's simulated node."""
    return migd.migctl.process(*args, timeout=timeout)


@pytest.mark.parametrize("kind", sorted(TYPOS))
def test_a_profile_that_selects_no_gpu_is_refused_locally(tmp_path: Path, kind: str) -> None:
    """It used to plan a blank line, assert "applied on 0 GPU(s)" and apply "applied": exit 0 each."""
    m = Migctl(tmp_path, "dgx-a100")
    path = _typo(tmp_path, kind)
    before = m.layout()
    for cmd in (("plan",), ("assert",), ("apply", "--local"), ("apply", "--dry-run", "--local")):
        r = m(cmd[0], str(path), *cmd[1:])
        assert r.code == 2, (cmd, r)
        assert r.out == "", (cmd, r.out)
        line, = r.err.splitlines()
        assert line.startswith(f"error: {path}:5:5: ") and "matches no GPU of this node" in line, line
        assert TYPOS[kind].split("{")[1].split(":")[0] in line and "GPU 0-7 (A100-SXM4-80GB)" in line, line
    assert m.layout() == before
    assert StateStore(m.state).read().mutations == 0


def test_a_profile_that_selects_no_gpu_is_not_held_by_the_daemon(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00")  # Monday 10:00 KST: day
    migd.wait_ready()
    store = StateStore(migd.migctl.state)
    before = store.read().mutations
    r = migctl(migd, "apply", str(_typo(migd.tmp, "index")))
    assert r.returncode == 2 and "matches no GPU of this node" in r.stderr, r
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["override"] is None and doc["active"]["reason"] == "schedule", doc["active"]
    assert not (migd.migctl.state_dir / "override.json").exists()
    assert store.read().mutations == before
    assert "applied" not in r.stdout


def test_validate_catches_an_index_beyond_the_node(tmp_path: Path) -> None:
    path = str(_typo(tmp_path, "index"))
    m = Migctl(tmp_path, "dgx-a100")
    known = m("validate", path)  # the fleet is known (--sim dgx-a100): index 12 cannot exist there
    assert known.code == 2 and "index 12 is beyond this node's GPUs (0-7)" in known.err, known
    sized = m("validate", "--gpus", "16", path)  # told the node is larger: fine
    assert sized.code == 0, sized
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["validate", path])  # nothing known about the node: a warning, not an error
    said = err.getvalue()
    assert code == 0 and "warning: " in said and "index 12: no server carries more than 10" in said, said


def test_validate_notes_unconfirmed_facts_once_for_all_files() -> None:
    files = [str(p) for p in sorted(PROFILES.glob("*.yaml"))]
    r = subprocess.run([*MIGCTL, "validate", *files], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(files)
    for line in r.stdout.splitlines():  # a config's line names a few models, not all 27
        assert line.endswith("more catalog models; -v lists them)") and len(line) < 160, line
    notes = r.stderr.splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: ") and "-v" in notes[0], notes
    v = subprocess.run([*MIGCTL, "validate", "-v", files[0]], capture_output=True, text=True,
                       timeout=120)
    assert v.returncode == 0 and "RTX-PRO-6000-Blackwell-Server" in v.stdout and "more catalog" not in v.stdout



def _day(migd: MigdProcess) -> list[object]:
    """migd started on Monday 10:00 KST (day; night follows at 19:00), its layout once applied."""
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    return list(migd.migctl.layout())


def _daemon(migd: MigdProcess) -> dict[str, Any]:
    doc: dict[str, Any] = migd.control({"cmd": "status"})["daemon"]
    return doc


def _metric(migd: MigdProcess, line: str) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/metrics", timeout=10) as r:
        return line in r.read().decode().splitlines()


def test_resume_lifts_a_manual_apply_and_returns_to_the_schedule(migd: MigdProcess) -> None:
    _day(migd)
    r = migctl(migd, "apply", str(PROFILES / "night.yaml"))
    assert r.returncode == 0, r.stderr
    held = r.stdout.splitlines()[-1]
    assert held == "night holds until 2026-11-23T10:00:00+00:00; `migctl resume` returns to the schedule now", held
    table = migctl(migd, "daemon").stdout
    assert "manual apply of" in table and "`migctl resume` returns to the schedule now" in table, table
    r = migctl(migd, "resume")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "lifted the manual apply of night"
    assert r.stdout.splitlines()[-1] == "back on the schedule: day"
    assert "day: applied in " in r.stdout and "(by migd)" in r.stdout
    assert migd.assert_profile("day")
    doc = _daemon(migd)
    assert doc["override"] is None and doc["active"]["reason"] == "schedule" and doc["applied_profile"] == "day"
    assert not (migd.migctl.state_dir / "override.json").exists()
    again = migctl(migd, "resume")  # nothing held: said so, and nothing changes
    assert again.returncode == 0 and again.stdout.splitlines() == ["no manual apply was held",
                                                                    "back on the schedule: day"], again.stdout


def test_resume_without_a_daemon_drops_the_kept_apply(migd: MigdProcess) -> None:
    _day(migd)
    assert migctl(migd, "apply", str(PROFILES / "night.yaml")).returncode == 0
    assert migd.stop() == 0
    r = migctl(migd, "resume")
    assert r.returncode == 0 and "dropped the kept manual apply" in r.stdout, r
    migd.start(now="2026-11-23T11:00:00")  # still before 19:00: without resume, night would hold
    migd.wait_ready()
    assert migd.assert_profile("day") and _daemon(migd)["active"]["reason"] == "schedule"


def test_ctrl_c_on_an_apply_through_migd_cancels_it(migd: MigdProcess) -> None:
    """It said "interrupted ... migctl recover restores it" while migd finished the apply and held it."""
    before = _day(migd)
    store = StateStore(migd.migctl.state)
    world.set_mutation_delay(store, 0.3)
    p = subprocess.Popen([*MIGCTL, "--sim", migd.fleet, "--sim-state", str(migd.migctl.state),
                          "--state-dir", str(migd.migctl.state_dir), "apply", str(PROFILES / "night.yaml")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = store.read().mutations
    migd.wait_until(lambda: store.read().mutations >= base + 3, timeout=60)  # under way
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    world.set_mutation_delay(store, 0)
    assert p.returncode == 130, (out, err)
    assert err.startswith("cancelling: migd stops at the next step") and \
        err.splitlines()[-1] == "interrupted: the apply was cancelled; no GPU was left changed and nothing is held", err
    assert out.startswith("night: cancelled in ") and out.splitlines()[0].endswith("(by migd)"), out
    assert migd.migctl.layout() == before
    doc = _daemon(migd)
    assert doc["override"] is None and doc["active"]["reason"] == "schedule", doc["active"]
    assert doc["last_apply"]["result"] == "cancelled" and doc["apply_count"].get("cancelled") == 1, doc
    assert not (migd.migctl.state_dir / "override.json").exists()
    assert not (migd.migctl.state_dir / "journal.json").exists()
    assert _metric(migd, "migd_last_apply_success 1.0")
    assert "Traceback" not in migd.log.read_text()


def test_local_apply_is_refused_beside_a_running_daemon(migd: MigdProcess) -> None:
    """It was silently undone 0.2 s later, logged as "applied profile night (reconcile)"."""
    migd.write_config(reconcile_interval="1s")
    before = _day(migd)
    r = migctl(migd, "apply", str(PROFILES / "night.yaml"), "--local")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("error: --local: migd is running") and "--force-local" in r.stderr, r.stderr
    assert migd.migctl.layout() == before
    # (migd's pass, every second here, holds the apply lock while it reads the GPUs)
    forced = migctl(migd, "apply", str(PROFILES / "night.yaml"), "--force-local", "--lock-timeout", "60")
    assert forced.returncode == 0 and forced.stderr.startswith("warning: --force-local: migd is running"), forced
    migd.wait_until(lambda: migd.migctl.layout() == before, timeout=30)  # migd reconciles, and says it was drift
    log = migd.log.read_text()
    assert "drift on GPU 0: it holds 7g.80gb, profile day wants 7x1g.10gb; correcting it" in log, log[-2000:]
    migd.wait_until(lambda: "drift corrected: profile day restored" in migd.log.read_text(), timeout=30)


def test_a_busy_refusal_is_blocked_not_an_error(migd: MigdProcess) -> None:
    _day(migd)
    store = StateStore(migd.migctl.state)
    world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
    r = migctl(migd, "apply", str(PROFILES / "night.yaml"))
    assert r.returncode == 3, r
    assert r.stderr.rstrip().endswith("(--on-busy wait waits for them; --on-busy force stops them)"), r.stderr
    waited = migctl(migd, "apply", str(PROFILES / "night.yaml"), "--on-busy", "wait", "--busy-timeout", "1s")
    assert waited.returncode == 3, waited
    assert "--on-busy wait" not in waited.stderr and "a longer --busy-timeout" in waited.stderr, waited.stderr
    doc = _daemon(migd)
    assert doc["apply_count"].get("blocked") == 2 and "error" not in doc["apply_count"], doc["apply_count"]
    assert doc["last_apply"]["result"] == "blocked"
    assert "last apply: night: blocked" in migctl(migd, "daemon").stdout
    assert _metric(migd, 'migd_applies_total{result="blocked"} 2.0')
    assert _metric(migd, 'migd_applies_total{result="error"} 0.0')
    assert _metric(migd, "migd_last_apply_success 1.0")
    assert " ERROR " not in migd.log.read_text()


def test_clients_that_hang_up_leave_no_traceback_in_migds_log(migd: MigdProcess) -> None:
    """A Ctrl-C'd migctl or a second migd's probe closed the socket before the reply: BrokenPipeError."""
    _day(migd)
    for _ in range(30):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(migd.socket_path))
            s.sendall(b'{"cmd": "status"}\n')
    assert migd.control({"cmd": "status"})["ok"]  # still serving
    log = migd.log.read_text()
    assert "Traceback" not in log and "BrokenPipe" not in log, log[-3000:]


def test_a_closed_stdout_is_not_a_daemon_error(tmp_path: Path) -> None:
    """`migctl validate FILES | head -1` printed "error talking to migd: Broken pipe" and exited 1."""
    files = [str(p) for p in sorted(PROFILES.glob("*.yaml"))]
    p = subprocess.Popen([*MIGCTL, "validate", *files], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before migctl writes its first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 128 + signal.SIGPIPE, err
    assert "error" not in err and "Traceback" not in err, err


def test_an_unknown_fleet_is_invalid_input(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "dgx-a100")
    r = subprocess.run([*MIGCTL, "--sim", "dgx-a1000", "--sim-state", str(m.state), "status"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid choice: 'dgx-a1000'" in r.stderr, r
    r = subprocess.run([*MIGCTL, "status", "--sim", "dgx-a100", "--sim-state", str(m.state)],
                       capture_output=True, text=True, timeout=60)  # global options after the command work too
    assert r.returncode == 0 and r.stdout.startswith("status: 8 GPU(s)"), r


@pytest.mark.parametrize("args", [("status",), ("status", "--mine")])  # (docs/users.md: --mine's exit 4)
def test_no_driver_says_so_and_mentions_the_simulator(args: tuple[str, ...]) -> None:
    import ctypes.util
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver")
    r = subprocess.run([*MIGCTL, *args], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("MIGD_")})
    assert r.returncode == 4, r
    assert r.stderr.startswith("hardware error: no NVIDIA driver found") and "--sim dgx-a100" in r.stderr, r.stderr


def test_reload_says_whether_it_was_accepted(migd: MigdProcess) -> None:
    """It exited 0 when the reload was rejected."""
    _day(migd)
    ok = migctl(migd, "reload")
    assert ok.returncode == 0 and ok.stdout.startswith("reloaded: "), ok
    migd.config.write_text(migd.config.read_text().replace("on_busy: wait", "on_busy: sometimes"))
    bad = migctl(migd, "reload")
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert bad.stderr.startswith("error: reload rejected, migd keeps its running configuration: ") and \
        "on_busy" in bad.stderr, bad.stderr
    assert _daemon(migd)["last_reload_error"] is not None


def test_clear_fault_refuses_a_gpu_that_does_not_exist(migd: MigdProcess) -> None:
    _day(migd)
    r = migctl(migd, "clear-fault", "9")
    assert r.returncode == 2 and "no GPU '9' on this node (it has GPU 0-7 (A100-SXM4-80GB))" in r.stderr, r
    assert "Traceback" not in migd.log.read_text()


def test_status_tells_of_an_interrupted_apply_and_recover_settles_it(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    before = m.layout()
    world.crash_after_mutations(StateStore(m.state), 5)
    p = subprocess.run([*MIGCTL, "--sim", m.fleet, "--sim-state", str(m.state),
                        "--state-dir", str(m.state_dir), "apply", str(PROFILES / "night.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -9
    r = m("status")
    first = r.out.splitlines()[1]  # (after the summary)
    assert first.startswith("an interrupted apply of night (pid "), first
    assert "left GPU 0 unfinished: `migctl recover`" in first, first
    doc = m("status", "-o", "json").json()["journal"]
    assert doc["profile"] == "night" and doc["unfinished_gpus"] == [0] and doc["running"] is False, doc
    r = m("recover")
    assert r.code == 0 and r.out == "restored GPU 0 to the layout before the interrupted apply\n" and r.err == "", r
    assert m.layout() == before and m("status", "-o", "json").json()["journal"] is None


def test_recover_of_a_journal_whose_gpus_all_settled_says_one_thing(tmp_path: Path) -> None:
    """After a double Ctrl-C it said "found an unfinished apply ... restoring", then "no interrupted apply"."""
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    journal = Journal(m.state_dir / "journal.json")
    journal.begin("night", {"GPU-x": {"index": 0, "status": "rolled_back", "done": 3, "ops": 9,
                                      "before": {"mig": True, "instances": []}, "owners_before": {}}})
    r = subprocess.run([*MIGCTL, "--sim", m.fleet, "--sim-state", str(m.state),
                        "--state-dir", str(m.state_dir), "recover"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "no interrupted apply to recover\n", ""), r
    assert not journal.exists()


def _migd_run(migd: MigdProcess, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--sim",
                           migd.fleet, "--sim-state", str(migd.migctl.state), "--state-dir",
                           str(migd.migctl.state_dir), *extra], capture_output=True, text=True, timeout=60)


def test_a_second_migd_says_not_starting_once(migd: MigdProcess) -> None:
    _day(migd)
    p = _migd_run(migd, "--metrics-listen", "127.0.0.1:0")
    assert p.returncode == 2 and p.stderr.count("not starting") == 1, p.stderr


def test_check_prints_the_error_alone(migd: MigdProcess) -> None:
    migd.config.write_text(migd.config.read_text().replace("on_busy: wait", "on_busy: sometimes"))
    p = _migd_run(migd, "--check")
    assert p.returncode == 2 and p.stdout == "", p
    line, = p.stderr.splitlines()
    assert line.startswith(f"{migd.config}:") and "on_busy" in line and "CRITICAL" not in line, line


def test_the_demo_starts_fresh_with_fresh(migd: MigdProcess) -> None:
    """A manual apply kept from an earlier run stopped the README's demo from reaching night at 19:00."""
    _day(migd)
    assert migctl(migd, "apply", str(PROFILES / "balanced.yaml")).returncode == 0
    assert migd.stop() == 0
    migd.start(now="2026-11-23T18:59:59")  # without --fresh the kept apply holds across the restart
    migd.wait_ready()
    assert _daemon(migd)["active"]["reason"] == "manual"
    assert migd.stop() == 0
    log = migd.log.read_text()
    assert f"migd's state dir {migd.migctl.state_dir} (--fresh starts both anew)" in log
    migd.start(now="2026-11-23T18:59:59", extra=("--fresh",))
    migd.wait_ready()
    doc = _daemon(migd)
    assert doc["override"] is None and doc["active"]["reason"] == "schedule", doc["active"]
    migd.wait_until(lambda: _daemon(migd)["applied_profile"] == "night", timeout=30)
    assert migd.assert_profile("night")


@pytest.mark.parametrize("given", ["a state dir holding other files", "a sim state that is not one"])
def test_fresh_removes_only_what_migd_wrote(tmp_path: Path, given: str) -> None:
    """``--fresh --state-dir /tmp`` removed every file in /tmp (shutil.rmtree of whatever was named), and
    ``--sim-state`` naming a configuration file replaced it.  Each is now refused in one line, exit 2, and
    nothing is removed."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep")
    (victim / "control.sock").write_text("not a socket")  # (the socket's claim removed any file there first)
    (victim / "journal.json").write_text("{}")  # (migd's own: removed only when the rest is migd's too)
    conf = tmp_path / "important.conf"
    conf.write_text("not a sim state\n")
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(f"profiles_dir: {PROFILES}\nschedule:\n  - {{profile: day, at: '08:30'}}\n")
    where = (["--state-dir", str(victim), "--sim-state", str(tmp_path / "s.json")] if given.startswith("a state dir")
             else ["--state-dir", str(tmp_path / "empty"), "--sim-state", str(conf)])
    p = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(cfg), "--sim", "dgx-a100", "--fresh",
                        "--metrics-listen", "127.0.0.1:0", *where], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p
    if given.startswith("a state dir"):
        assert (f"not starting: {victim}: --fresh removes only migd's own state, and this directory holds 2 other "
                "entries (precious.txt, sub): name a state dir of migd's alone") in p.stderr, p.stderr
        assert sorted(x.name for x in victim.iterdir()) == ["control.sock", "journal.json", "precious.txt", "sub"]
    else:
        assert f"not starting: {conf}: --fresh replaces only a simulator's state: " in p.stderr, p.stderr
        assert conf.read_text() == "not a sim state\n"
    assert "Traceback" not in p.stderr


def test_the_address_metrics_are_served_on_is_said(migd: MigdProcess) -> None:
    """``--metrics-listen 127.0.0.1:0`` bound a port nobody could find: the log now names it."""
    migd.start(now="2026-11-23T10:00:00", extra=("--metrics-listen", "127.0.0.1:0"))
    migd.wait_ready()
    m = re.search(r"serving /metrics, /healthz and the page on 127\.0\.0\.1:(\d+)", migd.log.read_text())
    assert m is not None and m[1] != "0", migd.log.read_text()[-2000:]
    with urllib.request.urlopen(f"http://127.0.0.1:{m[1]}/healthz", timeout=10) as r:
        assert r.status in (200, 503)


def test_fresh_with_the_sim_state_in_its_own_state_dir_starts(tmp_path: Path) -> None:
    """``--sim-state D/node.json --state-dir D``: the simulator's own file and its lock are not strangers."""
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(f"profiles_dir: {PROFILES}\nschedule:\n  - {{profile: day, at: '08:30'}}\n")
    argv = [sys.executable, "-m", "migd.daemon.main", "--config", str(cfg), "--sim", "single-a100", "--fresh",
            "--metrics-listen", "127.0.0.1:0", "--sim-state", str(d / "node.json"), "--state-dir", str(d)]
    for _ in range(2):  # (the second start finds the first one's files)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 30
            while not (d / "control.sock").exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None and (d / "control.sock").exists(), proc.communicate(timeout=10)[0]
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_a_file_where_the_control_socket_goes_is_never_removed(migd: MigdProcess) -> None:
    """A stale socket is cleared at start; any other file there was removed too, whoever's it was."""
    sock = migd.tmp / "file.sock"
    sock.write_text("someone's")
    p = _migd_run(migd, "--control-socket", str(sock), "--metrics-listen", "127.0.0.1:0")
    assert p.returncode == 2 and sock.read_text() == "someone's", p
    assert f"not starting: {sock}: is not a socket" in p.stderr, p.stderr


def test_metrics_answer_while_a_slow_apply_runs(migd: MigdProcess) -> None:
    """docs/metrics.md: a scrape never waits for an apply.  The fault marks' one lock was held through
    each GPU's change and read by every scrape: during a slow apply /metrics, /healthz and the page gave no
    answer for a minute (Prometheus would have called migd down)."""
    _day(migd)
    from migd.sim import world
    from migd.sim.state import StateStore
    store = StateStore(migd.migctl.state)
    world.set_mutation_delay(store, 0.25)  # ~4 s per GPU's change, 8 GPUs
    apply = subprocess.Popen([*MIGCTL, "--sim", migd.fleet, "--sim-state", str(migd.migctl.state), "--state-dir",
                              str(migd.migctl.state_dir), "apply", str(PROFILES / "night.yaml")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # (the apply is under way: 8 GPUs of about 4 s each)
        for _ in range(5):
            started = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/metrics", timeout=10) as r:
                assert r.status == 200 and b"migd_build_info" in r.read()
            assert time.monotonic() - started < 3, time.monotonic() - started
            time.sleep(0.5)
        assert apply.poll() is None  # (the apply was still running through every scrape)
        world.set_mutation_delay(store, 0.0)
    finally:
        out, err = apply.communicate(timeout=120)
    assert apply.returncode == 0, (out, err)


def test_fresh_is_refused_on_real_gpus(migd: MigdProcess) -> None:
    p = subprocess.run([sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--fresh",
                        "--state-dir", str(migd.tmp / "state")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--fresh" in p.stderr and "only with --sim" in p.stderr, p.stderr


@pytest.mark.parametrize("instances, message", [
    (["{profile: 1g, count: 1000}"], "gpus[0].instances[0].count: must be at most 7, not 1000"),
    (["{profile: 3g, count: 3}"], "3 x 3g.40gb exceed the 2 instance(s) A100-SXM4-80GB allows"),
    (["{profile: 4g}", "{profile: 3g, count: 2}"], "4g.40gb+2x3g.40gb needs 12 memory slices, A100-SXM4-80GB has 8"),
])
def test_the_readmes_example_errors_are_the_real_ones(tmp_path: Path, instances: list[str], message: str) -> None:
    """The documentation quoted "needs 9 memory slices" where migd says 12, and "at most 8" for a count that
    then failed at 8 ("has 7"): the limit said is the one that holds for the GPUs selected."""
    path = tmp_path / "p.yaml"
    text = PROFILE.format(select="select: all").replace("      - {profile: 7g, count: 1}\n", "")
    path.write_text(text + "".join(f"      - {i}\n" for i in instances))
    r = Migctl(tmp_path, "dgx-a100")("plan", str(path))
    assert r.code == 2 and message in r.err, r.err
    docs = [PROFILES.parent / "README.md", *sorted((PROFILES.parent / "docs").glob("*.md"))]
    assert any(message in d.read_text() for d in docs), message


def test_isolation_names_the_profile_it_was_given(tmp_path: Path) -> None:
    """It said "not in the active profile" when the profile given simply was not active."""
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    r = m("isolation", "--profile", str(PROFILES / "night.yaml"))
    assert "is not in profile night" in r.out and "from profile night does not exist" in r.out, r.out
    assert "active profile" not in r.out


def test_the_log_says_when_mig_mode_is_enabled(migd: MigdProcess) -> None:
    _day(migd)  # the fleet starts with MIG off; the start-up apply enables it
    log = migd.log.read_text()
    assert "GPU 0: MIG mode enabled" in log and "GPU 7: MIG mode enabled" in log, log[-2000:]


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"]])
def test_the_fake_nvidia_smi_answers_without_arguments_and_for_help(tmp_path: Path, args: list[str]) -> None:
    m = Migctl(tmp_path, "single-a100")
    assert m("status").code == 0  # creates the simulated node
    r = subprocess.run([sys.executable, "-m", "migd.sim.smi", "--sim-state", str(m.state), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r
    if args:
        assert r.stdout.startswith("NVIDIA System Management Interface -- v580.105.08\n") and "--list-gpus" in r.stdout
    else:  # the GPU table (test_sim_clients checks its layout)
        assert "|   0  NVIDIA A100-SXM4-80GB          On  |" in r.stdout, r.stdout


def test_a_client_that_only_closes_its_write_side_does_not_cancel(migd: MigdProcess) -> None:
    """Only migctl's request (withdraw_on_hangup) is withdrawn by a hang-up: a script that sends the
    request and closes its end for writing, as `nc -U` does, gets its apply done."""
    _day(migd)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(migd.socket_path))
        s.sendall(json.dumps({"cmd": "apply", "file": str(PROFILES / "night.yaml"),
                                "text": (PROFILES / "night.yaml").read_text()}).encode() + b"\n")
        s.shutdown(socket.SHUT_WR)
        reply = json.loads(s.makefile("rb").readline())
    assert reply["ok"] and reply["result"]["results"][0]["status"] == "applied", reply
    assert migd.assert_profile("night") and _daemon(migd)["override"]["profile"] == "night"


def test_status_names_the_mode_after_a_reset_for_what_it_is(tmp_path: Path) -> None:
    """``mig.pending: true`` read as "a change is pending"; ``after_reset`` says what it is."""
    m = Migctl(tmp_path, "a100-vm")  # a pass-through VM: an Ampere mode change waits for a reset
    assert m("status").code == 0
    r = subprocess.run([sys.executable, "-m", "migd.sim.smi", "--sim-state", str(m.state), "-mig", "1", "-i", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    mig = m("status", "-o", "json").json()["gpus"][0]["mig"]
    assert mig == {"current": False, "pending": True, "after_reset": True}, mig
    assert m("status").out.splitlines()[1].endswith("MIG disabled (enabled after the next reset)")


def _minutes_ahead(migd: MigdProcess, minutes: int) -> datetime:
    """migd's clock (``--now``, ``--time-scale``) ``minutes`` ahead of now, on a whole minute, in KST."""
    clock = migd.daemon_doc()["clock"]
    now = datetime.fromisoformat(clock["at"]) + timedelta(seconds=(time.time() - clock["real"]) * clock["scale"])
    return (now + timedelta(minutes=minutes + 1)).astimezone(ZoneInfo("Asia/Seoul")).replace(second=0, microsecond=0)


def test_a_reload_that_adds_an_earlier_transition_ends_a_manual_hold_then(migd: MigdProcess) -> None:
    """The hold lasts until the next transition of the schedule as it is now: a SIGHUP that adds an
    earlier one used to show it as next while the hold stayed until 19:00."""
    migd.start(now="2026-11-23T10:00:00", time_scale=60)  # 10:00 KST Monday: day; 60x: a minute a second
    migd.wait_ready()
    assert migctl(migd, "--control-socket", str(migd.socket_path), "apply",
                  str(PROFILES / "night.yaml")).returncode == 0
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["active"]["until"] == "2026-11-23T10:00:00+00:00"  # 19:00 KST
    # Counted from migd's clock as it reads now, not from --now: on a loaded machine the start and the
    # apply took three seconds (three minutes on this clock), and a 10:03 transition had already passed.
    at = _minutes_ahead(migd, 15)
    until = at.astimezone(timezone.utc).isoformat()
    text = migd.config.read_text()
    migd.config.write_text(text.replace('  - {profile: day,   at: "08:30", days: mon-fri}',
                                        '  - {profile: day,   at: "08:30", days: mon-fri}\n'
                                        f'  - {{profile: day,   at: "{at:%H:%M}", days: mon-fri}}'))
    migd.signal(signal.SIGHUP)
    migd.wait_until(lambda: migd.control({"cmd": "status"})["daemon"]["active"]["until"] == until)
    migd.wait_until(lambda: migd.control({"cmd": "status"})["daemon"]["active"]["reason"] == "schedule", 60)
    migd.wait_until(lambda: migd.assert_profile("day"), 30)
    assert not (migd.migctl.state_dir / "override.json").exists()
    assert f"now holds until {until} (the schedule changed)" in migd.log.read_text()


def test_migd_applies_a_profile_from_a_home_it_cannot_see(migd: MigdProcess, tmp_path: Path) -> None:
    """The shipped unit has ProtectHome=yes and PrivateTmp=yes: migd cannot open ``~/night.yaml``.  migctl
    reads the file (it runs as the user) and sends its text; migd never opens a user's path."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    home = tmp_path / "home"
    home.mkdir()
    profile = home / "night.yaml"
    profile.write_text((PROFILES / "night.yaml").read_text())
    profile.chmod(0o644)
    hide = f"mount -t tmpfs -o size=1m tmpfs {home} && exec \"$@\""  # what ProtectHome does to /home
    migd.start(now="2026-11-23T10:00:00", wrap=("unshare", "--mount", "--propagation", "private", "sh", "-c",
                                                hide, "sh"))
    migd.wait_ready()
    r = migctl(migd, "--control-socket", str(migd.socket_path), "apply", str(profile))
    assert r.returncode == 0 and "(by migd)" in r.stdout, r
    assert migd.assert_profile("night")
    profile.chmod(0o666)  # StrictModes is migctl's now, as root: a profile others can rewrite is not sent
    r = migctl(migd, "--control-socket", str(migd.socket_path), "apply", str(profile))
    assert r.returncode == 2 and "profile is writable by group or others" in r.stderr, r
    sent = {"cmd": "apply", "file": str(profile)}  # a client that sends only the path: refused, not opened
    reply = migd.control(sent)
    assert reply["exit"] == 2 and "carries no profile text" in reply["error"], reply
