"""Issue 39, second pass, item 1: a driver not loaded yet is a hardware condition, not a configuration
error.  migd exited 2 when NVML could not be opened, which the unit does not restart, so after a reboot
where the driver came up late migd stayed down for good.  Through the real migd against the simulator,
whose nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED until the test loads the driver."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.sim import world
from migd.sim.state import StateStore
from tests.daemon_harness import MigdProcess

pytestmark = pytest.mark.integration  # real migd daemons


@pytest.fixture
def migd(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path)
    yield m
    m.close()


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[MigdProcess]:
    m = MigdProcess(tmp_path, fleet="dgx-a100", reconcile_interval="1s", busy_timeout="30m")
    yield m
    m.close()


# -- 1: a driver that is not loaded yet ----------------------------------------------------------------
def test_a_driver_not_loaded_yet_is_waited_for_not_a_configuration_error(migd: MigdProcess) -> None:
    """It exited 2 (which the unit does not restart) and stayed down.  Now it waits, says so in the log,
    in STATUS= and on /healthz, and serves the GPUs once NVML opens, without a restart."""
    assert migd.migctl("status").code == 0  # the node exists; then its driver goes away
    store = StateStore(migd.migctl.state)
    world.driver_not_loaded(store, 10_000)
    migd.start(now="2026-11-23T10:00:00", time_scale=4.0)  # tries at 0.25 s, 0.5 s, 1 s, ... real
    status = migd.wait_for(lambda s: "STATUS=waiting for the NVIDIA driver" in s, timeout=30)
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in status and "READY=1" not in status
    migd.wait_until(lambda: migd.healthz()[0] == 503, timeout=20)
    code, body = migd.healthz()
    assert body.startswith("waiting for the NVIDIA driver: ") and "DRIVER_NOT_LOADED" in body, (code, body)
    time.sleep(2)  # several more tries: still waiting, said once
    assert migd.proc is not None and migd.proc.poll() is None, migd.log.read_text()
    assert not any("READY=1" in m for m in migd.messages)
    waits = [ln for ln in migd.log.read_text().splitlines() if "waiting for the NVIDIA driver" in ln]
    assert len(waits) == 1 and "WARNING" in waits[0], waits
    world.driver_not_loaded(store, 0)  # the module is loaded
    migd.wait_ready(timeout=60)
    assert migd.assert_profile("day")
    migd.wait_until(lambda: migd.healthz()[0] == 200, timeout=30)
    assert "NVML opened after waiting" in migd.log.read_text()
    assert migd.stop() == 0
    migd.assert_no_traceback()


def test_sigterm_while_waiting_for_the_driver_stops_cleanly(migd: MigdProcess) -> None:
    """A node stopped before its driver came (or a library NVML cannot read at all): exit 0, one line."""
    migd.migctl.state.write_text("{not json")  # what a broken libnvidia-ml is to the simulated node
    migd.start()
    migd.wait_for(lambda s: "STATUS=waiting for the NVIDIA driver" in s, timeout=30)
    assert migd.stop() == 0
    log = migd.log.read_text()
    assert "stopped while waiting for the NVIDIA driver" in log and "not starting" not in log, log
    migd.assert_no_traceback()


