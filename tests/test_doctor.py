"""``migctl doctor`` reads and compares, never changes; programs nobody here wrote see the simulated fleet."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from migd.catalog.models import GpuModel, model_for
from migd.hardware.doctor import Verdict, diagnose
from migd.report import doctor_doc
from migd.sim import world
from migd.sim.backend import sim_backend
from migd.sim.state import CATALOG_FLEETS, FLEETS, StateStore
from tests.helpers import PROFILES, Migctl

FIXTURES = Path(__file__).parent / "fixtures"


def _gpu_state(store: StateStore) -> str:
    s = store.read()
    return json.dumps([{k: v for k, v in g.items()} for g in s.to_json()["gpus"]]) + f"/{s.mutations}"


@pytest.mark.parametrize("fleet", CATALOG_FLEETS)
@pytest.mark.parametrize("profile", [None, "day"])
@pytest.mark.integration
def test_doctor_is_clean_and_read_only_on_every_fleet(tmp_path: Path, fleet: str, profile: str | None) -> None:
    m = Migctl(tmp_path, fleet)
    if profile:
        assert m("apply", str(PROFILES / f"{profile}.yaml")).code == 0
    else:
        m("status")
    store = StateStore(m.state)
    before = _gpu_state(store)
    r = m("doctor", "-o", "json")
    doc = r.json()
    assert r.code == 0 and doc["schema"] == "migd.doctor/v1" and doc["ok"], r.out
    checks = {(f["gpu"], f["check"]) for f in doc["findings"]}
    for i in range(len(FLEETS[fleet])):
        assert {(i, "identity"), (i, "memory"), (i, "mig-mode"), (i, "gpm"), (i, "events")} <= checks
        assert any(c.startswith("placements") for g, c in checks if g == i)
    assert _gpu_state(store) == before  # no mode change, no instance, no reset
    assert store.read().clients == {}  # and NVML was let go
    table = m("doctor")
    assert table.code == 0 and table.out.startswith("doctor: no differences from the catalog ("), table.out


def test_doctor_reports_a_wrong_catalog_entry(tmp_path: Path) -> None:
    backend = sim_backend(tmp_path / "s.json", "mixed", mig_enabled=True)
    try:
        def wrong(name: str, pci: int) -> GpuModel | None:
            model = model_for(name=name, pci_device_id=pci)
            if model is None or model.key != "H100-SXM5-80GB":
                return model
            p3g = model.profile_by_role("3g")
            assert p3g is not None
            bad = dataclasses.replace(p3g, instance_count=3, starts=(0, 2, 4))
            return dataclasses.replace(model, total_memory_mib=81920,
                                       profiles=tuple(bad if p is p3g else p for p in model.profiles))
        findings = diagnose(backend, wrong)
    finally:
        backend.close()
    bad = {(f.gpu, f.check): f.detail for f in findings if f.verdict is Verdict.MISMATCH}
    assert set(bad) == {(g, c) for g in (2, 3) for c in ("memory", "profile 9", "placements 9")}
    assert "catalog says 81920 MiB" in bad[(2, "memory")]
    assert "instanceCount 2 (catalog 3)" in bad[(2, "profile 9")]
    assert "0:4,4:4 (catalog 0:4,2:4,4:4)" in bad[(2, "placements 9")]
    assert not doctor_doc(findings).ok


def test_doctor_reports_an_unknown_gpu_and_a_lost_one(tmp_path: Path) -> None:
    backend = sim_backend(tmp_path / "s.json", "single-a100")
    try:
        findings = diagnose(backend, lambda name, pci: None)
    finally:
        backend.close()
    (ident,) = [f for f in findings if f.check == "identity"]
    assert ident.verdict is Verdict.MISMATCH and "not in migd's catalog" in ident.detail
    m = Migctl(tmp_path, "dgx-a100")
    m("status")
    world.set_lost(StateStore(m.state), 3)
    r = m("doctor")  # the other seven are checked; the lost one is a finding, and the exit says "partly"
    assert r.code == 5 and r.out.startswith("doctor: no differences from the catalog; GPU 3 cannot be read"), r
    assert any(line.startswith("GPU 3 ") and " readable       error    lost (fallen off the bus" in line
               for line in r.out.splitlines()) and "GPU_IS_LOST" in r.out  # (its column as wide as "GPU 0-2,4-7")
    assert "GPU 0-2,4-7 mig-mode" in r.out and "Traceback" not in r.err


def test_recorded_real_h100_doctor_run_was_clean() -> None:
    """`migctl doctor` on a real H100 80GB HBM3 (driver 580.159.04, MIG off), kept as it came back."""
    doc = json.loads((FIXTURES / "h100-sxm5-580.159.04-doctor.json").read_text())
    assert doc["schema"] == "migd.doctor/v1" and doc["ok"]
    assert any(f["check"] == "profile 9" and f["verdict"] == "ok" for f in doc["findings"])


def test_recorded_real_h200_doctor_runs_found_the_catalog_wrong_then_clean() -> None:
    """`migctl doctor` on a real H200 (driver 580.159.04, MIG off), 2026-11-28: first with the catalog
    as it was (memory sizes from an older driver's lgip), then with the catalog corrected to the
    driver's answers. Both kept as they came back."""
    before = json.loads((FIXTURES / "h200-580.159.04-doctor-before-fix.json").read_text())
    wrong = {f["check"]: f["detail"] for f in before["findings"] if f["verdict"] == "mismatch"}
    assert not before["ok"] and sorted(wrong) == ["profile 0", "profile 14", "profile 15", "profile 5", "profile 9"]
    assert all("memorySizeMB" in d for d in wrong.values())
    after = json.loads((FIXTURES / "h200-580.159.04-doctor.json").read_text())
    assert after["ok"] and {f["verdict"] for f in after["findings"]} == {"ok", "info"}
    assert any(f["check"] == "placements 9" and f["verdict"] == "ok" for f in after["findings"])


@pytest.mark.integration
def test_gpustat_sees_the_simulated_fleet(tmp_path: Path) -> None:
    if shutil.which("gpustat") is None and subprocess.run([sys.executable, "-c", "import gpustat"]).returncode:
        pytest.skip("gpustat is not installed (it is in the test extra)")
    m = Migctl(tmp_path, "dgx-h100")
    assert m("apply", str(PROFILES / "day.yaml")).code == 0
    p = subprocess.run([sys.executable, "-m", "migd.sim.cli", "exec", "--sim-state", str(m.state), "--",
                        sys.executable, "-m", "gpustat", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert {g["name"] for g in doc["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert {g["memory.total"] for g in doc["gpus"]} == {81559}  # MiB, as a real H100 80GB HBM3 reports
    uuids = {g.uuid for g in StateStore(m.state).read().gpus}
    assert {g["uuid"] for g in doc["gpus"]} == uuids
    assert doc["driver_version"] == StateStore(m.state).read().driver_version


def test_doctor_names_the_unconfirmed_catalog_facts_of_a_newer_gpu(tmp_path: Path) -> None:
    """On a B200 the catalog's placements are assumed and some rows derived: doctor says so, so an
    operator knows which of its comparisons test a guess (and a real B200's table then decides)."""
    m = Migctl(tmp_path, "hgx-b200")
    doc = m("doctor", "-o", "json").json()
    notes = [f["detail"] for f in doc["findings"] if f["check"] == "catalog" and f["gpu"] == 0]
    assert len(notes) == 1 and "placements assumed" in notes[0] and "3g.90gb: not observed" in notes[0]
    assert doc["ok"]  # the simulated driver serves the catalog's table: no difference
    m_h100 = Migctl(tmp_path / "h", "single-h100")
    (note,) = [f["detail"] for f in m_h100("doctor", "-o", "json").json()["findings"] if f["check"] == "catalog"]
    assert "placements assumed" not in note  # observed on an H100 80GB: only the CI split is assumed


def test_a_memory_size_that_moves_with_the_driver_is_said_not_failed() -> None:
    """memorySizeMB differs by driver (an H200's 2-slice profiles: 33024 MB on an older driver, 33280 on
    580.159.04): within 1% of the catalog it is information; further off, or with another field, a mismatch."""
    from types import SimpleNamespace

    from migd.catalog.models import MODELS
    from migd.hardware.doctor import Verdict, _profile

    p = next(x for x in MODELS["H200-141GB"].profiles if x.profile_id == 14)
    fields = {"sliceCount": p.slices, "instanceCount": p.instance_count, "multiprocessorCount": p.sm,
              "copyEngineCount": p.ce, "decoderCount": p.dec, "encoderCount": p.enc, "jpegCount": p.jpeg,
              "ofaCount": p.ofa, "name": f"MIG {p.name}".encode(), "id": p.profile_id}
    older = _profile(0, p, SimpleNamespace(**fields, memorySizeMB=33024))
    assert older.verdict is Verdict.INFO and "memorySizeMB 33024 (catalog 33280: within 1%" in older.detail
    assert _profile(0, p, SimpleNamespace(**fields, memorySizeMB=33280)).verdict is Verdict.OK
    assert _profile(0, p, SimpleNamespace(**fields, memorySizeMB=30000)).verdict is Verdict.MISMATCH
    fewer_sms = {**fields, "multiprocessorCount": p.sm - 2}
    assert _profile(0, p, SimpleNamespace(**fewer_sms, memorySizeMB=33024)).verdict is Verdict.MISMATCH
