"""Every documented migctl output, pinned byte for byte on a fixed simulated fleet.

As prometheus/client_python pins its exposition: a deliberate format change rewrites the
golden files (``MIGD_UPDATE_GOLDEN=1 pytest tests/test_golden.py``) in the same commit, where
the diff shows reviewers exactly what users will see change.  Times are the only thing masked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from migd.api.daemon import DaemonDoc, LastApply, Outcome
from migd.apply.executor import Applier
from migd.config.migdyaml import load_config
from migd.ctl.text import daemon_table
from migd.daemon.clock import Clock
from migd.daemon.service import Daemon
from migd.metrics.collector import MigdCollector
from migd.metrics.sampler import NvmlErrorCounter, Sampler
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from migd.state.live import Status
from migd.wire import from_json
from tests.helpers import PROFILES, Migctl, check_golden

GOLDEN = Path(__file__).parent / "golden"
_SECONDS = re.compile(r'("seconds": )[0-9.]+|( in )[0-9.]+s\b')


def _mask(text: str) -> str:
    return _SECONDS.sub(lambda m: (m.group(1) or m.group(2)) + ("0" if m.group(1) else "0.00s"), text)


_check = check_golden


@pytest.fixture
def mixed(tmp_path: Path) -> Migctl:
    return Migctl(tmp_path, "mixed")  # 2 x A100-SXM4-40GB + 2 x H100 80GB HBM3, MIG off


def _run(m: Migctl, *args: str) -> str:
    r = m(*args)
    assert r.code == 0, r.err
    return _mask(r.out)


@pytest.mark.integration
def test_plan_apply_status_outputs(mixed: Migctl) -> None:
    balanced = str(PROFILES / "balanced.yaml")
    _check("plan-balanced.txt", _run(mixed, "plan", balanced))
    _check("plan-balanced-verbose.txt", _run(mixed, "plan", balanced, "-v"))
    _check("plan-balanced.json", _run(mixed, "plan", balanced, "-o", "json").replace(str(PROFILES), "PROFILES"))
    _check("apply-balanced-dry-run.txt", _run(mixed, "apply", balanced, "--dry-run"))
    _check("apply-balanced.json", _run(mixed, "apply", balanced, "--sequential", "-o", "json"))
    _check("status-balanced.txt", _run(mixed, "status"))
    _check("status-balanced-verbose.txt", _run(mixed, "status", "-v"))
    _check("status-balanced.json", _run(mixed, "status", "-o", "json"))
    _check("apply-night.txt", _run(mixed, "apply", str(PROFILES / "night.yaml"), "--sequential"))
    _check("export-night.yaml", _run(mixed, "export", "--name", "night"))


def test_doctor_outputs(mixed: Migctl) -> None:
    _check("doctor.txt", _run(mixed, "doctor"))
    _check("doctor-verbose.txt", _run(mixed, "doctor", "-v"))
    _check("doctor.json", _run(mixed, "doctor", "-o", "json"))


_TIMES = re.compile(r'("(?:started|since|blocked_since|time|seconds|failed_at|next_try|real)": )[0-9.e+]+')


def test_daemon_status_outputs(tmp_path: Path, mixed: Migctl) -> None:
    """``migctl daemon`` (table and ``-o json``): the daemon after a scheduled transition, one GPU
    waiting for a busy instance; times masked, everything else exact."""
    doc = _daemon_doc(tmp_path, mixed)
    text = _TIMES.sub(lambda m: m.group(1) + "0", json.dumps(doc, indent=2) + "\n")
    _check("daemon-waiting.json", text)
    _check("daemon-waiting.txt", daemon_table(from_json(DaemonDoc, json.loads(text))))


def _daemon_doc(tmp_path: Path, m: Migctl, arm: Callable[[StateStore], None] = lambda store: None) -> dict[str, Any]:
    """``arm``: what else the node does to the transition (after day is applied)."""
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(m.state)
    world.start_process(store, 3, store.read().gpus[3].gis[0].id, 0, used_mib=1000)
    arm(store)
    (tmp_path / "migd.yaml").write_text("timezone: Asia/Seoul\nprofiles_dir: " + str(PROFILES) + "\nschedule:\n"
                                        "  - {profile: day, at: '08:30', days: mon-fri}\n"
                                        "  - {profile: night, at: '19:00', days: mon-fri}\n")
    os.chmod(tmp_path / "migd.yaml", 0o644)
    backend = sim_backend(m.state, m.fleet)
    try:
        cfg = load_config(tmp_path / "migd.yaml")
        d = Daemon(cfg, backend, m.state_dir, Clock(datetime.fromisoformat("2026-11-23T19:00:05+09:00")))
        d.reconcile("transition")
        doc = d.status.to_json()
    finally:
        backend.close()
    doc["config_path"] = "CONFIG"
    return doc


def test_daemon_status_with_failed_gpus(tmp_path: Path, mixed: Migctl) -> None:
    """``migctl daemon`` (table and ``-o json``) after a transition in which two GPUs' changes failed and
    were rolled back: each waits out its backoff (docs/daemon.md), said with when it failed, why, and its
    next try; GPU 1 as if it had failed three times in a row.  Times set, or masked in the JSON."""
    def arm(store: StateStore) -> None:
        for gpu in (0, 1):
            world.fail_call(store, "nvmlGpuInstanceDestroy", 999, gpu=gpu)
    doc = _daemon_doc(tmp_path, mixed, arm)
    text = _TIMES.sub(lambda m: m.group(1) + "0", json.dumps(doc, indent=2) + "\n")
    _check("daemon-failed.json", text)
    doc = json.loads(text)
    doc["gpus"]["0"].update(since=1795000003.0, failed_at=1795000003.0, next_try=1795000013.0)
    doc["gpus"]["1"].update(since=1794999933.0, failed_at=1795000003.0, next_try=1795000043.0, failures=3)
    doc["clock"]["real"] = 1795000000.0  # (its own clock: each time above shown on it, 3 s after it started)
    _check("daemon-failed.txt", daemon_table(from_json(DaemonDoc, doc)))


def test_metrics_exposition(tmp_path: Path, mixed: Migctl) -> None:
    """One /metrics exposition on the fixed fleet after the same transition (timestamps and
    durations masked), as prometheus/client_python pins its own exposition bytes."""
    assert mixed("apply", str(PROFILES / "balanced.yaml"), "--sequential").code == 0  # MIG UUIDs in order
    backend = sim_backend(mixed.state, mixed.fleet)
    try:
        sampler = Sampler(backend, threading.RLock(), Applier(backend, mixed.state_dir).owners.load, interval_s=60)
        sampler.sample_once()
        status = Status(desired_profile="balanced", applied_profile="balanced", apply_count={Outcome.SUCCESS: 1},
                        last_apply=LastApply(1795000000.0, Outcome.SUCCESS, 0.5, "balanced"))
        registry = CollectorRegistry()
        collector = MigdCollector(sampler, lambda: status, NvmlErrorCounter())
        collector.observe_apply(None, Outcome.SUCCESS, 0.5)
        registry.register(collector)
        text = generate_latest(registry).decode()
    finally:
        backend.close()
    text = _METRIC_TIMES.sub(lambda m: m.group(1) + " 0", text)
    _check("metrics-balanced.txt", _BUILD.sub(lambda m: f'{m.group(1)}="X"', text))


_BUILD = re.compile(r'(python_version|nvidia_ml_py|version)="[^"]*"')  # this machine's versions
_METRIC_TIMES = re.compile(r"^((?:migd_sampler_(?:duration|cpu)_seconds|migd_\w*timestamp_seconds|\w+_created)"
                           r"(?:\{[^}]*\})?) \S+$", re.M)


def test_assert_outputs(mixed: Migctl) -> None:
    """``assert -o json`` was accepted and ignored; ``migd.assert/v1`` now, beside its table."""
    balanced = str(PROFILES / "balanced.yaml")
    assert mixed("apply", balanced, "--sequential").code == 0
    night = str(PROFILES / "night.yaml")
    r = mixed("assert", night, "-o", "json")
    assert r.code == 1
    _check("assert-night.json", r.out)
    r = mixed("assert", night)
    assert r.code == 1
    _check("assert-night.txt", r.out)
    r = mixed("assert", night, "-v")
    assert r.code == 1
    _check("assert-night-verbose.txt", r.out)
    assert mixed("assert", balanced, "-o", "yaml").out.startswith("schema: migd.assert/v1\n")


def test_daemon_status_with_demand(tmp_path: Path, mixed: Migctl) -> None:
    """``migctl daemon`` on a demand planner that follows its own want (docs/demand.md): the status
    of a real transition with the demand view such a node holds; times masked."""
    from migd.api.demand import DemandView, PlanSummary, Source
    from migd.wire import to_json
    doc = _daemon_doc(tmp_path, mixed)
    plan = PlanSummary(1795000000.0, "on", ("gpu1: night -> day: gains 55.6 slice-hours of pending work for 0.3 "
                                            "idled while it drains (ready in 3 min)",),
                       ("gpu2: night -> day: gains 30.0 ...; held: in night for 10 min of the 60 min minimum; "
                        "earliest change in 50 min",),
                       {"1g.10gb": 56.0}, ("gpu9: drained by an operator (disk)",), 1, 2,
                       run_share={"nlp": 0.25, "teaching": 0.5}, seeded_jobs=412,
                       unoffered={"nvidia_h100_80gb_hbm3_1g.10gb": 3})
    doc["demand"] = to_json(DemandView("on", "gpu1", Source.PLANNER, "night", "planner gpu1 wants night",
                                       1795007200.0, plan))
    doc["active"] = {"profile": "night", "reason": "demand", "source": "gpu1", "until": 1795007200.0}
    del doc["clock"]  # (a planner node on the machine's clock: the times above are real ones)
    text = _TIMES.sub(lambda m: m.group(1) + "0", json.dumps(doc, indent=2) + "\n")
    _check("daemon-demand.txt", daemon_table(from_json(DaemonDoc, json.loads(text))))


@pytest.mark.integration
def test_plain_nvidia_smi_output(mixed: Migctl) -> None:
    """The simulator's `nvidia-smi` tables (migd/sim/smi_table.py), its clock line masked."""
    assert mixed("apply", str(PROFILES / "balanced.yaml")).code == 0
    r = subprocess.run([sys.executable, "-m", "migd.sim.smi", "--sim-state", str(mixed.state)],
                       capture_output=True, text=True, timeout=60, check=True)
    _check("nvidia-smi-balanced.txt", "DATE\n" + r.stdout.split("\n", 1)[1])


def test_status_mine_output() -> None:
    """`migctl status --mine`'s lines (ctl.status filters the document; the rendering is pinned here); on
    stderr, a note for each node whose answer is a prediction or a refusal, and the one line when the
    driver's files cannot be read (exit 4)."""
    import argparse
    import io
    from contextlib import redirect_stderr

    from migd.api.status import StatusDoc
    from migd.ctl.status_out import Found, Node, Owner, cap_recipe, mine_out, predict, recipe
    from migd.ctl.text import mine_table
    from migd.hardware.caps import CapsPaths
    doc = from_json(StatusDoc, json.loads((GOLDEN / "status-balanced.json").read_text()))
    _check("status-mine.txt", mine_table(doc, 61001, [29]) + mine_table(replace(doc, gpus=()), 61001, [29, 44]))
    reg = {m: recipe(f"ModifyDeviceFiles: {m}\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n",
                     "/proc/driver/nvidia/params") for m in (0, 1)}
    cap = {m: cap_recipe(f"DeviceFileMinor: 300\nDeviceFileMode: 292\nDeviceFileModify: {m}\n", True) for m in (0, 1)}
    team, video = Owner(0, 61101, 0o440), Owner(0, 61103, 0o660)
    cases = [("all GPUs", "/dev/nvidiactl", Found.ABSENT, None, reg[1], True, False, True),
             ("all GPUs", "/dev/nvidiactl", Found.ABSENT, None, reg[0], False, False, True),
             ("GPU 0", "/dev/nvidia2", Found.DEVICE, video, reg[0], False, False, True),
             ("GPU 0", "/dev/nvidia2", Found.DEVICE, video, reg[1], True, False, True),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.ABSENT, None, cap[1], True, False, False),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.ABSENT, None, cap[0], False, False, False),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.ABSENT, None,
              cap_recipe("DeviceFileModify: 1\n", True), False, False, False),
             ("GPU 0 GI 3 CI 0", "/dev/nvidia-caps/nvidia-cap301", Found.DEVICE, team,
              cap_recipe("DeviceFileMinor: 301\nDeviceFileMode: 256\nDeviceFileModify: 1\n", True), False, True, False),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.OTHER, None, cap[1], True, False, False),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.OTHER, None, cap[0], False, False, False),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.SYMLINK, None, cap[1], False, False, False),
             ("GPU 0 GI 3", "/dev/nvidia-caps/nvidia-cap300", Found.ABSENT, None, cap_recipe("", False),
              False, False, False)]
    lines = [Node(what, Path(p), found, now, r, predict(found, now, r), yours, yours_now, gate).note()
             for what, p, found, now, r, yours, yours_now, gate in cases]
    err = io.StringIO()
    with redirect_stderr(err):
        code = mine_out(argparse.Namespace(output="table"), doc, CapsPaths(Path("/nonexistent-driver")))
    assert code == 4
    _check("status-mine-notes.txt", "\n".join(lines) + "\n" + err.getvalue())


def test_daemon_status_with_access_by_owner(tmp_path: Path, mixed: Migctl) -> None:
    """``migctl daemon`` of a node with access by owner: to whom each owner's instances are open, an
    owner whose group is gone, a node it could not set and an instance held back for its handles
    (docs/users.md)."""
    from migd.api.access import AccessView
    from migd.wire import to_json
    doc = _daemon_doc(tmp_path, mixed)
    doc["access"] = to_json(AccessView({"inference": "group ml-b", "notebooks": "group ml-a and user alice"},
                                       "root", "dev", "/", 42,
                                       ("owner inference: group 'ml-b' does not exist: its instances are closed to "
                                        "all but root",
                                        "GPU 1: capability gpu1/gi3/access: /dev/nvidia-caps/nvidia-cap30 is not the "
                                        "driver's capability node 508:30: left as it was",
                                        "GPU 1: GI 5: its grant changes while pids 4242 hold its capability nodes: "
                                        "closed to all but root until they let go"), ("inference",)))
    text = _TIMES.sub(lambda m: m.group(1) + "0", json.dumps(doc, indent=2) + "\n")
    _check("daemon-access.txt", daemon_table(from_json(DaemonDoc, json.loads(text))))


def test_tables_of_a_dgx_by_verbosity(tmp_path: Path) -> None:
    """status, assert and isolation on a DGX A100 in ``day`` with a process on GPU 0 and GPU 5 lost: the
    summary line, then the GPUs that read the same as one line (README: "Tables lead with a one-line
    summary and group GPUs that read the same"); ``-v``: every GPU and MIG device, each finding."""
    m = Migctl(tmp_path, "dgx-a100")
    assert m("apply", str(PROFILES / "day.yaml"), "--sequential").code == 0  # MIG UUIDs in order
    store = StateStore(m.state)
    world.start_process(store, 0, store.read().gpus[0].gis[0].id, 0, used_mib=1000)
    world.set_lost(store, 5)
    night = str(PROFILES / "night.yaml")
    for name, args, code in (("status-dgx", ("status",), 5), ("assert-dgx-night", ("assert", night), 1),
                             ("isolation-dgx-night", ("isolation", "--profile", night), 5)):
        for suffix, verbose in (("", ()), ("-verbose", ("-v",))):
            r = m(*args, *verbose)
            assert r.code == code, (name, r)
            _check(f"{name}{suffix}.txt", r.out)


@pytest.mark.integration
def test_a_busy_refusal_writes_its_apply_document(tmp_path: Path) -> None:
    """``apply -o json`` refused for busy instances wrote nothing on stdout: a ``migd.apply/v1`` with
    ``error`` now (the plan it refused, each busy operation's pids, no results), beside the one line on
    stderr, exit 3; through migctl's own process."""
    m = Migctl(tmp_path, "mixed")
    assert m("apply", str(PROFILES / "balanced.yaml"), "--sequential").code == 0
    store = StateStore(m.state)
    world.start_process(store, 1, store.read().gpus[1].gis[0].id, 0, used_mib=1000)
    r = m.process("apply", str(PROFILES / "night.yaml"), "-o", "json")
    assert r.returncode == 3 and r.stderr.startswith("blocked: ") and r.stderr.count("\n") == 1, r
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["results"] == [] and doc["error"] == r.stderr.removeprefix("blocked: ").strip()
    _check("apply-night-refused-busy.json", r.stdout.replace(str(PROFILES), "PROFILES"))
