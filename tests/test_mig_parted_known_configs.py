"""mig-parted's known configurations go through migd as mig-parted decides them.

mig-parted builds a config by trying orderings of its flattened devices until one can be created
(``iteratePermutationsUntilSuccess``), each ordering packing a device into the previous GI of its
profile while its CI fits.  All 923 configurations of known_configs_test.go's A100-SXM4-40GB group
(tests/mig_parted_port.py ports both the generator and SetMigConfig over the simulator's driver model)
are planned by migd: applied with the same GIs and CIs mig-parted ends with, or refused where every
ordering fails for mig-parted too (its generator lists 477 combinations no A100-40GB can hold)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from migd.catalog.models import MODELS
from migd.errors import ValidationError
from migd.plan.offline import fake_gpu
from migd.plan.planner import PlanError, plan_gpu
from migd.profiles.loader import load_profile
from migd.profiles.resolve import resolve_section
from migd.sim.state import StateStore
from tests.helpers import Migctl
from tests.mig_parted_port import known_configs, set_mig_config

A100_40GB = MODELS["A100-SXM4-40GB"]
SPEC = "version: v1\nmig-configs:\n  k:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {}\n"


def _migd(config: dict[str, int]) -> list[tuple[str, list[str]]] | None:
    """What migd plans for ``config`` on an empty A100-40GB, as (GI, CIs) pairs; None if it refuses."""
    try:
        profile = load_profile("k.yaml", config="k", text=SPEC.format(json.dumps(config)))
        layout = resolve_section(profile.sections[0], A100_40GB)
        plan_gpu(fake_gpu(A100_40GB), layout, [])
    except (ValidationError, PlanError):
        return None
    return sorted((d.gi.name, sorted(c.name for c in d.cis)) for d in layout.instances)


@pytest.mark.integration
def test_all_923_known_configurations_as_mig_parted_decides_them() -> None:
    configs = known_configs()
    assert len(configs) == 923
    applied = refused = 0
    for config in configs:
        want = set_mig_config(config)
        assert _migd(config) == want, config
        applied, refused = applied + (want is not None), refused + (want is None)
    assert (applied, refused) == (446, 477)


@pytest.mark.parametrize(("config", "valid"), [  # known_configs_test.go TestValidConfiguration
    ({}, True), ({"bogus": 1}, False), ({"bogus": 0}, False), ({"1g.5gb": 7}, True), ({"1g.5gb": 8}, False),
    ({"1g.5gb": 6}, True), ({"1g.5gb": 0}, False), ({"1g.5gb": 3, "2g.10gb": 2}, True),
    ({"1g.5gb": 2, "2g.10gb": 2}, True), ({"1g.5gb": 2, "2g.10gb": 1}, True), ({"1g.5gb": 4, "2g.10gb": 2}, False),
])
def test_valid_configuration_cases(config: dict[str, int], valid: bool) -> None:
    assert (_migd(config) is not None) is valid


def test_the_issues_example_is_applied_as_two_3g_gis_of_2c_and_1c(tmp_path: Path) -> None:
    """{"1c.3g.20gb": 2, "2c.3g.20gb": 2}: Flatten's own order needs three 3g GIs (refused before); the
    second ordering mig-parted tries packs [2c, 1c] twice.  Through migctl, on a simulated DGX A100 40GB."""
    path = tmp_path / "c.yaml"
    path.write_text(SPEC.replace("k:", "mixed:").format(json.dumps({"1c.3g.20gb": 2, "2c.3g.20gb": 2})))
    m = Migctl(tmp_path, "dgx-a100-40gb")
    r = m("apply", "--local", str(path), "--config", "mixed")
    assert r.code == 0, r.err
    gpu = StateStore(m.state).read().gpus[0]
    assert sorted(sorted(c.size for c in g.cis) for g in gpu.gis) == [[1, 2], [1, 2]]
    assert m("assert", str(path), "--config", "mixed").code == 0
