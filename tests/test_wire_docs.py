"""The documented output formats as wire types (``migd.api``): every golden document reads back into its
type and writes out byte for byte; a document that does not fit is refused naming the field; migctl
reads migd's replies through the same types and says so in one line when one does not fit."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from migd.api.checks import DaemonMarks, DoctorDoc, IsolationDoc
from migd.api.daemon import DaemonDoc, LastApply, Outcome, Progress
from migd.api.demand import DemandView, PlanSummary, Source
from migd.api.plan import ApplyDoc, AssertDoc, PlanDoc
from migd.api.slurm import Phase, SlurmSnapshot, SlurmState
from migd.api.status import Gpu, MigMode, Process, Reading, StatusDoc, Unreadable
from migd.apply.result import GpuStatus
from migd.ctl.text import daemon_table
from migd.exits import Exit, failure
from migd.isolation.audit import Check, Finding, Severity
from migd.isolation.probe import Probe, ProbeRun, ProbeStatus
from migd.plan.planner import OpKind
from migd.profiles.model import Profile
from migd.state.live import GpuProgress, Status
from migd.state.override import Override
from migd.wire import WireError, from_json, to_json
from tests.helpers import PROFILES, Migctl

GOLDEN = Path(__file__).parent / "golden"
DOCS: list[tuple[str, type[Any]]] = [("status-balanced.json", StatusDoc), ("plan-balanced.json", PlanDoc),
                                     ("apply-balanced.json", ApplyDoc), ("assert-night.json", AssertDoc),
                                     ("doctor.json", DoctorDoc), ("apply-night-refused-busy.json", ApplyDoc)]


@pytest.mark.parametrize(("name", "kind"), DOCS)
def test_every_golden_document_reads_back_into_its_type_byte_for_byte(name: str, kind: type[Any]) -> None:
    text = (GOLDEN / name).read_text()
    doc = from_json(kind, json.loads(text))
    assert json.dumps(to_json(doc), indent=2) + "\n" == text


def test_the_types_carry_enums_not_words() -> None:
    apply = from_json(ApplyDoc, json.loads((GOLDEN / "apply-balanced.json").read_text()))
    assert {r.status for r in apply.results} == {GpuStatus.APPLIED}
    assert {o.kind for g in apply.gpus for o in g.operations} >= {OpKind.SET_MIG, OpKind.CREATE_GI, OpKind.CREATE_CI}


def _gpu(mig: bool) -> Gpu:
    return Gpu(0, "GPU-0", "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", "00000000:07:00.0", MigMode(mig, mig, mig), (),
               None if mig else (Process(42, 1 << 20), Process(43, None)))


def test_processes_are_a_gpus_only_when_mig_is_off() -> None:
    on, off = to_json(_gpu(True)), to_json(_gpu(False))
    assert "processes" not in on and off["processes"] == [{"pid": 42, "used_memory_bytes": 1 << 20},
                                                          {"pid": 43, "used_memory_bytes": None}]
    assert from_json(Gpu, on) == _gpu(True) and from_json(Gpu, off) == _gpu(False)


def test_an_isolation_document_with_everything_round_trips() -> None:
    doc = IsolationDoc((Finding(1, Check.OVERLAP, Severity.ERROR, "GPU 1: GI 3 overlaps GI 5"),),
                       (Unreadable(2, Reading.LOST, "GPU is lost"),),
                       DaemonMarks({"GPU-1": "Xid 79"}, ("GPU 1: a process outside its instance",)),
                       Probe(ProbeStatus.FAILED, "0/1 instances ran the workload",
                             (ProbeRun(1, 3, 0, "MIG-1", False, "CUDA error"),)))
    wire = json.loads(json.dumps(to_json(doc)))
    assert wire["schema"] == "migd.isolation/v1" and wire["findings"][0]["check"] == "overlap"
    assert from_json(IsolationDoc, wire) == doc
    assert "probe" not in to_json(IsolationDoc((), (), None))


def _broken(path: str, value: object) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GOLDEN / "status-balanced.json").read_text())
    *keys, last = path.split(".")
    at: Any = doc
    for k in keys:
        at = at[int(k)] if k.isdigit() else at[k]
    if value is KeyError:
        del at[last]
    else:
        at[last] = value
    return doc


@pytest.mark.parametrize(("path", "value", "said"), [
    ("gpus.1.mig.current", "yes", "gpus[1].mig.current: expected bool, not 'yes'"),
    ("gpus.0.instances.0.placement.start", KeyError, "gpus[0].instances[0].placement.start: missing"),
    ("gpus.0.index", True, "gpus[0].index: expected int, not True"),
    ("unreadable", {}, "unreadable: expected a list, not dict"),
    ("schema", "migd.status/v2", "schema: expected 'migd.status/v1', not 'migd.status/v2'"),
])
def test_a_document_that_does_not_fit_is_refused_naming_the_field(path: str, value: object, said: str) -> None:
    with pytest.raises(WireError) as e:
        from_json(StatusDoc, _broken(path, value))
    assert str(e.value) == said


def test_an_unknown_word_is_refused_naming_the_field() -> None:
    doc = json.loads((GOLDEN / "apply-balanced.json").read_text())
    doc["results"][2]["status"] = "exploded"
    with pytest.raises(WireError, match=r"^results\[2\]\.status: 'exploded' is not one of unchanged, applied"):
        from_json(ApplyDoc, doc)


def test_a_reply_migctl_cannot_read_is_one_line_not_a_traceback() -> None:
    f = failure(WireError("result.gpus[0].mig", "missing"))
    assert f.code == Exit.NOT_APPLIED
    assert str(f) == ("error talking to migd: its reply does not read as this migctl expects (a migd of another "
                      "version?): result.gpus[0].mig: missing")


def test_migctls_isolation_json_is_its_type(tmp_path: Path) -> None:
    m = Migctl(tmp_path, "mixed")
    assert m("apply", str(PROFILES / "balanced.yaml")).code == 0
    r = m("isolation", "--profile", str(PROFILES / "night.yaml"), "-o", "json")
    wire = r.json()
    doc = from_json(IsolationDoc, wire)
    assert doc.findings and all(f.check in (Check.ORPHAN, Check.MISSING) for f in doc.findings)
    assert to_json(doc) == wire


def test_the_daemons_golden_document_reads_back_byte_for_byte() -> None:
    text = (GOLDEN / "daemon-waiting.json").read_text()
    doc = from_json(DaemonDoc, json.loads(text))
    assert doc.gpus["3"].state is Progress.WAITING and doc.last_apply is not None
    assert doc.last_apply.result is Outcome.BLOCKED
    assert json.dumps(to_json(doc), indent=2) + "\n" == text


def test_a_failed_gpus_backoff_reads_back_and_is_left_out_elsewhere() -> None:
    """``failures``, ``failed_at`` and ``next_try`` (added in v1 with the backoff) only on a failed GPU."""
    text = (GOLDEN / "daemon-failed.json").read_text()
    doc = from_json(DaemonDoc, json.loads(text))
    assert doc.gpus["1"].state is Progress.FAILED and doc.gpus["1"].failures == 1
    assert doc.gpus["2"].failures is None and "failures" not in json.loads(text)["gpus"]["2"]
    assert json.dumps(to_json(doc), indent=2) + "\n" == text


def test_a_daemon_with_a_hold_slurm_and_demand_survives_the_socket() -> None:
    """Every optional part at once, through JSON text as migctl gets it."""
    at = datetime(2026, 11, 26, 19, 0, tzinfo=timezone.utc)
    status = Status(started=1.0, config_path="/etc/migd/config.yaml", timezone=ZoneInfo("Asia/Seoul"),
                    desired_profile="day", applied_profile="night",
                    override=Override(Profile("night", "", (), "/etc/migd/profiles/night.yaml"), at, at),
                    next_transition=(at, "day"), last_apply=LastApply(2.0, Outcome.SUCCESS, 1.23456, "night"),
                    slurm=SlurmSnapshot.of("gpu1", SlurmState(phase=Phase.DRAINING, reason="3 jobs")),
                    demand=DemandView("on", "gpu1", Source.SCHEDULE, "day", "no want",
                                      plan=PlanSummary(3.0, "on", ("a",), (), {"1g.10gb": 5.5}, (), 1, 0)))
    status.gpus[0] = GpuProgress("GPU-0", Progress.WAITING, 4.0, "GPU 0: busy")
    wire = json.loads(json.dumps(to_json(status.view())))
    assert wire["active"] == {"profile": "night", "reason": "manual", "source": "/etc/migd/profiles/night.yaml",
                              "until": at.isoformat(), "since": at.isoformat()}
    assert wire["last_apply"]["seconds"] == 1.235 and wire["slurm"]["phase"] == "draining"
    assert wire["demand"]["plan"]["wanted_slice_h"] == {"1g.10gb": 5.5}
    back = from_json(DaemonDoc, wire)
    assert back == status.view()
    assert "manual apply of /etc/migd/profiles/night.yaml" in daemon_table(back)
