"""tests/installed.py: the suite stops at once, in one line saying what to run, where the tests'
processes would import a migd other than this checkout's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installed import elsewhere

pytestmark = pytest.mark.integration  # (it starts interpreters)

REPO = Path(__file__).resolve().parents[1]


def test_this_checkouts_migd_passes() -> None:
    assert elsewhere(REPO, sys.executable, os.environ) is None


def test_another_copy_of_migd_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "migd").mkdir()
    (tmp_path / "migd" / "__init__.py").write_text("")
    why = elsewhere(REPO, sys.executable, {**os.environ, "PYTHONPATH": str(tmp_path)})
    assert why == (f"the migd installed for {sys.executable} is {tmp_path.resolve() / 'migd'}, not this checkout's "
                   f"({REPO / 'migd'}), and the tests run its console scripts, so they would test that copy: "
                   f"run pip install -e '.[test]' in {REPO}")


def test_no_migd_at_all_is_named_with_the_fix(tmp_path: Path) -> None:
    """An interpreter that imports no migd (here: one told to ignore site-packages and the environment)."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -s -S -E \"$@\"\n")
    python.chmod(0o755)
    assert elsewhere(REPO, str(python), os.environ) == (
        f"migd is not installed for {python}, and the tests run its console scripts: run pip install -e "
        f"'.[test]' in {REPO}")


def test_pytest_stops_before_any_test_where_another_migd_would_run(tmp_path: Path) -> None:
    (tmp_path / "migd").mkdir()
    (tmp_path / "migd" / "__init__.py").write_text("")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                           "tests/test_installed.py::test_this_checkouts_migd_passes"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 4 and "passed" not in done.stdout, done.stdout + done.stderr
    assert f"the migd installed for {sys.executable} is {tmp_path.resolve() / 'migd'}" in done.stdout + done.stderr
