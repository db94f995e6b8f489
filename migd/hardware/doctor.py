"""``migctl doctor``: compare what the driver reports with migd's catalog, changing nothing.

Every query here is read-only in NVML's own terms: no MIG mode change, no instance created
or destroyed, no reset.  An event set is created, registered and freed again to prove Xid
monitoring works; that touches no GPU state.  The catalog lookup is an argument, so a test
can hand in a deliberately wrong entry and see it reported.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from migd.catalog.models import Family, GiProfile, GpuModel, Placement, model_for
from migd.hardware.inventory import Unreadable, survey
from migd.hardware.types import GpuInfo, HardwareError

MiB = 1024 * 1024


class Verdict(enum.Enum):
    OK = "ok"
    INFO = "info"
    MISMATCH = "mismatch"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    gpu: int | None  # None: the node (driver, library)
    check: str
    verdict: Verdict
    detail: str


class DoctorSource(Protocol):
    """The read-only queries the doctor needs (NvmlBackend has them)."""

    def driver_version(self) -> str: ...
    def nvml_version(self) -> str: ...
    def gpu_count(self) -> int: ...
    def gpu(self, index: int) -> GpuInfo: ...
    def gi_profiles(self, index: int) -> list[Any]: ...
    def possible_placements(self, index: int, profile_id: int) -> list[Placement]: ...
    def gpm_supported(self, index: int) -> bool: ...
    def probe_events(self) -> dict[int, str]: ...


Lookup = Callable[[str, int], GpuModel | None]


def _catalog_lookup(name: str, pci_device_id: int) -> GpuModel | None:
    return model_for(name=name, pci_device_id=pci_device_id)


class _SaidByIdentity(logging.Filter):
    """The NVML backend warns, once per GPU, that a GPU is not in the catalog; the doctor's identity
    finding says so for that GPU, with more: the warning would print it twice per GPU."""

    def filter(self, record: logging.LogRecord) -> bool:
        return NOT_IN_CATALOG not in str(record.msg)


NOT_IN_CATALOG = "is not in migd's catalog"  # the backend's warning, as migd/hardware/nvml/backend.py words it


@contextmanager
def _identity_says_it() -> Iterator[None]:
    quiet = _SaidByIdentity()
    backend_log = logging.getLogger("migd.hardware.nvml.backend")
    backend_log.addFilter(quiet)
    try:
        yield
    finally:
        backend_log.removeFilter(quiet)


def diagnose(src: DoctorSource, lookup: Lookup = _catalog_lookup) -> list[Finding]:
    with _identity_says_it():
        return _diagnose(src, lookup)


def _diagnose(src: DoctorSource, lookup: Lookup) -> list[Finding]:
    out = [Finding(None, "driver", Verdict.INFO, f"driver {src.driver_version()}, NVML {src.nvml_version()}")]
    inventory = survey(src)
    unwatched = src.probe_events()
    for g in inventory.gpus:
        try:
            out.extend(_gpu(src, g, lookup(g.name, g.pci_device_id), unwatched.get(g.index)))
        except HardwareError as e:  # lost while being read: reported as the others are
            out.append(_unreadable(Unreadable.of(g.index, e)))
    out.extend(_unreadable(u) for u in inventory.unreadable)
    return sorted(out, key=lambda f: -1 if f.gpu is None else f.gpu)


UNREADABLE_CHECK = "readable"


def _unreadable(u: Unreadable) -> Finding:
    return Finding(u.index, UNREADABLE_CHECK, Verdict.ERROR, u.summary())


def _gpu(src: DoctorSource, g: GpuInfo, model: GpuModel | None, unwatched: str | None) -> Iterator[Finding]:
    i = g.index
    ident = f"{g.name}, PCI device id {g.pci_device_id:#010x}, bus {g.pci_bus_id}"
    if model is None:
        live = g.model is not None and g.model.family is Family.LIVE
        yield Finding(i, "identity", Verdict.MISMATCH, f"{ident}: not in migd's catalog: offline validation has "
                      "no table for it; " + (f"migd plans on the {len(g.model.profiles)} profiles its driver reports"
                                             if live and g.model else "no profile table read from the driver either"))
    else:
        same = model.nvml_name == g.name and model.pci_device_id == g.pci_device_id
        yield Finding(i, "identity", Verdict.OK if same else Verdict.MISMATCH,
                      f"{ident}" + ("" if same else f"; catalog {model.key} says {model.nvml_name}, "
                                    f"{model.pci_device_id:#010x}"))
        mib = g.memory_total_bytes // MiB
        yield Finding(i, "memory", Verdict.OK if mib == model.total_memory_mib else Verdict.MISMATCH,
                      f"{mib} MiB" + ("" if mib == model.total_memory_mib else
                                      f"; catalog says {model.total_memory_mib} MiB"))
    if model is not None:
        notes = [model.identity_unconfirmed, *model.caveats(model.profiles, split_cis=True)]
        if any(notes):
            yield Finding(i, "catalog", Verdict.INFO, f"{model.key}: unconfirmed in the catalog (the driver's values "
                          "decide): " + "; ".join(n for n in notes if n))
    mode = f"current {'on' if g.mig_current else 'off'}, pending {'on' if g.mig_pending else 'off'}"
    yield Finding(i, "mig-mode", Verdict.INFO, mode + ("" if g.mig_current == g.mig_pending else
                                                       " (a change waits for a GPU reset)"))
    if model is not None:
        yield from _profiles(src, g, model)
        gpm = src.gpm_supported(i)
        yield Finding(i, "gpm", Verdict.OK if gpm == model.is_hopper_or_newer else Verdict.MISMATCH,
                      f"GPM {'supported' if gpm else 'not supported'}" + (
                          "" if gpm == model.is_hopper_or_newer else
                          f"; expected {'Hopper+: supported' if model.is_hopper_or_newer else 'not before Hopper'}"))
    yield Finding(i, "events", Verdict.OK if unwatched is None else Verdict.MISMATCH,
                  "Xid and MIG-config-change events register" if unwatched is None else
                  f"events cannot be watched: {unwatched}")


_FIELDS = (("sliceCount", "slices"), ("instanceCount", "instance_count"), ("multiprocessorCount", "sm"),
           ("copyEngineCount", "ce"), ("decoderCount", "dec"), ("encoderCount", "enc"), ("jpegCount", "jpeg"),
           ("ofaCount", "ofa"), ("memorySizeMB", "memory_mib"))


def _profiles(src: DoctorSource, g: GpuInfo, model: GpuModel) -> Iterator[Finding]:
    live = {int(p.id): p for p in src.gi_profiles(g.index)}
    if not live and not g.mig_current:
        yield Finding(g.index, "profiles", Verdict.INFO, "the GPU-instance profile table is not readable with MIG "
                      "mode off (nvml.h: NOT_SUPPORTED); placements are compared below")
    elif not live:
        yield Finding(g.index, "profiles", Verdict.MISMATCH, "MIG is on but NVML lists no GPU-instance profile")
    for p in model.profiles:
        info = live.pop(p.profile_id, None)
        if info is not None:
            yield _profile(g.index, p, info)
        elif live or g.mig_current:
            yield Finding(g.index, f"profile {p.profile_id}", Verdict.MISMATCH, f"{p.name}: in the catalog, "
                          "not offered by the driver")
        yield _placements(src, g.index, p)
    for pid, info in sorted(live.items()):
        yield Finding(g.index, f"profile {pid}", Verdict.MISMATCH,
                      f"{_name(info)}: offered by the driver, not in the catalog")


def _name(info: Any) -> str:
    raw = getattr(info, "name", b"")
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    return name.removeprefix("MIG ") or f"profile {info.id}"


MEMORY_DRIFT = 0.01  # memorySizeMB moves with the driver: an H200's 2-slice profiles, 33024 MB on an older
# driver (mig-parted#120's lgip), 33280 on 580.159.04 (tests/fixtures/h200-580.159.04-probe.json)


def _profile(index: int, p: GiProfile, info: Any) -> Finding:
    """A profile field by field; memory within MEMORY_DRIFT of the catalog's is the driver's own (info),
    not a catalog error: planning takes the driver's table either way."""
    diffs = [f"{c} {int(getattr(info, c))} (catalog {getattr(p, ours)})" for c, ours in _FIELDS
             if int(getattr(info, c)) != getattr(p, ours)]
    if _name(info) != p.name:
        diffs.insert(0, f"name {_name(info)} (catalog {p.name})")
    memory = int(info.memorySizeMB)
    drift = diffs == [f"memorySizeMB {memory} (catalog {p.memory_mib})"] and \
        abs(memory - p.memory_mib) <= MEMORY_DRIFT * p.memory_mib
    if drift:
        return Finding(index, f"profile {p.profile_id}", Verdict.INFO, f"{p.name}: memorySizeMB {memory} (catalog "
                       f"{p.memory_mib}: within {MEMORY_DRIFT:.0%}, a size that moves with the driver)")
    return Finding(index, f"profile {p.profile_id}", Verdict.MISMATCH if diffs else Verdict.OK,
                   f"{p.name}: " + ("; ".join(diffs) if diffs else "as in the catalog"))


def _placements(src: DoctorSource, index: int, p: GiProfile) -> Finding:
    try:
        live = sorted(src.possible_placements(index, p.profile_id))
    except HardwareError as e:
        return Finding(index, f"placements {p.profile_id}", Verdict.MISMATCH, f"{p.name}: {e}")
    want = sorted(p.placements)
    text = ",".join(str(x) for x in live)
    return Finding(index, f"placements {p.profile_id}", Verdict.OK if live == want else Verdict.MISMATCH,
                   f"{p.name}: {text}" + ("" if live == want else
                                           f" (catalog {','.join(str(x) for x in want)})"))
