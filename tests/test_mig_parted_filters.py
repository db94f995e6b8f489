"""mig-parted's device filters as mig-parted reads them.

``MigConfigSpec.MatchesDeviceFilter`` (api/spec/v1/helpers.go, v0.15.0): an empty filter matches every
device; an entry that is not a PCI device id parses (``types.NewDeviceIDFromString`` fails, its zero
value matches no GPU) and the config is still used.  The cases below are helpers_test.go's
``TestMigConfigSpecMatchesDeviceFilter`` and spec_test.go's filter cases, transcribed (Apache-2.0)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from migd.errors import ValidationError
from migd.hardware.types import GpuInfo
from migd.profiles.loader import load_profile
from tests.helpers import MIGCTL

# helpers_test.go: h100 := types.NewDeviceIDWithSubsystem(0x2330, 0x10DE, 0x16C0, 0x10DE)
H100 = GpuInfo(index=0, uuid="GPU-x", name="NVIDIA H100 80GB HBM3", pci_bus_id="", pci_device_id=0x233010DE,
               architecture=9, memory_total_bytes=80 << 30, mig_current=True, mig_pending=True, model=None,
               pci_subsystem_id=0x16C010DE)
CASES = [  # (name in helpers_test.go, device-filter as YAML, matches the H100)
    ("empty filter matches all devices", '""', True),
    ("primary-only filter matches subsystem-aware hardware", '"0x233010DE"', True),
    ("matching subsystem filter matches hardware", '"0x233010DE:0x16C010DE"', True),
    ("sibling subsystem filter does not match hardware", '"0x233010DE:0x16C110DE"', False),
    ("multiple filters stop at a matching subsystem entry", '["0x233010DE:0x16C110DE", "0x233010DE:0x16C010DE"]',
     True),
    ("malformed filters with extra separators do not match", '"0x233010DE:0x16C010DE:extra"', False),
]
SPEC = """version: v1
mig-configs:
  c:
    - device-filter: {filter}
      devices: all
      mig-enabled: true
      mig-devices: {{"1g.5gb": 2}}
"""


@pytest.mark.parametrize(("name", "filt", "want"), CASES, ids=[c[0] for c in CASES])
def test_helpers_test_device_filter_cases(name: str, filt: str, want: bool) -> None:
    profile = load_profile("f.yaml", config="c", text=SPEC.format(filter=filt))
    assert profile.sections[0].selector.matches(H100) is want
    assert bool(profile.warnings) == ("extra" in filt)


@pytest.mark.parametrize("filt", ['"MODEL"', '["MODEL1", "MODEL2"]'], ids=["with filter", "with multi-filter"])
def test_spec_test_well_formed_filters_parse_and_match_nothing(filt: str) -> None:
    """spec_test.go: "Well formed with filter" / "... multi-filter" must parse (expectedFailure false)."""
    profile = load_profile("f.yaml", config="c", text=SPEC.format(filter=filt))
    assert not profile.sections[0].selector.matches(H100)
    assert len(profile.warnings) == filt.count("MODEL")
    assert profile.warnings[0].startswith("f.yaml:4:") and "as in mig-parted, this filter matches no GPU" in \
        profile.warnings[0]


@pytest.mark.parametrize("filt", ["{a: 1}", "[0x233010DE, {a: 1}]", "[[0x233010DE]]"])
def test_a_filter_that_is_neither_a_string_nor_a_list_of_strings_is_refused(filt: str) -> None:
    """mig-parted's MigConfigSpec refuses it when it reads the file; migd read a mapping as no filter,
    and so applied the config to every GPU without a word."""
    with pytest.raises(ValidationError) as e:
        load_profile("f.yaml", config="c", text=SPEC.format(filter=filt))
    assert e.value.file == "f.yaml" and "device-filter" in e.value.field and \
        e.value.message == "must be a string or a list of strings, as mig-parted reads it", e.value


def _migctl(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MIGCTL, "--sim", "dgx-h100", "--sim-state", str(tmp / "s.json"),
                           "--state-dir", str(tmp / "state"), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_migctl_uses_a_file_with_a_model_name_filter_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("version: v1\nmig-configs:\n  night:\n"
                    "    - device-filter: A100-SXM4-40GB\n      devices: all\n      mig-enabled: true\n"
                    "      mig-devices: {\"1g.10gb\": 7}\n"
                    "    - device-filter: \"0x233010DE:0x16C010DE\"\n      devices: all\n      mig-enabled: true\n"
                    "      mig-devices: {\"7g.80gb\": 1}\n")
    warning = (f"warning: {path}:4:22: mig-configs.night[0].device-filter: 'A100-SXM4-40GB' is not a PCI device "
               "id like 0x20B010DE or 0x233010DE:0x16C010DE: as in mig-parted, this filter matches no GPU")
    plan = _migctl(tmp_path, "plan", str(path), "--config", "night")
    assert plan.returncode == 0 and plan.stderr.splitlines() == [warning], plan
    assert "GPU 0-7 (H100-SXM5-80GB): 7g.80gb" in plan.stdout  # the second entry matched every H100
    check = _migctl(tmp_path, "validate", str(path))
    assert check.returncode == 0 and warning in check.stderr.splitlines(), check


# 8-GPU boards: the example's device indexes 0-7 all exist (on a smaller node validate --gpus N calls an
# index beyond it an error, where plan leaves that section without a GPU).
FLEETS = {"dgx-a100": "A100-SXM4-80GB", "dgx-a100-40gb": "A100-SXM4-40GB", "dgx-h100": "H100-SXM5-80GB",
          "hgx-h200": "H200-141GB"}


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_validate_agrees_with_plan_on_index_listed_configs(tmp_path: Path, fleet: str) -> None:
    """Issue 31, item 2: `custom-config` (devices by index) was "ok on all 27 models" while plan on a DGX
    A100 80GB refused its 1g.5gb.  A config is valid on a model only if every section that can meet one of
    its GPUs is; validate's verdict for each model is what plan does on a node of it."""
    from migd.profiles.validate import check_file
    from tests.helpers import REFERENCE, Migctl
    path = REFERENCE / "mig-parted-example-config.yaml"
    from migd.sim.fleets import FLEETS as SIZES
    check = check_file(path, len(SIZES[fleet]))  # (as `migctl validate --sim FLEET` checks it)
    m = Migctl(tmp_path, fleet)
    model = FLEETS[fleet]
    for name, _ in check.configs:
        valid, invalid = check.models[name]
        r = m("plan", str(path), "--config", name)
        assert (r.code == 0) is (model in valid), (name, model, r.err)
        assert (r.code == 2) is (model in invalid), (name, model, r.err)
    assert (model in check.models["custom-config"][0]) is (model == "A100-SXM4-40GB")
