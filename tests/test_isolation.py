"""Fault isolation on the simulator: audit findings, Xid attribution, GPU-wide fault marks, breaches."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from migd.sim import world
from migd.sim.state import SimCi, SimGi, StateStore
from tests.daemon_harness import MigdProcess
from tests.helpers import MIGCTL, PROFILES, Migctl

pytestmark = pytest.mark.integration  # real migd daemons, migd-sim


def scrape(m: MigdProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="single-h100", reconcile_interval="1h")
    m.start(now="2026-11-23T10:00:00")
    m.wait_ready()
    yield m
    m.close()


def test_clean_layout_has_no_findings(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "mixed")
    m("apply", str(PROFILES / "balanced.yaml"))
    r = m("isolation", "--profile", str(PROFILES / "balanced.yaml"), "-o", "json")
    assert r.code == 0 and r.json()["findings"] == [] and r.json()["schema"] == "migd.isolation/v1"
    assert "no findings" in m("isolation").out


def test_a_mig_parted_profile_is_audited_against_the_config_named(tmp_path: Path) -> None:
    """isolation --profile of a mig-parted file said "choose a config with --config NAME", and refused
    --config; it takes mig-parted's -c/--config as plan and assert do."""
    m = Migctl(tmp_path, "single-h100")
    parted = tmp_path / "parted.yaml"
    parted.write_text("version: v1\nmig-configs:\n  ones:\n    - devices: all\n      mig-enabled: true\n"
                      "      mig-devices: {1g.10gb: 7}\n  whole:\n    - devices: all\n      mig-enabled: true\n"
                      "      mig-devices: {7g.80gb: 1}\n")
    assert m("apply", str(parted), "-c", "ones").code == 0
    assert m("isolation", "--profile", str(parted), "-c", "ones").code == 0
    r = m("isolation", "--profile", str(parted), "--config", "whole", "-o", "json")
    assert r.code == 0 and {f["check"] for f in r.json()["findings"]} >= {"orphan"}, r.out
    r = m("isolation", "-c", "ones")
    assert r.code == 2 and r.err == "error: --config: names a config of the file --profile gives: give --profile\n"


def test_audit_finds_hand_made_overlap_and_orphans(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-a100")
    m("apply", str(PROFILES / "night-two.yaml"))
    store = StateStore(m.state)
    with store.transaction() as s:  # what no NVML call would allow: a 1g inside the 3g at 0:4
        s.gpus[0].gis.append(SimGi(id=9, serial=s.next_serial(), profile_id=19, start=1, size=1,
                                   cis=[SimCi(0, s.next_serial(), 0, 0, 1)]))
    r = m("isolation", "--profile", str(PROFILES / "night-two.yaml"), "-o", "json")
    assert r.code == 1
    checks = {(f["check"], f["severity"]) for f in r.json()["findings"]}
    assert ("overlap", "error") in checks and ("orphan", "warning") in checks
    text = m("isolation").out
    assert "share memory slices" in text
    # an orphan against the profile, and a GI without a compute instance
    with store.transaction() as s:
        s.gpus[0].gis = [g for g in s.gpus[0].gis if g.id != 9]
        s.gpus[0].gis[-1].cis = []
    r = m("isolation", "--profile", str(PROFILES / "night-two.yaml"), "-o", "json")
    checks = {f["check"] for f in r.json()["findings"]}
    assert "no_ci" in checks


def test_probe_is_skipped_without_cuda(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "single-h100")
    m("apply", str(PROFILES / "night.yaml"))
    r = m("isolation", "--probe", "-o", "json")
    assert r.json()["probe"]["status"] == "skipped" and "torch" in r.json()["probe"]["detail"]


def test_instance_scoped_xid_counts_only_that_instance(migd: MigdProcess) -> None:
    store = StateStore(migd.migctl.state)
    gis = store.read().gpus[0].gis
    for gi in gis:
        world.start_process(store, 0, gi.id, 0)
    migd.wait_until(lambda: "migd_compute_instance_processes" in scrape(migd))
    time.sleep(1.5)  # let the watch record who runs where
    world.raise_xid(store, 0, 43, gi=gis[0].id, ci=0)
    migd.wait_until(lambda: bool(_xids(migd)))
    assert _xids(migd) == {(str(gis[0].id), "43"): 1.0}
    assert _gpu_xids(migd) == {("0", "43"): 1.0}  # the GPU's count includes it, once
    iso = migd.control({"cmd": "isolation"})
    assert iso["breaches"] == [] and iso["unhealthy"] == {}
    assert {s.value for s in _samples(migd, "migd_isolation_breaches")} == {0.0}  # there from the start, at 0


def _samples(m: MigdProcess, family: str) -> list[Any]:
    return [s for fam in text_string_to_metric_families(scrape(m)) if fam.name == family for s in fam.samples
            if s.name.endswith("_total")]


def _xids(m: MigdProcess) -> dict[tuple[str, str], float]:
    """Xids counted against a GPU instance: (gi, xid) -> count, those above 0 (all start at 0)."""
    return {(s.labels["gi"], s.labels["xid"]): s.value for s in _samples(m, "migd_instance_xid_events") if s.value}


def _gpu_xids(m: MigdProcess) -> dict[tuple[str, str], float]:
    """Every Xid per GPU: (gpu, xid) -> count, those above 0."""
    return {(s.labels["gpu"], s.labels["xid"]): s.value for s in _samples(m, "migd_xid_events") if s.value}


def test_gpu_wide_xid_blocks_reconfiguration_until_cleared(migd: MigdProcess) -> None:
    store = StateStore(migd.migctl.state)
    world.raise_xid(store, 0, 79)
    migd.wait_until(lambda: bool(migd.control({"cmd": "isolation"})["unhealthy"]))
    assert ("0", "79") in _gpu_xids(migd) and not _xids(migd)  # GPU-wide: no instance is blamed
    assert 'migd_gpu_unhealthy{gpu="0"' in scrape(migd)
    r = migd.migctl("apply", str(PROFILES / "night.yaml"))
    assert r.code == 4 and "unhealthy" in r.err and "Xid 79" in r.err
    assert migd.assert_profile("day")
    r = migd.migctl("isolation")
    assert r.code == 1 and "UNHEALTHY GPU 0 (GPU-" in r.out and "`migctl clear-fault 0`" in r.out, r.out
    r = migd.migctl("clear-fault", "0")
    assert r.code == 0 and "GPU-" in r.out
    assert migd.migctl("apply", str(PROFILES / "night.yaml")).code == 0


def test_fault_leaking_into_a_neighbour_is_a_breach(migd: MigdProcess) -> None:
    store = StateStore(migd.migctl.state)
    gis = store.read().gpus[0].gis
    for gi in gis:
        world.start_process(store, 0, gi.id, 0)
    time.sleep(1.5)
    world.raise_xid(store, 0, 43, gi=gis[0].id, ci=0, leak_to=(gis[1].id,))
    migd.wait_until(lambda: bool(migd.control({"cmd": "isolation"})["breaches"]))
    (breach,) = migd.control({"cmd": "isolation"})["breaches"]
    assert f"GI {gis[1].id}" in breach and "Xid 43" in breach
    assert 'migd_isolation_breaches_total{gpu="0"' in scrape(migd)
    with urllib.request.urlopen(f"http://127.0.0.1:{migd.port}/healthz", timeout=10) as r:
        assert r.status == 200  # the daemon kept serving throughout


def test_a_lost_gpu_among_eight_blinds_nothing_else(tmp_path: Path) -> None:
    """GPU 3 falls off the bus (Xid 79, then GPU_IS_LOST): its Xid is counted and marks it, the
    other seven keep their series, an Xid on a healthy GPU is seen at once, and the daemon's
    status and metrics name the lost GPU."""
    m = MigdProcess(tmp_path, fleet="dgx-h100", reconcile_interval="2s")
    m.start(now="2026-11-23T10:00:00")
    try:
        m.wait_ready()
        m.wait_until(lambda: "migd_gpu_up{" in scrape(m))
        time.sleep(1.5)  # the watch has read every GPU once
        store = StateStore(m.migctl.state)
        uuid = store.read().gpus[3].uuid
        world.raise_xid(store, 3, 79)
        world.set_lost(store, 3)
        m.wait_until(lambda: uuid in m.control({"cmd": "isolation"})["unhealthy"])
        assert ("3", "79") in _gpu_xids(m)
        t0 = time.monotonic()
        gi = store.read().gpus[1].gis[0].id
        world.raise_xid(store, 1, 43, gi=gi, ci=0)
        m.wait_until(lambda: (str(gi), "43") in _xids(m), timeout=10)
        assert time.monotonic() - t0 < 5  # not 44 s late
        m.wait_until(lambda: 'migd_gpu_lost{gpu="3"} 1.0' in scrape(m))
        text = scrape(m)
        assert 'migd_gpu_up{gpu="3"} 0.0' in text and 'migd_gpu_up{gpu="7"} 1.0' in text
        assert sum(1 for line in text.splitlines() if line.startswith("migd_gpu_info{")) == 7
        m.wait_until(lambda: m.control({"cmd": "status"})["daemon"]["gpus"].get("3", {}).get("state") == "lost")
        assert m.proc is not None and m.proc.poll() is None
    finally:
        m.close()


def _sim(m: MigdProcess, *args: str) -> str:
    """``migd-sim ARGS`` on the node migd runs over, as an operator types it: its output line."""
    r = subprocess.run([sys.executable, "-m", "migd.sim.cli", *args, "--sim-state", str(m.migctl.state)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    return r.stdout.strip()


def test_a_fatal_fault_wins_over_a_manual_apply_waiting_for_busy_work(migd: MigdProcess) -> None:
    """A manual apply waited inside migd for a busy instance; an application's Xid on another instance
    of the GPU, then Xid 79 (fallen off the bus, which ends every process on it, the awaited one too).
    The apply held the hardware lock through its wait, so the fault watch sat behind it (checking the
    neighbours of the first Xid) and read Xid 79 only after the apply had reconfigured the GPU.  The wait
    lets go of the lock, and the apply reads the marks once the watch has caught up, before its first
    change: GPU 0 is refused (exit 4, the Xid named) and left as it was."""
    store = StateStore(migd.migctl.state)
    busy, other = (g.id for g in store.read().gpus[0].gis[:2])
    pid = int(_sim(migd, "process", "start", "--gpu", "0", "--gi", str(busy)))
    before = store.read().mutations
    apply = subprocess.Popen([*MIGCTL, "--sim", migd.fleet, "--sim-state",
                              str(migd.migctl.state), "--state-dir", str(migd.migctl.state_dir), "apply",
                              str(PROFILES / "night.yaml"), "--on-busy", "wait", "--busy-timeout", "10m"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        migd.wait_until(lambda: (migd.daemon_doc().get("applying") or {}).get("waiting") == {"0": [pid]}
                        or apply.poll() is not None, timeout=60)
        assert apply.poll() is None, apply.communicate()
        _sim(migd, "xid", "43", "--gpu", "0", "--gi", str(other))
        migd.wait_until(lambda: (str(other), "43") in _xids(migd), timeout=60)  # the watch is on it
        assert "Xid 79 on GPU 0 (GPU-wide)" in _sim(migd, "xid", "79", "--gpu", "0")
        assert not any(p.pid == pid for p in store.read().gpus[0].processes)  # the awaited process is gone
        out, err = apply.communicate(timeout=120)
    finally:
        if apply.poll() is None:
            apply.kill()
            apply.communicate()
    assert apply.returncode == 4, (out, err)
    line = next((ln for ln in (out + err).splitlines() if "GPU 0" in ln and "Xid 79" in ln), None)
    assert line is not None and "FAULTED" in line, (out, err)
    assert store.read().mutations == before and migd.assert_profile("day")  # GPU 0 was not touched
    assert len(migd.migctl.layout()[0]) == 7
    assert list(migd.control({"cmd": "isolation"})["unhealthy"]) == [store.read().gpus[0].uuid]
    migd.assert_no_traceback()


def test_the_fault_watch_never_waits_for_the_hardware_lock(make_backend: Any) -> None:
    """An apply holds the hardware lock through its changes, and the watch waited for it (its process
    listing every 5 s, a neighbour check after an instance's Xid): a fatal Xid meanwhile was read only
    after the apply.  The watch now takes the lock only when it is free, puts the neighbour check off
    until then, and answers an apply's catch-up (every event delivered before it read) while the
    lock is held."""
    from migd.catalog.models import Placement
    from migd.daemon.hwlock import HardwareLock
    from migd.isolation.events import EventCounters
    from migd.isolation.marks import FaultMarks
    from migd.isolation.watch import FaultWatch

    backend, store, _ = make_backend("single-a100", mig_enabled=True)
    gi = backend.create_gpu_instance(0, 19, Placement(0, 1))
    backend.create_compute_instance(0, gi, 0)
    uuid, lock, marks = store.read().gpus[0].uuid, HardwareLock(), FaultMarks()
    watch = FaultWatch(backend, lock, EventCounters(), marks)
    watch.start()
    try:
        with lock:  # an apply's changes
            watch._last_remember = 0.0  # the process listing is due
            world.raise_xid(store, 0, 43, gi=gi, ci=0)
            world.raise_xid(store, 0, 79)
            reasons = marks.caught_up()
            assert list(reasons) == [uuid] and reasons[uuid].startswith("Xid 79 (GPU-wide)"), reasons
            assert [ev.xid for ev, _ in watch._deferred] == [43]  # its check waits for the lock
        deadline = time.monotonic() + 60
        while watch._deferred and time.monotonic() < deadline:  # checked once the lock is free
            time.sleep(0.05)
        assert not watch._deferred and watch.breaches == []
    finally:
        watch.stop()
    assert marks.caught_up() == marks.reasons()  # no watch runs: the marks as they are, at once


def test_an_xid_right_after_the_watch_starts_is_seen(make_backend: Any) -> None:
    """The event set was registered at the watch thread's first wait, and NVML delivers nothing from
    before a registration: under load the thread ran late, and an Xid raised right after ``start()``
    was never seen (the hardware-lock test above failed that way).  ``start()`` now registers."""
    import threading

    from migd.daemon.hwlock import HardwareLock
    from migd.isolation.events import EventCounters
    from migd.isolation.marks import FaultMarks
    from migd.isolation.watch import FaultWatch

    backend, store, _ = make_backend("single-a100", mig_enabled=True)
    uuid, marks = store.read().gpus[0].uuid, FaultMarks()
    watch = FaultWatch(backend, HardwareLock(), EventCounters(), marks)
    go, step = threading.Event(), watch.step

    def late_step() -> float:  # the thread's first step comes only after the Xid: a loaded machine
        go.wait(30)
        return step()

    watch.step = late_step  # type: ignore[method-assign]
    watch.start()
    try:
        world.raise_xid(store, 0, 79)
        go.set()
        reasons = marks.caught_up()
        assert list(reasons) == [uuid] and reasons[uuid].startswith("Xid 79 (GPU-wide)"), reasons
    finally:
        go.set()
        watch.stop()


def test_a_guarded_change_holds_off_marking_but_never_a_reader() -> None:
    """An apply holds the guard through each GPU's change; /metrics read the marks under the same lock, so
    during a slow apply every scrape, /healthz and the page waited (an outside audit: no answer for a
    minute).  A reader gets its copy at once; a new mark waits for the change to end."""
    import threading

    from migd.isolation.marks import FaultMarks
    from migd.isolation.xids import FaultMark
    marks = FaultMarks()
    marks.mark("GPU-a", FaultMark(79, 1.0))
    in_change, done, marked = threading.Event(), threading.Event(), threading.Event()

    def apply() -> None:
        with marks.guard("GPU-b"):
            in_change.set()
            done.wait(30)

    def watch() -> None:
        marks.mark("GPU-b", FaultMark(79, 2.0))
        marked.set()
    threading.Thread(target=apply, daemon=True).start()
    assert in_change.wait(30)
    try:
        reader = threading.Thread(target=lambda: (marks.snapshot(), marks.reasons(), marks.clear("GPU-x")),
                                  daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive()  # (it waited for the change to end)
        threading.Thread(target=watch, daemon=True).start()
        assert not marked.wait(0.3) and list(marks.snapshot()) == ["GPU-a"]  # the mark waits for the change
    finally:
        done.set()
    assert marked.wait(30) and sorted(marks.snapshot()) == ["GPU-a", "GPU-b"]


def test_fault_marks_are_read_whole_while_the_watch_writes_them() -> None:
    """The watch thread set marks in a plain dict that scrapes and status iterated and the loop popped:
    'dictionary changed size during iteration' in a scrape.  Readers now get copies taken under the lock."""
    import sys
    import threading

    from migd.isolation.xids import FaultMark
    from migd.state.live import Status
    status = Status()
    stop = threading.Event()

    def watch() -> None:
        n = 0
        while not stop.is_set():
            status.unhealthy.mark(f"GPU-{n % 5000}", FaultMark(79, 0.0))
            status.unhealthy.clear(f"GPU-{(n + 2500) % 5000}")
            n += 1
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer = threading.Thread(target=watch)
    writer.start()
    try:
        for _ in range(100):  # (a plain dict raised in 99 of 100 readings here)
            reasons = status.unhealthy_reasons()
            doc = status.to_json()["unhealthy"]
            assert all(r.startswith("Xid 79") for r in reasons.values()) and isinstance(doc, dict)
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(old)
