"""The applier's decisions on an in-memory node (tests/fakes.py): milliseconds each, beside the
simulator tests that run the same paths through the real pynvml and C ABI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from migd.apply.executor import Applier
from migd.apply.result import ApplyOptions, BusyError, GpuStatus, GpuUnhealthy, OnBusy
from migd.exits import Exit, for_result
from migd.hardware.ports import ApplyPort
from migd.isolation.marks import FaultMarks
from migd.isolation.xids import FaultMark
from migd.profiles.loader import load_profile
from tests.fakes import FakeNode
from tests.helpers import PROFILES

DAY, NIGHT = load_profile(PROFILES / "day.yaml"), load_profile(PROFILES / "night.yaml")


def _applier(tmp_path: Path, *models: str) -> tuple[FakeNode, Applier]:
    node = FakeNode(*models)
    assert isinstance(node, ApplyPort)  # the fake offers every method of the applier's port
    return node, Applier(node, tmp_path / "state")


def test_day_then_night_then_night_again_changes_only_what_differs(tmp_path: Path) -> None:
    node, applier = _applier(tmp_path, "A100-SXM4-80GB")
    assert applier.apply(DAY).ok and node.layout(0) == [("1g.10gb", s) for s in range(7)]
    before = node.changes
    result = applier.apply(NIGHT)
    assert result.ok and node.layout(0) == [("7g.80gb", 0)]
    assert node.changes - before == len(result.plans[0].ops)  # exactly the plan's operations
    before = node.changes
    again = applier.apply(NIGHT)
    assert again.ok and node.changes == before and [r.status for r in again.results] == [GpuStatus.UNCHANGED]


def test_a_busy_instance_refuses_the_apply_and_nothing_changes(tmp_path: Path) -> None:
    node, applier = _applier(tmp_path, "A100-SXM4-80GB")
    applier.apply(DAY)
    node.run(0, gi_id=min(node.gpus[0].gis))
    before = (node.changes, node.layout(0))
    with pytest.raises(BusyError) as e:
        applier.apply(NIGHT)
    assert "instances with running processes would be destroyed" in str(e.value)
    assert (node.changes, node.layout(0)) == before


def test_a_driver_error_mid_apply_is_rolled_back_to_the_layout_before(tmp_path: Path) -> None:
    node, applier = _applier(tmp_path, "A100-SXM4-80GB")
    applier.apply(DAY)
    node.fail_after = 5  # the sixth change of the night apply fails
    result = applier.apply(NIGHT)
    assert [r.status for r in result.results] == [GpuStatus.ROLLED_BACK]
    assert node.layout(0) == [("1g.10gb", s) for s in range(7)] and for_result(result) == Exit.NOT_APPLIED
    assert not applier.journal.exists()


def test_a_lost_gpu_is_left_alone_and_the_others_applied(tmp_path: Path) -> None:
    node, applier = _applier(tmp_path, "A100-SXM4-80GB", "A100-SXM4-80GB", "A100-SXM4-80GB")
    node.gpus[1].lost = True
    result = applier.apply(NIGHT)
    assert result.ok and [u.index for u in result.unreadable] == [1] and result.unreadable[0].lost
    assert [r.index for r in result.results] == [0, 2] and for_result(result) == Exit.PARTLY
    assert node.layout(0) == node.layout(2) == [("7g.80gb", 0)] and node.gpus[1].gis == {}


class _LateMark(FaultMarks):
    """A fatal Xid that lands after the apply planned, just as it is about to change the GPU."""

    def guard(self, uuid: str) -> Any:
        self.mark(uuid, FaultMark(79, 0.0))
        return super().guard(uuid)


def test_a_fault_mark_set_before_a_change_stops_it(tmp_path: Path) -> None:
    node, applier = _applier(tmp_path, "A100-SXM4-80GB")
    applier.apply(DAY)
    marked = FaultMarks()  # marked before the apply plans: refused up front
    marked.mark("GPU-fake-0", FaultMark(79, 0.0))
    with pytest.raises(GpuUnhealthy, match="Xid 79"):
        applier.apply(NIGHT, ApplyOptions(faults=marked))
    before = node.changes
    result = applier.apply(NIGHT, ApplyOptions(faults=_LateMark()))
    assert [r.status for r in result.results] == [GpuStatus.FAULTED] and "Xid 79" in (result.results[0].error or "")
    assert node.changes == before and for_result(result) == Exit.HARDWARE


class _MarkedWhileWaiting(FaultMarks):
    """The fault watch reads Xid 79 on GPU 0 while the apply waits for its busy instance (the Xid ends
    that instance's process, which ends the wait): the marks read once the watch caught up carry it."""

    def caught_up(self) -> dict[str, str]:
        self.mark("GPU-fake-0", FaultMark(79, 0.0))
        return super().caught_up()


def test_a_fault_mark_set_while_the_apply_waited_leaves_that_gpu_alone(tmp_path: Path) -> None:
    """Read again after the wait, with the hardware lock let go while waiting: GPU 0 is set aside before
    the journal and the first change (faulted, exit 4, the Xid named); GPU 1 goes ahead as planned."""
    from contextlib import contextmanager

    node, applier = _applier(tmp_path, "A100-SXM4-80GB", "A100-SXM4-80GB")
    applier.apply(DAY)
    node.run(0, gi_id=min(node.gpus[0].gis))
    let_go: list[str] = []

    @contextmanager
    def unheld() -> Any:
        let_go.append("wait")
        yield

    def waiting(pids: dict[int, tuple[int, ...]], until: float) -> None:
        node.gpus[0].pids.clear()  # (Xid 79 took the process)
    before = node.layout(0)
    result = applier.apply(NIGHT, ApplyOptions(on_busy=OnBusy.WAIT, busy_timeout_s=60, poll_s=0.01,
                                               faults=_MarkedWhileWaiting(), on_wait=waiting, unheld=unheld))
    assert [r.status for r in result.results] == [GpuStatus.FAULTED, GpuStatus.APPLIED], result.results
    assert "Xid 79" in (result.results[0].error or "") and for_result(result) == Exit.HARDWARE
    assert node.layout(0) == before and node.layout(1) == [("7g.80gb", 0)] and not applier.journal.exists()
    assert let_go == ["wait", "wait"]  # the busy wait, then the catch-up


def test_the_daemon_serves_the_readable_gpus_and_says_which_is_lost(tmp_path: Path) -> None:
    """The daemon's start-up pass on a node where GPU 1 fell off the bus: the others converge, GPU 1
    is 'lost', and the pass is not an error (the applier's port is the in-memory node)."""
    from datetime import datetime

    from migd.api.daemon import Outcome, Progress
    from migd.config.migdyaml import load_config
    from migd.daemon.clock import Clock
    from migd.daemon.service import Daemon
    (tmp_path / "profiles").mkdir()
    for name in ("day.yaml", "night.yaml"):
        (tmp_path / "profiles" / name).write_text((PROFILES / name).read_text())
    (tmp_path / "migd.yaml").write_text('timezone: Asia/Seoul\nprofiles_dir: profiles\nschedule:\n'
                                        '  - {profile: day, at: "08:30", days: mon-fri}\n'
                                        '  - {profile: night, at: "19:00", days: mon-fri}\nmetrics: {enabled: false}\n')
    node = FakeNode("H100-SXM5-80GB", "H100-SXM5-80GB", "H100-SXM5-80GB")
    node.gpus[1].lost = True
    daemon = Daemon(load_config(tmp_path / "migd.yaml"), node, tmp_path / "state",  # type: ignore[arg-type]
                    Clock(datetime.fromisoformat("2026-11-23T10:00:00+09:00")))
    daemon.reconcile("start")
    states = {i: g.progress for i, g in daemon.status.gpus.items()}
    assert states == {0: Progress.CONVERGED, 1: Progress.LOST, 2: Progress.CONVERGED}, states
    assert daemon.status.last_apply is not None and daemon.status.last_apply.result is Outcome.SUCCESS
    assert node.layout(0) == node.layout(2) == [("1g.10gb", s) for s in range(7)]


def test_an_unresolved_journal_is_never_written_over(tmp_path: Path) -> None:
    """A journal recovery could not resolve (its GPU gone, say) is the only record of that GPU's layout
    before the interrupted apply: the daemon's passes recover and go on, so the apply itself must not
    begin a new journal over it.  The change is refused, the GPU untouched, the record kept."""
    node, applier = _applier(tmp_path, "A100-SXM4-80GB")
    assert applier.apply(DAY).ok
    kept = {"schema": "migd.journal/v1", "profile": "night", "pid": 1, "started": 0.0, "gpus": {"GPU-gone": {
        "index": 5, "status": "applying", "done": 3, "ops": 16, "before": {"mig": True, "instances": []}}}}
    applier.journal.path.write_text(json.dumps(kept))
    assert applier.recover_locked()[0].status is GpuStatus.FAILED and applier.journal.exists()  # not resolved
    before = node.changes
    result = applier.apply_plans(NIGHT, applier.plan(NIGHT), ApplyOptions())
    assert [r.status for r in result.results] == [GpuStatus.FAILED] and "is unresolved" in (result.results[0].error
                                                                                           or "")
    assert node.changes == before and json.loads(applier.journal.path.read_text()) == kept
