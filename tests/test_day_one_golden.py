"""The outputs issue 39's second pass changed or added, pinned byte for byte (``MIGD_UPDATE_GOLDEN=1``
rewrites them; review the diff): an apply that ``--on-busy force`` made (each PID signalled, and when).
Times and real PIDs are masked."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migd.api.plan import ApplyDoc
from migd.api.wire import from_json, to_json
from migd.report_text import apply_table
from migd.sim import control
from migd.sim.state import StateStore
from tests.helpers import PROFILES, Migctl, check_golden

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
    control.start_process(store, 3, store.read().gpus[3].gis[0].id, 0, pid=sleeper.pid)
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
