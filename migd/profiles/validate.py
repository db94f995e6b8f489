"""Offline validation: structure, names and feasibility against the catalog, no GPU needed."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from migd.catalog.models import MODELS, GpuModel
from migd.errors import ValidationError
from migd.plan.offline import fake_gpu
from migd.plan.planner import PlanError, plan_gpu
from migd.profiles.loader import load_profile, mig_parted_configs, mig_parted_profiles, profile_top
from migd.profiles.model import GpuSection, Profile
from migd.profiles.resolve import gi_name_of, resolve_section
from migd.yamlsrc import load, read


def _candidates(section: GpuSection) -> list[GpuModel]:
    sel = section.selector
    out = []
    for m in MODELS.values():
        if sel.pci_device_ids is not None and m.pci_device_id not in sel.pci_device_ids:
            continue
        if sel.models is not None and not any(fnmatch.fnmatchcase(n, pat) for pat in sel.models
                                              for n in (m.key, m.nvml_name, m.nvml_name.removeprefix("NVIDIA "))):
            continue
        out.append(m)
    return out


def _offers(model: GpuModel, section: GpuSection) -> bool:
    """Whether the model has every GI profile a mig-parted section names (a full name, maybe 1c.-prefixed)."""
    return all(model.profile_by_name(gi_name_of(i.profile)) for i in section.instances)


def check_section(section: GpuSection) -> list[str]:
    """Model keys this section is valid for; raises the first error if it is valid for none
    (or, when the selector pins models, for any pinned model).  A mig-parted section for all GPUs
    is checked on the models that offer its profiles, as mig-parted applies it (to any GPU, the
    driver's table deciding); one whose names no model offers cannot be checked offline: []."""
    pinned = section.selector.models is not None or section.selector.pci_device_ids is not None
    candidates = _candidates(section)
    if section.mig_parted and not pinned:
        candidates = [m for m in candidates if _offers(m, section)]
        if not candidates:
            return []
    if pinned and not candidates:
        if section.selector.pci_device_ids is not None:
            return []  # a device filter naming GPUs migd has no catalog entry for: nothing to check offline
        raise section.loc.error("the model selector matches no known GPU model", sorted(MODELS))
    ok: list[str] = []
    first: Exception | None = None
    for model in candidates:
        try:
            plan_gpu(fake_gpu(model), resolve_section(section, model), [])
            ok.append(model.key)
        except (ValidationError, PlanError) as e:
            if pinned:
                if isinstance(e, PlanError):
                    raise section.loc.error(f"on {model.key}: {e}") from None
                raise
            first = first or e
    if not ok and first is not None:
        if isinstance(first, PlanError):
            raise section.loc.error(str(first)) from None
        raise first
    return ok


# The most MIG GPUs one server carries: NVIDIA's HGX and DGX boards (A100, H100, H200, B200, B300) 8, PCIe
# servers up to 10 double-width cards (sim/state.py FLEETS follows the board sizes).
MAX_NODE_GPUS = 10


def check_indexes(profile: Profile, gpus: int | None) -> list[str]:
    """Index selectors against the node size when it is known (``gpus``: an error beyond it), else
    warnings for indexes no known board has: a typo there selects nothing, which apply refuses."""
    warnings = []
    for s in profile.sections:
        beyond = [i for i in s.selector.indexes or () if i >= (gpus or MAX_NODE_GPUS)]
        if beyond and gpus is not None:
            raise s.loc.error(f"index {','.join(map(str, beyond))} is beyond this node's GPUs (0-{gpus - 1})")
        if beyond:
            warnings.append(f"{s.loc}: index {','.join(map(str, beyond))}: no server carries more than "
                            f"{MAX_NODE_GPUS} MIG GPUs; on a node without it this profile selects nothing "
                            "(--gpus N checks against a node's size)")
    return warnings


def check_profile(profile: Profile) -> dict[int, list[str]]:
    return {i: check_section(s) for i, s in enumerate(profile.sections)}


def config_models(profile: Profile, checked: dict[int, list[str]],
                  gpus: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The catalog models the whole profile is valid on, and for each other model why not.

    A node is one model, and any of its GPUs may meet any section that can select it (a section listing
    device indexes can meet every model, as ``devices: all`` does): a model is valid only if every such
    section is.  A section no model offers the profiles of cannot be checked offline: it is left out; so
    is one whose indexes are all beyond the node (``gpus``, when known)."""
    live = [(i, s, {m.key for m in _candidates(s)}) for i, s in enumerate(profile.sections) if checked.get(i) and (
        gpus is None or s.selector.indexes is None or any(x < gpus for x in s.selector.indexes))]
    valid: list[str] = []
    invalid: dict[str, str] = {}
    for key in MODELS:
        meets = [(i, s) for i, s, keys in live if key in keys]
        bad = [s for i, s in meets if key not in checked[i]]
        if bad:
            invalid[key] = f"{bad[0].loc} does not fit it"
        elif meets:
            valid.append(key)
    return valid, invalid


Checked = dict[int, list[str]] | ValidationError  # section -> model keys it is valid for, or its error


def validate_file(path: str | Path) -> list[tuple[str, Checked]]:
    """Validate a migd profile, or every config of a mig-parted file, each on its own: one bad
    config does not hide the others' errors.  Raises ValidationError only for the file as a whole."""
    return check_file(path).configs


Caveats = dict[str, list[str]]  # model key -> unconfirmed catalog facts a valid layout relies on


@dataclass(frozen=True)
class FileCheck:
    """One file's offline check: each config's verdict, the unconfirmed catalog facts the valid
    layouts rely on (per model), and warnings about what may be a typo."""

    configs: list[tuple[str, Checked]]
    caveats: Caveats = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    models: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)  # config -> config_models


def _profiles(path: str | Path) -> dict[str | None, Profile | ValidationError]:
    """A migd profile (None: its one config), or each config of a mig-parted file, read once."""
    text = read(path)
    top = profile_top(load(path, text))
    if "mig-configs" in top:
        return {name: p for name, p in mig_parted_profiles(path, text=text).items()}
    if "version" in top and "apiVersion" not in top:
        mig_parted_configs(path, text)  # (a spec with nothing to apply, or the line that says what is wrong)
        return {}
    try:
        return {None: load_profile(path, text=text)}
    except ValidationError as e:
        return {None: e}


def check_file(path: str | Path, gpus: int | None = None) -> FileCheck:
    """:func:`validate_file` plus caveats and warnings: a layout planned on a borrowed or derived table
    may differ on the real GPU (its live table decides).  ``gpus``: the node's GPU count, if known."""
    out: list[tuple[str, Checked]] = []
    notes: Caveats = {}
    warnings: list[str] = []
    models: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, loaded in _profiles(path).items():
        try:
            if isinstance(loaded, ValidationError):
                raise loaded
            p = loaded
            warns = [*p.warnings, *check_indexes(p, gpus)]
            checked = check_profile(p)
        except ValidationError as e:
            out.append((name or str(path), e))
            continue
        out.append((p.name, checked))
        models[p.name] = config_models(p, checked, gpus)
        warnings += warns
        for i, keys in checked.items():
            for key in keys:
                want = resolve_section(p.sections[i], MODELS[key]).instances
                split = any(len(d.cis) != 1 or not d.cis[0].default for d in want)
                have = notes.setdefault(key, [])
                have.extend(n for n in MODELS[key].caveats({d.gi for d in want}, split) if n not in have)
    return FileCheck(out, {k: v for k, v in notes.items() if v}, warnings, models)
