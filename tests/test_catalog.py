"""The catalog must say exactly what mig-facts.yaml says (tests/fixtures/reference/: a copy, sources in SOURCES.md),
except where a real GPU of the model answered otherwise: its recording (bench/nvml_probe.py, tests/fixtures/)
outranks the facts' reading of other captures."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from migd.catalog.models import MODELS, GpuModel, model_for

# catalog key -> facts key of its gpus entry
FACTS_KEY = {
    "A100-40GB-0x20B1": "A100-40GB-0x20B1", "PG506-96GB": "PG506-0x20B6", "H100-96GB": "H100-96GB-0x233D",
    "GH200-144GB": "GH200-144G-HBM3e", "B300": "B300-SXM6",
    "RTX-PRO-6000-Blackwell-Server": "RTX-PRO-6000-Blackwell-Server-Edition",
}
# entries whose profile table is one sentence ("same as ..."): the facts key of the table it names
SIBLING = {"A100-40GB-0x20B1": "A100-SXM4-40GB", "A100-80GB-PCIe": "A100-SXM4-80GB", "A800-80GB-PCIe": "A800-SXM4-80GB",
           "PG506-96GB": "GH200-96GB", "H100-PCIe-80GB": "H100-SXM5-80GB", "H800-SXM5-80GB": "H800-PCIe-80GB",
           "H100-96GB": "GH200-96GB"}
PLACEMENT_TABLE = {"seven_slice": "seven_slice_8_memory_slices", "a30": "a30_4_memory_slices"}
ROLE_NAMES = {"1g": 0, "1g+me": 7, "1g.2m": 9, "2g": 1, "3g": 2, "4g": 3, "7g": 4}
# facts field -> catalog attribute, for the values a row may carry
FIELDS = {"nvml_enum_value": "nvml_enum", "slice_count": "slices", "memory_slices": "memory_slices",
          "memory_size_mb": "memory_mib", "sm": "sm", "ce": "ce", "dec": "dec", "enc": "enc", "jpeg": "jpeg",
          "ofa": "ofa"}
DERIVABLE = ("memory_mib", "sm", "ce", "dec", "enc", "jpeg", "ofa")  # what the simulator needs a number for
# models recorded on a lent machine (MIG off, read-only): the driver's own profile table and memory
RECORDED = {"H100-SXM5-80GB": "h100-sxm5-580.159.04-probe.json", "H200-141GB": "h200-580.159.04-probe.json"}
PROBE_FIELDS = {"memory_mib": "memorySizeMB", "sm": "multiprocessorCount", "ce": "copyEngineCount",
                "dec": "decoderCount", "enc": "encoderCount", "jpeg": "jpegCount", "ofa": "ofaCount",
                "instance_count": "instanceCount", "slices": "sliceCount"}


def _recorded(key: str) -> dict[str, Any] | None:
    if key not in RECORDED:
        return None
    return dict(json.loads((Path(__file__).parent / "fixtures" / RECORDED[key]).read_text())["gpus"][0])


def _value(v: Any) -> tuple[Any, bool]:
    """(first value, marked unconfirmed) of a facts field."""
    if isinstance(v, dict):
        return _first(v.get("value")), bool(v.get("unconfirmed"))
    return _first(v), False


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) else v


def _facts_rows(facts: dict[str, Any], key: str) -> tuple[list[dict[str, Any]], bool]:
    """The facts rows of a model and whether they came from a sibling (the whole table unconfirmed)."""
    entry = facts["gpus"][FACTS_KEY.get(key, key)]
    rows = entry["gpu_instance_profiles"]
    if isinstance(rows, list):
        return rows, False
    text = rows if isinstance(rows, str) else rows["value"]
    sibling = facts["gpus"][SIBLING[key]]["gpu_instance_profiles"]
    listed = dict(re.findall(r"(\d+g\.\d+gb(?:\+me)?) x(\d)", text))
    if set(listed) != {r["name"] for r in sibling}:
        listed = {}  # the sentence lists another thing (e.g. an all-balanced layout), not the table
    return [{**r, "instance_count": int(listed.get(r["name"], r["instance_count"]))} for r in sibling], True


def _placements(facts: dict[str, Any], model: GpuModel, row: dict[str, Any], pid: int) -> list[list[int]]:
    if "placements" in row:
        return row["placements"]
    table = facts["placement_tables"][PLACEMENT_TABLE[model.family]]
    entry = next(v for k, v in table.items() if k.startswith(f"profile_id_{pid}_"))
    return [[s, entry["size"]] for s in entry["starts"]]


@pytest.mark.parametrize("key", sorted(MODELS))
def test_profiles_match_facts(facts: dict[str, Any], key: str) -> None:
    """Every observed value equals the facts; every value the facts lack is marked unconfirmed."""
    model = MODELS[key]
    rows, borrowed = _facts_rows(facts, key)
    assert [p.name for p in model.profiles] == [r["name"] for r in rows]
    if borrowed or any(r.get("ids_engines_placements_unconfirmed") for r in rows):
        assert model.unconfirmed, f"{key}: its table is borrowed, the catalog must say so"
    for p, r in zip(model.profiles, rows, strict=True):
        assert (p.profile_id, p.instance_count) == (r["profile_id"], r["instance_count"]), p.name
        marked = bool(p.unconfirmed) or borrowed or bool(r.get("ids_engines_placements_unconfirmed"))
        if r.get("unconfirmed") or r.get("id_unconfirmed"):
            assert marked, f"{key} {p.name}: unconfirmed in the facts, not in the catalog"
        for fact, ours in FIELDS.items():
            want, unsure = _value(r.get(fact))
            if want is None and fact == "memory_size_mb" and "memory_gib_lgip" in r:
                assert f"{p.memory_mib / 1024:.2f}" == _first(r["memory_gib_lgip"]).split()[0], p.name
            elif want is None:
                assert ours not in DERIVABLE or marked, f"{key} {p.name}: {ours} not in the facts, not marked"
            elif not (fact == "memory_size_mb" and _recorded(key)):  # (the driver's figure: below)
                assert getattr(p, ours) == want, (key, p.name, fact)
                assert marked or not unsure, (key, p.name, fact)
        real = _recorded(key)
        if real is not None:
            assert [[pl.start, pl.size] for pl in p.placements] == real["placements"][str(p.profile_id)], p.name
        else:
            assert [[pl.start, pl.size] for pl in p.placements] == _placements(facts, model, r, p.profile_id), p.name


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_a_recorded_gpu_outranks_the_facts(key: str) -> None:
    """Every GPU-instance profile the real driver listed, field by field, and its total memory (for the
    H200, five memory sizes differ from the facts' capture by another driver: the recording decides)."""
    model, real = MODELS[key], _recorded(key)
    assert real is not None and model.total_memory_mib == real["memory_total_mib"]
    listed = {row["id"]: row for row in real["profiles"].values() if isinstance(row, dict)}
    assert sorted(listed) == sorted(p.profile_id for p in model.profiles)
    for p in model.profiles:
        assert {ours: getattr(p, ours) for ours in PROBE_FIELDS} == \
            {ours: listed[p.profile_id][theirs] for ours, theirs in PROBE_FIELDS.items()}, p.name


@pytest.mark.parametrize("key", sorted(MODELS))
def test_identity_matches_facts(facts: dict[str, Any], key: str) -> None:
    model = MODELS[key]
    g = facts["gpus"][FACTS_KEY.get(key, key)]
    assert int(g["pci_device_id"], 16) == model.pci_device_id
    names, unsure = _value(g["nvml_name"]) if isinstance(g["nvml_name"], dict) else (g["nvml_name"], False)
    if names is None:  # not in the driver's name table: the catalog's made-up name must say so
        assert unsure and "NVML name" in model.identity_unconfirmed, key
    else:
        assert {model.nvml_name, *model.alt_names} == set(names if isinstance(names, list) else [names])
    assert model_for(pci_device_id=model.pci_device_id) is model
    assert model_for(name=model.nvml_name.removeprefix("NVIDIA ")) is model
    total, unsure = _value(g.get("total_memory_mib"))
    real = _recorded(key)
    if real is not None:
        total, unsure = real["memory_total_mib"], False
    if total is not None and not unsure:
        assert model.total_memory_mib == total, key
    else:  # a number the facts do not have: the catalog says where it came from
        assert "memory" in model.identity_unconfirmed, key


def test_every_device_id_of_nvidias_default_config_is_known(reference_dir: Path) -> None:
    text = (reference_dir / "mig-parted-config-default.yaml").read_text()
    ids = {int(x, 16) for x in re.findall(r"0x[0-9A-Fa-f]{8}", text)}
    assert len(ids) == 27
    assert {hex(i) for i in ids if model_for(pci_device_id=i) is None} == set()


def test_enum_to_profile_id_table(facts: dict[str, Any]) -> None:
    table = facts["nvml"]["profile_id_vs_enum"]
    enums = facts["nvml"]["gpu_instance_profile_enum"]
    for model in MODELS.values():
        if model.family == "gb202":
            continue  # RTX PRO 6000: its own ids, checked row by row against the facts above
        expect = table["a30"] if model.family == "a30" else table["seven_slice_boards"]
        got = {name: model.profile_by_enum(enums[name]).profile_id  # type: ignore[union-attr]
               for name in expect}
        assert got == expect, model.key


def test_ci_profiles_per_gi(facts: dict[str, Any]) -> None:
    cis = facts["gpus"]["A100-SXM4-40GB"]["compute_instance_profiles"]
    m = MODELS["A100-SXM4-40GB"]
    for gi_name in ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"):
        p = m.profile_by_name(gi_name)
        assert p is not None
        got = [(c.name, c.profile_id, c.instance_count, c.sm, c.default) for c in p.ci_profiles]
        want = [(c["name"], c["ci_profile_id"], c["instances"], c["sm"], bool(c.get("default"))) for c in cis[gi_name]]
        assert got == want


def feasible_multisets(model: GpuModel, roles: list[str]) -> set[tuple[tuple[str, int], ...]]:
    """Independent brute force: every set of non-overlapping placements within instance caps."""
    options = [(p.role, pl.start, pl.size) for p in model.profiles if p.role in roles for pl in p.placements]
    caps = {p.role: p.instance_count for p in model.profiles}
    out: set[tuple[tuple[str, int], ...]] = set()
    for n in range(1, 8):
        for combo in itertools.combinations(options, n):
            spans = sorted((s, s + z) for _, s, z in combo)
            if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
                continue
            counts = Counter(r for r, _, _ in combo)
            if any(c > caps[r] for r, c in counts.items()):
                continue
            out.add(tuple(sorted(counts.items())))
    return out


@pytest.mark.integration
def test_127_feasible_multisets(facts: dict[str, Any]) -> None:
    section = facts["combinations"]["seven_slice_boards_all_profiles_feasible_multisets"]
    sets = feasible_multisets(MODELS["A100-SXM4-80GB"], list(ROLE_NAMES))
    assert len(sets) == section["count_total"] == 127
    maximal = {s for s in sets if not any(s != t and all(dict(t).get(r, 0) >= c for r, c in s) for t in sets)}
    assert len(maximal) == section["count_maximal"]

    def parse(text: str) -> tuple[tuple[str, int], ...]:
        c: Counter[str] = Counter()
        for part in text.split(" + "):
            n, role = part.split("x", 1)
            c[role] += int(n)
        return tuple(sorted(c.items()))
    assert maximal == {parse(t) for t in section["maximal"]}
