"""Text and times read from Slurm never stop migd: bytes that are not UTF-8
(an operator's Latin-1 drain reason) are read with replacement, and a lease's ``until=`` beyond the
configured lease (written in milliseconds) is not followed, is said, and renders.

A fake ``scontrol`` on PATH prints the exact bytes, so the real subprocess path is what is tested."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from migd.api.daemon import Active, Reason, SimClock
from migd.api.demand import Source
from migd.ctl.daemon_table import _active_line, clock_of, utc
from migd.daemon.demandpass import DemandPass
from migd.slurm import want as want_text
from migd.slurm.ctl import SlurmCtl, SlurmError, command_runner
from migd.slurm.demandconf import DemandMode, DemandSettings
from migd.slurm.demandplan import Planner
from migd.slurm.queue import read_queue
from migd.slurm.slurmconf import SlurmSettings
from migd.slurm.want import Want
from tests.helpers import NO_JOBS

pytestmark = pytest.mark.integration  # Slurm's commands faked as programs

NOW = 1795671590.0
MS_UNTIL = "1795678790000"  # until= in milliseconds: 13 digits
REASON = b"Reason=maintenance caf\xe9 (Latin-1) [root@2026-11-27T10:00:00]"


def _fake(tmp_path: Path, stdout: bytes, stderr: bytes = b"", rc: int = 0) -> SlurmCtl:
    """A SlurmCtl for gpu1 whose ``scontrol`` prints these exact bytes."""
    (tmp_path / "out").write_bytes(stdout)
    (tmp_path / "err").write_bytes(stderr)
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\ncat {tmp_path}/out\ncat {tmp_path}/err >&2\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return SlurmCtl("gpu1", command_runner({"PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"}))


def _node_line(extra: str = "", reason: bytes = REASON) -> bytes:
    return (b"NodeName=gpu1 Arch=x86_64 Gres=gpu:1g.10gb:7 State=IDLE+DRAIN Partitions=main Extra="
            + extra.encode() + b" " + reason + b"\n")


def test_a_latin1_drain_reason_is_read_with_replacement(tmp_path: Path) -> None:
    info = _fake(tmp_path, _node_line()).info()
    assert info.name == "gpu1" and info.drained and info.gres == "gpu:1g.10gb:7"
    assert info.reason == "maintenance caf\ufffd (Latin-1) [root@2026-11-27T10:00:00]"


def test_latin1_bytes_on_a_failing_command_are_its_error(tmp_path: Path) -> None:
    ctl = _fake(tmp_path, b"", b"scontrol: error: n\xe9ud inconnu\n", rc=1)
    with pytest.raises(SlurmError, match="exited 1: scontrol: error: n\ufffdud inconnu"):
        ctl.info()


def test_a_lease_in_milliseconds_is_beyond_any_lease() -> None:
    want = Want.parse(f"migd:want=day,by=gpu1,at={NOW:.0f},until={MS_UNTIL}")
    assert want is not None and want.beyond(NOW, 7200.0) and not want.holds("gpu1", NOW, 7200.0)
    fine = Want("day", "gpu1", NOW, NOW + 7200.0)
    assert not fine.beyond(NOW - 60, 7200.0) and fine.holds("gpu1", NOW - 60, 7200.0)  # (clock skew allowed)
    assert want_text.stamp(1e300) == f"{1e300:.0f} (epoch seconds, out of range)"


def _demand(tmp_path: Path, extra: str) -> DemandPass:
    ctl = _fake(tmp_path, _node_line(extra))
    settings = DemandSettings(DemandMode.ON, "gpu1", ("day", "night"), 60.0, 7200.0)
    slurm = SlurmSettings("gpu1", tmp_path / "slurm.conf", tmp_path / "gres.conf", partition="main",
                          demand=settings)
    return DemandPass(slurm, settings, ctl, tmp_path, clock=lambda: NOW)


def test_a_node_does_not_follow_a_lease_in_milliseconds_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    demand = _demand(tmp_path, f"migd:want=day,by=gpu1,at={NOW:.0f},until={MS_UNTIL}")
    with caplog.at_level(logging.INFO, logger="migd"):
        views = [demand.follow("night") for _ in range(3)]
    view = views[0]
    assert view.source is Source.SCHEDULE and view.profile is None and view.until is None, view
    assert "not followed" in view.why and f"until={MS_UNTIL}" in view.why and "7200s" in view.why, view.why
    said = [r.getMessage() for r in caplog.records if "not followed" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    (tmp_path / "ok").mkdir()
    ok = _demand(tmp_path / "ok", f"migd:want=day,by=gpu1,at={NOW:.0f},until={NOW + 3600:.0f}")
    assert ok.follow("night").profile == "day"  # (a lease within the configured one is followed)


def test_the_planner_rewrites_its_own_want_in_milliseconds(tmp_path: Path) -> None:
    """Its own want beyond its lease is not one it holds: rewritten with a lease it would write."""
    line = _node_line(f"migd:want=day,by=gpu1,at={NOW:.0f},until={MS_UNTIL}", b"Reason=none")
    ctl = _fake(tmp_path, line.replace(b"State=IDLE+DRAIN", b"State=IDLE"))
    settings = DemandSettings(DemandMode.ON, "gpu1", ("day", "night"), 60.0, 7200.0)
    planner = Planner(settings, "main", "gpu1", ctl, {}, tmp_path / "demand.json", lambda: NOW)
    _, skipped = planner._views(ctl.nodes(), read_queue(NO_JOBS, "main", NOW), NOW)
    assert planner._current == {} and not any("follows planner" in s for s in skipped), skipped


@pytest.mark.parametrize("epoch", [float(MS_UNTIL), float(MS_UNTIL) * 1000, 1e300])
def test_migctl_daemon_renders_a_time_out_of_range(epoch: float) -> None:
    active = Active("day", Reason.DEMAND, "gpu1", epoch)
    line = _active_line(active, utc)
    assert "(epoch seconds, out of range)" in line or "UTC" in line, line
    assert "out of range" in clock_of(SimClock("2026-11-27T10:00:00+00:00", NOW, 60.0))(epoch)
