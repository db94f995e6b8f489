"""The outputs of day one's second pass, pinned byte for byte (``MIGD_UPDATE_GOLDEN=1``
rewrites them; review the diff): an apply that ``--on-busy force`` made (each PID signalled, and when),
``migctl daemon`` while a manual apply waits inside migd for busy instances, that apply cancelled while
it waited, and a manual profile that selects one GPU of four.  Times and real PIDs are masked."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from migd.api.commands import ManualApply
from migd.api.daemon import DaemonDoc
from migd.api.plan import ApplyDoc
from migd.apply.result import ApplyResult, OnBusy
from migd.config.migdyaml import load_config
from migd.ctl.text import apply_table, daemon_table
from migd.daemon.clock import Clock
from migd.daemon.service import Daemon
from migd.profiles.loader import load_profile
from migd.report import apply_doc
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import StateStore
from migd.wire import from_json, to_json
from tests.helpers import PROFILES, Migctl, check_golden

pytestmark = pytest.mark.integration  # a real migd

_JSON_TIMES = re.compile(r'("(?:started|since|blocked_since|time|seconds|failed_at|next_try|real|at|until)": )'
                         r'[0-9.e+]+')
_TEXT_TIMES = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC|(?<= in )[0-9.]+s\b")


def _masked_json(doc: Any) -> str:
    return _JSON_TIMES.sub(lambda m: m.group(1) + "0", json.dumps(doc, indent=2) + "\n")


def _masked_text(text: str) -> str:
    return _TEXT_TIMES.sub(lambda m: "-" if m.group(0).endswith("UTC") else "0.00s", text)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_an_apply_that_force_made(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """``migctl apply --on-busy force``: the table names the PID, its GPU, the signal and when; ``-o json``
    has them in ``signalled``."""
    m = Migctl(tmp_path, "mixed")
    assert m("apply", str(PROFILES / "day.yaml"), "--sequential").code == 0
    store = StateStore(m.state)
    world.start_process(store, 3, store.read().gpus[3].gis[0].id, 0, pid=sleeper.pid)
    r = m("apply", str(PROFILES / "night.yaml"), "--sequential", "--on-busy", "force", "-o", "json")
    assert r.code == 0, r.err
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
    doc = json.loads(r.out)
    assert [(s["pid"], s["signal"], s["gpu"]) for s in doc["signalled"]] == [(sleeper.pid, "SIGTERM", 3)]
    text = _masked_json(doc).replace(f'"pid": {sleeper.pid}', '"pid": 4711')
    check_golden("apply-night-force.json", text)
    back = from_json(ApplyDoc, json.loads(text))
    assert json.dumps(to_json(back), indent=2) + "\n" == text
    table = apply_table(from_json(ApplyDoc, doc))
    check_golden("apply-night-force.txt", _masked_text(table).replace(f"PID {sleeper.pid}", "PID 4711"))


def _daemon(tmp_path: Path, m: Migctl, now: str) -> tuple[Daemon, Any]:
    (tmp_path / "migd.yaml").write_text("timezone: Asia/Seoul\nprofiles_dir: " + str(PROFILES) + "\nschedule:\n"
                                        "  - {profile: day, at: '08:30', days: mon-fri}\n"
                                        "  - {profile: night, at: '19:00', days: mon-fri}\n")
    os.chmod(tmp_path / "migd.yaml", 0o644)
    backend = sim_backend(m.state, m.fleet)
    d = Daemon(load_config(tmp_path / "migd.yaml"), backend, m.state_dir, Clock(datetime.fromisoformat(now)))
    d.progress.node = {g.index: g.uuid for g in (backend.gpu(i) for i in range(backend.gpu_count()))}
    return d, backend


def _fixed(doc: dict[str, Any], tmp_path: Path) -> str:
    """The document as JSON text, times masked, paths of this machine named."""
    text = _masked_json({**doc, "config_path": "CONFIG"})
    return text.replace(str(PROFILES), "PROFILES").replace(str(tmp_path), "TMP")


def _table(text: str) -> str:
    return daemon_table(from_json(DaemonDoc, json.loads(text)))


def test_migctl_daemon_while_a_manual_apply_waits_and_that_apply_cancelled(tmp_path: Path) -> None:
    """A manual apply of night waits inside migd for GPU 3's PIDs: ``migctl daemon`` (table and JSON)
    shows it; withdrawn (Ctrl-C), its own account says cancelled, nothing changed."""
    m = Migctl(tmp_path, "mixed")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    store = StateStore(m.state)
    world.start_process(store, 3, store.read().gpus[3].gis[0].id, 0, used_mib=1000)
    d, backend = _daemon(tmp_path, m, "2026-11-23T10:00:05+09:00")
    abort = threading.Event()
    done: list[ApplyResult] = []
    try:
        d.reconcile("start")
        t = threading.Thread(target=lambda: done.append(d.manual_apply(
            load_profile(PROFILES / "night.yaml"), ManualApply(on_busy=OnBusy.WAIT, busy_timeout_s=600.0), abort)))
        t.start()
        deadline = time.monotonic() + 30
        while d.status.applying is None and time.monotonic() < deadline:
            time.sleep(0.05)
        doc = d.status.to_json()
        abort.set()
        t.join(30)
    finally:
        backend.close()
    assert doc["applying"]["waiting"] == {"3": [5000001]}
    text = _fixed(doc, tmp_path)
    check_golden("daemon-applying.json", text)
    check_golden("daemon-applying.txt", _table(text))
    assert json.dumps(to_json(from_json(DaemonDoc, json.loads(text))), indent=2) + "\n" == text
    result = apply_doc(done[0], False)
    check_golden("apply-night-cancelled.txt", _masked_text(apply_table(result, by="migd")).replace(str(PROFILES),
                                                                                                 "PROFILES"))
    assert d.status.applying is None and d.status.last_apply is not None


def test_migctl_daemon_after_a_manual_profile_for_one_gpu(tmp_path: Path) -> None:
    """The three GPUs it does not select stay in view, said as such."""
    m = Migctl(tmp_path, "mixed")
    one = tmp_path / "one.yaml"
    one.write_text("apiVersion: migd/v1\nkind: Profile\nname: one\ngpus:\n  - select: {index: 2}\n    mig: enabled\n"
                   "    instances:\n      - {profile: 7g, count: 1}\n")
    d, backend = _daemon(tmp_path, m, "2026-11-23T10:00:05+09:00")
    try:
        d.reconcile("start")
        assert d.manual_apply(load_profile(one), ManualApply()).ok
        doc = d.status.to_json()
    finally:
        backend.close()
    assert [g.get("selected") for _, g in sorted(doc["gpus"].items())] == [False, False, None, False]
    check_golden("daemon-one-gpu.txt", _table(_fixed(doc, tmp_path)))
