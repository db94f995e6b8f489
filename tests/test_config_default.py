"""NVIDIA's own config-default.yaml, every named config planned on every GPU model it targets,
and mig-parted's packing of mixed compute-instance profiles (pkg/mig/config/config.go)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from migd.catalog.models import MODELS, GpuModel
from migd.hardware.types import HardwareError
from migd.plan.offline import fake_gpu
from migd.plan.planner import plan_gpu
from migd.profiles.loader import load_profile, mig_parted_configs
from migd.profiles.model import GpuSection
from migd.profiles.resolve import resolve_section
from migd.profiles.validate import check_section
from migd.sim.backend import sim_backend
from tests.helpers import REFERENCE, Migctl, check_golden

DEFAULT = REFERENCE / "mig-parted-config-default.yaml"
# Names no catalog model offers: the earlier HGX GB200 names (facts gpus.GB200 notes: names changed
# with the driver, ids did not).  mig-parted accepts them and lets the GPU's table decide; so does migd.
UNTARGETED = {"all-3g.95gb", "all-4g.95gb", "all-7g.189gb"}


def _targets(section: GpuSection) -> list[GpuModel]:
    """The models a mig-parted entry applies to: its device filter, or (devices: all) every model
    whose table offers each named profile, as mig-parted would succeed there."""
    return [MODELS[k] for k in check_section(section)] if section.mig else \
        [m for m in MODELS.values() if section.selector.pci_device_ids is None
         or m.pci_device_id in section.selector.pci_device_ids]


def _render(model: GpuModel, section: GpuSection) -> str:
    plan = plan_gpu(fake_gpu(model, mig=False), resolve_section(section, model), [])
    names = {p.profile_id: p for p in model.profiles}
    if not section.mig:
        return "MIG off"
    parts = []
    for t in plan.targets:
        gi = names[t.gi_profile_id]
        cis = "+".join(f"{c.name.split('.')[0] if not c.default else 'full'}@{pl.start}"
                       for c, pl in ((gi.ci_by_id(pid), pl) for pid, pl in t.ci) if c is not None)
        parts.append(f"{gi.name}@{t.placement}[{cis}]")
    return " ".join(parts) or "MIG on, no instances"


def _counts(model: GpuModel, section: GpuSection) -> Counter[str]:
    """What the plan creates, as mig-parted names: GI name for a full CI, else '<c>c.<GI name>'."""
    plan = plan_gpu(fake_gpu(model, mig=False), resolve_section(section, model), [])
    out: Counter[str] = Counter()
    for t in plan.targets:
        gi = model.profile_by_id(t.gi_profile_id)
        assert gi is not None
        for pid, _ in t.ci:
            ci = gi.ci_by_id(pid)
            assert ci is not None
            out[ci.name] += 1
    return out


@pytest.mark.integration
def test_every_named_config_plans_on_every_model_it_targets() -> None:
    raw = yaml.safe_load(DEFAULT.read_text())["mig-configs"]
    lines, untargeted = [], set()
    assert len(mig_parted_configs(DEFAULT)) == len(raw) == 81
    for name in mig_parted_configs(DEFAULT):
        profile = load_profile(DEFAULT, config=name)
        hit = False
        for section, entry in zip(profile.sections, raw[name], strict=True):
            for model in _targets(section):
                hit = True
                lines.append(f"{name:22} {model.key:30} {_render(model, section)}")
                want = Counter({k: v for k, v in (entry.get("mig-devices") or {}).items() if v})
                assert _counts(model, section) == want, (name, model.key)
        if not hit:
            untargeted.add(name)
    assert untargeted == UNTARGETED
    check_golden("config-default-plans.txt", "\n".join(lines) + "\n")


def test_device_filtered_configs_reach_the_models_nvidia_names() -> None:
    """all-balanced has one entry per GPU family; each device id lands in exactly one entry."""
    profile = load_profile(DEFAULT, config="all-balanced")
    seen: Counter[str] = Counter()
    for section in profile.sections:
        for model in _targets(section):
            seen[model.key] += 1
    assert set(seen) == set(MODELS) and set(seen.values()) == {1}


PACKING = """version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: true
      mig-devices: {"4c.7g.40gb": 1, "1c.7g.40gb": 3}
  full-and-split:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.20gb": 3, "3g.20gb": 1}
  overflow:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.2g.10gb": 3}
  two-sizes:
    - devices: all
      mig-enabled: true
      mig-devices: {"2c.7g.40gb": 2, "3c.7g.40gb": 1}
  two-full:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
"""


@pytest.mark.parametrize("config,groups", [
    ("mixed", [["4c", "1c", "1c", "1c"]]),  # one 7g GI, as mig-parted reuses the last GI
    ("full-and-split", [["3g"], ["1c", "1c", "1c"]]),  # a full 3c leaves no room: a new GI
    ("overflow", [["1c", "1c"], ["1c"]]),  # a 2g holds two 1c CIs
    ("two-sizes", [["3c", "2c", "2c"]]),  # Flatten order: 3c first, then both 2c fit beside it
    ("two-full", [["3g"], ["3g"]]),
])
def test_mixed_ci_profiles_pack_as_mig_parted_packs_them(tmp_path: Path, config: str, groups: list[list[str]]) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(PACKING)
    model = MODELS["A100-SXM4-40GB"]
    layout = resolve_section(load_profile(f, config=config).sections[0], model)
    got = [[c.name.split(".")[0] for c in d.cis] for d in layout.instances]
    assert got == groups


def test_mixed_ci_config_applies_as_one_gpu_instance(tmp_path: Path) -> None:
    """Through the real apply path on the simulator: one 7g GI holding four CIs, and assert agrees."""
    f = tmp_path / "c.yaml"
    f.write_text(PACKING.replace("7g.40gb", "7g.80gb"))
    m = Migctl(tmp_path, "single-a100")
    assert m("apply", str(f), "--config", "mixed").code == 0
    ((gi,),) = m.layout()
    assert (gi[0], gi[1], sorted(gi[2])) == ("7g.80gb", 0, ["1c.7g.80gb"] * 3 + ["4c.7g.80gb"])
    assert m("assert", str(f), "--config", "mixed").code == 0
    assert m("assert", str(f), "--config", "two-sizes").code == 1


ME_ALL = """version: v1
mig-configs:
  hog-and-plain:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.24gb+me.all": 1, "1g.24gb": 1}
  hog-and-no-me:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.24gb+me.all": 1, "1g.24gb-me": 2}
"""


def test_all_media_engines_profile_admits_only_no_me_neighbours(tmp_path: Path) -> None:
    """nvml.h on *_SLICE_ALL_ME: "prevents allocation of all but _NO_ME profiles" - refused before
    any hardware is touched, and the simulated driver refuses it too."""
    f = tmp_path / "c.yaml"
    f.write_text(ME_ALL)
    m = Migctl(tmp_path, "rtx-pro-6000")
    r = m("apply", str(f), "--config", "hog-and-plain")
    assert r.code == 2 and "takes every media engine" in r.err and "\n" not in r.err.strip()
    assert not any(g for g in m.layout())  # nothing changed
    assert m("apply", str(f), "--config", "hog-and-no-me").code == 0
    assert sorted(p for p, _, _ in m.layout()[0]) == ["1g.24gb+me.all"] + ["1g.24gb-me"] * 2
    model = MODELS["RTX-PRO-6000-Blackwell-Server"]
    plain, no_me = model.profile_by_name("1g.24gb"), model.profile_by_name("1g.24gb-me")
    assert plain is not None and no_me is not None
    free = next(pl for pl in plain.placements if pl.start not in {s for _, s, _ in m.layout()[0]})
    backend = sim_backend(m.state, "rtx-pro-6000")
    try:
        with pytest.raises(HardwareError) as e:
            backend.create_gpu_instance(0, plain.profile_id, free)
        assert "INSUFFICIENT_RESOURCES" in str(e.value)
        backend.create_gpu_instance(0, no_me.profile_id, free)  # the same slot takes a -me GI
    finally:
        backend.close()
