"""The real migd process against the simulator: start-up profile, transitions, drift, signals, sd_notify."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from migd import __version__, paths
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES, migctl_as

pytestmark = pytest.mark.integration  # real migd daemons


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path)
    yield m
    m.close()


# (start time in Asia/Seoul, profile that must be active): both sides of each transition
SIDES = [
    ("2026-11-23T08:29:30", "night-two"),  # Monday before 08:30: Saturday 00:00's profile still holds
    ("2026-11-23T08:30:30", "day"),
    ("2026-11-23T18:59:30", "day"),
    ("2026-11-23T19:00:30", "night"),
    ("2026-11-27T23:59:30", "night"),  # Friday night
    ("2026-11-28T00:00:30", "night-two"),  # Saturday 00:00
]


@pytest.mark.parametrize("now,expected", SIDES)
def test_profile_at_start(migd: MigdProcess, now: str, expected: str) -> None:
    migd.start(now=now)
    ready = migd.wait_ready()
    assert f"STATUS=profile {expected}\n" in ready
    assert migd.assert_profile(expected)
    status = migd.control({"cmd": "status"})["daemon"]
    assert status["desired_profile"] == status["applied_profile"] == expected
    assert migd.stop() == 0
    migd.wait_for(lambda m: "STOPPING=1" in m)


def test_day_night_day_cycle(migd: MigdProcess) -> None:
    migd.write_config(reconcile_interval="1h")
    # Monday 18:50 in Seoul at 20000x: 19:00 comes after 30 ms, Tuesday 08:30 after ~2.5 s
    migd.start(now="2026-11-23T18:50:00", time_scale=20000)
    assert "profile day" in migd.wait_ready()
    migd.wait_for(lambda m: m == "STATUS=profile night applied", timeout=20)
    migd.wait_for(lambda m: m == "STATUS=profile day applied", timeout=20)
    assert migd.stop() == 0
    applied = [line.split("applied profile ")[1].split(" ")[0] for line in migd.log.read_text().splitlines()
               if "applied profile" in line]
    # start, Monday 19:00, Tuesday 08:30 (and Tuesday 19:00 if the fast clock got there first): each once
    assert applied[:3] == ["day", "night", "day"], applied
    assert migd.assert_profile(applied[-1])


def test_drift_is_corrected(migd: MigdProcess) -> None:
    migd.write_config(reconcile_interval="1s")
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    def corrections() -> int:
        return int(migd.control({"cmd": "status"})["daemon"]["apply_count"].get("success", 0))
    before = corrections()
    intruder = sim_backend(migd.migctl.state)
    try:
        gi = intruder.list_gpu_instances(0)[0]
        intruder.destroy_compute_instance(0, gi.id, gi.compute_instances[0].id)
        intruder.destroy_gpu_instance(0, gi.id)
    finally:
        intruder.close()
    # The MIG-config-change event makes migd correct it at once (often before a migctl could look):
    # an apply happened, and the layout is the profile's again.
    migd.wait_until(lambda: corrections() > before and migd.assert_profile("day"), timeout=15)
    # and after a GPU reset behind migd's back (an admin's forced reset: all instances lost)
    r = migd.migctl("status", "-o", "json").json()
    assert r["gpus"][0]["mig"]["current"]
    world.reset_gpu(StateStore(migd.migctl.state), 0, despite_clients=True)
    migd.wait_until(lambda: migd.assert_profile("day"), timeout=15)


def test_drift_reported_only(migd: MigdProcess) -> None:
    migd.write_config(reconcile_interval="1s", reconcile="report")
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    intruder = sim_backend(migd.migctl.state)
    gi = intruder.list_gpu_instances(0)[-1]
    intruder.destroy_compute_instance(0, gi.id, gi.compute_instances[0].id)
    intruder.close()
    migd.wait_until(lambda: migd.control({"cmd": "status"})["daemon"]["drift_gpus"] == [0], timeout=15)
    assert not migd.assert_profile("day")
    assert "not corrected" in migd.log.read_text()


def test_sighup_with_bad_config_keeps_the_old_one(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    good = migd.config.read_text()
    migd.config.write_text(good.replace("profile: night,", "profile: nightt,"))
    migd.signal(signal.SIGHUP)
    migd.wait_for(lambda m: m.startswith("RELOADING=1\nMONOTONIC_USEC="))
    msg = migd.wait_for(lambda m: "reload rejected" in m)
    assert "no profile named 'nightt'" in msg and "migd.yaml:" in msg
    assert migd.proc is not None and migd.proc.poll() is None
    st = migd.control({"cmd": "status"})["daemon"]
    assert st["last_reload_error"] and st["desired_profile"] == "day"
    migd.config.write_text(good.replace('at: "19:00"', 'at: "20:00"'))
    migd.signal(signal.SIGHUP)
    migd.wait_for(lambda m: "configuration reloaded" in m)
    st = migd.control({"cmd": "status"})["daemon"]
    assert st["last_reload_error"] is None and st["next_transition"][0].startswith("2026-11-23T11:00")


def test_bad_config_stops_the_start(migd: MigdProcess) -> None:
    migd.config.write_text(migd.config.read_text().replace("timezone: Asia/Seoul", "timezone: Mars/Olympus"))
    migd.start()
    assert migd.proc is not None and migd.proc.wait(timeout=30) == 2
    assert "Mars/Olympus" in migd.log.read_text() and "migd.yaml:1:11: timezone" in migd.log.read_text()


def test_group_writable_profile_is_refused(migd: MigdProcess) -> None:
    os.chmod(migd.tmp / "profiles" / "day.yaml", 0o664)
    migd.start()
    assert migd.proc is not None and migd.proc.wait(timeout=30) == 2
    assert "writable by group or others" in migd.log.read_text()


def _slow_transition(migd: MigdProcess) -> StateStore:
    """Start at day, let night fire 2 s later with a slow simulated driver; return once it is under way."""
    migd.write_config(reconcile_interval="1h")
    migd.start(now="2026-11-23T18:59:58")
    migd.wait_ready()
    store = StateStore(migd.migctl.state)
    world.set_mutation_delay(store, 0.25)
    base = store.read().mutations
    migd.wait_until(lambda: store.read().mutations > base + 3, timeout=20)
    return store


def test_sigterm_mid_apply_leaves_a_consistent_gpu(migd: MigdProcess) -> None:
    store = _slow_transition(migd)
    assert migd.stop() == 0
    world.set_mutation_delay(store, 0)
    assert migd.assert_profile("day") or migd.assert_profile("night")
    assert not (migd.migctl.state_dir / "journal.json").exists()
    assert "cancelled" in migd.log.read_text() or "applied profile night" in migd.log.read_text()


def test_sigkill_mid_apply_is_recovered_at_next_start(migd: MigdProcess) -> None:
    store = _slow_transition(migd)
    migd.signal(signal.SIGKILL)
    assert migd.proc is not None and migd.proc.wait(timeout=10) == -9
    world.set_mutation_delay(store, 0)
    journal = migd.migctl.state_dir / "journal.json"
    assert journal.exists() and json.loads(journal.read_text())["profile"] == "night"
    assert not migd.assert_profile("day") and not migd.assert_profile("night")
    migd.start(now="2026-11-23T19:10:00")
    migd.wait_ready()
    assert migd.assert_profile("night")
    assert not journal.exists()
    assert "after an interrupted apply" in migd.log.read_text()


def test_sd_notify_protocol(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00", watchdog_usec=400_000)
    ready = migd.wait_ready()
    assert ready.splitlines()[0] == "READY=1" and f"MAINPID={migd.proc.pid}" in ready  # type: ignore[union-attr]
    t0 = time.monotonic()
    migd.wait_for(lambda m: m == "WATCHDOG=1")
    migd.wait_for(lambda m: m == "WATCHDOG=1")
    assert time.monotonic() - t0 < 3
    migd.signal(signal.SIGHUP)
    reloading = migd.wait_for(lambda m: m.startswith("RELOADING=1"))
    usec = int(reloading.split("MONOTONIC_USEC=")[1])
    assert abs(usec / 1e6 - time.clock_gettime(time.CLOCK_MONOTONIC)) < 10
    migd.wait_for(lambda m: "READY=1" in m and "reloaded" in m)
    assert migd.stop() == 0
    migd.wait_for(lambda m: m.startswith("STOPPING=1"))


def test_signal_storm_never_wedges_the_daemon(migd: MigdProcess) -> None:
    """A signal landing while the main thread holds an Event's lock must not deadlock it (seen with SIGHUP)."""
    migd.start(now="2026-11-23T10:00:00", watchdog_usec=400_000)
    migd.wait_ready()
    for _ in range(300):
        migd.signal(signal.SIGHUP)
        time.sleep(0.002)
    migd.wait_for(lambda m: "READY=1" in m and "reloaded" in m)
    migd.cursor = len(migd.messages)
    migd.wait_for(lambda m: m == "WATCHDOG=1", timeout=10)  # (the reload above shows the main loop runs)
    assert migd.control({"cmd": "status"})["ok"]
    assert migd.stop() == 0


def test_control_socket_routes_migctl_apply(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    mode = stat.S_IMODE(os.stat(migd.socket_path).st_mode)
    assert mode == 0o600
    r = migd.migctl("apply", str(PROFILES / "balanced.yaml"), "-o", "json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] and doc["profile"] == "balanced"
    st = migd.control({"cmd": "status"})["daemon"]
    assert st["override"]["profile"] == "balanced"
    assert st["override"]["until"].startswith("2026-11-23T10:00")  # 19:00 KST = 10:00 UTC
    assert migd.assert_profile("balanced")  # the reconcile loop does not undo a manual apply
    r = migd.migctl("apply", str(migd.tmp / "missing.yaml"))
    assert r.code == 2 and "cannot read file" in r.err


def test_manual_apply_keeps_its_own_content_when_the_name_is_taken(migd: MigdProcess) -> None:
    """A hand-applied file named like a configured profile holds as written, not as the config's copy."""
    migd.write_config(reconcile_interval="1s")
    migd.start(now="2026-11-23T02:00:00")  # 11:00 KST Monday: day
    migd.wait_ready()
    variant = migd.tmp / "my-night.yaml"
    variant.write_text((PROFILES / "night-two.yaml").read_text().replace("name: night-two", "name: night"))
    os.chmod(variant, 0o644)
    assert migd.migctl("apply", str(variant)).code == 0
    time.sleep(3)  # three reconcile passes
    assert migd.control({"cmd": "status"})["daemon"]["override"]["profile"] == "night"
    assert migd.assert_profile("night-two") and not migd.assert_profile("night")


def test_busy_transition_waits_then_applies(migd: MigdProcess) -> None:
    migd.write_config(reconcile_interval="1h", busy_timeout="2s")
    migd.start(now="2026-11-23T18:59:59")
    migd.wait_ready()
    migd.wait_until(lambda: migd.assert_profile("night"), timeout=15)
    store = StateStore(migd.migctl.state)
    gi = store.read().gpus[0].gis[0].id
    pid = world.start_process(store, 0, gi, 0)
    migd.stop()
    migd.start(now="2026-11-24T08:29:58")  # Tuesday: day fires in 2 s, but the 7g instance is busy
    migd.wait_ready()
    migd.wait_until(lambda: "still blocked after busy_timeout" in migd.log.read_text(), timeout=20)
    assert migd.assert_profile("night")
    world.stop_process(store, pid)
    migd.wait_until(lambda: migd.assert_profile("day"), timeout=15)


def _explode(*args: object) -> Any:
    raise RuntimeError("status exploded")


def test_control_server_always_answers(tmp_path: Path) -> None:
    """A failure inside the daemon reaches migctl as an error reply, never as a silent hang-up."""
    from migd.ctl.client import request
    from migd.daemon.server import ControlServer, Handlers
    server = ControlServer(tmp_path / "ctl.sock", Handlers(_explode, _explode, _explode, _explode, _explode, _explode,
                                                                     _explode))
    server.start()
    try:
        reply = request(server.path, {"cmd": "status"}, timeout_s=10)
        assert reply is not None and reply["ok"] is False and reply["exit"] == 1
        assert "RuntimeError: status exploded" in reply["error"]
        reply = request(server.path, {"cmd": "apply", "file": str(PROFILES / "day.yaml")}, timeout_s=10)
        assert reply is not None and reply["exit"] == 2 and "carries no profile text" in reply["error"]
        reply = request(server.path, {"cmd": "apply", "file": "mine.yaml", "text": "gpus: ["}, timeout_s=10)
        assert reply is not None and reply["exit"] == 2 and "mine.yaml:" in reply["error"] and \
            "invalid YAML" in reply["error"]
    finally:
        server.close()


def test_manual_apply_is_not_undone_and_redone(migd: MigdProcess) -> None:
    """The apply's own MIG-config-change events must not make the loop re-apply the schedule first:
    one manual change costs exactly the operations its plan names, and the log says so once."""
    migd.write_config(reconcile_interval="1s")
    migd.start(now="2026-11-23T02:00:00")
    migd.wait_ready()
    plan = migd.migctl("plan", str(PROFILES / "balanced.yaml"), "-o", "json").json()
    ops = sum(len(g["operations"]) for g in plan["gpus"])
    store = StateStore(migd.migctl.state)
    before = store.read().mutations
    assert migd.migctl("apply", str(PROFILES / "balanced.yaml")).code == 0
    time.sleep(4)  # the apply's events and several reconcile passes
    assert store.read().mutations - before == ops
    applied = [line.split("applied profile ", 1)[1].split(" in ")[0] for line in migd.log.read_text().splitlines()
               if "applied profile" in line]
    assert len(applied) == 2 and applied[0].endswith("(start)") and applied[1] == "balanced (manual)", applied
    assert migd.control({"cmd": "status"})["daemon"]["apply_count"] == {"success": 2}  # the manual one counts
    assert migd.assert_profile("balanced")


def _migd_argv(migd: MigdProcess, *extra: str) -> list[str]:
    return [sys.executable, "-m", "migd.daemon.main", "--config", str(migd.config), "--sim", migd.fleet,
            "--sim-state", str(migd.migctl.state), "--state-dir", str(migd.migctl.state_dir), *extra]


def test_a_second_migd_refuses_and_leaves_the_first_alone(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T02:00:00")
    migd.wait_ready()
    mutations = StateStore(migd.migctl.state).read().mutations
    p = subprocess.run(_migd_argv(migd, "--metrics-listen", "127.0.0.1:0"), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "another migd" in p.stderr and str(migd.socket_path) in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert migd.socket_path.exists() and migd.control({"cmd": "status"})["ok"]  # still reachable
    assert StateStore(migd.migctl.state).read().mutations == mutations  # and nothing on the GPUs moved


@pytest.mark.parametrize("extra, words", [
    (("--sim", "no-such-fleet"), "no-such-fleet"),
    (("--now", "yesterday"), "--now"),
    (("--time-scale", "0"), "--time-scale"),
    (("--metrics-listen", "{busy}"), "metrics"),
])
def test_start_up_errors_are_one_line(migd: MigdProcess, extra: tuple[str, ...], words: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = f"127.0.0.1:{busy.getsockname()[1]}"
        argv = [a.replace("{busy}", addr) for a in _migd_argv(migd, *extra)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and words in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1, p.stderr


def test_version_flags() -> None:
    for prog in ("migd.daemon.main", "migd.ctl.migctl"):
        p = subprocess.run([sys.executable, "-m", prog, "--version"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.strip().endswith(__version__), p


def _migctl(migd: MigdProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MIGCTL, "--sim", migd.fleet, "--sim-state", str(migd.migctl.state),
                           "--state-dir", str(migd.migctl.state_dir), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_apply_options_through_the_daemon(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T02:00:00")
    migd.wait_ready()
    before = migd.migctl.layout()
    balanced = str(PROFILES / "balanced.yaml")
    dry = _migctl(migd, "apply", balanced, "--dry-run")
    local = _migctl(migd, "apply", balanced, "--dry-run", "--local")
    assert dry.returncode == 0 == local.returncode, dry.stderr + local.stderr
    assert "dry run" in dry.stdout and "applied" not in dry.stdout.replace("already applied", "")
    head, rest = local.stdout.split("\n", 1)
    assert dry.stdout == f"{head} (by migd)\n{rest}"  # one renderer, whichever process applied
    assert migd.migctl.layout() == before
    r = _migctl(migd, "apply", balanced, "--hooks", str(migd.tmp / "hooks.yaml"))
    assert r.returncode == 2 and "--hooks" in r.stderr and "--force-local" in r.stderr
    # --busy-timeout reaches the daemon (its own is 30m): a busy instance blocks for one second, not half an hour
    gi = next(g for g in StateStore(migd.migctl.state).read().gpus[0].gis)
    world.start_process(StateStore(migd.migctl.state), 0, gi.id, 0)
    t0 = time.monotonic()
    r = _migctl(migd, "apply", balanced, "--on-busy", "wait", "--busy-timeout", "1s", "--sequential",
                "--lock-timeout", "5")
    assert r.returncode == 3 and time.monotonic() - t0 < 30, r.stderr
    assert migd.migctl.layout() == before


def test_daemon_status_and_reload_commands(migd: MigdProcess) -> None:
    migd.start(now="2026-11-23T10:00:00")  # 10:00 KST Monday: day
    migd.wait_ready()
    st = _migctl(migd, "daemon", "-o", "json")
    doc = json.loads(st.stdout)
    assert doc["schema"] == "migd.daemon/v1" and doc["active"]["reason"] == "schedule"
    assert doc["next"]["at"] == doc["next_transition"][0] and doc["next"]["local"].endswith("+09:00")
    assert _migctl(migd, "apply", str(PROFILES / "balanced.yaml")).returncode == 0
    raw = _migctl(migd, "daemon", "-o", "json").stdout
    assert "Profile(" not in raw  # no Python repr in the wire format
    doc = json.loads(raw)
    since = doc["active"].pop("since")
    assert doc["active"] == {"profile": "balanced", "reason": "manual", "source": str(PROFILES / "balanced.yaml"),
                             "until": doc["next"]["at"]}
    assert since.startswith("2026-11-23T01:00")  # --now is local time (Asia/Seoul)
    table = _migctl(migd, "daemon").stdout
    assert f"active profile: balanced (manual apply of {PROFILES / 'balanced.yaml'}, until" in table
    assert f"next transition: {doc['next']['profile']} at {doc['next']['local']}" in table
    assert "last apply: balanced: success" in table
    r = _migctl(migd, "reload")
    assert r.returncode == 0, r.stderr
    migd.wait_for(lambda m: "RELOADING=1" in m)
    r = _migctl(migd, "daemon", "-o", "json")
    assert json.loads(r.stdout)["last_reload_error"] is None
    migd.stop()
    r = _migctl(migd, "daemon")
    assert r.returncode == 1 and r.stderr.strip().endswith(f"no migd is listening on {migd.socket_path}")


def test_a_manual_apply_survives_a_restart_until_the_next_transition(migd: MigdProcess) -> None:
    """Kept with the profile's own text: editing the file afterwards changes nothing that was applied."""
    migd.start(now="2026-11-23T10:00:00")  # 10:00 KST Monday: day; the next transition is night at 19:00 KST
    migd.wait_ready()
    profile = migd.tmp / "mine.yaml"
    profile.write_text((PROFILES / "balanced.yaml").read_text())
    assert _migctl(migd, "apply", str(profile)).returncode == 0
    profile.write_text("garbage: [")
    assert migd.stop() == 0
    store = StateStore(migd.migctl.state)
    before = store.read().mutations
    migd.start(now="2026-11-23T12:00:00")  # 12:00 KST: the manual apply still holds
    migd.wait_ready()
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["active"]["reason"] == "manual" and doc["active"]["profile"] == "balanced", doc["active"]
    assert doc["active"]["until"] == "2026-11-23T10:00:00+00:00"
    assert store.read().mutations == before and migd.assert_profile("balanced")
    assert migd.stop() == 0
    migd.start(now="2026-11-23T19:00:30")  # 19:00:30 KST: the schedule is back (night)
    migd.wait_ready()
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["active"]["reason"] == "schedule" and doc["applied_profile"] == "night", doc
    assert not (migd.migctl.state_dir / "override.json").exists()


@pytest.fixture
def busy_at_night(tmp_path: Path) -> Iterator[tuple[MigdProcess, StateStore, int]]:
    """4 GPUs in the day layout with a process on GPU 0, migd started three seconds before the night
    transition.  The process exists before migd starts: however slow the start, it is there in time."""
    migd = MigdProcess(tmp_path, fleet="mixed", reconcile_interval="1s")
    try:
        assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
        store = StateStore(migd.migctl.state)
        pid = world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
        migd.start(now="2026-11-23T18:59:57")  # Monday, KST
        migd.wait_ready()
        yield migd, store, pid
    finally:
        migd.close()


def test_one_busy_gpu_does_not_hold_back_the_others(busy_at_night: tuple[MigdProcess, StateStore, int]) -> None:
    migd, store, pid = busy_at_night
    migd.wait_until(lambda: migd.control({"cmd": "status"})["daemon"]["desired_profile"] == "night", 30)
    migd.wait_until(lambda: [len(g) for g in migd.migctl.layout()][1:] == [1, 1, 1], 30)  # GPUs 1-3 switched
    assert len(migd.migctl.layout()[0]) > 1  # GPU 0 keeps its busy day layout
    # The layout changes on the GPUs before the daemon publishes the pass's outcome: wait for the
    # state this checks, not for time (under load the status came a moment after the layout).
    migd.wait_until(lambda: list(migd.control({"cmd": "status"})["daemon"]["blocked_gpus"]) == ["0"], 30)
    st = migd.control({"cmd": "status"})["daemon"]
    assert list(st["blocked_gpus"]) == ["0"] and str(pid) in st["blocked_gpus"]["0"]["reason"]
    with urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/metrics", timeout=10) as r:
        body = r.read().decode()
    assert [ln.split("{")[1].split("}")[0] for ln in body.splitlines()
            if ln.startswith("migd_gpu_blocked_since_timestamp_seconds{")] == ['gpu="0"']
    time.sleep(4)  # several retries: the wait is logged once, not once per retry
    waits = [ln for ln in migd.log.read_text().splitlines() if "waits for busy instances" in ln]
    assert len(waits) == 1, waits
    world.stop_process(store, pid)
    migd.wait_until(lambda: [len(g) for g in migd.migctl.layout()] == [1, 1, 1, 1], 60)
    migd.wait_until(lambda: migd.control({"cmd": "status"})["daemon"]["blocked_gpus"] == {}, 30)


def test_a_settled_layout_clears_a_stale_wait(busy_at_night: tuple[MigdProcess, StateStore, int]) -> None:
    migd = busy_at_night[0]
    migd.wait_until(lambda: migd.control({"cmd": "status"})["daemon"]["blocked_gpus"] != {}, 30)
    assert _migctl(migd, "apply", str(PROFILES / "day.yaml")).returncode == 0  # GPU 0 is already day
    st = migd.control({"cmd": "status"})["daemon"]
    assert st["blocked_gpus"] == {} and st["blocked_reason"] is None and st["active"]["reason"] == "manual"


def test_a_daemon_started_during_a_migctl_apply_waits_for_it(migd: MigdProcess) -> None:
    """It used to exit 1 (the lock was busy at its recovery step); now it waits its turn."""
    from migd.apply.lock import ApplyLock
    lock = ApplyLock(migd.migctl.state_dir / "apply.lock")
    lock.acquire()
    try:
        migd.start(now="2026-11-23T10:00:00")
        time.sleep(2)
        assert migd.proc is not None and migd.proc.poll() is None, migd.log.read_text()
    finally:
        lock.release()
    migd.wait_ready()
    migd.wait_until(lambda: migd.assert_profile("day"))


def test_a_read_only_state_dir_does_not_kill_the_daemon(tmp_path: Path) -> None:
    """Writes to the state dir fail (a full or read-only disk): the pass is refused and logged,
    the daemon lives on and succeeds once the disk is writable again."""
    from migd.config.migdyaml import load_config
    from migd.daemon.clock import Clock
    from migd.daemon.service import Daemon
    from tests.daemon_harness import CONFIG, free_port
    fs = tmp_path / "fs"
    fs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(fs)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        (tmp_path / "profiles").mkdir()
        for f in PROFILES.glob("*.yaml"):
            (tmp_path / "profiles" / f.name).write_text(f.read_text())
        cfg = tmp_path / "migd.yaml"
        cfg.write_text(CONFIG.format(on_busy="wait", busy_timeout="30m", reconcile_interval="60s",
                                     reconcile="correct", port=free_port(), sample_interval="1s"))
        backend = sim_backend(tmp_path / "sim.json", "single-a100")
        try:
            d = Daemon(load_config(cfg), backend, fs / "state", Clock(datetime.fromisoformat(
                "2026-11-23T10:00:00+09:00")))
            subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
            d.reconcile("start")  # must not raise
            assert d.status.last_apply is not None and d.status.last_apply.result.value in ("error", "rolled_back")
            subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
            d.reconcile("reconcile")
            assert d.status.applied_profile == "day"
        finally:
            backend.close()
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def test_two_thousand_idle_connections_do_not_starve_the_daemon(migd: MigdProcess) -> None:
    """Any local user can open connections to the metrics port; with 1024 descriptors (systemd's
    default) ~1,100 idle ones used to kill migd.  Now extra ones are closed and idle ones time out."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        pytest.skip(f"this test process may hold only {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2200), hard))
    migd.start(now="2026-11-23T10:00:00", nofile=1024)
    migd.wait_ready()
    held = []
    try:
        for _ in range(2000):
            try:
                held.append(socket.create_connection(("127.0.0.1", migd.port), timeout=1))
            except OSError:
                pass  # the backlog is full: that is the kernel saying no, not migd dying
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/metrics", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "metrics never answered while idle connections were held"
                time.sleep(0.2)
        assert b"migd_gpu_info" in body
        assert migd.control({"cmd": "status"})["ok"]
        assert migd.proc is not None and migd.proc.poll() is None
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert migd.stop() == 0


def test_the_watchdog_is_fed_while_a_manual_apply_waits(migd: MigdProcess) -> None:
    """The decision loop waits for the lock a manual apply holds while busy instances drain; the
    watchdog used to go unfed for the whole wait (12-21 s), and systemd would have killed migd."""
    migd.write_config(reconcile_interval="1s")  # a reconcile pass comes due during the wait
    migd.start(now="2026-11-23T10:00:00", watchdog_usec=1_000_000)
    migd.wait_ready()
    store = StateStore(migd.migctl.state)
    world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0)
    apply = subprocess.Popen([*MIGCTL, "--sim", migd.fleet, "--sim-state",
                              str(migd.migctl.state), "--state-dir", str(migd.migctl.state_dir), "apply",
                              str(PROFILES / "night.yaml"), "--on-busy", "wait", "--busy-timeout", "5s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pings: list[float] = []
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end:
        before = len(migd.messages)
        migd.poll_notify()
        pings += [time.monotonic() for m in migd.messages[before:] if m == "WATCHDOG=1"]
    out, err = apply.communicate(timeout=60)
    assert apply.returncode == 3, out + err  # still busy after 5 s: the apply waited the whole time
    gaps = [b - a for a, b in zip(pings, pings[1:], strict=False)]
    assert len(pings) >= 6 and max(gaps) < 1.0, gaps


def test_a_reload_says_which_settings_need_a_restart(migd: MigdProcess) -> None:
    """SIGHUP used to ignore a new listen address, socket or state dir without a word."""
    migd.start(now="2026-11-23T10:00:00")
    migd.wait_ready()
    migd.config.write_text(migd.config.read_text().replace(f"127.0.0.1:{migd.port}", "127.0.0.1:1"))
    migd.signal(signal.SIGHUP)
    migd.wait_for(lambda m: "READY=1" in m and "restart needed for metrics.listen" in m)
    doc = migd.control({"cmd": "status"})["daemon"]
    assert doc["restart_needed"] == ["metrics.listen"] and doc["last_reload_error"] is None
    assert "takes effect only after a restart" in migd.log.read_text()
    assert urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/healthz", timeout=5).status == 200  # still served


def test_a_state_dir_others_can_write_stops_the_start(migd: MigdProcess) -> None:
    migd.migctl.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(migd.migctl.state_dir, 0o777)
    p = subprocess.run(_migd_argv(migd), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "state dir is open to group or others (mode 0777)" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    os.chmod(migd.migctl.state_dir, 0o700)


def _as_nobody(argv: list[str]) -> tuple[int, str]:
    code, _, err = migctl_as(65534, 65534, argv)
    return code, err


def test_migctl_as_an_ordinary_user_says_so_in_one_line(migd: MigdProcess) -> None:
    """It used to end in a PermissionError traceback."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    assert migd.migctl("apply", str(PROFILES / "day.yaml")).code == 0
    os.chmod(migd.migctl.state, 0o666)  # the simulated driver is usable; the state dir stays root's
    for args in (("apply", str(PROFILES / "night.yaml"), "--local"), ("recover",)):
        code, err = _as_nobody(["--sim", migd.fleet, "--sim-state", str(migd.migctl.state), "--state-dir",
                                str(migd.migctl.state_dir), *args])
        assert code in (1, 2, 4) and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and ("not permitted" in err or "Permission denied" in err), err


def test_status_as_an_ordinary_user_is_not_a_hardware_error(migd: MigdProcess) -> None:
    """It said "hardware error ... Permission denied" and exited 4: not permitted is not a fault."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    assert migd.migctl("status").code == 0
    os.chmod(migd.migctl.state, 0o600)  # the simulated driver, as a device node this user may not open
    code, err = _as_nobody(["--sim", migd.fleet, "--sim-state", str(migd.migctl.state), "--state-dir",
                            str(migd.migctl.state_dir), "status"])
    assert code == 1 and err.startswith("not permitted: ") and "Permission denied" in err, err
    assert "hardware error" not in err and len(err.strip().splitlines()) == 1, err
    # (it said "MIG changes need root": the user is told where migd would have answered, and that none does)
    control = paths.control_socket(None, migd.fleet, str(migd.migctl.state), str(migd.migctl.state_dir))
    view = paths.status_socket(control)
    assert err.endswith(f"or asks a running migd on its read-only socket {view}, where none answers\n"), err


def test_a_control_socket_path_that_is_no_socket_is_said_with_its_path(tmp_path: Path) -> None:
    """``--control-socket`` through a regular file said ``not applied: Not a directory``, no path, for a
    command that applies nothing."""
    (tmp_path / "file").write_text("")
    sock = tmp_path / "file" / "control.sock"
    r = subprocess.run([sys.executable, "-m", "migd.ctl.migctl", "--sim", "single-a100", "--sim-state",
                        str(tmp_path / "s.json"), "--control-socket", str(sock), "daemon"],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error talking to migd: migd's socket {sock}: Not a "
                                                         "directory\n"), r
