"""What one sampling cycle saw: GPUs, their GPU instances, and the compute instances inside.

Memory and GPM activity belong to a GPU instance (every MIG device of a GI reports the GI's memory;
nvmlGpmMigSampleGet takes a GI id), so they are read and exported once per GI; processes run in
a compute instance, so they stay with the CI (a GI split into several CIs was counted
once per CI).  Capacity is kept as numbers (compute and memory slices), so a share per owner is a
sum, not a join.
"""

from __future__ import annotations

from dataclasses import dataclass

from migd.api import status as ws
from migd.hardware.inventory import Unreadable
from migd.hardware.types import GpmMetrics, GpuInfo
from migd.kinds import Word
from migd.report import unreadable


@dataclass(frozen=True)
class CiSample:
    ci_id: int
    profile: str  # the CI's profile name ("1c.3g.40gb"; the GI's name for a CI spanning the GI)
    mig_uuid: str
    processes: int


class ActivitySource(Word):
    """Where an instance's activity figures come from (the ``activity_source`` label)."""

    GPM = "gpm"  # nvmlGpmMigSampleGet + nvmlGpmMetricsGet (Hopper and newer)
    NONE = "none"  # no per-instance utilization from NVML (Ampere), or the sample failed


@dataclass(frozen=True)
class GiSample:
    gi_id: int
    profile: str
    placement_start: int
    placement_size: int
    compute_slices: int
    memory_slices: int
    owner: str
    memory_used_bytes: int | None  # None: the GI has no MIG device (no CI) to read it through
    memory_total_bytes: int | None
    activity: GpmMetrics | None  # None: no GPM on this GPU (Ampere) or the sample failed
    cis: tuple[CiSample, ...]

    @property
    def activity_source(self) -> ActivitySource:
        """Follows from ``activity``: one place for the rule, never a figure without a source."""
        return ActivitySource.GPM if self.activity is not None else ActivitySource.NONE

    @property
    def processes(self) -> int:
        return sum(c.processes for c in self.cis)


@dataclass(frozen=True)
class GpuSample:
    info: GpuInfo
    instances: tuple[GiSample, ...]
    processes: int  # on a non-MIG GPU
    status: ws.Gpu  # the GPU as `migctl status` shows it, from the same reading: what migd's read-only socket answers

    @property
    def compute_slices(self) -> int:
        return self.info.model.compute_slices if self.info.model else 0

    @property
    def memory_slices(self) -> int:
        return self.info.model.memory_slices if self.info.model else 0


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    duration_s: float
    gpus: tuple[GpuSample, ...]
    unread: tuple[Unreadable, ...] = ()  # GPUs this cycle could not read; the others were sampled as usual

    def status(self, journal: ws.JournalLeft | None) -> ws.StatusDoc:
        """``migd.status/v1`` as this cycle read it, with what an unfinished apply left (``journal``)."""
        return ws.StatusDoc(tuple(g.status for g in self.gpus), journal, unreadable(self.unread),
                            sampled_at=self.taken_at)
