"""Every documented migctl output, pinned byte for byte on a fixed simulated fleet.

As prometheus/client_python pins its exposition: a deliberate format change rewrites the
golden files (``MIGD_UPDATE_GOLDEN=1 pytest tests/test_golden.py``) in the same commit, where
the diff shows reviewers exactly what users will see change.  Times are the only thing masked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers import PROFILES, Migctl

GOLDEN = Path(__file__).parent / "golden"
_SECONDS = re.compile(r'("seconds": )[0-9.]+|( in )[0-9.]+s\b')


def _mask(text: str) -> str:
    return _SECONDS.sub(lambda m: (m.group(1) or m.group(2)) + ("0" if m.group(1) else "0.00s"), text)


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MIGD_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with MIGD_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} differs from its golden file (MIGD_UPDATE_GOLDEN=1 rewrites it)"


@pytest.fixture
def mixed(tmp_path: Path) -> Migctl:
    return Migctl(tmp_path, "mixed")  # 2 x A100-SXM4-40GB + 2 x H100 80GB HBM3, MIG off


def _run(m: Migctl, *args: str) -> str:
    r = m(*args)
    assert r.code == 0, r.err
    return _mask(r.out)


def test_plan_apply_status_outputs(mixed: Migctl) -> None:
    balanced = str(PROFILES / "balanced.yaml")
    _check("plan-balanced.txt", _run(mixed, "plan", balanced))
    _check("plan-balanced.json", _run(mixed, "plan", balanced, "-o", "json").replace(str(PROFILES), "PROFILES"))
    _check("apply-balanced-dry-run.txt", _run(mixed, "apply", balanced, "--dry-run"))
    _check("apply-balanced.json", _run(mixed, "apply", balanced, "--sequential", "-o", "json"))
    _check("status-balanced.txt", _run(mixed, "status"))
    _check("status-balanced.json", _run(mixed, "status", "-o", "json"))
    _check("apply-night.txt", _run(mixed, "apply", str(PROFILES / "night.yaml"), "--sequential"))
    _check("export-night.yaml", _run(mixed, "export", "--name", "night"))


def test_doctor_outputs(mixed: Migctl) -> None:
    _check("doctor.txt", _run(mixed, "doctor"))
    _check("doctor.json", _run(mixed, "doctor", "-o", "json"))
