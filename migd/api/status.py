"""``migd.status/v1``: what each GPU holds, as ``migctl status -o json`` and migd's read-only socket
give it (docs/migctl.md "Output formats").  Fields are only ever added within v1."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from migd.kinds import Word
from migd.wire import OMIT_NONE


@dataclass(frozen=True)
class Placement:
    start: int
    size: int


@dataclass(frozen=True)
class Process:
    pid: int
    used_memory_bytes: int | None  # None: NVML does not say (it may not under MIG, or unprivileged)


@dataclass(frozen=True)
class ComputeInstance:
    ci_id: int
    profile: str
    profile_id: int
    placement: Placement
    mig_uuid: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[Process, ...]


@dataclass(frozen=True)
class Instance:
    """A GPU instance, its owner (``owners.json``) and its compute instances."""

    gi_id: int
    profile: str
    profile_id: int
    placement: Placement
    owner: str | None
    compute_instances: tuple[ComputeInstance, ...]


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool  # kept for v1 readers: NVML's "pending" mode, the one after the next reset
    after_reset: bool


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    model: str
    pci_bus_id: str
    mig: MigMode
    instances: tuple[Instance, ...]
    processes: tuple[Process, ...] | None = field(default=None, metadata=OMIT_NONE)  # MIG disabled only


class Reading(Word):
    LOST = "lost"  # NVML's GPU_IS_LOST: left alone until a GPU reset or a reboot brings it back
    UNREADABLE = "unreadable"  # another NVML error: left alone, read again next time


@dataclass(frozen=True)
class Unreadable:
    """A GPU NVML cannot read: ``lost`` (fallen off the bus) or ``unreadable`` (another error)."""

    index: int
    state: Reading
    error: str


@dataclass(frozen=True)
class JournalLeft:
    """What an unfinished apply's journal says (``apply.journal.left_behind``); ``error``: it cannot be read."""

    path: str
    profile: str | None
    pid: int | None
    running: bool
    unfinished_gpus: tuple[int, ...]
    error: str | None


@dataclass(frozen=True)
class StatusDoc:
    SCHEMA: ClassVar[str] = "migd.status/v1"
    gpus: tuple[Gpu, ...]
    journal: JournalLeft | None
    unreadable: tuple[Unreadable, ...]
    # migd's read-only socket: when its sampler read this (Unix time); absent when read just now
    sampled_at: float | None = field(default=None, metadata=OMIT_NONE)
