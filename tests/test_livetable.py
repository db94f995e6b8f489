"""A GPU migd's catalog does not know: planned on the table its driver reports."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from migd.catalog.livetable import live_model
from migd.catalog.models import MODELS, GpuModel
from migd.sim.gpu import UNLISTED
from tests.helpers import Migctl


def _from_driver(m: GpuModel) -> GpuModel | None:
    """What live_model builds from the answers a driver with this table gives."""
    table = [(p.nvml_enum, SimpleNamespace(id=p.profile_id, sliceCount=p.slices, instanceCount=p.instance_count,
                                           multiprocessorCount=p.sm, copyEngineCount=p.ce, decoderCount=p.dec,
                                           encoderCount=p.enc, jpegCount=p.jpeg, ofaCount=p.ofa,
                                           memorySizeMB=p.memory_mib)) for p in m.profiles]
    by_id = {p.profile_id: p for p in m.profiles}
    return live_model(m.nvml_name, m.pci_device_id, m.architecture, m.total_memory_mib, table,
                      lambda pid: list(by_id[pid].placements))


@pytest.mark.parametrize("key", sorted(MODELS))
def test_the_driver_table_alone_gives_the_catalog_model(key: str) -> None:
    """Names follow go-nvlib's getMigMemorySizeGB rounding (facts naming.gb_rounding_algorithm_go_nvlib):
    from memorySizeMB and the GPU's total memory alone they come out as NVIDIA prints them."""
    m = MODELS[key]
    live = _from_driver(m)
    assert live is not None and live.unconfirmed
    assert [(p.name, p.profile_id, p.role, p.placements, p.instance_count) for p in live.profiles] == \
        [(p.name, p.profile_id, p.role, p.placements, p.instance_count) for p in m.profiles]
    assert (live.memory_slices, live.compute_slices) == (m.memory_slices, m.compute_slices)


PROFILE = """apiVersion: migd/v1
kind: Profile
name: {name}
gpus:
  - select: all
    mig: enabled
    instances:
{instances}
"""


def test_an_unlisted_gpu_is_planned_applied_and_changed_minimally(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    assert all(k not in MODELS for k in UNLISTED)  # the simulated driver knows it, the catalog does not
    m = Migctl(tmp_path, "unlisted")
    day, night = tmp_path / "day.yaml", tmp_path / "night.yaml"
    day.write_text(PROFILE.format(name="day", instances="      - {profile: 3g, owner: a}\n"
                                  "      - {profile: 1g.10gb, count: 4, owner: b}\n"))
    night.write_text(PROFILE.format(name="night", instances="      - {profile: 3g, owner: a}\n"
                                    "      - {profile: 3g.40gb, owner: c}\n"))
    r = m("apply", str(day))
    assert r.code == 0, r.err
    assert "not in migd's catalog; planning on the table its driver reports" in caplog.text
    assert m("assert", str(day)).code == 0
    assert m.layout()[0] == [("1g.10gb", s, ["1g.10gb"]) for s in range(4)] + [("3g.40gb", 4, ["3g.40gb"])]
    r = m("apply", str(night))
    assert r.code == 0 and "1 instance(s) kept" in r.out  # the 3g of tenant a stays where it is
    assert m.layout()[0] == [("3g.40gb", 0, ["3g.40gb"]), ("3g.40gb", 4, ["3g.40gb"])]
    doc = m("doctor").out
    assert "migd plans on the 7 profiles its driver reports" in doc
