"""migd profiles written as documents: the current state of a node (``migctl export``), and a loaded
profile (the what-if's suggestion); one writer of an instance entry for both."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from migd.catalog.models import CiProfile, GiProfile
from migd.hardware.inventory import Unreadable, read_all
from migd.hardware.ports import GpuReader
from migd.hardware.types import GpuInfo, GpuInstance
from migd.profiles.loader import API_VERSION
from migd.profiles.model import GpuSection, Profile, Selector

T = TypeVar("T")


def _instances(backend: GpuReader, g: GpuInfo) -> Iterator[tuple[GpuInstance, GiProfile, list[CiProfile]]]:
    """Each GI of a MIG GPU with its profile and its CI split: empty when it holds one full CI, or none
    (a GI without CIs is exported with its default CI: CUDA cannot use it otherwise)."""
    model = g.model
    if model is None:
        return
    for gi in backend.list_gpu_instances(g.index):
        prof = model.profile_by_id(gi.profile_id)
        if prof is None:
            continue
        cps = [c for c in (prof.ci_by_id(ci.profile_id) for ci in gi.compute_instances) if c]
        yield gi, prof, [] if not cps or cps == [prof.default_ci] else cps


def _each(backend: GpuReader, key: Callable[[GpuInfo], T]) -> tuple[dict[T, list[int]], list[Unreadable]]:
    """GPU indexes grouped by ``key`` (the layout); a GPU NVML cannot read (lost) is left out and returned."""
    keys, unreadable = read_all(backend, lambda g: (key(g), g.index), keep=lambda g: g.model is not None)
    groups: dict[T, list[int]] = {}
    for k, index in keys:
        groups.setdefault(k, []).append(index)
    return groups, unreadable


def export_profile(backend: GpuReader, owners: dict[str, dict[int, str]],
                   name: str = "exported") -> tuple[dict[str, Any], list[Unreadable]]:
    """The node as a migd profile, and the GPUs it leaves out because NVML cannot read them."""
    def layout(g: GpuInfo) -> tuple[Any, ...]:
        if not g.mig_current:
            return ("disabled",)
        items: Counter[tuple[str, tuple[str, ...] | None, str | None]] = Counter()
        for gi, prof, split in _instances(backend, g):
            compute = tuple(f"{c.slices}c" for c in split) if split else None
            items[(prof.name, compute, owners.get(g.uuid, {}).get(gi.placement.start))] += 1
        return ("enabled", tuple(sorted(items.items(), key=lambda kv: repr(kv))))
    groups, unreadable = _each(backend, layout)
    sections = []
    for key, indexes in groups.items():
        sec: dict[str, Any] = {"select": {"index": indexes}, "mig": key[0]}
        if key[0] == "enabled":
            sec["instances"] = [_instance(prof, n, owner, compute) for (prof, compute, owner), n in key[1]]
        sections.append(sec)
    return {"apiVersion": API_VERSION, "kind": "Profile", "name": name,
            "description": "exported from the current GPU state", "gpus": sections}, unreadable


def export_mig_parted(backend: GpuReader, name: str = "exported") -> tuple[dict[str, Any], list[Unreadable]]:
    """The current state as a mig-parted config (``version: v1``): GPUs with the same layout share an
    entry; ``mig-devices`` counts GI profiles, or CI profiles for a GI split into several CIs (mig-parted
    keeps no placements and no owners, so neither is written)."""
    def key(g: GpuInfo) -> tuple[bool, tuple[tuple[str, int], ...]]:
        counts: Counter[str] = Counter()
        if g.mig_current:
            for _, prof, split in _instances(backend, g):
                counts.update([c.name for c in split] or [prof.name])
        return g.mig_current, tuple(sorted(counts.items()))
    groups, unreadable = _each(backend, key)
    entries = []
    for (mig, counts_), indexes in groups.items():
        entry: dict[str, Any] = {"devices": indexes, "mig-enabled": mig}
        if mig:
            entry["mig-devices"] = dict(counts_)
        entries.append(entry)
    return {"version": "v1", "mig-configs": {name: entries}}, unreadable


def profile_doc(profile: Profile, name: str, description: str) -> dict[str, Any]:
    """A loaded profile as the document that loads back to it (its sections, selectors, owners, splits)."""
    return {"apiVersion": API_VERSION, "kind": "Profile", "name": name, "description": description,
            "gpus": [_section(s) for s in profile.sections]}


def _section(s: GpuSection) -> dict[str, Any]:
    out: dict[str, Any] = {"select": _selector(s.selector), "mig": "enabled" if s.mig else "disabled"}
    if s.mig and s.instances:
        out["instances"] = [_instance(i.profile, i.count, i.owner, i.compute) for i in s.instances]
    return out


def _selector(sel: Selector) -> Any:
    out: dict[str, Any] = {}
    if sel.indexes is not None:
        out["index"] = list(sel.indexes)
    if sel.uuids is not None:
        out["uuid"] = list(sel.uuids)
    if sel.models is not None:
        out["model"] = list(sel.models)
    if sel.pci is not None:
        out["pci_device_id"] = [str(p) for p in sel.pci]
    return out or "all"


def _instance(profile: str, count: int, owner: str | None, compute: tuple[str, ...] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"profile": profile, "count": count}
    if owner:
        out["owner"] = owner
    if compute is not None:
        out["compute"] = list(compute)
    return out
