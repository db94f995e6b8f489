"""The daemon's decision path in-process, where every NVML call can be counted.

A scheduled transition must cost what the same change costs through ``migctl apply``: one
reading and plan of each GPU, the operations, one read-back that also feeds the isolation
audit; no second plan, no second audit (issue: 3 plans and 2 audits, 2.7x migctl's calls).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from migd.api.daemon import DaemonDoc, Outcome, Progress
from migd.config.migdyaml import load_config
from migd.ctl.daemon_table import daemon_table
from migd.daemon.clock import Clock
from migd.daemon.service import Daemon, ManualApply
from migd.hardware.ports import read_state
from migd.isolation.xids import FaultMark
from migd.profiles.loader import load_profile
from migd.sim.backend import sim_backend
from migd.sim.library import loaded
from migd.wire import from_json
from tests.helpers import PROFILES, Migctl

pytestmark = pytest.mark.integration  # seconds each, in-process

FLEET = "dgx-h100"
CONFIG = """\
timezone: Asia/Seoul
profiles_dir: profiles
schedule:
  - {profile: day,   at: "08:30", days: mon-fri}
  - {profile: night, at: "19:00", days: mon-fri}
metrics: {enabled: false}
"""
NIGHT = datetime.fromisoformat("2026-11-23T19:00:05+09:00")  # Monday, just after the night transition


def calls() -> int:
    lib = loaded()
    assert lib is not None
    return sum(lib.calls.values())


def in_day_layout(tmp: Path) -> Migctl:
    m = Migctl(tmp, FLEET)
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    return m


def migctl_cost(tmp: Path, profile: str) -> int:
    """NVML calls of ``migctl apply`` from the day layout (the simulated library is one per process,
    bound to one node at a time: measure before the daemon's node is opened)."""
    by_hand = in_day_layout(tmp)
    before = calls()
    r = by_hand("apply", str(PROFILES / profile))
    assert r.code == 0, r.err
    return calls() - before


@pytest.fixture
def migctl_night(tmp_path: Path) -> int:
    return migctl_cost(tmp_path / "migctl", "night.yaml")


@pytest.fixture
def daemon(tmp_path: Path, migctl_night: int) -> Iterator[Daemon]:
    m = in_day_layout(tmp_path / "daemon")
    (tmp_path / "profiles").mkdir()
    for f in PROFILES.glob("*.yaml"):
        shutil.copy(f, tmp_path / "profiles" / f.name)
        os.chmod(tmp_path / "profiles" / f.name, 0o644)
    (tmp_path / "migd.yaml").write_text(CONFIG)
    os.chmod(tmp_path / "migd.yaml", 0o644)
    backend = sim_backend(m.state, FLEET)
    try:
        yield Daemon(load_config(tmp_path / "migd.yaml"), backend, m.state_dir, Clock(NIGHT))
    finally:
        backend.close()


def test_a_scheduled_transition_costs_what_migctl_costs(daemon: Daemon, migctl_night: int) -> None:
    migctl_calls = migctl_night
    before = calls()
    daemon.reconcile("transition")
    daemon_calls = calls() - before
    assert daemon.status.applied_profile == "night" and daemon.status.last_apply is not None
    assert daemon.status.last_apply.result is Outcome.SUCCESS
    assert all(g.progress is Progress.CONVERGED for g in daemon.status.gpus.values())
    print(f"NVML calls for day -> night on 8 H100: migctl apply {migctl_calls}, migd transition {daemon_calls}")
    assert daemon_calls <= 1.1 * migctl_calls, (daemon_calls, migctl_calls)

    before = calls()  # the next pass finds nothing to do: one reading, no apply, no extra audit
    daemon.reconcile("reconcile")
    assert calls() - before < 0.5 * migctl_calls
    assert daemon.status.apply_count == {Outcome.SUCCESS: 1}


def test_each_gpu_is_read_twice_per_transition(daemon: Daemon) -> None:
    """Once to plan, once to verify; the audit uses the read-back (the old loop read each GPU's
    instances six times: three plans, two audits and the verify)."""
    lib = loaded()
    assert lib is not None
    before = lib.calls.copy()
    daemon.reconcile("transition")
    spent = lib.calls - before
    before = lib.calls.copy()
    for g in daemon.backend.list_gpus():
        read_state(daemon.backend, g)
    one_reading = lib.calls - before

    def listings(c: Counter[str]) -> int:
        return sum(n for fn, n in c.items() if fn.startswith("nvmlDeviceGetGpuInstances"))
    assert listings(spent) == 2 * listings(one_reading) > 0, spent
    assert daemon.audit_findings == [] and daemon.status.applied_profile == "night"


def test_a_manual_apply_with_nothing_to_change_says_so(daemon: Daemon, migctl_night: int) -> None:
    daemon.reconcile("transition")
    before = calls()
    result = daemon.manual_apply(load_profile(PROFILES / "night.yaml"), ManualApply())
    assert result.ok and not result.changed
    assert daemon.status.last_apply is not None and daemon.status.last_apply.result is Outcome.UNCHANGED
    assert daemon.status.override is not None and daemon.status.override.profile.name == "night"
    assert calls() - before < 0.5 * migctl_night  # one reading of each GPU, no operations


def test_a_faulted_gpu_does_not_hold_back_the_others(daemon: Daemon) -> None:
    gpus = daemon.backend.list_gpus()
    daemon.status.unhealthy.mark(gpus[0].uuid, FaultMark(79, time.time()))  # GPU fell off the bus
    daemon.reconcile("transition")
    st = daemon.status
    assert st.gpus[0].progress is Progress.FAULTED and "Xid 79" in st.gpus[0].reason
    assert all(st.gpus[g.index].progress is Progress.CONVERGED for g in gpus[1:])
    assert st.last_apply is not None and st.last_apply.result is Outcome.BLOCKED
    assert st.applied_profile is None  # not every GPU holds the profile
    doc = st.to_json()
    assert doc["gpus"]["0"]["state"] == "faulted" and doc["gpus"]["1"]["state"] == "converged"
    st.unhealthy.clear(gpus[0].uuid)  # the operator cleared the mark
    daemon.reconcile("reconcile")
    assert all(g.progress is Progress.CONVERGED for g in st.gpus.values()) and st.applied_profile == "night"


def test_a_faulted_gpu_left_as_it_is_is_not_drift_nor_another_apply_each_pass(
        daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    """Day holds; GPU 0 falls off the bus; night comes.  The passes after it leave GPU 0 as it is, as a
    fault mark asks: none says it is drift being corrected, none counts another blocked apply, and
    ``migctl daemon`` names GPU 0 as not as night asks (faulted) instead of every GPU as night asks.
    Once the mark is cleared, night's change of GPU 0 is migd's own, not drift either."""
    daemon.clock = Clock(datetime.fromisoformat("2026-11-23T12:00:00+09:00"))
    daemon.reconcile("start")
    assert daemon.status.applied_profile == "day"
    gpus = daemon.backend.list_gpus()
    daemon.status.unhealthy.mark(gpus[0].uuid, FaultMark(79, time.time()))
    daemon.clock = Clock(NIGHT)
    daemon.reconcile("transition")
    st = daemon.status
    blocked = st.apply_count[Outcome.BLOCKED]
    with caplog.at_level("INFO", logger="migd"):
        for _ in range(3):
            daemon.reconcile("reconcile")
    assert st.apply_count[Outcome.BLOCKED] == blocked and not [r for r in caplog.records if "drift" in r.message], \
        [r.message for r in caplog.records]
    assert st.gpus[0].progress is Progress.FAULTED and st.drifted == [0]
    asked = daemon_table(from_json(DaemonDoc, st.to_json())).splitlines()
    assert "applied profile: day; not yet as night asks: GPU 0 faulted" in asked, asked
    caplog.clear()
    st.unhealthy.clear(gpus[0].uuid)
    with caplog.at_level("INFO", logger="migd"):
        daemon.reconcile("reconcile")
    assert st.applied_profile == "night" and st.drifted == []
    assert not [r for r in caplog.records if "drift" in r.message], [r.message for r in caplog.records]


def test_a_transition_a_reconcile_pass_finds_first_is_a_transition_not_drift(
        daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    """19:00 has passed and the reconcile timer wakes migd before the schedule's own trigger does (a fast
    clock, a busy machine): the new profile's change is the schedule's, said and counted as a transition,
    not logged as drift being corrected."""
    daemon.clock = Clock(datetime.fromisoformat("2026-11-23T12:00:00+09:00"))
    daemon.reconcile("start")
    assert daemon.status.applied_profile == "day"
    daemon.clock = Clock(NIGHT)
    with caplog.at_level("INFO", logger="migd"):
        daemon.reconcile("reconcile")
    said = [r.message for r in caplog.records]
    assert daemon.status.applied_profile == "night" and not [m for m in said if "drift" in m], said
    assert daemon.status.last_apply is not None and daemon.status.last_apply.trigger == "transition"
    assert any(m.startswith("applied profile night (transition)") for m in said), said


def test_a_lost_gpu_does_not_hold_back_the_others(daemon: Daemon) -> None:
    """NVML answers GPU_IS_LOST for one GPU: the other seven switch, status says which is lost."""
    from migd.sim import world
    from migd.sim.state import StateStore

    lib = loaded()
    assert lib is not None and lib.store.path is not None
    store = StateStore(lib.store.path)
    uuid = daemon.backend.gpu(5).uuid
    daemon.clock = Clock(datetime.fromisoformat("2026-11-23T12:00:00+09:00"))
    daemon.reconcile("start")  # day holds: every GPU converged, UUIDs known
    assert daemon.status.applied_profile == "day"
    daemon.clock = Clock(NIGHT)
    world.set_lost(store, 5)
    daemon.reconcile("transition")
    st = daemon.status
    assert st.gpus[5].progress is Progress.LOST and "GPU_IS_LOST" in st.gpus[5].reason.upper().replace(" ", "_")
    assert st.gpus[5].uuid == uuid  # as last known
    assert sum(g.progress is Progress.CONVERGED for g in st.gpus.values()) == 7
    assert st.applied_profile == "day" and st.to_json()["gpus"]["5"]["state"] == "lost"  # night is not applied


def test_status_shows_the_new_schedule_when_reload_says_reloaded(tmp_path: Path, daemon: Daemon) -> None:
    """"configuration reloaded" is a promise about what status shows from then on, not after the
    loop's next pass (CI caught the old next transition read right after the notification)."""
    daemon.reconcile("transition")
    assert daemon.status.next_transition is not None
    assert daemon.status.next_transition[1] == "day"  # Tuesday 08:30
    cfg = tmp_path / "migd.yaml"
    cfg.write_text(CONFIG.replace('"08:30"', '"07:45"'))
    daemon._reload_config = lambda: load_config(cfg)
    assert daemon.reload().error is None
    assert daemon.status.next_transition is not None
    when, name = daemon.status.next_transition
    assert name == "day" and when == datetime.fromisoformat("2026-11-24T07:45:00+09:00")
