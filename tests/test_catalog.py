"""The catalog must say exactly what mig-facts.yaml says (tests/fixtures/reference/: a copy, sources in SOURCES.md)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from migd.hardware.catalog import MODELS, GpuModel, model_for

# catalog key -> facts key whose gpu_instance_profiles list it must equal
FACTS_KEY = {
    "A100-SXM4-40GB": "A100-SXM4-40GB", "A100-PCIE-40GB": "A100-SXM4-40GB",
    "A100-SXM4-80GB": "A100-SXM4-80GB", "A100-80GB-PCIe": "A100-SXM4-80GB",
    "A30-24GB": "A30-24GB", "H100-SXM5-80GB": "H100-SXM5-80GB", "H100-PCIe-80GB": "H100-SXM5-80GB",
    "H100-NVL-94GB": "H100-NVL-94GB", "H200-141GB": "H200-141GB",
}
ROLE_NAMES = {"1g": 0, "1g+me": 7, "1g.2m": 9, "2g": 1, "3g": 2, "4g": 3, "7g": 4}


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) else v


@pytest.mark.parametrize("key", sorted(MODELS))
def test_profiles_match_facts(facts: dict[str, Any], key: str) -> None:
    model = MODELS[key]
    rows = facts["gpus"][FACTS_KEY[key]]["gpu_instance_profiles"]
    assert [p.name for p in model.profiles] == [r["name"] for r in rows]
    table = facts["placement_tables"]["seven_slice_8_memory_slices" if model.family == "seven_slice"
                                      else "a30_4_memory_slices"]
    for p, r in zip(model.profiles, rows, strict=True):
        assert p.nvml_enum == r["nvml_enum_value"], p.name
        assert p.profile_id == r["profile_id"], p.name
        assert p.slices == r["slice_count"] and p.memory_slices == r["memory_slices"], p.name
        assert p.instance_count == r["instance_count"], p.name
        assert p.memory_mib == _first(r["memory_size_mb"]), p.name
        assert (p.sm, p.ce, p.dec, p.enc, p.jpeg, p.ofa) == (r["sm"], r["ce"], r["dec"], r["enc"], r["jpeg"],
                                                             r["ofa"]), p.name
        expected = r.get("placements")
        if expected is None:  # H200: facts say "same as placement_tables.seven_slice_8_memory_slices"
            entry = next(v for k, v in table.items() if k.startswith(f"profile_id_{p.profile_id}_"))
            expected = [[s, entry["size"]] for s in entry["starts"]]
        assert [[pl.start, pl.size] for pl in p.placements] == expected, p.name


@pytest.mark.parametrize("key", sorted(MODELS))
def test_identity_matches_facts(facts: dict[str, Any], key: str) -> None:
    model = MODELS[key]
    fk = {"A100-PCIE-40GB": None, "A100-80GB-PCIe": "A100-80GB-PCIe"}.get(key, key)
    if fk is None:
        return  # only named in a note of the facts file; checked below
    g = facts["gpus"][fk]
    assert int(g["pci_device_id"], 16) == model.pci_device_id
    assert g["nvml_name"] == model.nvml_name
    assert model_for(pci_device_id=model.pci_device_id) is model
    assert model_for(name=model.nvml_name.removeprefix("NVIDIA ")) is model


def test_enum_to_profile_id_table(facts: dict[str, Any]) -> None:
    table = facts["nvml"]["profile_id_vs_enum"]
    enums = facts["nvml"]["gpu_instance_profile_enum"]
    for model in MODELS.values():
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
