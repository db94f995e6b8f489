"""Which of the node's GPUs NVML can read now, and which it cannot.

GPUs fall off the bus on real fleets (Xid 79; nvml.h: NVML_ERROR_GPU_IS_LOST, "the GPU has fallen
off the bus or has otherwise become inaccessible"), and only a reset or a reboot brings one back.
One such GPU must not take the node down: every reader (status, plan, apply, export, doctor, the
isolation audit, the daemon's start and passes) takes the node's GPUs from :func:`survey`, serves
those it can read and reports the others as :class:`Unreadable`, left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from migd.hardware.types import GpuInfo, HardwareError

T = TypeVar("T")

LOST_HINT = "fallen off the bus; left alone until a GPU reset or a reboot brings it back"


@dataclass(frozen=True)
class Unreadable:
    """A GPU NVML could not read (``lost``: GPU_IS_LOST, it fell off the bus)."""

    index: int
    error: str
    lost: bool

    @classmethod
    def of(cls, index: int, e: HardwareError) -> Unreadable:
        return cls(index, str(e).removeprefix(f"GPU {index}: "), e.lost)

    @property
    def state(self) -> str:
        return "lost" if self.lost else "unreadable"

    def summary(self) -> str:
        """What NVML said and what migd does about it."""
        what = LOST_HINT if self.lost else "left alone; read again next time"
        return f"{self.state} ({what}): {self.error}"

    def describe(self) -> str:
        """One line for the user: the GPU, then :meth:`summary`."""
        return f"GPU {self.index}: {self.summary()}"


class GpuLister(Protocol):
    """The narrow port :func:`survey` needs."""

    def gpu_count(self) -> int: ...

    def gpu(self, index: int) -> GpuInfo: ...


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GpuInfo, ...]
    unreadable: tuple[Unreadable, ...]

    @property
    def count(self) -> int:
        return len(self.gpus) + len(self.unreadable)


def survey(backend: GpuLister) -> Inventory:
    """Every GPU NVML can read, and the others with the reason (never raises for one GPU's error)."""
    gpus: list[GpuInfo] = []
    unreadable: list[Unreadable] = []
    for i in range(backend.gpu_count()):
        try:
            gpus.append(backend.gpu(i))
        except HardwareError as e:
            unreadable.append(Unreadable.of(i, e))
    return Inventory(tuple(gpus), tuple(unreadable))


def read_all(backend: GpuLister, read: Callable[[GpuInfo], T],
             keep: Callable[[GpuInfo], bool] = lambda g: True) -> tuple[list[T], list[Unreadable]]:
    """``read`` of each GPU NVML can read (of those ``keep`` selects), and every GPU it cannot, in index
    order: lost before the reading, or while it was read."""
    inventory = survey(backend)
    done: list[T] = []
    failed = list(inventory.unreadable)
    for g in inventory.gpus:
        if not keep(g):
            continue
        try:
            done.append(read(g))
        except HardwareError as e:
            failed.append(Unreadable.of(g.index, e))
    return done, sorted(failed, key=lambda u: u.index)
