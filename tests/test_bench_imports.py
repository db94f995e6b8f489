"""Every benchmark script loads against the package as it is now: CI runs them only after the suite,
so a stale import (a name moved to another module) would otherwise first show there."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_bench_script_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # as when run as a script: its folder first on the path
    runpy.run_path(str(path), run_name="bench_import_check")  # its body, not its main
