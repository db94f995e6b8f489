"""mig-parted's own spec and device-id test cases, run through migd's reader: api/spec/v1
spec_test.go (TestSpec, TestMigConfigSpec) and pkg/types/device_test.go (TestNewDeviceIDFromString,
TestDeviceIDMatches) of mig-parted v0.15.0 (Apache-2.0), each case as mig-parted decides it.

Where migd is stricter it says so: an empty file is an error here (mig-parted reads "" as an empty
spec; `migctl apply` of an empty file is surely a mistake), and TestSpec's "valid-format-non-existent-
devices" entry (`"0g.0gb": 100`) is refused when read, not when applied (no GPU holds 100 instances)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from migd.errors import ValidationError
from migd.hardware.types import GpuInfo
from migd.profiles.loader import load_profile, mig_parted_configs
from migd.profiles.model import PciId


def _spec(doc: Any) -> str:
    return json.dumps(doc)


ENTRY = {"devices": "all", "mig-enabled": False}
SPECS = [  # TestSpec's Unmarshal cases: (description, spec, expected failure)
    ("Well formed", {"version": "v1", "mig-configs": {"all-disabled": [ENTRY]}}, False),
    ("Only version field", {"version": "v1"}, False),
    ("Well formed - wrong version", {"version": "v2", "mig-configs": {"all-disabled": [ENTRY]}}, True),
    ("Only version field - wrong versiomn", {"version": "v2"}, True),
    ("Missing version field", {"mig-configs": {"all-disabled": [ENTRY]}}, True),
    ("Erroneous field", {"bogus": "field", "version": "v1", "mig-configs": {"all-disabled": [ENTRY]}}, True),
    ("Empty 'mig-configs'", {"version": "v1", "mig-configs": {}}, True),
]


@pytest.mark.parametrize(("description", "doc", "fails"), SPECS, ids=[s[0] for s in SPECS])
def test_spec_test_unmarshal_cases(description: str, doc: dict[str, Any], fails: bool) -> None:
    try:
        names = mig_parted_configs("s.yaml", text=_spec(doc))
        for name in names:
            load_profile("s.yaml", config=name, text=_spec(doc))
    except ValidationError:
        assert fails, description
    else:
        assert not fails, description


WELL = {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 2}}
ENTRIES = [  # TestMigConfigSpec: (description, entry, expected failure); "Empty" ("") has no entry form
    ("Well formed", WELL, False),
    ("Well formed with filter", {"device-filter": "MODEL", **WELL}, False),
    ("Well formed with multi-filter", {"device-filter": ["MODEL1", "MODEL2"], **WELL}, False),
    ("Missing 'devices'", {"mig-enabled": True, "mig-devices": {"1g.5gb": 2}}, True),
    ("Missing 'mig-enabled'", {"devices": "all", "mig-devices": {"1g.5gb": 2}}, True),
    ("Missing 'mig-devices', enabled: false", {"devices": "all", "mig-enabled": False}, False),
    ("Missing 'mig-devices', enabled: true", {"devices": "all", "mig-enabled": True}, True),
    ("'mig-devices' formatted correctly", WELL, False),
    ("'mig-devices' formatted incorrectly", {**WELL, "mig-devices": {"bogus": 2}}, True),
    ("Erroneous field", {"bogus": "field", "devices": "all", "mig-enabled": False}, True),
    ("'devices' string == all", {"devices": "all", "mig-enabled": False}, False),
    ("'devices' string != all", {"devices": "bogus", "mig-enabled": False}, True),
    ("'devices' []int", {"devices": [0, 1, 2, 3], "mig-enabled": False}, False),
    ("'devices' not string for []int", {"devices": {}, "mig-enabled": False}, True),
]


@pytest.mark.parametrize(("description", "entry", "fails"), ENTRIES, ids=[e[0] for e in ENTRIES])
def test_mig_config_spec_cases(description: str, entry: dict[str, Any], fails: bool) -> None:
    text = _spec({"version": "v1", "mig-configs": {"c": [entry]}})
    try:
        load_profile("s.yaml", config="c", text=text)
    except ValidationError:
        assert fails, description
    else:
        assert not fails, description


def _filter(text: str) -> tuple[PciId | None, list[str]]:
    p = load_profile("s.yaml", config="c", text=_spec(
        {"version": "v1", "mig-configs": {"c": [{"device-filter": text, "devices": "all", "mig-enabled": False}]}}))
    pci = p.sections[0].selector.pci
    return (pci[0] if pci else None), list(p.warnings)


@pytest.mark.parametrize(("text", "want", "error"), [  # TestNewDeviceIDFromString
    ("0x25B610DE", PciId(0x25B610DE), ""),
    ("0x25B610DE:0x14A910DE", PciId(0x25B610DE, 0x14A910DE), ""),
    ("not-a-device-id", None, "is not a PCI device id"),
    ("0x25B610DE:not-a-subsystem", None, "is not a PCI device id"),
    ("0x25B610DE:0x14A910DE:extra", None, "is not a PCI device id"),
])
def test_device_id_from_string_cases(text: str, want: PciId | None, error: str) -> None:
    got, warnings = _filter(text)
    assert got == want
    assert bool(warnings) == bool(error) and all(error in w for w in warnings)


def _gpu(device: int, subsystem: int) -> GpuInfo:
    return GpuInfo(index=0, uuid="GPU-x", name="x", pci_bus_id="", pci_device_id=device, architecture=8,
                   memory_total_bytes=1, mig_current=True, mig_pending=True, model=None, pci_subsystem_id=subsystem)


A16, A2 = _gpu(0x25B610DE, 0x14A910DE), _gpu(0x25B610DE, 0x157E10DE)


@pytest.mark.parametrize(("name", "flt", "hardware", "want"), [  # TestDeviceIDMatches
    ("primary only filter matches same primary id", PciId(0x25B610DE), A16, True),
    ("subsystem filter matches exact hardware", PciId(0x25B610DE, 0x14A910DE), A16, True),
    ("subsystem filter rejects sibling subsystem", PciId(0x25B610DE, 0x14A910DE), A2, False),
    ("subsystem filter does not match hardware with unknown subsystem", PciId(0x25B610DE, 0x14A910DE),
     _gpu(0x25B610DE, 0), False),
    ("zero subsystem filter matches hardware with unknown subsystem", PciId(0x25B610DE, 0), _gpu(0x25B610DE, 0),
     True),
    ("different primary id does not match", PciId(0x1E3010DE), A16, False),
])
def test_device_id_matches_cases(name: str, flt: PciId, hardware: GpuInfo, want: bool) -> None:
    assert flt.matches(hardware) is want, name


def test_spec_test_document_loads_every_config() -> None:
    """TestSpec's document (its model-name filters match no GPU, with a warning each); the
    "valid-format-non-existent-devices" entry ("0g.0gb": 100) is the one migd refuses when read."""
    f = "A100-SXM4-40GB"
    balanced = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"device-filter": f, "devices": "all", "mig-enabled": False}],
        "all-1-slice": [{"device-filter": f, "devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
        "all-2-slice": [{"device-filter": f, "devices": "all", "mig-enabled": True, "mig-devices": {"2g.10gb": 3}}],
        "all-3-slice": [{"device-filter": f, "devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
        "all-balanced-slices": [{"device-filter": f, "devices": "all", "mig-enabled": True, "mig-devices": balanced}],
        "half-disabled-half-balanced-slices": [
            {"device-filter": f, "devices": [0, 1, 2, 3], "mig-enabled": False},
            {"device-filter": f, "devices": [4, 5, 6, 7], "mig-enabled": True, "mig-devices": balanced}],
        "multi-device-filter": [
            {"device-filter": [f, "A100-PCIE-40GB"], "devices": [0, 1, 2, 3], "mig-enabled": False},
            {"device-filter": [f, "A100-PCIE-40GB"], "devices": [4, 5, 6, 7], "mig-enabled": True,
             "mig-devices": balanced}],
    }
    text = _spec({"version": "v1", "mig-configs": configs})
    assert mig_parted_configs("s.yaml", text=text) == list(configs)
    for name in configs:
        profile = load_profile("s.yaml", config=name, text=text)
        assert profile.warnings and not any(s.selector.matches(A16) for s in profile.sections)
    bad = _spec({"version": "v1", "mig-configs": {"valid-format-non-existent-devices": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"0g.0gb": 100}}]}})
    with pytest.raises(ValidationError, match="at most"):
        load_profile("s.yaml", config="valid-format-non-existent-devices", text=bad)


@pytest.mark.parametrize("value", ["!!bool maybe", "!!bool ''"])
def test_a_tag_of_bool_on_a_word_that_is_no_boolean_is_refused_not_read_as_false(value: str) -> None:
    """``mig-enabled: !!bool maybe`` was read as false: an apply of it destroyed every instance and
    turned MIG off.  Go's YAML reader refuses it as no bool; so does migd, naming the line."""
    text = f"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: {value}\n      mig-devices: {{}}\n"
    with pytest.raises(ValidationError, match=r"f.yaml:5:20: mig-configs.c\[0\].mig-enabled: must be true or false"):
        load_profile("f.yaml", config="c", text=text)
    assert load_profile("f.yaml", config="c", text=text.replace(value, "!!bool off")).sections
