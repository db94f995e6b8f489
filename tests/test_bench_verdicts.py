"""The soak's pass/fail verdict (bench/soak.py, run by .ci/run): a short run judges absolute growth,
an hour-long one the rate."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests.helpers import REPO


@pytest.fixture
def soak(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("soak")


def test_one_allocator_step_in_a_short_run_passes(soak: Any) -> None:
    """Seen in a fresh-clone CI: 41.9 -> 42.1 MiB after the first minute of 3 read as 5.97 MiB/h."""
    assert soak.passed({"minutes": 3.0, "growth_per_hour": 5.97, "steady_growth": 0.2})
    # and a layout switch every minute: 42.2 -> 41.6 -> 42.8 MiB
    assert soak.passed({"minutes": 3.0, "growth_per_hour": 26.75, "steady_growth": 0.63})


def test_the_gpm_handle_leak_fails_a_short_run(soak: Any) -> None:
    """45 KB per 1 s cycle for two minutes after the first."""
    assert not soak.passed({"minutes": 3.0, "growth_per_hour": 158.0, "steady_growth": 5.3})


def test_an_hour_long_run_is_judged_by_its_rate(soak: Any) -> None:
    assert soak.passed({"minutes": 60.0, "growth_per_hour": 0.05, "steady_growth": -0.6})
    assert not soak.passed({"minutes": 60.0, "growth_per_hour": 6.0, "steady_growth": 0.9})
