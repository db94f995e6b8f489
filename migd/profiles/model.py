"""Partition profiles: what the user asked for, before it meets a particular GPU."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field

from migd.errors import ValidationError
from migd.hardware.types import GpuInfo
from migd.printable import clipped


@dataclass(frozen=True)
class Loc:
    """Where a value came from, so errors found later (against a GPU) still point at the file."""

    file: str
    line: int | None
    column: int | None
    field: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}:{self.column}"
        return f"{where}: {self.field}" if self.field else where

    def error(self, message: str, allowed: Iterable[str] | None = None) -> ValidationError:
        return ValidationError(self.file, self.line, self.column, self.field, message, allowed)


@dataclass(frozen=True)
class PciId:
    """``0xDDDDVVVV`` or ``0xDDDDVVVV:0xSSSSVVVV`` as in mig-parted's pkg/types/device.go: with a
    subsystem all four parts must match (``DeviceID.Matches``), else device and vendor only."""

    device: int  # device << 16 | vendor, as NVML's pciDeviceId
    subsystem: int | None = None  # subsystem device << 16 | subsystem vendor, as pciSubSystemId

    def matches(self, gpu: GpuInfo) -> bool:
        return gpu.pci_device_id == self.device and self.subsystem in (None, gpu.pci_subsystem_id)

    def __str__(self) -> str:
        return f"0x{self.device:08X}" + (f":0x{self.subsystem:08X}" if self.subsystem is not None else "")


@dataclass(frozen=True)
class Selector:
    """Which GPUs a section applies to; every given criterion must hold."""

    all: bool = False
    indexes: tuple[int, ...] | None = None
    uuids: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None  # fnmatch globs on the catalog key or NVML name
    pci: tuple[PciId, ...] | None = None

    @property
    def pci_device_ids(self) -> tuple[int, ...] | None:
        return None if self.pci is None else tuple(p.device for p in self.pci)

    def matches(self, gpu: GpuInfo) -> bool:
        if self.indexes is not None and gpu.index not in self.indexes:
            return False
        if self.uuids is not None and gpu.uuid not in self.uuids:
            return False
        if self.pci is not None and not any(p.matches(gpu) for p in self.pci):
            return False
        if self.models is not None:
            names = [gpu.name, gpu.name.removeprefix("NVIDIA ")] + ([gpu.model.key] if gpu.model else [])
            if not any(fnmatch.fnmatchcase(n, pat) for n in names for pat in self.models):
                return False
        return True

    def may_match(self, index: int) -> bool:
        """Whether this selector could select GPU ``index`` whose other attributes NVML cannot read (a lost
        GPU): only an index list can rule it out."""
        return self.indexes is None or index in self.indexes

    def describe(self) -> str:
        parts = []
        if self.indexes is not None:
            parts.append("index " + ",".join(map(str, self.indexes)))
        if self.uuids is not None:
            parts.append("uuid " + ",".join(self.uuids))
        if self.models is not None:
            parts.append("model " + ",".join(self.models))
        if self.pci is not None:
            parts.append("pci " + ",".join(map(str, self.pci)))
        return " and ".join(parts) or "all"


@dataclass(frozen=True)
class InstanceSpec:
    profile: str  # short form (3g), GI name (3g.40gb) or CI name (1c.3g.40gb)
    count: int
    owner: str | None
    compute: tuple[str, ...] | None  # CI split of each GI, e.g. ("1c", "1c", "1c")
    loc: Loc


@dataclass(frozen=True)
class GpuSection:
    selector: Selector
    mig: bool
    instances: tuple[InstanceSpec, ...]
    loc: Loc
    mig_parted: bool = False  # read from a mig-parted file: CIs of one GI type pack as mig-parted packs them


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    sections: tuple[GpuSection, ...]
    source: str
    kind: str = "migd"  # or "mig-parted"
    extra: dict[str, str] = field(default_factory=dict, compare=False)
    text: str = field(default="", compare=False, repr=False)  # the file as read: a manual apply is kept with it
    warnings: tuple[str, ...] = field(default=(), compare=False)  # read, but worth a look (file:line:col: ...)

    @property
    def config(self) -> str | None:
        """The mig-configs entry this profile is, for a mig-parted file (load_profile's ``config``)."""
        return self.name if self.kind == "mig-parted" else None

    def section_for(self, gpu: GpuInfo) -> GpuSection | None:
        """The one section that selects ``gpu`` (None: the profile leaves it alone)."""
        hits = [s for s in self.sections if s.selector.matches(gpu)]
        if len(hits) > 1 and self.kind == "mig-parted":
            # mig-parted walks the entries in order and applies each match to the GPU in turn
            # (cmd/nvidia-mig-parted/assert/assert.go WalkSelectedMigConfigForEachGPU): the last holds.
            return hits[-1]
        if len(hits) > 1:
            first, second = hits[0], hits[1]
            raise second.loc.error(f"GPU {gpu.index} ({gpu.model_key}) is also selected by the section at line "
                                   f"{first.loc.line}; each GPU may be selected by one section only")
        return hits[0] if hits else None

    def may_select(self, index: int) -> bool:
        """Whether the profile could select GPU ``index`` were it readable (a lost GPU: the request touches it)."""
        return any(s.selector.may_match(index) for s in self.sections)

    def selects_nothing(self, gpus: Iterable[GpuInfo]) -> ValidationError:
        """A profile that selects no GPU of this node would change nothing: an error, not "applied"
        (a typo in an index or model pattern must be seen, never held as a manual override)."""
        which = "; ".join(f"{s.loc.field}: {s.selector.describe()}" if len(self.sections) > 1 else
                          f"selects {s.selector.describe()}" for s in self.sections) or "no entries"
        first = self.sections[0].loc if self.sections else Loc(self.source, None, None, "")
        return first.error(f"profile {self.name} matches no GPU of this node ({clipped(which, 200)}); this node has "
                           f"{describe_gpus(gpus)}; nothing was changed")


def describe_gpus(gpus: Iterable[GpuInfo]) -> str:
    """``GPU 0-7 (A100-SXM4-80GB)``: each model with its indexes, for messages about a node."""
    by_model: dict[str, list[int]] = {}
    for g in gpus:
        by_model.setdefault(g.model_key, []).append(g.index)
    if not by_model:
        return "no GPU"
    return ", ".join(f"GPU {index_ranges(ix)} ({model})" for model, ix in by_model.items())


def index_ranges(indexes: Iterable[int]) -> str:
    """``0-3,5``: sorted indexes with runs folded."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)
