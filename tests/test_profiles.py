"""Profile parsing and validation: every error names file, line, column and field."""

from __future__ import annotations

import re
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from migd.catalog.models import MODELS
from migd.errors import ValidationError
from migd.hardware.types import GpuInfo
from migd.profiles.loader import load_profile, mig_parted_configs
from migd.profiles.resolve import resolve_section
from migd.profiles.validate import check_file, check_section, validate_file
from tests.helpers import MIGCTL, PROFILES, REFERENCE, Migctl

GOOD = """\
apiVersion: migd/v1
kind: Profile
name: t
gpus:
  - select: all
    mig: enabled
    instances:
      - {profile: 1g, count: 7}
"""


def bad(tmp_path: Path, text: str) -> ValidationError:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    try:
        errors = [c for _, c in validate_file(f) if isinstance(c, ValidationError)]
    except ValidationError as e:
        errors = [e]
    assert errors and errors[0].file == str(f), errors
    return errors[0]


def test_examples_validate_for_every_seven_slice_model() -> None:
    selected = {k for k, m in MODELS.items() if m.family == "seven_slice"}
    assert len(selected) == 25  # the examples select every 7-slice model of the catalog by name
    for name in ("day", "night", "night-two", "balanced"):
        ((_, sections),) = validate_file(PROFILES / f"{name}.yaml")
        assert not isinstance(sections, ValidationError)
        assert set(sections[0]) == selected
        assert sections[1] == ["A30-24GB", "RTX-PRO-6000-Blackwell-Server"]


@pytest.mark.parametrize("text,line,col,field,needle", [
    (GOOD.replace("count: 7", "count: 7, colour: red"), 8, 33, "gpus[0].instances[0].colour", "unknown key"),
    (GOOD.replace("count: 7", "count: seven"), 8, 30, "gpus[0].instances[0].count", "must be an integer"),
    (GOOD.replace("count: 7", "count: 1000"), 8, 30, "gpus[0].instances[0].count", "at most 7"),
    (GOOD.replace("mig: enabled", "mig: maybe"), 6, 10, "gpus[0].mig", "not allowed"),
    (GOOD.replace("kind: Profile", "kind: Profle"), 2, 7, "kind", "not allowed"),
    (GOOD.replace("select: all", "select: some"), 5, 13, "gpus[0].select", "not allowed"),
    (GOOD.replace("profile: 1g", "profile: 9z"), 8, 19, "gpus[0].instances[0].profile", "not a MIG profile"),
    (GOOD.replace("name: t", "name: 'bad name'"), 3, 7, "name", "not a valid name"),
    (GOOD.replace("name: t", 'name: "t\\n"'), 3, 7, "name", "not a valid name"),  # ($ matched before a newline)
    (GOOD.replace("count: 7", 'count: 7, owner: "team\\n"'), 8, 40, "gpus[0].instances[0].owner", "not a valid owner"),
    (GOOD.replace("    instances:\n      - {profile: 1g, count: 7}\n", ""), None, None, "", None),
])
def test_structural_errors_are_located(tmp_path: Path, text: str, line: int | None, col: int | None, field: str,
                                       needle: str | None) -> None:
    if line is None:  # mig enabled with no instances is valid: validate_file returns (it does not raise)
        ok = tmp_path / "ok.yaml"
        ok.write_text(text)
        (name, checked), = validate_file(ok)
        assert name == "t" and isinstance(checked, dict) and checked, checked  # section -> valid models
        return
    e = bad(tmp_path, text)
    assert (e.line, e.column, e.field) == (line, col, field), str(e)
    assert needle in e.message
    assert f"p.yaml:{line}:{col}: {field}:" in str(e)


def test_unknown_key_lists_allowed_values(tmp_path: Path) -> None:
    e = bad(tmp_path, GOOD.replace("kind: Profile", "kind: Profile\nowner: x"))
    assert e.allowed == ["apiVersion", "kind", "name", "description", "gpus"]
    assert "(allowed: apiVersion, kind" in str(e)


def test_yaml_syntax_and_empty_files(tmp_path: Path) -> None:
    e = bad(tmp_path, "apiVersion: migd/v1\ngpus: [\n")
    assert e.line is not None and "invalid YAML" in e.message
    e = bad(tmp_path, "")
    assert "empty" in e.message
    e = bad(tmp_path, "- just\n- a list\n")
    assert e.message.startswith("not a migd profile (apiVersion: migd/v1, kind: Profile) or a mig-parted")


def test_unknown_profile_for_a_pinned_model_lists_allowed(tmp_path: Path) -> None:
    text = GOOD.replace("select: all", "select: {model: 'A100-SXM4-80GB'}").replace("profile: 1g,", "profile: 1g.5gb,")
    e = bad(tmp_path, text)
    assert "unknown profile '1g.5gb' for A100-SXM4-80GB" in e.message
    assert e.allowed is not None and "1g.10gb" in e.allowed and "3g.40gb" in e.allowed
    assert (e.line, e.field) == (8, "gpus[0].instances[0].profile")


def test_infeasible_layout_is_refused_with_reason(tmp_path: Path) -> None:
    text = GOOD.replace("      - {profile: 1g, count: 7}", "      - {profile: 3g, count: 2}\n      - {profile: 1g}")
    e = bad(tmp_path, text)
    assert "needs 9 memory slices" in e.message and "has 8" in e.message
    text = GOOD.replace("      - {profile: 1g, count: 7}", "      - {profile: 4g}\n      - {profile: 2g, count: 2}")
    e = bad(tmp_path, text)
    assert "needs 8 compute slices" in e.message and "has 7" in e.message
    text = GOOD.replace("count: 7}", "count: 2}").replace("profile: 1g,", "profile: 1g+me,")
    e = bad(tmp_path, text)
    assert "2 x 1g.5gb+me exceed the 1 instance(s)" in e.message


def test_full_names_resolve_per_model() -> None:
    text = GOOD.replace("profile: 1g, count: 7", "profile: 1g.10gb, count: 4")
    p = load_profile("x.yaml", text=text)
    a40 = resolve_section(p.sections[0], MODELS["A100-SXM4-40GB"]).instances
    a80 = resolve_section(p.sections[0], MODELS["A100-SXM4-80GB"]).instances
    assert {d.gi.profile_id for d in a40} == {15}  # double-memory REV2 profile on the 40GB part
    assert {d.gi.profile_id for d in a80} == {19}  # plain 1-slice profile on the 80GB part


def test_compute_instance_splits() -> None:
    text = GOOD.replace("profile: 1g, count: 7", "profile: 1c.3g.40gb, count: 4")
    p = load_profile("x.yaml", text=text)
    insts = resolve_section(p.sections[0], MODELS["H100-SXM5-80GB"]).instances
    assert [len(d.cis) for d in insts] == [3, 1]  # packed: 3 x 1c per 3g GI
    assert all(c.name == "1c.3g.40gb" for d in insts for c in d.cis)
    text = GOOD.replace("{profile: 1g, count: 7}", "{profile: 3g, compute: [2c, 1c]}")
    (d,) = resolve_section(load_profile("x.yaml", text=text).sections[0], MODELS["A100-SXM4-40GB"]).instances
    assert sorted(c.name for c in d.cis) == ["1c.3g.20gb", "2c.3g.20gb"]
    with pytest.raises(ValidationError, match="compute slices"):
        text = GOOD.replace("{profile: 1g, count: 7}", "{profile: 3g, compute: [2c, 1c, 1c]}")
        resolve_section(load_profile("x.yaml", text=text).sections[0], MODELS["A100-SXM4-40GB"])


def test_overlapping_sections_are_an_error(tmp_path: Path) -> None:
    text = GOOD + "  - select: {index: [0]}\n    mig: disabled\n"

    p = load_profile("x.yaml", text=text)
    gpu = GpuInfo(0, "GPU-x", "NVIDIA A100-SXM4-80GB", "", 0x20B210DE, 7, 0, True, True, MODELS["A100-SXM4-80GB"])
    with pytest.raises(ValidationError, match="also selected"):
        p.section_for(gpu)


@pytest.mark.parametrize("name", ["mig-parted-config-default.yaml", "mig-parted-example-config.yaml"])
def test_mig_parted_files_parse(name: str) -> None:
    path = REFERENCE / name
    configs = mig_parted_configs(path)
    assert "all-balanced" in configs and "all-disabled" in configs
    for cfg in configs:
        p = load_profile(path, config=cfg)
        assert p.kind == "mig-parted" and p.sections
        for s in p.sections:  # every section is valid for some catalog model, or filtered to unknown models
            try:
                check_section(s)
            except ValidationError as e:
                # RTX PRO / B200-class names: not in migd's catalog; must fail as "unknown profile", located
                assert "unknown profile" in e.message and e.line is not None, e
    with pytest.raises(ValidationError, match="choose a config"):
        load_profile(path)
    with pytest.raises(ValidationError, match="no config named"):
        load_profile(path, config="nope")


def test_mig_parted_all_balanced_filters_by_pci_id() -> None:
    """Each named model must exist and be matched (a renamed catalog key fails here, not silently)."""
    path = REFERENCE / "mig-parted-config-default.yaml"
    p = load_profile(path, config="all-balanced")
    want = {"A100-SXM4-40GB": [("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
            "A100-PCIE-40GB": [("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
            "A30-24GB": [("1g.6gb", 2), ("2g.12gb", 1)]}
    for key in [*want, "H100-PCIe-80GB"]:
        model = MODELS[key]
        hits = [s for s in p.sections if s.selector.pci_device_ids and model.pci_device_id in s.selector.pci_device_ids]
        assert hits, f"no all-balanced entry filters {key} by its PCI id"
        if key in want:
            assert [(i.profile, i.count) for i in hits[0].instances] == want[key], key
        else:
            assert key in check_section(hits[0])  # plans on the catalog's H100 PCIe


@pytest.mark.parametrize("text, words", [
    # PyYAML 6.0.4's libyaml scans ahead and stops at its own limit (flow level 1000) before
    # migd's event-level check (32) sees the 33rd level; either way: one line, file and line.
    ("apiVersion: migd/v1\nkind: Profile\nname: deep\ngpus: " + "[" * 3000 + "]" * 3000 + "\n",
     r"p\.yaml:4:(38: nested deeper than 32 levels|\d+: invalid YAML: exceeded maximum nesting depth)"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n", r"more than 20000 values \(aliases expanded\)"),
    ("# padding\n" * 20000, r"bytes; a profile or config is at most 131072"),
])
def test_hostile_yaml_is_refused_by_line_without_a_crash(tmp_path: Path, text: str, words: str) -> None:
    """A RecursionError used to escape validate (and kill the daemon on SIGHUP)."""
    f = tmp_path / "p.yaml"
    f.write_text(text)
    m = Migctl(tmp_path, "single-a100")
    r = m("validate", str(f))
    assert r.code == 2 and re.search(words, r.err) and "Traceback" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1


@pytest.mark.integration
def test_a_profile_of_gigabytes_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A 4 GiB file named by mistake was read whole into memory before its size was checked: under a 2 GiB
    address-space limit that was a MemoryError traceback.  Only the first 128 KiB and one byte are read."""
    f = tmp_path / "huge.yaml"
    with open(f, "wb") as out:
        out.truncate(4 << 30)  # sparse: no disk
    m = Migctl(tmp_path, "single-a100")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    cmd = ["--sim", m.fleet, "--sim-state", str(m.state), "--state-dir", str(m.state_dir), "validate", str(f)]
    r = subprocess.run([*MIGCTL, *cmd], capture_output=True, text=True, timeout=120, preexec_fn=limited)
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr == (f"error: {f}: more than 131072 bytes; a profile or config is at most 131072 (NVIDIA's "
                        "whole config-default.yaml is 12 KB)\n"), r.stderr



MIG_PARTED_CASES = """\
version: v1
mig-configs:
  enabled-none:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  disabled-empty:
    - devices: all
      mig-enabled: false
      mig-devices: {}
  typo-no-devices:
    - devices: all
      mig-enabled: true
  typo-all-zero:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 0
  disabled-with-devices:
    - devices: all
      mig-enabled: false
      mig-devices:
        "1g.10gb": 7
  subsystem:
    - device-filter: ["0x233010DE:0x16C010DE", "0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  two-entries:
    - devices: all
      mig-enabled: true
      mig-devices:
        "7g.80gb": 1
    - devices: [0]
      mig-enabled: false
"""


def test_mig_parted_files_are_read_as_mig_parted_reads_them(tmp_path: Path) -> None:
    """api/spec/v1/spec.go MigConfigSpec.UnmarshalJSON and pkg/types/mig_config.go AssertValidFormat:
    what they accept is read the same way, what they refuse is refused by line, and a typo can no
    longer be read as "destroy every instance"; every config is reported, not only the first."""
    f = tmp_path / "config.yaml"
    f.write_text(MIG_PARTED_CASES)
    results = dict(validate_file(f))
    errors = {k: v for k, v in results.items() if isinstance(v, ValidationError)}
    assert set(errors) == {"typo-no-devices", "typo-all-zero", "disabled-with-devices"}, results
    assert "needs mig-devices" in str(errors["typo-no-devices"]) and errors["typo-no-devices"].line == 13
    assert "all counts for all MIG profiles are 0" in str(errors["typo-all-zero"])
    assert "MIG devices included when mig-enabled is false" in str(errors["disabled-with-devices"])
    m = Migctl(tmp_path, "single-a100")
    r = m("validate", str(f))
    assert r.code == 2 and r.err.count("error:") == 3 and "enabled-none: ok" in r.out and "subsystem: ok" in r.out


def test_mig_parted_device_filters_with_subsystem_and_the_last_matching_entry() -> None:
    """pkg/types/device.go: with a subsystem all four ids must match; entries are walked in order and
    each match applied in turn (assert.go WalkSelectedMigConfigForEachGPU), so the last one holds."""
    p = load_profile("c.yaml", "subsystem", text=MIG_PARTED_CASES)
    h100 = GpuInfo(0, "GPU-x", "NVIDIA H100 80GB HBM3", "", 0x233010DE, 9, 0, True, True, MODELS["H100-SXM5-80GB"],
                   pci_subsystem_id=0x16C010DE)
    other_board = GpuInfo(0, "GPU-y", "NVIDIA H100 80GB HBM3", "", 0x233010DE, 9, 0, True, True,
                          MODELS["H100-SXM5-80GB"], pci_subsystem_id=0x17A610DE)
    assert p.section_for(h100) is not None and p.section_for(other_board) is None
    two = load_profile("c.yaml", "two-entries", text=MIG_PARTED_CASES)
    section = two.section_for(h100)
    assert section is not None and section.mig is False  # the later entry
    gpu1 = GpuInfo(1, "GPU-z", "NVIDIA H100 80GB HBM3", "", 0x233010DE, 9, 0, True, True, MODELS["H100-SXM5-80GB"])
    assert two.section_for(gpu1) is not None and two.section_for(gpu1).mig is True  # type: ignore[union-attr]


def test_a_mig_parted_config_past_the_gpus_compute_slices_is_refused_without_walking_its_orderings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """mig-parted tries orderings of a config's devices until one fits; one of 18 devices of six
    profiles (34 compute slices on a GPU of 7) walked every distinct ordering, tens of seconds each at
    validate, plan and migd's start.  No ordering fits more slices than the GPU has, so none is tried,
    and the error is the one the planner gives; a config that fits is still packed by its orderings."""
    import migd.profiles.resolve as resolve

    walked: list[int] = []
    real = resolve._orderings

    def counted(items: list[resolve.Item]) -> Iterator[list[resolve.Item]]:
        walked.append(len(items))
        return real(items)
    monkeypatch.setattr(resolve, "_orderings", counted)
    devices = '{"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1, "1g.20gb": 4}'
    text = ("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
            f"      mig-devices: {devices}\n")
    h100 = MODELS["H100-SXM5-80GB"]
    with pytest.raises(ValidationError, match="needs 41 memory slices, .* has 8"):
        check_section(load_profile("f.yaml", config="c", text=text).sections[0])
    assert walked == []
    seven = '{"1g.10gb": 1, "1g.10gb+me": 1, "1g.20gb": 1, "1c.2g.20gb": 1, "1c.3g.40gb": 1, "1c.4g.40gb": 1, ' \
            '"1c.7g.80gb": 1}'  # (7 compute slices, as the GPU has, in seven GIs of 22 memory slices: 5,040 walks)
    with pytest.raises(ValidationError, match="needs 22 memory slices, .* has 8"):
        check_section(load_profile("f.yaml", config="c", text=text.replace(devices, seven)).sections[0])
    assert walked == []
    fits = text.replace(devices, '{"1c.3g.40gb": 2, "2c.3g.40gb": 2}')  # (two 3g GIs of [2c, 1c]: orderings)
    laid = resolve_section(load_profile("f.yaml", config="c", text=fits).sections[0], h100)
    assert [len(d.cis) for d in laid.instances] == [2, 2] and walked == [4]


def test_a_mig_parted_file_is_parsed_a_few_times_not_once_per_config(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """validate and migd's profiles directory read a mig-parted file again for each of its configs: a
    file of 2,500 configs (within the 128 KiB a file may have) took minutes, past the unit's watchdog at
    start.  Now the file is parsed a fixed number of times, however many configs it has."""
    import yaml

    from migd.config.migdyaml import load_profiles

    parsed: list[int] = []
    real = yaml.compose

    def counted(*args: object, **kw: object) -> object:
        parsed.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(yaml, "compose", counted)
    configs = "".join(f"  c{i}:\n    - devices: all\n      mig-enabled: false\n" for i in range(200))
    (tmp_path / "parted.yaml").write_text(f"version: v1\nmig-configs:\n{configs}")
    checked = check_file(tmp_path / "parted.yaml")
    assert len(checked.configs) == 200 and not any(isinstance(r, ValidationError) for _, r in checked.configs)
    assert len(parsed) <= 3, len(parsed)
    parsed.clear()
    profiles, unusable = load_profiles(tmp_path, strict=False)
    assert len(profiles) == 200 and not unusable and profiles["parted.yaml#c199"].name == "c199"
    assert len(parsed) <= 3, len(parsed)


@pytest.mark.parametrize("select, said", [
    ("{index: []}", "gpus[0].select.index: lists nothing: it would select no GPU"),
    ("{uuid: ''}", "gpus[0].select.uuid: must not be empty: it would select no GPU"),
    ("{model: ['']}", "gpus[0].select.model[0]: must not be empty: it would select no GPU"),
    ("{pci_device_id: '٢٣٣٠١٠'}", "is not a PCI device id"),  # (Python's int read Arabic-Indic digits; Go's does not)
])
def test_a_selector_that_can_select_no_gpu_is_refused_when_read(select: str, said: str) -> None:
    """validate called these ok, and plan then refused the profile as matching no GPU."""
    text = f"apiVersion: migd/v1\nkind: Profile\nname: p\ngpus:\n  - select: {select}\n" \
           "    instances: [{profile: 1g, count: 1}]\n"
    with pytest.raises(ValidationError, match=re.escape(said)):
        load_profile("p.yaml", text=text)


@pytest.mark.parametrize("value", ['!!int ""', '!!int "-"', '!!int "0x"', '!!int "1:"'])
def test_an_explicit_int_tag_on_no_number_is_one_line(value: str) -> None:
    """PyYAML's own reading of ``!!int ""`` raises IndexError: validate printed a traceback, and a reload
    with such a profile in the profiles directory ended the running migd."""
    text = f"apiVersion: migd/v1\nkind: Profile\nname: p\ngpus:\n  - select: all\n    instances: [{{profile: 1g, " \
           f"count: {value}}}]\n"
    with pytest.raises(ValidationError, match=r"^p.yaml:6:38: gpus\[0\].instances\[0\].count: '.*' is not an integer$"):
        load_profile("p.yaml", text=text)
