"""Turn a profile section into concrete GI/CI profiles of one GPU model.

Short forms (``1g`` .. ``7g``) resolve per model so one profile serves a mixed fleet; full
names are checked against the GPU's own table (``1g.10gb`` is the double-memory 1-slice
profile on A100-40GB but the plain one on A100-80GB).  A CI name such as ``1c.3g.40gb``
asks for that many compute instances, packed into as few parent GIs as their CI caps allow.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from operator import attrgetter

from migd.catalog.models import CiProfile, GiProfile, GpuModel, Placement
from migd.plan.firstfit import first_fit
from migd.plan.requests import DesiredInstance, DesiredLayout
from migd.profiles.model import GpuSection, InstanceSpec
from migd.yamlsrc import excerpt

Item = tuple[GiProfile, CiProfile]  # one MIG device of a mig-parted config
ROLES = ("1g", "1g+me", "2g", "2g+me", "3g", "4g", "7g", "1g+gfx", "1g-me", "1g+me.all", "2g+gfx", "2g-me",
         "2g+me.all", "4g+gfx")
_CI_NAME = re.compile(r"^([0-9]{1,2})c(?:\.(.+))?$", re.ASCII)


def allowed_names(model: GpuModel) -> list[str]:
    return [p.name for p in model.profiles] + [r for r in ROLES if model.profile_by_role(r)]


def gi_name_of(name: str) -> str:
    """The GPU-instance profile a MIG device name sits in: ``1c.3g.20gb`` -> ``3g.20gb``."""
    m = _CI_NAME.match(name)
    return m.group(2) if m and m.group(2) else name


def _gi_profile(spec: InstanceSpec, name: str, model: GpuModel) -> GiProfile | None:
    return model.profile_by_role(name) if name in ROLES else model.profile_by_name(name)


def _ci_profile(spec: InstanceSpec, gi: GiProfile, name: str) -> CiProfile:
    m = _CI_NAME.match(name)
    if m is not None and (m.group(2) is None or m.group(2) in (gi.name, gi.role)):
        ci = next((c for c in gi.ci_profiles if c.slices == int(m.group(1))), None)
    else:
        ci = gi.ci_by_name(name)
    if ci is None:
        raise spec.loc.error(f"compute instance {excerpt(name)} does not fit a {gi.name} GPU instance",
                             [c.name for c in gi.ci_profiles])
    return ci


def resolve_instances(spec: InstanceSpec, model: GpuModel) -> list[DesiredInstance]:
    name = spec.profile
    gi = _gi_profile(spec, name, model)
    if gi is not None:
        if spec.compute is None:
            cis: tuple[CiProfile, ...] = (gi.default_ci,)
        else:
            cis = tuple(_ci_profile(spec, gi, c) for c in spec.compute)
            for ci in set(cis):
                if cis.count(ci) > ci.instance_count:
                    raise spec.loc.error(f"{cis.count(ci)} x {ci.name} exceed the {ci.instance_count} a "
                                         f"{gi.name} GPU instance can hold")
            if sum(c.slices for c in cis) > gi.slices:
                raise spec.loc.error(f"compute instances need {sum(c.slices for c in cis)} compute slices; "
                                     f"{gi.name} has {gi.slices}")
        return [DesiredInstance(gi=gi, cis=cis, owner=spec.owner) for _ in range(spec.count)]
    m = _CI_NAME.match(name)
    parent = _gi_profile(spec, m.group(2), model) if m and m.group(2) else None
    if m is None or parent is None or spec.compute is not None:
        raise spec.loc.error(f"unknown profile {excerpt(name)} for {model.key}", allowed_names(model))
    ci = _ci_profile(spec, parent, name)
    per_gi = min(ci.instance_count, parent.slices // ci.slices)
    out = []
    left = spec.count
    while left > 0:
        n = min(per_gi, left)
        out.append(DesiredInstance(gi=parent, cis=(ci,) * n, owner=spec.owner))
        left -= n
    return out


def _cis_fit(gi: GiProfile, cis: list[CiProfile]) -> bool:
    """Whether these CIs can sit in one GI together: CI caps and non-overlapping placements."""
    if any(cis.count(c) > c.instance_count for c in set(cis)):
        return False

    def place(k: int, used: list[Placement]) -> bool:
        return k == len(cis) or any(place(k + 1, used + [p]) for p in cis[k].placements
                                    if not any(p.overlaps(u) for u in used))
    return place(0, [])


def _mig_parted_order(item: tuple[GiProfile, CiProfile]) -> tuple[int, int, str, str]:
    """mig-parted's MigConfig.Flatten order (pkg/types/mig_config.go): GI slices descending, then CI
    slices descending, then attributes descending (the name breaks ties: Go's sort is not stable)."""
    gi, ci = item
    attrs = gi.name.split("gb", 1)[1] if "gb" in gi.name else ""
    return (-gi.slices, -ci.slices, "".join(chr(0x10FFFF - ord(ch)) for ch in attrs), gi.name)


def _orderings(items: list[Item]) -> Iterator[list[Item]]:
    """Orderings of ``items`` in mig-parted's iteratePermutationsUntilSuccess order (pkg/mig/config/
    config.go): swap-based, each position trying the items from it onwards, an item equal to one
    already tried at that position skipped (mig-parted compares the same parsed profile)."""
    work = list(items)

    def walk(i: int) -> Iterator[list[Item]]:
        if i >= len(work):
            yield list(work)
            return
        for j in range(i, len(work)):
            if all(work[k] != work[j] for k in range(i, j)):
                work[i], work[j] = work[j], work[i]
                yield from walk(i + 1)
                work[i], work[j] = work[j], work[i]
    return walk(0)


def _grouped(order: list[tuple[GiProfile, CiProfile]]) -> list[tuple[GiProfile, list[CiProfile]]]:
    """One ordering as SetMigConfig builds it: a device whose GI profile equals the previous one's goes
    into that GI when its CI still fits there, otherwise a new GI is made."""
    groups: list[tuple[GiProfile, list[CiProfile]]] = []
    for gi, ci in order:
        if groups and groups[-1][0] == gi and _cis_fit(gi, groups[-1][1] + [ci]):
            groups[-1][1].append(ci)
        else:
            groups.append((gi, [ci]))
    return groups


def _gis_fit(model: GpuModel, gis: list[GiProfile]) -> bool:
    """Whether these GIs can all be created on an empty GPU: instance caps and memory-slice placements
    (the first-fit table holds every sequence that fits, in search order)."""
    if any(gis.count(g) > g.instance_count for g in set(gis)):
        return False
    return tuple(g.profile_id for g in sorted(gis, key=attrgetter("search_rank"))) in first_fit(model)


def _may_fit(model: GpuModel, items: list[Item]) -> bool:
    """Whether any ordering of ``items`` might fit: each GI profile needs at least as many GIs as its
    compute instances' slices fill (a GI's CIs share its slices), and those GIs at least their memory
    slices, compute slices and instance count.  Without this a config past the GPU walked every ordering
    (18 devices took minutes; seven distinct ones 5,040 orderings per catalog model, and migd's start and
    reload check every config of every file)."""
    need: dict[GiProfile, int] = {}
    for gi, ci in items:
        need[gi] = need.get(gi, 0) + ci.slices
    gis = {gi: -(-slices // gi.slices) for gi, slices in need.items()}
    return (all(n <= gi.instance_count for gi, n in gis.items())
            and sum(n * gi.memory_slices for gi, n in gis.items()) <= model.memory_slices
            and sum(n * gi.slices for gi, n in gis.items()) <= model.compute_slices)


def pack_mig_parted(section: GpuSection, model: GpuModel) -> list[DesiredInstance]:
    """GPU instances as mig-parted builds them from a config (pkg/mig/config/config.go SetMigConfig):
    every MIG device is flattened in Flatten order, and orderings of that list are tried in mig-parted's
    order until one can be created; in each, a device whose GI profile equals the previous one's goes
    into that GI when its CI still fits, otherwise a new GI is made.  So ``{"4c.7g.40gb": 1,
    "1c.7g.40gb": 3}`` is one 7g GI, ``3g.20gb: 2`` two GIs, and ``{"1c.3g.20gb": 2, "2c.3g.20gb": 2}``
    two 3g GIs of [2c, 1c] each (Flatten's own order would need three).  Where mig-parted lets the
    driver place, migd checks fit exactly; where no ordering fits, the Flatten order's grouping is
    returned for the planner to say why."""
    items: list[tuple[GiProfile, CiProfile]] = []
    for spec in section.instances:
        for d in resolve_instances(spec, model):
            items.extend((d.gi, c) for c in d.cis)
    items.sort(key=_mig_parted_order)
    fits = _may_fit(model, items)
    for order in _orderings(items) if fits else ():
        groups = _grouped(order)
        if _gis_fit(model, [gi for gi, _ in groups]):
            break
    else:
        groups = _grouped(items)
    return [DesiredInstance(gi=gi, cis=tuple(cis)) for gi, cis in groups]


def resolve_section(section: GpuSection, model: GpuModel, mode_only: bool = False) -> DesiredLayout:
    if not section.mig:
        return DesiredLayout(mig=False)
    if mode_only:
        return DesiredLayout(mig=True, mode_only=True)
    if section.mig_parted:
        return DesiredLayout(mig=True, instances=tuple(pack_mig_parted(section, model)))
    out: list[DesiredInstance] = []
    for spec in section.instances:
        out.extend(resolve_instances(spec, model))
    return DesiredLayout(mig=True, instances=tuple(out))
